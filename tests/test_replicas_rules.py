"""The read-only Service part: address families, rules, every verdict, impostor Pods.

The test design notes are those of tests/test_replicas_objects.py.
"""

from __future__ import annotations

import copy
import ipaddress
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from hooks.children.read_members import NOT_READY, classify
from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus
from hooks.domain.model import ENDPOINTSLICE_KEY, LAST_APPLIED_ANNOTATION, POD_NAME_LABEL
from hooks.loaders.schemas import load_spec
from tests.child_helpers import (
    LEADER_AT,
    MIB,
    READ_ONLY,
    SLICE,
    answer,
    children_of,
    cluster_answers,
    condition,
    listed_slice,
    observed,
    read_only_service,
    request_body,
    rs_spec,
    slice_names,
)
from tests.doubts import DOUBTS
from tests.helpers import (
    CLUSTER,
    NOW,
    P0,
    P1,
    P2,
    SERVICE_NAME,
    down,
    fed_back,
    loaded_pod,
    make_pod,
    member_ip,
    preserved,
    run,
    seed_spec,
    without_resync,
)
from tests.replicas_cases import (
    PRIMARY,
    all_lagging,
    endpoints_of,
    paused_member,
    replicas_body,
    routed,
    tagged_member,
)

# ================================================================ address families


def test_ipv6_pods_get_an_ipv6_slice() -> None:
    pods = [make_pod(n, ip=f"fd00::{i + 1}") for i, n in enumerate((P0, P1, P2))]
    _, outcome = run(request_body(pods=pods), routed())

    slices = children_of(outcome, "EndpointSlice")
    assert list(slices) == [f"{READ_ONLY}-ipv6"]
    assert slices[f"{READ_ONLY}-ipv6"]["addressType"] == "IPv6"
    assert [e["addresses"] for e in slices[f"{READ_ONLY}-ipv6"]["endpoints"]] == [
        ["fd00::2"],
        ["fd00::3"],
    ]


def test_each_address_family_has_its_own_slice_and_a_slice_is_never_dropped() -> None:
    pods = [make_pod(P0), make_pod(P1), make_pod(P2, ip="fd00::3")]
    _, outcome = run(request_body(pods=pods), routed())
    slices = children_of(outcome, "EndpointSlice")
    assert {n: slice_names(s) for n, s in slices.items()} == {
        SLICE: [P1],
        f"{READ_ONLY}-ipv6": [P2],
    }

    # pg-orders-2 comes back with an IPv4 address: the IPv6 slice stays, empty.
    observed_slices = observed(*slices.values())
    body = request_body(slices=observed_slices)
    _, outcome = run(body, routed())
    slices = children_of(outcome, "EndpointSlice")
    assert slice_names(slices[SLICE]) == [P1, P2]
    assert slices[f"{READ_ONLY}-ipv6"]["endpoints"] is None


def test_with_nobody_listed_the_observed_slice_s_family_is_kept_and_no_other_is_made() -> None:
    """The pods moved to IPv6 and no replica is listable: the IPv4 slice stays (emptied);
    the leader's family does not add an IPv6 slice, as it would for a Service with none."""
    pods = [make_pod(n, ip=f"fd00::{i + 1}") for i, n in enumerate((P0, P1, P2))]
    body = request_body(pods=pods, slices=[listed_slice([P1])])
    _, outcome = run(body, routed(pg_orders_1=down(P1), pg_orders_2=down(P2)))
    slices = children_of(outcome, "EndpointSlice")
    assert list(slices) == [SLICE]
    assert slices[SLICE]["endpoints"] is None


def test_with_nobody_listed_an_observed_ipv6_slice_is_kept_and_no_ipv4_one_is_made() -> None:
    pods = [make_pod(n, ip=f"fd00::{i + 1}") for i, n in enumerate((P0, P1, P2))]
    _, first = run(request_body(pods=pods), routed())
    observed_slices = observed(*children_of(first, "EndpointSlice").values())
    body = request_body(slices=observed_slices)  # the pods are back on IPv4
    _, outcome = run(body, routed(pg_orders_1=down(P1), pg_orders_2=down(P2)))
    slices = children_of(outcome, "EndpointSlice")
    assert list(slices) == [f"{READ_ONLY}-ipv6"]
    assert slices[f"{READ_ONLY}-ipv6"]["endpoints"] is None


