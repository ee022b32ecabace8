"""The decision core: from what Metacontroller observed and what Patroni said, the reply.

Everything here is a pure function of its arguments (the clock is passed in as ``now``),
so every rule can be tested with plain dicts. The rules, in the order they protect
production (see the design card):

1. A reply lists every observed child, except while the parent is being finalized:
   Metacontroller deletes whatever a reply leaves out.
2. The Service moves only to a member that Patroni itself reports as the running
   leader, when exactly one member claims leadership and the leader's Pod is
   selectable and not terminating, however many other members answered: Patroni
   answers 200 on the health path only while its own lease on the leader key in the
   DCS is valid, so the DCS lock is the quorum (see :func:`choose_leader`). Anything
   else keeps the observed selector, says why in a condition, and asks for a fast
   resync. How many members answered is reported (``MembersReachable``), not voted on.
3. The status holds nothing that changes on every sync (no probe times, no WAL
   positions), and a condition's ``lastTransitionTime`` moves only when its status
   does, so Metacontroller's status write converges instead of hot-looping.

The optional read-only Service (:mod:`hooks.replicas`) and scheduled backups
(:mod:`hooks.backup`) follow the same rules; this module only gives them their share of
the request and merges their children, status fields and conditions into the reply.
"""

from __future__ import annotations

import copy
import enum
import ipaddress
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from hooks import backup as backups
from hooks import manifests, replicas, switchover
from hooks.members import MEMBER_NAME_SINCE, MemberStatus, ProbeTarget
from hooks.model import (
    CRONJOB_KEY,
    ENDPOINTSLICE_KEY,
    LAST_APPLIED_ANNOTATION,
    POD_NAME_LABEL,
    ClusterSpec,
    ResyncTiming,
    SpecProblem,
    SyncRequest,
)
from hooks.policy import ProbePolicy, effective_address

CONDITION_READY = "Ready"
CONDITION_ROUTED = "PrimaryRouted"
CONDITION_SPEC = "SpecValid"
#: Whether every member answered as Patroni: an operator sees a degraded cluster even
#: while routing is fine. Never part of the routing decision.
CONDITION_MEMBERS = "MembersReachable"
#: Whether ``memberNameMustMatchPod`` can do its job: Patroni before 3.2.0 does not
#: report ``patroni.name``, so the guard cannot check those members.
CONDITION_NAME_GUARD = "MemberNameGuard"
#: Conditions of the optional parts, present only while the part is configured or has
#: objects; kept as they are by a finalize or an invalid-spec reply.
OPTIONAL_CONDITIONS = (replicas.CONDITION, backups.CONDITION, switchover.CONDITION)
#: Child groups that hooks.replicas and hooks.backup reply for (every other group is
#: passed through unchanged).
_PLANNED_GROUPS = frozenset({ENDPOINTSLICE_KEY, CRONJOB_KEY})


class Decision(enum.Enum):
    """Why the reply looks the way it does; the value is the condition's reason."""

    ROUTED = "LeaderFound"
    NO_MEMBERS = "NoMembers"
    NO_LEADER = "NoLeader"
    LEADER_NOT_READY = "LeaderNotReady"
    MULTIPLE_LEADERS = "MultipleLeaders"
    LEADER_TERMINATING = "LeaderTerminating"
    LEADER_NOT_SELECTABLE = "LeaderPodNotSelectable"
    MEMBER_NAME_MISMATCH = "MemberNameMismatch"
    INVALID_SPEC = "InvalidSpec"
    FINALIZING = "Finalizing"

    @property
    def degraded(self) -> bool:
        """Routing could not be confirmed: keep what is observed, look again soon."""
        return self not in (Decision.ROUTED, Decision.INVALID_SPEC, Decision.FINALIZING)


