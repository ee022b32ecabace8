"""Unit tests of the decision core (hooks.sync): the children a reply keeps and renames.

The test design notes are those of tests/test_sync_routing.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest

from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus
from hooks.domain.model import LAST_APPLIED_ANNOTATION
from tests.doubts import DOUBT_IDS, DOUBTS, Doubt
from tests.helpers import (
    NAMESPACE,
    P0,
    P1,
    P2,
    PARENT_UID,
    POD_NAME_LABEL,
    SELECTOR,
    SERVICE_NAME,
    fixture,
    healthy,
    make_service,
    preserved,
    run,
    seed_spec,
    service_selector,
    sync_body,
)
from tests.sync_cases import (
    MANAGED_BY,
    PRESERVED_CONFIG_MAP,
    config_map,
    expected_service,
    services_of,
)

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
