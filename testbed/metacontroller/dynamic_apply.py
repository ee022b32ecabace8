"""Metacontroller v4.17's dynamic apply, exactly, as pure functions on plain JSON objects.

The default ``--apply-strategy=dynamic-apply`` (``pkg/dynamic/apply/apply.go`` ``Merge`` and
``pkg/controller/common/manage_children.go`` ``ApplyUpdate``) is a client-side three-way merge
in the style of ``kubectl apply``: what the hook sends is set, what it sent last time (the
``metacontroller.k8s.io/last-applied-configuration`` annotation) and no longer sends is
removed, and whatever other actors added is kept. Lists whose items are all objects sharing a
conventional key (``containerPort``, ``port``, ``mountPath``, ``name``, ``uid``, ``ip``,
``path``, first one wins) are merged as maps keyed by it, keeping the observed order; every
other list is replaced. ``status`` and the system fields of ``metadata`` are reverted to the
observed ones, so they never cause a write.

:mod:`testbed.metacontroller.apply` keeps its simpler model (lists replaced whole) for the in-memory
world;
the stand-in against the real API server (:mod:`testbed.metacontroller.kube`) uses this one, since
there
the server's defaults inside lists (a Service port's ``protocol``) would otherwise differ
from the merge on every sync and cost a PUT each time.

Where it differs from Go: the annotation is Python's compact, key-sorted JSON, which equals
Go's ``json.Marshal`` except that Go escapes ``<``, ``>`` and ``&`` as ``\\u003c`` etc.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from testbed.metacontroller.apply import LAST_APPLIED

KNOWN_MERGE_KEYS = ("containerPort", "port", "mountPath", "name", "uid", "ip", "path")
#: ObjectMeta's read-only, system-populated fields (``objectMetaSystemFields``).
SYSTEM_METADATA = (
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


class MergeError(ValueError):
    """The desired object's shape does not fit the observed one (Go's ``can't merge``)."""


def last_applied_json(obj: Mapping[str, Any]) -> str:
    """The annotation's value: compact JSON with sorted keys, as ``json.Marshal`` writes."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def last_applied(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The observed object's last-applied configuration (``None`` without one)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise MergeError(f"can't unmarshal {LAST_APPLIED!r} annotation: {error}") from None
    return value if isinstance(value, dict) else None


def merge(observed: Mapping[str, Any], last: Any, desired: Mapping[str, Any]) -> dict[str, Any]:
    """``apply.Merge``: a merged copy of ``observed``."""
    destination = copy.deepcopy(dict(observed))
    _merge("", destination, last, copy.deepcopy(dict(desired)))
    return destination


def _merge(path: str, destination: Any, last: Any, desired: Any) -> Any:
    if isinstance(destination, dict):
        if last is not None and not isinstance(last, dict):
            raise MergeError(f"lastApplied{path}: expecting an object")
        if desired is not None and not isinstance(desired, dict):
            raise MergeError(f"desired{path}: expecting an object")
        return _merge_object(path, destination, last or {}, desired or {})
    if isinstance(destination, list):
        if last is not None and not isinstance(last, list):
            raise MergeError(f"lastApplied{path}: expecting a list")
        if desired is not None and not isinstance(desired, list):
            raise MergeError(f"desired{path}: expecting a list")
        return _merge_array(path, destination, last or [], desired or [])
    return desired


def _merge_object(
    path: str, destination: dict[str, Any], last: dict[str, Any], desired: dict[str, Any]
) -> dict[str, Any]:
    for key in last:
        if key not in desired:
            destination.pop(key, None)
    for key, value in desired.items():
        destination[key] = _merge(f"{path}[{key}]", destination.get(key), last.get(key), value)
    return destination


def _merge_array(path: str, destination: list[Any], last: list[Any], desired: list[Any]) -> Any:
    key = detect_list_map_key(destination, last, desired)
    if not key:
        return desired
    dest_map = {_key(item[key]): item for item in destination}
    _merge_object(
        path,
        dest_map,
        {_key(item[key]): item for item in last},
        {_key(item[key]): item for item in desired},
    )
    result: list[Any] = []
    added: set[str] = set()
    for item in destination:
        name = _key(item[key])
        if name in dest_map:
            result.append(dest_map[name])
            added.add(name)
    for item in desired:
        name = _key(item[key])
        if name not in added:
            result.append(dest_map[name])
            added.add(name)
    return result


def _key(value: Any) -> str:
    """``stringMergeKey``: Go's ``%v`` of a non-string key (ints as digits)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def detect_list_map_key(*lists: list[Any]) -> str:
    """The first conventional key every item of every list has, or ``""``."""
    common: set[str] | None = None
    for items in lists:
        for item in items:
            if not isinstance(item, dict):
                return ""
            common = set(item) if common is None else common & set(item)
    for key in KNOWN_MERGE_KEYS:
        if common and key in common:
            return key
    return ""


def apply_update(observed: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """``ApplyUpdate``: the full object to PUT for ``desired`` over ``observed``."""
    desired = copy.deepcopy(dict(desired))
    annotations = (desired.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(LAST_APPLIED, None)  # nullifyLastAppliedAnnotation
    merged = merge(observed, last_applied(observed), desired)
    metadata = merged.setdefault("metadata", {})
    observed_meta = observed.get("metadata") or {}
    for name in SYSTEM_METADATA:
        if name in observed_meta:
            metadata[name] = copy.deepcopy(observed_meta[name])
        else:
            metadata.pop(name, None)
    if "status" in observed:
        merged["status"] = copy.deepcopy(observed["status"])
    else:
        merged.pop("status", None)
    metadata.setdefault("annotations", {})[LAST_APPLIED] = last_applied_json(desired)
    return merged


def for_create(desired: Mapping[str, Any], parent: Mapping[str, Any]) -> dict[str, Any]:
    """The object Metacontroller POSTs: the last-applied annotation of the object itself
    (taken before anything else is added), then its controller reference appended."""
    obj = copy.deepcopy(dict(desired))
    snapshot = last_applied_json(obj)
    metadata = obj.setdefault("metadata", {})
    metadata.setdefault("annotations", {})[LAST_APPLIED] = snapshot
    metadata["ownerReferences"] = [*(metadata.get("ownerReferences") or []), controller_ref(parent)]
    return obj


def controller_ref(parent: Mapping[str, Any]) -> dict[str, Any]:
    """``MakeControllerRef``."""
    meta = parent["metadata"]
    return {
        "apiVersion": parent["apiVersion"],
        "kind": parent["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def group_key(api_version: str, kind: str) -> str:
    """Metacontroller's map key: ``Service.v1``, ``EndpointSlice.discovery.k8s.io/v1``."""
    return f"{kind}.{api_version}"
