"""The read-only Service: a selector-less Service plus the EndpointSlice(s) the hook writes.

Pure, like every part (:mod:`hooks.children.base`): everything is a function of the request,
the probe answers of this round and the confirmed leader. The objects themselves are built
and read in :mod:`hooks.children.readonly_objects`.

**How lag is measured.** The hook already asks every member one ``GET`` of the health path
per sync, concurrently, and Patroni answers every health path with the same JSON document:
the leader's ``xlog.location`` and each replica's ``xlog.replayed_location``,
``replication_state`` and ``state``. So the lag of a replica is the leader's location minus
the replica's replayed location *from the same probe round*, and no member costs an extra
request. The alternative, probing ``/replica?lag=<max>`` as well, would double the requests
per sync (Patroni serves its REST API from a 5-thread pool) and compares against the
leader's position *in the DCS*, which Patroni refreshes only once per ``loop_wait`` (10 s by
default), so it is the staler of the two. The price of one round: the positions are read a
few milliseconds apart, so under heavy writes a replica looks up to that much WAL further
behind (never ahead: a negative difference counts as zero). Replayed, not received: a
client reads what the replica has replayed.

**Who is listed** (only what Patroni itself reports, and only with a confirmed leader): a
member whose Pod is not terminating and carries its own name as
``statefulset.kubernetes.io/pod-name`` (a Pod that merely copies the members' labels is
no member, whatever it answers), that answers as itself (``patroni.name`` is the pod's
name when ``memberNameMustMatchPod``, same ``patroni.scope`` as the leader), reports
``role: replica``, ``state: running`` (a member Patroni reports as initialising, or whose
Pod carries ``spec.patroni.bootstrapLabels``, Patroni 4.1's ``bootstrap_labels``, is never
listed, nor kept while in doubt), ``replication_state: streaming``, a replayed location,
no ``noloadbalance`` tag, replay not paused (``xlog.paused``, unless
``includePausedReplicas``), and lags the leader by at most ``maxLagBytes``. These are
Patroni's own rules for ``GET /replica`` (``replica_status_code`` in ``patroni/api.py``: 503
for a member tagged ``noloadbalance``, which is how backup or analytics members are kept
away from clients), plus two Patroni leaves to ``?lag=``: streaming, and a replay that
moves (a paused replica never falls ``maxLagBytes`` behind on a quiet primary, so it
would serve arbitrarily old data for ever). ``nofailover``, ``nosync`` and
``replicatefrom`` say nothing about serving reads; ``nostream`` members are never
``streaming``. Patroni 3.0.0 to 3.0.3 report no ``replication_state`` (it came in
3.0.4): such members are left out, and the reason says so, since streaming cannot be told
from archive recovery with what they send. The leader is never listed, except as the
``UseLeader`` fallback. A member whose Patroni does not answer is in doubt: it stays
listed if it is listed now (same Pod IP, and its Pod is not reported NotReady by the
kubelet), and is not added if it is not. A member that answers something that is not
Patroni's JSON is not in doubt: it is not a Patroni replica, and is left out.

**When no member qualifies** (``whenNoReplica``):

* ``KeepEndpoints`` (default): keep the members listed now, minus the leader and minus those
  that can no longer serve at all (Pod gone or terminating, another IP, not running, not a
  replica, answering as another member). Stale reads beat no reads during a write burst;
  ``ReplicasRouted`` says so.
* ``UseLeader``: list the leader, so reads keep working (on the primary, read-write).
* ``Empty``: list nothing; clients get refused connections and can fall back themselves.

**In doubt** (no confirmed leader, so no position to compare with; the leader reported no
WAL location; a named target port the leader's Pod does not declare): every observed
read-only object is kept exactly as it is, and none is created. Outside finalize nothing
is ever dropped: after ``spec.replicaService`` is removed the objects are kept as they are
(frozen); after a rename the old Service and its slices keep following the replicas.

**Consistency level** (``consistency``, :mod:`hooks.children.read_levels`): ``lag`` is all of
the above; ``synchronous`` and ``quorum`` also require the leader's ``replication`` answer
to list the member's walsender as ``sync`` or ``quorum``. A member below the level counts
like a lagging one (``KeepEndpoints`` may keep it). With a level other than ``lag`` the
status (``replicaLevels``) and the condition name each replica's level as the leader
reports it; with ``lag`` both stay exactly as they were before the field existed.

**Zones** (``trafficDistribution``, :mod:`hooks.children.read_zones`): the Service gets
``spec.trafficDistribution`` and each listed endpoint its Pod's zone and a same-zone hint,
all or nothing; unset, the objects are exactly those of before the field existed.

**Stable status:** names, reasons, levels and the limit only; never a lag in bytes, which moves on
every sync and would make Metacontroller write the status again and again.
"""

from __future__ import annotations

import enum
from typing import Any

