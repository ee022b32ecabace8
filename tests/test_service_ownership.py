"""A Service named by ``spec.serviceRef`` that exists outside this controller (pure core + app).

Metacontroller v4.17.2 POSTs a desired child it does not observe; a name that is taken gets
409 AlreadyExists, swallowed at info level (``manage_children.go`` ``DynamicApply.Apply``),
on every sync, and the foreign Service keeps its selector. The hook now relates the Service
by name (``/customize``) and, seeing it outside its children, never reports ``Ready True``:
``ServiceNotOwned`` says who owns it and how to hand it over, and the reply does not ask for
the create that can only fail. Each case is one plain request through the loader and the
decision core; the last ones go through the Flask app and the stand-in's reply check.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks import children
from hooks.children.services import foreign_service
from hooks.core.cluster_event import event_for
from hooks.core.routing import Decision
from hooks.domain.model import (
    CONTROLLER_UID_LABEL,
    ENDPOINTSLICE_KEY,
    LAST_APPLIED_ANNOTATION,
    SERVICE_KEY,
)
from hooks.domain.observed import OwnerRef
from hooks.loaders.envelope import RequestError, load_sync_request
from hooks.loaders.schemas import load_spec
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.metacontroller.apply import check_reply
from tests.child_helpers import READ_ONLY, condition, rs_spec
from tests.helpers import (
    CLUSTER,
    NAMESPACE,
    NO_AUTH,
    P0,
    P1,
    PARENT_UID,
    SERVICE_NAME,
    TIMING,
    FakeProber,
    down,
    fed_back,
    leader,
    make_service,
    replica,
    run,
    seed_spec,
    service_selector,
    sync_body,
)

#: The selector the seed's operator left on the Service it patched.
SEED_SELECTOR = {"app": "pg-orders", "role": "master"}
LEADER_0 = {P0: leader(P0), P1: replica(P1), f"{CLUSTER}-2": replica(f"{CLUSTER}-2")}
ALL_DOWN = {n: down(n) for n in (P0, P1, f"{CLUSTER}-2")}
OPERATOR = {
    "apiVersion": "acid.example/v1",
    "kind": "PostgresCluster",
    "name": "orders",
    "uid": "uid-operator-1",
    "controller": True,
    "blockOwnerDeletion": True,
}


def foreign(
    name: str = SERVICE_NAME,
    *,
    owners: list[Any] | None = None,
    labels: dict[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A Service as someone else made it: no last-applied record, the seed's selector."""
    service = make_service(name, last_applied=False, selector=SEED_SELECTOR)
    metadata = service["metadata"]
    metadata["labels"] = dict(labels or {"app": "pg-orders"})
    metadata.pop("managedFields")
    if owners is None:
        metadata.pop("ownerReferences")
    else:
        metadata["ownerReferences"] = owners
    if deleting:
        metadata["deletionTimestamp"] = "2026-08-20T09:59:00Z"
    return service


