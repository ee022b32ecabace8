"""The decision core stays pure: no web framework, HTTP client, Kubernetes client or prober.

Test design notes
-----------------
* Two independent checks, so neither tool's blind spot hides a violation:

  1. ``lint-imports`` (import-linter, from the venv next to ``sys.executable``) runs the
     contract in ``pyproject.toml``; the test also reads that contract and fails if it
     is weakened (a core module or a forbidden package dropped from it, or indirect
     imports allowed).
  2. An AST scan of the source files follows every ``hooks.*`` import of
     ``hooks/sync.py``, ``hooks/members.py``, ``hooks/schemas.py``, ``hooks/policy.py``,
     ``hooks/replicas.py`` and ``hooks/backup.py`` transitively
     (``hooks/__init__.py`` included, since importing any submodule runs it), and
     collects every top-level package named in ``import``/``from ... import``
     statements, wherever they are (inside functions and ``TYPE_CHECKING`` blocks too).
     It also refuses dynamic imports (``importlib.import_module``/``__import__``)
     that a static scan could not follow.

* A negative control runs the same scanner on ``hooks/app.py`` and must find Flask
  there: a scanner that finds nothing anywhere would otherwise pass silently.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ROOT / "hooks"
CORE = (
    "hooks.model",
    "hooks.sync",
    "hooks.probing",
    "hooks.routing",
    "hooks.keeping",
    "hooks.conditions",
    "hooks.parts",
    "hooks.parts.base",
    "hooks.parts.primary",
    "hooks.parts.readonly",
    "hooks.parts.readonly_objects",
    "hooks.parts.backup",
    "hooks.parts.backup_cronjob",
    "hooks.cluster_event",
    "hooks.members",
    "hooks.schemas",
    "hooks.policy",
    "hooks.manifests",
    "hooks.switchover",
)
FORBIDDEN = (
    "flask",
    "werkzeug",
    "requests",
    "urllib3",
    "kubernetes",
    "gunicorn",
    "hooks.patroni",
    "hooks.app",
)


def _source(module: str) -> Path:
    parts = module.split(".")
    package = ROOT.joinpath(*parts) / "__init__.py"
    return package if package.exists() else ROOT.joinpath(*parts[:-1], f"{parts[-1]}.py")


def _imports(module: str) -> set[str]:
    """Every module named by an import statement in ``module``'s source, absolute."""
    path = _source(module)
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            # ``from hooks import sync`` imports the submodule hooks.sync
            found.update(f"{prefix}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            assert name not in ("import_module", "__import__"), (
                f"{path.name}:{node.lineno} imports dynamically; the layering scan cannot follow it"
            )
    return {name for name in found if name and name != "__future__"}


def _closure(start: str) -> tuple[set[str], set[str]]:
    """(hooks modules reached, every module named) from ``start``, following hooks.*"""
    seen: set[str] = set()
    named: set[str] = set()
    todo = [start, "hooks"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imports(module):
            named.add(name)
            if name.startswith("hooks.") or name == "hooks":
                # the name may be a module or an attribute of one: follow what exists
                for candidate in (name, name.rpartition(".")[0]):
                    if candidate and _source(candidate).exists():
                        todo.append(candidate)
                        break
    return seen, named


def _violations(named: set[str]) -> set[str]:
    return {n for n in named for bad in FORBIDDEN if n == bad or n.startswith(f"{bad}.")}


# ================================================================ import-linter


def test_lint_imports_keeps_the_contract() -> None:
    executable = Path(sys.executable).parent / "lint-imports"
    assert executable.exists(), f"import-linter is not installed next to {sys.executable}"
    result = subprocess.run(
        [str(executable), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Contracts: 1 kept, 0 broken." in output, output


def test_the_import_contract_covers_the_whole_core_and_every_forbidden_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if set(CORE) & set(c.get("source_modules", []))]
    assert contract["type"] == "forbidden"
    assert set(contract["source_modules"]) == set(CORE)
    assert set(contract["forbidden_modules"]) >= set(FORBIDDEN) - {"werkzeug"}
    assert contract.get("allow_indirect_imports", False) is False
    assert config.get("include_external_packages") is True


# ===================================================================== AST scan


@pytest.mark.parametrize("module", CORE)
def test_the_core_module_imports_nothing_forbidden_even_indirectly(module: str) -> None:
    reached, named = _closure(module)
    assert module in reached
    assert not _violations(named), (
        f"{module} reaches {sorted(_violations(named))} via {sorted(reached)}"
    )
    assert not {"hooks.app", "hooks.patroni", "hooks.metrics", "hooks.gunicorn_conf"} & reached


def test_the_core_reaches_only_the_pure_hooks_modules() -> None:
    reached: set[str] = set()
    for module in CORE:
        reached |= _closure(module)[0]
    assert reached == {"hooks", *CORE}


def test_the_scanner_finds_forbidden_imports_where_they_are() -> None:
    _, named = _closure("hooks.app")
    assert {"flask", "hooks.patroni"} <= _violations(named)
    _, named = _closure("hooks.patroni")
    assert "urllib3" in _violations(named)


def test_the_scanner_resolves_relative_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text("from . import sync\nfrom .members import MemberStatus\nimport flask.json\n")
    real = _source
    monkeypatch.setattr(
        sys.modules[__name__], "_source", lambda m: fake if m == "hooks.fake" else real(m)
    )
    assert _imports("hooks.fake") == {
        "hooks",
        "hooks.sync",
        "hooks.members",
        "hooks.members.MemberStatus",
        "flask.json",
    }
    assert _violations(_imports("hooks.fake")) == {"flask.json"}


def test_importing_the_core_in_a_fresh_interpreter_loads_no_forbidden_package() -> None:
    probe = (
        "import sys\n"
        "import hooks.sync, hooks.members, hooks.schemas, hooks.policy\n"
        "import hooks.parts, hooks.cluster_event\n"
        f"forbidden = {FORBIDDEN!r}\n"
        "bad = [m for m in sys.modules for b in forbidden if m == b or m.startswith(b + '.')]\n"
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
