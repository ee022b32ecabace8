"""Posting to the real Flask app and applying its replies as Metacontroller does.

The contract tests (tests/test_contract.py, test_replicas_contract.py,
test_backup_contract.py) share these: a :class:`~standin.apply.World` built from a recorded
request, one sync through the app's test client with the reply checked and applied
(:mod:`testbed.metacontroller.apply`), syncing until nothing changes, and reading a condition back.
"""

from __future__ import annotations

import json
from typing import Any

from flask.testing import FlaskClient

from testbed.metacontroller.apply import Applied, World, apply_reply, check_reply
from tests.child_helpers import READ_ONLY, answer, backup_fields
from tests.helpers import P0, P1, P2, FakeProber, fixture


def world_of(body: dict[str, Any]) -> World:
    """The objects a recorded request describes, as the stand-in's world."""
    return World(
        parent=body["parent"],
        services=body["children"]["Service.v1"],
        pods=body["related"]["Pod.v1"],
    )


def world_with(name: str = "sync-first-no-service.json", **spec: Any) -> World:
    """The world of recorded request ``name`` with ``spec.replicaService`` and
    ``spec.backup`` added (and ``spec`` overrides on top)."""
    body = fixture(name)
    body["parent"]["spec"].update(
        {"replicaService": {"name": READ_ONLY}, "backup": backup_fields(), **spec}
    )
    return world_of(body)


def post_and_apply(client: FlaskClient, world: World) -> tuple[dict[str, Any], Applied]:
    """One sync: post the world's request, check the reply strictly, apply it."""
    response = client.post(
        "/sync", data=json.dumps(world.sync_request()), content_type="application/json"
    )
    reply = check_reply(response.status_code, response.data)
    return reply, apply_reply(world, reply)


def settle(client: FlaskClient, world: World) -> Applied:
    """Sync until a reply changes nothing (Metacontroller's own writes trigger syncs)."""
    for _ in range(5):
        _, applied = post_and_apply(client, world)
        if not (applied.changed_children or applied.status_changed or applied.writes):
            return applied
    raise AssertionError(f"no steady state after 5 syncs: {applied}")


def healthy(prober: FakeProber, leading: str = P0, **overrides: Any) -> None:
    """``leading`` answers as the leader, the others as caught-up replicas (overrides by
    name, ``pg_orders_1=...``)."""
    prober.answers = {n: answer(n, "primary") if n == leading else answer(n) for n in (P0, P1, P2)}
    prober.answers.update({k.replace("_", "-"): v for k, v in overrides.items()})


def condition(world: World, kind: str = "Ready") -> dict[str, Any]:
    """The parent's condition of type ``kind``."""
    return next(c for c in world.parent["status"]["conditions"] if c["type"] == kind)
