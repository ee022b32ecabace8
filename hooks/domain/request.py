"""The sync request as the decision sees it: the parent's identity, its spec, the observed state.

Filled in by :func:`hooks.loaders.envelope.load_sync_request`; read by the core, the parts
and the shell.

Pure: a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hooks.domain.model import ClusterSpec, SpecProblem
from hooks.domain.observed import (
    Child,
    CronJobChild,
    Job,
    Pod,
    PreviousStatus,
    ServiceChild,
    SliceChild,
)


@dataclass(frozen=True, slots=True)
class SyncRequest:
    """A sync or finalize request, checked and loaded into typed values (hooks.loaders).

    The observed objects are :mod:`hooks.domain.observed` values: nothing above the loaders
    reads a Metacontroller dict.
    """

    namespace: str
    name: str
    generation: int | None
    spec: ClusterSpec | None
    spec_problems: tuple[SpecProblem, ...]
    #: Observed Service children, by name.
    services: Mapping[str, ServiceChild]
    #: Observed children of other types, by group and name (a reply never drops them).
    other_children: Mapping[str, Mapping[str, Child]]
    #: Related Patroni Pods, by name.
    pods: Mapping[str, Pod]
    finalizing: bool
    #: The parent's ``metadata.uid`` (labels the backup Jobs).
    uid: str | None = None
    #: Related backup Jobs, by name; ``None`` when the request has no such group.
    jobs: Mapping[str, Job] | None = None
    #: ``other_children``' EndpointSlice and CronJob groups, typed; ``None`` when the
    #: request has no such group (the CompositeController does not declare the type).
    slices: Mapping[str, SliceChild] | None = None
    cronjobs: Mapping[str, CronJobChild] | None = None
    #: Services related by name (``spec.serviceRef.name``, the customize rule of
    #: :mod:`hooks.children.primary`), by name, whoever owns them: one that is not in
    #: ``services`` exists outside this controller. ``None`` when the request has no such
    #: group (a customize answer cached from before the rule existed).
    named_services: Mapping[str, ServiceChild] | None = None
    #: The parent's status as the last reply (or anyone) wrote it.
    previous: PreviousStatus = field(default_factory=PreviousStatus)
    #: How many related Pods the request holds, when more than the loader was told to load
    #: (their number is all a refusal needs); ``None``: every one is in :attr:`pods`.
    pod_count: int | None = None
    #: Whether the request has a related Pods group at all. Without one, Metacontroller's
    #: cached customize answer for this parent relates no Pods: the answer the hook gives
    #: a parent the calling shard does not serve (:mod:`hooks.core.scope`), still cached
    #: (by UID and generation, 20 minutes) after the parent's labels moved it into this
    #: shard. An empty group is "no Pod matches primarySelector".
    pods_related: bool = True
    #: The spec is refused by the hook's own limits (:func:`hooks.probe.plan.apply_policy`),
    #: not by the schema: asked again after ``ResyncTiming.refused``.
    refused_by_policy: bool = False
    #: The parent's ``apiVersion`` and ``kind`` (an Event's ``regarding``).
    api_version: str = "adg.io/v1alpha1"
    kind: str = "PostgreSQLCluster"

    @property
    def cluster(self) -> str:
        """``namespace/name`` of the parent, for logs and metrics."""
        return f"{self.namespace}/{self.name}"
