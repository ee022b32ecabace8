"""Unit tests of the decision core (hooks.sync): rules over every scenario, and a property.

The test design notes are those of tests/test_sync_routing.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus
from hooks.domain.model import LAST_APPLIED_ANNOTATION
from testbed.fakes.patroni_wire import patroni_body
from tests.doubts import DOUBTS
from tests.helpers import (
    CLUSTER,
    NOW,
    P0,
    P1,
    P2,
    POD_NAME_LABEL,
    SELECTOR,
    SERVICE_NAME,
    TIMING,
    claims,
    down,
    fed_back,
    fixture,
    healthy,
    leader,
    make_pod,
    make_service,
    preserved,
    replica,
    run,
    seed_spec,
    service_selector,
    spread,
    sync_body,
    without_resync,
)
from tests.sync_cases import (
    LATER,
    SERVER_FIELDS,
    condition,
    config_map,
    observed_objects,
    replied_objects,
    services_of,
    walk_keys,
)

# =============================================== rules over every scenario


def _scenarios() -> dict[str, tuple[dict[str, Any], Mapping[str, MemberStatus]]]:
    with_config_map = {"ConfigMap.v1": {"pg-orders-extra": config_map()}}
    renamed = seed_spec(serviceRef={"name": "orders-rw"})
    finalize_empty = fixture("finalize-parent-deleting.json")
    finalize_empty["children"]["Service.v1"] = {}
    scenarios: dict[str, tuple[dict[str, Any], Mapping[str, MemberStatus]]] = {
        "fixture: first sync": (fixture("sync-first-no-service.json"), healthy(P0)),
        "fixture: first sync, no leader": (
            fixture("sync-first-no-service.json"),
            DOUBTS[0].answers,
        ),
        "fixture: failover in progress": (
            fixture("sync-no-leader-during-failover.json"),
            {P0: down(P0), P1: replica(P1, 2), P2: replica(P2)},
        ),
        "fixture: new leader": (fixture("sync-service-selects-old-leader.json"), healthy(P1, 2)),
        "fixture: finalize": (fixture("finalize-parent-deleting.json"), {}),
        "finalize, nothing left": (finalize_empty, {}),
        "routed, extra ConfigMap": (
            sync_body(services=[make_service(pod=P0)], extra_children=with_config_map),
            healthy(P1),
        ),
        "doubt, extra ConfigMap": (
            sync_body(services=[make_service(pod=P0)], extra_children=with_config_map),
            DOUBTS[0].answers,
        ),
        "routed, no last-applied": (
            sync_body(services=[make_service(pod=P0, last_applied=False)]),
            healthy(P1),
        ),
        "doubt, no last-applied": (
            sync_body(services=[make_service(pod=P0, last_applied=False)]),
            DOUBTS[1].answers,
        ),
        "renamed, routed": (sync_body(spec=renamed, services=[make_service(pod=P0)]), healthy(P1)),
        "renamed, doubt": (
            sync_body(spec=renamed, services=[make_service(pod=P0)]),
            DOUBTS[2].answers,
        ),
        "invalid spec": (
            sync_body(
                spec={"primarySelector": {}},
                services=[make_service(pod=P0)],
                extra_children=with_config_map,
            ),
            healthy(P1),
        ),
    }
    for doubt in DOUBTS:
        scenarios[f"doubt: {doubt.id}"] = (
            sync_body(pods=doubt.pods, services=[make_service(pod=P0, last_applied=False)]),
            doubt.answers,
        )
    return scenarios


SCENARIOS = _scenarios()


@pytest.mark.parametrize("name", [n for n, (b, _) in SCENARIOS.items() if not b["finalizing"]])
def test_nothing_observed_is_ever_dropped(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    assert observed_objects(body) <= replied_objects(outcome)
    assert len(outcome.body["children"]) == len(replied_objects(outcome))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_no_child_carries_server_owned_fields_or_records(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    for child in outcome.body["children"]:
        assert "status" not in child
        assert not [(p, k) for p, k in walk_keys(child) if k in SERVER_FIELDS]
        assert LAST_APPLIED_ANNOTATION not in child["metadata"].get("annotations", {})
        if child["kind"] == "Service":
            assert child["apiVersion"] == "v1"
            assert child["metadata"]["namespace"] == body["parent"]["metadata"]["namespace"]
            assert child["spec"]["selector"], "a Service without a selector would select nothing"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_status_converges_when_it_is_fed_back(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, first = run(body, answers, now=NOW)
    following = fed_back(body, first)
    _, second = run(following, answers, now=LATER)
    _, third = run(fed_back(following, second), answers, now=LATER + timedelta(hours=3))

    # All but the resync, which moves with the clock (the status never does).
    assert without_resync(second.body) == without_resync(first.body)
    assert without_resync(third.body) == without_resync(first.body)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_same_inputs_at_another_time_give_the_same_reply_when_nothing_transitioned(
    name: str,
) -> None:
    body, answers = SCENARIOS[name]
    _, settled = run(body, answers, now=NOW)
    steady = fed_back(body, settled)
    _, at_one = run(steady, answers, now=LATER)
    _, at_other = run(steady, answers, now=LATER + timedelta(days=2))
    assert json.dumps(without_resync(at_one.body), sort_keys=True) == json.dumps(
        without_resync(at_other.body), sort_keys=True
    )


# ===================================================== property over clusters

#: Mostly healthy answers, so that every decision (routed included) is drawn often.
NON_LEADER_KINDS = ("replica",) * 6 + ("down",) * 3 + ("promoting", "stopping", "not-patroni")


CLAIMING = {"leader", "promoting", "stopping"}


#: Answered at all (``reachable`` in the status); answered as Patroni: all but not-patroni.
REACHABLE = {"leader", "replica", "promoting", "stopping", "not-patroni"}


AS_PATRONI = REACHABLE - {"not-patroni"}


def _answer(kind: str, name: str) -> MemberStatus:
    return {
        "leader": lambda: leader(name),
        "replica": lambda: replica(name),
        "down": lambda: down(name),
        "promoting": lambda: claims(name, "replica"),
        "stopping": lambda: claims(name, "primary", "stopping"),
        "not-patroni": lambda: MemberStatus.from_api_response(name, 200, {"status": "ok"}),
    }[kind]()


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.integers(min_value=0, max_value=5))
    names = [f"{CLUSTER}-{i}" for i in range(size)]
    pods, kinds, ips, deleting, selectable, pod_names = [], {}, {}, {}, {}, {}
    for name in names:
        ips[name] = draw(st.sampled_from(["auto"] * 6 + [None, "evil.example", "fd00::7"]))
        deleting[name] = draw(st.sampled_from([False] * 5 + [True]))
        labels_kind = draw(
            st.sampled_from(["ok"] * 5 + ["no-pod-name", "no-scope", "another-pod-name"])
        )
        labels = {**SELECTOR, POD_NAME_LABEL: name}
        if labels_kind == "no-pod-name":
            del labels[POD_NAME_LABEL]
        elif labels_kind == "no-scope":
            del labels["cluster-name"]
        elif labels_kind == "another-pod-name":  # a copy of another member (issue 29)
            labels[POD_NAME_LABEL] = draw(st.sampled_from(names))
        selectable[name] = labels == {**SELECTOR, POD_NAME_LABEL: name}
        pod_names[name] = labels.get(POD_NAME_LABEL)
        kinds[name] = draw(st.sampled_from(NON_LEADER_KINDS))
        pods.append(make_pod(name, ips[name], labels=labels, deleting=deleting[name]))
    if names and draw(st.integers(min_value=0, max_value=3)):  # usually one member leads
        kinds[draw(st.sampled_from(names))] = "leader"
    service_kind = draw(
        st.sampled_from(["none", "pinned", "hand-edited", "renamed", "no-last-applied"])
    )
    services = {
        "none": [],
        "pinned": [make_service(pod=P1)],
        "hand-edited": [make_service(pod=P0, selector={"hand": "edited"})],
        "renamed": [make_service("old-name", pod=P2)],
        "no-last-applied": [make_service(pod=P0, last_applied=False)],
    }[service_kind]
    extra = {"ConfigMap.v1": {"pg-orders-extra": config_map()}} if draw(st.booleans()) else None
    body = sync_body(
        pods=pods,
        services=services,
        extra_children=extra,
        generation=draw(st.integers(min_value=1, max_value=9)),
    )
    return {
        "body": body,
        "answers": {n: _answer(kinds[n], n) for n in names},
        "names": names,
        "kinds": kinds,
        "probed": {n for n in names if ips[n] in ("auto", "fd00::7")},
        "deleting": deleting,
        "selectable": selectable,
        "pod_names": pod_names,
    }


def _oracle(case: Mapping[str, Any]) -> tuple[Decision, str | None]:
    """The routing rules, written independently of hooks.sync."""
    names = case["names"]
    if not names:
        return Decision.NO_MEMBERS, None
    kind = {n: case["kinds"][n] if n in case["probed"] else "down" for n in names}
    claimants = [n for n in names if kind[n] in CLAIMING]
    if len(claimants) > 1:
        return Decision.MULTIPLE_LEADERS, None
    if not claimants:
        return Decision.NO_LEADER, None
    (claimant,) = claimants
    if kind[claimant] != "leader":
        return Decision.LEADER_NOT_READY, None
    if case["deleting"][claimant]:
        return Decision.LEADER_TERMINATING, None
    if not case["selectable"][claimant]:
        return Decision.LEADER_NOT_SELECTABLE, None
    if any(case["pod_names"][n] == claimant for n in names if n != claimant):
        return Decision.SELECTOR_NOT_UNIQUE, None
    return Decision.ROUTED, claimant


@settings(max_examples=300, deadline=None, database=None)
@given(case=clusters())
def test_property_every_reply_obeys_the_routing_rules(case: dict[str, Any]) -> None:
    body = case["body"]
    observed_services = body["children"]["Service.v1"]
    _, outcome = run(body, case["answers"])
    expected, chosen = _oracle(case)

    assert outcome.decision is expected
    assert observed_objects(body) <= replied_objects(outcome)
    services = services_of(outcome)
    for child in outcome.body["children"]:
        assert not [k for _, k in walk_keys(child) if k in SERVER_FIELDS]
    ready, routed = condition(outcome.body, "Ready"), condition(outcome.body, "PrimaryRouted")
    assert (ready["reason"], routed["reason"]) == (expected.value, expected.value)
    if expected is Decision.ROUTED:
        assert chosen is not None
        assert SERVICE_NAME in services
        assert {n: s["spec"]["selector"] for n, s in services.items()} == {
            n: service_selector(chosen) for n in services
        }
        # Exactly one Pod behind the primary Service: the selector matches the leader alone.
        selector = service_selector(chosen)
        matched = [
            p["metadata"]["name"]
            for p in body["related"]["Pod.v1"].values()
            if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
        ]
        assert matched == [chosen]
        assert outcome.body["resyncAfterSeconds"] == spread(TIMING.healthy, NOW, body)
        assert (ready["status"], routed["status"]) == ("True", "True")
    else:
        assert services == {n: preserved(s) for n, s in observed_services.items()}
        assert {n: s["spec"]["selector"] for n, s in services.items()} == {
            n: s["spec"]["selector"] for n, s in observed_services.items()
        }
        assert outcome.body["resyncAfterSeconds"] == TIMING.degraded
        assert (ready["status"], routed["status"]) == ("False", "False")
    members = outcome.body["status"]["members"]
    assert [m["name"] for m in members] == sorted(case["names"])
    assert [m["reachable"] for m in members] == [
        n in case["probed"] and case["kinds"][n] in REACHABLE for n in sorted(case["names"])
    ]
    as_patroni = [
        n for n in case["names"] if n in case["probed"] and case["kinds"][n] in AS_PATRONI
    ]
    assert outcome.body["status"]["membersAnswered"] == f"{len(as_patroni)}/{len(case['names'])}"
    reachable = condition(outcome.body, "MembersReachable")
    if case["names"]:
        all_answered = len(as_patroni) == len(case["names"])
        assert reachable["status"] == ("True" if all_answered else "False")
    _, again = run(fed_back(body, outcome), case["answers"], now=LATER)
    assert without_resync(again.body) == without_resync(outcome.body)


def test_members_named_unlike_their_pods_route_when_the_spec_turns_the_name_check_off() -> None:
    answers = {
        P0: replica(P0),
        P1: MemberStatus.from_api_response(P1, 200, patroni_body("primary", name="db-b")),
        P2: replica(P2),
    }
    spec = seed_spec(patroni={"memberNameMustMatchPod": False})
    _, outcome = run(sync_body(spec=spec, services=[make_service(pod=P0)]), answers)
    assert outcome.decision is Decision.ROUTED
    assert services_of(outcome)[SERVICE_NAME]["spec"]["selector"] == service_selector(P1)


def test_a_member_answer_without_a_patroni_name_is_not_refused_by_the_name_check() -> None:
    body = patroni_body("primary", name=P1)
    del body["patroni"]["name"]
    answers = {P0: replica(P0), P1: MemberStatus.from_api_response(P1, 200, body), P2: replica(P2)}
    _, outcome = run(sync_body(services=[make_service(pod=P0)]), answers)
    assert outcome.decision is Decision.ROUTED
    # ... but the status says the guard could not check it (issue 10), not silently.
    guard = condition(outcome.body, "MemberNameGuard")
    assert (guard["status"], guard["reason"]) == ("False", "Unavailable")
    assert "Patroni 4.1.5 on pg-orders-1;" in guard["message"]


def _versioned(name: str, version: str, *, leads: bool = False) -> MemberStatus:
    body = patroni_body("master" if leads else "replica", name=name)
    body["patroni"] = {"version": version, "scope": "pg-orders"}  # before 3.2.0: no name
    return MemberStatus.from_api_response(name, 200 if leads else 503, body)


@pytest.mark.parametrize(
    ("spec", "answers", "expected"),
    [
        pytest.param(
            {},
            {P0: replica(P0), P1: leader(P1), P2: down(P2)},
            (
                "True",
                "Active",
                "Every member that answered reports its Patroni name; a leader whose name is "
                "not its Pod's is never routed to",
            ),
            id="every answer carries its name",
        ),
        pytest.param(
            {},
            {
                P0: _versioned(P0, "3.1.2"),
                P1: _versioned(P1, "3.0.3", leads=True),
                P2: _versioned(P2, "3.1.2"),
            },
            (
                "False",
                "Unavailable",
                "No patroni.name in the answer (Patroni 3.0.3 on pg-orders-1; Patroni 3.1.2 on "
                "pg-orders-0, pg-orders-2; Patroni reports it since 3.2.0): "
                "memberNameMustMatchPod cannot check these members",
            ),
            id="patroni before 3.2.0",
        ),
        pytest.param(
            {"patroni": {"memberNameMustMatchPod": False}},
            {P0: replica(P0), P1: leader(P1), P2: replica(P2)},
            (
                "False",
                "Disabled",
                "spec.patroni.memberNameMustMatchPod is false: Patroni member names are not "
                "checked",
            ),
            id="disabled",
        ),
        pytest.param(
            {},
            {P0: down(P0), P1: down(P1), P2: MemberStatus.not_patroni(P2, "HTTP 302", 302)},
            ("Unknown", "NoAnswers", "No member answered as Patroni"),
            id="nobody answered as Patroni",
        ),
    ],
)
def test_the_member_name_guard_condition_says_whether_the_guard_can_work(
    spec: dict[str, Any], answers: dict[str, MemberStatus], expected: tuple[str, str, str]
) -> None:
    body = sync_body(spec=seed_spec(**spec), services=[make_service(pod=P0)])
    _, outcome = run(body, answers)
    guard = condition(outcome.body, "MemberNameGuard")
    assert (guard["status"], guard["reason"], guard["message"]) == expected


def test_an_invalid_spec_reply_carries_no_member_conditions() -> None:
    previous = sync_body(services=[make_service(pod=P1)])
    _, first = run(previous, healthy(P1))
    body = fed_back(sync_body(spec=seed_spec(healthCheckPath="/replica")), first)
    _, outcome = run(body, healthy(P1))
    types = [c["type"] for c in outcome.body["status"]["conditions"]]
    assert "MembersReachable" not in types and "MemberNameGuard" not in types
    assert "membersAnswered" not in outcome.body["status"]
