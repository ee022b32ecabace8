"""Switchover detection per cluster: how soon a healthy cluster must be looked at again.

A planned switchover on an etcd or Consul DCS changes no Kubernetes object, so only
``resyncAfterSeconds`` brings the sync that follows it (the *polled* mode; the cluster's
``spec.switchover.pollSeconds``, else the operator's ``PGFH_RESYNC_HEALTHY_SECONDS``).
Polling every cluster every second is what stops a Metacontroller install from
scaling past about fifty clusters (docs/scale.md, testbed/bench/fleet/table.py), so a cluster whose
member Pods change on every switchover may be looked at far less often (the *event-driven* mode,
``spec.switchover.eventDrivenResyncSeconds``): the Pod change itself triggers the sync.

Patroni on the Kubernetes DCS gives exactly that: in every HA cycle ``touch_member``
(patroni/dcs/kubernetes.py) patches the member's own Pod with the role label
(``kubernetes.role_label``, default ``role``: ``primary`` on the leader-lock holder,
``replica`` on a running follower; ``master`` before Patroni 4 or with
``leader_label_value: master``; removed on a member that is not running) and with the
``status`` annotation (the member's JSON: ``role``, ``state``, ``xlog_location`` ...).
Labels kept by something else (Spilo's ``spilo-role`` callback, ``master``/``replica``)
are opted into with ``spec.switchover.roleLabel``.

A label proves nothing by itself: anyone can set it, and one that nobody maintains may
agree with Patroni by chance. So this is decided afresh in every sync, and only from a
sync whose probes confirmed the leader: every member Pod must carry the label with the
value Patroni's REST answer implies (the leader's value on the leader, the replica value
on every other member) and, without ``roleLabel``, Patroni's ``status`` annotation with
the role that member reported over REST. Anything else is polled, with the reason in
the status. The label never decides routing (:mod:`hooks.core.routing` routes on the REST
answers only); it only decides how long the healthy resync may be.

Phase spread: each healthy resync lands the cluster's next sync on a slot of its own (a
hash of the parent's UID modulo the resync period). After a Metacontroller restart every
parent is synced at once and, because each schedules its next sync relative to its last,
the fleet would stay in that one clump and the queue would run at its rate limit every
period (docs/scale.md, "Phase-locking"). The slot is computed from the UID and the clock
only, so the hook stays stateless, and nothing of it enters the status.

Pure: no I/O; plain mappings in, a small value out (the clock is passed in).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hooks.domain.members import MemberStatus
from hooks.domain.model import (
    PATRONI_LEADER_VALUES,
    PATRONI_REPLICA_VALUES,
    PATRONI_ROLE_LABEL,
    ClusterSpec,
    Condition,
    ResyncTiming,
    RoleLabelSpec,
)
from hooks.domain.observed import Pod

#: The status condition that explains the mode.
CONDITION = "SwitchoverDetection"
#: At most this many Pods are named in a message (the rest are counted).
_NAMED = 3


class Detection(enum.Enum):
    """How a switchover that changes nothing else reaches this hook."""

    #: Only ``resyncAfterSeconds``: the healthy resync is the poll setting.
    POLLED = "Polled"
    #: A role-label change of a member Pod (an immediate sync): the long healthy resync.
    ROLE_LABEL = "RoleLabel"


class DetectionReason(enum.Enum):
    """The ``SwitchoverDetection`` condition's reason."""

    ROLE_LABELS_AGREE = "RoleLabelsAgree"
    NO_CONFIRMED_LEADER = "NoConfirmedLeader"
    ROLE_LABEL_DISAGREES = "RoleLabelDisagrees"
    STATUS_ANNOTATION_DISAGREES = "StatusAnnotationDisagrees"
    ROLE_LABEL_MISSING = "RoleLabelMissing"
    STATUS_ANNOTATION_MISSING = "StatusAnnotationMissing"


@dataclass(frozen=True, slots=True)
class DetectionVerdict:
    """The mode for this sync, the condition's reason and a message that says why."""

    detection: Detection
    reason: DetectionReason
    message: str

    @property
    def event_driven(self) -> bool:
        """Whether a switchover of this cluster is expected to change a related Pod."""
        return self.detection is Detection.ROLE_LABEL

    @property
    def condition(self) -> Condition:
        """The ``SwitchoverDetection`` condition of this sync."""
        status = "True" if self.event_driven else "False"
        return Condition(CONDITION, status, self.reason.value, self.message)


@dataclass(frozen=True, slots=True)
class _Rule:
    """What every member Pod must carry for the event-driven mode."""

    key: str
    leader_values: frozenset[str]
    replica_values: frozenset[str]
    #: Patroni's ``status`` annotation required too (the default rule only).
    annotation: bool

    @classmethod
    def of(cls, role_label: RoleLabelSpec | None) -> _Rule:
        if role_label is None:
            return cls(PATRONI_ROLE_LABEL, PATRONI_LEADER_VALUES, PATRONI_REPLICA_VALUES, True)
        return cls(
            role_label.key,
            frozenset({role_label.leader_value}),
            frozenset({role_label.replica_value}),
            False,  # pragma: no mutate (None reads the same: the field is only tested for truth)
        )

    def describe(self, values: frozenset[str]) -> str:
        return " or ".join(f"{self.key}={v}" for v in sorted(values))


