"""The import contracts in ``pyproject.toml``: one per folder, none weakened, each one biting.

``make lint`` runs ``lint-imports`` (import-linter) over the contracts, one per layer: the
domain (``hooks/domain/``) imports only the standard library's pure modules; the loaders
(``hooks/loaders/``) the domain and marshmallow; the pure core (``hooks/core/``) the domain;
the parts (``hooks/parts/``) the core and the domain; ``hooks/sync.py`` the core, the parts
and the domain; ``hooks/patroni.py`` (the prober) no web framework and no decision; the shell
(``hooks/shell/``) everything but the kubectl plugin, which (``pgfh_plugin/``) imports no web
framework, prober or shell. What import-linter cannot check by itself is tested here:

* that the folders and the contracts match one to one: every folder of ``hooks/`` (and each
  module left at its top, and the plugin's package) is the one source of exactly one
  contract whose id is its name, and no contract names anything else, so a new folder or
  module fails until it is put under a contract;
* that a contract is not weakened: each keeps what it forbids (the layers above it, the
  I/O and the settings for the pure layers);
* that the tool really fails on a forbidden import: a copy of the tree with one forbidden
  import added must break the contract it names, while the unmodified copy passes (so the
  failure is the added line's, not the copy's);
* that importing the pure layers loads no forbidden third-party package at run time, which
  catches what a static reader cannot see (an import inside a dependency).
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

#: The pure layers, from the bottom up, and what each must never import besides I/O: every
#: layer above it (and the ones beside it that it does not build on).
PURE = {
    "domain": {"hooks.loaders", "hooks.core", "hooks.parts", "hooks.sync", "hooks.shell"},
    "loaders": {"hooks.core", "hooks.parts", "hooks.sync", "hooks.shell"},
    "core": {"hooks.loaders", "hooks.parts", "hooks.sync", "hooks.shell"},
    "parts": {"hooks.loaders", "hooks.sync", "hooks.shell"},
    "sync": {"hooks.loaders", "hooks.shell"},
}
#: What no pure layer may reach, whatever else its contract adds.
PURE_FORBIDS = {
    "flask", "werkzeug", "gunicorn", "requests", "urllib3", "kubernetes",
    "hooks.patroni", "hooks.probe", PLUGIN,
    "os", "posix", "sys", "importlib", "socket", "time", "logging",
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


def _layers() -> dict[str, str]:
    """Layer name → its dotted package or module: hooks' folders, its top modules, the plugin."""
    hooks = ROOT / "hooks"
    layers = {p.name: f"hooks.{p.name}" for p in hooks.iterdir() if (p / "__init__.py").is_file()}
    layers |= {p.stem: f"hooks.{p.stem}" for p in hooks.glob("*.py") if p.stem != "__init__"}
    layers[PLUGIN] = PLUGIN
    return layers


def _modules(package: str) -> list[str]:
    """Every module of a layer, dotted (a package by its own name)."""
    path = ROOT / package.replace(".", "/")
    if path.with_suffix(".py").is_file():
        return [package]
    found = []
    for file in sorted(path.rglob("*.py")):
        parts = file.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


# ================================================================ one to one


def test_the_folders_and_the_contracts_match_one_to_one() -> None:
    contracts = _contracts()
    layers = _layers()
    assert sorted(contracts) == sorted(layers), (
        f"folders without a contract: {sorted(set(layers) - set(contracts))}; contracts "
        f"without a folder: {sorted(set(contracts) - set(layers))} (pyproject.toml, "
        "[tool.importlinter]: one contract per folder of hooks/, id = the folder's name)"
    )
    for name, contract in contracts.items():
        assert contract["source_modules"] == [layers[name]], name


def test_the_layers_are_the_ones_the_design_card_names() -> None:
    assert set(_layers()) == {*PURE, "shell", "patroni", "probe", PLUGIN}


# =============================================================== cannot shrink


