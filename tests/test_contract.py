"""Contract tests: Metacontroller's recorded requests through the real Flask app.

Test design: each recorded request (tests/fixtures/metacontroller, shaped exactly as
Metacontroller v4.17.2 sends them) is posted to the app with a fake prober playing
Patroni for that scenario; the reply is then *applied* the way Metacontroller applies
it (:mod:`testbed.metacontroller.apply`: omitted children deleted, InPlace three-way merge, status
replaced wholesale), and the assertions are on the resulting objects — the thing an
on-call engineer sees — not only on the JSON.
"""

from __future__ import annotations

import json

import pytest
from flask.testing import FlaskClient

from testbed.metacontroller.apply import CRONJOB_KEY, ENDPOINTSLICE_KEY, SERVICE_KEY, check_reply
from tests.child_helpers import READ_ONLY
from tests.contract_helpers import condition, healthy, post_and_apply, settle, world_of, world_with
from tests.helpers import (
    NOW,
    P0,
    P1,
    P2,
    SYNC_FIXTURES,
    FakeProber,
    down,
    fixture,
    leader,
    replica,
    spread,
)

SERVICE = "pg-orders-primary"
POD_NAME = "statefulset.kubernetes.io/pod-name"


@pytest.mark.parametrize("name", SYNC_FIXTURES)
def test_every_recorded_request_gets_a_strict_200_reply(client: FlaskClient, name: str) -> None:
    response = client.post("/sync", data=json.dumps(fixture(name)), content_type="application/json")
    assert response.status_code == 200
    reply = check_reply(response.status_code, response.data)
    assert set(reply) <= {"status", "children", "resyncAfterSeconds", "finalized"}
    assert isinstance(reply["status"], dict)


def test_first_sync_creates_the_service_on_the_confirmed_leader(
    client: FlaskClient, prober: FakeProber
) -> None:
    prober.answers.update(
        {
            "pg-orders-0": leader("pg-orders-0"),
            "pg-orders-1": replica("pg-orders-1"),
            "pg-orders-2": replica("pg-orders-2"),
        }
    )
    world = world_of(fixture("sync-first-no-service.json"))
    reply, applied = post_and_apply(client, world)
    assert applied.created == (SERVICE,)
    # Recorded on the Kubernetes DCS: Patroni's role labels and status annotations agree
    # with the answers, so the cluster is event-driven (a polled test strips them:
    # tests.helpers.polled, and tests/test_switchover.py for both).
    assert world.parent["status"]["switchoverDetection"] == "RoleLabel"
    assert reply["resyncAfterSeconds"] == spread(30.0, NOW, world.parent)
    assert world.selected_pods(SERVICE) == ["pg-orders-0"]
    service = world.services[SERVICE]
    assert service["metadata"]["labels"]["controller-uid"] == world.uid
    assert service["spec"]["ports"] == [
        {"name": "postgresql", "port": 5432, "targetPort": 5432, "protocol": "TCP"}
    ]
    assert condition(world)["status"] == "True"
    assert world.parent["status"]["primary"] == "pg-orders-0"
    assert world.parent["status"]["observedGeneration"] == 1
    # every member was probed on its own pod IP, on Patroni's port and health path
    assert sorted(t.url for t in prober.calls[0]) == [
        "http://10.244.1.17:8008/primary",
        "http://10.244.2.23:8008/primary",
        "http://10.244.3.9:8008/primary",
    ]


def test_during_a_failover_the_service_stays_where_it_is(
    client: FlaskClient, prober: FakeProber
) -> None:
    # pg-orders-0 is being drained (stale role=primary label); nobody is leader yet.
    prober.answers.update(
        {
            "pg-orders-0": down("pg-orders-0", "read timeout"),
            "pg-orders-1": replica("pg-orders-1"),
            "pg-orders-2": replica("pg-orders-2"),
        }
    )
    world = world_of(fixture("sync-no-leader-during-failover.json"))
    before = json.loads(json.dumps(world.services))
    reply, applied = post_and_apply(client, world)
    assert applied.deleted == () and applied.created == () and applied.updated == ()
    assert world.services == before
    assert world.selected_pods(SERVICE) == ["pg-orders-0"]
    assert condition(world)["reason"] == "NoLeader"
    assert condition(world, "PrimaryRouted")["status"] == "False"
    assert 0 < reply["resyncAfterSeconds"] < 1


