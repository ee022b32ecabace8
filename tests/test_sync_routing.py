"""Unit tests of the decision core (hooks.sync): routing, the DCS lock as the quorum, every doubt.

Unit tests of the decision core (:mod:`hooks.sync`), with plain dicts only.

Test design notes
-----------------
* Every test takes the path the app takes, minus HTTP: a request *body* (a plain
  dict shaped like Metacontroller v4.17.2's) → ``load_sync_request`` →
  ``probe_targets`` → a :class:`FakeProber` that plays Patroni for exactly the planned
  targets → ``reconcile(request, probes, now=..., timing=...)``. A pod the planner
  skips (no IP, a hostname) is therefore never "answered", as in production. No
  network, no Flask.
* ``TIMING`` (tests/helpers.py) uses values nobody would pick as defaults (healthy 7 s,
  degraded 0.25 s), so an assertion on ``resyncAfterSeconds`` cannot pass by coincidence.
* The doubt cases are one table (``DOUBTS``). Every row goes through the same strict
  oracle: the children are exactly the observed Service as ``preserved()`` rebuilds it,
  its selector equals the *observed object's* ``spec.selector``, both ``Ready`` and
  ``PrimaryRouted`` are ``False`` with the row's reason, and the resync is the degraded
  one. The same table runs with a hand-edited selector and with no Service at all.
* The rules that must hold for *every* reply ("nothing observed is dropped", "no
  server-owned field in any child", "the status converges") are checked over every
  scenario of this module (``SCENARIOS``) and by a Hypothesis property over random
  clusters, judged by an independent oracle of the routing rules.
* The no-hot-loop property: reconcile, feed the reply's status back as the parent's
  status (as Metacontroller's status write does), reconcile again at a later ``now``:
  the second reply must equal the first, byte for byte.
"""

from __future__ import annotations

import json

import pytest

from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus
from hooks.domain.model import LAST_APPLIED_ANNOTATION, LEADER_PATHS, ResyncTiming
from hooks.loaders.envelope import load_sync_request
from hooks.sync import reconcile
from testbed.fakes.patroni_wire import patroni_body
from tests.doubts import DOUBT_IDS, DOUBTS, Doubt
from tests.helpers import (
    CLUSTER,
    NAMESPACE,
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
    fixture,
    healthy,
    leader,
    make_pod,
    make_service,
    polled,
    preserved,
    replica,
    run,
    seed_spec,
    service_selector,
    spread,
    sync_body,
)
from tests.sync_cases import (
    MANAGED_BY,
    NOW_STAMP,
    ROUTED_STATUS,
    condition,
    expected_service,
)

# ====================================================================== routing


def test_first_sync_creates_the_service_once_patroni_confirms_the_leader() -> None:
    body = polled(fixture("sync-first-no-service.json"))
    _, outcome = run(body, healthy(P0))

    assert outcome.body["children"] == [expected_service(P0)]
    assert outcome.decision is Decision.ROUTED
    assert set(outcome.body) == {"status", "children", "resyncAfterSeconds"}
    assert outcome.body["resyncAfterSeconds"] == spread(TIMING.healthy, NOW, body)
    assert condition(outcome.body, "Ready")["status"] == "True"
    assert condition(outcome.body, "PrimaryRouted")["reason"] == "LeaderFound"


@pytest.mark.parametrize("leading", [P0, P1, P2])
def test_the_selector_is_the_primary_selector_plus_the_leaders_pod_name(leading: str) -> None:
    body = sync_body(services=[make_service(pod=P0)])
    _, outcome = run(body, healthy(leading))

    assert outcome.body["children"] == [expected_service(leading)]
    assert outcome.body["children"][0]["spec"]["selector"] == {
        "application": "patroni",
        "cluster-name": "pg-orders",
        "statefulset.kubernetes.io/pod-name": leading,
    }
    assert outcome.body["status"]["primary"] == leading


def test_after_a_failover_the_recorded_service_is_moved_to_the_new_leader() -> None:
    body = fixture("sync-service-selects-old-leader.json")
    _, outcome = run(body, healthy(P1, timeline=2))

    assert outcome.body["children"] == [expected_service(P1)]
    assert outcome.body["status"]["primary"] == P1
    assert outcome.body["status"]["timeline"] == 2
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == (P0, P1, True)
    assert "timeline 2" in condition(outcome.body, "Ready")["message"]


def test_ports_type_labels_and_annotations_of_the_service_come_from_the_spec() -> None:
    spec = seed_spec(
        serviceRef={"name": "orders-rw"},
        service={
            "type": "LoadBalancer",
            "ports": [
                {"name": "pg", "port": 5433, "targetPort": "postgresql"},
                {"name": "metrics", "port": 9187},
            ],
            "labels": {"team": "payments", "adg.io/tier": "db"},
            "annotations": {"example.com/owner": "dba team", "note": "any text, even: colons"},
        },
    )
    _, outcome = run(sync_body(spec=spec), healthy(P2))

    assert outcome.body["children"] == [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "orders-rw",
                "namespace": NAMESPACE,
                "labels": {**MANAGED_BY, "team": "payments", "adg.io/tier": "db"},
                "annotations": {"example.com/owner": "dba team", "note": "any text, even: colons"},
            },
            "spec": {
                "type": "LoadBalancer",
                "ports": [
                    {"name": "pg", "port": 5433, "targetPort": "postgresql", "protocol": "TCP"},
                    {"name": "metrics", "port": 9187, "targetPort": 9187, "protocol": "TCP"},
                ],
                "selector": service_selector(P2),
            },
        }
    ]


