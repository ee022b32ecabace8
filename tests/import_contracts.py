"""Running import-linter on a copy of the tree, for the tests that show a contract bites.

``tests/test_layering.py`` (the hook's layer contracts in ``pyproject.toml``) and
``tests/test_testbed_apart.py`` (the test bed apart, ``testbed/import-contracts.toml``) both
add one forbidden import to a module of a scratch copy and need the contract it breaks to be
named in import-linter's report, with the import's line: one copy of that check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path, *config: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` in ``tree`` (pyproject.toml there, unless a config file is named)."""
    assert LINT_IMPORTS.exists(), f"import-linter is not installed next to {sys.executable}"
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *config],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        # The copy comes first on the path, before the editable install of the real tree.
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=False,
    )


def assert_breaks(
    copy: Path, module: str, line: str, imported: str, contract_name: str, *config: str
) -> None:
    """``line`` added on top of ``module`` in ``copy`` breaks the contract ``contract_name``."""
    path = copy / module
    original = path.read_text()
    try:
        path.write_text(f"{line}  # noqa\n{original}")
        result = lint_imports(copy, *config)
    finally:
        path.write_text(original)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # import-linter wraps long lines: compare with the whitespace squeezed.
    broken = " ".join(output[output.index("Broken contracts") :].split())
    assert " ".join(contract_name.split()) in broken, output
    assert f"{module.removesuffix('.py').replace('/', '.')} -> {imported} (l.1)" in broken, output
