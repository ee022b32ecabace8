"""Contract tests of the read-only Service and the backups: the real Flask app, replies
applied by the Metacontroller stand-in (:mod:`standin.apply`).

Test design: the recorded requests' world (tests/fixtures/metacontroller) with
``spec.replicaService`` and ``spec.backup`` added; each reply is applied the way
Metacontroller applies it, including the API server's rewrites (``endpoints: null``,
canonical quantities), and the assertions are on the resulting objects and on what
kube-proxy would route to. A steady state must cost Metacontroller no write at all: no
object update, no PUT of an unchanged object, no status change.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from standin.apply import (
    CRONJOB_KEY,
    ENDPOINTSLICE_KEY,
    SERVICE_KEY,
    Applied,
    World,
    apply_reply,
    check_reply,
)
from tests.helpers import FakeProber, down, fixture
from tests.readonly_helpers import MIB, READ_ONLY, answer, backup_fields

PRIMARY = "pg-orders-primary"
P0, P1, P2 = "pg-orders-0", "pg-orders-1", "pg-orders-2"


def world_with(name: str = "sync-first-no-service.json", **spec: Any) -> World:
    body = fixture(name)
    body["parent"]["spec"].update(
        {"replicaService": {"name": READ_ONLY}, "backup": backup_fields(), **spec}
    )
    return World(
        parent=body["parent"],
        services=body["children"]["Service.v1"],
        pods=body["related"]["Pod.v1"],
    )


def sync(client: FlaskClient, world: World) -> tuple[dict[str, Any], Applied]:
    response = client.post(
        "/sync", data=json.dumps(world.sync_request()), content_type="application/json"
    )
    reply = check_reply(response.status_code, response.data)
    return reply, apply_reply(world, reply)


def settle(client: FlaskClient, world: World) -> Applied:
    """Sync until a reply changes nothing (Metacontroller's own writes trigger syncs)."""
    for _ in range(5):
        _, applied = sync(client, world)
        if not (applied.changed_children or applied.status_changed or applied.writes):
            return applied
    raise AssertionError(f"no steady state after 5 syncs: {applied}")


def healthy(prober: FakeProber, leading: str = P0, **overrides: Any) -> None:
    prober.answers = {n: answer(n, "primary") if n == leading else answer(n) for n in (P0, P1, P2)}
    prober.answers.update({k.replace("_", "-"): v for k, v in overrides.items()})


def condition(world: World, kind: str) -> dict[str, Any]:
    return next(c for c in world.parent["status"]["conditions"] if c["type"] == kind)


def test_the_first_sync_creates_every_child_and_the_next_ones_write_nothing(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    world = world_with()
    _, applied = sync(client, world)

    assert sorted(applied.created_objects) == [
        "CronJob/pg-orders-backup",
        "EndpointSlice/pg-orders-replicas-ipv4",
        "Service/pg-orders-primary",
        "Service/pg-orders-replicas",
    ]
    assert world.selected_pods(PRIMARY) == [P0]
    assert world.selected_pods(READ_ONLY) == []  # no selector: only our slice routes
    assert world.endpoint_pods(READ_ONLY) == [P1, P2]
    for child in [*world.services.values(), *world.endpointslices.values()]:
        assert child["metadata"]["labels"]["controller-uid"] == world.uid
    assert world.parent["status"]["replicaEndpoints"] == [P1, P2]

    steady = settle(client, world)
    assert steady.writes == ()


def test_the_read_only_endpoints_follow_a_failover(client: FlaskClient, prober: FakeProber) -> None:
    healthy(prober)
    world = world_with()
    settle(client, world)

    # pg-orders-0 dies; nobody is leader yet: everything stays as it is.
    prober.answers = {P0: down(P0), P1: answer(P1), P2: answer(P2)}
    before = json.loads(json.dumps(world.endpointslices))
    reply, applied = sync(client, world)
    assert world.endpointslices == before and applied.deleted_objects == ()
    assert condition(world, "ReplicasRouted")["reason"] == "LeaderNotConfirmed"
    assert reply["resyncAfterSeconds"] < 1

    # pg-orders-1 is promoted: it leaves the read-only endpoints in the same reply that
    # moves the primary Service to it.
    prober.answers = {P0: down(P0), P1: answer(P1, "primary"), P2: answer(P2)}
    _, applied = sync(client, world)
    assert world.selected_pods(PRIMARY) == [P1]
    assert world.endpoint_pods(READ_ONLY) == [P2]
    assert "EndpointSlice/pg-orders-replicas-ipv4" in applied.updated_objects

    # The old leader rejoins and streams: it joins the read-only endpoints.
    prober.answers[P0] = answer(P0)
    sync(client, world)
    assert world.endpoint_pods(READ_ONLY) == [P0, P2]
    assert settle(client, world).writes == ()


def test_a_lagging_replica_leaves_and_comes_back(client: FlaskClient, prober: FakeProber) -> None:
    healthy(prober)
    world = world_with()
    settle(client, world)

    healthy(prober, pg_orders_2=answer(P2, behind=17 * MIB))
    sync(client, world)
    assert world.endpoint_pods(READ_ONLY) == [P1]
    assert world.parent["status"]["replicaEndpoints"] == [P1]

    healthy(prober, pg_orders_2=answer(P2, behind=20 * MIB))  # still lagging: no write
    assert settle(client, world).writes == ()

    healthy(prober)
    sync(client, world)
    assert world.endpoint_pods(READ_ONLY) == [P1, P2]


@pytest.mark.parametrize("fallback", ["KeepEndpoints", "UseLeader", "Empty"])
def test_each_fallback_reaches_a_steady_state(
    client: FlaskClient, prober: FakeProber, fallback: str
) -> None:
    healthy(prober)
    world = world_with(replicaService={"name": READ_ONLY, "whenNoReplica": fallback})
    settle(client, world)
    healthy(
        prober,
        pg_orders_1=answer(P1, behind=64 * MIB),
        pg_orders_2=answer(P2, replication_state=None),
    )
    sync(client, world)
    expected = {"KeepEndpoints": [P1, P2], "UseLeader": [P0], "Empty": []}[fallback]
    assert world.endpoint_pods(READ_ONLY) == expected
    if fallback == "Empty":
        # Stored as the API server stores it, and echoed so: no PUT on every sync.
        assert world.endpointslices["pg-orders-replicas-ipv4"]["endpoints"] is None
    assert settle(client, world).writes == ()


def test_canonicalised_quantities_do_not_make_metacontroller_write_every_sync(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    resources = {"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"memory": 2**30}}
    world = world_with(backup=backup_fields(resources=resources))
    sync(client, world)
    container = world.cronjobs["pg-orders-backup"]["spec"]["jobTemplate"]["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "1073741824"},  # a plain number stays decimal
    }
    assert settle(client, world).writes == ()


def test_an_old_compositecontroller_gets_no_untracked_children(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    world = world_with()
    world.declared = (SERVICE_KEY,)
    _, applied = sync(client, world)
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

    first, applied = sync(client, world)
    assert first["finalized"] is False
    assert sorted(applied.deleted_objects) == [
        "CronJob/pg-orders-backup",
        "EndpointSlice/pg-orders-replicas-ipv4",
        "Service/pg-orders-primary",
        "Service/pg-orders-replicas",
    ]
    second, _ = sync(client, world)
    assert second["finalized"] is True
    assert world.parent["metadata"]["finalizers"] == []


@pytest.mark.parametrize(
    "answers",
    [
        {},
        {P0: answer(P0, "primary"), P1: answer(P1, "primary")},
        {P2: answer(P2, "replica", http_status=200)},
        {P0: answer(P0, "primary", location=None), P1: answer(P1)},
    ],
    ids=["nobody answers", "two leaders", "lone claimant still promoting", "no leader position"],
)
def test_no_reply_outside_finalize_drops_a_read_only_object(
    client: FlaskClient, prober: FakeProber, answers: dict[str, Any]
) -> None:
    healthy(prober)
    world = world_with()
    settle(client, world)
    prober.answers = dict(answers)
    _, applied = sync(client, world)
    assert applied.deleted_objects == ()
    assert world.endpoint_pods(READ_ONLY) == [P1, P2]
    assert world.selected_pods(PRIMARY) == [P0]


def test_backup_jobs_are_related_by_uid_and_reported(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    world = world_with()
    response = client.post(
        "/customize",
        data=json.dumps(world.customize_request()),
        content_type="application/json",
    )
    rules = response.get_json()["relatedResources"]
    assert rules[1] == {
        "apiVersion": "batch/v1",
        "resource": "jobs",
        "labelSelector": {"matchLabels": {"pg-failover-hook.adg.io/backup-of": world.uid}},
    }
    world.jobs = {
        "pg-orders-backup-29250": {
            "metadata": {
                "name": "pg-orders-backup-29250",
                "labels": {"pg-failover-hook.adg.io/backup-of": world.uid},
            },
            "status": {
                "completionTime": "2026-08-20T02:16:09Z",
                "conditions": [{"type": "Complete", "status": "True"}],
            },
        }
    }
    sync(client, world)
    assert world.parent["status"]["backup"] == {
        "cronJob": "pg-orders-backup",
        "lastSuccessful": {
            "job": "pg-orders-backup-29250",
            "completionTime": "2026-08-20T02:16:09Z",
        },
    }
    assert settle(client, world).writes == ()


def test_customize_without_backup_relates_only_the_pods(client: FlaskClient) -> None:
    body = fixture("customize-request.json")
    body["parent"]["spec"]["replicaService"] = {"name": READ_ONLY}
    response = client.post("/customize", data=json.dumps(body), content_type="application/json")
    assert [r["resource"] for r in response.get_json()["relatedResources"]] == ["pods"]


def test_the_recorded_requests_carry_the_declared_child_groups() -> None:
    for name in ("sync-first-no-service.json", "finalize-parent-deleting.json"):
        children = fixture(name)["children"]
        assert list(children) == [CRONJOB_KEY, ENDPOINTSLICE_KEY, SERVICE_KEY]