def test_no_contract_is_weakened() -> None:
    contracts = _contracts()
    for contract in contracts.values():
        assert contract["type"] == "forbidden"
        assert contract.get("allow_indirect_imports", False) is False, contract["id"]
        assert contract.get("as_packages", True) is True, contract["id"]
        assert not contract.get("ignore_imports"), contract["id"]
    for layer, above in PURE.items():
        forbidden = set(contracts[layer]["forbidden_modules"])
        assert forbidden >= above | PURE_FORBIDS, (layer, sorted(above | PURE_FORBIDS - forbidden))
    assert {"marshmallow", "pythonjsonlogger"} <= set(contracts["domain"]["forbidden_modules"])
    assert "marshmallow" in contracts["core"]["forbidden_modules"]
    assert set(contracts["shell"]["forbidden_modules"]) == {PLUGIN}
    assert {"flask", "werkzeug", "gunicorn", "hooks.shell", "hooks.patroni"} <= set(
        contracts[PLUGIN]["forbidden_modules"]
    )
    # The prober and its machinery are handed their settings: nothing of the shell.
    assert {"flask", "kubernetes", "hooks.sync", "hooks.shell"} <= set(
        contracts["patroni"]["forbidden_modules"]
    )
    assert {"flask", "kubernetes", "hooks.sync", "hooks.shell", "hooks.patroni"} <= set(
        contracts["probe"]["forbidden_modules"]
    )


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
        ("hooks/domain/model.py", "import flask", "flask", "domain"),
        ("hooks/domain/model.py", "from hooks.core import routing", "hooks.core.routing", "domain"),
        ("hooks/domain/members.py", "import marshmallow", "marshmallow", "domain"),
        ("hooks/loaders/envelope.py", "from hooks.core import keeping", "hooks.core.keeping",
         "loaders"),
        ("hooks/core/routing.py", "from hooks.loaders import envelope", "hooks.loaders.envelope",
         "core"),
        ("hooks/core/keeping.py", "import time", "time", "core"),
        ("hooks/sync.py", "import os", "os", "sync"),
        ("hooks/parts/readonly.py", "from os import environ", "os", "parts"),
        ("hooks/parts/backup.py", "from hooks.shell import config", "hooks.shell.config", "parts"),
        ("hooks/patroni.py", "import flask", "flask", "patroni"),
        ("hooks/patroni.py", "from hooks.shell import config", "hooks.shell.config", "patroni"),
        ("hooks/probe/tls.py", "from hooks.shell import config", "hooks.shell.config", "probe"),
        ("hooks/probe/transport.py", "from hooks import patroni", "hooks.patroni", "probe"),
        ("pgfh_plugin/cli.py", "import flask", "flask", PLUGIN),
        ("hooks/shell/app.py", "from pgfh_plugin import report", "pgfh_plugin.report", "shell"),
    ],
)  # fmt: skip
def test_a_forbidden_import_breaks_the_contract_it_names(
    copy: Path, module: str, line: str, imported: str, contract: str
) -> None:
    assert_breaks(copy, module, line, imported, _contracts()[contract]["name"])


# ============================================================ at run time


def test_importing_the_pure_layers_in_a_fresh_interpreter_loads_no_forbidden_package() -> None:
    pure = [m for layer in PURE for m in _modules(_layers()[layer])]
    assert "hooks.core.routing" in pure and "hooks.parts.readonly" in pure
    third_party = ("flask", "werkzeug", "gunicorn", "requests", "urllib3", "kubernetes")
    impure = ("hooks.shell", "hooks.patroni", PLUGIN)
    probe = (
        "import importlib, sys\n"
        f"for m in {pure!r}: importlib.import_module(m)\n"
        f"bad = [m for m in sys.modules for b in {third_party + impure!r} "
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
    assert result.stdout.strip() == "", f"importing the pure layers loaded: {result.stdout.strip()}"


# ========================================================= parts stand side by side

#: The child parts the registry (hooks/parts/__init__.py) lists; their helpers are theirs.
PART_FACES = {"primary", "readonly", "backup"}


def _part_imports(path: Path) -> set[str]:
    """The ``hooks.parts`` modules a module of ``hooks/parts/`` imports (by last name)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "hooks.parts":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("hooks.parts."):
                found.add(node.module.removeprefix("hooks.parts.").split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("hooks.parts.").split(".")[0]
                for a in node.names
                if a.name.startswith("hooks.parts.")
            }
    return found


def test_no_part_imports_another_part() -> None:
    """Each part stands on hooks/parts/base.py and the shared readers (services.py), never
    on another part: a part can change without the others following."""
    offenders = {}
    for path in sorted((ROOT / "hooks" / "parts").glob("*.py")):
        if path.stem == "__init__":
            continue  # the registry lists them all
        others = (_part_imports(path) & PART_FACES) - {path.stem}
        if others:
            offenders[path.name] = sorted(others)
    assert not offenders, offenders


def test_the_part_independence_check_bites(tmp_path: Path) -> None:
    module = tmp_path / "readonly.py"
    module.write_text("from hooks.parts.primary import observed_primary\n")
    assert _part_imports(module) & PART_FACES == {"primary"}
