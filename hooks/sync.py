"""The decision core: from what Metacontroller observed and what Patroni said, the reply.

Everything here is a pure function of its arguments (the clock is passed in as ``now``),
so every rule can be tested with plain dicts. The rules, in the order they protect
production (see the design card):

1. A reply lists every observed child, except while the parent is being finalized:
   Metacontroller deletes whatever a reply leaves out (:mod:`hooks.core.keeping`).
2. The Service moves only to a member that Patroni itself reports as the running
   leader, when exactly one member claims leadership and the leader's Pod is
   selectable and not terminating (:func:`hooks.core.routing.choose_leader`). Anything
   else keeps the observed selector, says why in a condition, and asks for a fast
   resync. How many members answered is reported (``MembersReachable``), not voted on.
3. The status holds nothing that changes on every sync (no probe times, no WAL
   positions), and a condition's ``lastTransitionTime`` moves only when its status
   does (:func:`hooks.core.conditions.stamped`), so Metacontroller's status write converges.

What the reply holds besides the hook's own status comes from the child parts
(:mod:`hooks.children`): the primary Service, the read-only Service, the backup CronJob.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hooks import children as registry
from hooks.children.base import PartContext
from hooks.children.primary import keeping_phrase, observed_primary
from hooks.core import switchover
from hooks.core.conditions import (
    CONDITION_MEMBERS,
    CONDITION_NAME_GUARD,
    CONDITION_READY,
    CONDITION_ROUTED,
    CONDITION_SPEC,
    SPEC_ACCEPTED,
    SpecReason,
    kept,
    member_conditions,
    stamped,
)
from hooks.core.keeping import Keep, preserved
from hooks.core.outcome import SyncOutcome
from hooks.core.routing import Decision, Route, choose_leader
from hooks.domain.members import MemberStatus
from hooks.domain.model import ClusterSpec, Condition, ResyncTiming
from hooks.domain.request import SyncRequest


def reconcile(
    request: SyncRequest,
    probes: Mapping[str, MemberStatus],
    *,
    now: datetime,
    timing: ResyncTiming,
) -> SyncOutcome:
    """Compute the whole sync (or finalize) reply."""
    if request.finalizing:
        outcome = _finalize(request, now)
    elif request.spec is None:
        outcome = _invalid_spec(request, now, timing)
    else:
        outcome = _route(request, request.spec, probes, now, timing)
    ready = request.previous.ready
    return replace(outcome, previous_reason=ready.reason if ready is not None else None)


def _route(
    request: SyncRequest,
    spec: ClusterSpec,
    probes: Mapping[str, MemberStatus],
    now: datetime,
    timing: ResyncTiming,
) -> SyncOutcome:
    """A valid spec: decide the route, let every part plan, merge their replies."""
    # One answer per related Pod, by name: its probe's, else unreachable ("no pod IP").
    members = tuple(
        probes.get(name) or MemberStatus.unknown(name, "no pod IP") for name in sorted(request.pods)
    )
    route = choose_leader(request.pods, members, spec)
    keep: Keep = functools.partial(preserved, namespace=request.namespace)
    context = PartContext(request, spec, members, route, keep)
    primary, *optional = [part.plan(context) for part in registry.PARTS]
    routed = primary.condition
    assert routed is not None, "the primary Service part always says how it routes"
    detection = switchover.detect(request.pods, members, route.leader, spec)

    status = {**_generation(request), **primary.status, **_members_status(request, route, members)}
    for plan in optional:
        status.update(plan.status)
    status["switchoverDetection"] = detection.detection.value
    conditions = [
        replace(routed, type=CONDITION_READY),
        routed,
        *member_conditions(members, spec),
        SPEC_ACCEPTED,
        *(plan.condition for plan in optional if plan.condition is not None),
        detection.condition,
    ]
    children = [child for plan in (primary, *optional) for child in plan.children]
    children += _unplanned(request, keep)
    # The primary part may overrule the route: a Service outside this controller.
    decision = (
        Decision.SERVICE_NOT_OWNED
        if routed.reason == Decision.SERVICE_NOT_OWNED.value
        else route.decision
    )
    resync = (
        timing.degraded
        if decision.degraded
        else switchover.healthy_resync(
            spec, timing, detection, key=request.uid or request.cluster, now=_seconds(now)
        )
    )
    return _reply(
        request, now, status, conditions, children, decision, routed.message,
        resync=resync, primary=primary.status.get("primary"),
    )  # fmt: skip


def _finalize(request: SyncRequest, now: datetime) -> SyncOutcome:
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
    conditions = [
        Condition(CONDITION_READY, "False", Decision.FINALIZING.value, message),
        *kept(
            request,
            (
                CONDITION_ROUTED,
                CONDITION_MEMBERS,
                CONDITION_NAME_GUARD,
                CONDITION_SPEC,
                *_optional_conditions(),
            ),
        ),
    ]
    return _reply(
        request, now, _previous_status(request), conditions, [], Decision.FINALIZING, message,
        finalized=remaining == 0, resync=1.0 if remaining else None,
        primary=observed_primary(request),
    )  # fmt: skip


def _invalid_spec(request: SyncRequest, now: datetime, timing: ResyncTiming) -> SyncOutcome:
    """An invalid spec: keep every observed child as it is, say which fields are wrong."""
    problems = "; ".join(f"{p.field}: {p.message}" for p in request.spec_problems)
    status = _previous_status(request)
    # Nothing is probed: no member list, and no conditions about members.
    status.pop("members", None)
    status.pop("membersAnswered", None)
    invalid = Decision.INVALID_SPEC.value
    conditions = [
        Condition(CONDITION_READY, "False", invalid, f"Invalid spec: {problems}"),
        Condition(
            CONDITION_ROUTED,
            "Unknown",
            invalid,
            f"Routing is frozen until the spec is fixed; {keeping_phrase(request)}",
        ),
        Condition(CONDITION_SPEC, "False", SpecReason.INVALID.value, problems),
        *kept(request, _optional_conditions()),
    ]
    keep: Keep = functools.partial(preserved, namespace=request.namespace)
    children = [keep(obj) for _, obj in sorted(request.services.items())]
    children += [
        keep(obj)
        for _, group in sorted(request.other_children.items())
        for _, obj in sorted(group.items())
    ]
    resync = timing.refused if request.refused_by_policy else timing.healthy
    return _reply(
        request, now, status, conditions, children, Decision.INVALID_SPEC, problems,
        resync=resync, primary=observed_primary(request),
    )  # fmt: skip


def _reply(
    request: SyncRequest,
    now: datetime,
    status: dict[str, Any],
    conditions: list[Condition],
    children: list[dict[str, Any]],
    decision: Decision,
    message: str,
    *,
    resync: float | None,
    finalized: bool | None = None,
    primary: str | None,
) -> SyncOutcome:
    """The one builder of a reply, which each outcome feeds with only what differs.

    The conditions are stamped here (a transition time moves only with its status); the
    body's keys keep one order (status, children, finalized, resyncAfterSeconds), so a
    reply's bytes do not depend on which outcome built it. ``primary``: the Pod the
    Service selects after this reply (the observed one where the outcome does not route).
    """
    status["conditions"] = stamped(request, now, conditions)
    body: dict[str, Any] = {"status": status, "children": children}
    if finalized is not None:
        body["finalized"] = finalized
    if resync is not None:
        body["resyncAfterSeconds"] = resync
    return SyncOutcome(body, decision, message, observed_primary(request), primary)


# ------------------------------------------------------------------ small helpers


def _optional_conditions() -> tuple[str, ...]:
    """Conditions a finalize or an invalid-spec reply keeps as they are."""
    return (*(part.condition for part in registry.OPTIONAL), switchover.CONDITION)


def _unplanned(request: SyncRequest, keep: Keep) -> list[dict[str, Any]]:
    """Observed children of groups no part declares: kept as they are, never dropped."""
    planned = registry.planned_groups()
    return [
        keep(obj)
        for key, group in sorted(request.other_children.items())
        if key not in planned
        for _, obj in sorted(group.items())
    ]


def _generation(request: SyncRequest) -> dict[str, Any]:
    return {} if request.generation is None else {"observedGeneration": request.generation}


def _previous_status(request: SyncRequest) -> dict[str, Any]:
    """The parent's status as it is (a copy of what was observed), with this generation."""
    result = copy.deepcopy(dict(request.previous.raw))
    result.update(_generation(request))
    return result


def _members_status(
    request: SyncRequest, route: Route, members: tuple[MemberStatus, ...]
) -> dict[str, Any]:
    """``status.timeline``, ``members`` and ``membersAnswered``: stable fields only."""
    status: dict[str, Any] = {}
    timeline = route.timeline if route.routed else request.previous.timeline
    if timeline is not None:
        status["timeline"] = timeline
    status["members"] = [_member_status(m) for m in members]
    status["membersAnswered"] = f"{sum(m.answered_as_patroni for m in members)}/{len(members)}"
    return status


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


def _seconds(now: datetime) -> float:
    """The clock as POSIX seconds (a naive ``now`` is UTC, as in the conditions)."""
    return (now if now.tzinfo is not None else now.replace(tzinfo=UTC)).timestamp()
