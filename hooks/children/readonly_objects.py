"""The read-only part's objects: the selector-less Service, its EndpointSlices, and reading them.

Builders of the desired objects (:func:`desired_service`, :func:`desired_slice`,
:func:`endpoint`, :func:`desired_objects`) and readers of the observed ones (which Service
is ours, which Pods our slices list now). The decision of who is listed is
:mod:`hooks.children.readonly`'s.

Pure: typed observed values in, new dicts out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hooks.core import manifests
from hooks.core.keeping import Keep
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
from hooks.domain.observed import IP, Pod, ServiceChild, SliceChild

Services = Mapping[str, ServiceChild]
Slices = Mapping[str, SliceChild]


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
        traffic_distribution=rs.traffic_distribution,
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


def endpoint(
    name: str, pod: Pod, ip: IP, namespace: str, zone: str | None = None
) -> dict[str, Any]:
    """One listed member: its Pod IP and a reference to its Pod; with a ``zone``, that zone
    and the same-zone hint the EndpointSlice controller writes for ``PreferSameZone``
    (:mod:`hooks.children.read_zones`)."""
    target: dict[str, Any] = {"kind": "Pod", "namespace": namespace, "name": name}
    if pod.uid is not None:
        target["uid"] = pod.uid
    entry: dict[str, Any] = {
        "addresses": [str(ip)],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": target,
    }
    if pod.node_name is not None:
        entry["nodeName"] = pod.node_name
    if zone is not None:
        entry["zone"] = zone
        entry["hints"] = {"forZones": [{"name": zone}]}
    return entry


def desired_objects(
    spec: ClusterSpec,
    namespace: str,
    *,
    services: Services,
    slices: Slices,
    listed: Sequence[tuple[str, Pod, IP]],
    default_family: int,
    ports: list[dict[str, Any]],
    keep: Keep,
    zones: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every read-only Service with its slices listing ``listed`` (name, Pod, IP), each
    endpoint with its zone in ``zones`` if it has one there.

    ``services`` and ``slices`` are the observed read-only Services and EndpointSlices. A
    Service without any slice gets one of ``default_family`` (the leader's). A slice of
    ours is never dropped: one for a family nobody is listed in any more, or one labelled
    for the primary Service, is emptied; slices of other Services are kept as they are.
    """
    rs = spec.replica_service
    assert rs is not None
    by_family: dict[int, list[dict[str, Any]]] = {}
    for name, pod, ip in listed:
        zone = (zones or {}).get(name)
        by_family.setdefault(ip.version, []).append(endpoint(name, pod, ip, namespace, zone))
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


def slice_ports(spec: ClusterSpec, pod: Pod | None) -> list[dict[str, Any]] | None:
    """The slice's ports: one per Service port, named like it, with the Pod's port number.

    A named ``targetPort`` is resolved in the Pod's container ports (an EndpointSlice
    carries numbers); ``None`` if it is not there (or there is no Pod).
    """
    declared = pod.container_ports if pod is not None else {}
    result = []
    for port in spec.service_ports:
        target = port.target_port
        number = target if isinstance(target, int) else declared.get(target)
        if number is None:
            return None
        result.append({"name": port.name, "port": number, "protocol": port.protocol})
    return result


def listed_now(slices: Slices, service: str) -> dict[str, str]:
    """Pod name → address of every endpoint our slices of ``service`` list now."""
    listed: dict[str, str] = {}
    for _, observed in sorted(slices.items()):
        if service_of(observed) == service:
            for pod, address in observed.endpoints:
                listed.setdefault(pod, address)
    return listed


def service_of(observed: SliceChild) -> str | None:
    """The Service an observed EndpointSlice belongs to (its ``service-name`` label)."""
    return observed.labels.get(SERVICE_NAME_LABEL)


def _ours(observed: SliceChild, services: Services, spec: ClusterSpec) -> bool:
    """Whether :func:`desired_objects` emits (a version of) this observed slice."""
    rs = spec.replica_service
    assert rs is not None
    service = service_of(observed)
    if service in {rs.name, *services} - {spec.service_name}:
        return True
    return service == spec.service_name and _managed_by_us(observed)


def _managed_by_us(observed: SliceChild) -> bool:
    return observed.labels.get(SLICE_MANAGED_BY_LABEL) == SLICE_MANAGER


def _emptied(preserved: dict[str, Any]) -> dict[str, Any]:
    """A slice kept (never dropped) but listing nobody."""
    preserved["endpoints"] = None
    return preserved
