"""``kubectl pgfh status``: one cluster's state as plain data, from its CR status and Pods (pure).

This module gathers; :mod:`pgfh_plugin.render` turns the result into text, and ``-o json``
prints it as it is, so both outputs always carry the same facts.

Everything shown comes from two reads: the PostgreSQLCluster (its status is what the hook last
answered, written by Metacontroller) and the Pods its ``spec.primarySelector`` matches (phase,
readiness, IP, deletion). Without ``--lag`` nothing asks Patroni: the plugin runs with the
user's Kubernetes credentials, which reach the API server, not the pod network (``--lag`` asks
each member through the API server's pod proxy; the answers come in as ``live``).

What the status does not carry is said, not guessed:

- **Lag.** The hook never writes a lag in bytes into the status (it changes on every sync, and
  a status that changes on every sync makes Metacontroller write it on every sync). What it does
  record is which replicas the read-only Service lists; while ``ReplicasRouted`` is ``True``
  every listed replica was measured within ``spec.replicaService.maxLagBytes`` of the leader,
  so that is what the LAG column says. Otherwise it says ``?``.
- **Members.** ``status.members`` is absent before the first sync and while the spec is
  invalid; the report then lists the Pods alone and says why there is no member data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hooks.domain.members import MemberStatus
from hooks.domain.model import ZONE_LABEL, ReplicaServiceSpec, field_default
from hooks.domain.observed import PreviousMember
from hooks.loaders.previous_status import load_previous_status

LEADER_ROLES = ("primary", "master", "standby_leader")


def build(
    cluster: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]] | None,
    live: Mapping[str, MemberStatus | str] | None = None,
) -> dict[str, Any]:
    """The report of one cluster as plain JSON data (what ``-o json`` prints).

    ``pods`` is ``None`` when the Pods could not be read (their columns then say ``?``).
    ``live`` (``status --lag``) holds each member's own ``GET /patroni`` answer, or why it
    could not be had; the lag of each replica is then measured as the hook measures it: the
    leader's WAL location minus the replica's replayed location, from the same round.
    """
    meta = as_mapping(cluster.get("metadata"))
    spec = as_mapping(cluster.get("spec"))
    status = as_mapping(cluster.get("status"))
    conditions = [_condition(c) for c in _list(status.get("conditions")) if isinstance(c, dict)]
    by_type = {c["type"]: c for c in conditions}
    pods_by_name = {str(as_mapping(p.get("metadata")).get("name")): p for p in pods or ()}
    primary = _str(status.get("primary"))
    read_only = _read_only(spec, status, by_type, pods_by_name)
    within = _within_limit(read_only, by_type)
    measured = measure_lag(live) if live is not None else None

    members: list[dict[str, Any]] = []
    status_members = status.get("members")
    seen: set[str] = set()
    for entry in load_previous_status(status).members:
        seen.add(entry.name)
        members.append(
            _member(entry, pods_by_name.get(entry.name), primary, within, measured, in_status=True)
        )
    for name in sorted(set(pods_by_name) - seen):
        members.append(
            _member(
                PreviousMember(name), pods_by_name[name], primary, within, measured, in_status=False
            )
        )
    members.sort(key=lambda m: str(m["name"]))

    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    return {
        "namespace": _str(meta.get("namespace")),
        "name": _str(meta.get("name")),
        "service": _str(as_mapping(spec.get("serviceRef")).get("name")),
        "primary": primary,
        "timeline": status.get("timeline") if isinstance(status.get("timeline"), int) else None,
        "ready": by_type.get("Ready"),
        "generation": generation if isinstance(generation, int) else None,
        "observedGeneration": observed if isinstance(observed, int) else None,
        "membersAnswered": _str(status.get("membersAnswered")),
        "podsRead": pods is not None,
        "members": members,
        "membersNote": _members_note(status, status_members, by_type, pods_by_name),
        "conditions": conditions,
        "readOnly": read_only,
        "backup": _backup(spec, status),
    }


def _member(
    entry: PreviousMember,
    pod: Mapping[str, Any] | None,
    primary: str | None,
    within: tuple[int, frozenset[str]] | None,
    measured: Mapping[str, dict[str, Any]] | None,
    *,
    in_status: bool,
) -> dict[str, Any]:
    name, role = entry.name, entry.role
    lag: dict[str, Any] = {"bytes": None, "withinBytes": None, "source": None}
    if measured is not None:
        lag = measured.get(name) or {**lag, "error": "not asked: no Pod IP"}
    elif role in LEADER_ROLES:
        lag = {**lag, "source": "leader"}
    elif within is not None and name in within[1]:
        lag = {**lag, "withinBytes": within[0], "source": "ReplicasRouted"}
    return {
        "name": name,
        "primary": name == primary,
        "role": role,
        "state": entry.state,
        "timeline": entry.timeline,
        "reachable": entry.reachable,
        "reason": entry.reason,
        "lag": lag,
        "inStatus": in_status,
        "pod": _pod(pod),
    }


def measure_lag(live: Mapping[str, MemberStatus | str]) -> dict[str, dict[str, Any]]:
    """Each member's replay lag from one round of ``GET /patroni`` answers.

    The reference is the one running member that reports a leader role; with none or
    several there is no reference and no replica gets a number (the reason says why).
    """
    answers = {n: a for n, a in live.items() if isinstance(a, MemberStatus)}
    leaders = [
        a
        for a in answers.values()
        if a.role in LEADER_ROLES and a.state == "running" and a.wal_position is not None
    ]
    out: dict[str, dict[str, Any]] = {}
    for name, answer in live.items():
        entry: dict[str, Any] = {"bytes": None, "withinBytes": None, "source": "patroni"}
        if isinstance(answer, str):
            entry["error"] = answer
        elif answer.role in LEADER_ROLES:
            entry["source"] = "leader"
        elif len(leaders) != 1:
            entry["error"] = (
                "no running leader answered"
                if not leaders
                else "several members report a leader role"
            )
        elif answer.wal_position is None:
            entry["error"] = f"no replayed WAL position (role {answer.role}, state {answer.state})"
        else:
            assert leaders[0].wal_position is not None
            entry["bytes"] = max(0, leaders[0].wal_position - answer.wal_position)
        out[name] = entry
    return out


def _within_limit(
    read_only: Mapping[str, Any] | None, by_type: Mapping[str, Mapping[str, Any]]
) -> tuple[int, frozenset[str]] | None:
    """The lag bound the read-only routing proves, and the replicas it proves it for.

    ``ReplicasRouted`` is ``True`` only when the hook chose the listed replicas by their
    measured lag; under a ``whenNoReplica`` fallback it is ``False`` and proves nothing.
    """
    if read_only is None:
        return None
    routed = by_type.get("ReplicasRouted")
    limit = read_only.get("maxLagBytes")
    if routed is None or routed.get("status") != "True" or not isinstance(limit, int):
        return None
    return limit, frozenset(str(e["pod"]) for e in read_only["endpoints"])


def _pod(pod: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if pod is None:
        return None
    meta = as_mapping(pod.get("metadata"))
    status = as_mapping(pod.get("status"))
    ready = any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in _list(status.get("conditions"))
    )
    return {
        "phase": _str(status.get("phase")),
        "ready": ready,
        "ip": _str(status.get("podIP")),
        "node": _str(as_mapping(pod.get("spec")).get("nodeName")),
        "terminating": meta.get("deletionTimestamp") is not None,
    }


def _condition(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": _str(raw.get("type")) or "?",
        "status": _str(raw.get("status")) or "Unknown",
        "reason": _str(raw.get("reason")),
        "message": _str(raw.get("message")),
        "lastTransitionTime": _str(raw.get("lastTransitionTime")),
    }


def _read_only(
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    by_type: Mapping[str, Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any] | None:
    wanted = as_mapping(spec.get("replicaService"))
    name = _str(status.get("replicaService")) or _str(wanted.get("name"))
    if name is None:
        return None
    listed = [n for n in _list(status.get("replicaEndpoints")) if isinstance(n, str)]
    limit = wanted.get("maxLagBytes", field_default(ReplicaServiceSpec, "max_lag_bytes"))
    routed = by_type.get("ReplicasRouted")
    levels = as_mapping(status.get("replicaLevels"))
    distribution = _str(wanted.get("trafficDistribution"))
    found: dict[str, Any] = {
        "service": name,
        "endpoints": [_endpoint(n, pods, levels, distribution) for n in sorted(listed)],
        "maxLagBytes": limit if isinstance(limit, int) else None,
        "whenNoReplica": _str(wanted.get("whenNoReplica"))
        or field_default(ReplicaServiceSpec, "when_no_replica"),
        "consistency": _str(wanted.get("consistency"))
        or field_default(ReplicaServiceSpec, "consistency"),
        "reason": routed.get("reason") if routed else None,
    }
    if distribution is not None:
        found["trafficDistribution"] = distribution
    return found


def _endpoint(
    name: str,
    pods: Mapping[str, Mapping[str, Any]],
    levels: Mapping[str, Any],
    distribution: str | None,
) -> dict[str, Any]:
    """``{pod, ip}``, plus ``level`` (its ``sync_state`` on the leader) when the status names
    one (``consistency`` ``synchronous``/``quorum``), plus ``zone`` (its Pod's
    ``topology.kubernetes.io/zone`` label, what the hook hints it for) with
    ``trafficDistribution``: without either, the shape stays as it was."""
    entry: dict[str, Any] = {"pod": name, "ip": (_pod(pods.get(name)) or {}).get("ip")}
    level = _str(levels.get(name))
    if level is not None:
        entry["level"] = level
    if distribution is not None:
        labels = as_mapping(as_mapping(as_mapping(pods.get(name)).get("metadata")).get("labels"))
        entry["zone"] = _str(labels.get(ZONE_LABEL))
    return entry


def _backup(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any] | None:
    wanted = as_mapping(spec.get("backup"))
    seen = as_mapping(status.get("backup"))
    if not wanted and not seen:
        return None
    ok = as_mapping(seen.get("lastSuccessful"))
    failed = as_mapping(seen.get("lastFailed"))
    return {
        "cronJob": _str(seen.get("cronJob")),
        "schedule": _str(wanted.get("schedule")),
        "lastSuccessful": (
            {"job": _str(ok.get("job")), "completionTime": _str(ok.get("completionTime"))}
            if ok
            else None
        ),
        "lastFailed": (
            {
                "job": _str(failed.get("job")),
                "failureTime": _str(failed.get("failureTime")),
                "reason": _str(failed.get("reason")),
            }
            if failed
            else None
        ),
    }


def _members_note(
    status: Mapping[str, Any],
    status_members: Any,
    by_type: Mapping[str, Mapping[str, Any]],
    pods: Mapping[str, Any],
) -> str | None:
    if isinstance(status_members, list):
        missing = sorted(set(pods) - {m.get("name") for m in status_members if isinstance(m, dict)})
        if missing:
            return (
                f"not in the status yet (no sync has probed them): {', '.join(missing)}; "
                "their role, state and reachability are unknown"
            )
        return None
    if not status:
        return "the status is empty: the hook has not answered a sync for this cluster yet"
    ready = by_type.get("Ready")
    why = f" (Ready: {ready.get('reason')})" if ready and ready.get("reason") else ""
    return (
        f"the status carries no per-member data{why}: role, state, timeline and reachability "
        "are unknown; the Pods are listed as the Kubernetes API shows them"
    )


# ------------------------------------------------------------------ small helpers


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, else ``{}`` (the API's objects are free-form)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
