"""Keeping observed children: an object Metacontroller showed us, echoed so that nothing changes.

Metacontroller deletes every observed child a sync reply leaves out, so whenever the hook
does not (re)build a child itself it hands back :func:`preserved`: what was last applied
(Metacontroller's last-applied record, so its three-way merge is a no-op), with the
identity the object *is* (the ``children`` group's GVK, the parent's namespace) and never a
field the API server owns.

Also the one place for the small readers every part uses on free-form objects
(:func:`metadata_of`, :func:`labels_of`).

Pure: plain mappings in, new dicts out; the observed object is never modified.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from hooks.domain.model import LAST_APPLIED_ANNOTATION, SyncRequest

#: The GVK of the ``Service.v1`` group.
SERVICE_GVK = ("v1", "Service")
#: Echoes an observed child unchanged (see :func:`keeper`).
Keep = Callable[[Mapping[str, Any]], dict[str, Any]]

#: Metadata the API server owns; echoing it back would be wrong or rejected.
_SERVER_METADATA = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "ownerReferences",
        "selfLink",
        "finalizers",
    }
)
#: Service spec fields the API server allocates or defaults.
_SERVER_SERVICE_SPEC = frozenset(
    {
        "clusterIP",
        "clusterIPs",
        "ipFamilies",
        "ipFamilyPolicy",
        "internalTrafficPolicy",
        "sessionAffinity",
        "healthCheckNodePort",
    }
)


def metadata_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``metadata`` of a free-form object, ``{}`` when it is not a mapping."""
    metadata = (obj or {}).get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def labels_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``metadata.labels`` of a free-form object, ``{}`` when it is not a mapping."""
    labels = metadata_of(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def annotations_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``metadata.annotations`` of a free-form object, ``{}`` when it is not a mapping."""
    annotations = metadata_of(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def preserved(
    observed: Mapping[str, Any],
    *,
    gvk: tuple[str, str] | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """An observed child, as a desired object that changes nothing when applied.

    The base is what we last asked for (Metacontroller records it in the
    last-applied annotation), so the three-way merge is a no-op. The Service's
    selector is taken from the observed object itself, so even a selector someone
    edited by hand is kept exactly as it is while we are in doubt.

    ``gvk`` (apiVersion, kind) and ``namespace`` are what the object *is*: the
    ``children`` group it was observed in and the parent's namespace. They win over
    whatever the object or its last-applied record says, because Metacontroller
    matches a reply's children to the observed ones by exactly these (plus the name),
    and deletes every observed child that no reply child matches. Nor does a Service
    ever carry fields the API server allocates (``clusterIP`` ...), whichever record
    it was rebuilt from.
    """
    base = last_applied(observed)
    if base is None:
        base = minimal_copy(observed)
    if gvk is not None:
        base["apiVersion"], base["kind"] = gvk
    if namespace is not None:
        base["metadata"]["namespace"] = namespace
    if base.get("kind") == "Service":
        spec = observed.get("spec") if isinstance(observed.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        selector = spec.get("selector")
        base_spec = base.get("spec")
        base_spec = _without_server_fields(base_spec if isinstance(base_spec, dict) else {})
        base["spec"] = base_spec
        if isinstance(selector, Mapping) and selector:
            base_spec["selector"] = dict(selector)
        else:
            base_spec.pop("selector", None)
    return base


def group_gvk(group: str) -> tuple[str, str] | None:
    """``(apiVersion, kind)`` of a ``children`` key: ``Service.v1``, ``Deployment.apps/v1``."""
    kind, dot, api_version = group.partition(".")
    return (api_version, kind) if dot and kind and api_version else None


def keeper(request: SyncRequest) -> Keep:
    """:func:`preserved` for this request's observed children, each as what it *is*.

    An observed object is recognised by identity (the parts get the request's own
    objects and hand them back through this function): its GVK is its ``children``
    group's, its namespace the parent's.
    """
    gvks: dict[int, tuple[str, str] | None] = {
        id(obj): SERVICE_GVK for obj in request.services.values()
    }
    for key, group in request.other_children.items():
        gvk = group_gvk(key)
        for obj in group.values():
            gvks[id(obj)] = gvk

    def keep(observed: Mapping[str, Any]) -> dict[str, Any]:
        return preserved(observed, gvk=gvks.get(id(observed)), namespace=request.namespace)

    return keep


def last_applied(observed: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the hook last asked for (Metacontroller's record), if it is usable.

    Usable: JSON, an object with a ``metadata`` object (and a ``spec`` object, if any),
    for this very object (same ``apiVersion``, ``kind`` and name).
    """
    raw = annotations_of(observed).get(LAST_APPLIED_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        applied = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(applied, dict) or not isinstance(applied.get("metadata"), dict):
        return None
    if not isinstance(applied.get("spec", {}), dict):
        return None
    same_kind = all(applied.get(key) == observed.get(key) for key in ("apiVersion", "kind"))
    same_name = applied["metadata"].get("name") == metadata_of(observed).get("name")
    return applied if same_kind and same_name else None


def minimal_copy(observed: Mapping[str, Any]) -> dict[str, Any]:
    """Without a last-applied record: the observed object minus server-owned metadata.

    A Service's spec loses the fields the API server allocates in :func:`preserved`, the
    only caller, which does that for every Service whichever record it was rebuilt from.
    """
    result = {k: copy.deepcopy(v) for k, v in observed.items() if k != "status"}
    metadata = {
        # ObjectMeta without the server's fields holds flat string maps: copy = deepcopy.
        k: copy.deepcopy(v)  # pragma: no mutate
        for k, v in metadata_of(observed).items()
        if k not in _SERVER_METADATA
    }
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(LAST_APPLIED_ANNOTATION, None)
        annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
        if not annotations:
            metadata.pop("annotations")
    result["metadata"] = metadata
    return result


def _without_server_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A Service spec without what the API server allocates or defaults."""
    result = {k: v for k, v in spec.items() if k not in _SERVER_SERVICE_SPEC}
    ports = result.get("ports")
    if isinstance(ports, list):
        result["ports"] = [
            {k: v for k, v in port.items() if k != "nodePort"}
            for port in ports
            if isinstance(port, dict)
        ]
    return result
