"""The read-only Service: a selector-less Service plus the EndpointSlice(s) the hook writes.

Pure, like :mod:`hooks.sync` (which calls :func:`plan` once per sync): everything is a
function of the request, the probe answers of this round and the confirmed leader.

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
member whose Pod is not terminating, that answers as itself (``patroni.name`` is the pod's
name when ``memberNameMustMatchPod``, same ``patroni.scope`` as the leader), reports
``role: replica``, ``state: running``, ``replication_state: streaming``, a replayed location,
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

**Stable status:** names, reasons and the limit only; never a lag in bytes, which moves on
every sync and would make Metacontroller write the status again and again.
"""

from __future__ import annotations

import enum
import ipaddress
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hooks import manifests
from hooks.members import REPLICATION_STATE_SINCE, MemberStatus
from hooks.model import (
    LAST_APPLIED_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    READ_ONLY,
    READ_ONLY_LABEL,
    SERVICE_NAME_LABEL,
    SLICE_MANAGED_BY_LABEL,
    SLICE_MANAGER,
    ClusterSpec,
    ReplicaServiceSpec,
)

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

CONDITION = "ReplicasRouted"


class Reason(enum.Enum):
    """The ``ReplicasRouted`` condition's reason."""

    ROUTED = "ReplicasWithinLag"
    NO_REPLICA = "NoReplicaWithinLag"
    NO_LEADER = "LeaderNotConfirmed"
    NO_LEADER_POSITION = "LeaderPositionUnknown"
    PORT_NOT_FOUND = "NamedPortNotFound"
    NOT_DECLARED = "EndpointSlicesNotDeclared"
    REMOVED = "ReplicaServiceRemoved"


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """The read-only part of a sync reply."""

    children: list[dict[str, Any]]
    #: ``status.replicaService`` / ``status.replicaEndpoints`` (``None``: leave out).
    service: str | None = None
    endpoints: tuple[str, ...] | None = None
    #: ``(type, status, reason, message)`` for ``ReplicasRouted``, or ``None``.
    condition: tuple[str, str, str, str] | None = None


@dataclass(frozen=True, slots=True)
class _Verdict:
    #: True: qualifies; None: in doubt (unreachable); False: left out.
    listed: bool | None
    reason: str = ""
    #: Whether ``KeepEndpoints`` may keep it listed when nobody qualifies.
    keepable: bool = False


# ------------------------------------------------------------------ classification


def is_read_only_service(service: Mapping[str, Any]) -> bool:
    """Whether an observed Service is one of our read-only Services (by its label)."""
    for labels in (_labels(service), _labels(_applied(service))):
        if labels.get(READ_ONLY_LABEL) == READ_ONLY:
            return True
    return False


def classify(
    name: str,
    member: MemberStatus,
    pod: Mapping[str, Any],
    ip: IP | None,
    leader: MemberStatus,
    leader_position: int,
    max_lag: int,
    verify_name: bool,
    include_paused: bool = False,
) -> _Verdict:
    """Whether one member may be listed, and if not, why (a stable phrase)."""
    if name == leader.name:
        return _Verdict(False, "leader")
    if _metadata(pod).get("deletionTimestamp"):
        return _Verdict(False, "terminating")
    if ip is None:
        return _Verdict(False, "no pod IP")
    if not member.reachable:
        if _pod_not_ready(pod):
            return _Verdict(False, "unreachable, Pod not ready")
        return _Verdict(None, "unreachable")
    if not member.patroni_answer:
        return _Verdict(False, "not a Patroni answer")
    if verify_name and member.patroni_name is not None and member.patroni_name != name:
        return _Verdict(False, f"answers as Patroni member {member.patroni_name}")
    if (
        member.patroni_scope is not None
        and leader.patroni_scope is not None
        and member.patroni_scope != leader.patroni_scope
    ):
        return _Verdict(False, f"member of Patroni scope {member.patroni_scope}")
    if member.claims_leadership or member.role != "replica":
        return _Verdict(False, f"role {member.role or 'unknown'}")
    if member.state != "running":
        return _Verdict(False, f"state {member.state or 'unknown'}")
    if member.noloadbalance:
        return _Verdict(False, "tagged noloadbalance")
    if member.replication_state is None and member.older_than(REPLICATION_STATE_SINCE):
        since = ".".join(map(str, REPLICATION_STATE_SINCE))
        return _Verdict(
            False, f"{member.version_text} reports no replication_state (since {since})", True
        )
    if member.replication_state != "streaming":
        return _Verdict(False, f"not streaming ({member.replication_state or 'unknown'})", True)
    if member.wal_position is None:
        return _Verdict(False, "no replayed WAL position", True)
    if member.replay_paused and not include_paused:
        return _Verdict(False, "replay paused")
    if leader_position - member.wal_position > max_lag:
        return _Verdict(False, f"replay lags more than {format_bytes(max_lag)}", True)
    return _Verdict(True)


