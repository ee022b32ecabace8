"""Unit tests of the decision core (:mod:`hooks.sync`), with plain dicts only.

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

import copy
import json
import re
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.core.outcome import SyncOutcome
from hooks.core.probing import probe_targets
from hooks.core.routing import Decision
from hooks.core.switchover import spread_resync
from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.domain.model import LAST_APPLIED_ANNOTATION, LEADER_PATHS, ResyncTiming
from hooks.loaders.envelope import load_sync_request
from hooks.sync import reconcile
from testbed.fakes.patroni_wire import patroni_body
from tests.doubts import DOUBT_IDS, DOUBTS, Doubt
from tests.helpers import (
    CLUSTER,
    INVALID_SPECS,
    NAMESPACE,
    NOW,
    P0,
    P1,
    P2,
    PARENT_UID,
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
    member_ip,
    polled,
    preserved,
    replica,
    run,
    seed_spec,
    service_selector,
    spread,
    sync_body,
    without_resync,
)

NOW_STAMP = "2026-08-20T10:00:00Z"
LATER = NOW + timedelta(minutes=7, seconds=13)
EARLIER_STAMP = "2026-08-20T09:00:00Z"

MANAGED_BY = {"app.kubernetes.io/managed-by": "pg-failover-hook"}

#: Fields the API server owns or allocates: never in a child of a reply.
SERVER_FIELDS = frozenset(
    {
        "clusterIP",
        "clusterIPs",
        "ipFamilies",
        "ipFamilyPolicy",
        "internalTrafficPolicy",
        "sessionAffinity",
        "healthCheckNodePort",
        "nodePort",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "ownerReferences",
        "selfLink",
        "finalizers",
    }
)


# --------------------------------------------------------------------- helpers


def condition(body_or_status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    status = body_or_status.get("status", body_or_status)
    matches = [c for c in status["conditions"] if c["type"] == type_]
    assert len(matches) == 1, f"expected exactly one {type_} condition in {status}"
    return matches[0]


def services_of(outcome: SyncOutcome) -> dict[str, dict[str, Any]]:
    found = [c for c in outcome.body["children"] if c.get("kind") == "Service"]
    by_name = {c["metadata"]["name"]: c for c in found}
    assert len(by_name) == len(found), "a Service is listed twice"
    return by_name


def expected_service(pod: str, name: str = SERVICE_NAME) -> dict[str, Any]:
    """The exact Service the hook must ask for with the seed spec."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(MANAGED_BY)},
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": "postgresql", "port": 5432, "targetPort": 5432, "protocol": "TCP"}],
            "selector": service_selector(pod),
        },
    }


def walk_keys(value: object, path: str = "") -> Iterator[tuple[str, str]]:
    """Every (path, key) of every mapping inside ``value``."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield path, key
            yield from walk_keys(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk_keys(item, f"{path}[{index}]")


def observed_objects(body: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (obj["apiVersion"], obj["kind"], name)
        for group in body["children"].values()
        for name, obj in group.items()
    }


def replied_objects(outcome: SyncOutcome) -> set[tuple[str, str, str]]:
    return {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in outcome.body["children"]}


def config_map(name: str = "pg-orders-extra") -> dict[str, Any]:
    """A child of another type, as an informer delivers it (server fields included)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": "uid-cm",
            "resourceVersion": "77",
            "creationTimestamp": "2026-08-20T09:12:05Z",
            "labels": {"controller-uid": "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"},
            "ownerReferences": [{"kind": "PostgreSQLCluster", "name": CLUSTER, "uid": "u"}],
            "managedFields": [{"manager": "metacontroller"}],
        },
        "data": {"note": "kept by the hook"},
    }


