"""The routing decision: which member, if any, the primary Service may select.

The rule (see :func:`choose_leader`): route only to the one member Patroni itself
reports as the running leader, whose Pod is selectable, not terminating and not marked by
Patroni as still being built (``spec.patroni.bootstrapLabels``), and only
while no other Pod carries its ``statefulset.kubernetes.io/pod-name`` value (the
Service's selector must match exactly one Pod). Anything
else is a :class:`Decision` that keeps the observed selector, with the reason.

Pure: members and Pods in, a :class:`Route` out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hooks.domain.members import MemberStatus
from hooks.domain.model import POD_NAME_LABEL, ClusterSpec
from hooks.domain.observed import Pod


class Decision(enum.Enum):
    """Why the reply looks the way it does; the value is the condition's reason."""

    ROUTED = "LeaderFound"
    NO_MEMBERS = "NoMembers"
    NO_LEADER = "NoLeader"
    LEADER_NOT_READY = "LeaderNotReady"
    #: The lock holder is still being built: Patroni reports an initialising state, or its
    #: Pod carries ``spec.patroni.bootstrapLabels`` (Patroni 4.1's ``bootstrap_labels``).
    LEADER_INITIALIZING = "LeaderInitializing"
    MULTIPLE_LEADERS = "MultipleLeaders"
    LEADER_TERMINATING = "LeaderTerminating"
    LEADER_NOT_SELECTABLE = "LeaderPodNotSelectable"
    MEMBER_NAME_MISMATCH = "MemberNameMismatch"
    #: Another Pod carries the leader's ``statefulset.kubernetes.io/pod-name`` value: the
    #: Service's selector would match it too (Kubernetes does not reserve the label).
    SELECTOR_NOT_UNIQUE = "SelectorNotUnique"
    INVALID_SPEC = "InvalidSpec"
    FINALIZING = "Finalizing"
    #: ``spec.serviceRef`` names a Service that exists outside this controller: it waits
    #: for a person (``kubectl pgfh adopt``), not for Patroni (hooks.children.primary).
    SERVICE_NOT_OWNED = "ServiceNotOwned"

    @property
    def degraded(self) -> bool:
        """Routing could not be confirmed: keep what is observed, look again soon."""
        return self not in (
            Decision.ROUTED,
            Decision.INVALID_SPEC,
            Decision.FINALIZING,
            Decision.SERVICE_NOT_OWNED,
        )


@dataclass(frozen=True, slots=True)
class Route:
    """The decision of one sync: the confirmed leader (only when routed), or why not."""

    decision: Decision
    leader: str | None = None
    #: Why routing is not confirmed ("" when routed).
    why: str = ""
    #: The timeline the leader reported in this sync (only when routed, if it did).
    timeline: int | None = None

    @property
    def routed(self) -> bool:
        return self.decision is Decision.ROUTED


def choose_leader(
    pods: Mapping[str, Pod],
    members: Sequence[MemberStatus],
    spec: ClusterSpec,
) -> Route:
    """Apply the routing rules; return the decision, the leader (if routed) and why.

    How many members answered does not matter: a member answers 200 on the health path
    only while Patroni's ``Ha.is_leader()`` holds (``patroni/api.py``, ``do_GET``), and that
    is true only until the expiry Patroni set from the DCS TTL when it last wrote the
    leader key (``patroni/ha.py``, ``is_leader`` / ``set_is_leader``). A leader that lost
    the DCS stops answering 200 before the key can expire and another member can take
    it. So a single 200 is a lock holder, and a member the hook cannot reach adds no
    doubt that Patroni has not already resolved. (The exceptions: Patroni's maintenance
    ``pause`` with the DCS unreachable, where Patroni itself trusts the running role, and
    ``failsafe_mode``, where it keeps answering 200 only while every member acknowledges the
    leader over ``POST /failsafe``, so none can be promoted meanwhile.)
    Two 200s at once (a stale or forged answer) keep the Service where it is.
    """
    path = spec.health_check_path
    if not members:
        return Route(
            Decision.NO_MEMBERS, why=f"No Pod matches primarySelector {_selector_text(spec)}"
        )
    claimants = [m for m in members if m.claims_leadership]
    answered = [m for m in members if m.reachable]
    if len(claimants) > 1:
        names = ", ".join(m.name for m in claimants)
        return Route(
            Decision.MULTIPLE_LEADERS, why=f"Several members answer 200 on {path}: {names}"
        )
    if not claimants:
        return Route(
            Decision.NO_LEADER,
            why=f"No member answers 200 on {path} ({len(answered)} of {len(members)} answered"
            f"{_unreachable_phrase(members)}){_failsafe_phrase(members)}",
        )
    claimant = claimants[0]
    if claimant.initialising:
        return Route(
            Decision.LEADER_INITIALIZING,
            why=f"{claimant.name} holds the leader lock but Patroni reports it initializing "
            f"(state {claimant.state})",
        )
    if not claimant.is_leader:
        return Route(
            Decision.LEADER_NOT_READY,
            why=f"{claimant.name} holds the leader lock but reports role={claimant.role}, "
            f"state={claimant.state}",
        )
    if (
        spec.verify_member_name
        and claimant.patroni_name is not None
        and claimant.patroni_name != claimant.name
    ):
        # The pod's IP answered as another member: a stale or reused IP. Never route on it.
        return Route(
            Decision.MEMBER_NAME_MISMATCH,
            why=f"Pod {claimant.name}'s IP answers as Patroni member {claimant.patroni_name!r}",
        )
    pod = pods[claimant.name]
    if bootstrap_labelled(spec, pod.labels):
        # Patroni labels the Pod so while the member is built, and removes the labels in
        # its next HA loop once it runs: a leader that still carries them waits that loop.
        return Route(
            Decision.LEADER_INITIALIZING,
            why=f"Leader {claimant.name}'s Pod carries Patroni's bootstrap labels "
            f"({bootstrap_labels_text(spec)}): it is still being built",
        )
    if pod.terminating:
        return Route(
            Decision.LEADER_TERMINATING,
            why=f"Leader {claimant.name} is terminating; waiting for Patroni to elect another",
        )
    labels = pod.labels
    wanted = {**spec.primary_selector, POD_NAME_LABEL: claimant.name}
    missing = sorted(k for k, v in wanted.items() if labels.get(k) != v)
    if missing:
        return Route(
            Decision.LEADER_NOT_SELECTABLE,
            why=f"Leader {claimant.name} lacks the label(s) {', '.join(missing)} that the "
            f"Service selector needs",
        )
    impostors = sorted(
        name
        for name, other in pods.items()
        if name != claimant.name and other.labels.get(POD_NAME_LABEL) == claimant.name
    )
    if impostors:
        # Kubernetes does not reserve the label: a copied Pod (`kubectl debug --copy-to
        # --keep-labels`, a manifest copied from a member) would be selected too, and get
        # part of the writes. Every related Pod is here (the customize rule relates all
        # that match primarySelector), so every Pod the selector could match is checked.
        return Route(
            Decision.SELECTOR_NOT_UNIQUE,
            why=f"{_pods_phrase(impostors)} {POD_NAME_LABEL}={claimant.name} besides the "
            f"leader {claimant.name}: the Service's selector would match "
            f"{'them' if len(impostors) > 1 else 'it'} too, so it is not moved",
        )
    return Route(Decision.ROUTED, claimant.name, timeline=claimant.timeline)


