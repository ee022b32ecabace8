"""Shapes of the child objects the hook emits, shared by the primary and read-only Services.

Pure: plain dicts with only the fields we own (never ``clusterIP`` or other fields the API
server fills in; Metacontroller's three-way merge keeps those because we never set them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hooks.domain.model import MANAGED_BY, MANAGED_BY_LABEL, ServicePort


def service(
    name: str,
    namespace: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    service_type: str,
    ports: Iterable[ServicePort],
    selector: Mapping[str, str] | None = None,
    traffic_distribution: str | None = None,
) -> dict[str, Any]:
    """A ``v1`` Service; without ``selector`` its endpoints are written by us.
    ``traffic_distribution``: its ``spec.trafficDistribution`` (none when ``None``)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, **labels},
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    spec: dict[str, Any] = {
        "type": service_type,
        "ports": [port.as_manifest() for port in ports],
    }
    if selector is not None:
        spec["selector"] = dict(selector)
    if traffic_distribution is not None:
        spec["trafficDistribution"] = traffic_distribution
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}