def test_another_slice_of_the_read_only_service_is_emptied_not_dropped() -> None:
    extra = listed_slice([P1])
    extra["metadata"]["name"] = f"{READ_ONLY}-old"
    body = request_body(slices=[listed_slice([P1, P2]), extra])
    _, outcome = run(body, routed())
    slices = children_of(outcome, "EndpointSlice")
    assert slices[f"{READ_ONLY}-old"] == {**preserved(extra), "endpoints": None}
    assert slice_names(slices[SLICE]) == [P1, P2]


def test_a_slice_of_ours_for_a_service_we_do_not_plan_is_kept_as_it_is() -> None:
    stray = listed_slice([P1], service="pg-orders-elsewhere")
    body = request_body(slices=[listed_slice([P1, P2]), stray])
    _, outcome = run(body, routed())
    assert children_of(outcome, "EndpointSlice")[stray["metadata"]["name"]] == preserved(stray)


# ========================================================== rules over scenarios


def _scenarios() -> dict[str, tuple[dict[str, Any], Mapping[str, MemberStatus]]]:
    service, slice_ = read_only_service(), listed_slice([P1, P2])
    existing = {"services": [PRIMARY, service], "slices": [slice_]}
    return {
        "first sync": (request_body(), routed()),
        "steady": (request_body(**existing), routed()),
        "one lagging": (
            request_body(**existing),
            routed(pg_orders_2=answer(P2, behind=40 * MIB)),
        ),
        "all lagging, keep": (request_body(**existing), all_lagging()),
        "all lagging, use leader": (
            request_body(spec=rs_spec(whenNoReplica="UseLeader"), **existing),
            all_lagging(),
        ),
        "all lagging, empty": (
            request_body(spec=rs_spec(whenNoReplica="Empty"), **existing),
            all_lagging(),
        ),
        "failover": (request_body(**existing), cluster_answers(P1, pg_orders_0=down(P0))),
        "no leader": (request_body(**existing), DOUBTS[0].answers),
        "unreachable replica": (
            request_body(**existing),
            routed(pg_orders_1=down(P1)),
        ),
        "removed from spec": (
            request_body(spec=seed_spec(), **existing),
            routed(),
        ),
        "finalize": (request_body(finalizing=True, **existing), {}),
    }


SCENARIOS = _scenarios()


LIVE = [n for n, (b, _) in SCENARIOS.items() if not b["finalizing"]]


