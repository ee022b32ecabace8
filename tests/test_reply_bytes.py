"""The reply bytes of the recorded requests, pinned: a refactoring changes none of them.

Every recorded sync, finalize and customize request (``tests/fixtures/metacontroller/``) goes
through the real app (the Flask test client, a fixed clock, a fake prober) under a few
Patroni scenarios, with the spec as recorded and with ``spec.replicaService`` and
``spec.backup`` added, each also as an older CompositeController sends it (the ``Service.v1``
group only, as the first recordings were made: no EndpointSlice or CronJob group); then one
cluster's life is played through the Metacontroller stand-in (:mod:`testbed.metacontroller.apply`:
the
replies applied, so that the later requests carry observed read-only Services, their
EndpointSlices, the CronJob and a backup Job): settle, fail over, lose every member, an
invalid spec, finalize. Each reply's HTTP status and exact body bytes are compared with
``tests/fixtures/reply_bytes.json``.

That file was written from ``main`` before the typed observed state and the layered
folders changed the code, and is never rewritten to make a change
pass: a difference is a change of behaviour. To write it again on purpose (a change that
*should* alter replies, said so in the commit)::

    .venv/bin/python -m tests.test_reply_bytes --write
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks.domain.members import MemberStatus
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.metacontroller.apply import World, apply_reply, check_reply
from tests.child_helpers import READ_ONLY, answer, backup_fields
from tests.helpers import NO_AUTH, NOW, P0, P1, P2, FakeProber, down

ROOT = Path(__file__).resolve().parent
GOLDEN = ROOT / "fixtures" / "reply_bytes.json"
FIXTURES = ROOT / "fixtures" / "metacontroller"
MEMBERS = (P0, P1, P2)


def _scenarios() -> dict[str, dict[str, MemberStatus]]:
    """What Patroni answers, by scenario name."""
    return {
        "all-down": {n: down(n) for n in MEMBERS},
        "leader-0": {n: answer(n, "primary") if n == P0 else answer(n) for n in MEMBERS},
        "leader-1-lagging-2": {
            P0: answer(P0),
            P1: answer(P1, "primary"),
            P2: answer(P2, behind=64 * 1024 * 1024),
        },
        "two-leaders": {P0: answer(P0, "primary"), P1: answer(P1, "primary"), P2: answer(P2)},
    }


def _full(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the read-only Service and the backups asked for."""
    body = copy.deepcopy(body)
    spec = body["parent"].get("spec")
    if isinstance(spec, dict):
        spec.update({"replicaService": {"name": READ_ONLY}, "backup": backup_fields()})
    return body


def _services_only(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as a CompositeController that declares only ``v1/services`` sends it."""
    body = copy.deepcopy(body)
    body["children"] = {k: v for k, v in body["children"].items() if k == "Service.v1"}
    return body


def _variants(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "as-recorded": body,
        "services-only": _services_only(body),
        "full": _full(body),
        "full-services-only": _services_only(_full(body)),
    }


def _completed_job(uid: str, namespace: str) -> dict[str, Any]:
    when = "2026-08-20T02:31:00Z"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "pg-orders-backup-29000000",
            "namespace": namespace,
            "labels": {"pg-failover-hook.adg.io/backup-of": uid},
        },
        "status": {
            "completionTime": when,
            "succeeded": 1,
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": when}],
        },
    }


def _post(client: FlaskClient, path: str, body: object) -> dict[str, Any]:
    response = client.post(path, data=json.dumps(body), content_type="application/json")
    return {"status": response.status_code, "body": response.get_data(as_text=True)}


def _life(
    client: FlaskClient, prober: FakeProber, body: dict[str, Any]
) -> Iterator[tuple[str, Any]]:
    """One cluster's life through the stand-in: every reply, by step."""
    full = _full(body)
    world = World(
        parent=full["parent"],
        services=full["children"]["Service.v1"],
        pods=full["related"]["Pod.v1"],
    )
    world.jobs = {}
    scenarios = _scenarios()

    def step(name: str) -> Iterator[tuple[str, Any]]:
        reply = _post(client, "/sync", world.sync_request())
        yield name, reply
        if reply["status"] == 200:
            apply_reply(world, check_reply(reply["status"], reply["body"].encode()))

    prober.answers = scenarios["leader-0"]
    for i in range(3):
        yield from step(f"settle-{i}")
    job = _completed_job(world.uid, world.namespace)
    world.jobs = {job["metadata"]["name"]: job}
    yield from step("backup-done")
    prober.answers = scenarios["leader-1-lagging-2"]
    for i in range(2):
        yield from step(f"failover-{i}")
    prober.answers = scenarios["all-down"]
    yield from step("all-down")
    prober.answers = scenarios["two-leaders"]
    yield from step("two-leaders")
    spec = world.parent["spec"]
    world.parent["spec"] = {**spec, "healthCheckPath": "/replica"}
    yield from step("invalid-spec")
    world.parent["spec"] = {k: v for k, v in spec.items() if k not in ("replicaService", "backup")}
    prober.answers = scenarios["leader-0"]
    yield from step("parts-removed")
    world.parent["metadata"]["deletionTimestamp"] = "2026-08-20T10:00:00Z"
    for i in range(2):
        yield from step(f"finalize-{i}")


def replies(fixtures: Path = FIXTURES) -> dict[str, Any]:
    """Every case's reply, by case ID (``<fixture>/<variant>/<scenario>``).

    ``fixtures``: another folder of recorded requests (the same file names), to pin the
    replies to another copy of the recordings outside the repository by hand.
    """
    prober = FakeProber()
    app = create_app(settings=HookSettings(auth=NO_AUTH), prober=prober, clock=lambda: NOW)
    app.config["TESTING"] = True
    client = app.test_client()
    result: dict[str, Any] = {}
    for path in sorted(fixtures.glob("*.json")):
        recorded = json.loads(path.read_text())
        case = path.stem
        if path.name == "customize-request.json":
            result[f"{case}/as-recorded"] = _post(client, "/customize", recorded)
            result[f"{case}/full"] = _post(client, "/customize", _full(recorded))
            continue
        for variant, body in _variants(recorded).items():
            for scenario, answers in _scenarios().items():
                prober.answers = answers
                result[f"{case}/{variant}/{scenario}"] = _post(client, "/sync", body)
        if path.stem == "sync-first-no-service":
            for step, reply in _life(client, prober, recorded):
                result[f"{case}/life/{step}"] = reply
    return result


@pytest.fixture(scope="module")
def observed() -> dict[str, Any]:
    return replies()


def _golden() -> dict[str, Any]:
    """The pinned replies (none while the file is missing: then the first test fails)."""
    if not GOLDEN.exists():
        return {}
    golden: dict[str, Any] = json.loads(GOLDEN.read_text())
    return golden


def test_every_recorded_case_is_pinned(observed: dict[str, Any]) -> None:
    assert sorted(observed) == sorted(_golden())
    assert len(observed) > 60, "the cases come from the recorded fixtures: are they there?"


@pytest.mark.parametrize("case", sorted(_golden()))
def test_the_reply_bytes_are_the_recorded_ones(observed: dict[str, Any], case: str) -> None:
    assert observed[case] == _golden()[case]


if __name__ == "__main__":  # pragma: no cover - writes the golden file on purpose only
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write  (rewrites {GOLDEN})")
    GOLDEN.write_text(json.dumps(replies(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