@dataclass(frozen=True, slots=True)
class SyncOutcome:
    """The reply body plus what the app needs for logs, metrics and Events."""

    body: dict[str, Any]
    decision: Decision
    message: str
    #: The pod the primary Service selected before this reply, and selects after it.
    previous_primary: str | None
    primary: str | None
    #: The Ready condition's reason before this reply (from the parent's status).
    previous_reason: str | None = None

    @property
    def transition(self) -> bool:
        """Whether the decision differs from the one the parent's status records."""
        return self.decision.value != self.previous_reason

    @property
    def primary_changed(self) -> bool:
        """Whether this reply moves the Service to another pod."""
        return self.primary != self.previous_primary and self.decision is Decision.ROUTED


# ------------------------------------------------------------------ probe planning


def apply_policy(request: SyncRequest, policy: ProbePolicy) -> SyncRequest:
    """The request as this hook's probe policy sees it: a spec it refuses is invalid.

    A Patroni port the hook does not allow, or a primarySelector that matches more Pods
    than the hook probes per request, makes the spec invalid *for this hook*: nothing is
    probed, the observed Service is kept, and the SpecValid condition says why (the
    same path as a spec the schema refuses, so there is one reply shape for "not now").
    """
    spec = request.spec
    if spec is None or request.finalizing:
        return request
    problems = []
    port = policy.port_problem(spec.patroni_port)
    if port is not None:
        problems.append(SpecProblem("spec.patroni.port", port))
    members = policy.members_problem(len(request.pods))
    if members is not None:
        problems.append(SpecProblem("spec.primarySelector", members))
    if not problems:
        return request
    return replace(request, spec=None, spec_problems=tuple(problems))


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """What to probe, and the members that are answered without a probe."""

    targets: tuple[ProbeTarget, ...] = ()
    #: Pods whose address the policy refuses: unreachable, with the reason; nothing sent.
    refused: Mapping[str, MemberStatus] = field(default_factory=dict)


def plan_probes(request: SyncRequest, policy: ProbePolicy) -> ProbePlan:
    """Which members to probe: every related Pod whose own IP the policy allows.

    Only the Pod's own IP literal is ever probed (never a hostname, never an address
    taken from an annotation), on the spec's Patroni port and health path. An address
    the policy refuses (loopback, link-local/metadata, outside the Pod networks) becomes
    an unreachable member with the reason, and no packet is sent to it.
    """
    spec = request.spec
    if spec is None or request.finalizing:
        return ProbePlan()
    targets = []
    refused: dict[str, MemberStatus] = {}
    for name in sorted(request.pods):
        ip = pod_ip(request.pods[name])
        if ip is None:
            continue
        problem = policy.address_problem(ip)
        if problem is not None:
            refused[name] = MemberStatus.unknown(name, problem)
            continue
        address = effective_address(ip)
        host = f"[{address}]" if address.version == 6 else str(address)
        url = f"{spec.patroni_scheme}://{host}:{spec.patroni_port}{spec.health_check_path}"
        targets.append(
            ProbeTarget(
                pod=name,
                url=url,
                connect_timeout=spec.connect_timeout,
                read_timeout=spec.read_timeout,
                health_path=spec.health_check_path,
                leader_roles=spec.leader_roles,
                server_name=spec.patroni_server_name,
            )
        )
    return ProbePlan(tuple(targets), refused)


def probe_targets(request: SyncRequest, policy: ProbePolicy | None = None) -> list[ProbeTarget]:
    """The targets of :func:`plan_probes` (the default policy if none is given)."""
    return list(plan_probes(request, policy or ProbePolicy()).targets)