def format_bytes(value: int) -> str:
    """``16777216`` → ``16 MiB``: exact, so the phrase never changes between syncs."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"


# -------------------------------------------------------------------------- plan


def plan(
    spec: ClusterSpec,
    namespace: str,
    services: Mapping[str, Mapping[str, Any]],
    slices: Mapping[str, Mapping[str, Any]] | None,
    pods: Mapping[str, Mapping[str, Any]],
    members: Sequence[MemberStatus],
    ips: Mapping[str, IP],
    leader: str | None,
    preserve: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> ReplicaPlan:
    """The read-only children and status of one sync.

    :param services: the observed read-only Services (:func:`is_read_only_service`) by name,
        without the one named like the primary Service (that one is the primary's).
    :param slices: the observed EndpointSlice children, by name; ``None`` when the request
        has no EndpointSlice group (the CompositeController does not declare the type).
    :param members: one answer per related Pod (unreachable ones included).
    :param ips: the Pods' IPs (only Pods that have one).
    :param leader: the leader Patroni confirmed in this round, ``None`` in doubt.
    :param preserve: :func:`hooks.sync.preserved` (an observed child, changing nothing).
    """
    rs = spec.replica_service
    observed = [preserve(s) for _, s in sorted(services.items())]
    observed += [preserve(s) for _, s in sorted((slices or {}).items())]
    if rs is None:
        if not observed:
            return ReplicaPlan([])
        names = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in observed)
        return ReplicaPlan(
            observed,
            condition=(
                CONDITION,
                "False",
                Reason.REMOVED.value,
                f"spec.replicaService is not set; keeping {names} as they are until they are "
                "deleted by hand or with the PostgreSQLCluster",
            ),
        )
    if slices is None:
        return ReplicaPlan(
            observed,
            service=rs.name,
            condition=(
                CONDITION,
                "False",
                Reason.NOT_DECLARED.value,
                "The CompositeController does not declare discovery.k8s.io/v1 endpointslices "
                "as a child resource; apply metacontroller/compositecontroller.yaml",
            ),
        )
    listed_now = _listed(slices, rs.name)
    by_name = {m.name: m for m in members}
    leader_status = by_name.get(leader) if leader is not None else None
    doubt: tuple[Reason, str] | None = None
    if leader is None or leader_status is None or leader not in ips:
        doubt = (Reason.NO_LEADER, "No leader is confirmed, so replica lag cannot be computed")
    elif leader_status.wal_position is None:
        doubt = (Reason.NO_LEADER_POSITION, f"Leader {leader} reported no WAL location")
    reference_ports = _slice_ports(spec, pods.get(leader, {})) if leader is not None else None
    if doubt is None and reference_ports is None:
        doubt = (
            Reason.PORT_NOT_FOUND,
            f"A named targetPort of spec.service.ports is not a container port of {leader}",
        )
    if doubt is not None:
        keeping = ", ".join(sorted(listed_now)) or "none"
        return ReplicaPlan(
            observed,
            service=rs.name,
            endpoints=tuple(sorted(listed_now)),
            condition=(
                CONDITION,
                "False",
                doubt[0].value,
                f"{doubt[1]}; keeping the read-only endpoints as they are ({keeping})",
            ),
        )
    assert leader is not None and leader_status is not None and reference_ports is not None
    position = leader_status.wal_position
    assert position is not None

    verdicts: dict[str, _Verdict] = {}
    for name in sorted(pods):
        member = by_name.get(name) or MemberStatus.unknown(name, "not probed")
        verdict = classify(
            name,
            member,
            pods[name],
            ips.get(name),
            leader_status,
            position,
            rs.max_lag_bytes,
            spec.verify_member_name,
            rs.include_paused_replicas,
        )
        if verdict.listed is not False and _slice_ports(spec, pods[name]) != reference_ports:
            verdict = _Verdict(False, f"container ports differ from {leader}'s")
        verdicts[name] = verdict

    def same_pod(name: str) -> bool:
        return name in ips and listed_now.get(name) == str(ips[name])

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
                for n in listed_now
                if n in verdicts and (verdicts[n].keepable or verdicts[n].listed is None)
                if same_pod(n)
            )
            fallback = (
                f"keeping the endpoints listed before: {', '.join(selected) or 'none'} "
                "(whenNoReplica: KeepEndpoints)"
            )

    children = _desired_objects(
        spec, rs, namespace, services, slices, pods, ips, selected, leader, preserve
    )
    children += [preserve(s) for _, s in sorted(slices.items()) if not _ours(s, services, rs, spec)]

    left_out = [f"{n} ({v.reason})" for n, v in verdicts.items() if n != leader and not v.listed]
    limit = format_bytes(rs.max_lag_bytes)
    if chosen:
        message = f"{len(chosen)} replica(s) within {limit} of leader {leader}: {', '.join(chosen)}"
        status, reason = "True", Reason.ROUTED
    else:
        message = f"No replica streams within {limit} of leader {leader}"
        status, reason = "False", Reason.NO_REPLICA
    if held:
        message += f"; kept while Patroni does not answer: {', '.join(held)}"
    if left_out:
        message += f"; left out: {', '.join(left_out)}"
    if fallback:
        message += f"; {fallback}"
    return ReplicaPlan(
        children,
        service=rs.name,
        endpoints=tuple(selected),
        condition=(CONDITION, status, reason.value, message),
    )


# ------------------------------------------------------------------ child objects


def desired_service(
    spec: ClusterSpec, rs: ReplicaServiceSpec, namespace: str, name: str
) -> dict[str, Any]:
    """A read-only Service: the primary Service's ports, and no selector (we write its slices)."""
    return manifests.service(
        name,
        namespace,
        labels={**rs.labels, READ_ONLY_LABEL: READ_ONLY},
        annotations=rs.annotations,
        service_type=rs.service_type,
        ports=spec.service_ports,
    )


def slice_name(service: str, family: int) -> str:
    """``<service>-ipv4`` / ``<service>-ipv6``: one slice per address family (addressType is
    immutable, so a family never moves to another slice)."""
    return f"{service}-ipv{family}"


def desired_slice(
    namespace: str,
    service: str,
    family: int,
    endpoints: list[dict[str, Any]],
    ports: list[dict[str, Any]],
) -> dict[str, Any]:
    """One EndpointSlice of a read-only Service.

    No endpoints are written as ``null``, not ``[]``: that is how the API server returns an
    empty slice (kubernetes/kubernetes#135968), and Metacontroller compares our object with
    what it observes; ``[]`` would make it PUT the slice again on every sync.
    """
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(service, family),
            "namespace": namespace,
            "labels": {
                SERVICE_NAME_LABEL: service,
                SLICE_MANAGED_BY_LABEL: SLICE_MANAGER,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
        },
        "addressType": f"IPv{family}",
        "endpoints": endpoints or None,
        "ports": ports,
    }


