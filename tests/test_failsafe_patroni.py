"""Patroni's failsafe mode on the real cluster: the DCS is down, the primary keeps running.

Test design: the session's 3-member Patroni cluster (127.0.0.2-4, etcd on 127.0.0.1), the
hook under real gunicorn and the Metacontroller stand-in applying every reply, with
``spec.replicaService``. ``failsafe_mode: true`` is set through ``PATCH /config`` and the
test waits until the leader has written every member to the ``/failsafe`` key; then etcd
is SIGSTOPped (it keeps its connections and answers nothing, as a DCS behind a partition)
for ``OUTAGE`` seconds, more than twice the leader key's TTL (20 s), so a leader that did
not hold by failsafe would have demoted itself (``Ha._handle_dcs_error``, patroni/ha.py at
v4.1.4, lines 2352-2365) well inside it.

What Patroni does then (read in its source, and sampled here every 0.5 s from the leader's
own ``GET /primary``): all members acknowledge the leader over ``POST /failsafe``, the
leader calls ``set_is_leader(True)`` and keeps answering 200 on ``/primary`` with ``role:
primary, state: running`` plus ``failsafe_mode_is_active: true`` and ``cluster_unlocked:
true``. The hook's rule (route only to a 200 running leader) therefore holds; the test
proves the router neither fails closed (``Ready`` stays ``LeaderFound``) nor flaps (one
(selection, reason, read-only endpoints) triple over every sync of the outage). It goes on
sampling for ``AFTER`` s past etcd's return, failsafe still on, while Patroni takes its
expired key again: the routing never moves, and ``Ready`` ends ``LeaderFound``; for a moment
in between it may say ``NoLeader``, because the leader itself answers 503 from the cycle
that finds its key expired until it acquires the key again in the same cycle (seen in 2 of
~12 syncs there in 2 of 6 runs; patroni/ha.py 4.1.5 ``load_cluster_from_dcs``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from testbed.metacontroller.harness import PRIMARY_SELECTOR, READ_ONLY_SERVICE, SERVICE, Rig
from testbed.metacontroller.loop import SyncRecord
from testbed.patroni import PatroniCluster

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

SPEC: dict[str, Any] = {
    "primarySelector": dict(PRIMARY_SELECTOR),
    "serviceRef": {"name": SERVICE},
    "healthCheckPath": "/primary",
    "replicaService": {"name": READ_ONLY_SERVICE},
}
#: Seconds etcd answers nothing: more than twice the leader key's TTL (20 s).
OUTAGE = 45.0
#: Seconds sampled past the DCS's return, failsafe still on.
AFTER = 8.0
#: The control's outage: long enough for Patroni to demote a leader without failsafe.
CONTROL_OUTAGE = 30.0


@pytest.fixture
def rig_spec() -> dict[str, Any]:
    return SPEC


@dataclass(frozen=True)
class Sample:
    """The leader's own answer on ``/primary`` at ``at`` s into the outage."""

    at: float
    status: int
    role: str | None
    state: str | None
    failsafe: bool


def sample_leader(cluster: PatroniCluster, name: str, started: float) -> Sample:
    response = cluster.member(name).api_get("/primary", timeout=1.0)
    try:
        body = json.loads(response.body) if response.status else {}
    except ValueError:
        body = {}
    return Sample(
        round(time.monotonic() - started, 2),
        response.status,
        body.get("role"),
        body.get("state"),
        body.get("failsafe_mode_is_active") is True,
    )


def sample_for(cluster: PatroniCluster, name: str, started: float, until: float) -> list[Sample]:
    """The leader's ``/primary`` every 0.5 s until the monotonic time ``until``."""
    samples: list[Sample] = []
    while time.monotonic() < until:
        samples.append(sample_leader(cluster, name, started))
        time.sleep(0.5)
    return samples


def outage(rig: Rig, seconds: float) -> tuple[list[Sample], list[SyncRecord], float]:
    """etcd paused ``seconds``; the leader sampled meanwhile; the syncs wholly inside."""
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    with cluster.dcs_paused(limit=seconds + 30) as stopped:
        samples = sample_for(cluster, leader, stopped, stopped + seconds)
    end = stopped + seconds
    inside = [r for r in rig.records if r.started >= stopped and r.finished <= end]
    return samples, inside, stopped


