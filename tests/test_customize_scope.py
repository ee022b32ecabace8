"""The shard-aware customize: no related rules for a parent the calling install never syncs.

Metacontroller v4.17.2 walks every parent of its (unfiltered, shared) parent informer on every
Pod and Service event (``findRelatedParents``, customize/manager.go 353-397) and enqueues a
match only if the CompositeController's ``parentResource.labelSelector`` selects it or it
carries the controller's finalizer (``enqueueParentObject``, composite/controller.go 385-392).
The hook answers the full rules exactly for those parents. Plain values: the selector semantics
over every operator and label state (cross-checked with the stand-in's independent
``testbed.metacontroller.selectors.matches``), the finalizer, every doubt, and the HTTP answer.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks.children.primary import NO_POD_RULE
from hooks.core.scope import FINALIZER_PREFIX, selects, serves
from hooks.domain.scope import OPERATORS, CustomizeScope, ParentSelector, Requirement
from hooks.loaders.envelope import load_customize_call, load_scope
from testbed.metacontroller.selectors import matches
from tests.helpers import fixture

SHARD = "pg-failover-hook.adg.io/shard"
CONTROLLER = "pg-failover-hook-0"


def shard_request(
    labels: dict[str, str] | None, finalizers: list[str] | None = None, selector: Any = "shard0"
) -> dict[str, Any]:
    body = fixture("customize-request.json")
    body["controller"]["metadata"]["name"] = CONTROLLER
    if selector == "shard0":
        selector = {"matchLabels": {SHARD: "0"}}
    if selector is not None:
        body["controller"]["spec"]["parentResource"]["labelSelector"] = selector
    meta = body["parent"]["metadata"]
    if labels is not None:
        meta["labels"] = labels
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return body


# ------------------------------------------------------------------ selector semantics

LABEL_STATES: list[dict[str, str]] = [{}, {"k": "a"}, {"k": "b"}, {"k": ""}, {"o": "a"},
                                      {"k": "a", "o": "x"}]  # fmt: skip
VALUE_SETS: list[tuple[str, ...]] = [(), ("a",), ("a", "b"), ("",), ("c",)]


@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_every_operator_against_every_label_state_agrees_with_the_stand_in(
    operator: str,
) -> None:
    for labels, values in itertools.product(LABEL_STATES, VALUE_SETS):
        selector = ParentSelector(expressions=(Requirement("k", operator, values),))
        raw = {"matchExpressions": [{"key": "k", "operator": operator, "values": list(values)}]}
        assert selects(selector, labels) == matches(raw, labels), (operator, labels, values)


def test_the_operators_mean_what_kubernetes_says() -> None:
    def one(operator: str, labels: dict[str, str], *values: str) -> bool:
        return selects(ParentSelector(expressions=(Requirement("k", operator, values),)), labels)

    assert one("In", {"k": "a"}, "a", "b") and not one("In", {"k": "c"}, "a")
    assert not one("In", {}, "a"), "In needs the key"
    assert one("NotIn", {}, "a"), "NotIn holds without the key"
    assert one("NotIn", {"k": "c"}, "a") and not one("NotIn", {"k": "a"}, "a")
    assert one("Exists", {"k": ""}) and not one("Exists", {"o": "k"})
    assert one("DoesNotExist", {"o": "k"}) and not one("DoesNotExist", {"k": "a"})


def test_match_labels_and_expressions_must_all_hold() -> None:
    for labels in LABEL_STATES:
        for wanted in [(), (("k", "a"),), (("k", "a"), ("o", "x")), (("o", "a"),)]:
            for exists in (False, True):
                expressions = (Requirement("o", "Exists"),) if exists else ()
                selector = ParentSelector(wanted, expressions)
                raw: dict[str, Any] = {"matchLabels": dict(wanted)}
                if exists:
                    raw["matchExpressions"] = [{"key": "o", "operator": "Exists"}]
                assert selects(selector, labels) == matches(raw, labels), (labels, wanted)


def test_an_operator_kubernetes_does_not_have_selects_in_doubt() -> None:
    selector = ParentSelector(expressions=(Requirement("k", "Gt", ("1",)),))
    assert all(selects(selector, labels) for labels in LABEL_STATES)


def test_an_empty_selector_selects_everything() -> None:
    assert all(selects(ParentSelector(), labels) for labels in LABEL_STATES)


# ------------------------------------------------------------------ who is served


def test_a_parent_of_this_shard_is_served_and_another_shards_is_not() -> None:
    selector = ParentSelector(((SHARD, "0"),))
    assert serves(CustomizeScope(CONTROLLER, selector, {SHARD: "0"}))
    assert not serves(CustomizeScope(CONTROLLER, selector, {SHARD: "1"}))
    assert not serves(CustomizeScope(CONTROLLER, selector, {}))


def test_a_parent_with_this_controllers_finalizer_is_served_whatever_its_labels() -> None:
    """Metacontroller keeps syncing (and finalizes) a parent carrying its finalizer."""
    selector = ParentSelector(((SHARD, "0"),))
    ours = (FINALIZER_PREFIX + CONTROLLER,)
    theirs = (FINALIZER_PREFIX + "pg-failover-hook-1", FINALIZER_PREFIX + "pg-failover-hook")
    assert serves(CustomizeScope(CONTROLLER, selector, {SHARD: "1"}, ours))
    assert not serves(CustomizeScope(CONTROLLER, selector, {SHARD: "1"}, theirs))


def test_every_doubt_is_served_full_rules() -> None:
    assert serves(None), "no scope could be read"
    assert serves(CustomizeScope(CONTROLLER, None, {SHARD: "1"})), "no labelSelector: all"


# ------------------------------------------------------------------ loading the scope


def test_the_recorded_request_has_no_selector_so_every_parent_is_served() -> None:
    scope = load_customize_call(fixture("customize-request.json"))[3]
    assert scope is not None and scope.selector is None and serves(scope)


def test_the_shard_controllers_selector_and_the_parents_labels_are_loaded() -> None:
    body = shard_request({SHARD: "1", "team": "a"}, ["x"])
    body["controller"]["spec"]["parentResource"]["labelSelector"]["matchExpressions"] = [
        {"key": "team", "operator": "In", "values": ["a", "b"]}
    ]
    scope = load_customize_call(body)[3]
    assert scope == CustomizeScope(
        CONTROLLER,
        ParentSelector(((SHARD, "0"),), (Requirement("team", "In", ("a", "b")),)),
        {SHARD: "1", "team": "a"},
        ("x",),
    )


@pytest.mark.parametrize(
    ("controller", "metadata"),
    [
        (None, {}),
        ("a string", {}),
        ({"metadata": {}, "spec": {"parentResource": {}}}, {}),
        ({"metadata": {"name": ""}, "spec": {"parentResource": {}}}, {}),
        ({"metadata": {"name": "c"}, "spec": {}}, {}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": []}}, {}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {}}}, {"labels": {"k": 1}}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {}}}, {"labels": ["k"]}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {}}}, {"labels": []}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {}}}, {"finalizers": "f"}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {}}}, {"finalizers": [1]}),
        ({"metadata": {"name": "c"},
          "spec": {"parentResource": {"labelSelector": "shard=0"}}}, {}),
        ({"metadata": {"name": "c"},
          "spec": {"parentResource": {"labelSelector": {"matchLabels": {"k": 0}}}}}, {}),
        ({"metadata": {"name": "c"},
          "spec": {"parentResource": {"labelSelector": {"matchExpressions": {}}}}}, {}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {"labelSelector": {
            "matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}}}}, {}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {"labelSelector": {
            "matchExpressions": [{"key": 1, "operator": "In", "values": ["1"]}]}}}}, {}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {"labelSelector": {
            "matchExpressions": [{"key": "k", "operator": "In", "values": [1]}]}}}}, {}),
        ({"metadata": {"name": "c"}, "spec": {"parentResource": {"labelSelector": {
            "matchExpressions": ["k"]}}}}, {}),
    ],
)  # fmt: skip
def test_anything_unreadable_is_no_scope_and_so_full_rules(
    controller: object, metadata: dict[str, Any]
) -> None:
    parent = {"metadata": {"name": "p", "namespace": "n", **metadata}}
    assert load_scope(controller, parent) is None
    assert serves(load_scope(controller, parent))


# ------------------------------------------------------------------ the answer over HTTP


def post(client: FlaskClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/customize", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    answer: dict[str, Any] = response.get_json()
    return answer


def test_over_http_only_the_served_parents_get_rules(client: FlaskClient) -> None:
    full = post(client, fixture("customize-request.json"))
    assert [r["resource"] for r in full["relatedResources"]] == ["pods", "services"]
    assert post(client, shard_request({SHARD: "0"})) == full
    assert post(client, shard_request({SHARD: "1"})) == {"relatedResources": []}
    assert post(client, shard_request({})) == {"relatedResources": []}
    ours = [FINALIZER_PREFIX + CONTROLLER]
    assert post(client, shard_request({SHARD: "1"}, ours)) == full
    assert post(client, shard_request({SHARD: "1"}, selector=None)) == full


def test_a_broken_parent_is_still_a_400_not_an_empty_answer(client: FlaskClient) -> None:
    body = shard_request({SHARD: "1"})
    del body["parent"]["metadata"]["name"]
    response = client.post("/customize", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400


# ------------------------------------------------------------------ a stale empty answer


def test_a_sync_without_a_pod_group_keeps_the_service_and_says_why(
    client: FlaskClient,
) -> None:
    """A parent that moved into this shard after the hook answered it no rules: the cached
    answer relates no Pods (no group at all, not an empty one). The Service stays on its
    member, nothing is Ready, and the status says why rather than "no Pod matches"."""
    body = fixture("sync-service-selects-old-leader.json")
    before = json.loads(json.dumps(body["children"]["Service.v1"]))
    del body["related"]["Pod.v1"]
    response = client.post("/sync", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    reply = response.get_json()
    services = {c["metadata"]["name"]: c for c in reply["children"] if c["kind"] == "Service"}
    assert set(services) == set(before)
    for name, service in services.items():
        assert service["spec"]["selector"] == before[name]["spec"]["selector"]
    conditions = {c["type"]: c for c in reply["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    routed = conditions["PrimaryRouted"]
    assert routed["reason"] == "NoMembers"
    assert routed["message"].startswith(NO_POD_RULE)


def test_an_empty_pod_group_is_still_no_pod_matches(client: FlaskClient) -> None:
    body = fixture("sync-service-selects-old-leader.json")
    body["related"]["Pod.v1"] = {}
    reply = client.post("/sync", data=json.dumps(body), content_type="application/json")
    routed = {c["type"]: c for c in reply.get_json()["status"]["conditions"]}["PrimaryRouted"]
    assert routed["message"].startswith("No Pod matches primarySelector")
