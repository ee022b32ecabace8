"""Pytest plugin: the real Patroni cluster as fixtures.

Load it with ``pytest_plugins = ["tests.patroni_fixtures"]`` in ``tests/conftest.py`` (or
``-p tests.patroni_fixtures``).

* ``patroni_cluster`` (session): one cluster for the whole session. Starting it costs a few
  seconds, so tests share it; the teardown runs at session end even after failures and on
  Ctrl-C, and keeps the logs (printing where) if any test failed.
* ``healthy_patroni_cluster`` (function): the same cluster in the state every test may
  assume: all members running, exactly one leader, all others streaming. After each test it
  is brought back to that state (members the test stopped or killed are restarted,
  rejoining via pg_rewind if needed); a test that left it beyond repair **fails** at its
  teardown, naming itself, and a fresh cluster is started so the next test gets a healthy one
  (:func:`repair_after`).
* ``hook`` (module): the hook under real gunicorn with the production config module
  (2 workers, 8 threads), one per test module; from the work tree, or from the built image
  with ``PGFH_TEST_HOOK_FROM=image`` (:func:`testbed.metacontroller.harness.rig_hook`).
* ``rig`` (function): the Metacontroller stand-in (:mod:`testbed.metacontroller.harness`) driving
  ``hook``
  for the healthy cluster, started once the Services route to the current leader (and,
  with ``spec.replicaService``, the read-only endpoints to its replicas); after the test,
  :func:`assert_invariants` over every sync of the run. Its spec is ``rig_spec``: the seed
  spec unless a module overrides that fixture or a test parametrizes it indirectly.

Every test that uses either fixture is marked ``patroni`` automatically, so
``-m "not patroni"`` deselects all of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pytest

from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import READ_ONLY_SERVICE, Rig, rig_hook, start_rig
from testbed.patroni import ClusterError, PatroniCluster

_FIXTURES = {"patroni_cluster", "healthy_patroni_cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests that need the cluster, whatever marks they were written with."""
    for item in items:
        if _FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.patroni)


@pytest.fixture(scope="session")
def patroni_cluster(request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    """A started 3-member cluster shared by the session; torn down at the end."""
    cluster = PatroniCluster()
    cluster.start(timeout=90)
    try:
        yield cluster
    finally:
        # Keep the logs for a post-mortem if anything failed (the path is printed on stderr).
        cluster.stop(keep_logs=request.session.testsfailed > 0)


#: How long a test's members may take to rejoin after it (pg_rewind, or a re-clone).
REPAIR_TIMEOUT = 120.0
#: How long a fresh cluster may take to start when the old one is beyond repair.
RESTART_TIMEOUT = 90.0


class Repairable(Protocol):
    def ensure_healthy(self, timeout: float = ...) -> str: ...
    def restart(self, timeout: float = ...) -> None: ...


def repair_after(cluster: Repairable, test: str) -> str | None:
    """Bring ``cluster`` back to healthy after ``test``; ``None`` when that worked, else what
    to fail ``test`` with (the cluster is then replaced by a fresh one for the next test).

    Replacing it silently, as this fixture used to at the next test's start, let the test
    that broke the cluster pass and blamed nobody.
    """
    try:
        cluster.ensure_healthy(timeout=REPAIR_TIMEOUT)
    except ClusterError as exc:
        cluster.restart(timeout=RESTART_TIMEOUT)
        return (
            f"{test} left the real cluster beyond repair (not healthy {REPAIR_TIMEOUT:.0f} s "
            f"after it; a fresh cluster was started for the next test, the old logs kept): {exc}"
        )
    return None


@pytest.fixture
def healthy_patroni_cluster(
    patroni_cluster: PatroniCluster, request: pytest.FixtureRequest
) -> Iterator[PatroniCluster]:
    """The session cluster with all members up, one leader and the others streaming; the
    test fails at teardown if it left the cluster beyond repair (:func:`repair_after`)."""
    yield from kept_healthy(patroni_cluster, request)


def kept_healthy(
    cluster: PatroniCluster, request: pytest.FixtureRequest
) -> Iterator[PatroniCluster]:
    """The body of a fixture that hands a test ``cluster`` healthy and repairs it after,
    failing the test that left it beyond repair (any module's own cluster, too)."""
    # Every earlier user repaired it at its own teardown: this only waits for the replicas.
    cluster.ensure_healthy(timeout=REPAIR_TIMEOUT)
    yield cluster
    problem = repair_after(cluster, request.node.nodeid)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    """The hook under real gunicorn (production config module), shared by a test module."""
    with rig_hook(tmp_path_factory.mktemp("hook"), workers=2, threads=8) as running:
        yield running


@pytest.fixture
def rig_spec(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    """The parent's spec for ``rig``: the seed spec (None) unless parametrized indirectly."""
    spec: dict[str, Any] | None = getattr(request, "param", None)
    return spec


@pytest.fixture
def rig(
    healthy_patroni_cluster: PatroniCluster, hook: GunicornHook, rig_spec: dict[str, Any] | None
) -> Iterator[Rig]:
    """The stand-in driving ``hook`` for the cluster, routed; invariants checked after."""
    running = start_rig(healthy_patroni_cluster, hook.url, spec=rig_spec)
    try:
        leader = healthy_patroni_cluster.leader()
        assert leader is not None
        if rig_spec is not None and "replicaService" in rig_spec:
            replicas = tuple(sorted(n for n in healthy_patroni_cluster.names() if n != leader))
            running.wait_record(
                lambda r: r.selected == (leader,) and r.read_only == replicas,
                timeout=10,
                what="the Services on the leader and the replicas",
            )
        else:
            running.wait_selected(leader, timeout=10)
        yield running
    finally:
        running.stop()
    assert_invariants(running)


def assert_invariants(rig: Rig) -> None:
    """What must hold over every sync of a run, whatever the test broke.

    No hook call failed; the primary Service never selected two Pods and, once created,
    was never dropped. With ``spec.replicaService``: the leader was never among the
    read-only endpoints, they listed someone at some point, and no reply deleted a
    read-only object.
    """
    read_only = "replicaService" in rig.standin.world.parent["spec"]
    created = listed = False
    for record in rig.records:
        assert record.error is None, f"hook call failed: {record.error}"
        assert len(record.selected) <= 1, f"Service selected two pods: {record}"
        created = created or record.service_present
        assert record.service_present or not created, "the Service was dropped"
        if read_only:
            assert not set(record.selected) & set(record.read_only), f"leader listed: {record}"
            listed = listed or bool(record.read_only)
            assert record.applied is not None
            deleted = [o for o in record.applied.deleted_objects if READ_ONLY_SERVICE in o]
            assert not deleted, record
    assert listed or not read_only, "the read-only endpoints never listed anyone"
