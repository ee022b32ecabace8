"""Switchover detection on real Patroni: event-driven via the Pods, or polled per spec.

The session's 3-member Patroni cluster, the hook under gunicorn with the production
config, and the Metacontroller stand-in. Two ways a planned switchover (Patroni's
``POST /switchover``: no kill, no NotReady) reaches the hook:

* Kubernetes DCS: :class:`testbed.metacontroller.harness.RoleLabelKeeper` patches the member Pods'
  role
  label and status annotation as Patroni's ``touch_member`` does. The healthy resync is
  30 s, so only the Pod change can explain a Service that follows at once.
* etcd DCS (no role evidence on the Pods): the cluster is polled every
  ``spec.switchover.pollSeconds``; the Service follows within that plus a second.

Bounds are generous multiples of the mechanism's (a 50 ms label keeper, 0.3 s degraded
resync); they catch a missed event or an ignored poll setting, not a slow machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import CLUSTER, PRIMARY_SELECTOR, SERVICE, Rig, start_rig
from testbed.patroni import PatroniCluster
from tests.patroni_fixtures import assert_invariants

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

EVENT_DRIVEN_RESYNC = 30.0
POLL_SECONDS = 3.0


def spec(**switchover: Any) -> dict[str, Any]:
    return {
        "primarySelector": dict(PRIMARY_SELECTOR),
        "serviceRef": {"name": SERVICE},
        "healthCheckPath": "/primary",
        "switchover": switchover,
    }


def asks_for(resync_after: float | None, period: float, *, on_slot: bool = False) -> bool:
    """Whether a reply asked for the phase-spread healthy resync of ``period``.

    Any healthy reply asks for half a period to one and a half (hooks.core.switchover); a sync
    that ran on the cluster's own slot asks for one period, less that sync's latency.
    """
    if resync_after is None:
        return False
    if on_slot:
        return period - 1.0 < resync_after <= period
    return period / 2 <= resync_after < period * 1.5


def settle(rig: Rig, resync: float, detection: str, *, on_slot: bool = False) -> None:
    """Wait until the Service is on the leader and the hook asked for ``resync``
    (phase-spread; ``on_slot``: from a sync on the cluster's slot, so the next poll is
    one period away)."""
    leader = rig.cluster.leader()
    assert leader is not None
    rig.wait_record(
        lambda r: r.selected == (leader,) and asks_for(r.resync_after, resync, on_slot=on_slot),
        timeout=15,
        what=f"a healthy sync with the phase-spread resyncAfterSeconds of {resync}",
    )
    status = rig.status()
    assert status["switchoverDetection"] == detection, status
    assert status["primary"] == leader


def quiet(rig: Rig, resync: float, timeout: float = 10.0) -> int:
    """Wait until the last reply asked for ``resync`` and no sync ran for 0.5 s.

    (The keeper patches a Pod whenever a member's REST answer changes, e.g. a replica's
    timeline after it follows the new leader: each patch is a sync.) Returns the number
    of records at that point.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = len(rig.records)
        time.sleep(0.5)
        if len(rig.records) == count and count and asks_for(rig.records[-1].resync_after, resync):
            return count
    raise TimeoutError(f"the stand-in did not settle on resyncAfterSeconds {resync}")


@pytest.fixture
def k8s_dcs_rig(healthy_patroni_cluster: PatroniCluster, hook: GunicornHook) -> Iterator[Rig]:
    rig = start_rig(
        healthy_patroni_cluster,
        hook.url,
        spec=spec(pollSeconds=1, eventDrivenResyncSeconds=EVENT_DRIVEN_RESYNC),
        role_labels=True,
        resync_period=EVENT_DRIVEN_RESYNC,
    )
    try:
        yield rig
    finally:
        rig.stop()
    assert_invariants(rig)


@pytest.fixture
def polled_rig(healthy_patroni_cluster: PatroniCluster, hook: GunicornHook) -> Iterator[Rig]:
    rig = start_rig(healthy_patroni_cluster, hook.url, spec=spec(pollSeconds=POLL_SECONDS))
    try:
        yield rig
    finally:
        rig.stop()
    assert_invariants(rig)


