"""What Metacontroller v4.17 does with a hook reply, as a pure, inspectable model.

A DEVELOPMENT STAND-IN, for tests and the local demo: production runs real
Metacontroller. It models the parts of the contract that can hurt a hook, as
Metacontroller v4.17.2 implements them (github.com/metacontroller/metacontroller at tag
``v4.17.2``; paths relative to that repository; the recorded requests this model is
tested with are described in ``tests/fixtures/metacontroller/README.md``):

* only HTTP 200 with a JSON object counts; anything else changes nothing
  (``pkg/hooks/webhook_plain.go`` ``isStatusSupported``, ``pkg/hooks/webhook.go``);
* ``responseUnMarshallMode: strict``: an unknown top-level key is an error
  (``pkg/hooks/webhook.go`` ``responseUnmarshallMode``);
* children: every observed child that the reply leaves out is deleted (before any
  create or update), new ones are created, existing ones are updated in place
  (``updateStrategy: InPlace``) with the three-way merge of dynamic apply
  (``pkg/controller/common/manage_children.go`` ``ManageChildren``/``deleteChildren``,
  ``pkg/dynamic/apply/apply.go`` ``Merge``);
* the ``controller-uid`` label is added, and every child must then match it
  (``pkg/controller/composite/controller.go`` ``syncParentObject``);
* ``finalized: true`` removes the finalizer (and so lets the parent go) (same function);
* ``status`` replaces ``.status`` wholesale, with ``observedGeneration`` injected
  (``pkg/controller/composite/controller.go`` ``updateParentStatus``);
* child types: Services, EndpointSlices and CronJobs (``World.declared`` says which the
  CompositeController declares; a reply's object of an undeclared type is created once and
  never observed, updated or deleted: metacontroller#238);
* the API server's own rewriting of what it stores, where it matters to a hook that must
  echo objects exactly: an EndpointSlice without endpoints comes back with
  ``endpoints: null`` (kubernetes/kubernetes#135968), a resource quantity comes back in
  canonical form (``0.5`` → ``500m``, ``1024Mi`` → ``1Gi``). ``Applied.writes`` counts the
  PUTs Metacontroller would send (its three-way merge differs from what it observed) even
  when the server then stores nothing new, so a test can prove a steady state costs none.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

LAST_APPLIED = "metacontroller.k8s.io/last-applied-configuration"
SERVICE_KEY = "Service.v1"
ENDPOINTSLICE_KEY = "EndpointSlice.discovery.k8s.io/v1"
CRONJOB_KEY = "CronJob.batch/v1"
JOB_KEY = "Job.batch/v1"
#: Metacontroller's child map key → (apiVersion, kind) of each child type we model.
CHILD_TYPES: Mapping[str, tuple[str, str]] = {
    SERVICE_KEY: ("v1", "Service"),
    ENDPOINTSLICE_KEY: ("discovery.k8s.io/v1", "EndpointSlice"),
    CRONJOB_KEY: ("batch/v1", "CronJob"),
}
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
    """The objects one PostgreSQLCluster's sync sees: the parent, its children, Pods, Jobs."""

    parent: dict[str, Any]
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted_services: list[str] = field(default_factory=list)
    endpointslices: dict[str, dict[str, Any]] = field(default_factory=dict)
    cronjobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Related backup Jobs; ``None`` while the customize hook relates none.
    jobs: dict[str, dict[str, Any]] | None = None
    #: The child types the CompositeController declares (Metacontroller sends a group,
    #: possibly empty, for each of them, and manages only those).
    declared: tuple[str, ...] = (SERVICE_KEY, ENDPOINTSLICE_KEY, CRONJOB_KEY)
    #: ``Kind/name`` of every child deleted, in order.
    deleted_children: list[str] = field(default_factory=list)
    #: Objects of undeclared types that a reply made Metacontroller create.
    untracked: dict[str, dict[str, Any]] = field(default_factory=dict)
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

    def group(self, key: str) -> dict[str, dict[str, Any]]:
        """The observed children of one type, by name."""
        groups = {
            SERVICE_KEY: self.services,
            ENDPOINTSLICE_KEY: self.endpointslices,
            CRONJOB_KEY: self.cronjobs,
        }
        return groups[key]

    def sync_request(self, controller: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The body Metacontroller would POST to the sync (or finalize) hook."""
        related: dict[str, Any] = {"Pod.v1": copy.deepcopy(self.pods)}
        if self.jobs is not None:
            related[JOB_KEY] = copy.deepcopy(self.jobs)
        return {
            "controller": dict(controller or {}),
            "parent": copy.deepcopy(self.parent),
            "children": {key: copy.deepcopy(self.group(key)) for key in sorted(self.declared)},
            "related": related,
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

    def endpoint_pods(self, service: str) -> list[str]:
        """Pods a selector-less Service routes to, as kube-proxy reads its EndpointSlices:
        every ready endpoint of every slice labelled ``kubernetes.io/service-name``."""
        found: set[str] = set()
        for slice_ in self.endpointslices.values():
            labels = slice_.get("metadata", {}).get("labels", {})
            if labels.get("kubernetes.io/service-name") != service:
                continue
            for endpoint in slice_.get("endpoints") or []:
                if endpoint.get("conditions", {}).get("ready") is not False:
                    found.add(str(endpoint.get("targetRef", {}).get("name")))
        return sorted(found)


@dataclass(frozen=True)
class Applied:
    """What one reply did (``created``/``updated``/``deleted``: Service names; the
    ``*_objects`` fields: ``Kind/name`` of every child type)."""

    resync_after: float | None
    created: tuple[str, ...]
    updated: tuple[str, ...]
    deleted: tuple[str, ...]
    status_changed: bool
    finalized: bool
    created_objects: tuple[str, ...] = ()
    updated_objects: tuple[str, ...] = ()
    deleted_objects: tuple[str, ...] = ()
    #: PUTs Metacontroller sends (merge differs from observed), changed or not.
    writes: tuple[str, ...] = ()

    @property
    def changed_children(self) -> bool:
        """Whether any child was created, changed or deleted (each is a watch event)."""
        return bool(self.created_objects or self.updated_objects or self.deleted_objects)


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
    by_type = {(api, kind): key for key, (api, kind) in CHILD_TYPES.items()}
    desired: dict[str, dict[str, dict[str, Any]]] = {key: {} for key in world.declared}
    undeclared: list[dict[str, Any]] = []
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
        key = by_type.get((str(child.get("apiVersion")), str(child.get("kind"))))
        if key in desired:
            desired[key][str(metadata.get("name"))] = child
        else:
            undeclared.append(child)

    finalized = bool(reply.get("finalized"))
    if finalized:
        finalizers = world.parent["metadata"].get("finalizers", [])
        world.parent["metadata"]["finalizers"] = [
            f for f in finalizers if not f.startswith("metacontroller.io/")
        ]

    created: list[str] = []
    updated: list[str] = []
    deleted: list[str] = []
    writes: list[str] = []
    manage = not world.finalizing or any(
        f.startswith("metacontroller.io/") for f in world.parent["metadata"].get("finalizers", [])
    )
    if manage:
        for key, wanted in desired.items():
            observed = world.group(key)
            kind = CHILD_TYPES[key][1]
            for name in sorted(set(observed) - set(wanted)):
                del observed[name]
                if key == SERVICE_KEY:
                    world.deleted_services.append(name)
                world.deleted_children.append(f"{kind}/{name}")
                deleted.append(f"{kind}/{name}")
        for key, wanted in desired.items():
            observed = world.group(key)
            kind = CHILD_TYPES[key][1]
            for name, child in wanted.items():
                if name in observed:
                    merged = _three_way_merge(observed[name], child)
                    if merged != observed[name]:
                        writes.append(f"{kind}/{name}")
                        stored = _stored(merged)
                        if stored != observed[name]:
                            observed[name] = stored
                            updated.append(f"{kind}/{name}")
                else:
                    observed[name] = _stored(_create(world, child))
                    created.append(f"{kind}/{name}")
        for child in undeclared:
            ident = f"{child.get('kind')}/{child['metadata'].get('name')}"
            if ident not in world.untracked:  # a second create gets 409, swallowed
                world.untracked[ident] = _stored(_create(world, child))

    status_changed = False
    if "status" in reply or not finalized:
        status = copy.deepcopy(reply.get("status") or {})
        generation = world.parent["metadata"].get("generation")
        if generation is not None:
            status["observedGeneration"] = generation
        status_changed = status != world.parent.get("status")
        world.parent["status"] = status

    def services(names: list[str]) -> tuple[str, ...]:
        return tuple(n.split("/", 1)[1] for n in names if n.startswith("Service/"))

    resync = reply.get("resyncAfterSeconds")
    return Applied(
        resync_after=float(resync) if resync and resync > 0 else None,
        created=services(created),
        updated=services(updated),
        deleted=services(deleted),
        status_changed=status_changed,
        finalized=finalized,
        created_objects=tuple(created),
        updated_objects=tuple(updated),
        deleted_objects=tuple(deleted),
        writes=tuple(writes),
    )


def _create(world: World, child: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(child)
    obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(
        child, separators=(",", ":"), sort_keys=True
    )
    obj["metadata"]["uid"] = f"{str(child.get('kind')).lower()}-{world._next_ip}"
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
    if child.get("kind") == "Service":
        spec = obj.setdefault("spec", {})
        ip = f"10.96.0.{world._next_ip}"
        spec.setdefault("clusterIP", ip)
        spec.setdefault("clusterIPs", [ip])
        for key, value in SERVER_SERVICE_DEFAULTS.items():
            spec.setdefault(key, copy.deepcopy(value))
        obj["status"] = {"loadBalancer": {}}
    elif child.get("kind") == "CronJob":
        pod = obj.get("spec", {}).get("jobTemplate", {}).get("spec", {}).get("template", {})
        pod_spec = pod.setdefault("spec", {})
        for key, value in SERVER_POD_DEFAULTS.items():
            pod_spec.setdefault(key, value)
        for container in pod_spec.get("containers", []):
            container.setdefault("imagePullPolicy", "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
        obj["status"] = {}
    world._next_ip += 1
    return obj


SERVER_POD_DEFAULTS: Mapping[str, Any] = {
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "terminationGracePeriodSeconds": 30,
}


def _stored(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores and returns for ``obj`` (the rewrites a hook sees)."""
    obj = copy.deepcopy(obj)
    if obj.get("kind") == "EndpointSlice" and obj.get("endpoints") == []:
        obj["endpoints"] = None
    if obj.get("kind") == "CronJob":
        pod = obj.get("spec", {}).get("jobTemplate", {}).get("spec", {}).get("template", {})
        for container in pod.get("spec", {}).get("containers", []):
            for group in (container.get("resources") or {}).values():
                for name, value in list(group.items()):
                    group[name] = canonical_quantity(value)
    return obj


_BINARY = (("Ei", 6), ("Pi", 5), ("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1))
_DECIMAL: tuple[tuple[str, int], ...] = (
    ("E", 18),
    ("P", 15),
    ("T", 12),
    ("G", 9),
    ("M", 6),
    ("k", 3),
    ("", 0),
    ("m", -3),
    ("u", -6),
    ("n", -9),
)


def canonical_quantity(value: object) -> str:
    """A resource quantity as the API server writes it back (the common cases).

    Binary suffixes stay binary when the value is a whole multiple of 1024 (``1024Mi`` →
    ``1Gi``); everything else gets the largest decimal suffix that keeps a whole number
    (``0.5`` → ``500m``, ``1000m`` → ``1``, ``2000`` → ``2k``). Exponent notation and
    rounding below ``1n`` are not modelled.
    """
    text = str(value)
    match = re.fullmatch(r"([0-9]*\.?[0-9]*)([KMGTPE]i|[numkMGTPE]?)", text)
    if match is None or match.group(1) in ("", "."):
        return text
    number, suffix = Fraction(match.group(1)), match.group(2)
    binary = dict(_BINARY)
    decimal = dict(_DECIMAL)
    amount = number * (Fraction(1024) ** binary[suffix] if suffix in binary else 1)
    if suffix not in binary:
        amount = number * Fraction(10) ** decimal[suffix]
    if suffix in binary and amount >= 1024 and amount.denominator == 1:
        for name, power in _BINARY:
            if amount % (1024**power) == 0:
                return f"{amount // 1024**power}{name}"
    for name, power in _DECIMAL:
        scaled = amount / Fraction(10) ** power
        if scaled.denominator == 1:
            return f"{scaled.numerator}{name}"
    return text


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
