"""Status conditions: the hook's own condition types, and how a reply's conditions are stamped.

Every reply lists its conditions as :class:`~hooks.domain.model.Condition` values (type, status,
reason, message); :func:`stamped` turns them into ``status.conditions`` entries whose
``lastTransitionTime`` moves only when the condition's ``status`` does, so that
Metacontroller's status write converges instead of hot-looping. The child parts
(:mod:`hooks.children`) each own one more condition type.

Pure: the clock is passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from hooks.domain.members import MEMBER_NAME_SINCE, MemberStatus
from hooks.domain.model import ClusterSpec, Condition
from hooks.domain.request import SyncRequest

CONDITION_READY = "Ready"
CONDITION_ROUTED = "PrimaryRouted"
CONDITION_SPEC = "SpecValid"
#: Whether every member answered as Patroni: an operator sees a degraded cluster even
#: while routing is fine. Never part of the routing decision.
CONDITION_MEMBERS = "MembersReachable"
#: Whether ``memberNameMustMatchPod`` can do its job: Patroni before 3.2.0 does not
#: report ``patroni.name``, so the guard cannot check those members.
CONDITION_NAME_GUARD = "MemberNameGuard"


class SpecReason(enum.Enum):
    """``SpecValid``'s reason."""

    ACCEPTED = "SpecAccepted"
    INVALID = "InvalidSpec"


class MembersReason(enum.Enum):
    """``MembersReachable``'s reason."""

    ALL_ANSWERED = "AllMembersAnswered"
    UNREACHABLE = "MembersUnreachable"
    NO_MEMBERS = "NoMembers"


class NameGuardReason(enum.Enum):
    """``MemberNameGuard``'s reason."""

    ACTIVE = "Active"
    DISABLED = "Disabled"
    NO_ANSWERS = "NoAnswers"
    UNAVAILABLE = "Unavailable"


#: The longest condition message written (then cut, with "…"). Messages name members
#: (at most ``PGFH_MAX_MEMBERS``, 253 characters each) and their reasons: the cap keeps
#: the status of any cluster far below etcd's 1.5 MiB object limit.
MAX_MESSAGE_CHARS = 8192

SPEC_ACCEPTED = Condition(CONDITION_SPEC, "True", SpecReason.ACCEPTED.value, "The spec is valid")


def stamped(
    request: SyncRequest, now: datetime, wanted: Iterable[Condition]
) -> list[dict[str, Any]]:
    """``status.conditions``: a ``lastTransitionTime`` that moves only when ``status`` moves.

    The time of the last transition and the observed generation are not part of the
    decision (a :class:`~hooks.domain.model.Condition`): they are added here, keeping the
    previous condition's ``lastTransitionTime`` while its ``status`` stays the same, so
    that Metacontroller's status write converges.
    """
    previous = request.previous.by_type
    aware = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    stamp = aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    generation = request.generation
    entries = []
    for condition in wanted:
        before = previous.get(condition.type)
        transition = stamp
        if (
            before is not None
            and before.status == condition.status
            and before.last_transition_time is not None
        ):
            transition = before.last_transition_time
        entry: dict[str, Any] = {
            "type": condition.type,
            "status": condition.status,
            "reason": condition.reason,
            "message": _capped(condition.message),
            "lastTransitionTime": transition,
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        entries.append(entry)
    return entries


def _capped(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "…"


def kept(request: SyncRequest, types: Iterable[str]) -> list[Condition]:
    """The parent's conditions of these types, as they are (a finalize or an invalid spec)."""
    previous = request.previous.by_type
    found = (previous[t].condition for t in types if t in previous)
    return [c for c in found if c is not None]


def member_conditions(
    members: Sequence[MemberStatus], spec: ClusterSpec
) -> tuple[Condition, Condition]:
    """``MembersReachable`` and ``MemberNameGuard``: what the members' answers say."""
    return members_condition(members), name_guard_condition(members, spec)


def members_condition(members: Sequence[MemberStatus]) -> Condition:
    """``MembersReachable``: how many members answered as Patroni, and who did not.

    Stable: names and the probe's stable reasons only (no latencies), so the status
    converges while the same members stay down.
    """
    if not members:
        return Condition(
            CONDITION_MEMBERS, "Unknown", MembersReason.NO_MEMBERS.value, "No member to probe"
        )
    silent = [f"{m.name} ({m.reason})" for m in members if not m.reachable]
    foreign = [f"{m.name} ({m.reason})" for m in members if m.reachable and not m.patroni_answer]
    answered = len(members) - len(silent) - len(foreign)
    if not silent and not foreign:
        return Condition(
            CONDITION_MEMBERS,
            "True",
            MembersReason.ALL_ANSWERED.value,
            f"All {len(members)} member(s) answered as Patroni",
        )
    parts = [f"{answered} of {len(members)} member(s) answered as Patroni"]
    if silent:
        parts.append(f"no answer from {', '.join(silent)}")
    if foreign:
        parts.append(f"not a Patroni answer from {', '.join(foreign)}")
    return Condition(CONDITION_MEMBERS, "False", MembersReason.UNREACHABLE.value, "; ".join(parts))


def name_guard_condition(members: Sequence[MemberStatus], spec: ClusterSpec) -> Condition:
    """``MemberNameGuard``: whether ``memberNameMustMatchPod`` can check the members.

    Patroni before 3.2.0 sends no ``patroni.name`` (it came with patroni#2846), so the
    guard cannot tell a reused Pod IP from the member itself. That is said here plainly,
    per member and version, instead of routing as if the guard were on.
    """
    if not spec.verify_member_name:
        return Condition(
            CONDITION_NAME_GUARD,
            "False",
            NameGuardReason.DISABLED.value,
            "spec.patroni.memberNameMustMatchPod is false: Patroni member names are not checked",
        )
    patroni = [m for m in members if m.answered_as_patroni]
    if not patroni:
        return Condition(
            CONDITION_NAME_GUARD,
            "Unknown",
            NameGuardReason.NO_ANSWERS.value,
            "No member answered as Patroni",
        )
    nameless: dict[str, list[str]] = {}
    for member in patroni:
        if member.patroni_name is None:
            nameless.setdefault(member.version_text, []).append(member.name)
    if not nameless:
        return Condition(
            CONDITION_NAME_GUARD,
            "True",
            NameGuardReason.ACTIVE.value,
            "Every member that answered reports its Patroni name; a leader whose name is "
            "not its Pod's is never routed to",
        )
    groups = "; ".join(f"{v} on {', '.join(names)}" for v, names in sorted(nameless.items()))
    return Condition(
        CONDITION_NAME_GUARD,
        "False",
        NameGuardReason.UNAVAILABLE.value,
        f"No patroni.name in the answer ({groups}; Patroni reports it since "
        f"{'.'.join(map(str, MEMBER_NAME_SINCE))}): memberNameMustMatchPod cannot check "
        "these members",
    )