def pod_disruption_budget() -> dict[str, Any]:
    """A child of another type whose spec nests objects two levels deep."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "uid": "uid-pdb"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(SELECTOR)}},
    }


PRESERVED_CONFIG_MAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "pg-orders-extra",
        "namespace": NAMESPACE,
        "labels": {"controller-uid": "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"},
    },
    "data": {"note": "kept by the hook"},
}

#: The parent's status after a healthy sync that routed to pg-orders-0 at 09:00.
ROUTED_STATUS = {
    "observedGeneration": 1,
    "primary": P0,
    "service": SERVICE_NAME,
    "timeline": 1,
    "members": [],
    "conditions": [
        {
            "type": t,
            "status": "True",
            "reason": r,
            "message": m,
            "lastTransitionTime": EARLIER_STAMP,
            "observedGeneration": 1,
        }
        for t, r, m in (
            ("Ready", "LeaderFound", "Patroni reports pg-orders-0 as leader"),
            ("PrimaryRouted", "LeaderFound", "Patroni reports pg-orders-0 as leader"),
            ("SpecValid", "SpecAccepted", "The spec is valid"),
        )
    ],
}


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


# ==================================================================== preserved


EXPECTED_MINIMAL = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {
        "name": SERVICE_NAME,
        "namespace": NAMESPACE,
        "labels": {**MANAGED_BY, "controller-uid": "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"},
    },
    "spec": {
        "ports": [{"name": "postgresql", "port": 5432, "protocol": "TCP", "targetPort": 5432}],
        "selector": service_selector(P0),
        "type": "ClusterIP",
    },
}


def test_preserved_is_the_last_applied_configuration_with_the_observed_selector() -> None:
    observed = fixture("sync-no-leader-during-failover.json")["children"]["Service.v1"][
        SERVICE_NAME
    ]
    applied = json.loads(observed["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])

    assert preserved(observed) == applied

    observed["spec"]["selector"] = {"hand": "edited"}
    assert preserved(observed) == {
        **applied,
        "spec": {**applied["spec"], "selector": {"hand": "edited"}},
    }


def test_preserved_without_last_applied_is_a_minimal_copy_without_server_fields() -> None:
    observed = make_service(pod=P0, last_applied=False)
    observed["metadata"].update(
        generation=3,
        selfLink="/api/v1/namespaces/databases/services/pg-orders-primary",
        finalizers=["service.kubernetes.io/load-balancer-cleanup"],
        deletionGracePeriodSeconds=30,
        annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"},
    )
    observed["spec"]["healthCheckNodePort"] = 31000
    observed["spec"]["ports"][0]["nodePort"] = 30432

    assert preserved(observed) == EXPECTED_MINIMAL


def test_preserved_keeps_user_annotations_but_drops_last_applied_records() -> None:
    observed = make_service(pod=P0, last_applied=False)
    observed["metadata"]["annotations"] = {
        "example.com/owner": "dba",
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
    }
    assert preserved(observed)["metadata"]["annotations"] == {"example.com/owner": "dba"}


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param("{not json", id="not JSON"),
        pytest.param("[]", id="a JSON list"),
        pytest.param("null", id="JSON null"),
        pytest.param('"a string"', id="a JSON string"),
        pytest.param('{"apiVersion":"v1","kind":"Service"}', id="no metadata"),
        pytest.param('{"apiVersion":"v1","kind":"Service","metadata":[]}', id="metadata a list"),
        pytest.param(
            '{"apiVersion":"v1","kind":"Service","metadata":{"name":"other"},"spec":{}}',
            id="for another name",
        ),
        pytest.param(
            '{"apiVersion":"v1","kind":"Endpoints","metadata":{"name":"pg-orders-primary"}}',
            id="for another kind",
        ),
        pytest.param(
            '{"apiVersion":"v2","kind":"Service","metadata":{"name":"pg-orders-primary"}}',
            id="for another apiVersion",
        ),
        pytest.param(
            '{"apiVersion":"v1","kind":"Service","metadata":{"name":"pg-orders-primary"},'
            '"spec":null}',
            id="spec null",
        ),
        pytest.param(
            '{"apiVersion":"v1","kind":"Service","metadata":{"name":"pg-orders-primary"},'
            '"spec":["selector"]}',
            id="spec a list",
        ),
    ],
)
def test_preserved_falls_back_to_the_minimal_copy_when_last_applied_is_unusable(
    annotation: str,
) -> None:
    observed = make_service(pod=P0, last_applied=False)
    observed["metadata"]["annotations"] = {LAST_APPLIED_ANNOTATION: annotation}
    assert preserved(observed) == EXPECTED_MINIMAL


def test_preserved_leaves_the_observed_object_untouched() -> None:
    for observed in (make_service(pod=P0), make_service(pod=P0, last_applied=False), config_map()):
        before = copy.deepcopy(observed)
        result = preserved(observed)
        result["metadata"]["name"] = "mutated"
        result.setdefault("spec", {})["selector"] = {"mutated": "yes"}
        assert observed == before


def test_preserved_keeps_an_absent_observed_selector_absent() -> None:
    observed = make_service(pod=P0)
    del observed["spec"]["selector"]
    assert "selector" not in preserved(observed)["spec"]


def test_preserved_drops_an_empty_observed_selector() -> None:
    observed = make_service(pod=P0)
    observed["spec"]["selector"] = {}
    assert "selector" not in preserved(observed)["spec"]


def test_a_kept_service_is_rebuilt_from_its_last_applied_record() -> None:
    """What the hook last asked for, plus the live selector: a label or annotation that
    someone else added to the live Service is theirs and stays out of the reply (the
    three-way merge keeps it), and nothing of the live object is claimed as ours."""
    observed = make_service(pod=P0, selector={**SELECTOR, POD_NAME_LABEL: P2})
    observed["metadata"]["labels"]["team"] = "orders"
    observed["metadata"]["annotations"]["note"] = "added by hand"
    _, outcome = run(sync_body(services=[observed]), {})
    assert outcome.decision is Decision.NO_LEADER
    assert outcome.body["children"] == [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": SERVICE_NAME,
                "namespace": NAMESPACE,
                "labels": {**MANAGED_BY, "controller-uid": PARENT_UID},
            },
            "spec": {
                "ports": [
                    {"name": "postgresql", "port": 5432, "protocol": "TCP", "targetPort": 5432}
                ],
                "selector": {**SELECTOR, POD_NAME_LABEL: P2},
                "type": "ClusterIP",
            },
        }
    ]


def test_a_last_applied_record_without_a_spec_keeps_only_the_live_selector() -> None:
    observed = make_service(pod=P0)
    applied = json.loads(observed["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    del applied["spec"]
    observed["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = json.dumps(applied)
    assert preserved(observed)["spec"] == {"selector": service_selector(P0)}


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda a: a["metadata"].__setitem__("name", "other"), id="another name"),
        pytest.param(lambda a: a["metadata"].pop("name"), id="no name"),
        pytest.param(lambda a: a.__setitem__("kind", "ConfigMap"), id="another kind"),
    ],
)
def test_a_last_applied_record_of_another_object_is_not_used(edit: Any) -> None:
    observed = make_service(pod=P0)
    applied = json.loads(observed["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    edit(applied)
    applied["metadata"]["labels"]["from-the-record"] = "yes"
    observed["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = json.dumps(applied)
    kept = preserved(observed)
    assert "from-the-record" not in kept["metadata"]["labels"]
    assert kept["metadata"]["name"] == SERVICE_NAME


def test_preserved_copies_other_kinds_without_server_fields() -> None:
    assert preserved(config_map()) == PRESERVED_CONFIG_MAP


def test_only_a_service_s_spec_loses_the_fields_the_api_server_allocates_to_services() -> None:
    """Another kind's spec is its own: a field named like a Service's (``clusterIP``,
    ``nodePort``) is kept as it was observed."""
    custom = {
        "apiVersion": "example.com/v1",
        "kind": "Proxy",
        "metadata": {"name": "pg-orders-proxy", "namespace": NAMESPACE},
        "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 5432, "nodePort": 30432}]},
    }
    assert preserved(custom) == custom


# ============================================================ renamed serviceRef


def test_after_a_rename_the_old_service_follows_the_leader_and_the_new_one_is_created() -> None:
    old = make_service(SERVICE_NAME, pod=P0)
    body = sync_body(spec=seed_spec(serviceRef={"name": "orders-rw"}), services=[old])

    _, outcome = run(body, healthy(P1))

    services = services_of(outcome)
    assert set(services) == {SERVICE_NAME, "orders-rw"}
    assert services["orders-rw"] == expected_service(P1, "orders-rw")
    repointed = preserved(old)
    repointed["spec"]["selector"] = service_selector(P1)
    assert services[SERVICE_NAME] == repointed
    assert outcome.body["status"]["service"] == "orders-rw"
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == (P0, P1, True)


def test_after_a_rename_both_observed_services_are_pinned_to_the_leader() -> None:
    old, new = make_service(SERVICE_NAME, pod=P0), make_service("orders-rw", pod=P2)
    body = sync_body(spec=seed_spec(serviceRef={"name": "orders-rw"}), services=[old, new])

    _, outcome = run(body, healthy(P1))

    services = services_of(outcome)
    assert set(services) == {SERVICE_NAME, "orders-rw"}
    assert {n: s["spec"]["selector"] for n, s in services.items()} == {
        SERVICE_NAME: service_selector(P1),
        "orders-rw": service_selector(P1),
    }
    assert outcome.previous_primary == P2  # the serviceRef's own Service is the reference


@pytest.mark.parametrize("doubt", DOUBTS[:3], ids=DOUBT_IDS[:3])
def test_after_a_rename_in_doubt_the_old_service_is_kept_and_no_new_one_is_created(
    doubt: Doubt,
) -> None:
    old = make_service(SERVICE_NAME, pod=P0)
    body = sync_body(
        spec=seed_spec(serviceRef={"name": "orders-rw"}), pods=doubt.pods, services=[old]
    )

    _, outcome = run(body, doubt.answers)

    assert outcome.body["children"] == [preserved(old)]
    assert outcome.primary == P0


# ===================================================== children of other types


@pytest.mark.parametrize(
    ("spec", "answers", "decision"),
    [
        pytest.param(seed_spec(), healthy(P1), Decision.ROUTED, id="routed"),
        pytest.param(seed_spec(), DOUBTS[0].answers, Decision.NO_LEADER, id="no leader"),
        pytest.param(
            seed_spec(healthCheckPath="/replica"),
            healthy(P1),
            Decision.INVALID_SPEC,
            id="invalid spec",
        ),
    ],
)
def test_children_of_other_types_are_passed_through_and_never_dropped(
    spec: object, answers: Mapping[str, MemberStatus], decision: Decision
) -> None:
    body = sync_body(
        spec=spec,
        services=[make_service(pod=P0)],
        extra_children={"ConfigMap.v1": {"pg-orders-extra": config_map()}},
    )

    _, outcome = run(body, answers)

    assert outcome.decision is decision
    others = [c for c in outcome.body["children"] if c["kind"] != "Service"]
    assert others == [PRESERVED_CONFIG_MAP]
    assert len(services_of(outcome)) == 1


# ====================================================================== finalize


def test_finalize_with_the_service_still_there_lists_no_children_and_is_not_finalized() -> None:
    body = fixture("finalize-parent-deleting.json")
    previous = body["parent"]["status"]
    request, outcome = run(body, healthy(P1))

    assert probe_targets(request) == []
    assert outcome.decision is Decision.FINALIZING
    assert outcome.body["children"] == []
    assert outcome.body["finalized"] is False
    assert outcome.body["resyncAfterSeconds"] == 1.0
    assert outcome.message == "Deleting: 1 child object(s) still exist"
    status = outcome.body["status"]
    assert status["primary"] == previous["primary"] == P1
    assert status["observedGeneration"] == 2
    kept = condition(status, "PrimaryRouted")
    assert {k: kept[k] for k in ("status", "reason", "message", "lastTransitionTime")} == {
        k: previous["conditions"][0][k]
        for k in ("status", "reason", "message", "lastTransitionTime")
    }
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Finalizing")
    assert "1 child object(s) still exist" in ready["message"]
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == (P1, P1, False)


def test_finalize_is_finalized_once_nothing_is_observed() -> None:
    body = fixture("finalize-parent-deleting.json")
    body["children"]["Service.v1"] = {}

    _, outcome = run(body)

    assert outcome.body["children"] == []
    assert outcome.body["finalized"] is True
    assert outcome.body.get("resyncAfterSeconds", 0) == 0
    assert condition(outcome.body, "Ready")["message"] == "Deleting: all child objects are gone"
    assert outcome.body["status"]["primary"] == P1


def test_finalize_waits_for_children_of_other_types_too() -> None:
    body = fixture("finalize-parent-deleting.json")
    body["children"] = {"Service.v1": {}, "ConfigMap.v1": {"pg-orders-extra": config_map()}}
    _, outcome = run(body)
    assert (outcome.body["children"], outcome.body["finalized"]) == ([], False)


def test_finalize_does_not_depend_on_probes_or_on_the_spec() -> None:
    body = fixture("finalize-parent-deleting.json")
    request = load_sync_request(body)
    with_leader = reconcile(request, healthy(P0), now=NOW, timing=TIMING)
    without = reconcile(request, {}, now=NOW, timing=TIMING)
    assert with_leader.body == without.body

    body["parent"]["spec"] = {"healthCheckPath": "/replica"}
    _, invalid = run(body)
    assert (invalid.decision, invalid.body["children"], invalid.body["finalized"]) == (
        Decision.FINALIZING,
        [],
        False,
    )


# ================================================================= invalid spec


@pytest.mark.parametrize(
    ("spec", "field_path"), [c[1:] for c in INVALID_SPECS], ids=[c[0] for c in INVALID_SPECS]
)
def test_an_invalid_spec_keeps_every_observed_service_and_names_the_field(
    spec: object, field_path: str
) -> None:
    observed = make_service(pod=P0)
    body = sync_body(spec=spec, services=[observed], status=ROUTED_STATUS)

    request, outcome = run(body, healthy(P1))

    assert request.spec is None
    assert probe_targets(request) == []
    assert outcome.decision is Decision.INVALID_SPEC
    assert outcome.body["children"] == [preserved(observed)]
    assert outcome.body["children"][0]["spec"]["selector"] == observed["spec"]["selector"]
    spec_valid = condition(outcome.body, "SpecValid")
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "InvalidSpec")
    assert re.search(rf"(^|; ){re.escape(field_path)}: ", spec_valid["message"]), spec_valid
    ready = condition(outcome.body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert field_path in ready["message"]
    assert condition(outcome.body, "PrimaryRouted")["status"] != "True"
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == (P0, P0, False)


def test_an_invalid_spec_names_every_problem_and_what_is_kept_in_each_condition() -> None:
    spec = seed_spec(healthCheckPath="/replica", patroni={"port": 0})
    body = sync_body(spec=spec, services=[make_service(pod=P0)], status=ROUTED_STATUS)
    _, outcome = run(body, healthy(P1))
    problems = (
        "spec.healthCheckPath: must be one of Patroni's leader paths: /primary, /master, "
        "/read-write, /leader, /standby-leader, /standby_leader; spec.patroni.port: Must be "
        "greater than or equal to 1 and less than or equal to 65535."
    )
    assert outcome.message == problems
    assert [
        (c["type"], c["status"], c["reason"], c["message"])
        for c in outcome.body["status"]["conditions"]
    ] == [
        ("Ready", "False", "InvalidSpec", f"Invalid spec: {problems}"),
        (
            "PrimaryRouted",
            "Unknown",
            "InvalidSpec",
            "Routing is frozen until the spec is fixed; keeping Service pg-orders-primary on "
            "pg-orders-0",
        ),
        ("SpecValid", "False", "InvalidSpec", problems),
    ]


def test_kept_conditions_without_a_reason_or_message_keep_them_empty() -> None:
    body = fixture("finalize-parent-deleting.json")
    body["parent"]["status"]["conditions"] = [
        {"type": "ReplicasRouted", "status": "True", "lastTransitionTime": EARLIER_STAMP}
    ]
    _, outcome = run(body)
    kept = condition(outcome.body, "ReplicasRouted")
    assert (kept["status"], kept["reason"], kept["message"]) == ("True", "", "")


def test_an_invalid_spec_without_a_service_creates_none_and_drops_the_member_list() -> None:
    body = sync_body(spec=seed_spec(healthCheckPath="/replica"), status=ROUTED_STATUS)
    _, outcome = run(body, healthy(P1))
    assert outcome.body["children"] == []
    assert "members" not in outcome.body["status"]
    assert outcome.body["status"]["primary"] == P0  # the last known routing, not a new one


def test_an_invalid_spec_keeps_every_observed_service_of_any_name() -> None:
    services = [make_service("a-old", pod=P2), make_service(pod=P0, last_applied=False)]
    body = sync_body(spec={"serviceRef": {"name": "x"}}, services=services)
    _, outcome = run(body, healthy(P1))
    assert outcome.body["children"] == [preserved(services[0]), preserved(services[1])]


def test_a_service_without_a_last_applied_record_is_kept_without_server_fields() -> None:
    """Spelled out, not through :func:`preserved` (which is the code under test)."""
    observed = make_service(pod=P0, last_applied=False)
    observed["spec"]["ports"][0]["nodePort"] = 30432
    observed["spec"]["healthCheckNodePort"] = 31000
    observed["metadata"]["annotations"] = {"team": "orders"}
    body = sync_body(spec={"serviceRef": {"name": "x"}}, services=[observed])
    _, outcome = run(body, healthy(P1))
    assert outcome.body["children"] == [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": SERVICE_NAME,
                "namespace": NAMESPACE,
                "labels": {**MANAGED_BY, "controller-uid": PARENT_UID},
                "annotations": {"team": "orders"},
            },
            "spec": {
                "ports": [
                    {"name": "postgresql", "port": 5432, "protocol": "TCP", "targetPort": 5432}
                ],
                "selector": service_selector(P0),
                "type": "ClusterIP",
            },
        }
    ]


def _containers(value: object) -> dict[int, object]:
    """Every dict and list inside ``value``, by identity."""
    found: dict[int, object] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            found[id(item)] = item
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


@pytest.mark.parametrize(
    ("body", "answers"),
    [
        pytest.param(
            sync_body(
                services=[
                    make_service(pod=P0, last_applied=False),
                    make_service("pg-orders-old", pod=P0, last_applied=False),
                ],
                status=ROUTED_STATUS,
            ),
            healthy(P1),
            id="routed",
        ),
        pytest.param(
            {
                **sync_body(services=[make_service(pod=P0)], status=ROUTED_STATUS),
                "children": {
                    "Service.v1": {SERVICE_NAME: make_service(pod=P0)},
                    "ConfigMap.v1": {"pg-orders-extra": config_map()},
                    "PodDisruptionBudget.policy/v1": {"pg-orders": pod_disruption_budget()},
                },
            },
            healthy(P1),
            id="routed, other kinds of child",
        ),
        pytest.param(
            sync_body(services=[make_service(pod=P0, last_applied=False)], status=ROUTED_STATUS),
            {},
            id="in doubt",
        ),
        pytest.param(
            sync_body(
                spec={"serviceRef": {"name": "x"}},
                services=[make_service(pod=P0, last_applied=False)],
                status={**ROUTED_STATUS, "replicas": {"members": [P1]}},
            ),
            {},
            id="invalid spec",
        ),
        pytest.param(fixture("finalize-parent-deleting.json"), {}, id="finalize"),
    ],
)
def test_the_reply_shares_no_object_with_the_request(
    body: dict[str, Any], answers: Mapping[str, MemberStatus]
) -> None:
    """Kept children and the kept status are copies: nothing done to the reply (or to the
    request) after reconcile can reach the other."""
    request, outcome = run(body, answers)
    children = [*request.services.values()]
    children += [c for group in request.other_children.values() for c in group.values()]
    # The typed values keep the request's objects (read-only) and their last-applied records.
    observed = _containers(
        [
            dict(request.previous.raw),
            *(dict(c.raw) for c in children),
            *(c.last_applied for c in children if c.last_applied is not None),
        ]
    )
    shared = set(_containers(outcome.body)) & set(observed)
    assert not shared, [observed[i] for i in shared]


def test_the_no_leader_message_names_the_unreachable_and_the_foreign_members() -> None:
    answers = {
        P0: MemberStatus.not_patroni(P0, "HTTP 302 on /primary without Patroni JSON", 302),
        P1: down(P1, "timed out"),
        P2: MemberStatus.not_patroni(P2, "HTTP 404 on /primary without Patroni JSON", 404),
    }
    _, outcome = run(sync_body(services=[make_service(pod=P0)]), answers)
    assert outcome.message == (
        "No member answers 200 on /primary (2 of 3 answered; unreachable: pg-orders-1: timed "
        "out; not Patroni: pg-orders-0: HTTP 302 on /primary without Patroni JSON; "
        "pg-orders-2: HTTP 404 on /primary without Patroni JSON); keeping Service "
        "pg-orders-primary on pg-orders-0"
    )


def test_in_doubt_every_kept_primary_service_is_named_with_its_target() -> None:
    old = make_service("pg-orders-old", pod=None)
    del old["spec"]["selector"]
    _, outcome = run(sync_body(services=[make_service(pod=P0), old]), {P0: down(P0)})
    assert outcome.message.endswith(
        "; keeping Service pg-orders-old as it is, Service pg-orders-primary on pg-orders-0"
    )


def test_a_leader_without_a_timeline_is_routed_without_one() -> None:
    body = patroni_body("primary", name=P1)
    del body["timeline"]
    answers = {**healthy(P1), P1: MemberStatus.from_api_response(P1, 200, body)}
    _, outcome = run(sync_body(services=[make_service(pod=P0)]), answers)
    assert outcome.decision is Decision.ROUTED
    assert (
        outcome.message
        == "Patroni reports pg-orders-1 as leader; Service pg-orders-primary selects it"
    )
    assert "timeline" not in outcome.body["status"]


def test_the_timeline_is_the_leaders_not_another_members() -> None:
    answers = {P0: replica(P0, 4), P1: leader(P1, 5), P2: replica(P2, 4)}
    _, outcome = run(sync_body(services=[make_service(pod=P0)]), answers)
    assert outcome.body["status"]["timeline"] == 5
    assert outcome.message == (
        "Patroni reports pg-orders-1 as leader (timeline 5); Service pg-orders-primary selects it"
    )


@pytest.mark.parametrize(("previous", "kept"), [(3, 3), ("3", None), (True, None), (None, None)])
def test_in_doubt_the_last_known_timeline_is_kept(previous: object, kept: int | None) -> None:
    status = {**ROUTED_STATUS, "timeline": previous}
    _, outcome = run(sync_body(services=[make_service(pod=P0)], status=status), {})
    assert outcome.decision is Decision.NO_LEADER
    assert outcome.body["status"].get("timeline") == kept


@pytest.fixture
def local_time_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is UTC-3 (POSIX TZ: no tzdata needed)."""
    monkeypatch.setenv("TZ", "XYZ+03")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("local_time_zone")