def test_a_switchover_on_the_kubernetes_dcs_is_followed_at_once_via_the_pod_change(
    k8s_dcs_rig: Rig,
) -> None:
    rig = k8s_dcs_rig
    settle(rig, EVENT_DRIVEN_RESYNC, "RoleLabel")
    assert rig.keeper is not None
    pods = rig.model.pods()
    leader = rig.cluster.leader()
    assert leader is not None
    assert pods[leader]["metadata"]["labels"]["role"] == "primary"
    # The last reply before the switchover asked to be called again in 15-45 s (30, spread).
    before = quiet(rig, EVENT_DRIVEN_RESYNC)
    version = rig.model.version

    result = rig.cluster.switchover()
    moved = rig.wait_selected(result.new_leader, timeout=10, after=before)

    lag = moved.finished - result.election.first_primary
    print(f"event-driven switchover: Service followed {lag:.3f} s after the promotion")
    assert lag < 1.0, f"Service followed {lag:.2f} s after the promotion"
    assert rig.model.version > version, "the switchover changed no Pod"
    # Nothing but a Pod change (or our own status write) woke the stand-in: no timer
    # was due before 15 s (half the phase-spread 30 s) after the last healthy reply.
    assert moved.finished - rig.records[before - 1].finished < EVENT_DRIVEN_RESYNC / 2
    # Every sync after the switchover followed Patroni's answer, never a label alone.
    for record in rig.records[before:]:
        assert record.selected in ((result.old_leader,), (result.new_leader,)), record
    # Once Patroni's labels caught up, the cluster is event-driven again.
    settle(rig, EVENT_DRIVEN_RESYNC, "RoleLabel")
    pods = rig.model.pods()
    assert pods[result.new_leader]["metadata"]["labels"]["role"] == "primary"
    assert pods[result.old_leader]["metadata"]["labels"]["role"] == "replica"


def test_a_polled_cluster_follows_a_switchover_within_its_poll_setting(polled_rig: Rig) -> None:
    rig = polled_rig
    settle(rig, POLL_SECONDS, "Polled", on_slot=True)
    before = len(rig.records)

    result = rig.cluster.switchover()
    moved = rig.wait_selected(result.new_leader, timeout=POLL_SECONDS + 10, after=before)

    lag = moved.finished - result.election.first_primary
    print(f"polled switchover (pollSeconds {POLL_SECONDS}): followed {lag:.3f} s after")
    assert lag < POLL_SECONDS + 1.0, f"Service followed {lag:.2f} s after the promotion"
    assert rig.model.version == 1, "no Pod changed: only the poll brought the sync"
    status = rig.status()
    assert status["switchoverDetection"] == "Polled"
    (cond,) = [c for c in status["conditions"] if c["type"] == "SwitchoverDetection"]
    assert cond["reason"] == "RoleLabelMissing", cond
    assert CLUSTER in cond["message"]


def test_a_kill_on_the_kubernetes_dcs_still_syncs_at_once_and_polls_fast(
    k8s_dcs_rig: Rig,
) -> None:
    """The 30 s resync changes nothing for a kill: NotReady syncs, no-leader polls at 0.3 s.

    A SIGKILLed Patroni patches nothing: its Pod keeps ``role=primary`` (the keeper
    leaves an unanswering member's Pod alone), so the labels disagree with Patroni until
    the new leader's Patroni patches its own Pod; routing never follows the stale label.
    """
    rig = k8s_dcs_rig
    settle(rig, EVENT_DRIVEN_RESYNC, "RoleLabel")
    cluster = rig.cluster
    old = cluster.leader()
    assert old is not None
    before = len(rig.records)
    with cluster.watch_leader(exclude={old}) as watch:
        killed_at = cluster.kill_member(old)
        dead_at = time.monotonic()  # kill_member returns once the processes are gone
        rig.pod_changed(old, ready=False)
        first = rig.wait_record(
            lambda r: r.started > killed_at, timeout=5, what="a sync after the kill", after=before
        )
        election = watch.result(timeout=60)
    assert first.started - killed_at < 1.0, "the NotReady Pod did not trigger a sync at once"
    moved = rig.wait_selected(election.name, timeout=10, after=before)
    # A sync that started before the processes were gone (on a Pod patch of the keeper)
    # may still have seen the old leader answer: it is not a sync after the kill.
    waiting = [
        r for r in rig.records[before:] if dead_at < r.started and r.finished < election.first_200
    ]
    assert waiting, "no sync ran while there was no leader"
    for record in waiting:
        assert record.selected == (old,), record
        assert record.resync_after is not None and record.resync_after <= 0.5, record
    lag = moved.finished - election.first_primary
    print(f"kill on the Kubernetes DCS: Service followed {lag:.3f} s after the promotion")
    assert lag < 1.0
    assert rig.model.pods()[old]["metadata"]["labels"]["role"] == "primary"  # stale
    status = rig.status()
    assert status["primary"] == election.name
    assert status["switchoverDetection"] == "Polled"
    (cond,) = [c for c in status["conditions"] if c["type"] == "SwitchoverDetection"]
    assert cond["reason"] == "RoleLabelDisagrees", cond
    assert f"{old} has role=primary" in cond["message"]