def endpoint(name: str, pod: Mapping[str, Any], ip: IP, namespace: str) -> dict[str, Any]:
    """One listed member: its Pod IP and a reference to its Pod."""
    metadata = _metadata(pod)
    target: dict[str, Any] = {"kind": "Pod", "namespace": namespace, "name": name}
    if isinstance(metadata.get("uid"), str):
        target["uid"] = metadata["uid"]
    entry: dict[str, Any] = {
        "addresses": [str(ip)],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": target,
    }
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if isinstance(node, str) and node:
        entry["nodeName"] = node
    return entry


def _desired_objects(
    spec: ClusterSpec,
    rs: ReplicaServiceSpec,
    namespace: str,
    services: Mapping[str, Mapping[str, Any]],
    slices: Mapping[str, Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]],
    ips: Mapping[str, IP],
    selected: list[str],
    leader: str,
    preserve: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> list[dict[str, Any]]:
    ports = _slice_ports(spec, pods[leader]) or []
    by_family: dict[int, list[dict[str, Any]]] = {}
    for name in selected:
        ip = ips[name]
        by_family.setdefault(ip.version, []).append(endpoint(name, pods[name], ip, namespace))
    names = sorted({rs.name, *services} - {spec.service_name})
    objects: list[dict[str, Any]] = []
    for service in names:
        objects.append(desired_service(spec, rs, namespace, service))
        families = set(by_family)
        for family in (4, 6):
            if slice_name(service, family) in slices:
                families.add(family)
        if not families:
            families.add(ips[leader].version)
        for family in sorted(families):
            objects.append(
                desired_slice(namespace, service, family, by_family.get(family, []), ports)
            )
        # Any other slice of ours for this Service is emptied, never dropped.
        for name, observed in sorted(slices.items()):
            if _service_of(observed) == service and name not in {
                slice_name(service, f) for f in families
            }:
                objects.append(_emptied(preserve(observed)))
    # A slice of ours labelled for the primary Service (after a rename swapped the names)
    # would add replicas to the primary's endpoints: empty it.
    for _, observed in sorted(slices.items()):
        if _service_of(observed) == spec.service_name and _managed_by_us(observed):
            objects.append(_emptied(preserve(observed)))
    return objects


