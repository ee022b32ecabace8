"""Reads by consistency level on the real Patroni cluster (``spec.replicaService.consistency``).

Test design: the session's 3-member Patroni cluster (127.0.0.2-4, a real etcd), the hook
under real gunicorn, and the Metacontroller stand-in applying every reply, as in
tests/test_replicas_patroni.py. Patroni's own ``synchronous_mode`` is switched with
``PATCH /config`` (what ``patronictl edit-config`` sends) and each test waits until the
leader's own ``GET /patroni`` shows the effect in ``replication[].sync_state`` before it
expects the hook to follow; every fixture puts ``synchronous_mode`` back off and waits for
it, so the next test gets the asynchronous cluster the session started. The ``rig``
fixture's invariants hold over every sync: no hook call failed (never a 5xx), the leader is
never among the read-only endpoints, nothing is ever dropped.

Patroni's quorum mode (``synchronous_mode: quorum``) needs Patroni 4.0: the installed one
is checked first (``patroni.version`` in the leader's answer).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from testbed.metacontroller.harness import PRIMARY_SELECTOR, READ_ONLY_SERVICE, SERVICE, Rig
from testbed.patroni.cluster import PatroniCluster
from testbed.patroni.waiting import poll_until

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

#: Patroni applies a configuration change at each member's next HA loop (loop_wait 2 s
#: here); a sync standby change takes one or two loops.
PATRONI_CHANGE = 30.0
#: How long the hook may take to follow (the rig's next syncs).
HOOK_FOLLOWS = 15.0
ASYNC: dict[str, Any] = {"synchronous_mode": False, "synchronous_node_count": None}


def spec(**replica_service: Any) -> dict[str, Any]:
    return {
        "primarySelector": dict(PRIMARY_SELECTOR),
        "serviceRef": {"name": SERVICE},
        "healthCheckPath": "/primary",
        "replicaService": {"name": READ_ONLY_SERVICE, **replica_service},
    }


def sync_states(cluster: PatroniCluster) -> dict[str, str] | None:
    """``application_name`` → ``sync_state`` in the leader's own answer, or None."""
    leader = cluster.leader()
    if leader is None:
        return None
    rows = cluster.patroni_info(leader).get("replication") or []
    return {r["application_name"]: r["sync_state"] for r in rows}


def wait_sync_states(cluster: PatroniCluster, expected: dict[str, str]) -> None:
    poll_until(
        lambda: sync_states(cluster) == expected,
        PATRONI_CHANGE,
        what=f"the leader to report sync_state {expected}",
        details=lambda: f"it reports {sync_states(cluster)}",
    )


def replicas_routed(rig: Rig) -> dict[str, Any]:
    return next(c for c in rig.status()["conditions"] if c["type"] == "ReplicasRouted")


def wait_routed(rig: Rig, endpoints: tuple[str, ...], reason: str) -> dict[str, Any]:
    """Wait for a sync, from now on, that lists ``endpoints`` with ``reason`` (an earlier
    record must not count: it was made before the change the caller waits for); return
    the condition."""
    rig.wait_record(
        lambda r: r.read_only == endpoints and replicas_routed(rig)["reason"] == reason,
        HOOK_FOLLOWS,
        what=f"read-only endpoints {endpoints} with {reason}",
        after=len(rig.records),
    )
    return replicas_routed(rig)


def set_mode(cluster: PatroniCluster, patch: dict[str, Any], expected: dict[str, str]) -> None:
    cluster.patch_config(patch)
    wait_sync_states(cluster, expected)


@pytest.fixture
def replica_names(healthy_patroni_cluster: PatroniCluster) -> tuple[str, str]:
    leader = healthy_patroni_cluster.leader()
    first, second = sorted(n for n in healthy_patroni_cluster.names() if n != leader)
    return first, second


@pytest.fixture
def both_sync(
    healthy_patroni_cluster: PatroniCluster, replica_names: tuple[str, str]
) -> Iterator[PatroniCluster]:
    """``synchronous_mode: true`` with both replicas synchronous; asynchronous after."""
    cluster = healthy_patroni_cluster
    first, second = replica_names
    try:
        set_mode(
            cluster,
            {"synchronous_mode": True, "synchronous_node_count": 2},
            {first: "sync", second: "sync"},
        )
        yield cluster
    finally:
        restore(cluster)


@pytest.fixture
def quorum(
    healthy_patroni_cluster: PatroniCluster, replica_names: tuple[str, str]
) -> Iterator[PatroniCluster]:
    """``synchronous_mode: quorum`` (Patroni >= 4.0): both replicas in the quorum."""
    cluster = healthy_patroni_cluster
    leader = cluster.leader()
    assert leader is not None
    version = cluster.patroni_info(leader)["patroni"]["version"]
    assert tuple(int(p) for p in version.split(".")[:2]) >= (4, 0), version
    first, second = replica_names
    try:
        set_mode(
            cluster,
            {"synchronous_mode": "quorum", "synchronous_node_count": 1},
            {first: "quorum", second: "quorum"},
        )
        yield cluster
    finally:
        restore(cluster)


def restore(cluster: PatroniCluster) -> None:
    """Back to the session's asynchronous cluster, every member running and async."""
    for name in cluster.names():
        if not cluster.member(name).running:
            cluster.start_member(name)
    cluster.patch_config(ASYNC)
    poll_until(
        lambda: (
            (s := sync_states(cluster)) is not None and len(s) == 2 and set(s.values()) == {"async"}
        ),
        PATRONI_CHANGE,
        what="every standby asynchronous again",
        details=lambda: f"the leader reports {sync_states(cluster)}",
    )