def test_neither_the_clock_s_nor_the_machine_s_time_zone_matters() -> None:
    body = sync_body(services=[make_service(pod=P0)])
    replies = [
        run(body, healthy(P0), now=at)[1].body
        for at in (
            NOW,
            NOW.astimezone(timezone(timedelta(hours=2))),
            NOW.astimezone(timezone(timedelta(hours=-7))),
            NOW.replace(tzinfo=None),  # naive: taken as UTC
        )
    ]
    assert {r["resyncAfterSeconds"] for r in replies} == {spread(TIMING.healthy, NOW)}
    stamps = {c["lastTransitionTime"] for r in replies for c in r["status"]["conditions"]}
    assert stamps == {NOW_STAMP}


@pytest.mark.parametrize("group", ["ConfigMap", "ConfigMap.", ".v1"])
def test_a_child_group_that_is_not_kind_dot_version_is_kept_as_observed(group: str) -> None:
    body = sync_body(services=[make_service(pod=P0)])
    body["children"][group] = {"pg-orders-extra": config_map()}
    _, outcome = run(body, healthy(P0))
    (kept,) = [c for c in outcome.body["children"] if c["metadata"]["name"] == "pg-orders-extra"]
    assert (kept["apiVersion"], kept["kind"]) == ("v1", "ConfigMap")


