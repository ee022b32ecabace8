"""Contract tests of the backup CronJob: the real Flask app, replies applied by the
Metacontroller stand-in (:mod:`testbed.metacontroller.apply`).

Test design: as tests/test_replicas_contract.py (the recorded requests' world with
``spec.backup`` and ``spec.replicaService`` added, each reply applied with the API
server's rewrites: here canonical quantities); plus ``/customize``, which relates the
backup Jobs by the parent's uid, and the status that reports the last successful one.
"""

from __future__ import annotations

import json

from flask.testing import FlaskClient

from tests.child_helpers import READ_ONLY, backup_fields
from tests.contract_helpers import healthy, post_and_apply, settle, world_with
from tests.helpers import FakeProber, fixture


def test_canonicalised_quantities_do_not_make_metacontroller_write_every_sync(
    client: FlaskClient, prober: FakeProber
) -> None:
    healthy(prober)
    resources = {"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"memory": 2**30}}
    world = world_with(backup=backup_fields(resources=resources))
    post_and_apply(client, world)
    container = world.cronjobs["pg-orders-backup"]["spec"]["jobTemplate"]["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "1073741824"},  # a plain number stays decimal
    }
    assert settle(client, world).writes == ()


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
    # The Pods, the Services by name (primary, and read-only if set), then the backup Jobs.
    assert [r["resource"] for r in rules] == ["pods", "services", "jobs"]
    assert rules[2] == {
        "apiVersion": "batch/v1",
        "resource": "jobs",
        "labelSelector": {"matchLabels": {"pg-failover-hook.adg.io/backup-of": world.uid}},
        "namespace": world.parent["metadata"]["namespace"],
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
    post_and_apply(client, world)
    assert world.parent["status"]["backup"] == {
        "cronJob": "pg-orders-backup",
        "lastSuccessful": {
            "job": "pg-orders-backup-29250",
            "completionTime": "2026-08-20T02:16:09Z",
        },
    }
    assert settle(client, world).writes == ()


def test_customize_without_backup_relates_no_jobs(client: FlaskClient) -> None:
    body = fixture("customize-request.json")
    body["parent"]["spec"]["replicaService"] = {"name": READ_ONLY}
    response = client.post("/customize", data=json.dumps(body), content_type="application/json")
    rules = response.get_json()["relatedResources"]
    # The Pods, and the two Services by name (primary, read-only) in one rule: no Jobs.
    assert [r["resource"] for r in rules] == ["pods", "services"]
    assert rules[1]["names"] == ["pg-orders-primary", READ_ONLY]