@pytest.mark.parametrize("name", LIVE)
def test_nothing_observed_is_ever_dropped(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    observed_ids = {(o["kind"], n) for group in body["children"].values() for n, o in group.items()}
    replied = {(c["kind"], c["metadata"]["name"]) for c in outcome.body["children"]}
    assert observed_ids <= replied


@pytest.mark.parametrize("name", LIVE)
def test_the_primary_and_the_read_only_endpoints_never_share_a_pod(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    services = children_of(outcome, "Service")
    selected = services[SERVICE_NAME]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"]
    listed = {n for s in children_of(outcome, "EndpointSlice").values() for n in slice_names(s)}
    if "use leader" in name:
        assert listed == {selected}
    else:
        assert selected not in listed


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_no_child_carries_server_owned_fields(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    for child in outcome.body["children"]:
        metadata = child["metadata"]
        assert set(metadata) <= {"name", "namespace", "labels", "annotations"}, metadata
        assert LAST_APPLIED_ANNOTATION not in metadata.get("annotations", {})
        assert "status" not in child
        if child["kind"] == "Service":
            assert not {"clusterIP", "clusterIPs", "ipFamilies"} & set(child["spec"])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_status_converges_when_it_is_fed_back(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, first = run(body, answers, now=NOW)
    following = fed_back(body, first)
    _, second = run(following, answers, now=NOW + timedelta(minutes=5))
    # All but the phase-spread resync, which moves with the clock (the status never does).
    assert without_resync(second.body) == without_resync(first.body)


def test_moving_lag_values_inside_a_category_change_nothing_in_the_reply() -> None:
    body = request_body(services=[PRIMARY, read_only_service()], slices=[listed_slice([P1, P2])])
    a = routed(pg_orders_1=answer(P1, behind=3), pg_orders_2=answer(P2, behind=40 * MIB))
    b = routed(pg_orders_1=answer(P1, behind=9 * MIB), pg_orders_2=answer(P2, behind=99 * MIB))
    _, first = run(body, a)
    _, second = run(fed_back(body, first), b, now=NOW + timedelta(seconds=1))
    # All but the phase-spread resync, which moves with the clock (the status never does).
    assert json.dumps(without_resync(first.body), sort_keys=True) == json.dumps(
        without_resync(second.body), sort_keys=True
    )
    assert str(LEADER_AT) not in json.dumps(first.body["status"])


def test_the_observed_slice_is_reproduced_exactly_in_a_steady_state() -> None:
    body, answers = SCENARIOS["steady"]
    _, outcome = run(body, answers)
    (slice_,) = body["children"][ENDPOINTSLICE_KEY].values()
    applied = json.loads(slice_["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    replied = copy.deepcopy(children_of(outcome, "EndpointSlice")[SLICE])
    replied["metadata"]["labels"]["controller-uid"] = applied["metadata"]["labels"][
        "controller-uid"
    ]
    assert replied == applied


# ============================================ classify: every verdict spelled out
# One row per rule of replicas.classify, with the whole verdict: listed (True), left out
# (False) or in doubt (None: unreachable, kept as it was), the phrase, and whether
# KeepEndpoints may keep the member listed when nobody qualifies.

_LEADER = answer(P0, "primary")


_READY_POD = make_pod(P1)


def _not_ready(name: str) -> dict[str, Any]:
    pod = make_pod(name)
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return pod


def _terminating(name: str) -> dict[str, Any]:
    return make_pod(name, deleting=True)


def _v3(**changes: Any) -> MemberStatus:
    body = replicas_body(P1, **changes)
    body["patroni"] = {"version": "3.0.2", "scope": CLUSTER}
    body.pop("replication_state", None)
    return MemberStatus.from_api_response(P1, 503, body)


@pytest.mark.parametrize(
    ("member", "pod", "ip", "options", "verdict"),
    [
        (answer(P1), _READY_POD, "auto", {}, (True, "", False)),
        (_LEADER, make_pod(P0), "auto", {}, (False, "leader", False)),
        (answer(P1), _terminating(P1), "auto", {}, (False, "terminating", False)),
        (answer(P1), _READY_POD, None, {}, (False, "no pod IP", False)),
        (down(P1), _not_ready(P1), "auto", {}, (False, "unreachable, Pod not ready", False)),
        (down(P1), _READY_POD, "auto", {}, (None, "unreachable", False)),
        (down(P1), {**_READY_POD, "status": "junk"}, "auto", {}, (None, "unreachable", False)),
        (
            down(P1),
            {
                **_READY_POD,
                "status": {"conditions": ["junk", {"type": "Ready", "status": "False"}]},
            },
            "auto",
            {},
            (False, "unreachable, Pod not ready", False),
        ),
        (
            down(P1),
            {**_READY_POD, "status": {"conditions": "junk"}},
            "auto",
            {},
            (None, "unreachable", False),
        ),
        (
            MemberStatus.not_patroni(P1, "HTTP 302 on /primary without Patroni JSON", 302),
            _READY_POD,
            "auto",
            {},
            (False, "not a Patroni answer", False),
        ),
        (
            answer(P1, patroni_name="pg-other-3"),
            _READY_POD,
            "auto",
            {},
            (False, "answers as Patroni member pg-other-3", False),
        ),
        (
            answer(P1, patroni_name="pg-other-3"),
            _READY_POD,
            "auto",
            {"verify": False},
            (True, "", False),
        ),
        (
            answer(P1, scope="pg-billing"),
            _READY_POD,
            "auto",
            {},
            (False, "member of Patroni scope pg-billing", False),
        ),
        (
            answer(P1, "standby_leader"),
            _READY_POD,
            "auto",
            {},
            (False, "role standby_leader", False),
        ),
        (
            MemberStatus.from_api_response(P1, 503, {**replicas_body(P1), "role": None}),
            _READY_POD,
            "auto",
            {},
            (False, "role unknown", False),
        ),
        (answer(P1, state="starting"), _READY_POD, "auto", {}, (False, "state starting", False)),
        (
            MemberStatus.from_api_response(P1, 503, {**replicas_body(P1), "state": None}),
            _READY_POD,
            "auto",
            {},
            (False, "state unknown", False),
        ),
        (
            tagged_member(P1, noloadbalance=True),
            _READY_POD,
            "auto",
            {},
            (False, "tagged noloadbalance", False),
        ),
        (
            _v3(),
            _READY_POD,
            "auto",
            {},
            (False, "Patroni 3.0.2 reports no replication_state (since 3.0.4)", True),
        ),
        (
            answer(P1, replication_state="in archive recovery"),
            _READY_POD,
            "auto",
            {},
            (False, "not streaming (in archive recovery)", True),
        ),
        (
            answer(P1, replication_state=None),
            _READY_POD,
            "auto",
            {},
            (False, "not streaming (unknown)", True),
        ),
        (
            answer(P1, behind=None),
            _READY_POD,
            "auto",
            {},
            (False, "no replayed WAL position", True),
        ),
        (paused_member(P1), _READY_POD, "auto", {}, (False, "replay paused", False)),
        (paused_member(P1), _READY_POD, "auto", {"include_paused": True}, (True, "", False)),
        (answer(P1, behind=MIB), _READY_POD, "auto", {}, (True, "", False)),
        (
            answer(P1, behind=MIB + 1),
            _READY_POD,
            "auto",
            {},
            (False, "replay lags more than 1 MiB", True),
        ),
        # Patroni's own /readiness (the Pod's readiness probe) says no: left out, last.
        (answer(P1), _not_ready(P1), "auto", {}, (False, NOT_READY, False)),
        (answer(P1, behind=MIB), _not_ready(P1), "auto", {}, (False, NOT_READY, False)),
        (
            answer(P1, behind=MIB + 1),
            _not_ready(P1),
            "auto",
            {},
            (False, "replay lags more than 1 MiB", True),
        ),
        (paused_member(P1), _not_ready(P1), "auto", {}, (False, "replay paused", False)),
        (
            paused_member(P1),
            _not_ready(P1),
            "auto",
            {"include_paused": True},
            (False, NOT_READY, False),
        ),
        (
            answer(P1, state="starting"),
            _not_ready(P1),
            "auto",
            {},
            (False, "state starting", False),
        ),
    ],
)
def test_classify_gives_the_whole_verdict(
    member: MemberStatus,
    pod: dict[str, Any],
    ip: str | None,
    options: dict[str, bool],
    verdict: tuple[bool | None, str, bool],
) -> None:
    address = ipaddress.ip_address(member_ip(member.name)) if ip == "auto" else None
    spec_body = rs_spec(maxLagBytes=MIB, includePausedReplicas=options.get("include_paused", False))
    spec_body["patroni"] = {"memberNameMustMatchPod": options.get("verify", True)}
    spec, problems = load_spec(spec_body)
    assert spec is not None, problems
    got = classify(member, loaded_pod(pod), address, _LEADER, LEADER_AT, spec)
    assert (got.listed, got.reason, got.keepable) == verdict


# ====================================================== impostor Pods (issue 29)


@pytest.mark.parametrize(
    "labels",
    [
        {"application": "patroni", "cluster-name": CLUSTER, POD_NAME_LABEL: P2},
        {"application": "patroni", "cluster-name": CLUSTER},
        {"application": "patroni", "cluster-name": CLUSTER, POD_NAME_LABEL: P0},
    ],
    ids=["a copy of a replica", "no pod-name label", "the leader's pod-name label"],
)
def test_a_pod_that_is_not_its_statefulset_member_is_never_listed(labels: dict[str, str]) -> None:
    """A Pod with the members' labels whose pod-name label is not its own name is no member:
    even answering as a perfect Patroni replica under its own name, it is never listed."""
    impostor = "pg-orders-copy"
    pods = [
        make_pod(P0),
        make_pod(P1),
        make_pod(P2),
        make_pod(impostor, "10.244.9.10", labels=labels),
    ]
    answers = {**routed(), impostor: answer(impostor)}

    _, outcome = run(request_body(pods=pods), answers)

    if labels.get(POD_NAME_LABEL) == P0:
        # The primary is not routed (SelectorNotUnique), so no slice is written at all.
        assert outcome.decision is Decision.SELECTOR_NOT_UNIQUE
        assert children_of(outcome, "EndpointSlice") == {}
    else:
        assert endpoints_of(outcome) == [P1, P2]
        assert (
            "pg-orders-copy (statefulset.kubernetes.io/pod-name label is not its name)"
            in (condition(outcome, "ReplicasRouted")["message"])
        )
