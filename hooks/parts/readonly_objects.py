"""The read-only part's objects: the selector-less Service, its EndpointSlices, and reading them.

Builders of the desired objects (:func:`desired_service`, :func:`desired_slice`,
:func:`endpoint`, :func:`desired_objects`) and readers of the observed ones (which Service
is ours, which Pods our slices list now). The decision of who is listed is
:mod:`hooks.parts.readonly`'s.

Pure: plain mappings in, new dicts out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from hooks.core import manifests
from hooks.core.keeping import Keep, labels_of, last_applied, metadata_of
from hooks.domain.model import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    READ_ONLY,
    READ_ONLY_LABEL,
    SERVICE_NAME_LABEL,
    SLICE_MANAGED_BY_LABEL,
    SLICE_MANAGER,
    ClusterSpec,
    ReplicaServiceSpec,
)

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Objects = Mapping[str, Mapping[str, Any]]


def is_read_only_service(service: Mapping[str, Any]) -> bool:
    """Whether an observed Service is one of our read-only Services (by its label)."""
    for labels in (labels_of(service), labels_of(last_applied(service))):
        if labels.get(READ_ONLY_LABEL) == READ_ONLY:
            return True
    return False


def desired_service(
    spec: ClusterSpec, rs: ReplicaServiceSpec, namespace: str, name: str
) -> dict[str, Any]:
    """A read-only Service: the primary Service's ports, and no selector (we write its slices)."""
    return manifests.service(
        name,
        namespace,
        labels={**rs.labels, READ_ONLY_LABEL: READ_ONLY},
        annotations=rs.annotations,
        service_type=rs.service_type,
        ports=spec.service_ports,
    )


def slice_name(service: str, family: int) -> str:
    """``<service>-ipv4`` / ``<service>-ipv6``: one slice per address family (addressType is
    immutable, so a family never moves to another slice)."""
    return f"{service}-ipv{family}"


def desired_slice(
    namespace: str,
    service: str,
    family: int,
    endpoints: list[dict[str, Any]],
    ports: list[dict[str, Any]],
) -> dict[str, Any]:
    """One EndpointSlice of a read-only Service.

    No endpoints are written as ``null``, not ``[]``: that is how the API server returns an
    empty slice (kubernetes/kubernetes#135968), and Metacontroller compares our object with
    what it observes; ``[]`` would make it PUT the slice again on every sync.
    """
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(service, family),
            "namespace": namespace,
            "labels": {
                SERVICE_NAME_LABEL: service,
                SLICE_MANAGED_BY_LABEL: SLICE_MANAGER,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
        },
        "addressType": f"IPv{family}",
        "endpoints": endpoints or None,
        "ports": ports,
    }


def endpoint(name: str, pod: Mapping[str, Any], ip: IP, namespace: str) -> dict[str, Any]:
    """One listed member: its Pod IP and a reference to its Pod."""
    metadata = metadata_of(pod)
    target: dict[str, Any] = {"kind": "Pod", "namespace": namespace, "name": name}
    if isinstance(metadata.get("uid"), str):
        target["uid"] = metadata["uid"]
    entry: dict[str, Any] = {
        "addresses": [str(ip)],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": target,
    }
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if isinstance(node, str) and node:
        entry["nodeName"] = node
    return entry