def test_after_the_promotion_the_selector_moves_and_the_cluster_ip_stays(
    client: FlaskClient, prober: FakeProber
) -> None:
    prober.answers.update(
        {
            "pg-orders-0": replica("pg-orders-0", 2),
            "pg-orders-1": leader("pg-orders-1", 2),
            "pg-orders-2": replica("pg-orders-2", 2),
        }
    )
    world = world_of(fixture("sync-service-selects-old-leader.json"))
    cluster_ip = world.services[SERVICE]["spec"]["clusterIP"]
    _, applied = post_and_apply(client, world)
    assert applied.updated == (SERVICE,) and applied.deleted == ()
    assert world.selected_pods(SERVICE) == ["pg-orders-1"]
    assert world.services[SERVICE]["spec"]["clusterIP"] == cluster_ip
    assert condition(world)["status"] == "True"
    assert world.parent["status"]["timeline"] == 2
    # The earlier NoLeader condition transitioned: new lastTransitionTime.
    assert condition(world, "PrimaryRouted")["lastTransitionTime"] == "2026-08-20T10:00:00Z"


def test_a_second_identical_sync_changes_nothing(client: FlaskClient, prober: FakeProber) -> None:
    """No hot loop: once applied, the same observation gives the same objects and status."""
    prober.answers.update(
        {
            "pg-orders-0": replica("pg-orders-0", 2),
            "pg-orders-1": leader("pg-orders-1", 2),
            "pg-orders-2": replica("pg-orders-2", 2),
        }
    )
    world = world_of(fixture("sync-service-selects-old-leader.json"))
    post_and_apply(client, world)
    _, again = post_and_apply(client, world)
    assert again.updated == () and again.created == () and again.deleted == ()
    assert not again.status_changed


def test_finalize_deletes_the_service_then_reports_finalized(client: FlaskClient) -> None:
    world = world_of(fixture("finalize-parent-deleting.json"))
    first, applied = post_and_apply(client, world)
    assert applied.deleted == (SERVICE,)
    assert first["finalized"] is False
    assert world.parent["metadata"]["finalizers"], "finalizer kept until the Service is gone"
    second, applied = post_and_apply(client, world)
    assert second["finalized"] is True
    assert world.parent["metadata"]["finalizers"] == []


def test_customize_selects_the_patroni_pods_and_the_named_service(client: FlaskClient) -> None:
    response = client.post(
        "/customize",
        data=json.dumps(fixture("customize-request.json")),
        content_type="application/json",
    )
    assert response.status_code == 200
    assert response.get_json() == {
        "relatedResources": [
            {
                "apiVersion": "v1",
                "resource": "pods",
                "labelSelector": {
                    "matchLabels": {"application": "patroni", "cluster-name": "pg-orders"}
                },
                # Scoped to the parent's namespace: the same Pods on a sync, and a Pod
                # event elsewhere costs Metacontroller a string compare per parent, not a
                # selector (hooks.children.related_rules).
                "namespace": "databases",
            },
            # The Service spec.serviceRef names, whoever owns it, in the parent's namespace
            # only (without "namespace" Metacontroller lists Services of every namespace).
            {
                "apiVersion": "v1",
                "resource": "services",
                "names": ["pg-orders-primary"],
                "namespace": "databases",
            },
        ]
    }


