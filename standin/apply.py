"""What Metacontroller v4.17 does with a hook reply, as a pure, inspectable model.

A DEVELOPMENT STAND-IN, for tests and the local demo: production runs real
Metacontroller. It models the parts of the contract that can hurt a hook
(``../shared/notes/metacontroller-contract.md`` §0, §3, §4):

* only HTTP 200 with a JSON object counts; anything else changes nothing;
* ``responseUnMarshallMode: strict``: an unknown top-level key is an error;
* children: every observed child that the reply leaves out is deleted (before any
  create or update), new ones are created, existing ones are updated in place
  (``updateStrategy: InPlace``) with the three-way merge of dynamic apply;
* the ``controller-uid`` label is added, and every child must then match it;
* ``finalized: true`` removes the finalizer (and so lets the parent go);
* ``status`` replaces ``.status`` wholesale, with ``observedGeneration`` injected.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

LAST_APPLIED = "metacontroller.k8s.io/last-applied-configuration"
RESPONSE_KEYS = frozenset({"status", "children", "resyncAfterSeconds", "finalized"})
SERVER_SERVICE_DEFAULTS: Mapping[str, Any] = {
    "internalTrafficPolicy": "Cluster",
    "ipFamilies": ["IPv4"],
    "ipFamilyPolicy": "SingleStack",
    "sessionAffinity": "None",
}


class HookError(Exception):
    """The reply would make Metacontroller abort the sync: nothing is written."""


@dataclass
class World:
    """The objects one PostgreSQLCluster's sync sees: the parent, its Services, Pods."""

    parent: dict[str, Any]
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted_services: list[str] = field(default_factory=list)
    _next_ip: int = 10

    @property
    def uid(self) -> str:
        return str(self.parent["metadata"]["uid"])

    @property
    def namespace(self) -> str:
        return str(self.parent["metadata"]["namespace"])

    @property
    def finalizing(self) -> bool:
        return bool(self.parent["metadata"].get("deletionTimestamp"))

    def sync_request(self, controller: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The body Metacontroller would POST to the sync (or finalize) hook."""
        return {
            "controller": dict(controller or {}),
            "parent": copy.deepcopy(self.parent),
            "children": {"Service.v1": copy.deepcopy(self.services)},
            "related": {"Pod.v1": copy.deepcopy(self.pods)},
            "finalizing": self.finalizing,
        }

    def customize_request(self, controller: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {"controller": dict(controller or {}), "parent": copy.deepcopy(self.parent)}

    def selected_pods(self, service: str) -> list[str]:
        """Pods the named Service selects, as the endpoints controller would see it."""
        svc = self.services.get(service)
        if svc is None:
            return []
        selector = svc.get("spec", {}).get("selector") or {}
        if not selector:
            return []
        return sorted(
            name
            for name, pod in self.pods.items()
            if all(pod["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
        )


@dataclass(frozen=True)
class Applied:
    """What one reply did."""

    resync_after: float | None
    created: tuple[str, ...]
    updated: tuple[str, ...]
    deleted: tuple[str, ...]
    status_changed: bool
    finalized: bool


def check_reply(status_code: int, body: bytes) -> dict[str, Any]:
    """Metacontroller's acceptance of a reply (strict unmarshal mode)."""
    if status_code != 200:
        raise HookError(f"unsupported status code: {status_code}")
    try:
        reply = json.loads(body)
    except ValueError as error:
        raise HookError(f"can't unmarshal webhookResponse: {error}") from None
    if not isinstance(reply, dict):
        raise HookError("can't unmarshal webhookResponse: not an object")
    unknown = set(reply) - RESPONSE_KEYS
    if unknown:
        raise HookError(f"unknown field(s) in response: {sorted(unknown)}")
    children = reply.get("children")
    if children is not None and not isinstance(children, list):
        raise HookError("children must be a list")
    resync = reply.get("resyncAfterSeconds")
    if resync is not None and (isinstance(resync, bool) or not isinstance(resync, int | float)):
        raise HookError("resyncAfterSeconds must be a number")
    return reply


def apply_reply(world: World, reply: Mapping[str, Any]) -> Applied:
    """Apply an accepted reply to ``world`` the way Metacontroller does."""
    desired: dict[str, dict[str, Any]] = {}
    for child in reply.get("children") or []:
        if not isinstance(child, dict):
            raise HookError("a child is not an object")
        child = copy.deepcopy(child)
        metadata = child.setdefault("metadata", {})
        metadata.setdefault("namespace", world.namespace)  # applyNamespaceDefaults
        labels = metadata.setdefault("labels", {})
        labels.setdefault("controller-uid", world.uid)  # generateSelector
        if labels.get("controller-uid") != world.uid:
            raise HookError("labels on desired child don't match parent selector")
        if metadata["namespace"] != world.namespace:
            # A child elsewhere is another object: the observed one counts as left out.
            continue
        if child.get("apiVersion") == "v1" and child.get("kind") == "Service":
            desired[str(metadata.get("name"))] = child

    finalized = bool(reply.get("finalized"))
    if finalized:
        finalizers = world.parent["metadata"].get("finalizers", [])
        world.parent["metadata"]["finalizers"] = [
            f for f in finalizers if not f.startswith("metacontroller.io/")
        ]

    created: list[str] = []
    updated: list[str] = []
    deleted: list[str] = []
    manage = not world.finalizing or any(
        f.startswith("metacontroller.io/") for f in world.parent["metadata"].get("finalizers", [])
    )
    if manage:
        for name in sorted(set(world.services) - set(desired)):
            del world.services[name]
            world.deleted_services.append(name)
            deleted.append(name)
        for name, child in desired.items():
            if name in world.services:
                merged = _three_way_merge(world.services[name], child)
                if merged != world.services[name]:
                    world.services[name] = merged
                    updated.append(name)
            else:
                world.services[name] = _create(world, child)
                created.append(name)

    status_changed = False
    if "status" in reply or not finalized:
        status = copy.deepcopy(reply.get("status") or {})
        generation = world.parent["metadata"].get("generation")
        if generation is not None:
            status["observedGeneration"] = generation
        status_changed = status != world.parent.get("status")
        world.parent["status"] = status

    resync = reply.get("resyncAfterSeconds")
    return Applied(
        resync_after=float(resync) if resync and resync > 0 else None,
        created=tuple(created),
        updated=tuple(updated),
        deleted=tuple(deleted),
        status_changed=status_changed,
        finalized=finalized,
    )


def _create(world: World, child: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(child)
    obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(
        child, separators=(",", ":"), sort_keys=True
    )
    obj["metadata"]["uid"] = f"svc-{world._next_ip}"
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": world.parent.get("apiVersion", "adg.io/v1alpha1"),
            "kind": world.parent.get("kind", "PostgreSQLCluster"),
            "name": world.parent["metadata"]["name"],
            "uid": world.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = obj.setdefault("spec", {})
    ip = f"10.96.0.{world._next_ip}"
    world._next_ip += 1
    spec.setdefault("clusterIP", ip)
    spec.setdefault("clusterIPs", [ip])
    for key, value in SERVER_SERVICE_DEFAULTS.items():
        spec.setdefault(key, copy.deepcopy(value))
    obj["status"] = {"loadBalancer": {}}
    return obj


def _three_way_merge(observed: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Dynamic apply: set what we send, delete what we sent last time and no longer
    send, keep what others added. Lists of maps are replaced whole (a simplification
    of Metacontroller's keyed list merge that is exact for our selector and ports)."""
    annotations = observed.get("metadata", {}).get("annotations", {})
    try:
        last = json.loads(annotations.get(LAST_APPLIED, "{}"))
    except ValueError:
        last = {}
    merged: dict[str, Any] = _merge(copy.deepcopy(observed), last, desired)
    merged["metadata"]["annotations"] = {
        **merged["metadata"].get("annotations", {}),
        LAST_APPLIED: json.dumps(desired, separators=(",", ":"), sort_keys=True),
    }
    # status and system metadata always revert to the observed values
    merged["status"] = copy.deepcopy(observed.get("status", {}))
    for key in ("uid", "ownerReferences", "resourceVersion", "creationTimestamp"):
        if key in observed.get("metadata", {}):
            merged["metadata"][key] = copy.deepcopy(observed["metadata"][key])
    return merged


def _merge(observed: Any, last: Any, desired: Any) -> Any:
    if isinstance(desired, dict) and isinstance(observed, dict):
        last_map = last if isinstance(last, dict) else {}
        result = dict(observed)
        for key in last_map:
            if key not in desired:
                result.pop(key, None)
        for key, value in desired.items():
            result[key] = _merge(observed.get(key), last_map.get(key), value)
        return result
    return copy.deepcopy(desired)
