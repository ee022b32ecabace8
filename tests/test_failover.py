"""Failover on real Patroni, through the real hook under real gunicorn.

Test design: the session's 3-member Patroni cluster (PostgreSQL + etcd from wheels, on
127.0.0.2-4), the hook under gunicorn with the production config module, and the
Metacontroller stand-in applying every reply as Metacontroller would. Each test breaks
the cluster one way and asserts on what clients would get: which Pod the Service
selects, over every sync of the run, not only at the end. The ``rig`` fixture
(tests/patroni_fixtures.py) checks the invariants after every test: the Service is never
dropped once created and never selects two Pods; no reply is an error.

Bounds are generous multiples of what the benchmark measures (testbed/bench/routing_lag.py);
they catch a broken mechanism (a missed sync, a lost resync), not a slow machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import SERVICE, Rig

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]


def test_graceful_stop_of_the_leader_moves_the_service(rig: Rig) -> None:
    election = rig.lose_leader("graceful", timeout=30).election
    moved = rig.wait_selected(election.name, timeout=10)
    assert moved.finished - election.first_primary < 2.5
    assert rig.selected() == [election.name]
    assert rig.status()["primary"] == election.name


def test_sigkill_of_the_leader_moves_the_service_after_the_ttl(rig: Rig) -> None:
    old, killed_at, election = rig.lose_leader("kill", timeout=60)
    moved = rig.wait_selected(election.name, timeout=10)
    # Until Patroni promoted someone, every sync kept the Service on the dead leader and
    # asked for a fast resync.
    waiting = [r for r in rig.records if killed_at < r.started and r.finished < election.first_200]
    assert waiting, "no sync ran while there was no leader"
    for record in waiting:
        assert record.selected == (old,), record
        assert record.reason in ("NoLeader", "LeaderNotReady"), record
        assert record.resync_after is not None and record.resync_after <= 0.5, record
    assert moved.finished - election.first_primary < 2.5


def test_sigkill_of_the_leader_and_a_replica_moves_the_service_to_the_lone_survivor(
    rig: Rig,
) -> None:
    """Issue 10: two of three nodes gone (etcd, the DCS, stays up, as an external one would).

    Patroni promotes the survivor once the dead leader's key expires (TTL); the hook must
    follow it although only one member of three answers (the DCS lock is the quorum), as
    fast as after a single kill, and the status must name the two missing members.
    """
    cluster = rig.cluster
    old = cluster.leader()
    assert old is not None
    victim, survivor = sorted(n for n in cluster.names() if n != old)
    with cluster.watch_leader(exclude={old, victim}) as watch:
        killed_at = cluster.kill_member(old)
        cluster.kill_member(victim)
        rig.pod_changed(old, ready=False)
        rig.pod_changed(victim, ready=False)
        election = watch.result(timeout=60)
    assert election.name == survivor
    moved = rig.wait_selected(survivor, timeout=10)
    waiting = [r for r in rig.records if killed_at < r.started and r.finished < election.first_200]
    assert waiting, "no sync ran while there was no leader"
    for record in waiting:
        assert record.selected == (old,), record
        assert record.reason in ("NoLeader", "LeaderNotReady"), record
    # A figure for the report (shown with -s): Patroni's promotion, then the routing lag.
    print(
        f"\ntwo of three killed: promotion {election.first_primary - killed_at:.2f} s after the "
        f"kill, Service moved {moved.finished - election.first_primary:.3f} s after it"
    )
    assert moved.finished - election.first_primary < 2.5
    assert moved.reason == "LeaderFound"
    assert rig.selected() == [survivor]

    status = rig.status()
    assert status["primary"] == survivor
    assert status["membersAnswered"] == "1/3"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("True", "LeaderFound")
    reachable = conditions["MembersReachable"]
    assert (reachable["status"], reachable["reason"]) == ("False", "MembersUnreachable")
    missing = ", ".join(f"{n} (connection refused)" for n in sorted((old, victim)))
    assert reachable["message"] == (
        f"1 of 3 member(s) answered as Patroni; no answer from {missing}"
    ), reachable
    members = {m["name"]: m for m in status["members"]}
    assert members[survivor]["role"] == "primary" and "reason" not in members[survivor]
    assert {members[n].get("reason") for n in (old, victim)} == {"connection refused"}


def test_the_old_leader_rejoining_as_a_replica_does_not_move_the_service(rig: Rig) -> None:
    cluster = rig.cluster
    old = cluster.leader()
    assert old is not None
    cluster.kill_member(old)
    rig.pod_changed(old, ready=False)
    new = cluster.wait_for_leader(exclude={old}, timeout=60).name
    rig.wait_selected(new, timeout=10)
    cluster.start_member(old)  # waits until it streams as a replica
    rig.pod_changed(old, ready=True)
    count = len(rig.records)
    rig.wait_record(
        lambda r: r.reason == "LeaderFound", timeout=10, what="a healthy sync", after=count
    )
    rig.wait_record(lambda r: True, timeout=5, what="one more sync", after=len(rig.records))
    after = rig.records[count:]
    assert after and all(r.selected == (new,) for r in after)
    assert rig.selected() == [new]


def test_a_planned_switchover_is_followed_without_any_pod_change(rig: Rig) -> None:
    cluster = rig.cluster
    result = cluster.switchover()
    moved = rig.wait_selected(result.new_leader, timeout=10)
    lag = moved.finished - result.election.first_primary
    assert lag < 2.5, f"Service followed the switchover {lag:.2f} s after the promotion"
    assert rig.model.version == 1, "no Pod changed: only resyncAfterSeconds brought the sync"


def test_the_hook_logs_the_primary_change_with_old_and_new_leader(
    rig: Rig, hook: GunicornHook
) -> None:
    cluster = rig.cluster
    result = cluster.switchover()
    rig.wait_selected(result.new_leader, timeout=10)
    import json

    lines = [json.loads(line) for line in Path(hook.log_path).read_text().splitlines() if line]
    changes = [r for r in lines if r.get("message", "").startswith("primary changed")]
    assert any(
        r["old_leader"] == result.old_leader
        and r["new_leader"] == result.new_leader
        and r["cluster"] == "databases/pg-orders"
        and r["level"] == "INFO"
        for r in changes
    ), changes[-3:]


def test_the_service_object_is_created_once_and_keeps_its_cluster_ip(rig: Rig) -> None:
    service = rig.service()
    assert service is not None
    cluster_ip = service["spec"]["clusterIP"]
    result = rig.cluster.switchover()
    rig.wait_selected(result.new_leader, timeout=10)
    after = rig.service()
    assert after is not None and after["spec"]["clusterIP"] == cluster_ip
    assert SERVICE not in rig.standin.world.deleted_services
