"""The observed objects of a sync request, loaded once into :mod:`hooks.domain.observed` values.

:func:`hooks.loaders.envelope.load_sync_request` hands every child group, the related Pods
and Jobs, and the parent's status through here (the status is read by
:mod:`hooks.loaders.previous_status`). Each object's ``metadata`` must be an
object whose ``name`` is the object's key in its group, with ``labels`` and ``annotations``
maps of strings to strings (absent or ``null``: empty), as the API server always sends
them: anything else is junk the hook cannot read, refused with an :class:`ObservedError`
(the envelope answers 400). Everything past ``metadata`` that Kubernetes may leave out or
that is free input (a Pod without an IP yet, a hand-edited selector, an unusable
last-applied record, a status anyone can write) loads as an attribute that says so, never
as an error: the hook must keep working, and keep what it observed, whatever is there.

Pure: plain mappings in, frozen values out; the observed objects are never modified.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from hooks.domain.model import (
    CRONJOB_KEY,
    ENDPOINTSLICE_KEY,
    JOB_KEY,
    LAST_APPLIED_ANNOTATION,
    POD_KEY,
    ROLE_ALIASES,
    SERVICE_KEY,
    STATUS_ANNOTATION,
)
from hooks.domain.observed import (
    EMPTY,
    IP,
    Child,
    CronJobChild,
    Job,
    JobEnd,
    OwnerRef,
    Pod,
    PreviousStatus,
    ServiceChild,
    SliceChild,
    is_time,
)
from hooks.loaders.jsonbody import JsonRefused, bounded_loads
from hooks.loaders.previous_status import load_previous_status

T = TypeVar("T", bound=Child)
#: Patroni's member JSON in the ``status`` annotation is small; more is not Patroni's.
_MAX_STATUS_ANNOTATION = 65536
#: Kubernetes' limit on all of an object's annotations together
#: (``TotalAnnotationSizeLimitB``): no last-applied record can be larger.
_MAX_LAST_APPLIED = 256 * 1024


class ObservedError(ValueError):
    """An observed object's ``metadata`` is junk: the request cannot be read."""


# ------------------------------------------------------------------- metadata