def desired_objects(
    spec: ClusterSpec,
    namespace: str,
    *,
    services: Objects,
    slices: Objects,
    listed: Sequence[tuple[str, Mapping[str, Any], IP]],
    default_family: int,
    ports: list[dict[str, Any]],
    keep: Keep,
) -> list[dict[str, Any]]:
    """Every read-only Service with its slices listing ``listed`` (name, Pod, IP).

    ``services`` and ``slices`` are the observed read-only Services and EndpointSlices. A
    Service without any slice gets one of ``default_family`` (the leader's). A slice of
    ours is never dropped: one for a family nobody is listed in any more, or one labelled
    for the primary Service, is emptied; slices of other Services are kept as they are.
    """
    rs = spec.replica_service
    assert rs is not None
    by_family: dict[int, list[dict[str, Any]]] = {}
    for name, pod, ip in listed:
        by_family.setdefault(ip.version, []).append(endpoint(name, pod, ip, namespace))
    objects: list[dict[str, Any]] = []
    for service in sorted({rs.name, *services} - {spec.service_name}):
        objects.append(desired_service(spec, rs, namespace, service))
        families = set(by_family)
        families.update(f for f in (4, 6) if slice_name(service, f) in slices)
        if not families:
            families.add(default_family)
        for family in sorted(families):
            objects.append(
                desired_slice(namespace, service, family, by_family.get(family, []), ports)
            )
        # Any other slice of ours for this Service is emptied, never dropped.
        for name, slice_ in sorted(slices.items()):
            if service_of(slice_) == service and name not in {
                slice_name(service, f) for f in families
            }:
                objects.append(_emptied(keep(slice_)))
    # A slice of ours labelled for the primary Service (after a rename swapped the names)
    # would add replicas to the primary's endpoints: empty it.
    for _, slice_ in sorted(slices.items()):
        if service_of(slice_) == spec.service_name and _managed_by_us(slice_):
            objects.append(_emptied(keep(slice_)))
    # Slices of other Services are kept as they are.
    objects += [keep(s) for _, s in sorted(slices.items()) if not _ours(s, services, spec)]
    return objects


def slice_ports(spec: ClusterSpec, pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The slice's ports: one per Service port, named like it, with the Pod's port number.

    A named ``targetPort`` is resolved in the Pod's container ports (an EndpointSlice
    carries numbers); ``None`` if it is not there.
    """
    declared: dict[str, int] = {}
    pod_spec = pod.get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    for container in containers if isinstance(containers, list) else []:
        container_ports = container.get("ports") if isinstance(container, Mapping) else None
        for port in container_ports if isinstance(container_ports, list) else []:
            if isinstance(port, Mapping) and isinstance(port.get("name"), str):
                number = port.get("containerPort")
                if isinstance(number, int) and not isinstance(number, bool):
                    declared.setdefault(port["name"], number)
    result = []
    for port in spec.service_ports:
        target = port.target_port
        number = target if isinstance(target, int) else declared.get(target)
        if number is None:
            return None
        result.append({"name": port.name, "port": number, "protocol": port.protocol})
    return result


def listed_now(slices: Objects, service: str) -> dict[str, str]:
    """Pod name → address of every endpoint our slices of ``service`` list now."""
    listed: dict[str, str] = {}
    for _, observed in sorted(slices.items()):
        if service_of(observed) != service:
            continue
        endpoints = observed.get("endpoints")
        for entry in endpoints if isinstance(endpoints, list) else []:
            if not isinstance(entry, Mapping):
                continue
            target = entry.get("targetRef")
            addresses = entry.get("addresses")
            if (
                isinstance(target, Mapping)
                and target.get("kind") == "Pod"
                and isinstance(target.get("name"), str)
                and isinstance(addresses, list)
                and addresses
                and isinstance(addresses[0], str)
            ):
                listed.setdefault(target["name"], addresses[0])
    return listed


def service_of(observed: Mapping[str, Any]) -> str | None:
    """The Service an observed EndpointSlice belongs to (its ``service-name`` label)."""
    value = labels_of(observed).get(SERVICE_NAME_LABEL)
    return value if isinstance(value, str) else None


def _ours(observed: Mapping[str, Any], services: Objects, spec: ClusterSpec) -> bool:
    """Whether :func:`desired_objects` emits (a version of) this observed slice."""
    rs = spec.replica_service
    assert rs is not None
    service = service_of(observed)
    if service in {rs.name, *services} - {spec.service_name}:
        return True
    return service == spec.service_name and _managed_by_us(observed)


def _managed_by_us(observed: Mapping[str, Any]) -> bool:
    return labels_of(observed).get(SLICE_MANAGED_BY_LABEL) == SLICE_MANAGER


def _emptied(preserved: dict[str, Any]) -> dict[str, Any]:
    """A slice kept (never dropped) but listing nobody."""
    preserved["endpoints"] = None
    return preserved