def _ours(
    observed: Mapping[str, Any],
    services: Mapping[str, Mapping[str, Any]],
    rs: ReplicaServiceSpec,
    spec: ClusterSpec,
) -> bool:
    """Whether :func:`_desired_objects` emits (a version of) this observed slice."""
    service = _service_of(observed)
    names = {rs.name, *services} - {spec.service_name}
    if service in names:
        return True
    return service == spec.service_name and _managed_by_us(observed)


def _emptied(preserved: dict[str, Any]) -> dict[str, Any]:
    """A slice kept (never dropped) but listing nobody."""
    preserved["endpoints"] = None
    return preserved


def _slice_ports(spec: ClusterSpec, pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The slice's ports: one per Service port, named like it, with the Pod's port number.

    A named ``targetPort`` is resolved in the Pod's container ports (an EndpointSlice
    carries numbers); ``None`` if it is not there.
    """
    declared: dict[str, int] = {}
    pod_spec = pod.get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    for container in containers if isinstance(containers, list) else []:
        container_ports = container.get("ports") if isinstance(container, Mapping) else None
        for port in container_ports if isinstance(container_ports, list) else []:
            if isinstance(port, Mapping) and isinstance(port.get("name"), str):
                number = port.get("containerPort")
                if isinstance(number, int) and not isinstance(number, bool):
                    declared.setdefault(port["name"], number)
    result = []
    for port in spec.service_ports:
        target = port.target_port
        number = target if isinstance(target, int) else declared.get(target)
        if number is None:
            return None
        result.append({"name": port.name, "port": number, "protocol": port.protocol})
    return result


# ----------------------------------------------------------------- observed state


def _listed(slices: Mapping[str, Mapping[str, Any]], service: str) -> dict[str, str]:
    """Pod name → address of every endpoint our slices of ``service`` list now."""
    listed: dict[str, str] = {}
    for _, observed in sorted(slices.items()):
        if _service_of(observed) != service:
            continue
        endpoints = observed.get("endpoints")
        for entry in endpoints if isinstance(endpoints, list) else []:
            if not isinstance(entry, Mapping):
                continue
            target = entry.get("targetRef")
            addresses = entry.get("addresses")
            if (
                isinstance(target, Mapping)
                and target.get("kind") == "Pod"
                and isinstance(target.get("name"), str)
                and isinstance(addresses, list)
                and addresses
                and isinstance(addresses[0], str)
            ):
                listed.setdefault(target["name"], addresses[0])
    return listed


def _service_of(observed: Mapping[str, Any]) -> str | None:
    value = _labels(observed).get(SERVICE_NAME_LABEL)
    return value if isinstance(value, str) else None


def _managed_by_us(observed: Mapping[str, Any]) -> bool:
    return _labels(observed).get(SLICE_MANAGED_BY_LABEL) == SLICE_MANAGER


def _pod_not_ready(pod: Mapping[str, Any]) -> bool:
    """The kubelet says the Pod is not Ready (an absent condition is not a "no")."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "False"
    return False


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    labels = _metadata(obj or {}).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _applied(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    annotations = _metadata(obj).get("annotations")
    raw = annotations.get(LAST_APPLIED_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        applied = json.loads(raw)
    except ValueError:
        return None
    return applied if isinstance(applied, Mapping) else None
