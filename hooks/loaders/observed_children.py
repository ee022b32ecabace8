"""The observed children of a sync request, loaded: Services, EndpointSlices, CronJobs, any other.

Each child group of the request loads through here into :mod:`hooks.domain.observed` values
(:class:`ServiceChild`, :class:`SliceChild`, :class:`CronJobChild`, else :class:`Child`),
with what the hook last asked for (Metacontroller's last-applied record) when it is usable:
an unusable record, a hand-edited selector or odd owner references load as attributes that
say so, never as an error. Junk ``metadata`` is refused (:mod:`hooks.loaders.observed_fields`).

Pure: plain mappings in, frozen values out; the observed objects are never modified.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from hooks.domain.model import CRONJOB_KEY, ENDPOINTSLICE_KEY, LAST_APPLIED_ANNOTATION, SERVICE_KEY
from hooks.domain.observed import EMPTY, Child, CronJobChild, OwnerRef, ServiceChild, SliceChild
from hooks.loaders.jsonbody import JsonRefused, bounded_loads
from hooks.loaders.observed_fields import checked_metadata, mapping, strings

T = TypeVar("T", bound=Child)
#: Kubernetes' limit on all of an object's annotations together
#: (``TotalAnnotationSizeLimitB``): no last-applied record can be larger.
_MAX_LAST_APPLIED = 256 * 1024


def load_children(group: str, objects: Mapping[str, Mapping[str, Any]]) -> dict[str, Child]:
    """Every observed child of one group, by name, as the value its group loads into."""
    return {key: load_child(group, key, obj) for key, obj in objects.items()}


def load_child(group: str, key: str, obj: Mapping[str, Any]) -> Child:
    """One observed child: a Service, an EndpointSlice, a CronJob or any other."""
    metadata = checked_metadata(group, key, obj)
    raw = MappingProxyType(obj)
    labels = strings(metadata, "labels")
    applied = _last_applied(obj, metadata)
    if group == SERVICE_KEY:
        spec = mapping(obj.get("spec"))
        selector = spec.get("selector")
        applied_labels = mapping(applied.get("metadata")).get("labels") if applied else None
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
    raw = mapping(metadata.get("annotations")).get(LAST_APPLIED_ANNOTATION)
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
            resources = mapping(container.get("resources"))
            found.setdefault(
                container["name"],
                MappingProxyType(
                    {
                        group: MappingProxyType(
                            {
                                k: v
                                for k, v in mapping(resources.get(group)).items()
                                if isinstance(v, str)
                            }
                        )
                        for group in ("requests", "limits")
                    }
                ),
            )
    return found