from hooks.children import read_zones
from hooks.children.base import ChildGroup, Part, PartContext, PartPlan
from hooks.children.read_levels import Unserved, describe, levels, unserved
from hooks.children.read_members import Verdict, classify, format_bytes
from hooks.children.readonly_objects import (
    desired_objects,
    listed_now,
    slice_ports,
)
from hooks.children.services import foreign_service, primary_services
from hooks.domain.members import MemberStatus
from hooks.domain.model import ENDPOINTSLICE_KEY, ClusterSpec, Condition

CONDITION = "ReplicasRouted"


class ReadOnlyReason(enum.Enum):
    """The ``ReplicasRouted`` condition's reason."""

    ROUTED = "ReplicasWithinLag"
    NO_REPLICA = "NoReplicaWithinLag"
    NO_LEADER = "LeaderNotConfirmed"
    NO_LEADER_POSITION = "LeaderPositionUnknown"
    PORT_NOT_FOUND = "NamedPortNotFound"
    NOT_DECLARED = "EndpointSlicesNotDeclared"
    REMOVED = "ReplicaServiceRemoved"
    NOT_OWNED = "ServiceNotOwned"
    ROUTED_SYNCHRONOUS = "SynchronousReplicasRouted"
    ROUTED_QUORUM = "QuorumReplicasRouted"
    NO_SYNCHRONOUS = "NoSynchronousReplica"
    NO_QUORUM = "NoQuorumReplica"
    NO_SYNCHRONOUS_STANDBY = "NoSynchronousStandby"
    NO_QUORUM_STANDBY = "NoQuorumStandby"
    QUORUM_NOT_SUPPORTED = "QuorumNotSupported"


#: ``consistency`` → (reason when routed, reason when no replica qualifies, the listed
#: replicas' adjective in the message).
_LEVEL_REASONS = {
    "lag": (ReadOnlyReason.ROUTED, ReadOnlyReason.NO_REPLICA, ""),
    "synchronous": (
        ReadOnlyReason.ROUTED_SYNCHRONOUS,
        ReadOnlyReason.NO_SYNCHRONOUS,
        "synchronous ",
    ),
    "quorum": (ReadOnlyReason.ROUTED_QUORUM, ReadOnlyReason.NO_QUORUM, "quorum "),
}
#: (``consistency``, why it is not served) → the reason.
_UNSERVED_REASONS = {
    ("synchronous", Unserved.NO_STANDBY): ReadOnlyReason.NO_SYNCHRONOUS_STANDBY,
    ("quorum", Unserved.NO_STANDBY): ReadOnlyReason.NO_QUORUM_STANDBY,
    ("quorum", Unserved.VERSION): ReadOnlyReason.QUORUM_NOT_SUPPORTED,
}


def related_rules(spec: ClusterSpec, uid: str | None) -> list[dict[str, Any]]:
    """The read-only Service by name, whoever owns it (the member Pods are related by the
    primary Service's rule)."""
    rs = spec.replica_service
    if rs is None:
        return []
    return [{"apiVersion": "v1", "resource": "services", "names": [rs.name]}]