def test_the_service_named_in_the_spec_tells_where_routing_was() -> None:
    services = [make_service("pg-orders-a", pod=P2), make_service("pg-orders-b", pod=P0)]
    body = sync_body(spec=seed_spec(serviceRef={"name": "pg-orders-b"}), services=services)
    _, outcome = run(body, {})
    assert (outcome.previous_primary, outcome.primary) == (P0, P0)


def test_a_service_named_in_the_spec_is_the_primary_s_whatever_its_labels_say() -> None:
    """After a spec swapped the names, the Service named like spec.serviceRef is the
    primary's even if it still carries the read-only label."""
    service = make_service(pod=P0)
    service["metadata"]["labels"]["pg-failover-hook.adg.io/service"] = "read-only"
    _, outcome = run(sync_body(services=[service]), {})
    assert outcome.message.endswith("; keeping Service pg-orders-primary on pg-orders-0")
    assert outcome.previous_primary == P0


@pytest.mark.parametrize(("reason", "previous"), [("LeaderFound", "LeaderFound"), (5, None)])
def test_the_previous_ready_reason_is_what_a_transition_is_measured_from(
    reason: object, previous: str | None
) -> None:
    conditions = [
        {**c, "reason": reason} if c["type"] == "Ready" else c for c in ROUTED_STATUS["conditions"]
    ]
    status = {**ROUTED_STATUS, "conditions": conditions}
    _, outcome = run(sync_body(services=[make_service(pod=P0)], status=status), healthy(P0))
    assert outcome.previous_reason == previous
    assert outcome.transition is (previous is None)


