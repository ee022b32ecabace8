"""The import contracts in ``pyproject.toml``: the hook's layers, its pure modules, each biting.

``make lint`` runs ``lint-imports`` (import-linter) over five contracts:

* ``layers``: the folders of ``hooks/`` are its layers, highest first: the shell; the
  decision (``hooks/sync.py``) beside the prober (``hooks/patroni.py``); the parts beside
  the probe step (``hooks/probe/``); the core beside the loaders; the domain. A folder
  imports only the folders below it, and the folders of one line never import each other.
  Exhaustive: a new folder or top module fails until it is given its line;
* ``pure``: the pure modules (the domain, the loaders, the core, the parts, the decision
  and the probe step's pure half: policy, plan, answer) do no I/O and read no settings;
* ``prober``: the prober and its machinery talk HTTP to Patroni and nothing else;
* ``plugin`` and ``hook_without_plugin``: the kubectl plugin imports no web framework,
  prober or shell, and nothing of the hook imports the plugin.

What import-linter cannot check by itself is tested here:

* that the layers are the ones the design card names, every folder on one line;
* that a contract is not weakened: the layers keep their order and independence, the pure
  contract names every pure module and keeps what it forbids;
* that the tool really fails on a forbidden import: a copy of the tree with one forbidden
  import added must break the contract it names, while the unmodified copy passes (so the
  failure is the added line's, not the copy's);
* that importing the pure modules loads no forbidden package at run time (marshmallow
  included, but for the loaders), which catches what a static reader cannot see (an import
  inside a dependency).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.import_contracts import assert_breaks, lint_imports

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "pgfh_plugin"

#: The hook's layers, highest first; ``|`` joins folders that never import each other.
LAYERS = ["shell", "sync | patroni", "children | probe", "core | loaders", "domain"]
#: The pure modules: whole layers, and the probe step's pure half.
PURE = [
    "hooks.domain", "hooks.loaders", "hooks.core", "hooks.children", "hooks.sync",
    "hooks.probe.policy", "hooks.probe.plan", "hooks.probe.answer",
]  # fmt: skip
#: What no pure module may reach.
PURE_FORBIDS = {
    "flask", "werkzeug", "gunicorn", "requests", "urllib3", "kubernetes", "prometheus_client",
    PLUGIN, "os", "posix", "nt", "sys", "importlib", "io", "pathlib", "socket", "ssl", "http",
    "urllib", "subprocess", "threading", "concurrent", "asyncio", "time", "logging",
}  # fmt: skip


def _config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]
    return config


def _contracts() -> dict[str, dict[str, Any]]:
    config = _config()
    assert sorted(config["root_packages"]) == ["hooks", PLUGIN]
    assert config.get("include_external_packages") is True  # else nothing external is seen
    return {contract["id"]: contract for contract in config["contracts"]}


def _folders() -> set[str]:
    """hooks' folders and the modules at its top, by name."""
    hooks = ROOT / "hooks"
    names = {p.name for p in hooks.iterdir() if (p / "__init__.py").is_file()}
    return names | {p.stem for p in hooks.glob("*.py") if p.stem != "__init__"}


def _modules(package: str) -> list[str]:
    """Every module of a package or module, dotted (a package by its own name)."""
    path = ROOT / package.replace(".", "/")
    if path.with_suffix(".py").is_file():
        return [package]
    found = []
    for file in sorted(path.rglob("*.py")):
        parts = file.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


# ==================================================== the layers the card names


def test_the_layers_are_the_ones_the_design_card_names() -> None:
    layers = _contracts()["layers"]
    assert layers["type"] == "layers"
    assert layers["containers"] == ["hooks"]
    assert layers["layers"] == LAYERS
    named = {name.strip() for line in LAYERS for name in line.split("|")}
    assert named == _folders(), (
        f"folders without a line: {sorted(_folders() - named)}; lines without a folder: "
        f"{sorted(named - _folders())} (pyproject.toml, the `layers` contract)"
    )


# =============================================================== cannot shrink


def test_no_contract_is_weakened() -> None:
    contracts = _contracts()
    assert sorted(contracts) == ["hook_without_plugin", "layers", "plugin", "prober", "pure"]
    for contract in contracts.values():
        assert contract.get("allow_indirect_imports", False) is False, contract["id"]
        assert contract.get("as_packages", True) is True, contract["id"]
        assert not contract.get("ignore_imports"), contract["id"]
    assert contracts["layers"]["exhaustive"] is True
    assert not contracts["layers"].get("exhaustive_ignores")
    assert contracts["pure"]["source_modules"] == PURE
    forbidden = set(contracts["pure"]["forbidden_modules"])
    assert forbidden >= PURE_FORBIDS, sorted(PURE_FORBIDS - forbidden)
    assert {"flask", "werkzeug", "gunicorn", "kubernetes", PLUGIN} <= set(
        contracts["prober"]["forbidden_modules"]
    )
    assert contracts["prober"]["source_modules"] == ["hooks.patroni", "hooks.probe"]
    assert {"flask", "werkzeug", "gunicorn", "hooks.shell", "hooks.patroni", "hooks.probe"} <= set(
        contracts["plugin"]["forbidden_modules"]
    )
    assert contracts["hook_without_plugin"]["layers"] == [PLUGIN, "hooks"]


