"""``kubectl pgfh adopt``: hand an existing Service over to its PostgreSQLCluster (pure).

Metacontroller v4.17.2 adopts an object of a child type that has **no controller** and
whose labels match the parent's selector (``pkg/third_party/kubernetes/
controller_ref_manager.go`` ``ClaimObject``, over ``ListOrphans`` in
``pkg/controller/composite/controller.go`` ``claimChildren``). With ``generateSelector:
true`` that selector is ``controller-uid=<parent UID>``. So the hand-over is one merge
patch of the Service, guarded by its ``resourceVersion`` (nothing changes if someone else
changed it first):

* the label ``controller-uid=<parent UID>``: the Service update event enqueues the parent
  (``onChildUpdate`` → ``findPotentialParents``), whose claim adopts it (GET+PUT of the
  controller reference), and the same sync's reply pins the selector;
* Metacontroller's last-applied record, holding the Service's **current selector**: its
  three-way merge deletes only keys that were last applied and are no longer asked for
  (``pkg/dynamic/apply/apply.go`` ``mergeObject``), so without the record a key of the
  previous owner's selector (``role: master``) would stay beside the hook's and could
  select nothing after a failover. Every other field (ports, labels, annotations) is
  merged as it is, never removed;
* with ``--force`` only: the removal of another controller's reference. Never silently:
  two controllers would fight over the selector.

The selector itself is not touched: traffic moves only when the hook, on the next sync,
pins the leader that Patroni confirms. What is refused, and why, is said in one sentence.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hooks.domain.model import CONTROLLER_UID_LABEL, LAST_APPLIED_ANNOTATION, POD_NAME_LABEL


@dataclass(frozen=True)
class Adoption:
    """What ``adopt`` does: a patch, nothing (already done), or a refusal."""

    #: The merge patch to send; ``None``: nothing is sent.
    patch: dict[str, Any] | None
    #: One sentence for the user.
    message: str
    #: The plan refuses (exit 1); ``False`` with no patch: nothing to do (exit 0).
    refused: bool = False
    #: Things the user should know that do not stop the hand-over.
    notes: tuple[str, ...] = field(default_factory=tuple)


def _owner_text(ref: Mapping[str, Any]) -> str:
    return f"{ref.get('kind')} {ref.get('name')} ({ref.get('apiVersion')})"


def _controller(service: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (service.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def plan(cluster: Mapping[str, Any], service: Mapping[str, Any] | None, *, force: bool) -> Adoption:
    """The hand-over of ``spec.serviceRef``'s Service to ``cluster`` (see the module doc)."""
    meta = cluster.get("metadata") or {}
    spec = cluster.get("spec") or {}
    ident = f"{meta.get('namespace')}/{meta.get('name')}"
    uid = meta.get("uid")
    name = (spec.get("serviceRef") or {}).get("name")
    if not isinstance(uid, str) or not uid or not isinstance(name, str) or not name:
        return Adoption(None, f"PostgreSQLCluster {ident} has no UID or no spec.serviceRef.name")
    if service is None:
        return Adoption(
            None, f"no Service {name} in namespace {meta.get('namespace')}: the hook creates it"
        )
    smeta = service.get("metadata") or {}
    sspec = service.get("spec") or {}
    controller = _controller(service)
    if controller is not None and controller.get("uid") == uid:
        return Adoption(None, f"Service {name} is already a child of PostgreSQLCluster {ident}")
    if smeta.get("deletionTimestamp"):
        return Adoption(
            None, f"Service {name} is being deleted; the hook creates it anew once gone", True
        )
    wanted_type = (spec.get("service") or {}).get("type") or "ClusterIP"
    have_type = sspec.get("type") or "ClusterIP"
    if have_type != wanted_type:
        return Adoption(
            None,
            f"Service {name} is of type {have_type} and the cluster's spec.service.type is "
            f"{wanted_type}: adopted, its type would be changed on the first sync; set "
            f"spec.service.type: {have_type} first (or choose a new spec.serviceRef.name)",
            True,
        )
    selector = sspec.get("selector")
    owners = [r for r in smeta.get("ownerReferences") or [] if isinstance(r, Mapping)]
    patch_meta: dict[str, Any] = {"resourceVersion": smeta.get("resourceVersion")}
    notes: list[str] = []
    if controller is not None:
        if not force:
            return Adoption(
                None,
                f"Service {name} is controlled by {_owner_text(controller)}: adopting it would "
                "make two controllers fight over its selector; stop that controller (or make "
                "it let go of the Service), then run again with --force, which removes that "
                "controller reference and nothing else",
                True,
            )
        patch_meta["ownerReferences"] = [r for r in owners if r is not controller]
        notes.append(f"removed the controller reference to {_owner_text(controller)}")
    if not isinstance(selector, Mapping) or not selector:
        if not force:
            return Adoption(
                None,
                f"Service {name} has no selector: its endpoints are written by someone else "
                "(Patroni's use_endpoints, an operator); adopted, it gets the hook's selector "
                "and Kubernetes' endpoint controllers take its endpoints over; run again with "
                "--force if that is what you want",
                True,
            )
        selector = {}
    record = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": smeta.get("namespace"),
            "labels": {CONTROLLER_UID_LABEL: uid},
        },
        "spec": {"selector": dict(selector)},
    }
    patch_meta["labels"] = {CONTROLLER_UID_LABEL: uid}
    patch_meta["annotations"] = {
        LAST_APPLIED_ANNOTATION: json.dumps(record, separators=(",", ":"), sort_keys=True)
    }
    stale = (smeta.get("labels") or {}).get(CONTROLLER_UID_LABEL)
    if isinstance(stale, str) and stale != uid:
        notes.append(f"replaced the label {CONTROLLER_UID_LABEL}={stale} of another parent")
    return Adoption(
        {"metadata": patch_meta},
        f"Service {name} labelled {CONTROLLER_UID_LABEL}={uid}: Metacontroller adopts it on "
        f"its next sync of PostgreSQLCluster {ident}, and the hook pins its selector to the "
        "leader Patroni confirms (until then it is unchanged)",
        notes=tuple(notes),
    )


def pinned(cluster: Mapping[str, Any], service: Mapping[str, Any] | None) -> str | None:
    """The pod the adopted Service is pinned to, ``None`` until it is ours and pinned.

    Pinned: controlled by the cluster and selecting exactly ``primarySelector`` plus one
    ``statefulset.kubernetes.io/pod-name`` (no key of the previous owner left).
    """
    if service is None:
        return None
    controller = _controller(service)
    uid = (cluster.get("metadata") or {}).get("uid")
    if controller is None or controller.get("uid") != uid:
        return None
    selector = (service.get("spec") or {}).get("selector") or {}
    wanted = (cluster.get("spec") or {}).get("primarySelector") or {}
    pod = selector.get(POD_NAME_LABEL)
    if isinstance(pod, str) and dict(selector) == {**wanted, POD_NAME_LABEL: pod}:
        return pod
    return None