def test_a_routed_reply_says_the_spec_is_valid() -> None:
    _, outcome = run(sync_body(services=[make_service(pod=P0)]), healthy(P0))
    spec_valid = condition(outcome.body, "SpecValid")
    assert (spec_valid["status"], spec_valid["reason"], spec_valid["message"]) == (
        "True",
        "SpecAccepted",
        "The spec is valid",
    )


def test_when_every_member_answers_the_members_condition_counts_them() -> None:
    _, outcome = run(sync_body(services=[make_service(pod=P0)]), healthy(P0))
    members = condition(outcome.body, "MembersReachable")
    assert (members["status"], members["reason"], members["message"]) == (
        "True",
        "AllMembersAnswered",
        "All 3 member(s) answered as Patroni",
    )


def test_without_pods_the_members_condition_is_unknown() -> None:
    _, outcome = run(sync_body(services=[make_service(pod=P0)], pods=[]), {})
    members = condition(outcome.body, "MembersReachable")
    assert (members["status"], members["reason"], members["message"]) == (
        "Unknown",
        "NoMembers",
        "No member to probe",
    )


# ======================================================================= status


def test_members_are_listed_by_name_with_only_stable_fields() -> None:
    pods = [make_pod(P2), make_pod(P0), make_pod(P1)]
    answers = {P0: replica(P0, 2), P1: leader(P1, 2), P2: down(P2)}
    _, outcome = run(sync_body(pods=pods), answers)

    assert outcome.body["status"]["members"] == [
        {"name": P0, "reachable": True, "role": "replica", "state": "running", "timeline": 2},
        {"name": P1, "reachable": True, "role": "primary", "state": "running", "timeline": 2},
        {"name": P2, "reachable": False, "reason": "connection refused"},
    ]


