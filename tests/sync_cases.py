"""Shared cases and helpers of the tests/test_sync.py split (one module per subject)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from hooks.core.outcome import SyncOutcome
from tests.helpers import (
    CLUSTER,
    NAMESPACE,
    NOW,
    P0,
    SELECTOR,
    SERVICE_NAME,
    service_selector,
)

NOW_STAMP = "2026-08-20T10:00:00Z"


LATER = NOW + timedelta(minutes=7, seconds=13)


EARLIER_STAMP = "2026-08-20T09:00:00Z"


MANAGED_BY = {"app.kubernetes.io/managed-by": "pg-failover-hook"}


#: Fields the API server owns or allocates: never in a child of a reply.
SERVER_FIELDS = frozenset(
    {
        "clusterIP",
        "clusterIPs",
        "ipFamilies",
        "ipFamilyPolicy",
        "internalTrafficPolicy",
        "sessionAffinity",
        "healthCheckNodePort",
        "nodePort",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "ownerReferences",
        "selfLink",
        "finalizers",
    }
)


# --------------------------------------------------------------------- helpers


def condition(body_or_status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    status = body_or_status.get("status", body_or_status)
    matches = [c for c in status["conditions"] if c["type"] == type_]
    assert len(matches) == 1, f"expected exactly one {type_} condition in {status}"
    return matches[0]


def services_of(outcome: SyncOutcome) -> dict[str, dict[str, Any]]:
    found = [c for c in outcome.body["children"] if c.get("kind") == "Service"]
    by_name = {c["metadata"]["name"]: c for c in found}
    assert len(by_name) == len(found), "a Service is listed twice"
    return by_name


def expected_service(pod: str, name: str = SERVICE_NAME) -> dict[str, Any]:
    """The exact Service the hook must ask for with the seed spec."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(MANAGED_BY)},
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": "postgresql", "port": 5432, "targetPort": 5432, "protocol": "TCP"}],
            "selector": service_selector(pod),
        },
    }


def walk_keys(value: object, path: str = "") -> Iterator[tuple[str, str]]:
    """Every (path, key) of every mapping inside ``value``."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield path, key
            yield from walk_keys(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk_keys(item, f"{path}[{index}]")


def observed_objects(body: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (obj["apiVersion"], obj["kind"], name)
        for group in body["children"].values()
        for name, obj in group.items()
    }


def replied_objects(outcome: SyncOutcome) -> set[tuple[str, str, str]]:
    return {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in outcome.body["children"]}


def config_map(name: str = "pg-orders-extra") -> dict[str, Any]:
    """A child of another type, as an informer delivers it (server fields included)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": "uid-cm",
            "resourceVersion": "77",
            "creationTimestamp": "2026-08-20T09:12:05Z",
            "labels": {"controller-uid": "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"},
            "ownerReferences": [{"kind": "PostgreSQLCluster", "name": CLUSTER, "uid": "u"}],
            "managedFields": [{"manager": "metacontroller"}],
        },
        "data": {"note": "kept by the hook"},
    }


def pod_disruption_budget() -> dict[str, Any]:
    """A child of another type whose spec nests objects two levels deep."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "uid": "uid-pdb"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(SELECTOR)}},
    }


PRESERVED_CONFIG_MAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "pg-orders-extra",
        "namespace": NAMESPACE,
        "labels": {"controller-uid": "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"},
    },
    "data": {"note": "kept by the hook"},
}


#: The parent's status after a healthy sync that routed to pg-orders-0 at 09:00.
ROUTED_STATUS = {
    "observedGeneration": 1,
    "primary": P0,
    "service": SERVICE_NAME,
    "timeline": 1,
    "members": [],
    "conditions": [
        {
            "type": t,
            "status": "True",
            "reason": r,
            "message": m,
            "lastTransitionTime": EARLIER_STAMP,
            "observedGeneration": 1,
        }
        for t, r, m in (
            ("Ready", "LeaderFound", "Patroni reports pg-orders-0 as leader"),
            ("PrimaryRouted", "LeaderFound", "Patroni reports pg-orders-0 as leader"),
            ("SpecValid", "SpecAccepted", "The spec is valid"),
        )
    ],
}
