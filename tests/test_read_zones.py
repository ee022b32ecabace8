"""Unit tests of zone-aware reads (:mod:`hooks.children.read_zones`, and through ``reconcile``
the read-only part with ``spec.replicaService.trafficDistribution``).

Test design notes
-----------------
* Plain values: member Pods are :func:`tests.helpers.make_pod` with or without the
  ``topology.kubernetes.io/zone`` label, answers :func:`tests.child_helpers.answer`.
* :func:`decide` is tested over every mix (all zoned, one unzoned, none zoned, nobody
  listed, field unset); the plan over each fallback (``KeepEndpoints``, ``UseLeader``,
  ``Empty``) and with a consistency level, for the objects, the message and a steady state.
* What kube-proxy then does with the hints is not modelled here: it is proven on the real
  control plane with the real kube-proxy (tests/test_read_zones_kube.py).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from hooks.children.read_zones import ZoneDecision, decide
from hooks.domain.model import ZONE_LABEL
from hooks.loaders.schemas import load_spec
from tests.child_helpers import (
    MIB,
    READ_ONLY,
    SLICE,
    answer,
    children_of,
    cluster_answers,
    condition,
    listed_slice,
    request_body,
    rs_spec,
    slice_names,
)
from tests.helpers import P0, P1, P2, POD_NAME_LABEL, SELECTOR, fed_back, make_pod, run

ZONED = {P0: "zone-a", P1: "zone-a", P2: "zone-b"}


def labels(zone: str | None) -> dict[str, str]:
    return {} if zone is None else {ZONE_LABEL: zone}


# ================================================================ decide


@pytest.mark.parametrize("value", ["PreferSameZone", "PreferClose"])
def test_every_zoned_member_gets_its_zone(value: str) -> None:
    decision = decide(value, [(P1, labels("zone-a")), (P2, labels("zone-b"))])
    assert decision == ZoneDecision(
        {P1: "zone-a", P2: "zone-b"}, f"zone hints ({value}): {P1} zone-a, {P2} zone-b"
    )


@pytest.mark.parametrize("unzoned", [(P1,), (P2,), (P1, P2)])
def test_one_unzoned_member_means_no_zone_for_anyone(unzoned: tuple[str, ...]) -> None:
    listed = [(n, labels(None if n in unzoned else ZONED[n])) for n in (P1, P2)]
    decision = decide("PreferSameZone", listed)
    assert decision.zones == {}
    assert decision.note == (
        f"no zone hints (PreferSameZone): no {ZONE_LABEL} label on {', '.join(unzoned)}, "
        "so every client may reach every listed member"
    )


def test_an_empty_zone_label_is_no_zone() -> None:
    assert decide("PreferSameZone", [(P1, labels(""))]).zones == {}


def test_nobody_listed_writes_nothing_and_says_so() -> None:
    assert decide("PreferSameZone", []) == ZoneDecision(
        {}, "zone hints (PreferSameZone): no endpoint listed"
    )


@pytest.mark.parametrize("listed", [[], [(P1, labels("zone-a"))], [(P1, labels(None))]])
def test_unset_is_nothing_at_all(listed: list[tuple[str, dict[str, str]]]) -> None:
    assert decide(None, listed) == ZoneDecision()


# ================================================================ the spec


@pytest.mark.parametrize("value", ["PreferSameZone", "PreferClose"])
def test_each_value_loads(value: str) -> None:
    spec, problems = load_spec(rs_spec(trafficDistribution=value))
    assert problems == () and spec is not None and spec.replica_service is not None
    assert spec.replica_service.traffic_distribution == value


def test_unset_is_the_default() -> None:
    spec, _ = load_spec(rs_spec())
    assert spec is not None and spec.replica_service is not None
    assert spec.replica_service.traffic_distribution is None


@pytest.mark.parametrize("value", ["PreferSameNode", "preferSameZone", "", 1, ["PreferClose"]])
def test_an_invalid_value_is_a_spec_problem_naming_the_field(value: object) -> None:
    spec, problems = load_spec(rs_spec(trafficDistribution=value))
    assert spec is None
    text = " ".join(f"{p.field}: {p.message}" for p in problems)
    assert "spec.replicaService.trafficDistribution" in text, problems
    if isinstance(value, str):
        assert "must be one of: PreferSameZone, PreferClose" in text, problems


def test_an_invalid_value_keeps_everything_and_says_so_in_spec_valid() -> None:
    body = request_body(
        spec=rs_spec(trafficDistribution="PreferSameNode"), slices=[listed_slice([P1, P2])]
    )
    _, outcome = run(body, cluster_answers(P0))
    valid = condition(outcome, "SpecValid")
    assert valid["status"] == "False"
    assert "spec.replicaService.trafficDistribution" in valid["message"]
    assert slice_names(children_of(outcome, "EndpointSlice")[SLICE]) == [P1, P2]


# ================================================================ the plan


def zoned_pods(zones: dict[str, str | None]) -> list[dict[str, Any]]:
    return [
        make_pod(n, labels={**SELECTOR, POD_NAME_LABEL: n, "role": "replica", **labels(z)})
        for n, z in zones.items()
    ]


def slice_endpoints(outcome: Any) -> list[dict[str, Any]]:
    return list(children_of(outcome, "EndpointSlice")[SLICE].get("endpoints") or [])


def zones_written(outcome: Any) -> dict[str, tuple[str | None, Any]]:
    return {
        e["targetRef"]["name"]: (e.get("zone"), e.get("hints")) for e in slice_endpoints(outcome)
    }


def test_each_listed_replica_gets_its_zone_and_a_same_zone_hint() -> None:
    body = request_body(spec=rs_spec(trafficDistribution="PreferSameZone"), pods=zoned_pods(ZONED))
    _, outcome = run(body, cluster_answers(P0))
    assert zones_written(outcome) == {
        P1: ("zone-a", {"forZones": [{"name": "zone-a"}]}),
        P2: ("zone-b", {"forZones": [{"name": "zone-b"}]}),
    }
    service = children_of(outcome, "Service")[READ_ONLY]
    assert service["spec"]["trafficDistribution"] == "PreferSameZone"
    assert "selector" not in service["spec"]
    routed = condition(outcome, "ReplicasRouted")
    assert routed["message"] == (
        f"2 replica(s) within 16 MiB of leader {P0}: {P1}, {P2}; "
        f"zone hints (PreferSameZone): {P1} zone-a, {P2} zone-b"
    )


def test_the_primary_service_never_gets_a_zone_preference() -> None:
    body = request_body(spec=rs_spec(trafficDistribution="PreferSameZone"), pods=zoned_pods(ZONED))
    _, outcome = run(body, cluster_answers(P0))
    for name, service in children_of(outcome, "Service").items():
        if name != READ_ONLY:
            assert "trafficDistribution" not in service["spec"], service


def test_one_unzoned_replica_means_no_hints_and_the_message_names_it() -> None:
    body = request_body(
        spec=rs_spec(trafficDistribution="PreferSameZone"),
        pods=zoned_pods({P0: "zone-a", P1: "zone-a", P2: None}),
    )
    _, outcome = run(body, cluster_answers(P0))
    assert zones_written(outcome) == {P1: (None, None), P2: (None, None)}
    assert children_of(outcome, "Service")[READ_ONLY]["spec"]["trafficDistribution"] == (
        "PreferSameZone"
    )
    assert condition(outcome, "ReplicasRouted")["message"].endswith(
        f"; no zone hints (PreferSameZone): no {ZONE_LABEL} label on {P2}, "
        "so every client may reach every listed member"
    )


def test_an_unzoned_member_that_is_not_listed_does_not_matter() -> None:
    body = request_body(
        spec=rs_spec(trafficDistribution="PreferSameZone"),
        pods=zoned_pods({P0: None, P1: "zone-a", P2: "zone-b"}),
    )
    _, outcome = run(body, cluster_answers(P0, pg_orders_2=answer(P2, behind=64 * MIB)))
    assert zones_written(outcome) == {P1: ("zone-a", {"forZones": [{"name": "zone-a"}]})}


def test_replicas_all_in_another_zone_are_hinted_for_their_own_zone() -> None:
    """No zone has a replica for zone-a's clients: the hints still name the replicas' own
    zone (kube-proxy in zone-a then finds none for its zone and uses them all)."""
    pods = zoned_pods({P0: "zone-a", P1: "zone-b", P2: "zone-c"})
    body = request_body(spec=rs_spec(trafficDistribution="PreferSameZone"), pods=pods)
    _, outcome = run(body, cluster_answers(P0))
    assert zones_written(outcome) == {
        P1: ("zone-b", {"forZones": [{"name": "zone-b"}]}),
        P2: ("zone-c", {"forZones": [{"name": "zone-c"}]}),
    }


FALLBACKS = [
    ("KeepEndpoints", [P1, P2]),
    ("UseLeader", [P0]),
    ("Empty", []),
]


@pytest.mark.parametrize(("when", "expected"), FALLBACKS)
@pytest.mark.parametrize("unzoned", [None, P0, P1])
def test_each_fallback_is_hinted_all_or_nothing(
    when: str, expected: list[str], unzoned: str | None
) -> None:
    zones = {n: (None if n == unzoned else z) for n, z in ZONED.items()}
    body = request_body(
        spec=rs_spec(trafficDistribution="PreferSameZone", whenNoReplica=when),
        pods=zoned_pods(zones),
        slices=[listed_slice([P1, P2])],
    )
    lagging = cluster_answers(
        P0, pg_orders_1=answer(P1, behind=64 * MIB), pg_orders_2=answer(P2, behind=64 * MIB)
    )
    _, outcome = run(body, lagging)
    written = zones_written(outcome)
    assert sorted(written) == expected
    message = condition(outcome, "ReplicasRouted")["message"]
    if not expected:
        assert message.endswith("; zone hints (PreferSameZone): no endpoint listed")
    elif unzoned in expected:
        assert all(z == (None, None) for z in written.values()), written
        assert message.endswith(
            f"no {ZONE_LABEL} label on {unzoned}, so every client may reach every listed member"
        )
    else:
        assert written == {n: (zones[n], {"forZones": [{"name": zones[n]}]}) for n in expected}


@pytest.mark.parametrize(
    ("consistency", "states"),
    [("synchronous", ("sync", "async")), ("quorum", ("quorum", "async"))],
)
def test_a_consistency_level_and_zones_combine(consistency: str, states: tuple[str, str]) -> None:
    import dataclasses

    from hooks.domain.members import WalSender

    lead = dataclasses.replace(
        answer(P0, "primary"),
        walsenders=(WalSender(P1, "streaming", states[0]), WalSender(P2, "streaming", states[1])),
        patroni_version=(4, 1, 5),
    )
    body = request_body(
        spec=rs_spec(trafficDistribution="PreferSameZone", consistency=consistency),
        pods=zoned_pods(ZONED),
    )
    _, outcome = run(body, cluster_answers(P0) | {P0: lead})
    assert zones_written(outcome) == {P1: ("zone-a", {"forZones": [{"name": "zone-a"}]})}
    message = condition(outcome, "ReplicasRouted")["message"]
    assert message.endswith(f"; zone hints (PreferSameZone): {P1} zone-a"), message
    assert "levels (sync_state on" in message


@pytest.mark.parametrize("value", ["PreferSameZone", "PreferClose", None])
def test_a_second_round_over_the_first_rounds_objects_gives_the_same_reply(
    value: str | None,
) -> None:
    fields = {} if value is None else {"trafficDistribution": value}
    body = request_body(spec=rs_spec(**fields), pods=zoned_pods(ZONED))
    _, first = run(body, cluster_answers(P0))
    again = fed_back(body, first)
    again["children"]["EndpointSlice.discovery.k8s.io/v1"] = {
        SLICE: children_of(first, "EndpointSlice")[SLICE]
    }
    again["children"]["Service.v1"][READ_ONLY] = children_of(first, "Service")[READ_ONLY]
    _, second = run(again, cluster_answers(P0))
    assert second.body == first.body


def test_unset_writes_no_zone_even_for_zoned_pods() -> None:
    body = request_body(spec=rs_spec(), pods=zoned_pods(ZONED))
    _, outcome = run(body, cluster_answers(P0))
    assert zones_written(outcome) == {P1: (None, None), P2: (None, None)}
    assert "trafficDistribution" not in children_of(outcome, "Service")[READ_ONLY]["spec"]
    assert "zone" not in condition(outcome, "ReplicasRouted")["message"]


def test_removing_the_field_removes_zones_and_hints() -> None:
    zoned = request_body(spec=rs_spec(trafficDistribution="PreferSameZone"), pods=zoned_pods(ZONED))
    _, first = run(zoned, cluster_answers(P0))
    plain = request_body(spec=rs_spec(), pods=zoned_pods(ZONED))
    plain["children"]["EndpointSlice.discovery.k8s.io/v1"] = {
        SLICE: children_of(first, "EndpointSlice")[SLICE]
    }
    _, outcome = run(plain, cluster_answers(P0))
    assert zones_written(outcome) == {P1: (None, None), P2: (None, None)}


def test_every_mix_of_zones_is_all_or_nothing() -> None:
    """Exhaustive over three members × {zone-a, zone-b, none}, whoever is listed."""
    options = ("zone-a", "zone-b", None)
    for combo in itertools.product(options, repeat=3):
        for count in range(4):
            for listed in itertools.combinations((P0, P1, P2), count):
                zones = dict(zip((P0, P1, P2), combo, strict=True))
                decision = decide("PreferSameZone", [(n, labels(zones[n])) for n in listed])
                if all(zones[n] for n in listed):
                    assert decision.zones == {n: zones[n] for n in listed}
                else:
                    assert decision.zones == {}
                    assert "no zone hints" in decision.note