def body_with(
    related: list[dict[str, Any]] | None,
    *,
    services: list[dict[str, Any]] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A sync request whose ``related`` holds ``Service.v1`` (``None``: no such group)."""
    body = sync_body(services=services or [], spec=spec if spec is not None else seed_spec())
    if related is not None:
        body["related"][SERVICE_KEY] = {s["metadata"]["name"]: copy.deepcopy(s) for s in related}
    return body


def services_in(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in body["children"] if c["kind"] == "Service"}


# ------------------------------------------------------------------------- loading


def test_the_related_service_group_loads_with_its_owners_and_deletion() -> None:
    service = foreign(owners=[OPERATOR, {"kind": "Junk"}, "not a map"], deleting=True)
    request = load_sync_request(body_with([service]))
    assert request.named_services is not None
    loaded = request.named_services[SERVICE_NAME]
    assert loaded.owners == (
        OwnerRef("acid.example/v1", "PostgresCluster", "orders", "uid-operator-1", True),
    )
    assert loaded.controller == loaded.owners[0]
    assert loaded.deleting
    assert loaded.selector == SEED_SELECTOR
    assert request.services == {}


def test_no_related_service_group_is_none_and_a_non_controller_owner_is_no_controller() -> None:
    assert load_sync_request(body_with(None)).named_services is None
    owner = {**OPERATOR, "controller": False}
    loaded = load_sync_request(body_with([foreign(owners=[owner])])).named_services
    assert loaded is not None
    assert loaded[SERVICE_NAME].controller is None
    assert loaded[SERVICE_NAME].owners[0].describe() == "PostgresCluster orders (acid.example/v1)"
    assert OwnerRef("v1", "K", "n", "u", True).describe() == "K n (v1, controller)"


def test_a_related_service_with_junk_metadata_is_a_broken_request() -> None:
    body = body_with([foreign()])
    body["related"][SERVICE_KEY][SERVICE_NAME]["metadata"]["name"] = "other"
    with pytest.raises(RequestError, match=r"Service\.v1"):
        load_sync_request(body)


# -------------------------------------------------------------- which is foreign


@pytest.mark.parametrize(
    ("related", "children", "expected"),
    [
        (None, [], False),  # no rule answered yet: unknown, as before
        ([], [], False),  # the name is free: the hook creates it
        ([foreign()], [], True),  # an orphan outside the controller
        ([foreign(owners=[OPERATOR])], [], True),  # another controller's
        ([make_service()], [make_service()], False),  # our child, related too
        ([make_service()], [], False),  # ours, created after the children were listed
        ([foreign(name="other")], [], False),  # another name (never related in practice)
    ],
)
def test_foreign_service_is_the_named_one_outside_the_children(
    related: list[dict[str, Any]] | None, children: list[dict[str, Any]], expected: bool
) -> None:
    request = load_sync_request(body_with(related, services=children))
    found = foreign_service(request, SERVICE_NAME)
    assert (found is not None) is expected
    if expected:
        assert found is not None and found.name == SERVICE_NAME


def test_a_controller_reference_to_our_uid_is_not_foreign_without_a_parent_uid_it_is() -> None:
    body = body_with([make_service()])
    del body["parent"]["metadata"]["uid"]
    request = load_sync_request(body)
    assert foreign_service(request, SERVICE_NAME) is not None
    body = body_with([foreign(labels={CONTROLLER_UID_LABEL: PARENT_UID})])
    del body["parent"]["metadata"]["uid"]
    _, outcome = run(body, LEADER_0)
    assert f"(labels it {CONTROLLER_UID_LABEL}=<uid>;" in condition(outcome, "Ready")["message"]


# ------------------------------------------------------------------- the decision


def test_an_orphan_service_is_not_owned_never_ready_and_never_created() -> None:
    _, outcome = run(body_with([foreign()]), LEADER_0)
    body = outcome.body
    assert services_in(body) == {}, "no create that can only get 409"
    ready, routed = condition(outcome, "Ready"), condition(outcome, "PrimaryRouted")
    for entry in (ready, routed):
        assert entry["status"] == "False"
        assert entry["reason"] == "ServiceNotOwned"
    message = routed["message"]
    assert message == ready["message"]
    assert f"Service {SERVICE_NAME} exists but is not owned by this PostgreSQLCluster" in message
    assert "(no owner references)" in message
    assert "its selector is not pinned to the leader (Patroni reports pg-orders-0 as leader)" in (
        message
    )
    assert f"kubectl pgfh adopt {CLUSTER} -n {NAMESPACE}" in message
    assert f"{CONTROLLER_UID_LABEL}={PARENT_UID}" in message
    assert "primary" not in body["status"], "no pod is claimed as the Service's target"
    assert body["status"]["service"] == SERVICE_NAME
    assert outcome.decision is Decision.SERVICE_NOT_OWNED
    assert body["resyncAfterSeconds"] != TIMING.degraded, "waits for a person, not Patroni"
    assert condition(outcome, "SpecValid")["status"] == "True"
    check_reply(200, json.dumps(body).encode())


def test_a_service_another_controller_controls_is_refused_until_forced() -> None:
    _, outcome = run(body_with([foreign(owners=[OPERATOR])]), LEADER_0)
    message = condition(outcome, "Ready")["message"]
    assert "(PostgresCluster orders (acid.example/v1, controller))" in message
    assert "PostgresCluster orders controls it, so it is not taken over" in message
    assert f"stop that controller, then hand it over with `kubectl pgfh adopt {CLUSTER}" in message
    assert "--force` (removes that controller reference)" in message
    assert services_in(outcome.body) == {}


def test_a_service_labelled_for_adoption_says_metacontroller_adopts_it_next() -> None:
    labelled = foreign(labels={CONTROLLER_UID_LABEL: PARENT_UID})
    _, outcome = run(body_with([labelled]), LEADER_0)
    message = condition(outcome, "Ready")["message"]
    assert f"it is labelled {CONTROLLER_UID_LABEL}={PARENT_UID} for adoption" in message
    assert "check that Metacontroller may update Services" in message
    # A label of another (older) parent's UID is not ours: adopt relabels it.
    stale = foreign(labels={CONTROLLER_UID_LABEL: "uid-of-a-deleted-cluster"})
    _, outcome = run(body_with([stale]), LEADER_0)
    assert "hand it over with `kubectl pgfh adopt" in condition(outcome, "Ready")["message"]


def test_in_doubt_the_message_says_why_and_nothing_is_created() -> None:
    _, outcome = run(body_with([foreign()]), ALL_DOWN)
    ready = condition(outcome, "Ready")
    assert ready["reason"] == "ServiceNotOwned"
    assert "(No member answers 200 on /primary" in ready["message"]
    assert services_in(outcome.body) == {}
    assert outcome.decision is Decision.SERVICE_NOT_OWNED


def test_a_foreign_service_being_deleted_is_asked_for_again_once_routed() -> None:
    _, outcome = run(body_with([foreign(deleting=True)]), LEADER_0)
    assert services_in(outcome.body)[SERVICE_NAME]["spec"]["selector"] == service_selector(P0)
    message = condition(outcome, "Ready")["message"]
    assert "it is being deleted, and is created anew once it is gone" in message
    assert condition(outcome, "Ready")["status"] == "False"
    # In doubt, nothing is asked for.
    _, doubt = run(body_with([foreign(deleting=True)]), ALL_DOWN)
    assert services_in(doubt.body) == {}


def test_a_service_we_own_under_an_old_name_is_kept_and_moved_never_dropped() -> None:
    old = make_service("pg-orders-old", P1)
    _, outcome = run(body_with([foreign()], services=[old]), LEADER_0)
    kept = services_in(outcome.body)
    assert set(kept) == {"pg-orders-old"}, "rule 1: never drop a child we own"
    assert kept["pg-orders-old"]["spec"]["selector"] == service_selector(P0)
    assert outcome.body["status"]["primary"] == P0, "the owned Service does select it"
    _, doubt = run(body_with([foreign()], services=[old]), ALL_DOWN)
    assert services_in(doubt.body)["pg-orders-old"]["spec"]["selector"] == service_selector(P1)
    assert doubt.body["status"]["primary"] == P1


def test_once_adopted_the_same_service_is_routed_as_ours() -> None:
    adopted = foreign(labels={CONTROLLER_UID_LABEL: PARENT_UID})
    adopted["metadata"]["ownerReferences"] = make_service()["metadata"]["ownerReferences"]
    _, outcome = run(body_with([adopted], services=[adopted]), LEADER_0)
    assert condition(outcome, "Ready")["reason"] == "LeaderFound"
    assert services_in(outcome.body)[SERVICE_NAME]["spec"]["selector"] == service_selector(P0)
    assert outcome.body["status"]["primary"] == P0


def test_without_the_related_group_the_reply_is_as_before() -> None:
    _, before = run(body_with(None), LEADER_0)
    _, free = run(body_with([]), LEADER_0)
    assert before.body == free.body
    assert condition(before, "Ready")["reason"] == "LeaderFound"
    assert SERVICE_NAME in services_in(before.body)


def test_a_foreign_read_only_service_gets_no_slices_and_its_own_condition() -> None:
    body = body_with([foreign(name=READ_ONLY)], spec=rs_spec())
    body["children"][ENDPOINTSLICE_KEY] = {}
    _, outcome = run(body, LEADER_0)
    assert [c["kind"] for c in outcome.body["children"]] == ["Service"], "the primary only"
    assert services_in(outcome.body)[SERVICE_NAME]["spec"]["selector"] == service_selector(P0)
    routed = condition(outcome, "ReplicasRouted")
    assert (routed["status"], routed["reason"]) == ("False", "ServiceNotOwned")
    assert routed["message"].startswith(
        f"Service {READ_ONLY} exists but is not owned by this PostgreSQLCluster (no owner "
        "references): no read-only endpoints are written for it"
    )
    assert condition(outcome, "Ready")["reason"] == "LeaderFound", "the primary is pinned"
    spec, _ = load_spec(rs_spec())
    assert spec is not None
    # One rule for both names: Metacontroller lists the namespace's Services once per rule.
    assert children.related_rules(spec, PARENT_UID, NAMESPACE)[1:] == [
        {
            "apiVersion": "v1",
            "resource": "services",
            "names": [SERVICE_NAME, READ_ONLY],
            "namespace": NAMESPACE,
        }
    ]


def test_the_read_only_service_and_its_slices_are_planned_as_usual() -> None:
    body = body_with([foreign()], spec=rs_spec())
    body["children"][ENDPOINTSLICE_KEY] = {}
    _, outcome = run(body, LEADER_0)
    assert set(services_in(outcome.body)) == {READ_ONLY}
    assert condition(outcome, "ReplicasRouted")["status"] == "True"
    assert any(c["kind"] == "EndpointSlice" for c in outcome.body["children"])


# ----------------------------------------------------------------- Event and status


def test_a_warning_event_on_the_transition_only() -> None:
    request, outcome = run(body_with([foreign()]), LEADER_0)
    event = event_for(request, outcome)
    assert event is not None
    assert (event.type, event.reason) == ("Warning", "ServiceNotOwned")
    again_body = fed_back(body_with([foreign()]), outcome)
    request, again = run(again_body, LEADER_0)
    assert event_for(request, again) is None
    assert (
        condition(again, "Ready")["lastTransitionTime"]
        == (condition(outcome, "Ready")["lastTransitionTime"])
    )
    assert again.body["status"] == outcome.body["status"], "the status write converges"


# -------------------------------------------------------------------- /customize


def test_the_customize_rule_relates_the_named_service_in_the_parent_namespace() -> None:
    spec, problems = load_spec(seed_spec())
    assert spec is not None and not problems
    rules = children.related_rules(spec, PARENT_UID, NAMESPACE)
    assert {"apiVersion": "v1", "resource": "services", "names": [SERVICE_NAME],
            "namespace": NAMESPACE} in rules  # fmt: skip
    assert all(r["namespace"] == NAMESPACE for r in rules if "labelSelector" in r)
    unscoped = children.related_rules(spec, PARENT_UID)
    assert {"apiVersion": "v1", "resource": "services", "names": [SERVICE_NAME]} in unscoped


# ---------------------------------------------------------------- the Flask app


@pytest.fixture
def client() -> FlaskClient:
    prober = FakeProber(LEADER_0)
    app = create_app(settings=HookSettings(auth=NO_AUTH), prober=prober)
    return app.test_client()


def test_the_app_end_to_end_answers_not_owned_then_routes_once_adopted(
    client: FlaskClient,
) -> None:
    customize = client.post(
        "/customize",
        data=json.dumps({"parent": body_with(None)["parent"]}),
        content_type="application/json",
    )
    assert customize.status_code == 200
    rules = customize.get_json()["relatedResources"]
    assert rules[1] == {
        "apiVersion": "v1",
        "resource": "services",
        "names": [SERVICE_NAME],
        "namespace": NAMESPACE,
    }
    response = client.post(
        "/sync", data=json.dumps(body_with([foreign()])), content_type="application/json"
    )
    assert response.status_code == 200
    check_reply(200, response.data)
    reply = response.get_json()
    assert [c["metadata"]["name"] for c in reply["children"]] == []
    ready = next(c for c in reply["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ServiceNotOwned")
    # adopted: Metacontroller now shows it among the children, with the record adopt wrote
    adopted = foreign(labels={CONTROLLER_UID_LABEL: PARENT_UID})
    adopted["metadata"]["ownerReferences"] = make_service()["metadata"]["ownerReferences"]
    adopted["metadata"]["annotations"] = {
        LAST_APPLIED_ANNOTATION: json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": SERVICE_NAME,
                    "namespace": NAMESPACE,
                    "labels": {CONTROLLER_UID_LABEL: PARENT_UID},
                },
                "spec": {"selector": SEED_SELECTOR},
            }
        )
    }
    response = client.post(
        "/sync",
        data=json.dumps(body_with([adopted], services=[adopted])),
        content_type="application/json",
    )
    assert response.status_code == 200
    reply = response.get_json()
    (service,) = reply["children"]
    assert service["spec"]["selector"] == service_selector(P0)
    ready = next(c for c in reply["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "LeaderFound")


def test_the_not_owned_messages_word_for_word() -> None:
    """Each way to hand the Service over, in the exact words `kubectl pgfh status` shows."""
    head = f"Service {SERVICE_NAME} exists but is not owned by this PostgreSQLCluster"
    finding = "its selector is not pinned to the leader (Patroni reports pg-orders-0 as leader)"
    adopt = f"kubectl pgfh adopt {CLUSTER} -n {NAMESPACE}"
    other = {**OPERATOR, "kind": "Other", "name": "x", "uid": "u-2", "controller": False}
    _, outcome = run(body_with([foreign(owners=[OPERATOR, other])]), LEADER_0)
    assert condition(outcome, "Ready")["message"] == (
        f"{head} (PostgresCluster orders (acid.example/v1, controller), Other x "
        f"(acid.example/v1)): {finding}; PostgresCluster orders controls it, so it is not "
        f"taken over: stop that controller, then hand it over with `{adopt} --force` (removes "
        "that controller reference), or set spec.serviceRef.name to a new name"
    )
    _, outcome = run(body_with([foreign()]), LEADER_0)
    assert condition(outcome, "Ready")["message"] == (
        f"{head} (no owner references): {finding}; hand it over with `{adopt}` (labels it "
        f"{CONTROLLER_UID_LABEL}={PARENT_UID}; Metacontroller adopts it and the selector is "
        "pinned from its next sync), or set spec.serviceRef.name to a new name"
    )
    _, outcome = run(body_with([foreign(labels={CONTROLLER_UID_LABEL: PARENT_UID})]), LEADER_0)
    assert condition(outcome, "Ready")["message"] == (
        f"{head} (no owner references): {finding}; it is labelled "
        f"{CONTROLLER_UID_LABEL}={PARENT_UID} for adoption; Metacontroller adopts it on its "
        "next sync (if this stays, check that Metacontroller may update Services)"
    )
    _, outcome = run(body_with([foreign(deleting=True)]), LEADER_0)
    assert condition(outcome, "Ready")["message"] == (
        f"{head} (no owner references): it is being deleted, and is created anew once it is "
        "gone (Patroni reports pg-orders-0 as leader)"
    )
    asked = services_in(outcome.body)[SERVICE_NAME]
    assert asked["metadata"]["namespace"] == NAMESPACE


def test_an_owned_service_without_a_spec_is_kept_with_the_leaders_selector() -> None:
    """Free input: a Service we own that reads back without ``spec`` is still moved, beside a
    foreign one and on its own (under an old serviceRef name)."""
    old = make_service("pg-orders-old", P1)
    del old["spec"]
    for related in ([foreign()], None):
        _, outcome = run(body_with(related, services=[copy.deepcopy(old)]), LEADER_0)
        kept = services_in(outcome.body)["pg-orders-old"]
        assert kept["spec"]["selector"] == service_selector(P0)


def test_a_foreign_read_only_service_is_named_with_its_owners_word_for_word() -> None:
    other = {**OPERATOR, "kind": "Other", "name": "x", "uid": "u-2", "controller": False}
    body = body_with([foreign(name=READ_ONLY, owners=[OPERATOR, other])], spec=rs_spec())
    body["children"][ENDPOINTSLICE_KEY] = {}
    _, outcome = run(body, LEADER_0)
    assert condition(outcome, "ReplicasRouted")["message"] == (
        f"Service {READ_ONLY} exists but is not owned by this PostgreSQLCluster (PostgresCluster "
        "orders (acid.example/v1, controller), Other x (acid.example/v1)): no read-only "
        "endpoints are written for it; set spec.replicaService.name to a new name, or delete "
        "that Service"
    )
    assert outcome.body["status"]["replicaService"] == READ_ONLY
