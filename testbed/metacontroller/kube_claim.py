"""Which objects a parent's sync sees and which children its reply asks for, in the stand-in
against the real API server (:mod:`testbed.metacontroller.kube`), as Metacontroller v4.17.2
decides them (``pkg/controller/composite/controller.go`` ``syncParentObject``):

* the parent's selector: ``controller-uid`` with ``generateSelector``, else its own
  ``spec.selector`` (refused when empty);
* ``claimChildren`` (``pkg/controller/common/claim.go``): children of every declared type
  whose controller reference is the parent and whose labels match are its; orphans that
  match are adopted (after a live read of the parent: not being deleted, the same UID),
  owned objects that no longer match are released (GET + PUT of the owner references);
* the related objects a customize rule names (``names``) or selects (``labelSelector``), in
  the parent's namespace only (hook ``version: v1``);
* the desired children of a reply: namespaces defaulted, the ``controller-uid`` label added
  and the selector enforced; a child of an undeclared type is created, never observed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from testbed.kubernetes.rest import KubeApiError, KubeRest, group_version_path, resource_path
from testbed.kubernetes.watch import Reflector
from testbed.metacontroller.apply import HookError
from testbed.metacontroller.dynamic_apply import controller_ref, group_key
from testbed.metacontroller.kube_apply import ChildType, Managed, create
from testbed.metacontroller.selectors import matches

Groups = dict[str, dict[str, dict[str, Any]]]


def controller_ref_of(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner reference with ``controller: true``, if any."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def selector_of(controller: Mapping[str, Any], parent: Mapping[str, Any]) -> dict[str, Any]:
    if controller["spec"].get("generateSelector"):
        return {"matchLabels": {"controller-uid": parent["metadata"]["uid"]}}
    selector = (parent.get("spec") or {}).get("selector") or {}
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        raise HookError(".spec.selector must have either matchLabels, matchExpressions, or both")
    return dict(selector)


def claim(
    rest: KubeRest,
    controller: Mapping[str, Any],
    child_types: Mapping[str, ChildType],
    children: Mapping[str, Reflector],
    parent: dict[str, Any],
    parent_path: str,
) -> Groups:
    """``claimChildren``: owned and matching, adopted orphans; owned but not matching
    released. Every declared type is present, empty or not. ``parent_path``: the parent's
    own path, read live before an adoption."""
    meta = parent["metadata"]
    selector = selector_of(controller, parent)
    groups: Groups = {}
    for key, reflector in sorted(children.items()):
        kind = child_types[key]
        group: dict[str, dict[str, Any]] = {}
        for obj in reflector.items():
            child_meta = obj["metadata"]
            if child_meta.get("namespace") != meta["namespace"]:
                continue
            ref = controller_ref_of(obj)
            labelled = matches(selector, child_meta.get("labels"))
            if ref is not None and ref.get("uid") == meta["uid"]:
                if labelled:
                    group[child_meta["name"]] = obj
                else:
                    set_owner(rest, kind, obj, None)
            elif ref is None and labelled and not child_meta.get("deletionTimestamp"):
                adopted = _adopt(rest, kind, obj, parent, parent_path)
                if adopted is not None:
                    group[child_meta["name"]] = adopted
        groups[key] = group
    return groups


def _adopt(
    rest: KubeRest, kind: ChildType, obj: dict[str, Any], parent: dict[str, Any], parent_path: str
) -> dict[str, Any] | None:
    meta = parent["metadata"]
    live = rest.get(parent_path)
    if live["metadata"].get("deletionTimestamp") or live["metadata"]["uid"] != meta["uid"]:
        return None
    return set_owner(rest, kind, obj, controller_ref(parent))


def set_owner(
    rest: KubeRest, kind: ChildType, obj: dict[str, Any], ref: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Adopt (``ref``) or release (``None``) with GET+PUT; the updated object."""
    meta = obj["metadata"]
    path = resource_path(kind.api_version, kind.resource, meta["namespace"], meta["name"])
    try:
        live = rest.get(path)
        if live["metadata"]["uid"] != meta["uid"]:
            return None
        refs = [r for r in live["metadata"].get("ownerReferences") or [] if not r.get("controller")]
        live["metadata"]["ownerReferences"] = [*refs, ref] if ref else refs
        return rest.replace(path, live)
    except KubeApiError as error:
        if error.status in (404, 409):
            return None
        raise


def rule_gvr(rule: Mapping[str, Any]) -> str:
    return f"{rule.get('apiVersion')}/{rule.get('resource')}"


def rule_matches(
    rule: Mapping[str, Any], parent: Mapping[str, Any], obj: Mapping[str, Any]
) -> bool:
    meta = obj["metadata"]
    if meta.get("namespace") != parent["metadata"]["namespace"]:
        return False  # v1, namespaced parent: its own namespace only
    names = rule.get("names")
    if names:
        return meta.get("name") in names
    return matches(rule.get("labelSelector"), meta.get("labels"))


def desired_children(
    controller: Mapping[str, Any],
    child_types: Mapping[str, ChildType],
    parent: Mapping[str, Any],
    reply: Mapping[str, Any],
) -> Groups:
    """Steps 5 and 8: namespaces defaulted, the selector label added and enforced."""
    meta = parent["metadata"]
    selector = selector_of(controller, parent)
    generate = bool(controller["spec"].get("generateSelector"))
    desired: Groups = {k: {} for k in child_types}
    for child in reply.get("children") or []:
        if not isinstance(child, dict):
            raise HookError("a child is not an object")
        child = copy.deepcopy(child)
        child_meta = child.setdefault("metadata", {})
        child_meta.setdefault("namespace", meta["namespace"])
        labels = child_meta.setdefault("labels", {})
        if generate:
            labels.setdefault("controller-uid", meta["uid"])
        if not matches(selector, labels):
            raise HookError(
                f"labels on desired child {child.get('kind')} {child_meta.get('name')} "
                "don't match parent selector"
            )
        key = group_key(str(child.get("apiVersion")), str(child.get("kind")))
        if child_meta["namespace"] != meta["namespace"]:
            continue  # v1: only the parent's namespace is observed
        desired.setdefault(key, {})[str(child_meta.get("name"))] = child
    return desired


def create_undeclared(
    rest: KubeRest, obj: dict[str, Any], parent: Mapping[str, Any], done: Managed
) -> None:
    """A child of a type the CompositeController does not declare: its resource looked up
    in discovery, then created (never observed, so never updated nor deleted)."""
    api_version, kind = str(obj.get("apiVersion")), str(obj.get("kind"))
    for entry in rest.get(group_version_path(api_version)).get("resources") or []:
        if entry.get("kind") == kind and "/" not in str(entry.get("name")):
            child_type = ChildType(group_key(api_version, kind), api_version, entry["name"], kind)
            create(rest, child_type, obj, parent, done)
            return
    done.errors.append(f"no resource for {kind} in {api_version}")
