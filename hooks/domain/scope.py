"""Which Metacontroller install a customize call comes from, and which parents it serves.

Metacontroller (v4.17.2) walks every parent in its parent informer on every related-object
event (``findRelatedParents``, ``pkg/controller/common/customize/manager.go`` 353-397), and
that informer is shared per resource and not filtered by the CompositeController's
``parentResource.labelSelector``: each shard install walks the whole fleet and asks this hook
for the related rules of other shards' parents. The customize request carries the
CompositeController, so the hook can tell (:func:`hooks.core.scope.serves`); these are the
plain values it decides on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The label-selector operators of ``metav1.LabelSelectorRequirement``.
OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry (the operator is one of :data:`OPERATORS`)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ParentSelector:
    """``spec.parentResource.labelSelector`` of the calling CompositeController."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class CustomizeScope:
    """The calling controller and the parent's labels and finalizers.

    ``selector`` ``None``: the controller has no ``labelSelector`` (it serves every parent).
    """

    controller: str
    selector: ParentSelector | None
    labels: dict[str, str] = field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
