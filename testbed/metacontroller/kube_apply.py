"""Writing a sync reply to the real API server as Metacontroller v4.17 does (dynamic apply).

The I/O half of :mod:`testbed.metacontroller.kube`; the merge itself is the pure
:mod:`testbed.metacontroller.dynamic_apply`.
From ``pkg/controller/common/manage_children.go`` and ``pkg/controller/composite/controller.go``:

* **delete** every observed child the reply leaves out, first, each with a UID precondition
  and background propagation; one already being deleted is skipped; 404 is swallowed;
* **create** each new child with the last-applied annotation and the parent's controller
  reference (``controller``, ``blockOwnerDeletion``); 409 AlreadyExists is swallowed;
* **update** in place (``updateStrategy.method: InPlace``): a full PUT of the three-way merge
  with the observed resourceVersion, only when the merge differs from the observed object;
  never for a child being deleted; 404 and 409 are swallowed (a watch event brings the next
  sync). ``OnDelete`` (or none) never updates; ``Recreate`` deletes now (created next sync);
* every failed write is collected while the others go ahead, and the sync then fails;
* **status** through the status subresource, ``observedGeneration`` injected, after a live
  GET, and only when it differs from the live status; 404 and 409 are swallowed;
* the **finalizer** added or removed by GET, change, PUT (retried on a conflict).

Where it differs: the rolling strategies (``RollingInPlace``/``RollingRecreate``, with
ControllerRevisions) and server-side apply (``--apply-strategy=server-side-apply``) are not
modelled; the pg-failover-hook CompositeController uses neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.dynamic_apply import apply_update, for_create

GC_FINALIZERS = frozenset({"foregroundDeletion", "orphan"})


@dataclass(frozen=True)
class ChildType:
    """One ``childResources`` entry, with the kind discovery gave its resource."""

    key: str  # Metacontroller's map key, e.g. Service.v1
    api_version: str
    resource: str
    kind: str
    method: str = "OnDelete"


@dataclass
class Managed:
    """What :func:`manage_children` wrote (``Kind/name``) and the errors it collected."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _path(kind: ChildType, namespace: str, name: str | None = None) -> str:
    return resource_path(kind.api_version, kind.resource, namespace, name)


def manage_children(
    rest: KubeRest,
    types: Mapping[str, ChildType],
    parent: Mapping[str, Any],
    observed: Mapping[str, Mapping[str, dict[str, Any]]],
    desired: Mapping[str, Mapping[str, dict[str, Any]]],
) -> Managed:
    """``ManageChildren``: deletes first, then creates and updates."""
    done = Managed()
    for key, objects in observed.items():
        kind = types[key]
        for name, obj in objects.items():
            if obj["metadata"].get("deletionTimestamp") or name in desired.get(key, {}):
                continue
            _delete(rest, kind, obj, done)
    for key, objects in desired.items():
        if key not in types:
            continue  # undeclared: the caller creates those once, unobserved
        kind = types[key]
        for name, obj in objects.items():
            old = observed.get(key, {}).get(name)
            if old is None:
                create(rest, kind, obj, parent, done)
                continue
            new = apply_update(old, obj)
            if new == old or old["metadata"].get("deletionTimestamp"):
                continue
            if kind.method in ("InPlace", "RollingInPlace"):
                _update(rest, kind, new, done)
            elif kind.method in ("Recreate", "RollingRecreate"):
                _delete(rest, kind, old, done)
    return done


def create(
    rest: KubeRest, kind: ChildType, obj: dict[str, Any], parent: Mapping[str, Any], done: Managed
) -> None:
    ident = f"{kind.kind}/{obj['metadata'].get('name')}"
    try:
        rest.create(_path(kind, obj["metadata"]["namespace"]), for_create(obj, parent))
        done.created.append(ident)
    except KubeApiError as error:
        if error.status != 409:  # AlreadyExists is swallowed, silently
            done.errors.append(f"can't create {ident}: {error}")
    except requests.RequestException as error:
        done.errors.append(f"can't create {ident}: {error}")


def _update(rest: KubeRest, kind: ChildType, new: dict[str, Any], done: Managed) -> None:
    meta = new["metadata"]
    ident = f"{kind.kind}/{meta['name']}"
    try:
        rest.replace(_path(kind, meta["namespace"], meta["name"]), new)
        done.updated.append(ident)
    except KubeApiError as error:
        if error.status not in (404, 409):
            done.errors.append(f"can't update {ident}: {error}")
    except requests.RequestException as error:
        done.errors.append(f"can't update {ident}: {error}")


def _delete(rest: KubeRest, kind: ChildType, obj: Mapping[str, Any], done: Managed) -> None:
    meta = obj["metadata"]
    ident = f"{kind.kind}/{meta['name']}"
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Background",
        "preconditions": {"uid": meta["uid"]},
    }
    try:
        rest.delete(_path(kind, meta["namespace"], meta["name"]), body)
        done.deleted.append(ident)
    except KubeApiError as error:
        if error.status != 404:
            done.errors.append(f"can't delete {ident}: {error}")
    except requests.RequestException as error:
        done.errors.append(f"can't delete {ident}: {error}")


def write_status(
    rest: KubeRest, parent_path: str, status: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """``updateParentStatus``: the status written (``None``: unchanged, gone or conflict)."""
    try:
        live = rest.get(parent_path)
    except KubeApiError as error:
        if error.status == 404:
            return None
        raise
    wanted = dict(status or {})
    generation = live["metadata"].get("generation")
    if generation is not None:
        wanted["observedGeneration"] = generation
    if wanted == live.get("status"):
        return None
    live["status"] = wanted
    try:
        rest.replace(parent_path + "/status", live)
    except KubeApiError as error:
        if error.status in (404, 409):
            return None
        raise
    return wanted


def set_finalizer(
    rest: KubeRest, parent_path: str, name: str, present: bool, attempts: int = 5
) -> dict[str, Any] | None:
    """Add or remove ``name`` (GET, change, PUT, again on a conflict); the live parent after
    it (``None`` if the parent is gone, which removing the last finalizer can cause)."""
    for _ in range(attempts):
        try:
            live = rest.get(parent_path)
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise
        finalizers = list(live["metadata"].get("finalizers") or [])
        if (name in finalizers) == present:
            return live
        finalizers = [*finalizers, name] if present else [f for f in finalizers if f != name]
        live["metadata"]["finalizers"] = finalizers
        try:
            return rest.replace(parent_path, live)
        except KubeApiError as error:
            if error.status == 404:
                return None
            if error.status != 409:
                raise
    raise KubeApiError(409, "Conflict", f"finalizer {name}: {attempts} conflicts in a row")


def should_manage(parent: Mapping[str, Any], finalizer: str) -> bool:
    """``finalizer.ShouldFinalize`` and the deletion check around ``ManageChildren``: not
    being deleted, or being deleted while our finalizer holds it and no GC finalizer does."""
    meta = parent["metadata"]
    if not meta.get("deletionTimestamp"):
        return True
    finalizers = set(meta.get("finalizers") or [])
    return finalizer in finalizers and not finalizers & GC_FINALIZERS