def test_every_module_of_the_probe_step_is_either_pure_or_the_probers_io() -> None:
    """hooks/probe/ holds both halves of the probe step; a new module there must say which."""
    pure = {m for m in PURE if m.startswith("hooks.probe.")}
    io = {"hooks.probe", "hooks.probe.transport", "hooks.probe.tls", "hooks.probe.targets",
          "hooks.probe.failures", "hooks.probe.settings"}  # fmt: skip
    assert set(_modules("hooks.probe")) == pure | io


# ================================================================ does fail


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hooks/, pgfh_plugin/ and pyproject.toml in a scratch directory; the copy passes."""
    tree = tmp_path_factory.mktemp("layering")
    for package in ("hooks", PLUGIN):
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    return tree


@pytest.mark.parametrize(
    ("module", "line", "imported", "contract"),
    [
        ("hooks/domain/model.py", "import flask", "flask", "pure"),
        ("hooks/domain/model.py", "from hooks.core import routing", "hooks.core.routing",
         "layers"),
        ("hooks/loaders/envelope.py", "from hooks.core import keeping", "hooks.core.keeping",
         "layers"),
        ("hooks/core/routing.py", "from hooks.loaders import envelope", "hooks.loaders.envelope",
         "layers"),
        ("hooks/core/keeping.py", "import time", "time", "pure"),
        ("hooks/sync.py", "import os", "os", "pure"),
        ("hooks/sync.py", "from hooks import patroni", "hooks.patroni", "layers"),
        ("hooks/children/readonly.py", "from os import environ", "os", "pure"),
        ("hooks/children/primary.py", "from hooks.probe import plan", "hooks.probe.plan", "layers"),
        ("hooks/children/backup.py", "from hooks.shell import config", "hooks.shell.config",
         "layers"),
        ("hooks/probe/plan.py", "import socket", "socket", "pure"),
        ("hooks/probe/answer.py", "import requests", "requests", "pure"),
        ("hooks/patroni.py", "import flask", "flask", "prober"),
        ("hooks/patroni.py", "from hooks.shell import config", "hooks.shell.config", "layers"),
        ("hooks/probe/tls.py", "from hooks.shell import config", "hooks.shell.config", "layers"),
        ("hooks/probe/transport.py", "from hooks import patroni", "hooks.patroni", "layers"),
        ("hooks/probe/transport.py", "import kubernetes", "kubernetes", "prober"),
        ("pgfh_plugin/cli.py", "import flask", "flask", "plugin"),
        ("hooks/shell/app.py", "from pgfh_plugin import report", "pgfh_plugin.report",
         "hook_without_plugin"),
    ],
)  # fmt: skip
def test_a_forbidden_import_breaks_the_contract_it_names(
    copy: Path, module: str, line: str, imported: str, contract: str
) -> None:
    assert_breaks(copy, module, line, imported, _contracts()[contract]["name"])


# ============================================================ at run time

#: What importing a pure module must never load, at run time.
RUNTIME_FORBIDS = (
    "flask", "werkzeug", "gunicorn", "requests", "urllib3", "kubernetes", "prometheus_client",
    "hooks.shell", "hooks.patroni", "hooks.probe.transport", "hooks.probe.tls", PLUGIN,
)  # fmt: skip


def _loaded_by(modules: list[str], forbidden: tuple[str, ...]) -> str:
    """Which of ``forbidden`` a fresh interpreter has loaded after importing ``modules``."""
    probe = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = [m for m in sys.modules for b in {forbidden!r} "
        "if m == b or m.startswith(b + '.')]\n"
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
    return result.stdout.strip()


def test_importing_the_pure_modules_in_a_fresh_interpreter_loads_no_forbidden_package() -> None:
    but_loaders = [m for p in PURE if p != "hooks.loaders" for m in _modules(p)]
    assert "hooks.core.routing" in but_loaders and "hooks.probe.plan" in but_loaders
    loaded = _loaded_by(but_loaders, (*RUNTIME_FORBIDS, "marshmallow"))
    assert loaded == "", f"importing the pure modules loaded: {loaded}"
    loaded = _loaded_by(_modules("hooks.loaders"), RUNTIME_FORBIDS)
    assert loaded == "", f"importing the loaders loaded: {loaded}"


def test_the_run_time_check_bites() -> None:
    assert _loaded_by(["hooks.loaders.schemas"], ("marshmallow",)).startswith("marshmallow,")


# ========================================================= parts stand side by side

#: The child parts the registry (hooks/children/__init__.py) lists; their helpers are theirs.
PART_FACES = {"primary", "readonly", "backup"}


def _part_imports(path: Path) -> set[str]:
    """The ``hooks.children`` modules a module of ``hooks/children/`` imports (by last name)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "hooks.children":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("hooks.children."):
                found.add(node.module.removeprefix("hooks.children.").split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("hooks.children.").split(".")[0]
                for a in node.names
                if a.name.startswith("hooks.children.")
            }
    return found


def test_no_part_imports_another_part() -> None:
    """Each part stands on hooks/children/base.py and the shared readers (services.py), never
    on another part: a part can change without the others following."""
    offenders = {}
    for path in sorted((ROOT / "hooks" / "children").glob("*.py")):
        if path.stem == "__init__":
            continue  # the registry lists them all
        others = (_part_imports(path) & PART_FACES) - {path.stem}
        if others:
            offenders[path.name] = sorted(others)
    assert not offenders, offenders


def test_the_part_independence_check_bites(tmp_path: Path) -> None:
    module = tmp_path / "readonly.py"
    module.write_text("from hooks.children.primary import observed_primary\n")
    assert _part_imports(module) & PART_FACES == {"primary"}