def detect(
    pods: Mapping[str, Pod],
    members: Sequence[MemberStatus],
    leader: str | None,
    spec: ClusterSpec,
) -> DetectionVerdict:
    """Decide this sync's mode from the member Pods and what Patroni answered.

    ``leader`` is the member this sync routes to (``None`` when it could not confirm
    one): without a confirmed leader there is nothing to compare the labels with, and
    the reply asks for the degraded resync anyway.
    """
    if leader is None or leader not in pods:
        return DetectionVerdict(
            Detection.POLLED,
            DetectionReason.NO_CONFIRMED_LEADER,
            "Polled: no leader confirmed by Patroni in this sync to compare role labels with",
        )
    rule = _Rule.of(spec.switchover.role_label)
    answers = {m.name: m for m in members}
    missing: list[str] = []
    disagreeing: list[str] = []
    no_annotation: list[str] = []
    bad_annotation: list[str] = []
    for name in sorted(pods):
        value = pods[name].labels.get(rule.key)
        wanted = rule.leader_values if name == leader else rule.replica_values
        if not isinstance(value, str):
            missing.append(name)
        elif value not in wanted:
            disagreeing.append(
                f"{name} has {rule.key}={value}, Patroni implies {rule.describe(wanted)}"
            )
        if not rule.annotation:
            continue
        role = pods[name].status_role
        answered = answers.get(name)
        if role is None:
            no_annotation.append(name)
        elif not _role_agrees(role, name == leader, answered, spec):
            said = answered.role if answered is not None else None
            bad_annotation.append(
                f"{name}'s status annotation says role {role}"
                + (f", its REST API {said}" if said else "")
            )
    if disagreeing:
        return _polled(
            DetectionReason.ROLE_LABEL_DISAGREES,
            f"the role label disagrees with Patroni (leader {leader}): {_names(disagreeing)}; "
            "the label is ignored",
        )
    if bad_annotation:
        return _polled(
            DetectionReason.STATUS_ANNOTATION_DISAGREES,
            f"Patroni's status annotation disagrees with its REST answer: {_names(bad_annotation)}",
        )
    if missing:
        return _polled(
            DetectionReason.ROLE_LABEL_MISSING,
            f"no {rule.key} label on {_names(missing)}",
        )
    if no_annotation:
        return _polled(
            DetectionReason.STATUS_ANNOTATION_MISSING,
            f"no Patroni status annotation on {_names(no_annotation)} (not Patroni's "
            "Kubernetes DCS: name a label kept by something else in spec.switchover.roleLabel)",
        )
    source = f"label {rule.key}" + (" and Patroni's status annotation" if rule.annotation else "")
    return DetectionVerdict(
        Detection.ROLE_LABEL,
        DetectionReason.ROLE_LABELS_AGREE,
        f"Role label: every member Pod's {source} agree with Patroni (leader {leader}), "
        "so a switchover changes a Pod",
    )


def healthy_resync(
    spec: ClusterSpec,
    timing: ResyncTiming,
    verdict: DetectionVerdict,
    *,
    key: str,
    now: float,
) -> float:
    """``resyncAfterSeconds`` for a routed reply: the period, phase-spread by ``key``.

    The period is never below the degraded resync (the operator may have raised it above
    the CRD's minimum), a cluster's ``pollSeconds`` never below the operator's floor
    (``timing.min_poll``), and the event-driven period is never shorter than the poll
    setting. ``key`` is the parent's ``metadata.uid`` (else ``namespace/name``), ``now``
    the clock in seconds: see :func:`spread_resync`.
    """
    poll = spec.switchover.poll_seconds
    if poll is not None:
        poll = max(poll, timing.min_poll)  # the operator's floor under a tenant's setting
    period = max(timing.healthy if poll is None else poll, timing.degraded)
    if verdict.event_driven:
        period = max(spec.switchover.event_driven_resync_seconds, period)
    return max(spread_resync(period, key, now), timing.degraded)


def spread_resync(period: float, key: str, now: float) -> float:
    """Seconds until ``key``'s next slot of ``period``, at least half a period away.

    The slot is a stable hash of ``key`` (BLAKE2b, not Python's salted ``hash``: every
    hook pod and every restart must agree) as a fraction of the period. The first sync
    after a restart moves the cluster onto its slot (between half a period and one and a
    half periods); from then on each resync is about one period, so a fleet synced all at
    once spreads evenly over one period and stays spread. The half-period floor keeps a
    cluster that happens to be just before its slot from being synced twice in a row.
    ``testbed/bench/fleet/model.py`` models the fleet with this very function.
    """
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    slot = int.from_bytes(digest) / 2**64 * period  # big-endian, the default
    delay = period - (now - slot) % period
    return delay + period if delay < period / 2 else delay


def _polled(reason: DetectionReason, why: str) -> DetectionVerdict:
    return DetectionVerdict(Detection.POLLED, reason, f"Polled: {why}")


def _role_agrees(
    role: str, is_leader: bool, answered: MemberStatus | None, spec: ClusterSpec
) -> bool:
    """The annotation's role against the REST answer of the same member, in this sync."""
    if is_leader:
        return role in spec.leader_roles and answered is not None and answered.role == role
    if role in spec.leader_roles or role == "primary":
        return False
    if answered is None or answered.role is None:  # no answer, or one without a role
        return True  # no REST role to compare with; the label check still applies
    return answered.role == role


def _names(items: Sequence[str]) -> str:
    shown = "; ".join(items[:_NAMED])
    more = len(items) - _NAMED
    return f"{shown} (and {more} more)" if more > 0 else shown
