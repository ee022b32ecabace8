"""Reads by consistency level: which replicas the leader counts in its synchronous commit.

``spec.replicaService.consistency`` narrows the replicas :mod:`hooks.children.readonly` lists:

* ``lag`` (the default, the behaviour before the field existed): every rule of
  :func:`hooks.children.readonly.classify`, replay within ``maxLagBytes``;
* ``synchronous``: those rules, and the leader reports the member's walsender with
  ``sync_state: sync`` (Patroni ``synchronous_mode: true``: a commit waits for it);
* ``quorum``: those rules, and ``sync_state: quorum`` (Patroni 4.0's
  ``synchronous_mode: quorum``: ``synchronous_standby_names = 'ANY k (...)'``, a commit
  waits for any ``k`` of them). A ``sync`` standby does not count: ``quorum`` says what
  the cluster was set up to do, and a mix of the two is a configuration to report, not
  to paper over.

**Where the level comes from.** The one ``GET`` of the health path the hook already sends
to each member: Patroni answers every health path (``/primary`` too) with
``get_postgresql_status()`` (``patroni/api.py``, 3.0.0 to 4.1.x), whose ``replication`` is
the member's ``pg_stat_replication`` (``application_name``, ``state``, ``sync_state``, ...).
The leader's list is PostgreSQL's own view of whom a commit waits for *now*, read in the
same probe round as the positions. The replicas' own ``sync_standby`` (since 3.0.2) and
``quorum_standby`` (since 4.0.0) flags say what the DCS's ``/sync`` key says, which
Patroni updates after PostgreSQL when it adds a standby and before when it drops one
(the multisync ``process_sync_replication`` docstring in ``patroni/ha.py``);
they are not used, so the decision has a single source. ``sync_state`` is ``sync`` or
``quorum`` only for a walsender that PostgreSQL counts as a candidate (streaming or
stopping, with a flush position: ``SyncRepGetCandidateStandbys`` in PostgreSQL's
``syncrep.c``), so ``state`` needs no check of its own.

**What the level promises.** A ``sync`` or ``quorum`` standby has *flushed* what the
leader committed (``synchronous_commit: on``); it has *replayed* it only with
``synchronous_commit: remote_apply``. ``maxLagBytes`` still bounds the replay.

**When the cluster cannot serve the level** (:func:`unserved`): the leader runs a Patroni
older than 4.0 and the level is ``quorum``, or the leader lists no standby at that level
(``synchronous_mode`` off or of the other kind, or no standby is synchronous right now).
Then nobody qualifies, ``whenNoReplica`` applies as for any round without a replica, and
the reason says which of the two it is.

Pure: member values in, phrases out.
"""

from __future__ import annotations

import enum

from hooks.domain.members import MemberStatus

#: ``consistency`` → the ``sync_state`` a member's walsender must have on the leader.
WANTED_SYNC_STATE = {"synchronous": "sync", "quorum": "quorum"}
#: Quorum commit (``synchronous_mode: quorum``) came in Patroni 4.0.0 (its docs/releases.rst:
#: "Quorum-based failover"; ``quorum_standby`` first appears in ``patroni/api.py`` at v4.0.0).
QUORUM_SINCE = (4, 0, 0)
#: A member's level when the leader lists no walsender of that name.
NOT_A_STANDBY = "none"
#: A member's level when the leader lists several walsenders of that name (an old
#: connection not yet gone, or another client using the name): which one is the member's
#: cannot be told, so none counts.
AMBIGUOUS = "ambiguous"


class Unserved(enum.Enum):
    """Why the cluster cannot serve a level in this round."""

    #: ``quorum`` and the leader's Patroni is older than 4.0.
    VERSION = "version"
    #: The leader lists no standby at the level.
    NO_STANDBY = "no_standby"


def member_level(leader: MemberStatus, name: str) -> str:
    """What the leader says of ``name``'s walsender: its ``sync_state`` (``sync``,
    ``potential``, ``quorum``, ``async``; ``unknown`` if absent), :data:`NOT_A_STANDBY`
    or :data:`AMBIGUOUS`. Names are compared the way Patroni compares them (case-folded)."""
    wanted = name.casefold()
    found = [w for w in leader.walsenders if w.application_name.casefold() == wanted]
    if not found:
        return NOT_A_STANDBY
    if len(found) > 1:
        return AMBIGUOUS
    return found[0].sync_state or "unknown"


def levels(leader: MemberStatus, names: list[str]) -> dict[str, str]:
    """:func:`member_level` of each of ``names`` (the leader itself is not one of them)."""
    return {name: member_level(leader, name) for name in sorted(names) if name != leader.name}


def level_problem(consistency: str, leader: MemberStatus, name: str) -> str | None:
    """Why ``name`` does not meet ``consistency`` (a stable phrase), or ``None`` if it does
    (always ``None`` for ``lag``)."""
    wanted = WANTED_SYNC_STATE.get(consistency)
    if wanted is None:
        return None
    if wanted == "quorum" and leader.older_than(QUORUM_SINCE):
        return f"no quorum commit in the leader's {leader.version_text}"
    level = member_level(leader, name)
    if level == wanted:
        return None
    if level == NOT_A_STANDBY:
        return f"not a standby of {leader.name}"
    if level == AMBIGUOUS:
        return f"{leader.name} lists several walsenders named {name}"
    return f"sync_state {level}, not {wanted}"


def unserved(consistency: str, leader: MemberStatus) -> tuple[Unserved, str] | None:
    """Why the cluster cannot serve ``consistency`` at all in this round, or ``None``.

    Only the leader's answer is read, so this is the same for every member. The members'
    own levels are named by :func:`describe` (not every walsender: a leader may also feed
    backups and logical subscribers, and the message must stay small).
    """
    wanted = WANTED_SYNC_STATE.get(consistency)
    if wanted is None:
        return None
    if wanted == "quorum" and leader.older_than(QUORUM_SINCE):
        return (
            Unserved.VERSION,
            f"Leader {leader.name} runs {leader.version_text}: quorum commit "
            "(synchronous_mode: quorum) needs Patroni 4.0 or later",
        )
    states = [w.sync_state for w in leader.walsenders]
    if wanted in states:
        return None
    if wanted == "sync":
        why = "synchronous_mode is off (or quorum), or no standby is synchronous now"
    elif "sync" in states:
        why = "synchronous_mode is true, not quorum"
    else:
        why = "synchronous_mode is not quorum, or no standby is in the quorum now"
    return (
        Unserved.NO_STANDBY,
        f"Leader {leader.name} lists no {wanted} standby: {why}",
    )


def describe(found: dict[str, str]) -> str:
    """``pg-1 sync, pg-2 async`` (or ``none``), for the condition's message."""
    return ", ".join(f"{name} {level}" for name, level in sorted(found.items())) or "none"