def test_customize_never_returns_a_rule_without_a_selector(client: FlaskClient) -> None:
    body = fixture("customize-request.json")
    body["parent"]["spec"]["primarySelector"] = {}
    response = client.post("/customize", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    assert response.get_json() == {"relatedResources": []}


def test_an_invalid_spec_keeps_the_service_and_names_the_field(
    client: FlaskClient, prober: FakeProber
) -> None:
    world = world_of(fixture("sync-service-selects-old-leader.json"))
    world.parent["spec"]["serviceRef"] = {"name": "Not_A_DNS_Name"}
    before = json.loads(json.dumps(world.services))
    _, applied = post_and_apply(client, world)
    assert world.services == before and applied.deleted == ()
    assert prober.calls == [], "an invalid spec plans no probes"
    spec_valid = condition(world, "SpecValid")
    assert spec_valid["status"] == "False"
    assert "spec.serviceRef.name" in spec_valid["message"]


NOT_FINALIZING = [name for name in SYNC_FIXTURES if not fixture(name)["finalizing"]]


@pytest.mark.parametrize("name", NOT_FINALIZING)
def test_no_reply_outside_finalize_ever_drops_an_observed_service(
    client: FlaskClient, prober: FakeProber, name: str
) -> None:
    for answers in (
        {},
        {"pg-orders-0": leader("pg-orders-0"), "pg-orders-1": leader("pg-orders-1")},
        {"pg-orders-2": leader("pg-orders-2")},
    ):
        prober.answers = dict(answers)
        world = world_of(fixture(name))
        observed = set(world.services)
        _, applied = post_and_apply(client, world)
        assert applied.deleted == ()
        assert observed <= set(world.services)
        for service in world.services.values():
            assert len(world.selected_pods(service["metadata"]["name"])) <= 1


# ------------------------------------------------ every child part (read-only Service, backup)
# The world of tests/contract_helpers.world_with: spec.replicaService and spec.backup set, so
# the primary Service, the read-only Service with its EndpointSlice and the backup CronJob
# are created, kept and finalized together.


def test_the_first_sync_creates_every_child_and_the_next_ones_write_nothing(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    world = world_with()
    _, applied = post_and_apply(client, world)

    assert sorted(applied.created_objects) == [
        "CronJob/pg-orders-backup",
        "EndpointSlice/pg-orders-replicas-ipv4",
        "Service/pg-orders-primary",
        "Service/pg-orders-replicas",
    ]
    assert world.selected_pods(SERVICE) == [P0]
    assert world.selected_pods(READ_ONLY) == []  # no selector: only our slice routes
    assert world.endpoint_pods(READ_ONLY) == [P1, P2]
    for child in [*world.services.values(), *world.endpointslices.values()]:
        assert child["metadata"]["labels"]["controller-uid"] == world.uid
    assert world.parent["status"]["replicaEndpoints"] == [P1, P2]

    steady = settle(client, world)
    assert steady.writes == ()


def test_an_old_compositecontroller_gets_no_untracked_children(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    world = world_with()
    world.declared = (SERVICE_KEY,)
    _, applied = post_and_apply(client, world)
    assert applied.created_objects == ("Service/pg-orders-primary",)
    assert world.untracked == {}
    assert condition(world, "ReplicasRouted")["reason"] == "EndpointSlicesNotDeclared"
    assert condition(world, "BackupScheduled")["reason"] == "CronJobsNotDeclared"


def test_finalize_deletes_every_child_then_reports_finalized(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    world = world_with()
    settle(client, world)
    world.parent["metadata"]["deletionTimestamp"] = "2026-08-20T10:05:44Z"

    first, applied = post_and_apply(client, world)
    assert first["finalized"] is False
    assert sorted(applied.deleted_objects) == [
        "CronJob/pg-orders-backup",
        "EndpointSlice/pg-orders-replicas-ipv4",
        "Service/pg-orders-primary",
        "Service/pg-orders-replicas",
    ]
    second, _ = post_and_apply(client, world)
    assert second["finalized"] is True
    assert world.parent["metadata"]["finalizers"] == []


def test_the_recorded_requests_carry_the_declared_child_groups() -> None:
    for name in ("sync-first-no-service.json", "finalize-parent-deleting.json"):
        children = fixture(name)["children"]
        assert list(children) == [CRONJOB_KEY, ENDPOINTSLICE_KEY, SERVICE_KEY]
