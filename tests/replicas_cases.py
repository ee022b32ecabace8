"""Shared cases and helpers of tests/test_replicas_*.py (one module per subject)."""

from __future__ import annotations

from typing import Any

from hooks.domain.members import MemberStatus
from testbed.fakes.patroni_wire import patroni_body
from tests.child_helpers import (
    LEADER_AT,
    MIB,
    SLICE,
    answer,
    children_of,
    cluster_answers,
    slice_names,
)
from tests.helpers import (
    CLUSTER,
    P0,
    P1,
    P2,
    make_service,
)

PRIMARY = make_service(pod=P0)


def replicas_body(name: str, **changes: Any) -> dict[str, Any]:
    """A streaming, caught-up replica's answer (as child_helpers.answer), changed."""
    body = patroni_body("replica", name=name)
    body["patroni"]["scope"] = CLUSTER
    body["xlog"] = {"received_location": LEADER_AT, "replayed_location": LEADER_AT, "paused": False}
    body.update(changes)
    return body


def tagged_member(name: str, **tags: object) -> MemberStatus:
    return MemberStatus.from_api_response(name, 503, replicas_body(name, tags=tags))


def paused_member(name: str) -> MemberStatus:
    body = replicas_body(name)
    body["xlog"]["paused"] = True
    return MemberStatus.from_api_response(name, 503, body)


def member_version(name: str, version: str, *, streaming: bool = True) -> MemberStatus:
    """An older Patroni's answer: no ``patroni.name`` (3.2.0), and without ``streaming`` no
    ``replication_state`` at all (what 3.0.0 to 3.0.3 send)."""
    body = replicas_body(name)
    body["patroni"] = {"version": version, "scope": CLUSTER}
    if not streaming:
        del body["replication_state"]
    return MemberStatus.from_api_response(name, 503, body)


def endpoints_of(outcome: Any, name: str = SLICE) -> list[str]:
    return slice_names(children_of(outcome, "EndpointSlice")[name])


def routed(**overrides: MemberStatus) -> dict[str, MemberStatus]:
    return cluster_answers(P0, **overrides)


# ======================================================================= fallbacks


def all_lagging() -> dict[str, MemberStatus]:
    return routed(
        pg_orders_1=answer(P1, behind=64 * MIB), pg_orders_2=answer(P2, replication_state=None)
    )
