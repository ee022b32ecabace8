"""The import contracts in ``pyproject.toml`` hold, cannot shrink, and do catch a violation.

``make lint`` runs ``lint-imports`` (import-linter) over the contracts: the pure core
imports no web framework, HTTP or Kubernetes client, prober, settings, environment or
other I/O; ``hooks.model`` imports only the standard library; the kubectl plugin and the
hook stay apart. What import-linter cannot check by itself is tested here:

* that a contract is not weakened: every module under ``hooks/`` is either in the
  pure-core contract or named below as part of the shell (a new module fails until it is
  put on one side), and the forbidden lists keep what they forbid;
* that the tool really fails on a forbidden import: a copy of ``hooks/`` and
  ``pyproject.toml`` with one forbidden import added must break the contract it names,
  while the unmodified copy passes (so the failure is the added line's, not the copy's);
* that importing the core loads no forbidden third-party package at run time, which
  catches what a static reader cannot see (an import inside a dependency).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

#: The I/O shell around the core, and the kubectl plugin: everything under hooks/ that is
#: not in the pure-core contract. A new module goes either here or in the contract.
SHELL = {
    "hooks",
    "hooks.app",
    "hooks.auth",
    "hooks.config",
    "hooks.events",
    "hooks.gunicorn_conf",
    "hooks.handler",
    "hooks.logs",
    "hooks.metrics",
    "hooks.patroni",
    "hooks.probe_failures",
}
PLUGIN = "hooks.plugin"
#: What the pure core must never reach, whatever else the contract adds.
CORE_FORBIDS = {
    "flask", "werkzeug", "gunicorn", "requests", "urllib3", "kubernetes",
    "hooks.app", "hooks.patroni", "hooks.config", "os", "posix", "sys", "importlib",
}  # fmt: skip


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["root_package"] == "hooks"
    assert config.get("include_external_packages") is True  # else nothing external is seen
    return {contract["id"]: contract for contract in config["contracts"]}


def _modules() -> set[str]:
    """Every module under hooks/, dotted (packages by their own name)."""
    found = set()
    for path in (ROOT / "hooks").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


# =============================================================== cannot shrink


def test_every_module_is_in_the_pure_core_contract_or_named_as_shell() -> None:
    core = set(_contracts()["pure-core"]["source_modules"])
    modules = _modules()
    plugin = {m for m in modules if m == PLUGIN or m.startswith(f"{PLUGIN}.")}
    assert core <= modules, f"the contract names modules that do not exist: {core - modules}"
    assert not core & SHELL
    unplaced = modules - core - SHELL - plugin
    assert not unplaced, (
        f"{sorted(unplaced)}: add each to the pure-core contract in pyproject.toml "
        "(source_modules) or, if it does I/O, to SHELL here"
    )
    assert modules >= SHELL, f"SHELL names modules that do not exist: {SHELL - modules}"


def test_no_contract_is_weakened() -> None:
    contracts = _contracts()
    for contract in contracts.values():
        assert contract["type"] == "forbidden"
        assert contract.get("allow_indirect_imports", False) is False, contract["id"]
        assert not contract.get("ignore_imports"), contract["id"]
    assert set(contracts["pure-core"]["forbidden_modules"]) >= CORE_FORBIDS
    assert contracts["model"]["source_modules"] == ["hooks.model"]
    assert {"hooks.*", "marshmallow", "flask"} <= set(contracts["model"]["forbidden_modules"])
    assert contracts["plugin-apart"]["source_modules"] == [PLUGIN]
    assert {"flask", "werkzeug", "gunicorn", "hooks.app", "hooks.patroni"} <= set(
        contracts["plugin-apart"]["forbidden_modules"]
    )
    assert contracts["hook-without-plugin"]["forbidden_modules"] == [PLUGIN]
    assert "hooks.app" in contracts["hook-without-plugin"]["source_modules"]


# ================================================================ does fail


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.exists(), f"import-linter is not installed next to {sys.executable}"
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        # The copy comes first on the path, before the editable install of the real tree.
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=False,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hooks/ and pyproject.toml in a scratch directory; the unmodified copy passes."""
    tree = tmp_path_factory.mktemp("layering")
    shutil.copytree(ROOT / "hooks", tree / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    result = _lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    return tree


@pytest.mark.parametrize(
    ("module", "line", "imported", "contract"),
    [
        ("hooks/model.py", "import flask", "flask", "pure-core"),
        ("hooks/sync.py", "import os", "os", "pure-core"),
        ("hooks/parts/readonly.py", "from os import environ", "os", "pure-core"),
        ("hooks/parts/backup.py", "from hooks import config", "hooks.config", "pure-core"),
        ("hooks/model.py", "from hooks import members", "hooks.members", "model"),
        ("hooks/plugin/cli.py", "import flask", "flask", "plugin-apart"),
        (
            "hooks/app.py",
            "from hooks.plugin import report",
            "hooks.plugin.report",
            "hook-without-plugin",
        ),
    ],
)
def test_a_forbidden_import_breaks_the_contract_it_names(
    copy: Path, module: str, line: str, imported: str, contract: str
) -> None:
    path = copy / module
    original = path.read_text()
    try:
        path.write_text(f"{line}  # noqa\n{original}")
        result = _lint_imports(copy)
    finally:
        path.write_text(original)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # import-linter wraps long lines: compare with the whitespace squeezed.
    broken = " ".join(output[output.index("Broken contracts") :].split())
    assert " ".join(_contracts()[contract]["name"].split()) in broken, output
    assert f"{module.removesuffix('.py').replace('/', '.')} -> {imported} (l.1)" in broken, output


# ============================================================ at run time


def test_importing_the_core_in_a_fresh_interpreter_loads_no_forbidden_package() -> None:
    core = _contracts()["pure-core"]["source_modules"]
    third_party = ("flask", "werkzeug", "gunicorn", "requests", "urllib3", "kubernetes")
    probe = (
        "import importlib, sys\n"
        f"for m in {core!r}: importlib.import_module(m)\n"
        f"bad = [m for m in sys.modules for b in {third_party!r} "
        "if m == b or m.startswith(b + '.')]\n"
        "bad += [m for m in ('hooks.app', 'hooks.patroni', 'hooks.config') if m in sys.modules]\n"
        "print(','.join(sorted(bad)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert result.stdout.strip() == "", f"importing the core loaded: {result.stdout.strip()}"
