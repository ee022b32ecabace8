"""The observed objects of a sync request, loaded once into :mod:`hooks.domain.observed` values.

:func:`hooks.loaders.envelope.load_sync_request` hands every child group, the related Pods
and Jobs, and the parent's status through here. Each object's ``metadata`` must be an
object whose ``name`` is the object's key in its group, with ``labels`` and ``annotations``
maps of strings to strings (absent or ``null``: empty), as the API server always sends
them: anything else is junk the hook cannot read, refused with an :class:`ObservedError`
(the envelope answers 400). Everything past ``metadata`` that Kubernetes may leave out or
that is free input (a Pod without an IP yet, a hand-edited selector, an unusable
last-applied record, a status anyone can write) loads as an attribute that says so, never
as an error: the hook must keep working, and keep what it observed, whatever is there.

This module loads the related Pods and Jobs and puts everything together (:class:`Observed`);
the child groups load in :mod:`hooks.loaders.observed_children`, the parent's status in
:mod:`hooks.loaders.previous_status`, and the metadata checks and lenient readers they all
share are :mod:`hooks.loaders.observed_fields`'s. Their loaders are importable from here too.

Pure: plain mappings in, frozen values out; the observed objects are never modified.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hooks.domain.model import (
    CRONJOB_KEY,
    ENDPOINTSLICE_KEY,
    JOB_KEY,
    POD_KEY,
    ROLE_ALIASES,
    SERVICE_KEY,
    STATUS_ANNOTATION,
)
from hooks.domain.observed import (
    IP,
    Child,
    CronJobChild,
    Job,
    JobEnd,
    Pod,
    PreviousStatus,
    ServiceChild,
    SliceChild,
)
from hooks.loaders.jsonbody import JsonRefused, bounded_loads
from hooks.loaders.observed_children import load_child, load_children, typed
from hooks.loaders.observed_fields import (
    ObservedError,
    checked_metadata,
    integer,
    is_time,
    mapping,
    strings,
)
from hooks.loaders.previous_status import load_previous_status

#: Patroni's member JSON in the ``status`` annotation is small; more is not Patroni's.
_MAX_STATUS_ANNOTATION = 65536

__all__ = [
    "Observed", "ObservedError", "load_child", "load_children", "load_jobs", "load_observed",
    "load_pod", "load_pods", "load_previous_status", "typed",
]  # fmt: skip


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
    metadata = checked_metadata(group, key, obj)
    annotations = strings(metadata, "annotations")
    status = mapping(obj.get("status"))
    spec = mapping(obj.get("spec"))
    uid = metadata.get("uid")
    node = spec.get("nodeName")
    return Pod(
        name=key,
        ip=_pod_ip(status.get("podIP")),
        labels=strings(metadata, "labels"),
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
                number = integer(port.get("containerPort"))
                if number is not None:
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


# ------------------------------------------------------------------------- Jobs


def load_jobs(group: str, objects: Mapping[str, Mapping[str, Any]]) -> dict[str, Job]:
    """Every related backup Job, by name."""
    jobs = {}
    for key, obj in objects.items():
        metadata = checked_metadata(group, key, obj)
        jobs[key] = Job(key, strings(metadata, "labels"), _finished(obj))
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