def test_the_service_namespace_is_always_the_parents() -> None:
    body = sync_body()
    body["parent"]["metadata"]["namespace"] = "payments-prod"
    _, outcome = run(body, healthy(P1))
    assert outcome.body["children"][0]["metadata"]["namespace"] == "payments-prod"


def test_a_probe_answer_for_a_pod_that_is_not_related_is_ignored() -> None:
    request = load_sync_request(sync_body())
    probes = {P0: replica(P0), P1: replica(P1), P2: replica(P2), "intruder": leader("intruder")}
    outcome = reconcile(request, probes, now=NOW, timing=TIMING)
    assert outcome.decision is Decision.NO_LEADER
    assert outcome.body["children"] == []
    assert [m["name"] for m in outcome.body["status"]["members"]] == [P0, P1, P2]


def test_a_standby_leader_is_routed_when_the_spec_asks_for_the_leader_path() -> None:
    spec = seed_spec(healthCheckPath="/leader")
    answers = {
        P0: MemberStatus.from_api_response(
            P0,
            200,
            patroni_body("standby_leader", name=P0),
            health_path="/leader",
            leader_roles=LEADER_PATHS["/leader"],
        ),
        P1: replica(P1),
        P2: replica(P2),
    }
    _, outcome = run(sync_body(spec=spec), answers)
    assert outcome.decision is Decision.ROUTED
    assert outcome.body["children"] == [expected_service(P0)]


@pytest.mark.parametrize(
    ("resync", "expected"),
    [
        (ResyncTiming(healthy=7.0, degraded=0.25), 7.0),
        (ResyncTiming(healthy=0.5, degraded=0.1), 0.5),
    ],
)
def test_a_healthy_reply_asks_for_the_healthy_resync(resync: ResyncTiming, expected: float) -> None:
    _, outcome = run(sync_body(services=[make_service(pod=P0)]), healthy(P0), timing=resync)
    assert outcome.body["resyncAfterSeconds"] == spread(expected, NOW)
    assert outcome.decision is Decision.ROUTED


# ------------------------------------------------ the DCS lock is the quorum


@pytest.mark.parametrize(
    ("members", "answered"),
    [
        (1, 1),
        (2, 1),
        (3, 1),
        (3, 2),
        (3, 3),
        (4, 2),
        (5, 1),
        (5, 2),
        (5, 3),
        (5, 5),
    ],
    ids=lambda v: str(v),
)
def test_the_lock_holder_is_routed_however_many_members_answered(
    members: int, answered: int
) -> None:
    """Issue 10: 1 of 3, 2 of 5, 1 of 5 answering with a leader among them: routed."""
    names = [f"{CLUSTER}-{i}" for i in range(members)]
    answers = {n: leader(n) if i == 0 else replica(n) for i, n in enumerate(names[:answered])}
    answers.update({n: down(n) for n in names[answered:]})
    body = sync_body(pods=[make_pod(n) for n in names], services=[make_service(pod=P1)])

    _, outcome = run(body, answers)

    assert outcome.decision is Decision.ROUTED
    assert outcome.body["children"] == [expected_service(P0)]
    assert outcome.body["status"]["membersAnswered"] == f"{answered}/{members}"
    reachable = condition(outcome.body, "MembersReachable")
    if answered == members:
        assert (reachable["status"], reachable["reason"]) == ("True", "AllMembersAnswered")
    else:
        assert (reachable["status"], reachable["reason"]) == ("False", "MembersUnreachable")
        missing = ", ".join(f"{n} (connection refused)" for n in names[answered:])
        assert reachable["message"] == (
            f"{answered} of {members} member(s) answered as Patroni; no answer from {missing}"
        )
    assert condition(outcome.body, "Ready")["status"] == "True"


