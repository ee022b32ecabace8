"""The real-cluster fixture's repair after each test (``tests/patroni_fixtures.py``), with a
stand-in cluster: a test that left the cluster beyond repair is named and failed, and the next
test still gets a fresh cluster."""

from __future__ import annotations

from testbed.patroni import ClusterError
from tests.patroni_fixtures import REPAIR_TIMEOUT, RESTART_TIMEOUT, repair_after


class StandInCluster:
    def __init__(self, repairable: bool) -> None:
        self.repairable = repairable
        self.calls: list[tuple[str, float]] = []

    def ensure_healthy(self, timeout: float = 120.0) -> str:
        self.calls.append(("ensure_healthy", timeout))
        if not self.repairable:
            raise ClusterError("timed out after 120.0s waiting for one leader + streaming replicas")
        return "pg-orders-0"

    def restart(self, timeout: float = 90.0) -> None:
        self.calls.append(("restart", timeout))


def test_a_repairable_cluster_is_repaired_and_the_test_passes() -> None:
    cluster = StandInCluster(repairable=True)
    assert repair_after(cluster, "tests/test_x.py::test_kill") is None
    assert cluster.calls == [("ensure_healthy", REPAIR_TIMEOUT)]


def test_a_cluster_beyond_repair_fails_the_test_that_left_it_and_is_replaced() -> None:
    cluster = StandInCluster(repairable=False)
    problem = repair_after(cluster, "tests/test_x.py::test_kill")
    assert problem is not None
    assert problem.startswith("tests/test_x.py::test_kill left the real cluster beyond repair")
    assert "one leader + streaming replicas" in problem
    assert cluster.calls == [("ensure_healthy", REPAIR_TIMEOUT), ("restart", RESTART_TIMEOUT)]