@pytest.mark.parametrize("rig_spec", [spec(consistency="synchronous")], indirect=True)
def test_synchronous_reads_follow_the_sync_standbys_as_one_leaves_sync(
    both_sync: PatroniCluster, replica_names: tuple[str, str], rig: Rig
) -> None:
    cluster = both_sync
    first, second = replica_names
    leader = cluster.leader()
    # The rig waited for both replicas: both are sync standbys.
    condition = replicas_routed(rig)
    assert condition["reason"] == "SynchronousReplicasRouted", condition
    assert rig.status()["replicaLevels"] == {first: "sync", second: "sync"}

    # One leaves sync: with synchronous_node_count 1 Patroni names one standby in
    # synchronous_standby_names, and PostgreSQL reports the other as 'async'.
    cluster.patch_config({"synchronous_node_count": 1})
    states = poll_until(
        lambda: (s := sync_states(cluster)) and sorted(s.values()) == ["async", "sync"] and s,
        PATRONI_CHANGE,
        what="one sync and one async standby",
        details=lambda: f"the leader reports {sync_states(cluster)}",
    )
    (synced,) = [n for n, s in states.items() if s == "sync"]
    (other,) = [n for n, s in states.items() if s == "async"]
    condition = wait_routed(rig, (synced,), "SynchronousReplicasRouted")
    assert f"left out: {other} (sync_state async, not sync)" in condition["message"]
    assert rig.status()["replicaLevels"] == {synced: "sync", other: "async"}
    assert rig.selected() == [leader]

    # The sync standby stops: Patroni makes the other one sync, and the reads move to it.
    cluster.stop_member_gracefully(synced)
    rig.pod_changed(synced, ready=False)
    wait_sync_states(cluster, {other: "sync"})
    condition = wait_routed(rig, (other,), "SynchronousReplicasRouted")
    assert rig.status()["replicaLevels"] == {synced: "none", other: "sync"}
    assert f"{synced} (unreachable, Pod not ready)" in condition["message"], condition
    cluster.start_member(synced)
    rig.pod_changed(synced, ready=True)
    assert rig.selected() == [leader]


@pytest.mark.parametrize("rig_spec", [spec()], indirect=True)
def test_a_level_the_cluster_does_not_serve_keeps_the_endpoints_then_empties_them(
    healthy_patroni_cluster: PatroniCluster, replica_names: tuple[str, str], rig: Rig
) -> None:
    """Asynchronous cluster (the session's), spec switched to synchronous, then to quorum:
    the reason names the missing mode, the fallback applies, nothing fails or is dropped."""
    first, second = replica_names
    both = (first, second)
    leader = healthy_patroni_cluster.leader()

    def switch(**replica_service: Any) -> None:
        with rig.standin.lock:
            rig.standin.world.parent["spec"]["replicaService"].update(replica_service)
        rig.standin.trigger()

    switch(consistency="synchronous")
    condition = wait_routed(rig, both, "NoSynchronousStandby")
    assert condition["message"].startswith(
        f"Leader {leader} lists no sync standby: synchronous_mode is off (or quorum), or no "
        f"standby is synchronous now; levels (sync_state on {leader}): "
        f"{first} async, {second} async"
    ), condition
    assert condition["message"].endswith(
        f"keeping the endpoints listed before: {first}, {second} (whenNoReplica: KeepEndpoints)"
    )
    assert rig.status()["replicaLevels"] == {first: "async", second: "async"}

    switch(consistency="quorum")
    condition = wait_routed(rig, both, "NoQuorumStandby")
    assert "synchronous_mode is not quorum" in condition["message"], condition

    switch(whenNoReplica="Empty")
    condition = wait_routed(rig, (), "NoQuorumStandby")
    assert condition["message"].endswith("the read-only endpoints are empty (whenNoReplica: Empty)")
    assert rig.selected() == [leader]
    switch(consistency="lag", whenNoReplica="KeepEndpoints")
    wait_routed(rig, both, "ReplicasWithinLag")
    assert "replicaLevels" not in rig.status()


@pytest.mark.parametrize("rig_spec", [spec(consistency="quorum")], indirect=True)
def test_quorum_reads_list_the_quorum_standbys_and_drop_one_that_stops(
    quorum: PatroniCluster, replica_names: tuple[str, str], rig: Rig
) -> None:
    cluster = quorum
    first, second = replica_names
    leader = cluster.leader()
    assert replicas_routed(rig)["reason"] == "QuorumReplicasRouted"
    assert rig.status()["replicaLevels"] == {first: "quorum", second: "quorum"}

    cluster.stop_member_gracefully(second)
    rig.pod_changed(second, ready=False)
    wait_sync_states(cluster, {first: "quorum"})
    condition = wait_routed(rig, (first,), "QuorumReplicasRouted")
    assert rig.status()["replicaLevels"] == {first: "quorum", second: "none"}
    assert f"{second} (unreachable, Pod not ready)" in condition["message"], condition

    cluster.start_member(second)
    rig.pod_changed(second, ready=True)
    wait_sync_states(cluster, {first: "quorum", second: "quorum"})
    wait_routed(rig, (first, second), "QuorumReplicasRouted")

    # The same cluster asked for synchronous reads: no sync standby in quorum mode.
    with rig.standin.lock:
        rig.standin.world.parent["spec"]["replicaService"]["consistency"] = "synchronous"
    rig.standin.trigger()
    condition = wait_routed(rig, (first, second), "NoSynchronousStandby")
    assert f"{first} quorum, {second} quorum" in condition["message"], condition
    assert rig.selected() == [leader]
