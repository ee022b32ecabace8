"""Unit tests of the decision core (hooks.sync): fuzz-found cases, phase-spread resyncs.

The test design notes are those of tests/test_sync_routing.py.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from hooks.core.routing import Decision
from hooks.core.switchover import spread_resync
from hooks.domain.model import LAST_APPLIED_ANNOTATION, ResyncTiming
from tests.helpers import (
    CLUSTER,
    NAMESPACE,
    NOW,
    P0,
    P1,
    P2,
    TIMING,
    healthy,
    leader,
    make_service,
    replica,
    run,
    seed_spec,
    spread,
    sync_body,
)
from tests.sync_cases import (
    LATER,
    NOW_STAMP,
    SERVER_FIELDS,
)

# ============================================= found by tests/test_fuzz.py (kept here)


def _last_applied_of(service: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(service["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]))


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: s.__setitem__("kind", "Pod"), id="observed kind Pod"),
        pytest.param(lambda s: s.pop("apiVersion"), id="observed without apiVersion"),
        pytest.param(lambda s: s.__setitem__("spec", None), id="observed spec null"),
        pytest.param(
            lambda s: s["metadata"].__setitem__("namespace", "elsewhere"), id="observed elsewhere"
        ),
        pytest.param(
            lambda s: s["metadata"]["annotations"].__setitem__(
                LAST_APPLIED_ANNOTATION,
                json.dumps(
                    {
                        **_last_applied_of(s),
                        "spec": {**_last_applied_of(s)["spec"], "clusterIP": "10.96.0.1"},
                    }
                ),
            ),
            id="last-applied with clusterIP",
        ),
        pytest.param(
            lambda s: s["metadata"]["annotations"].__setitem__(
                LAST_APPLIED_ANNOTATION,
                json.dumps(
                    {
                        **_last_applied_of(s),
                        "metadata": {**_last_applied_of(s)["metadata"], "namespace": "elsewhere"},
                    }
                ),
            ),
            id="last-applied in another namespace",
        ),
    ],
)
@pytest.mark.parametrize("routed", [True, False], ids=["routed", "in doubt"])
def test_a_kept_service_is_always_a_v1_service_in_the_parents_namespace_without_cluster_ip(
    edit: Any, routed: bool
) -> None:
    # Metacontroller matches reply children to observed ones by apiVersion, kind,
    # namespace and name: whatever the observed object or its last-applied record say,
    # the Service observed under "Service.v1" must come back as exactly that.
    observed = make_service(name="pg-orders-old", pod=P0)
    edit(observed)
    answers = {P0: replica(P0), P1: leader(P1), P2: replica(P2)} if routed else {}
    _, outcome = run(sync_body(services=[observed]), answers)
    kept = [c for c in outcome.body["children"] if c["metadata"]["name"] == "pg-orders-old"]
    assert len(kept) == 1
    (service,) = kept
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    assert service["metadata"]["namespace"] == NAMESPACE
    assert not SERVER_FIELDS & set(service.get("spec") or {})


@pytest.mark.parametrize(
    "conditions",
    [
        pytest.param([{"type": ["Ready"], "status": "True"}], id="type a list"),
        pytest.param([{"type": {"a": 1}, "status": "True"}], id="type an object"),
        pytest.param(
            [{"type": "Ready", "status": "False", "lastTransitionTime": ["x"]}],
            id="lastTransitionTime a list",
        ),
        pytest.param([{"type": None}, "Ready", 5, None], id="junk entries"),
    ],
)
def test_junk_in_the_parents_conditions_is_ignored(conditions: list[Any]) -> None:
    # The status is free input (anyone who may write the status subresource).
    body = sync_body(services=[make_service(pod=P0)], status={"conditions": conditions})
    _, outcome = run(body, {P0: replica(P0), P1: replica(P1), P2: replica(P2)})
    assert outcome.decision is Decision.NO_LEADER
    for cond in outcome.body["status"]["conditions"]:
        assert cond["lastTransitionTime"] == NOW_STAMP


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda o: o.__setitem__("kind", "Pod"), id="observed kind Pod"),
        pytest.param(lambda o: o.pop("kind"), id="observed without kind"),
        pytest.param(lambda o: o.pop("apiVersion"), id="observed without apiVersion"),
        pytest.param(
            lambda o: o["metadata"].__setitem__("namespace", "elsewhere"), id="observed elsewhere"
        ),
    ],
)
@pytest.mark.parametrize("routed", [True, False], ids=["routed", "in doubt"])
def test_kept_read_only_services_slices_and_cronjobs_are_what_they_were_observed_as(
    edit: Any, routed: bool
) -> None:
    # The same rule for the children the read-only and backup parts keep (the spec no
    # longer asks for them, so they are kept as they are / suspended): each comes back
    # as its children group's GVK, in the parent's namespace, whatever it claims.
    from tests.child_helpers import (
        backup_fields,
        cluster_answers,
        listed_slice,
        observed,
        read_only_service,
        request_body,
    )

    _, first = run(request_body(spec=seed_spec(backup=backup_fields())), cluster_answers(P0))
    (cronjob,) = observed(*(c for c in first.body["children"] if c["kind"] == "CronJob"))
    kept_objects = {
        ("v1", "Service"): read_only_service(),
        ("discovery.k8s.io/v1", "EndpointSlice"): listed_slice([P1]),
        ("batch/v1", "CronJob"): cronjob,
    }
    for obj in kept_objects.values():
        edit(obj)
    body = request_body(
        spec=seed_spec(),
        services=[make_service(pod=P0), kept_objects[("v1", "Service")]],
        slices=[kept_objects[("discovery.k8s.io/v1", "EndpointSlice")]],
        cronjobs=[kept_objects[("batch/v1", "CronJob")]],
    )
    _, outcome = run(body, cluster_answers(P0) if routed else {})
    replied = {
        (c["metadata"]["name"], c["apiVersion"], c["kind"], c["metadata"]["namespace"])
        for c in outcome.body["children"]
    }
    for (api_version, kind), obj in kept_objects.items():
        assert (obj["metadata"]["name"], api_version, kind, NAMESPACE) in replied


# ========================================== phase-spread healthy resyncs (issue 11)
# After a Metacontroller restart every parent is synced at once; each healthy resync
# lands the parent's next sync on a slot of its own (hooks.core.switchover.spread_resync), so
# the fleet spreads over one period instead of staying in one clump.

UIDS = [f"0f0e0d0c-0000-4000-8000-{i:012d}" for i in range(1000)]


T0 = NOW.timestamp()


def test_the_same_uid_always_gets_the_same_slot() -> None:
    """The slot is a function of the UID alone: every hook pod and every restart agree."""
    for uid in UIDS[:50]:
        first = T0 + spread_resync(10.0, uid, T0)
        for offset in (0.4, 3.3, 86_400.7):
            later = T0 + offset + spread_resync(10.0, uid, T0 + offset)
            drift = (later - first) % 10.0
            assert min(drift, 10.0 - drift) < 1e-6, (uid, offset)


def test_a_fleet_synced_at_once_spreads_over_one_period() -> None:
    """1,000 parents synced at the same instant: their next syncs fill the period evenly."""
    period = 30.0
    landing = [(T0 + spread_resync(period, uid, T0)) % period for uid in UIDS]
    buckets = [0] * 10
    for at in landing:
        buckets[int(at / period * 10)] += 1
    assert min(buckets) >= 70 and max(buckets) <= 130, buckets  # 100 each if even


def test_the_resync_is_between_half_a_period_and_one_and_a_half() -> None:
    for period in (0.5, 1.0, 7.0, 30.0, 300.0):
        for i, uid in enumerate(UIDS[:200]):
            resync = spread_resync(period, uid, T0 + i * 0.37)
            assert period / 2 <= resync < period * 1.5


def test_once_on_its_slot_a_cluster_resyncs_every_period() -> None:
    """Steady state: the sync at the slot asks for one period (not a clump-forming jump)."""
    uid = UIDS[7]
    arrival = T0 + spread_resync(30.0, uid, T0)
    assert spread_resync(30.0, uid, arrival) == pytest.approx(30.0)
    assert spread_resync(30.0, uid, arrival + 0.05) == pytest.approx(29.95)


def test_the_slots_are_stable_across_releases() -> None:
    """Golden values: a change of the hash, its size or the arithmetic would move every
    cluster of a fleet to a new slot during a rolling upgrade of the hook."""
    assert spread_resync(30.0, UIDS[0], 0.0) == pytest.approx(30.674303037185553, abs=1e-9)
    assert spread_resync(30.0, UIDS[1], 1000.0) == pytest.approx(18.652660985373927, abs=1e-9)


def test_exactly_half_a_period_before_the_slot_is_not_pushed_a_period_further() -> None:
    """UIDS[0]'s slot of an 8 s period is at 0.179814143249481 s: 4 s before it is kept."""
    now = 0.179814143249481 + 4.0
    assert spread_resync(8.0, UIDS[0], now) == 4.0
    assert spread_resync(8.0, UIDS[0], now + 0.5) == pytest.approx(11.5)


