"""Which member the read-only Service may list, and if not, why (a phrase that never varies).

One verdict per member, from its probe answer, its Pod and the leader's answer: Patroni's own
rules for read traffic (``GET /replica``: running, streaming, not paused, not tagged
``noloadbalance``), the spec's lag limit and consistency level, and the Pod's own state
(terminating, not its StatefulSet's member, bootstrap-labelled, not Ready). The read-only
part (:mod:`hooks.children.readonly`) decides from the verdicts who is listed.

Pure: typed values in, a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass

from hooks.children.read_levels import level_problem
from hooks.core.routing import bootstrap_labelled, bootstrap_labels_text
from hooks.domain.members import REPLICATION_STATE_SINCE, MemberStatus
from hooks.domain.model import POD_NAME_LABEL, ClusterSpec
from hooks.domain.observed import IP, Pod

#: Why a replica that answers well is still left out: its Pod's Ready condition is False.
NOT_READY = "Pod not ready (its readiness probe, Patroni's /readiness)"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether one member may be listed, and if not, why."""

    #: True: qualifies; None: in doubt (unreachable); False: left out.
    listed: bool | None
    reason: str = ""
    #: Whether ``KeepEndpoints`` may keep it listed when nobody qualifies.
    keepable: bool = False


def classify(
    member: MemberStatus,
    pod: Pod,
    ip: IP | None,
    leader: MemberStatus,
    leader_position: int,
    spec: ClusterSpec,
) -> Verdict:
    """Whether one member may be listed, and if not, why (a stable phrase)."""
    rs = spec.replica_service
    assert rs is not None
    name = member.name
    if name == leader.name:
        return Verdict(False, "leader")
    if pod.terminating:
        return Verdict(False, "terminating")
    if pod.labels.get(POD_NAME_LABEL) != name:
        # Not its StatefulSet's member (a copy of one, or a Pod that merely carries the
        # members' labels): never listed, whatever it answers.
        return Verdict(False, f"{POD_NAME_LABEL} label is not its name")
    if ip is None:
        return Verdict(False, "no pod IP")
    if bootstrap_labelled(spec, pod.labels):
        # Patroni's own mark (kubernetes.bootstrap_labels): never listed, and never kept
        # in doubt when it does not answer (a replica being re-created is often silent).
        return Verdict(False, f"initializing (bootstrap labels {bootstrap_labels_text(spec)})")
    if not member.reachable:
        if pod.not_ready:
            return Verdict(False, "unreachable, Pod not ready")
        return Verdict(None, "unreachable")
    if not member.patroni_answer:
        return Verdict(False, "not a Patroni answer")
    if spec.verify_member_name and member.patroni_name not in (None, name):
        return Verdict(False, f"answers as Patroni member {member.patroni_name}")
    if (
        member.patroni_scope is not None
        and leader.patroni_scope is not None
        and member.patroni_scope != leader.patroni_scope
    ):
        return Verdict(False, f"member of Patroni scope {member.patroni_scope}")
    if member.initialising:
        return Verdict(False, f"initializing (state {member.state})")
    if member.claims_leadership or member.role != "replica":
        return Verdict(False, f"role {member.role or 'unknown'}")
    if member.state != "running":
        return Verdict(False, f"state {member.state or 'unknown'}")
    if member.noloadbalance:
        return Verdict(False, "tagged noloadbalance")
    if member.replication_state is None and member.older_than(REPLICATION_STATE_SINCE):
        since = ".".join(map(str, REPLICATION_STATE_SINCE))
        return Verdict(
            False, f"{member.version_text} reports no replication_state (since {since})", True
        )
    if member.replication_state != "streaming":
        return Verdict(False, f"not streaming ({member.replication_state or 'unknown'})", True)
    if member.wal_position is None:
        return Verdict(False, "no replayed WAL position", True)
    if member.replay_paused and not rs.include_paused_replicas:
        return Verdict(False, "replay paused")
    below = level_problem(rs.consistency, leader, name)
    if below is not None:
        return Verdict(False, below, True)
    if leader_position - member.wal_position > rs.max_lag_bytes:
        return Verdict(False, f"replay lags more than {format_bytes(rs.max_lag_bytes)}", True)
    if pod.not_ready:
        # The kubelet says no, from the readiness probe docs/deploy.md asks for: Patroni's
        # /readiness, which since 4.1 answers 503 for a replica not streaming within
        # maximum_lag_on_failover (patroni/api.py `_readiness`). Kubernetes' own slices
        # would list it not ready; nor does this one. Last, so a reason of ours that says
        # more (lag, pause, role) comes first.
        return Verdict(False, NOT_READY)
    return Verdict(True)


def format_bytes(value: int) -> str:
    """``16777216`` → ``16 MiB``: exact, so the phrase never changes between syncs."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"
