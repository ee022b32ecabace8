"""Unit tests of the decision core (hooks.sync): finalizing, and an invalid spec.

The test design notes are those of tests/test_sync_routing.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta, timezone
from typing import Any

import pytest

from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus
from hooks.loaders.envelope import load_sync_request
from hooks.probe.plan import probe_targets
from hooks.sync import reconcile
from testbed.fakes.patroni_wire import patroni_body
from tests.helpers import (
    INVALID_SPECS,
    NAMESPACE,
    NOW,
    P0,
    P1,
    P2,
    PARENT_UID,
    SERVICE_NAME,
    TIMING,
    down,
    fixture,
    healthy,
    leader,
    make_service,
    preserved,
    replica,
    run,
    seed_spec,
    service_selector,
    spread,
    sync_body,
)
from tests.sync_cases import (
    EARLIER_STAMP,
    MANAGED_BY,
    NOW_STAMP,
    ROUTED_STATUS,
    condition,
    config_map,
    pod_disruption_budget,
)

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