@pytest.mark.parametrize(
    ("members", "answers", "decision"),
    [
        pytest.param(
            3, {0: "leader", 1: "leader"}, Decision.MULTIPLE_LEADERS, id="2 claim, 1 down"
        ),
        pytest.param(
            5, {0: "leader", 3: "leader"}, Decision.MULTIPLE_LEADERS, id="2 of 5, both 200"
        ),
        pytest.param(5, {2: "claims"}, Decision.LEADER_NOT_READY, id="1 of 5, still promoting"),
        pytest.param(5, {0: "replica", 1: "replica"}, Decision.NO_LEADER, id="2 of 5, no claimant"),
        pytest.param(3, {}, Decision.NO_LEADER, id="0 of 3"),
        pytest.param(5, {}, Decision.NO_LEADER, id="0 of 5"),
    ],
)
def test_the_guards_still_hold_among_few_answers(
    members: int, answers: dict[int, str], decision: Decision
) -> None:
    names = [f"{CLUSTER}-{i}" for i in range(members)]
    make = {"leader": leader, "replica": replica, "claims": lambda n: claims(n, "replica")}
    probes = {n: make[answers[i]](n) if i in answers else down(n) for i, n in enumerate(names)}
    body = sync_body(pods=[make_pod(n) for n in names], services=[make_service(pod=P1)])

    _, outcome = run(body, probes)

    assert outcome.decision is decision
    assert outcome.body["children"][0]["spec"]["selector"] == service_selector(P1)
    assert outcome.body["resyncAfterSeconds"] == TIMING.degraded
    assert outcome.body["status"]["membersAnswered"] == f"{len(answers)}/{members}"


def test_answers_that_are_not_patroni_do_not_block_the_lock_holder() -> None:
    """A redirect, an HTML page, an oversized body: answered, not leader, with the reason."""
    body = sync_body(services=[make_service(pod=P0)])
    probes = {
        P0: MemberStatus.not_patroni(P0, "HTTP 302 on /primary without Patroni JSON", 302),
        P1: leader(P1),
        P2: MemberStatus.not_patroni(P2, "body larger than 65536 bytes", 200),
    }

    _, outcome = run(body, probes)

    assert outcome.decision is Decision.ROUTED and outcome.primary == P1
    assert outcome.body["status"]["membersAnswered"] == "1/3"
    assert outcome.body["status"]["members"][0] == {
        "name": P0,
        "reachable": True,
        "reason": "HTTP 302 on /primary without Patroni JSON",
    }
    assert condition(outcome.body, "MembersReachable")["message"] == (
        "1 of 3 member(s) answered as Patroni; not a Patroni answer from "
        f"{P0} (HTTP 302 on /primary without Patroni JSON), {P2} (body larger than 65536 bytes)"
    )


# ======================================================================= doubts


@pytest.mark.parametrize("doubt", DOUBTS, ids=DOUBT_IDS)
def test_in_doubt_the_observed_service_is_kept_exactly(doubt: Doubt) -> None:
    observed = make_service(pod=P0)
    body = sync_body(pods=doubt.pods, services=[observed], status=ROUTED_STATUS)

    _, outcome = run(body, doubt.answers)

    assert outcome.decision is doubt.reason
    assert outcome.body["children"] == [preserved(observed)]
    assert outcome.body["children"][0]["spec"]["selector"] == observed["spec"]["selector"]
    assert outcome.body["resyncAfterSeconds"] == TIMING.degraded
    for type_ in ("Ready", "PrimaryRouted"):
        cond = condition(outcome.body, type_)
        assert (cond["status"], cond["reason"]) == ("False", doubt.reason.value)
        assert doubt.says in cond["message"]
        assert "keeping Service pg-orders-primary on pg-orders-0" in cond["message"]
        assert cond["lastTransitionTime"] == NOW_STAMP
    assert condition(outcome.body, "SpecValid")["status"] == "True"
    assert outcome.body["status"]["primary"] == P0
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == (P0, P0, False)


@pytest.mark.parametrize("doubt", DOUBTS, ids=DOUBT_IDS)
def test_in_doubt_a_hand_edited_selector_is_kept_exactly(doubt: Doubt) -> None:
    edited = {**SELECTOR, POD_NAME_LABEL: P2, "tier": "edited-by-hand"}
    observed = make_service(pod=P0, selector=edited)
    body = sync_body(pods=doubt.pods, services=[observed])

    _, outcome = run(body, doubt.answers)

    assert outcome.decision is doubt.reason
    assert [c["spec"]["selector"] for c in outcome.body["children"]] == [edited]


@pytest.mark.parametrize("doubt", DOUBTS, ids=DOUBT_IDS)
def test_in_doubt_without_an_observed_service_none_is_created(doubt: Doubt) -> None:
    body = sync_body(pods=doubt.pods, services=[])

    _, outcome = run(body, doubt.answers)

    assert outcome.body["children"] == []
    assert "primary" not in outcome.body["status"]
    assert outcome.body["resyncAfterSeconds"] == TIMING.degraded
    message = condition(outcome.body, "Ready")["message"]
    assert message.endswith("no Service is created until a leader is confirmed")
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == (
        None,
        None,
        False,
    )


def test_during_the_recorded_failover_the_service_stays_on_the_old_leader() -> None:
    body = fixture("sync-no-leader-during-failover.json")
    observed = body["children"]["Service.v1"][SERVICE_NAME]
    answers = {P0: down(P0, "timed out"), P1: replica(P1), P2: replica(P2)}

    _, outcome = run(body, answers)

    assert outcome.decision is Decision.NO_LEADER
    assert outcome.body["children"] == [
        json.loads(observed["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    ]
    assert outcome.body["children"][0]["spec"]["selector"] == observed["spec"]["selector"]
    assert outcome.body["resyncAfterSeconds"] == TIMING.degraded