def bootstrap_labelled(spec: ClusterSpec, labels: Mapping[str, str]) -> bool:
    """Whether a Pod's ``labels`` carry every one of ``spec.patroni.bootstrapLabels``.

    Patroni sets them together and removes them together (``touch_member``,
    ``patroni/dcs/kubernetes.py`` at v4.1.4, lines 1382-1387), so all of them, not any, is
    its signal: one of them alone may be a label the Pods always carry.
    """
    wanted = spec.bootstrap_labels
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def bootstrap_labels_text(spec: ClusterSpec) -> str:
    """``a=b,c=d``: the bootstrap labels for a message (sorted, so it is stable)."""
    return ",".join(f"{k}={v}" for k, v in sorted(spec.bootstrap_labels.items()))


#: Pods named in a message at most (the rest are counted): the status stays small.
_NAMED_PODS = 10


def _pods_phrase(names: Sequence[str]) -> str:
    """``Pod a carries`` / ``Pods a, b and 3 more carry``: named, but bounded."""
    shown = ", ".join(names[:_NAMED_PODS])
    more = f" and {len(names) - _NAMED_PODS} more" if len(names) > _NAMED_PODS else ""
    return f"Pods {shown}{more} carry" if len(names) > 1 else f"Pod {shown} carries"


def _unreachable_phrase(members: Sequence[MemberStatus]) -> str:
    lost = [f"{m.name}: {m.reason}" for m in members if not m.reachable]
    foreign = [f"{m.name}: {m.reason}" for m in members if m.reachable and not m.patroni_answer]
    phrase = f"; unreachable: {'; '.join(lost)}" if lost else ""
    return phrase + (f"; not Patroni: {'; '.join(foreign)}" if foreign else "")


def _failsafe_phrase(members: Sequence[MemberStatus]) -> str:
    """Why no member answers 200 while Patroni's failsafe mode holds a primary.

    Measured with Patroni 4.1.5 on its Kubernetes DCS (tests/test_patroni_kubernetes_dcs.py):
    with the API server down, the leader keeps running as primary by failsafe, but answers
    503 on its leader paths once its cached leader object is older than the TTL: every HA
    cycle starts with ``load_cluster_from_dcs``, whose ``set_is_leader(False)`` undoes the
    failsafe's ``set_is_leader(True)`` (the leader's own ``Failsafe`` holds no leader: only
    members that received ``POST /failsafe`` do). The Service is kept where it is, as for
    every other "no leader"; this says why.
    """
    running = sorted(
        m.name
        for m in members
        if m.failsafe_active and m.role == "primary" and m.state == "running"
    )
    if not running:
        return ""
    return (
        f"; Patroni failsafe mode is active and {', '.join(running[:_NAMED_PODS])} runs as "
        "primary (the DCS is unreachable)"
    )


def _selector_text(spec: ClusterSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(spec.primary_selector.items()))