def pod_ip(pod: Mapping[str, Any]) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The Pod's ``status.podIP`` if it is an IP literal, else ``None``."""
    status = pod.get("status")
    raw = status.get("podIP") if isinstance(status, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        ip = ipaddress.ip_address(raw)
    except ValueError:
        return None
    # A Pod IP never has an IPv6 zone, and a zone is free text: "::1%@evil.example:80#"
    # parses as an address but would put a hostname into the probe URL.
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return None
    return ip


# ------------------------------------------------------------------------ the reply


def reconcile(
    request: SyncRequest,
    probes: Mapping[str, MemberStatus],
    *,
    now: datetime,
    timing: ResyncTiming,
) -> SyncOutcome:
    """Compute the whole sync (or finalize) reply."""
    previous = _observed_primary(request)
    if request.finalizing:
        outcome = _finalize(request, previous, now)
    elif request.spec is None:
        outcome = _invalid_spec(request, previous, now, timing)
    else:
        outcome = _route(request, request.spec, probes, previous, now, timing)
    ready = next((c for c in _previous_conditions(request) if c.get("type") == CONDITION_READY), {})
    reason = ready.get("reason")
    return replace(outcome, previous_reason=reason if isinstance(reason, str) else None)


def _finalize(request: SyncRequest, previous: str | None, now: datetime) -> SyncOutcome:
    """The only reply allowed to leave children out: the parent is going away.

    ``finalized`` turns true only once nothing is observed any more. Answering it
    together with the first empty ``children`` would make Metacontroller drop its
    finalizer before deleting the Service (it then goes by garbage collection only).
    """
    remaining = len(request.services) + sum(len(g) for g in request.other_children.values())
    message = (
        f"Deleting: {remaining} child object(s) still exist"
        if remaining
        else "Deleting: all child objects are gone"
    )
    status = _previous_status(request)
    status["conditions"] = _conditions(
        request,
        now,
        [
            (CONDITION_READY, "False", Decision.FINALIZING.value, message),
            *_kept_conditions(
                request,
                (
                    CONDITION_ROUTED,
                    CONDITION_MEMBERS,
                    CONDITION_NAME_GUARD,
                    CONDITION_SPEC,
                    *OPTIONAL_CONDITIONS,
                ),
            ),
        ],
    )
    body: dict[str, Any] = {
        "status": status,
        "children": [],
        "finalized": remaining == 0,
    }
    if remaining:
        body["resyncAfterSeconds"] = 1.0
    return SyncOutcome(body, Decision.FINALIZING, message, previous, previous)


def _invalid_spec(
    request: SyncRequest, previous: str | None, now: datetime, timing: ResyncTiming
) -> SyncOutcome:
    problems = "; ".join(f"{p.field}: {p.message}" for p in request.spec_problems)
    keeping = _keeping_phrase(request)
    status = _previous_status(request)
    # Nothing is probed: no member list, and no conditions about members.
    status.pop("members", None)
    status.pop("membersAnswered", None)
    status["conditions"] = _conditions(
        request,
        now,
        [
            (CONDITION_READY, "False", Decision.INVALID_SPEC.value, f"Invalid spec: {problems}"),
            (
                CONDITION_ROUTED,
                "Unknown",
                Decision.INVALID_SPEC.value,
                f"Routing is frozen until the spec is fixed; {keeping}",
            ),
            (CONDITION_SPEC, "False", Decision.INVALID_SPEC.value, problems),
            *_kept_conditions(request, OPTIONAL_CONDITIONS),
        ],
    )
    keep = _keeper(request)
    children = [keep(obj) for obj in _observed(request)]
    body = {"status": status, "children": children, "resyncAfterSeconds": timing.healthy}
    return SyncOutcome(body, Decision.INVALID_SPEC, problems, previous, previous)


def _route(
    request: SyncRequest,
    spec: ClusterSpec,
    probes: Mapping[str, MemberStatus],
    previous: str | None,
    now: datetime,
    timing: ResyncTiming,
) -> SyncOutcome:
    members = [
        probes.get(name) or MemberStatus.unknown(name, "no pod IP") for name in sorted(request.pods)
    ]
    decision, leader, why = choose_leader(request.pods, members, spec)
    primaries = _primary_services(request)
    keep = _keeper(request)
    children: list[dict[str, Any]] = []
    if decision is Decision.ROUTED:
        assert leader is not None
        if spec.service_name not in primaries:
            children.append(desired_service(spec, request.namespace, leader))
        for name, observed in sorted(primaries.items()):
            if name == spec.service_name:
                children.append(desired_service(spec, request.namespace, leader))
            else:
                # A Service we own under an old serviceRef name: never dropped (only a
                # finalize may drop children), and never left on a stale leader.
                kept = keep(observed)
                children.append(_with_selector(kept, _selector(spec, leader)))
        primary: str | None = leader
        message = (
            f"Patroni reports {leader} as leader"
            f"{_timeline_phrase(members, leader)}; Service {spec.service_name} selects it"
        )
    else:
        children = [keep(obj) for _, obj in sorted(primaries.items())]
        primary = previous
        message = f"{why}; {_keeping_phrase(request)}"
    read_only = replicas.plan(
        spec,
        request.namespace,
        {n: s for n, s in request.services.items() if n not in primaries},
        request.other_children.get(ENDPOINTSLICE_KEY),
        request.pods,
        members,
        {n: ip for n in request.pods if (ip := pod_ip(request.pods[n])) is not None},
        leader if decision is Decision.ROUTED else None,
        keep,
    )
    previous_status = request.parent.get("status")
    backup = backups.plan(
        spec,
        request.namespace,
        request.name,
        request.uid,
        request.other_children.get(CRONJOB_KEY),
        request.jobs,
        previous_status.get("backup") if isinstance(previous_status, Mapping) else None,
        keep,
    )
    children.extend(read_only.children)
    children.extend(backup.children)
    children.extend(
        keep(obj)
        for key, group in sorted(request.other_children.items())
        if key not in _PLANNED_GROUPS
        for _, obj in sorted(group.items())
    )

    routed = decision is Decision.ROUTED
    status: dict[str, Any] = {}
    if request.generation is not None:
        status["observedGeneration"] = request.generation
    if primary is not None:
        status["primary"] = primary
    status["service"] = spec.service_name
    timeline = _leader_timeline(members, leader) if routed else _previous_timeline(request)
    if timeline is not None:
        status["timeline"] = timeline
    status["members"] = [_member_status(m) for m in members]
    status["membersAnswered"] = f"{sum(m.answered_as_patroni for m in members)}/{len(members)}"
    if read_only.service is not None:
        status["replicaService"] = read_only.service
    if read_only.endpoints is not None:
        status["replicaEndpoints"] = list(read_only.endpoints)
    if backup.status is not None:
        status["backup"] = backup.status
    # How the next event-less switchover will be seen: decided afresh from this sync's
    # Pods and probes; the labels never route (hooks.switchover).
    detection = switchover.detect(request.pods, members, leader if routed else None, spec)
    status["switchoverDetection"] = detection.detection.value
    status["conditions"] = _conditions(
        request,
        now,
        [
            (CONDITION_READY, "True" if routed else "False", decision.value, message),
            (CONDITION_ROUTED, "True" if routed else "False", decision.value, message),
            members_condition(members),
            name_guard_condition(members, spec),
            (CONDITION_SPEC, "True", "SpecAccepted", "The spec is valid"),
            *(c for c in (read_only.condition, backup.condition) if c is not None),
            detection.condition(),
        ],
    )
    body = {
        "status": status,
        "children": children,
        "resyncAfterSeconds": (
            timing.degraded
            if decision.degraded
            else switchover.healthy_resync(
                spec, timing, detection, key=request.uid or request.cluster, now=_seconds(now)
            )
        ),
    }
    return SyncOutcome(body, decision, message, previous, primary)


def _seconds(now: datetime) -> float:
    """The clock as POSIX seconds (a naive ``now`` is UTC, as in the conditions)."""
    return (now if now.tzinfo is not None else now.replace(tzinfo=UTC)).timestamp()


def choose_leader(
    pods: Mapping[str, Mapping[str, Any]],
    members: list[MemberStatus],
    spec: ClusterSpec,
) -> tuple[Decision, str | None, str]:
    """Apply the routing rules; return the decision, the leader (if routed) and why.

    How many members answered does not matter: a member answers 200 on the health path
    only while Patroni's ``Ha.is_leader()`` holds (``patroni/api.py``, ``do_GET``), and that
    is true only until the expiry Patroni set from the DCS TTL when it last wrote the
    leader key (``patroni/ha.py``, ``is_leader`` / ``set_is_leader``). A leader that lost
    the DCS stops answering 200 before the key can expire and another member can take
    it. So a single 200 is a lock holder, and a member the hook cannot reach adds no
    doubt that Patroni has not already resolved. (The exception, Patroni's maintenance
    ``pause`` with the DCS unreachable, is where Patroni itself trusts the running role.)
    Two 200s at once (a stale or forged answer) keep the Service where it is.
    """
    path = spec.health_check_path
    if not members:
        return Decision.NO_MEMBERS, None, f"No Pod matches primarySelector {_labels(spec)}"
    claimants = [m for m in members if m.claims_leadership]
    answered = [m for m in members if m.reachable]
    if len(claimants) > 1:
        names = ", ".join(m.name for m in claimants)
        return Decision.MULTIPLE_LEADERS, None, f"Several members answer 200 on {path}: {names}"
    if not claimants:
        unreachable = _unreachable_phrase(members)
        return (
            Decision.NO_LEADER,
            None,
            f"No member answers 200 on {path} ({len(answered)} of {len(members)} answered"
            f"{unreachable})",
        )
    claimant = claimants[0]
    if not claimant.is_leader:
        return (
            Decision.LEADER_NOT_READY,
            None,
            f"{claimant.name} holds the leader lock but reports role={claimant.role}, "
            f"state={claimant.state}",
        )
    if (
        spec.verify_member_name
        and claimant.patroni_name is not None
        and claimant.patroni_name != claimant.name
    ):
        # The pod's IP answered as another member: a stale or reused IP. Never route on it.
        return (
            Decision.MEMBER_NAME_MISMATCH,
            None,
            f"Pod {claimant.name}'s IP answers as Patroni member {claimant.patroni_name!r}",
        )
    pod = pods[claimant.name]
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    if metadata.get("deletionTimestamp"):
        return (
            Decision.LEADER_TERMINATING,
            None,
            f"Leader {claimant.name} is terminating; waiting for Patroni to elect another",
        )
    labels = metadata.get("labels") if isinstance(metadata.get("labels"), Mapping) else {}
    assert isinstance(labels, Mapping)
    wanted = {**spec.primary_selector, POD_NAME_LABEL: claimant.name}
    missing = sorted(k for k, v in wanted.items() if labels.get(k) != v)
    if missing:
        return (
            Decision.LEADER_NOT_SELECTABLE,
            None,
            f"Leader {claimant.name} lacks the label(s) {', '.join(missing)} that the "
            f"Service selector needs",
        )
    return Decision.ROUTED, claimant.name, ""


# ------------------------------------------------------------------- child objects


def desired_service(spec: ClusterSpec, namespace: str, leader: str) -> dict[str, Any]:
    """The primary Service, as we want it, with only the fields we own."""
    return manifests.service(
        spec.service_name,
        namespace,
        labels=spec.service_labels,
        annotations=spec.service_annotations,
        service_type=spec.service_type,
        ports=spec.service_ports,
        selector=_selector(spec, leader),
    )


def preserved(
    observed: Mapping[str, Any],
    *,
    gvk: tuple[str, str] | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """An observed child, as a desired object that changes nothing when applied.

    The base is what we last asked for (Metacontroller records it in the
    last-applied annotation), so the three-way merge is a no-op. The Service's
    selector is taken from the observed object itself, so even a selector someone
    edited by hand is kept exactly as it is while we are in doubt.

    ``gvk`` (apiVersion, kind) and ``namespace`` are what the object *is*: the
    ``children`` group it was observed in and the parent's namespace. They win over
    whatever the object or its last-applied record says, because Metacontroller
    matches a reply's children to the observed ones by exactly these (plus the name),
    and deletes every observed child that no reply child matches. Nor does a Service
    ever carry fields the API server allocates (``clusterIP`` ...), whichever record
    it was rebuilt from.
    """
    base = _last_applied(observed)
    if base is None:
        base = _minimal_copy(observed)
    if gvk is not None:
        base["apiVersion"], base["kind"] = gvk
    if namespace is not None:
        base["metadata"]["namespace"] = namespace
    if base.get("kind") == "Service":
        spec = observed.get("spec") if isinstance(observed.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        selector = spec.get("selector")
        base_spec = base.get("spec")
        base_spec = _without_server_fields(base_spec if isinstance(base_spec, dict) else {})
        base["spec"] = base_spec
        if isinstance(selector, Mapping) and selector:
            base_spec["selector"] = dict(selector)
        else:
            base_spec.pop("selector", None)
    return base


#: The GVK of the ``Service.v1`` group.
SERVICE_GVK = ("v1", "Service")


def group_gvk(group: str) -> tuple[str, str] | None:
    """``(apiVersion, kind)`` of a ``children`` key: ``Service.v1``, ``Deployment.apps/v1``."""
    kind, dot, api_version = group.partition(".")
    return (api_version, kind) if dot and kind and api_version else None


def _keeper(request: SyncRequest) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """:func:`preserved` for this request's observed children, each as what it *is*.

    An observed object is recognised by identity (hooks.replicas and hooks.backup get
    the request's own objects and hand them back through this function): its GVK is its
    ``children`` group's, its namespace the parent's.
    """
    gvks: dict[int, tuple[str, str] | None] = {
        id(obj): SERVICE_GVK for obj in request.services.values()
    }
    for key, group in request.other_children.items():
        gvk = group_gvk(key)
        for obj in group.values():
            gvks[id(obj)] = gvk

    def keep(observed: Mapping[str, Any]) -> dict[str, Any]:
        return preserved(observed, gvk=gvks.get(id(observed)), namespace=request.namespace)

    return keep


def _last_applied(observed: Mapping[str, Any]) -> dict[str, Any] | None:
    metadata = observed.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    raw = annotations.get(LAST_APPLIED_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        applied = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(applied, dict) or not isinstance(applied.get("metadata"), dict):
        return None
    if not isinstance(applied.get("spec", {}), dict):
        return None
    assert isinstance(metadata, Mapping)
    same = all(applied.get(key) == observed.get(key) for key in ("apiVersion", "kind")) and applied[
        "metadata"
    ].get("name") == metadata.get("name")
    return applied if same else None


#: Metadata the API server owns; echoing it back would be wrong or rejected.
_SERVER_METADATA = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "ownerReferences",
        "selfLink",
        "finalizers",
    }
)
#: Service spec fields the API server allocates or defaults.
_SERVER_SERVICE_SPEC = frozenset(
    {
        "clusterIP",
        "clusterIPs",
        "ipFamilies",
        "ipFamilyPolicy",
        "internalTrafficPolicy",
        "sessionAffinity",
        "healthCheckNodePort",
    }
)


def _minimal_copy(observed: Mapping[str, Any]) -> dict[str, Any]:
    """Without a last-applied record: the observed object minus server-owned fields."""
    result = {k: copy.deepcopy(v) for k, v in observed.items() if k != "status"}
    observed_metadata = observed.get("metadata")
    metadata = {
        k: copy.deepcopy(v)
        for k, v in (observed_metadata.items() if isinstance(observed_metadata, Mapping) else ())
        if k not in _SERVER_METADATA
    }
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(LAST_APPLIED_ANNOTATION, None)
        annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
        if not annotations:
            metadata.pop("annotations")
    result["metadata"] = metadata
    if observed.get("kind") == "Service" and isinstance(result.get("spec"), dict):
        result["spec"] = _without_server_fields(result["spec"])
    return result


def _without_server_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A Service spec without what the API server allocates or defaults."""
    result = {k: v for k, v in spec.items() if k not in _SERVER_SERVICE_SPEC}
    ports = result.get("ports")
    if isinstance(ports, list):
        result["ports"] = [
            {k: v for k, v in port.items() if k != "nodePort"}
            for port in ports
            if isinstance(port, dict)
        ]
    return result


def _with_selector(service: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    service.setdefault("spec", {})["selector"] = selector
    return service


def _selector(spec: ClusterSpec, leader: str) -> dict[str, str]:
    return {**spec.primary_selector, POD_NAME_LABEL: leader}


# -------------------------------------------------------------------------- status


def _conditions(
    request: SyncRequest,
    now: datetime,
    wanted: Iterable[tuple[str, str, str, str]],
) -> list[dict[str, Any]]:
    """Conditions with a ``lastTransitionTime`` that moves only when ``status`` moves."""
    previous = {c.get("type"): c for c in _previous_conditions(request)}
    aware = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    stamp = aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = []
    for type_, status, reason, message in wanted:
        old = previous.get(type_)
        transition = stamp
        kept = old.get("lastTransitionTime") if old is not None else None
        if old is not None and old.get("status") == status and isinstance(kept, str) and kept:
            transition = kept
        condition: dict[str, Any] = {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": transition,
        }
        if request.generation is not None:
            condition["observedGeneration"] = request.generation
        result.append(condition)
    return result


def _kept_conditions(request: SyncRequest, types: Iterable[str]) -> list[tuple[str, str, str, str]]:
    previous = {c.get("type"): c for c in _previous_conditions(request)}
    kept = []
    for type_ in types:
        old = previous.get(type_)
        if old is not None and isinstance(old.get("status"), str):
            kept.append(
                (type_, old["status"], str(old.get("reason", "")), str(old.get("message", "")))
            )
    return kept


def _previous_status(request: SyncRequest) -> dict[str, Any]:
    status = request.parent.get("status")
    result = copy.deepcopy(dict(status)) if isinstance(status, Mapping) else {}
    if request.generation is not None:
        result["observedGeneration"] = request.generation
    return result


def _previous_conditions(request: SyncRequest) -> list[Mapping[str, Any]]:
    """The parent's conditions that have a string ``type`` (the status is free input:
    anyone with write access to the status subresource can put anything there)."""
    status = request.parent.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return []
    return [c for c in conditions if isinstance(c, Mapping) and isinstance(c.get("type"), str)]


def _previous_timeline(request: SyncRequest) -> int | None:
    status = request.parent.get("status")
    value = status.get("timeline") if isinstance(status, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _member_status(member: MemberStatus) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": member.name, "reachable": member.reachable}
    if not member.answered_as_patroni:
        entry["reason"] = member.reason
    if member.role is not None:
        entry["role"] = member.role
    if member.state is not None:
        entry["state"] = member.state
    if member.timeline is not None:
        entry["timeline"] = member.timeline
    return entry


def _leader_timeline(members: list[MemberStatus], leader: str | None) -> int | None:
    return next((m.timeline for m in members if m.name == leader), None)


def _timeline_phrase(members: list[MemberStatus], leader: str) -> str:
    timeline = _leader_timeline(members, leader)
    return f" (timeline {timeline})" if timeline is not None else ""


def members_condition(members: list[MemberStatus]) -> tuple[str, str, str, str]:
    """``MembersReachable``: how many members answered as Patroni, and who did not.

    Stable: names and the probe's stable reasons only (no latencies), so the status
    converges while the same members stay down.
    """
    if not members:
        return (CONDITION_MEMBERS, "Unknown", Decision.NO_MEMBERS.value, "No member to probe")
    silent = [f"{m.name} ({m.reason})" for m in members if not m.reachable]
    foreign = [f"{m.name} ({m.reason})" for m in members if m.reachable and not m.patroni_answer]
    answered = len(members) - len(silent) - len(foreign)
    if not silent and not foreign:
        return (
            CONDITION_MEMBERS,
            "True",
            "AllMembersAnswered",
            f"All {len(members)} member(s) answered as Patroni",
        )
    parts = [f"{answered} of {len(members)} member(s) answered as Patroni"]
    if silent:
        parts.append(f"no answer from {', '.join(silent)}")
    if foreign:
        parts.append(f"not a Patroni answer from {', '.join(foreign)}")
    return (CONDITION_MEMBERS, "False", "MembersUnreachable", "; ".join(parts))


def name_guard_condition(
    members: list[MemberStatus], spec: ClusterSpec
) -> tuple[str, str, str, str]:
    """``MemberNameGuard``: whether ``memberNameMustMatchPod`` can check the members.

    Patroni before 3.2.0 sends no ``patroni.name`` (it came with patroni#2846), so the
    guard cannot tell a reused Pod IP from the member itself. That is said here plainly,
    per member and version, instead of routing as if the guard were on.
    """
    if not spec.verify_member_name:
        return (
            CONDITION_NAME_GUARD,
            "False",
            "Disabled",
            "spec.patroni.memberNameMustMatchPod is false: Patroni member names are not checked",
        )
    patroni = [m for m in members if m.answered_as_patroni]
    if not patroni:
        return (CONDITION_NAME_GUARD, "Unknown", "NoAnswers", "No member answered as Patroni")
    nameless: dict[str, list[str]] = {}
    for member in patroni:
        if member.patroni_name is None:
            nameless.setdefault(member.version_text, []).append(member.name)
    if not nameless:
        return (
            CONDITION_NAME_GUARD,
            "True",
            "Active",
            "Every member that answered reports its Patroni name; a leader whose name is "
            "not its Pod's is never routed to",
        )
    groups = "; ".join(f"{v} on {', '.join(names)}" for v, names in sorted(nameless.items()))
    return (
        CONDITION_NAME_GUARD,
        "False",
        "Unavailable",
        f"No patroni.name in the answer ({groups}; Patroni reports it since "
        f"{'.'.join(map(str, MEMBER_NAME_SINCE))}): memberNameMustMatchPod cannot check "
        "these members",
    )


def _unreachable_phrase(members: list[MemberStatus]) -> str:
    lost = [f"{m.name}: {m.reason}" for m in members if not m.reachable]
    foreign = [f"{m.name}: {m.reason}" for m in members if m.reachable and not m.patroni_answer]
    phrase = f"; unreachable: {'; '.join(lost)}" if lost else ""
    return phrase + (f"; not Patroni: {'; '.join(foreign)}" if foreign else "")


def _labels(spec: ClusterSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(spec.primary_selector.items()))


# ------------------------------------------------------------------ observed state


def _observed(request: SyncRequest) -> list[Mapping[str, Any]]:
    objects = [obj for _, obj in sorted(request.services.items())]
    objects.extend(obj for group in _other_groups(request) for obj in group)
    return objects


def _other_groups(request: SyncRequest) -> list[list[Mapping[str, Any]]]:
    return [
        [obj for _, obj in sorted(group.items())]
        for _, group in sorted(request.other_children.items())
    ]


def _observed_primary(request: SyncRequest) -> str | None:
    """The pod the primary Service selects now, if any."""
    name = request.spec.service_name if request.spec is not None else ""
    primaries = _primary_services(request)
    candidates = [primaries[name]] if name in primaries else []
    if not candidates:
        candidates = [obj for _, obj in sorted(primaries.items())]
    for service in candidates:
        spec = service.get("spec")
        selector = spec.get("selector") if isinstance(spec, Mapping) else None
        if isinstance(selector, Mapping) and isinstance(selector.get(POD_NAME_LABEL), str):
            return str(selector[POD_NAME_LABEL])
    return None


def _primary_services(request: SyncRequest) -> dict[str, Mapping[str, Any]]:
    """Observed Services that route to the primary: all but our read-only Services.

    The names in the spec decide first: the one named like ``spec.serviceRef`` is the
    primary's and the one named like ``spec.replicaService`` is not, whatever they were
    before a change of the spec swapped the names; the others go by their label.
    """
    spec = request.spec
    primary = spec.service_name if spec is not None else None
    read_only = spec.replica_service.name if spec and spec.replica_service else None
    return {
        name: service
        for name, service in request.services.items()
        if name == primary or (name != read_only and not replicas.is_read_only_service(service))
    }


def _keeping_phrase(request: SyncRequest) -> str:
    primaries = _primary_services(request)
    if not primaries:
        return "no Service is created until a leader is confirmed"
    parts = []
    for name, service in sorted(primaries.items()):
        spec = service.get("spec")
        selector = spec.get("selector") if isinstance(spec, Mapping) else None
        target = selector.get(POD_NAME_LABEL) if isinstance(selector, Mapping) else None
        parts.append(f"Service {name} on {target}" if target else f"Service {name} as it is")
    return "keeping " + ", ".join(parts)