def test_the_reply_s_resync_lands_on_the_parent_s_slot_at_any_time() -> None:
    body = sync_body(services=[make_service(pod=P0)])
    landings = set()
    for at in (NOW, LATER, LATER + timedelta(seconds=3.5), LATER + timedelta(days=2)):
        _, outcome = run(body, healthy(P0), now=at)
        resync = outcome.body["resyncAfterSeconds"]
        assert TIMING.healthy / 2 <= resync < TIMING.healthy * 1.5
        landings.add(round((at.timestamp() + resync) % TIMING.healthy, 6) % TIMING.healthy)
    assert len(landings) == 1, landings


def test_different_parents_get_different_resyncs_at_the_same_instant() -> None:
    resyncs = set()
    for uid in UIDS[:20]:
        body = sync_body(services=[make_service(pod=P0)])
        body["parent"]["metadata"]["uid"] = uid
        _, outcome = run(body, healthy(P0))
        resyncs.add(outcome.body["resyncAfterSeconds"])
    assert len(resyncs) == 20


def test_without_a_uid_the_slot_is_namespace_and_name() -> None:
    body = sync_body(services=[make_service(pod=P0)])
    del body["parent"]["metadata"]["uid"]
    _, outcome = run(body, healthy(P0))
    assert outcome.decision is Decision.ROUTED
    expected = spread_resync(TIMING.healthy, f"{NAMESPACE}/{CLUSTER}", NOW.timestamp())
    assert outcome.body["resyncAfterSeconds"] == expected
    assert outcome.body["resyncAfterSeconds"] != spread(TIMING.healthy, NOW)


