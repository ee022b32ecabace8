"""Contract tests: Metacontroller's recorded requests through the real Flask app.

Test design: each recorded request (tests/fixtures/metacontroller, shaped exactly as
Metacontroller v4.17.2 sends them) is posted to the app with a fake prober playing
Patroni for that scenario; the reply is then *applied* the way Metacontroller applies
it (:mod:`standin.apply`: omitted children deleted, InPlace three-way merge, status
replaced wholesale), and the assertions are on the resulting objects — the thing an
on-call engineer sees — not only on the JSON.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from standin.apply import World, apply_reply, check_reply
from tests.helpers import NOW, SYNC_FIXTURES, FakeProber, down, fixture, leader, replica, spread

SERVICE = "pg-orders-primary"
POD_NAME = "statefulset.kubernetes.io/pod-name"


def world_of(body: dict[str, Any]) -> World:
    return World(
        parent=body["parent"],
        services=body["children"]["Service.v1"],
        pods=body["related"]["Pod.v1"],
    )


def post_and_apply(client: FlaskClient, world: World) -> tuple[dict[str, Any], Any]:
    response = client.post(
        "/sync", data=json.dumps(world.sync_request()), content_type="application/json"
    )
    reply = check_reply(response.status_code, response.data)
    return reply, apply_reply(world, reply)


def condition(world: World, kind: str = "Ready") -> dict[str, Any]:
    return next(c for c in world.parent["status"]["conditions"] if c["type"] == kind)


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


def test_customize_selects_the_patroni_pods_by_the_primary_selector(client: FlaskClient) -> None:
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
            }
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