@pytest.mark.parametrize("path", ["/primary", "/master", "/read-write", "/leader"])
def test_patroni_3_master_role_is_reported_as_primary(path: str) -> None:
    answers = {
        P0: MemberStatus.from_api_response(
            P0,
            200,
            patroni_body("master", name=P0),
            health_path=path,
            leader_roles=LEADER_PATHS[path],
        ),
        P1: replica(P1),
        P2: replica(P2),
    }
    _, outcome = run(sync_body(spec=seed_spec(healthCheckPath=path)), answers)

    assert outcome.decision is Decision.ROUTED
    assert [m["role"] for m in outcome.body["status"]["members"]] == [
        "primary",
        "replica",
        "replica",
    ]


def test_the_routed_status_has_exactly_the_documented_fields() -> None:
    body = sync_body(generation=7)
    _, outcome = run(body, healthy(P1, timeline=4))
    status = outcome.body["status"]

    assert set(status) == {
        "observedGeneration",
        "primary",
        "service",
        "timeline",
        "members",
        "membersAnswered",
        "switchoverDetection",
        "conditions",
    }
    assert status["switchoverDetection"] == "Polled"  # make_pod: a role label, no annotation
    assert (
        status["observedGeneration"],
        status["primary"],
        status["service"],
        status["timeline"],
    ) == (
        7,
        P1,
        SERVICE_NAME,
        4,
    )
    assert [c["type"] for c in status["conditions"]] == [
        "Ready",
        "PrimaryRouted",
        "MembersReachable",
        "MemberNameGuard",
        "SpecValid",
        "SwitchoverDetection",
    ]
    for cond in status["conditions"]:
        assert set(cond) == {
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration",
        }
        assert cond["observedGeneration"] == 7
    for member in status["members"]:
        assert set(member) <= {"name", "role", "state", "timeline", "reachable", "reason"}