def test_in_failsafe_mode_the_services_stay_on_the_primary_through_a_dcs_outage(
    rig: Rig,
) -> None:
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    replicas = tuple(sorted(n for n in cluster.names() if n != leader))
    with cluster.failsafe_mode():
        samples, inside, stopped = outage(rig, OUTAGE)
        routed = rig.status()
        # Past the DCS's return, failsafe still on: Patroni takes its key again.
        returned = sample_for(cluster, leader, stopped, time.monotonic() + AFTER)
        through = [r for r in rig.records if r.started >= stopped + OUTAGE]
    # Patroni itself held the leader by failsafe (else this test would prove nothing).
    active = [s for s in samples if s.failsafe]
    assert active, f"Patroni never reported failsafe_mode_is_active: {samples}"
    assert all(s.status == 200 and s.role == "primary" for s in samples), samples
    # Not fail closed, no flapping: every sync of the outage, the same routing.
    outcomes = Counter((r.selected, r.reason, r.read_only) for r in inside)
    after = Counter((r.selected, r.reason, r.read_only) for r in through)
    refused = [s for s in returned if s.status != 200]  # sampled: may miss the moment
    why = [(round(r.started - stopped, 2), r.message) for r in through if r.reason != "LeaderFound"]
    print(
        f"\nfailsafe: etcd paused {OUTAGE:.0f} s; leader {leader} answered 200 in "
        f"{len(samples)}/{len(samples)} samples, failsafe_mode_is_active from "
        f"{active[0].at} s on ({len(active)} samples); {len(inside)} syncs inside: "
        f"{dict(outcomes)}; after the return: {len(returned) - len(refused)}/"
        f"{len(returned)} samples 200 (not: {refused}), syncs {dict(after)}; why not "
        f"Ready: {why}"
    )
    assert len(inside) >= 10, f"too few syncs inside the outage to judge: {len(inside)}"
    assert set(outcomes) == {((leader,), "LeaderFound", replicas)}, outcomes
    # After the return the routing never moves either, and Ready comes back. It may say
    # NoLeader for a moment: the HA cycle that first reaches etcd again finds the leader key
    # expired, and Patroni drops its own leadership (``set_is_leader(False)`` in
    # ``load_cluster_from_dcs``, patroni/ha.py 4.1.5 lines 340-346, failsafe injecting no
    # leader on the leader itself) until ``acquire_lock`` in the same cycle (lines 349-357):
    # a 503 on /primary between the two, which the hook reports and keeps the Service through.
    assert {(sel, ro) for sel, _, ro in after} == {((leader,), replicas)}, after
    assert {reason for _, reason, _ in after} <= {"LeaderFound", "NoLeader"}, after
    assert through and through[-1].reason == "LeaderFound", why
    ready = next(c for c in routed["conditions"] if c["type"] == "PrimaryRouted")
    assert "Patroni failsafe mode is active" in ready["message"], ready


def test_without_failsafe_the_leader_demotes_and_the_service_is_kept_not_moved(
    rig: Rig,
) -> None:
    """The control: Patroni's default. The leader demotes itself once it cannot renew
    its key; no member answers 200, so the hook keeps the Service where it is and says
    why (Rule 2): the failsafe test's assertions fail here."""
    cluster = rig.cluster
    cluster.set_failsafe_mode(False)  # Patroni's default, whatever ran before
    leader = cluster.leader()
    assert leader is not None
    samples, inside, _ = outage(rig, CONTROL_OUTAGE)
    assert not any(s.failsafe for s in samples), samples
    demoted = [s for s in samples if s.status != 200]
    assert demoted, f"the leader never stopped answering 200 without failsafe: {samples}"
    outcomes = Counter((r.selected, r.reason) for r in inside)
    print(
        f"\nno failsafe: etcd paused {CONTROL_OUTAGE:.0f} s; leader {leader} stopped "
        f"answering 200 at {demoted[0].at} s; {len(inside)} syncs inside: {dict(outcomes)}"
    )
    assert {selected for selected, _ in outcomes} == {(leader,)}, outcomes  # kept, not moved
    assert {reason for _, reason in outcomes} - {"LeaderFound"}, outcomes  # not Ready