def plan(context: PartContext) -> PartPlan:
    """The read-only children, ``status.replicaService``/``replicaEndpoints`` and
    ``ReplicasRouted`` of one sync."""
    spec, request, keep = context.spec, context.request, context.keep
    primaries = primary_services(request)
    services = {n: s for n, s in request.services.items() if n not in primaries}
    # None: the request has no EndpointSlice group (the CompositeController lacks the type).
    slices = request.slices
    observed = [keep(s) for _, s in sorted(services.items())]
    observed += [keep(s) for _, s in sorted((slices or {}).items())]
    rs = spec.replica_service
    if rs is None:
        if not observed:
            return PartPlan()
        names = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in observed)
        return PartPlan(
            observed,
            condition=_condition(
                "False",
                ReadOnlyReason.REMOVED,
                f"spec.replicaService is not set; keeping {names} as they are until they are "
                "deleted by hand or with the PostgreSQLCluster",
            ),
        )
    foreign = foreign_service(request, rs.name)
    if foreign is not None:
        # Not ours: creating it fails (409) every sync, and an EndpointSlice labelled with
        # its name would feed its endpoints. Ours are kept as they are; nothing is created.
        owners = ", ".join(o.describe() for o in foreign.owners) or "no owner references"
        return PartPlan(
            observed,
            {"replicaService": rs.name},
            _condition(
                "False",
                ReadOnlyReason.NOT_OWNED,
                f"Service {rs.name} exists but is not owned by this PostgreSQLCluster "
                f"({owners}): no read-only endpoints are written for it; set "
                "spec.replicaService.name to a new name, or delete that Service",
            ),
        )
    if slices is None:
        return PartPlan(
            observed,
            {"replicaService": rs.name},
            _condition(
                "False",
                ReadOnlyReason.NOT_DECLARED,
                "The CompositeController does not declare discovery.k8s.io/v1 endpointslices "
                "as a child resource; apply metacontroller/compositecontroller.yaml",
            ),
        )
    pods = request.pods
    ips = {n: ip for n, pod in pods.items() if (ip := pod.ip) is not None}
    listed = listed_now(slices, rs.name)
    leader = context.leader
    by_name = {m.name: m for m in context.members}
    leader_status = by_name.get(leader) if leader is not None else None
    doubt: tuple[ReadOnlyReason, str] | None = None
    if leader is None or leader_status is None or leader not in ips:
        doubt = (
            ReadOnlyReason.NO_LEADER,
            "No leader is confirmed, so replica lag cannot be computed",
        )
    elif leader_status.wal_position is None:
        doubt = (ReadOnlyReason.NO_LEADER_POSITION, f"Leader {leader} reported no WAL location")
    reference_ports = slice_ports(spec, pods.get(leader)) if leader is not None else None
    if doubt is None and reference_ports is None:
        doubt = (
            ReadOnlyReason.PORT_NOT_FOUND,
            f"A named targetPort of spec.service.ports is not a container port of {leader}",
        )
    if doubt is not None:
        keeping = ", ".join(sorted(listed)) or "none"
        return PartPlan(
            observed,
            _status(rs.name, sorted(listed)),
            _condition(
                "False",
                doubt[0],
                f"{doubt[1]}; keeping the read-only endpoints as they are ({keeping})",
            ),
        )
    assert leader is not None and leader_status is not None and reference_ports is not None
    position = leader_status.wal_position
    assert position is not None

    verdicts: dict[str, Verdict] = {}
    for name in sorted(pods):
        member = by_name.get(name) or MemberStatus.unknown(name, "not probed")
        verdict = classify(member, pods[name], ips.get(name), leader_status, position, spec)
        if verdict.listed is not False and slice_ports(spec, pods[name]) != reference_ports:
            verdict = Verdict(False, f"container ports differ from {leader}'s")
        verdicts[name] = verdict

    def same_pod(name: str) -> bool:
        return name in ips and listed.get(name) == str(ips[name])

    chosen = [n for n, v in verdicts.items() if v.listed is True]
    held = [n for n, v in verdicts.items() if v.listed is None and same_pod(n)]
    selected = sorted(chosen + held)
    fallback = ""
    if not selected:
        if rs.when_no_replica == "UseLeader":
            selected = [leader]
            fallback = (
                f"routing read-only traffic to the leader {leader} (whenNoReplica: UseLeader)"
            )
        elif rs.when_no_replica == "Empty":
            fallback = "the read-only endpoints are empty (whenNoReplica: Empty)"
        else:
            selected = sorted(
                n
                for n in listed
                if n in verdicts and (verdicts[n].keepable or verdicts[n].listed is None)
                if same_pod(n)
            )
            fallback = (
                f"keeping the endpoints listed before: {', '.join(selected) or 'none'} "
                "(whenNoReplica: KeepEndpoints)"
            )

    zoning = read_zones.decide(rs.traffic_distribution, [(n, pods[n].labels) for n in selected])
    children = desired_objects(
        spec,
        request.namespace,
        services=services,
        slices=slices,
        listed=[(n, pods[n], ips[n]) for n in selected],
        default_family=ips[leader].version,
        ports=reference_ports,
        keep=keep,
        zones=zoning.zones,
    )
    left_out = [f"{n} ({v.reason})" for n, v in verdicts.items() if n != leader and not v.listed]
    limit = format_bytes(rs.max_lag_bytes)
    routed, not_routed, adjective = _LEVEL_REASONS[rs.consistency]
    problem = unserved(rs.consistency, leader_status)
    if chosen:
        message = (
            f"{len(chosen)} {adjective}replica(s) within {limit} of leader {leader}: "
            f"{', '.join(chosen)}"
        )
        status, reason = "True", routed
    elif problem is not None:
        message = problem[1]
        status, reason = "False", _UNSERVED_REASONS[(rs.consistency, problem[0])]
    else:
        message = f"No {adjective}replica streams within {limit} of leader {leader}"
        status, reason = "False", not_routed
    found = None
    if rs.consistency != "lag":
        found = levels(leader_status, list(pods))
        message += f"; levels (sync_state on {leader}): {describe(found)}"
    if held:
        message += f"; kept while Patroni does not answer: {', '.join(held)}"
    if left_out:
        message += f"; left out: {', '.join(left_out)}"
    if fallback:
        message += f"; {fallback}"
    if zoning.note:
        message += f"; {zoning.note}"
    return PartPlan(
        children, _status(rs.name, selected, found), _condition(status, reason, message)
    )


PART = Part(
    name="read-only Service",
    condition=CONDITION,
    reasons=ReadOnlyReason,
    child_groups=(
        ChildGroup("Service.v1", "v1", "services", needed_by="replicaService"),
        ChildGroup(ENDPOINTSLICE_KEY, "discovery.k8s.io/v1", "endpointslices", "replicaService"),
    ),
    related_rules=related_rules,
    plan=plan,
)


def _status(
    service: str, endpoints: list[str], found: dict[str, str] | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {"replicaService": service, "replicaEndpoints": endpoints}
    if found is not None:
        status["replicaLevels"] = found
    return status


def _condition(status: str, reason: ReadOnlyReason, message: str) -> Condition:
    return Condition(CONDITION, status, reason.value, message)
