"""Contract tests of the read-only Service: the real Flask app, replies applied by the
Metacontroller stand-in (:mod:`testbed.metacontroller.apply`).

Test design: the recorded requests' world (tests/fixtures/metacontroller) with
``spec.replicaService`` (and ``spec.backup``, so the parts are seen side by side) added;
each reply is applied the way Metacontroller applies it, including the API server's
rewrites (``endpoints: null``), and the assertions are on the resulting objects and on
what kube-proxy would route to. A steady state must cost Metacontroller no write at all:
no object update, no PUT of an unchanged object, no status change.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.child_helpers import MIB, READ_ONLY, answer
from tests.contract_helpers import condition, healthy, post_and_apply, settle, world_with
from tests.helpers import P0, P1, P2, FakeProber, down

PRIMARY = "pg-orders-primary"


def test_the_read_only_endpoints_follow_a_failover(client: FlaskClient, prober: FakeProber) -> None:
    healthy(prober)
    world = world_with()
    settle(client, world)

    # pg-orders-0 dies; nobody is leader yet: everything stays as it is.
    prober.answers = {P0: down(P0), P1: answer(P1), P2: answer(P2)}
    before = json.loads(json.dumps(world.endpointslices))
    reply, applied = post_and_apply(client, world)
    assert world.endpointslices == before and applied.deleted_objects == ()
    assert condition(world, "ReplicasRouted")["reason"] == "LeaderNotConfirmed"
    assert reply["resyncAfterSeconds"] < 1

    # pg-orders-1 is promoted: it leaves the read-only endpoints in the same reply that
    # moves the primary Service to it.
    prober.answers = {P0: down(P0), P1: answer(P1, "primary"), P2: answer(P2)}
    _, applied = post_and_apply(client, world)
    assert world.selected_pods(PRIMARY) == [P1]
    assert world.endpoint_pods(READ_ONLY) == [P2]
    assert "EndpointSlice/pg-orders-replicas-ipv4" in applied.updated_objects

    # The old leader rejoins and streams: it joins the read-only endpoints.
    prober.answers[P0] = answer(P0)
    post_and_apply(client, world)
    assert world.endpoint_pods(READ_ONLY) == [P0, P2]
    assert settle(client, world).writes == ()


def test_a_lagging_replica_leaves_and_comes_back(client: FlaskClient, prober: FakeProber) -> None:
    healthy(prober)
    world = world_with()
    settle(client, world)

    healthy(prober, pg_orders_2=answer(P2, behind=17 * MIB))
    post_and_apply(client, world)
    assert world.endpoint_pods(READ_ONLY) == [P1]
    assert world.parent["status"]["replicaEndpoints"] == [P1]

    healthy(prober, pg_orders_2=answer(P2, behind=20 * MIB))  # still lagging: no write
    assert settle(client, world).writes == ()

    healthy(prober)
    post_and_apply(client, world)
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
    post_and_apply(client, world)
    expected = {"KeepEndpoints": [P1, P2], "UseLeader": [P0], "Empty": []}[fallback]
    assert world.endpoint_pods(READ_ONLY) == expected
    if fallback == "Empty":
        # Stored as the API server stores it, and echoed so: no PUT on every sync.
        assert world.endpointslices["pg-orders-replicas-ipv4"]["endpoints"] is None
    assert settle(client, world).writes == ()


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
    _, applied = post_and_apply(client, world)
    assert applied.deleted_objects == ()
    assert world.endpoint_pods(READ_ONLY) == [P1, P2]
    assert world.selected_pods(PRIMARY) == [P0]
