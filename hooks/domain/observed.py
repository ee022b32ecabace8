"""What Metacontroller observed, as typed values: Pods, children, Jobs and the previous status.

:mod:`hooks.loaders.observed` fills these in once, where the request is loaded; the core and
the parts read their attributes and never a Metacontroller dict. Junk that the hook cannot
read (a ``metadata`` that is not an object, labels that are not strings) is refused there,
with a 400; what Kubernetes leaves out (no Pod IP yet, no ``status`` annotation on a Pod of
another DCS) is an attribute that says so (``None``, ``False``, empty).

**The raw object a child keeps.** Metacontroller deletes every observed child a reply leaves
out, and a reply in doubt must hand an observed child back *as it is* (rule 1 of the design
card): a copy of its last-applied record, or of the object itself minus what the API server
owns, with every field the hook never reads (ports, annotations, a CronJob's whole
template). So a :class:`Child` holds the object it came from, read-only
(``types.MappingProxyType`` over the request's own object), as :attr:`Child.raw`. Only
:func:`hooks.core.keeping.preserved` reads it, and only to copy it into the echo; every
decision reads the typed attributes beside it. The previous status keeps its raw mapping
for the same reason (:attr:`PreviousStatus.raw`: a finalize or an invalid-spec reply keeps
the status as it is).

Pure: values only.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from hooks.domain.model import Condition

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
#: An empty read-only mapping (the default of every mapping attribute here).
EMPTY: Mapping[str, Any] = MappingProxyType({})


# ------------------------------------------------------------------------- Pods


@dataclass(frozen=True, slots=True)
class Pod:
    """A related Patroni member Pod, as far as the hook reads it."""

    name: str
    #: ``status.podIP`` when it is an IP literal without an IPv6 zone, else ``None``.
    ip: IP | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    #: ``metadata.deletionTimestamp`` is set.
    terminating: bool = False
    #: The kubelet reports the ``Ready`` condition ``False`` (absent is not a "no").
    not_ready: bool = False
    #: The role in Patroni's ``status`` annotation (its member JSON, normalised: ``master``
    #: is ``primary``), ``None`` without one that has a role and a state.
    status_role: str | None = None
    #: ``metadata.uid`` (an EndpointSlice's ``targetRef`` names it).
    uid: str | None = None
    #: ``spec.nodeName`` when set.
    node_name: str | None = None
    #: Named container ports, by name (the first declaration of a name wins).
    container_ports: Mapping[str, int] = field(default_factory=lambda: EMPTY)


# --------------------------------------------------------------------- children


@dataclass(frozen=True, slots=True)
class Child:
    """An observed child of any type: its identity, its labels and what it came from."""

    #: The ``children`` key it was observed under (``Service.v1``, ``CronJob.batch/v1``).
    group: str
    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    #: Metacontroller's last-applied record when it is usable: a JSON object with a
    #: ``metadata`` object (and a ``spec`` object, if any) for this very object (same
    #: ``apiVersion``, ``kind`` and name). ``None`` otherwise.
    last_applied: Mapping[str, Any] | None = None
    #: The object as observed, read-only: echoed by :func:`hooks.core.keeping.preserved`,
    #: never read by a decision (see the module docstring).
    raw: Mapping[str, Any] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """One entry of ``metadata.ownerReferences``, as far as a decision reads it."""

    api_version: str
    kind: str
    name: str
    uid: str
    #: ``controller: true``: the owner that reconciles the object (at most one).
    controller: bool = False

    def describe(self) -> str:
        """``Kind name (apiVersion)``, ``controller`` marked: for a condition's message."""
        role = ", controller" if self.controller else ""
        return f"{self.kind} {self.name} ({self.api_version}{role})"


@dataclass(frozen=True, slots=True)
class ServiceChild(Child):
    """An observed Service (a child, or a Service related by name: ``spec.serviceRef``)."""

    #: ``spec.selector`` as observed (values are free input: not necessarily strings);
    #: ``None`` when it is not an object.
    selector: Mapping[str, object] | None = None
    #: ``metadata.labels`` of the last-applied record (``{}`` without a record).
    applied_labels: Mapping[str, object] = field(default_factory=lambda: EMPTY)
    #: ``metadata.ownerReferences`` that are readable (free input: the rest is left out).
    owners: tuple[OwnerRef, ...] = ()
    #: ``metadata.deletionTimestamp`` is set.
    deleting: bool = False

    @property
    def controller(self) -> OwnerRef | None:
        """The owner reference with ``controller: true``, if any (Kubernetes allows one)."""
        return next((o for o in self.owners if o.controller), None)


