"""The interface of a child part: what every part of a reply declares and plans.

A *part* is one kind of thing the hook keeps for a PostgreSQLCluster (the primary Service,
the read-only Service with its EndpointSlices, the backup CronJob). It declares

* the ``children`` groups it replies for (:class:`ChildGroup`; the CompositeController
  must declare each as a child resource, ``InPlace``),
* the ``/customize`` rules for the related objects it reads,
* its condition type and the enum of that condition's reasons,

and plans its share of one sync from one frozen :class:`PartContext`: the children to
reply, its fields of ``status``, and its condition. :mod:`hooks.children` registers the parts;
:func:`hooks.sync.reconcile`, ``/customize`` and the declared-children check iterate over
that registry.

Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hooks.core.keeping import Keep
from hooks.core.routing import Route
from hooks.domain.members import MemberStatus
from hooks.domain.model import ClusterSpec, Condition
from hooks.domain.request import SyncRequest


@dataclass(frozen=True, slots=True)
class ChildGroup:
    """A child type a part replies for, as Metacontroller keys and declares it."""

    #: The ``children`` key in a sync request (``EndpointSlice.discovery.k8s.io/v1``).
    key: str
    #: ``childResources[].apiVersion`` / ``.resource`` of the CompositeController.
    api_version: str
    resource: str
    #: The spec field that makes the hook emit it; ``None``: every cluster needs it.
    needed_by: str | None = None


@dataclass(frozen=True, slots=True)
class PartContext:
    """Everything a part may read to plan one sync (the same object for every part)."""

    request: SyncRequest
    spec: ClusterSpec
    #: One answer per related Pod, sorted by name (unreachable ones included).
    members: tuple[MemberStatus, ...]
    #: This sync's routing decision; ``route.leader`` is set only when it routes.
    route: Route
    #: Echoes an observed child unchanged (:func:`hooks.core.keeping.preserved`, in the
    #: parent's namespace).
    keep: Keep

    @property
    def leader(self) -> str | None:
        """The leader Patroni confirmed in this sync, ``None`` in doubt."""
        return self.route.leader if self.route.routed else None


@dataclass(frozen=True, slots=True)
class PartPlan:
    """One part's share of a sync reply."""

    children: list[dict[str, Any]] = field(default_factory=list)
    #: Fields of ``status`` (merged into the reply's status in registry order).
    status: Mapping[str, Any] = field(default_factory=dict)
    #: The part's condition, ``None`` while the part has nothing to say.
    condition: Condition | None = None


@dataclass(frozen=True, slots=True)
class Part:
    """A registered child part (see the module docstring)."""

    name: str
    #: The condition type this part owns, and the enum of its reasons.
    condition: str
    reasons: type[enum.Enum]
    child_groups: tuple[ChildGroup, ...]
    #: ``/customize`` rules for a valid spec and the parent's UID (``None`` if absent).
    related_rules: Callable[[ClusterSpec, str | None], Sequence[Mapping[str, Any]]]
    plan: Callable[[PartContext], PartPlan]