def _metadata(group: str, key: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``obj``'s metadata, checked: an object named ``key`` with string maps."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if name != key:
        raise ObservedError(f"{group}[{key!r}] has metadata.name {name!r}")
    assert isinstance(metadata, Mapping)
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if value is not None and not _string_map(value):
            raise ObservedError(
                f"{group}[{key!r}] has metadata.{field} that is not a map of strings to strings"
            )
    return metadata


def _string_map(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _strings(metadata: Mapping[str, Any], field: str) -> Mapping[str, str]:
    value = metadata.get(field)
    return MappingProxyType(dict(value)) if value else EMPTY


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else EMPTY


# ------------------------------------------------------------------ all at once


@dataclass(frozen=True, slots=True)
class Observed:
    """Everything a sync request observed, loaded (the envelope puts it into a SyncRequest)."""

    services: dict[str, ServiceChild]
    other_children: dict[str, dict[str, Child]]
    slices: dict[str, SliceChild] | None
    cronjobs: dict[str, CronJobChild] | None
    pods: dict[str, Pod]
    jobs: dict[str, Job] | None
    previous: PreviousStatus
    #: The number of related Pods when they were too many to load (``pods`` is empty).
    pod_count: int | None = None
    #: The related ``Service.v1`` group (Services by name), ``None`` without one.
    named_services: dict[str, ServiceChild] | None = None
    #: Whether the related Pods group is there at all (empty or not).
    pods_related: bool = True


def load_observed(
    children: Mapping[str, Mapping[str, Mapping[str, Any]]],
    related: Mapping[str, Mapping[str, Mapping[str, Any]]],
    status: object,
    *,
    max_pods: int | None = None,
) -> Observed:
    """The child groups (with a ``Service.v1`` one), the related groups and the status.

    More than ``max_pods`` related Pods are counted, not loaded.
    """
    other = {k: load_children(k, v) for k, v in children.items() if k != SERVICE_KEY}
    jobs = related.get(JOB_KEY)
    pods = related.get(POD_KEY, {})
    too_many = max_pods is not None and len(pods) > max_pods
    named = related.get(SERVICE_KEY)
    return Observed(
        services=typed(load_children(SERVICE_KEY, children[SERVICE_KEY]), ServiceChild) or {},
        other_children=other,
        slices=typed(other.get(ENDPOINTSLICE_KEY), SliceChild),
        cronjobs=typed(other.get(CRONJOB_KEY), CronJobChild),
        pods={} if too_many else load_pods(POD_KEY, pods),
        jobs=load_jobs(JOB_KEY, jobs) if jobs is not None else None,
        previous=load_previous_status(status),
        pod_count=len(pods) if too_many else None,
        named_services=(
            typed(load_children(SERVICE_KEY, named), ServiceChild) if named is not None else None
        ),
        pods_related=POD_KEY in related,
    )


# ------------------------------------------------------------------------- Pods


def load_pods(group: str, objects: Mapping[str, Mapping[str, Any]]) -> dict[str, Pod]:
    """Every related Pod, by name."""
    return {key: load_pod(group, key, obj) for key, obj in objects.items()}


def load_pod(group: str, key: str, obj: Mapping[str, Any]) -> Pod:
    """One related Pod (``group`` and ``key`` name it in a refusal)."""
    metadata = _metadata(group, key, obj)
    annotations = _strings(metadata, "annotations")
    status = _mapping(obj.get("status"))
    spec = _mapping(obj.get("spec"))
    uid = metadata.get("uid")
    node = spec.get("nodeName")
    return Pod(
        name=key,
        ip=_pod_ip(status.get("podIP")),
        labels=_strings(metadata, "labels"),
        terminating=bool(metadata.get("deletionTimestamp")),
        not_ready=_not_ready(status),
        status_role=_annotation_role(annotations.get(STATUS_ANNOTATION)),
        uid=uid if isinstance(uid, str) else None,
        node_name=node if isinstance(node, str) and node else None,
        container_ports=MappingProxyType(_container_ports(spec)),
    )


def _pod_ip(raw: object) -> IP | None:
    """``status.podIP`` if it is an IP literal, else ``None``."""
    if not isinstance(raw, str):
        return None
    try:
        ip = ipaddress.ip_address(raw)
    except ValueError:
        return None
    # A Pod IP never has an IPv6 zone, and a zone is free text: "::1%@evil.example:80#"
    # parses as an address but would put a hostname into the probe URL.
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return None
    return ip


def _not_ready(status: Mapping[str, Any]) -> bool:
    """The kubelet says the Pod is not Ready (an absent condition is not a "no")."""
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return bool(condition.get("status") == "False")
    return False


def _container_ports(spec: Mapping[str, Any]) -> dict[str, int]:
    declared: dict[str, int] = {}
    containers = spec.get("containers")
    for container in containers if isinstance(containers, list) else []:
        container_ports = container.get("ports") if isinstance(container, Mapping) else None
        for port in container_ports if isinstance(container_ports, list) else []:
            if isinstance(port, Mapping) and isinstance(port.get("name"), str):
                number = port.get("containerPort")
                # JSON's ``true`` is an ``int`` to Python, and no port.
                if isinstance(number, int) and not isinstance(number, bool):
                    declared.setdefault(port["name"], number)
    return declared


def _annotation_role(raw: object) -> str | None:
    """The ``role`` of Patroni's member JSON, normalised; ``None`` if it is not that."""
    if not isinstance(raw, str):
        return None
    try:
        data = bounded_loads(raw, max_bytes=_MAX_STATUS_ANNOTATION)
    except JsonRefused:
        return None  # anyone who may patch the Pod writes it: ignored, never an error
    if not isinstance(data, Mapping):
        return None
    role = data.get("role")
    if not isinstance(role, str) or not role or not isinstance(data.get("state"), str):
        return None
    return ROLE_ALIASES.get(role, role)


# --------------------------------------------------------------------- children


def load_children(group: str, objects: Mapping[str, Mapping[str, Any]]) -> dict[str, Child]:
    """Every observed child of one group, by name, as the value its group loads into."""
    return {key: load_child(group, key, obj) for key, obj in objects.items()}


def load_child(group: str, key: str, obj: Mapping[str, Any]) -> Child:
    """One observed child: a Service, an EndpointSlice, a CronJob or any other."""
    metadata = _metadata(group, key, obj)
    raw = MappingProxyType(obj)
    labels = _strings(metadata, "labels")
    applied = _last_applied(obj, metadata)
    if group == SERVICE_KEY:
        spec = _mapping(obj.get("spec"))
        selector = spec.get("selector")
        applied_labels = _mapping(applied.get("metadata")).get("labels") if applied else None
        return ServiceChild(
            group,
            key,
            labels,
            applied,
            raw,
            selector=selector if isinstance(selector, Mapping) else None,
            applied_labels=applied_labels if isinstance(applied_labels, Mapping) else EMPTY,
            owners=_owners(metadata.get("ownerReferences")),
            deleting=bool(metadata.get("deletionTimestamp")),
        )
    if group == ENDPOINTSLICE_KEY:
        return SliceChild(group, key, labels, applied, raw, endpoints=_endpoints(obj))
    if group == CRONJOB_KEY:
        resources = MappingProxyType(_container_resources(obj))
        return CronJobChild(group, key, labels, applied, raw, container_resources=resources)
    return Child(group, key, labels, applied, raw)


def _owners(value: object) -> tuple[OwnerRef, ...]:
    """``metadata.ownerReferences``: the entries with string identity fields, in order."""
    found = []
    for entry in value if isinstance(value, list) else []:
        if not isinstance(entry, Mapping):
            continue
        ident = [entry.get(k) for k in ("apiVersion", "kind", "name", "uid")]
        if all(isinstance(v, str) for v in ident):
            api_version, kind, name, uid = (str(v) for v in ident)
            found.append(OwnerRef(api_version, kind, name, uid, entry.get("controller") is True))
    return tuple(found)


def typed(group: Mapping[str, Child] | None, kind: type[T]) -> dict[str, T] | None:
    """A loaded group whose children are all ``kind`` (as :func:`load_child` makes them)."""
    if group is None:
        return None
    found = {name: child for name, child in group.items() if isinstance(child, kind)}
    assert len(found) == len(group), "load_child loads a group alike"  # pragma: no mutate
    return found


def _last_applied(obj: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the hook last asked for (Metacontroller's record), if it is usable.

    Usable: JSON, an object with a ``metadata`` object (and a ``spec`` object, if any),
    for this very object (same ``apiVersion``, ``kind`` and name).
    """
    raw = _mapping(metadata.get("annotations")).get(LAST_APPLIED_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        applied = bounded_loads(raw, max_bytes=_MAX_LAST_APPLIED)
    except JsonRefused:
        return None  # unusable: the observed object itself is kept instead
    if not isinstance(applied, dict) or not isinstance(applied.get("metadata"), dict):
        return None
    if not isinstance(applied.get("spec", {}), dict):
        return None
    same_kind = all(applied.get(key) == obj.get(key) for key in ("apiVersion", "kind"))
    same_name = applied["metadata"].get("name") == metadata.get("name")
    return applied if same_kind and same_name else None


def _endpoints(obj: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """``(Pod name, first address)`` of each endpoint that references a Pod."""
    found = []
    endpoints = obj.get("endpoints")
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
            found.append((target["name"], addresses[0]))
    return tuple(found)


def _container_resources(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Mapping[str, str]]]:
    node: Any = obj
    for key in ("spec", "jobTemplate", "spec", "template", "spec"):
        node = node.get(key) if isinstance(node, Mapping) else None
    containers = node.get("containers") if isinstance(node, Mapping) else None
    found: dict[str, Mapping[str, Mapping[str, str]]] = {}
    for container in containers if isinstance(containers, list) else []:
        if isinstance(container, Mapping) and isinstance(container.get("name"), str):
            resources = _mapping(container.get("resources"))
            found.setdefault(
                container["name"],
                MappingProxyType(
                    {
                        group: MappingProxyType(
                            {
                                k: v
                                for k, v in _mapping(resources.get(group)).items()
                                if isinstance(v, str)
                            }
                        )
                        for group in ("requests", "limits")
                    }
                ),
            )
    return found


# ------------------------------------------------------------------------- Jobs


def load_jobs(group: str, objects: Mapping[str, Mapping[str, Any]]) -> dict[str, Job]:
    """Every related backup Job, by name."""
    jobs = {}
    for key, obj in objects.items():
        metadata = _metadata(group, key, obj)
        jobs[key] = Job(key, _strings(metadata, "labels"), _finished(obj))
    return jobs


def _finished(job: Mapping[str, Any]) -> JobEnd | None:
    """How a finished Job ended, else ``None``."""
    status = job.get("status")
    if not isinstance(status, Mapping):
        return None
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if not isinstance(condition, Mapping) or condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind not in ("Complete", "Failed"):
            continue
        when = status.get("completionTime") if kind == "Complete" else None
        when = when if is_time(when) else condition.get("lastTransitionTime")
        if not is_time(when):
            continue
        reason = condition.get("reason")
        assert isinstance(when, str)
        return JobEnd(str(kind), when, reason if isinstance(reason, str) and reason else str(kind))
    return None