@dataclass(frozen=True, slots=True)
class SliceChild(Child):
    """An observed EndpointSlice."""

    #: ``(Pod name, first address)`` of each endpoint whose ``targetRef`` is a Pod, in order.
    endpoints: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class CronJobChild(Child):
    """An observed CronJob."""

    #: ``resources`` of each container of its Pod template, by container name (the first
    #: of a name wins): ``requests`` and ``limits``, each the quantities that are strings,
    #: as the API server stores them.
    container_resources: Mapping[str, Mapping[str, Mapping[str, str]]] = field(
        default_factory=lambda: EMPTY
    )


# ------------------------------------------------------------------------- Jobs


def parse_time(value: str) -> datetime | None:
    """An RFC 3339 time as Kubernetes writes it (``2026-08-20T02:31:00Z``), ``None`` if not.

    Python 3.11's ``fromisoformat`` (the least this package supports) reads the ``Z`` itself.
    """
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def is_time(value: object) -> bool:
    """Whether a free field holds such a time (a Job's end, a backup record's)."""
    return isinstance(value, str) and parse_time(value) is not None


@dataclass(frozen=True, slots=True)
class JobEnd:
    """How a finished Job ended: ``Complete`` or ``Failed``, when, and why."""

    kind: str
    when: str
    reason: str


@dataclass(frozen=True, slots=True)
class Job:
    """A related backup Job."""

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    #: ``None`` while it runs (no ``Complete`` or ``Failed`` condition with a time).
    finished: JobEnd | None = None


# -------------------------------------------------------------- previous status


@dataclass(frozen=True, slots=True)
class PreviousCondition:
    """An entry of the parent's ``status.conditions`` that has a string ``type``.

    The status is free input (anyone with write access to the status subresource can put
    anything there): ``status``, ``reason`` and ``lastTransitionTime`` are ``None`` unless
    they are (non-empty, for the time) strings.
    """

    type: str
    status: str | None = None
    reason: str | None = None
    last_transition_time: str | None = None
    #: The entry as a condition to keep as it is (a finalize, an invalid spec): ``None``
    #: without a string ``status``; ``reason`` and ``message`` kept as text, whatever
    #: they were.
    condition: Condition | None = None


@dataclass(frozen=True, slots=True)
class BackupRecord:
    """``status.backup.lastSuccessful`` / ``lastFailed`` as recorded: a Job name, a time."""

    #: The record's string fields (``job``, ``completionTime`` or ``failureTime``, ``reason``).
    fields: Mapping[str, str]

    @property
    def job(self) -> str:
        return self.fields["job"]


@dataclass(frozen=True, slots=True)
class PreviousBackup:
    """``status.backup`` as recorded (each record only when it names a Job and a time)."""

    cron_job: str | None = None
    last_successful: BackupRecord | None = None
    last_failed: BackupRecord | None = None


@dataclass(frozen=True, slots=True)
class PreviousMember:
    """An entry of ``status.members`` that has a string ``name``, as the last reply wrote it.

    The hook never decides from it (each sync probes the members again); it is what
    ``kubectl pgfh status`` shows between syncs. Free input like the rest of the status:
    ``reachable`` is ``None`` unless a boolean, the texts unless non-empty strings, the
    ``timeline`` unless an integer.
    """

    name: str
    reachable: bool | None = None
    role: str | None = None
    state: str | None = None
    timeline: int | None = None
    #: Why the member did not answer as Patroni (the reply writes it only then).
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PreviousStatus:
    """The parent's ``status`` as the last reply (or anyone) wrote it."""

    conditions: tuple[PreviousCondition, ...] = ()
    #: ``status.members`` in their order.
    members: tuple[PreviousMember, ...] = ()
    #: ``status.timeline`` when it is an integer.
    timeline: int | None = None
    backup: PreviousBackup = field(default_factory=PreviousBackup)
    #: The conditions by type (of two with one type, the later one).
    by_type: Mapping[str, PreviousCondition] = field(default_factory=lambda: EMPTY)
    #: The first ``Ready`` condition.
    ready: PreviousCondition | None = None
    #: The status as observed, read-only: kept as it is by a finalize or an invalid-spec
    #: reply, never read by a decision.
    raw: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
