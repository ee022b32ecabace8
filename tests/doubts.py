"""The cases where routing cannot be confirmed: one table for every child part's tests.

tests/test_sync_*.py runs each row through the strict oracle of the primary Service (the
observed Service kept exactly, the row's reason, the degraded resync);
tests/test_replicas_*.py and tests/test_backup.py run the same rows for the read-only objects
and the CronJob.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus
from testbed.fakes.patroni_wire import patroni_body
from tests.helpers import (
    P0,
    P1,
    P2,
    POD_NAME_LABEL,
    SELECTOR,
    claims,
    down,
    healthy,
    leader,
    make_pod,
    replica,
)


@dataclass(frozen=True)
class Doubt:
    """One case where routing cannot be confirmed."""

    id: str
    answers: Mapping[str, MemberStatus]
    reason: Decision
    says: str
    pods: Sequence[Mapping[str, Any]] = field(
        default_factory=lambda: [make_pod(n) for n in (P0, P1, P2)]
    )


def _pods(**overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """Three member pods; ``overrides`` maps a pod name to ``make_pod`` kwargs."""
    return [make_pod(n, **overrides.get(n.replace("-", "_"), {})) for n in (P0, P1, P2)]


def _unlabelled(name: str) -> dict[str, Any]:
    """A member pod whose metadata has no ``labels`` key at all."""
    pod = make_pod(name)
    del pod["metadata"]["labels"]
    return pod


def _impostor(
    name: str, labels: Mapping[str, str], ip: str | None = "10.244.9.10"
) -> dict[str, Any]:
    """A Pod that is no member but carries labels of one (``kubectl debug --copy-to``)."""
    return make_pod(name, ip, labels=labels)


DOUBTS = [
    Doubt(
        "no leader: every member answers 503",
        {P0: replica(P0), P1: replica(P1), P2: replica(P2)},
        Decision.NO_LEADER,
        "No member answers 200 on /primary (3 of 3 answered)",
    ),
    Doubt(
        "every member is unreachable",
        {P0: down(P0), P1: down(P1, "timed out"), P2: down(P2)},
        Decision.NO_LEADER,
        "(0 of 3 answered; unreachable: pg-orders-0: connection refused; pg-orders-1: timed out",
    ),
    Doubt(
        "two members answer 200 as primary",
        {P0: leader(P0), P1: leader(P1), P2: replica(P2)},
        Decision.MULTIPLE_LEADERS,
        "Several members answer 200 on /primary: pg-orders-0, pg-orders-1",
    ),
    Doubt(
        "a second member answers 200 while still a replica",
        {P0: leader(P0), P1: replica(P1), P2: claims(P2)},
        Decision.MULTIPLE_LEADERS,
        "Several members answer 200 on /primary: pg-orders-0, pg-orders-2",
    ),
    Doubt(
        "promotion in progress: 200 with role replica",
        {P0: replica(P0), P1: claims(P1, "replica"), P2: replica(P2)},
        Decision.LEADER_NOT_READY,
        "pg-orders-1 holds the leader lock but reports role=replica, state=running",
    ),
    Doubt(
        "leader losing the DCS: 200 with state stopping",
        {P0: claims(P0, "primary", "stopping"), P1: replica(P1), P2: replica(P2)},
        Decision.LEADER_NOT_READY,
        "pg-orders-0 holds the leader lock but reports role=primary, state=stopping",
    ),
    Doubt(
        "leader still starting",
        {P0: claims(P0, "primary", "starting"), P1: replica(P1), P2: replica(P2)},
        Decision.LEADER_NOT_READY,
        "state=starting",
    ),
    Doubt(
        "the leader's pod is terminating",
        healthy(P1),
        Decision.LEADER_TERMINATING,
        "Leader pg-orders-1 is terminating",
        pods=_pods(pg_orders_1={"deleting": True}),
    ),
    Doubt(
        "the leader's pod lacks the pod-name label",
        healthy(P1),
        Decision.LEADER_NOT_SELECTABLE,
        "Leader pg-orders-1 lacks the label(s) statefulset.kubernetes.io/pod-name",
        pods=_pods(pg_orders_1={"labels": dict(SELECTOR)}),
    ),
    Doubt(
        "the leader's pod lacks a primarySelector label",
        healthy(P1),
        Decision.LEADER_NOT_SELECTABLE,
        "Leader pg-orders-1 lacks the label(s) cluster-name",
        pods=_pods(pg_orders_1={"labels": {"application": "patroni", POD_NAME_LABEL: P1}}),
    ),
    Doubt(
        "the leader's pod has another value for a primarySelector label",
        healthy(P1),
        Decision.LEADER_NOT_SELECTABLE,
        "lacks the label(s) application",
        pods=_pods(
            pg_orders_1={"labels": {**SELECTOR, "application": "other", POD_NAME_LABEL: P1}}
        ),
    ),
    Doubt(
        "the leader's pod has no labels at all",
        healthy(P1),
        Decision.LEADER_NOT_SELECTABLE,
        "Leader pg-orders-1 lacks the label(s) application, cluster-name, "
        "statefulset.kubernetes.io/pod-name that the Service selector needs",
        pods=[make_pod(P0), _unlabelled(P1), make_pod(P2)],
    ),
    Doubt(
        "the leader's pod-name label names another pod",
        healthy(P1),
        Decision.LEADER_NOT_SELECTABLE,
        "lacks the label(s) statefulset.kubernetes.io/pod-name",
        pods=_pods(pg_orders_1={"labels": {**SELECTOR, POD_NAME_LABEL: P2}}),
    ),
    Doubt(
        "the leader's pod IP answers as another Patroni member",
        {
            P0: replica(P0),
            P1: MemberStatus.from_api_response(P1, 200, patroni_body("primary", name="pg-other-7")),
            P2: replica(P2),
        },
        Decision.MEMBER_NAME_MISMATCH,
        "Pod pg-orders-1's IP answers as Patroni member 'pg-other-7'",
    ),
    Doubt(
        "another pod carries the leader's pod-name label (an impostor)",
        healthy(P1),
        Decision.SELECTOR_NOT_UNIQUE,
        "pg-orders-debug carries statefulset.kubernetes.io/pod-name=pg-orders-1",
        pods=[*_pods(), _impostor("pg-orders-debug", {**SELECTOR, POD_NAME_LABEL: P1})],
    ),
    Doubt(
        "an impostor with no Pod IP yet is still one the selector would match",
        healthy(P1),
        Decision.SELECTOR_NOT_UNIQUE,
        "pg-orders-debug carries statefulset.kubernetes.io/pod-name=pg-orders-1",
        pods=[*_pods(), _impostor("pg-orders-debug", {**SELECTOR, POD_NAME_LABEL: P1}, None)],
    ),
    Doubt(
        "a pod with the leader's pod-name label but not the primarySelector labels",
        healthy(P1),
        Decision.SELECTOR_NOT_UNIQUE,
        "pg-orders-x carries statefulset.kubernetes.io/pod-name=pg-orders-1",
        pods=[*_pods(), _impostor("pg-orders-x", {POD_NAME_LABEL: P1})],
    ),
    Doubt(
        "a member whose pod-name label names the leader, and a copy: both named",
        healthy(P1),
        Decision.SELECTOR_NOT_UNIQUE,
        "Pods pg-orders-0, pg-orders-1-copy carry statefulset.kubernetes.io/pod-name=pg-orders-1",
        pods=[
            *_pods(pg_orders_0={"labels": {**SELECTOR, POD_NAME_LABEL: P1}}),
            _impostor("pg-orders-1-copy", {**SELECTOR, POD_NAME_LABEL: P1}),
        ],
    ),
    Doubt(
        "no pods at all",
        {},
        Decision.NO_MEMBERS,
        "No Pod matches primarySelector application=patroni,cluster-name=pg-orders",
        pods=[],
    ),
    Doubt(
        "the leader's pod has no podIP yet",
        healthy(P1),
        Decision.NO_LEADER,
        "(2 of 3 answered; unreachable: pg-orders-1: no pod IP)",
        pods=_pods(pg_orders_1={"ip": None}),
    ),
    Doubt(
        "the leader's podIP is a hostname",
        healthy(P1),
        Decision.NO_LEADER,
        "unreachable: pg-orders-1: no pod IP",
        pods=_pods(pg_orders_1={"ip": "evil.example"}),
    ),
]
DOUBT_IDS = [d.id for d in DOUBTS]