_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d")
_VOLATILE = re.compile(
    r"xlog|wal|location|lsn|lag|latency|duration|elapsed|seconds|probe|dcs_last_seen|postmaster",
    re.I,
)


@pytest.mark.parametrize("doubt", [None, *DOUBTS], ids=["routed", *DOUBT_IDS])
def test_the_status_holds_no_positions_latencies_or_timestamps_but_transition_times(
    doubt: Doubt | None,
) -> None:
    pods = doubt.pods if doubt else [make_pod(n) for n in (P0, P1, P2)]
    answers = doubt.answers if doubt else healthy(P1)
    _, outcome = run(sync_body(pods=pods, services=[make_service(pod=P0)]), answers)
    status = outcome.body["status"]

    for _, key in walk_keys(status):
        assert not _VOLATILE.search(key), key

    def strings(value: object, key: str = "") -> Iterator[tuple[str, str]]:
        if isinstance(value, Mapping):
            for k, v in value.items():
                yield from strings(v, k)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v, key)
        elif isinstance(value, str):
            yield key, value

    for key, value in strings(status):
        if _TIMESTAMP.search(value):
            assert key == "lastTransitionTime", (key, value)
    assert "50332016" not in json.dumps(status)  # the WAL position in every fake answer


# ------------------------------------------------------- lastTransitionTime


def _previous(
    ready: str, routed: str | None = None, stamp: str | None = EARLIER_STAMP
) -> dict[str, Any]:
    status = copy.deepcopy(ROUTED_STATUS)
    for cond in status["conditions"]:
        if cond["type"] in ("Ready", "PrimaryRouted"):
            cond["status"] = ready if cond["type"] == "Ready" else (routed or ready)
            cond["reason"] = "NoLeader" if cond["status"] == "False" else "LeaderFound"
            cond["message"] = "something said earlier"
            if stamp is None:
                del cond["lastTransitionTime"]
    return status


@pytest.mark.parametrize(
    ("previous", "answers", "expected_status", "expected_stamp"),
    [
        pytest.param(
            _previous("False"),
            DOUBTS[2].answers,
            "False",
            EARLIER_STAMP,
            id="False→False, reason changed",
        ),
        pytest.param(
            _previous("True"), healthy(P2), "True", EARLIER_STAMP, id="True→True, message changed"
        ),
        pytest.param(_previous("True"), DOUBTS[0].answers, "False", NOW_STAMP, id="True→False"),
        pytest.param(_previous("False"), healthy(P1), "True", NOW_STAMP, id="False→True"),
        pytest.param(
            _previous("True", stamp=None), healthy(P1), "True", NOW_STAMP, id="no stamp before"
        ),
        pytest.param({}, healthy(P1), "True", NOW_STAMP, id="no condition before"),
    ],
)
def test_last_transition_time_moves_only_when_the_condition_status_does(
    previous: dict[str, Any],
    answers: Mapping[str, MemberStatus],
    expected_status: str,
    expected_stamp: str,
) -> None:
    body = sync_body(services=[make_service(pod=P0)], status=previous)
    _, outcome = run(body, answers)
    for type_ in ("Ready", "PrimaryRouted"):
        cond = condition(outcome.body, type_)
        assert (cond["status"], cond["lastTransitionTime"]) == (expected_status, expected_stamp)
        assert cond["message"] != "something said earlier"


def test_a_spec_valid_condition_turning_true_gets_a_new_stamp() -> None:
    invalid = sync_body(spec=seed_spec(healthCheckPath="/replica"), services=[make_service(pod=P0)])
    _, first = run(invalid, healthy(P0), now=NOW)
    fixed = fed_back(invalid, first)
    fixed["parent"]["spec"] = seed_spec()
    _, second = run(fixed, healthy(P0), now=LATER)
    assert condition(first.body, "SpecValid")["lastTransitionTime"] == NOW_STAMP
    spec_valid = condition(second.body, "SpecValid")
    assert (spec_valid["status"], spec_valid["lastTransitionTime"]) == (
        "True",
        "2026-08-20T10:07:13Z",
    )


@pytest.mark.parametrize(
    "now",
    [
        pytest.param(
            datetime(2026, 8, 20, 10, 0, 0, 999999, tzinfo=UTC), id="UTC with microseconds"
        ),
        pytest.param(datetime(2026, 8, 20, 10, 0, 0), id="naive, taken as UTC"),
        pytest.param(
            datetime(2026, 8, 20, 12, 0, 0, tzinfo=timezone(timedelta(hours=2))), id="UTC+2"
        ),
    ],
)
def test_transition_times_are_rfc3339_utc_seconds(now: datetime) -> None:
    _, outcome = run(sync_body(), healthy(P0), now=now)
    assert {c["lastTransitionTime"] for c in outcome.body["status"]["conditions"]} == {NOW_STAMP}


# ============================================================ SyncOutcome fields


