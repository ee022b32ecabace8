"""Keeping observed children: an object Metacontroller showed us, echoed so that nothing changes.

Metacontroller deletes every observed child a sync reply leaves out, so whenever the hook
does not (re)build a child itself it hands back :func:`preserved`: what was last applied
(Metacontroller's last-applied record, so its three-way merge is a no-op), with the
identity the object *is* (the ``children`` group's GVK, the parent's namespace) and never a
field the API server owns.

The observed child is a :class:`~hooks.domain.observed.Child`: its last-applied record was
parsed when the request was loaded, and its raw object (read-only) is what a record-less
echo copies.

Pure: typed values in, new dicts out; the observed object is never modified.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from hooks.domain.model import LAST_APPLIED_ANNOTATION
from hooks.domain.observed import Child, ServiceChild

#: Echoes an observed child unchanged: :func:`preserved` in the parent's namespace.
Keep = Callable[[Child], dict[str, Any]]

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


def preserved(observed: Child, *, namespace: str | None = None) -> dict[str, Any]:
    """An observed child, as a desired object that changes nothing when applied.

    The base is what we last asked for (Metacontroller records it in the
    last-applied annotation), so the three-way merge is a no-op. The Service's
    selector is taken from the observed object itself, so even a selector someone
    edited by hand is kept exactly as it is while we are in doubt.

    The GVK (apiVersion, kind) and ``namespace`` are what the object *is*: the
    ``children`` group it was observed in and the parent's namespace. They win over
    whatever the object or its last-applied record says, because Metacontroller
    matches a reply's children to the observed ones by exactly these (plus the name),
    and deletes every observed child that no reply child matches. Nor does a Service
    ever carry fields the API server allocates (``clusterIP`` ...), whichever record
    it was rebuilt from.

    The only reader of :attr:`~hooks.domain.observed.Child.raw`: a copy of it is the echo.
    """
    applied = observed.last_applied
    base = copy.deepcopy(dict(applied)) if applied is not None else minimal_copy(observed.raw)
    gvk = group_gvk(observed.group)
    if gvk is not None:
        base["apiVersion"], base["kind"] = gvk
    if namespace is not None:
        base["metadata"]["namespace"] = namespace
    if base.get("kind") == "Service":
        selector = observed.selector if isinstance(observed, ServiceChild) else None
        base_spec = base.get("spec")
        base_spec = _without_server_fields(base_spec if isinstance(base_spec, dict) else {})
        base["spec"] = base_spec
        if selector:
            base_spec["selector"] = dict(selector)
        else:
            base_spec.pop("selector", None)
    return base


def group_gvk(group: str) -> tuple[str, str] | None:
    """``(apiVersion, kind)`` of a ``children`` key: ``Service.v1``, ``Deployment.apps/v1``."""
    kind, dot, api_version = group.partition(".")
    return (api_version, kind) if dot and kind and api_version else None


def minimal_copy(observed: Mapping[str, Any]) -> dict[str, Any]:
    """Without a last-applied record: the observed object minus server-owned metadata.

    A Service's spec loses the fields the API server allocates in :func:`preserved`, the
    only caller, which does that for every Service whichever record it was rebuilt from.
    """
    result = {k: copy.deepcopy(v) for k, v in observed.items() if k != "status"}
    observed_metadata = observed.get("metadata")
    assert isinstance(observed_metadata, Mapping)  # the loader refuses any other
    metadata = {
        # ObjectMeta without the server's fields holds flat string maps: copy = deepcopy.
        k: copy.deepcopy(v)  # pragma: no mutate
        for k, v in observed_metadata.items()
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
