"""The product and its test bed apart: the top level says what ships, and imports run one way.

``testbed/import-contracts.toml`` (run by ``make lint`` beside the hook's layer contracts in
``pyproject.toml``) holds three contracts: the product (``hooks``, ``pgfh_plugin``, ``ops``)
imports neither ``testbed`` nor ``tests``; nothing of ``testbed`` imports ``tests``; nothing of
``testbed`` but the benchmarks imports ``testbed.bench``. These tests check that the top level
holds only the product's packages, the test bed and the tests; that the contracts keep what they
promise (a new test-bed folder fails until it is put under them); and that each one really
fails on a forbidden import, in a copy of the tree, while the unmodified copy passes.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.import_contracts import assert_breaks, lint_imports

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = Path("testbed") / "import-contracts.toml"
PRODUCT = {"hooks", "pgfh_plugin", "ops"}
PACKAGES = (*sorted(PRODUCT), "testbed", "tests")


def _contracts() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    config: dict[str, Any] = tomllib.loads((ROOT / CONTRACTS).read_text())["tool"]["importlinter"]
    return config, {contract["id"]: contract for contract in config["contracts"]}


def _testbed_parts() -> set[str]:
    """Every subpackage and top module of testbed/, dotted."""
    found = set()
    for path in (ROOT / "testbed").iterdir():
        if (path / "__init__.py").is_file():
            found.add(f"testbed.{path.name}")
        elif path.suffix == ".py" and path.stem != "__init__":
            found.add(f"testbed.{path.stem}")
    return found


def test_the_top_level_packages_are_the_product_the_test_bed_and_the_tests() -> None:
    top = {path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()}
    assert top == set(PACKAGES), (
        "a new top-level package is either the product's or belongs under testbed/ "
        f"(README.md, Layout): {sorted(top - set(PACKAGES))}"
    )


def test_the_contracts_keep_what_they_promise() -> None:
    config, contracts = _contracts()
    assert sorted(config["root_packages"]) == sorted(PACKAGES)
    assert set(contracts) == {"product-not-testbed", "testbed-not-tests", "benchmarks-on-top"}
    for contract in contracts.values():
        assert contract["type"] == "forbidden"
        assert contract.get("allow_indirect_imports", False) is False, contract["id"]
        assert not contract.get("ignore_imports"), contract["id"]
    assert set(contracts["product-not-testbed"]["source_modules"]) == PRODUCT
    assert set(contracts["product-not-testbed"]["forbidden_modules"]) == {"testbed", "tests"}
    assert contracts["testbed-not-tests"]["source_modules"] == ["testbed"]
    assert contracts["testbed-not-tests"]["forbidden_modules"] == ["tests"]
    # Every part of the test bed but the benchmarks, so that a new folder is held too.
    assert set(contracts["benchmarks-on-top"]["source_modules"]) == _testbed_parts() - {
        "testbed.bench"
    }
    assert contracts["benchmarks-on-top"]["forbidden_modules"] == ["testbed.bench"]


def _sources_only(folder: str, names: list[str]) -> set[str]:
    """What copytree leaves out: anything but packages and Python files (fixtures, Go modules)."""
    return {
        name
        for name in names
        if name == "__pycache__"
        or (not (Path(folder) / name).is_dir() and not name.endswith((".py", ".toml")))
    }


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python sources of the product, the test bed and the tests; the copy passes."""
    tree = tmp_path_factory.mktemp("apart")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=_sources_only)
    result = lint_imports(tree, str(CONTRACTS))
    assert result.returncode == 0, result.stdout + result.stderr
    return tree


@pytest.mark.parametrize(
    ("module", "line", "imported", "contract"),
    [
        ("hooks/sync.py", "import testbed.certs", "testbed.certs", "product-not-testbed"),
        ("pgfh_plugin/cli.py", "from testbed.fakes import kubeapi", "testbed.fakes.kubeapi",
         "product-not-testbed"),
        ("ops/chart/cli.py", "from tests import helpers", "tests.helpers", "product-not-testbed"),
        ("testbed/metacontroller/loop.py", "import tests.helpers", "tests.helpers",
         "testbed-not-tests"),
        ("testbed/bench/common.py", "from tests import doubts", "tests.doubts",
         "testbed-not-tests"),
        ("testbed/patroni/sql.py", "import testbed.bench.common", "testbed.bench.common",
         "benchmarks-on-top"),
        ("testbed/fakes/patroni.py", "from testbed.bench import rounds", "testbed.bench.rounds",
         "benchmarks-on-top"),
    ],
)  # fmt: skip
def test_a_forbidden_import_breaks_the_contract_it_names(
    copy: Path, module: str, line: str, imported: str, contract: str
) -> None:
    name = _contracts()[1][contract]["name"]
    assert_breaks(copy, module, line, imported, name, str(CONTRACTS))
