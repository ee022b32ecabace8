"""``make mutation``'s configuration and scoring, without running mutmut (that takes minutes:
CONTRIBUTING.md, "Mutation testing").

* mutmut mutates exactly the pure core: pyproject.toml's ``[tool.mutmut] only_mutate`` names
  the same modules as the import-linter contract of the pure modules (``pure``: the domain,
  the loaders, the core, the parts, ``hooks/sync.py`` and the probe step's pure half), so a
  module added to (or split out of) them is mutated too.
* It runs only fast tests: every selected test file exists and none starts the devcluster or
  gunicorn.
* ``testbed/bench/mutation_score.py`` counts a mutant as killed when a test failed on it, it timed
  out or the type checker refused it, and fails the target under the threshold.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from testbed.bench import mutation_score

REPO = Path(__file__).resolve().parents[1]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _files(patterns: list[str]) -> set[str]:
    every = [str(p.relative_to(REPO)) for p in (REPO / "hooks").rglob("*.py")]
    return {path for pattern in patterns for path in fnmatch.filter(every, pattern)}


def _module_files(module: str) -> set[str]:
    """``hooks.sync`` → ``hooks/sync.py``; a package → every module in it."""
    path = module.replace(".", "/")
    if (REPO / f"{path}.py").is_file():
        return {f"{path}.py"}
    return _files([f"{path}/*.py"])


def test_mutmut_mutates_exactly_the_pure_core() -> None:
    config = _pyproject()["tool"]
    contracts = {c["id"]: c for c in config["importlinter"]["contracts"]}
    core = {f for module in contracts["pure"]["source_modules"] for f in _module_files(module)}
    mutated = _files(config["mutmut"]["only_mutate"])
    assert mutated == core, (
        f"[tool.mutmut] only_mutate lacks {sorted(core - mutated)} "
        f"and has {sorted(mutated - core)} beyond the pure-core contract"
    )


def test_mutation_runs_only_fast_pure_tests() -> None:
    config = _pyproject()["tool"]["mutmut"]
    selected = config["pytest_add_cli_args_test_selection"]
    assert selected, "no test selected"
    for name in selected:
        assert (REPO / name).is_file(), f"{name} is selected but does not exist"
    assert "tests/test_fuzz.py" not in selected
    marks = config["pytest_add_cli_args"][config["pytest_add_cli_args"].index("-m") + 1]
    assert marks == "not patroni and not gunicorn"


def _meta(tmp_path: Path, module: str, codes: dict[str, int | None]) -> None:
    path = tmp_path / f"{module}.meta"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}), encoding="utf-8")


def test_killed_timed_out_and_type_checked_mutants_count_as_killed(tmp_path: Path) -> None:
    # mutmut's exit codes: 1 killed, 36 timeout, 37 type check, 0 survived, 33 no tests,
    # None not run yet.
    codes = {f"m{i}": code for i, code in enumerate([1, 1, 36, 37, 0, 33, None, 1])}
    _meta(tmp_path, "hooks/x.py", codes)
    score = mutation_score.score("hooks/x.py", tmp_path)
    assert (score.total, score.killed, score.percent) == (8, 5, 62.5)
    table = mutation_score.table([score])
    assert "hooks/x.py                      8       5   62.5%  1 no tests, 1 not checked" in table


def test_a_module_under_the_threshold_fails_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _meta(tmp_path / "mutants", "hooks/a.py", {"a1": 1, "a2": 1})
    _meta(tmp_path / "mutants", "hooks/b.py", {"b1": 1, "b2": 0})
    monkeypatch.chdir(tmp_path)
    assert mutation_score.main(["hooks/a.py", "--fail-under", "95"]) == 0
    assert mutation_score.main(["hooks/a.py", "hooks/b.py", "--fail-under", "95"]) == 1
    assert "below 95 %: hooks/b.py" in capsys.readouterr().err
    assert mutation_score.main(["hooks/c.py"]) == 2


@pytest.mark.parametrize(
    ("module", "pattern"),
    [
        ("hooks/probe/policy.py", "hooks.probe.policy.*"),
        ("hooks/children/backup.py", "hooks.children.backup.*"),
        ("hooks/children/__init__.py", "hooks.children.x*"),
    ],
)
def test_each_module_is_run_with_the_filter_its_mutant_names_match(
    module: str, pattern: str
) -> None:
    """A package's __init__.py: mutmut names its mutants after the package."""
    assert mutation_score.mutant_filter(module) == pattern