def test_the_degraded_resync_is_not_spread() -> None:
    for at in (NOW, LATER, LATER + timedelta(seconds=1.3)):
        _, outcome = run(sync_body(services=[make_service(pod=P0)]), {}, now=at)
        assert outcome.decision is not Decision.ROUTED
        assert outcome.body["resyncAfterSeconds"] == TIMING.degraded


def test_a_short_period_never_goes_below_the_degraded_resync() -> None:
    timing = ResyncTiming(healthy=0.5, degraded=0.4)
    for i in range(40):
        at = NOW + timedelta(seconds=i * 0.013)
        _, outcome = run(
            sync_body(services=[make_service(pod=P0)]), healthy(P0), now=at, timing=timing
        )
        assert 0.4 <= outcome.body["resyncAfterSeconds"] < 0.75


def test_a_parent_without_a_generation_reports_no_observed_generation() -> None:
    """``metadata.generation`` is optional in the envelope: no ``observedGeneration: null``."""
    body = sync_body()
    del body["parent"]["metadata"]["generation"]
    _, outcome = run(body, healthy(P1, timeline=4))
    assert outcome.decision is Decision.ROUTED
    assert "observedGeneration" not in outcome.body["status"]
    assert all("observedGeneration" not in c for c in outcome.body["status"]["conditions"])
