"""The registry of child parts: everything a sync reply holds besides the hook's own status.

Each part is one module with a :data:`PART` (:class:`hooks.children.base.Part`). Three places
iterate over the registry, so adding a part is one module, one line here and the YAML
(CRD field, CompositeController child resource, RBAC; see CONTRIBUTING.md):

* :func:`hooks.sync.reconcile` plans every part and merges children, status fields and
  conditions in registry order (children of groups no part declares are kept as they are);
* ``/customize`` answers :func:`related_rules`;
* the declared-children check (``kubectl pgfh check``, tests/test_manifests_*.py) compares the
  CompositeController's ``childResources`` with :func:`child_resources`.

:data:`PRIMARY` comes first: its condition (``PrimaryRouted``) is the one ``Ready`` mirrors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hooks.children import backup, primary, readonly
from hooks.children.base import Part
from hooks.domain.model import SERVICE_KEY, ClusterSpec

PRIMARY: Part = primary.PART
#: Parts a spec may leave out; their conditions are kept as they are by a finalize or an
#: invalid-spec reply.
OPTIONAL: tuple[Part, ...] = (readonly.PART, backup.PART)
PARTS: tuple[Part, ...] = (PRIMARY, *OPTIONAL)


def planned_groups() -> frozenset[str]:
    """``children`` keys some part replies for (other groups are kept as they are)."""
    return frozenset(g.key for part in PARTS for g in part.child_groups) - {SERVICE_KEY}


def related_rules(
    spec: ClusterSpec, uid: str | None, namespace: str | None = None
) -> list[Mapping[str, Any]]:
    """The ``/customize`` answer for a valid spec: every part's rules, in registry order,
    each scoped to the parent's ``namespace`` (when given).

    Rules by ``names`` of one type become one rule: Metacontroller (v4.17.2,
    ``customize/manager.go`` ``GetRelatedObjects``, ``selectByNamespaceAndNames``) lists
    every object of that type in the rule's namespace (without one: in *every* namespace) on
    each sync before it filters by name, once per rule.

    A label rule gets the namespace too (``selectByNamespaceAndLabels``): it lists the same
    objects on a sync (``listObjects``, manager.go 614: ``Lister().Namespace(ns).List``, as
    a plain label rule of a v1 hook does, 596), but on every related-object event
    ``matchesRelatedRule`` compares the namespaces *before* it builds the selector
    (manager.go 465-474), where a plain label rule builds and matches the selector first
    (453-464): a Pod event in another namespace then costs each parent a string compare
    instead of ``LabelSelectorAsSelector``.
    """
    rules: list[Mapping[str, Any]] = []
    by_name: dict[tuple[object, object], dict[str, Any]] = {}
    for part in PARTS:
        for rule in part.related_rules(spec, uid):
            if not rule.get("names"):
                rules.append({**rule, "namespace": namespace} if namespace else rule)
                continue
            kind = (rule.get("apiVersion"), rule.get("resource"))
            merged = by_name.get(kind)
            if merged is None:
                merged = by_name[kind] = {**rule, "names": list(rule["names"])}
                if namespace:
                    merged["namespace"] = namespace
                rules.append(merged)
            else:
                merged["names"] += [n for n in rule["names"] if n not in merged["names"]]
    return rules


@dataclass(frozen=True, slots=True)
class ChildResource:
    """A ``childResources`` entry the CompositeController must declare (``InPlace``)."""

    api_version: str
    resource: str
    #: The spec fields that make the hook emit it; empty: every cluster needs it.
    needed_by: tuple[str, ...]


def child_resources() -> list[ChildResource]:
    """The child types of every part, each once, in registry order."""
    fields: dict[tuple[str, str], list[str | None]] = {}
    for part in PARTS:
        for group in part.child_groups:
            fields.setdefault((group.api_version, group.resource), []).append(group.needed_by)
    return [
        ChildResource(
            api_version,
            resource,
            () if None in needs else tuple(dict.fromkeys(n for n in needs if n is not None)),
        )
        for (api_version, resource), needs in fields.items()
    ]
