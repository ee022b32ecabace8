"""The read-only Service on the real Patroni cluster.

Test design: the session's 3-member Patroni cluster (127.0.0.2-4), the hook under real
gunicorn, and the Metacontroller stand-in applying every reply, with ``spec.replicaService``
set. Each test asserts on what clients would get (which Pods the primary Service selects,
which Pods the read-only Service's EndpointSlice routes to) over every sync of the run.
The ``rig`` fixture (tests/patroni_fixtures.py) checks the invariants after every test: no
hook call failed, the primary Pod is never among the read-only endpoints, and neither
Service nor slice is ever dropped once created.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from testbed.metacontroller.harness import (
    PRIMARY_SELECTOR,
    READ_ONLY_SERVICE,
    SERVICE,
    Rig,
)

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

SPEC: dict[str, Any] = {
    "primarySelector": dict(PRIMARY_SELECTOR),
    "serviceRef": {"name": SERVICE},
    "healthCheckPath": "/primary",
    "replicaService": {"name": READ_ONLY_SERVICE},  # default: 16 MiB, KeepEndpoints
}
#: Paused replay makes the lag below; keep paused replicas so that only the lag decides.
SPEC_WITH_PAUSED: dict[str, Any] = {
    **SPEC,
    "replicaService": {"name": READ_ONLY_SERVICE, "includePausedReplicas": True},
}


@pytest.fixture
def rig_spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``SPEC``, or the spec given by indirect parametrization."""
    spec: dict[str, Any] = getattr(request, "param", SPEC)
    return spec


def replicas_routed(rig: Rig) -> dict[str, Any]:
    status = rig.status()
    return next(c for c in status["conditions"] if c["type"] == "ReplicasRouted")


@contextmanager
def one_replica_paused(rig: Rig) -> Iterator[tuple[str, str, str]]:
    """(leader, paused replica, other replica): replay paused on the first replica while
    inside, resumed on the way out."""
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    paused, other = sorted(n for n in cluster.names() if n != leader)
    # Patroni 4 resumes a paused replay at its next HA loop unless automation is paused.
    with cluster.maintenance_mode():
        cluster.execute(paused, "SELECT pg_wal_replay_pause()")
        try:
            yield leader, paused, other
        finally:
            cluster.execute(paused, "SELECT pg_wal_replay_resume()")


def test_the_read_only_endpoints_follow_a_failover(rig: Rig) -> None:
    cluster = rig.cluster
    old, _, election = rig.lose_leader("graceful", timeout=30)
    new = election.name
    (remaining,) = [n for n in cluster.names() if n not in (old, new)]
    # The promoted member leaves the read-only endpoints in the reply that moves the
    # primary Service to it.
    moved = rig.wait_record(
        lambda r: r.selected == (new,), timeout=10, what=f"the primary Service on {new}"
    )
    assert moved.read_only == (remaining,), moved
    cluster.wait_stopped(old)

    cluster.start_member(old)  # returns once it streams from the new leader
    rig.pod_changed(old, ready=True)
    rejoined = rig.wait_record(
        lambda r: r.read_only == tuple(sorted((old, remaining))),
        timeout=15,
        what=f"{old} back in the read-only endpoints",
    )
    assert rejoined.selected == (new,)
    assert rig.status()["replicaEndpoints"] == sorted((old, remaining))
    assert replicas_routed(rig)["status"] == "True"


def test_a_paused_replica_leaves_the_read_only_endpoints_at_once_and_comes_back(
    rig: Rig,
) -> None:
    """Issue 10: paused replay is out by default, lag or not (on a quiet primary a paused
    replica would never fall behind). Real Patroni reports it as ``xlog.paused: true``."""
    with one_replica_paused(rig) as (leader, paused, other):
        left = rig.wait_record(
            lambda r: r.read_only == (other,),
            timeout=15,
            what=f"{paused} out of the read-only endpoints",
        )
        assert left.selected == (leader,)
        routed = replicas_routed(rig)
        assert f"left out: {paused} (replay paused)" in routed["message"], routed
    rig.wait_record(
        lambda r: r.read_only == tuple(sorted((paused, other))),
        timeout=15,
        what=f"{paused} back once replay resumed",
    )


@pytest.mark.parametrize(
    "rig_spec", [SPEC_WITH_PAUSED], indirect=True, ids=["includePausedReplicas"]
)
def test_a_lagging_replica_leaves_the_read_only_endpoints_and_comes_back(rig: Rig) -> None:
    cluster = rig.cluster
    with one_replica_paused(rig) as (leader, lagging, other):
        cluster.execute(leader, "CREATE TABLE IF NOT EXISTS lag_probe (n int)")
        for n in range(3):  # each switch moves the WAL position to the next 16 MiB
            cluster.execute(leader, "INSERT INTO lag_probe VALUES (%s)", (n,))
            cluster.execute(leader, "SELECT pg_switch_wal()")
        left = rig.wait_record(
            lambda r: r.read_only == (other,),
            timeout=15,
            what=f"{lagging} out of the read-only endpoints",
        )
        assert left.selected == (leader,)
        routed = replicas_routed(rig)
        assert routed["status"] == "True"
        assert f"{lagging} (replay lags more than 16 MiB)" in routed["message"]
    rig.wait_record(
        lambda r: r.read_only == tuple(sorted((lagging, other))),
        timeout=15,
        what=f"{lagging} back once it replayed",
    )