@pytest.mark.parametrize(
    ("services", "answers", "expected"),
    [
        pytest.param([], healthy(P0), (None, P0, True), id="first Service"),
        pytest.param([make_service(pod=P0)], healthy(P0), (P0, P0, False), id="same leader"),
        pytest.param([make_service(pod=P0)], healthy(P2), (P0, P2, True), id="new leader"),
        pytest.param([make_service(pod=P0)], DOUBTS[0].answers, (P0, P0, False), id="in doubt"),
        pytest.param([], DOUBTS[0].answers, (None, None, False), id="in doubt, no Service"),
        pytest.param(
            [make_service(pod=None, selector=SELECTOR)],
            healthy(P1),
            (None, P1, True),
            id="unpinned Service",
        ),
    ],
)
def test_previous_primary_primary_and_primary_changed(
    services: list[dict[str, Any]], answers: Mapping[str, MemberStatus], expected: tuple[Any, ...]
) -> None:
    _, outcome = run(sync_body(services=services), answers)
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == expected


# ============================================================= probe_targets


def test_probe_targets_are_the_pod_ips_on_patronis_port_and_health_path() -> None:
    request = load_sync_request(fixture("sync-first-no-service.json"))
    assert probe_targets(request) == [
        ProbeTarget(pod, f"http://{ip}:8008/primary", 0.5, 1.0, "/primary", frozenset({"primary"}))
        for pod, ip in ((P0, "10.244.1.17"), (P1, "10.244.2.23"), (P2, "10.244.3.9"))
    ]


def test_probe_targets_are_sorted_by_pod_name() -> None:
    pods = [make_pod(f"{CLUSTER}-{i}") for i in (10, 2, 0, 1)]
    request = load_sync_request(sync_body(pods=pods))
    assert [t.pod for t in probe_targets(request)] == [P0, P1, f"{CLUSTER}-10", P2]


def test_probe_targets_follow_the_specs_scheme_port_path_and_timeouts() -> None:
    spec = seed_spec(
        healthCheckPath="/leader",
        patroni={
            "scheme": "https",
            "port": 8443,
            "connectTimeoutSeconds": 0.2,
            "readTimeoutSeconds": 0.7,
        },
    )
    request = load_sync_request(sync_body(spec=spec, pods=[make_pod(P1)]))
    assert probe_targets(request) == [
        ProbeTarget(
            pod=P1,
            url=f"https://{member_ip(P1)}:8443/leader",
            connect_timeout=0.2,
            read_timeout=0.7,
            health_path="/leader",
            leader_roles=frozenset({"primary", "standby_leader"}),
        )
    ]


def test_probe_targets_carry_the_tls_server_name() -> None:
    spec = seed_spec(patroni={"scheme": "https", "tls": {"serverName": "pg-orders.databases.svc"}})
    request = load_sync_request(sync_body(spec=spec, pods=[make_pod(P1)]))
    (target,) = probe_targets(request)
    assert target.url == f"https://{member_ip(P1)}:8008/primary"
    assert target.server_name == "pg-orders.databases.svc"
    assert probe_targets(load_sync_request(sync_body(pods=[make_pod(P1)])))[0].server_name is None


@pytest.mark.parametrize(
    ("pod_ip", "host"),
    [
        ("fd00:10:244::17", "[fd00:10:244::17]"),
        ("FD00:0010:0244:0000:0000:0000:0000:0017", "[fd00:10:244::17]"),
        ("10.244.1.17", "10.244.1.17"),
    ],
)
def test_probe_targets_write_ip_literals_and_bracket_ipv6(pod_ip: str, host: str) -> None:
    request = load_sync_request(sync_body(pods=[make_pod(P0, pod_ip)]))
    assert [t.url for t in probe_targets(request)] == [f"http://{host}:8008/primary"]


@pytest.mark.parametrize(
    "pod_ip",
    [
        pytest.param(None, id="no podIP"),
        pytest.param("", id="empty"),
        pytest.param("evil.example", id="a hostname"),
        pytest.param("localhost", id="localhost"),
        pytest.param("10.244.1.17:8008", id="with a port"),
        pytest.param("http://10.244.1.17", id="a URL"),
        pytest.param(" 10.244.1.17", id="leading space"),
        pytest.param("10.244.1.256", id="not an IPv4 address"),
        pytest.param("10.244.1.0/24", id="a network"),
        pytest.param(183_763_217, id="an integer"),
        pytest.param(["10.244.1.17"], id="a list"),
        pytest.param("fe80::1%eth0", id="IPv6 with a zone"),
        pytest.param("::1%@evil.example:80#", id="IPv6 zone smuggling a host"),
    ],
)
def test_probe_targets_skip_anything_but_an_ip_literal(pod_ip: object) -> None:
    request = load_sync_request(sync_body(pods=[make_pod(P0, pod_ip), make_pod(P1)]))
    targets = probe_targets(request)
    assert [t.pod for t in targets] == [P1]
    assert all("evil" not in t.url for t in targets)


@pytest.mark.parametrize("status", [None, "Running", [], {"podIPs": [{"ip": "10.244.1.17"}]}])
def test_probe_targets_skip_a_pod_whose_status_is_missing_or_odd(status: object) -> None:
    pod = make_pod(P0)
    if status is None:
        del pod["status"]
    else:
        pod["status"] = status
    request = load_sync_request(sync_body(pods=[pod]))
    assert probe_targets(request) == []


def test_no_probe_targets_while_finalizing_or_with_an_invalid_spec() -> None:
    assert probe_targets(load_sync_request(sync_body(finalizing=True))) == []
    assert probe_targets(load_sync_request(sync_body(spec={}))) == []
    assert len(probe_targets(load_sync_request(sync_body()))) == 3


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
