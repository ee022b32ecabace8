"""``make test``'s two workers honour tests/worker_groups.py: every module on the session's
real Patroni cluster runs on one worker, the others are spread.

Run as a user runs the suite (a pytest subprocess with ``-n 2 --dist loadgroup``) on four
tiny modules, two of which ask for a ``patroni_cluster`` fixture: if the installed pytest and
pytest-xdist stop honouring the groups (pytest 9.2 with xdist 3.8 did, silently:
pytest-dev/pytest-xdist#1386), the two land on different workers and this fails, instead of
a whole suite waiting on the cluster's address locks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.worker_groups import DEVCLUSTER

ROOT = Path(__file__).resolve().parent.parent
PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=")

CONFTEST = """
import pytest

pytest_plugins = ["tests.worker_groups"]


@pytest.fixture(scope="session")
def patroni_cluster():
    return "the session's cluster"
"""

ON_CLUSTER = """
import time


def test_one(patroni_cluster):
    time.sleep(0.3)


def test_two(patroni_cluster):
    time.sleep(0.3)
"""

ELSEWHERE = """
import time


def test_one():
    time.sleep(0.3)


def test_two():
    time.sleep(0.3)
"""


def test_the_modules_on_the_devcluster_share_one_worker_and_the_others_are_spread(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cluster_a.py").write_text(ON_CLUSTER)
    (tmp_path / "test_cluster_b.py").write_text(ON_CLUSTER)
    (tmp_path / "test_plain_c.py").write_text(ELSEWHERE)
    (tmp_path / "test_plain_d.py").write_text(ELSEWHERE)
    run = subprocess.run(
        [*PYTEST, "-n", "2", "--dist", "loadgroup", "-v", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (test_\w+)\.py::(test_\w+)(@\S+)?", run.stdout, re.M)
    assert len(ran) == 8, run.stdout
    workers = {(module, test): (worker, group) for worker, module, test, group in ran}
    on_cluster = {
        workers[module, test]
        for module in ("test_cluster_a", "test_cluster_b")
        for test in ("test_one", "test_two")
    }
    assert len(on_cluster) == 1, workers  # one worker, one group
    ((_, group),) = on_cluster
    assert group == f"@{DEVCLUSTER}", workers
    # Each plain module is a group of its own: whole on one worker, named after itself.
    for module in ("test_plain_c", "test_plain_d"):
        pair = {workers[module, t] for t in ("test_one", "test_two")}
        assert len(pair) == 1, workers
        assert pair.pop()[1] == f"@{module}.py", workers
