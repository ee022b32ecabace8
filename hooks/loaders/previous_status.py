"""The parent's previous status, loaded: free input, whatever is not readable is left out.

Anyone who can write the parent's status can put anything there, so nothing in it is an
error: a condition without a type, a member without a name, a timeline that is a boolean
are left out, and the hook decides as if they were not there. Loaded once per sync, through
:func:`hooks.loaders.observed.load_observed`.

Pure: a plain mapping in, frozen values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hooks.domain.model import Condition
from hooks.domain.observed import (
    BackupRecord,
    PreviousBackup,
    PreviousCondition,
    PreviousMember,
    PreviousStatus,
    is_time,
)


def load_previous_status(status: object) -> PreviousStatus:
    """The parent's ``status`` (free input: whatever is not readable is left out)."""
    if not isinstance(status, Mapping):
        return PreviousStatus()
    entries = status.get("conditions")
    timeline = status.get("timeline")
    conditions = tuple(
        _previous_condition(c)
        for c in (entries if isinstance(entries, list) else [])
        if isinstance(c, Mapping) and isinstance(c.get("type"), str)
    )
    members = status.get("members")
    return PreviousStatus(
        conditions=conditions,
        members=tuple(
            _previous_member(m)
            for m in (members if isinstance(members, list) else [])
            if isinstance(m, Mapping) and isinstance(m.get("name"), str)
        ),
        by_type=MappingProxyType({c.type: c for c in conditions}),
        ready=next((c for c in conditions if c.type == "Ready"), None),
        timeline=_integer(timeline),
        backup=_previous_backup(status.get("backup")),
        raw=MappingProxyType(status),
    )


def _previous_condition(observed: Mapping[str, Any]) -> PreviousCondition:
    type_ = observed["type"]
    status = observed.get("status")
    reason = observed.get("reason")
    transition = observed.get("lastTransitionTime")
    kept = None
    if isinstance(status, str):
        kept = Condition(
            type_, status, str(observed.get("reason", "")), str(observed.get("message", ""))
        )
    return PreviousCondition(
        type=type_,
        status=status if isinstance(status, str) else None,
        reason=reason if isinstance(reason, str) else None,
        last_transition_time=transition if isinstance(transition, str) and transition else None,
        condition=kept,
    )


def _previous_member(entry: Mapping[str, Any]) -> PreviousMember:
    reachable = entry.get("reachable")
    return PreviousMember(
        name=entry["name"],
        reachable=reachable if isinstance(reachable, bool) else None,
        role=_text(entry.get("role")),
        state=_text(entry.get("state")),
        timeline=_integer(entry.get("timeline")),
        reason=_text(entry.get("reason")),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _integer(value: object) -> int | None:
    """An integer, never a boolean (JSON's ``true`` is not a timeline)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _previous_backup(value: object) -> PreviousBackup:
    old: Mapping[str, Any] = value if isinstance(value, Mapping) else {}
    cron_job = old.get("cronJob")
    return PreviousBackup(
        cron_job=cron_job if isinstance(cron_job, str) else None,
        last_successful=_record(old.get("lastSuccessful"), "completionTime"),
        last_failed=_record(old.get("lastFailed"), "failureTime"),
    )


def _record(value: object, time_key: str) -> BackupRecord | None:
    if not isinstance(value, Mapping):
        return None
    if not isinstance(value.get("job"), str) or not is_time(value.get(time_key)):
        return None
    return BackupRecord(MappingProxyType({k: v for k, v in value.items() if isinstance(v, str)}))
