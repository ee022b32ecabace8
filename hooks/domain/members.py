"""What one Patroni member said when it was probed, as a small immutable value.

This module is pure: it turns an HTTP status and a JSON body (or a failure reason)
into a :class:`MemberStatus`. The I/O that obtains them lives in :mod:`hooks.patroni`,
and the decisions that use them live in :mod:`hooks.core.routing`. Modelled on Patroni's own
``_MemberStatus.from_api_response`` / ``unknown`` pair in ``patroni/ha.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hooks.domain.model import DEFAULT_HEALTH_CHECK_PATH, LEADER_PATHS, ROLE_ALIASES

#: The first Patroni releases whose answers carry these fields (read in Patroni's
#: ``patroni/api.py`` at each tag): ``replication_state`` since 3.0.4 (patroni#2733),
#: ``patroni.name`` since 3.2.0 (patroni#2846). Older answers simply lack them.
REPLICATION_STATE_SINCE = (3, 0, 4)
MEMBER_NAME_SINCE = (3, 2, 0)

#: Roles that may hold the leader lock. ``standby_leader`` leads a standby cluster.
LEADER_ROLES = frozenset({"primary", "standby_leader"})

#: The ``state`` values of a member that Patroni is still building: exactly the states in
#: which Patroni 4.1 puts ``kubernetes.bootstrap_labels`` on the member's Pod
#: (``touch_member``, ``patroni/dcs/kubernetes.py`` at v4.1.4, lines 1382-1387: ``INITDB``,
#: ``CUSTOM_BOOTSTRAP``, ``BOOTSTRAP_STARTING``, ``CREATING_REPLICA``; their strings in
#: ``patroni/postgresql/misc.py`` at v4.1.4, lines 20-27). Patroni 3.0.0 and 3.0.1 spelled
#: the first ``initalizing new cluster`` (``patroni/postgresql/bootstrap.py``, line 62 at
#: both tags);
#: ``starting after custom bootstrap`` exists since 4.1.0 (before, that phase said
#: ``starting``, which is not running either). The REST answer carries the state on every
#: health path (``get_postgresql_status`` falls back to ``{state, role}`` while PostgreSQL
#: cannot be queried), so a member in one of them is told apart from one merely not running.
INITIALISING_STATES = frozenset(
    {
        "initializing new cluster",
        "initalizing new cluster",
        "running custom bootstrap script",
        "starting after custom bootstrap",
        "creating replica",
    }
)


class ProbeVerdict(enum.Enum):
    """How a member answered the health-check path."""

    #: HTTP 200 on the health path, running, and a leader role in the body.
    LEADER = "leader"
    #: A definite answer that this member is not (or not yet, or no longer) the leader,
    #: including an answer that is not Patroni's at all (a redirect, an HTML page, an
    #: oversized body): whatever sent it, it is not a member holding the leader lock.
    NOT_LEADER = "not_leader"
    #: No answer: refused, timed out, reset, TLS failure, address refused by the policy.
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One member to ask, and where: built from the Pod's own IP by :mod:`hooks.probe.plan`."""

    pod: str
    url: str
    connect_timeout: float
    read_timeout: float
    #: What the path is (for messages) and which roles a leader reports there.
    health_path: str = DEFAULT_HEALTH_CHECK_PATH
    leader_roles: frozenset[str] = LEADER_PATHS[DEFAULT_HEALTH_CHECK_PATH]
    #: https only: verify the certificate against this name instead of the IP.
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class WalSender:
    """One entry of a member's ``replication`` list: a row of its ``pg_stat_replication``.

    Patroni 3.0 to 4.1 send the same entry from ``get_postgresql_status`` in
    ``patroni/api.py`` (``usename``, ``application_name``, ``client_addr``, ``state``,
    ``sync_state``, ``sync_priority``), on every health path. Patroni names a replica's
    connection after the member (``application_name``) and matches rows to members by that
    name, case-insensitively (``patroni/postgresql/sync.py``); ``client_addr`` is not kept,
    since a replica may connect through an address that is not its Pod IP.
    """

    application_name: str
    #: ``pg_stat_replication.state``: ``streaming``, ``catchup``, ``startup``, ``backup``, ...
    state: str | None
    #: ``pg_stat_replication.sync_state``: ``sync``, ``potential``, ``quorum`` or ``async``.
    sync_state: str | None


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member's answer, reduced to what routing and status need.

    ``claims_leadership`` is true for every HTTP 200 on the health path: Patroni answers
    200 there only while the member holds the leader lock. ``verdict`` is stricter: a
    claimant is only a ``LEADER`` once it also reports ``state: running`` and a leader
    role, because Patroni's first 200 after a promotion still says ``role: replica``
    and a leader that lost the DCS answers 200 with ``state: stopping`` on its way out.
    """

    name: str
    verdict: ProbeVerdict
    reason: str
    http_status: int | None = None
    claims_leadership: bool = False
    role: str | None = None
    state: str | None = None
    timeline: int | None = None
    #: Primary: ``xlog.location``. Replica: ``xlog.replayed_location`` (bytes).
    wal_position: int | None = None
    #: Replica only: ``xlog.received_location`` (bytes).
    received_position: int | None = None
    #: Replica only: ``xlog.paused`` (``pg_is_wal_replay_paused()``).
    replay_paused: bool = False
    replication_state: str | None = None
    patroni_name: str | None = None
    patroni_scope: str | None = None
    #: ``patroni.version`` as a tuple (``(4, 1, 5)``), ``None`` if absent or unparsable.
    patroni_version: tuple[int, ...] | None = None
    #: ``tags.noloadbalance``, read the way Patroni reads it (``bool(value)``): Patroni
    #: answers 503 on ``/replica`` for such a member, to keep client reads off it.
    noloadbalance: bool = False
    #: False for an answer that is not Patroni's JSON (and for no answer at all).
    patroni_answer: bool = True
    #: ``replication``: the member's walsenders (the leader's standbys), in Patroni's order.
    walsenders: tuple[WalSender, ...] = ()
    #: ``failsafe_mode_is_active: true`` (Patroni 3.0+, ``get_postgresql_status``): the DCS
    #: is unreachable and, on the leader, every member acknowledged it over ``POST
    #: /failsafe``, so Patroni keeps it primary (``Ha._handle_dcs_error``). Reported only;
    #: the health path's 200 still decides (Patroni answers it from ``is_leader()``, which
    #: failsafe renews: ``set_is_leader(True)``).
    failsafe_active: bool = False

    @property
    def reachable(self) -> bool:
        """Whether the member answered at all (Patroni's JSON or not)."""
        return self.verdict is not ProbeVerdict.UNREACHABLE

    @property
    def answered_as_patroni(self) -> bool:
        """Whether the member answered with Patroni's JSON document."""
        return self.reachable and self.patroni_answer

    @property
    def version_text(self) -> str:
        """``Patroni 3.0.2`` for messages, or ``Patroni (version unknown)``."""
        if self.patroni_version is None:
            return "Patroni (version unknown)"
        return "Patroni " + ".".join(str(part) for part in self.patroni_version)

    def older_than(self, release: tuple[int, ...]) -> bool:
        """Whether the member's Patroni reports a version before ``release``."""
        return self.patroni_version is not None and self.patroni_version < release

    @property
    def initialising(self) -> bool:
        """Whether Patroni reports the member as still being built (:data:`INITIALISING_STATES`)."""
        return self.state in INITIALISING_STATES

    @property
    def is_leader(self) -> bool:
        """Whether Patroni itself says this member is the writable leader."""
        return self.verdict is ProbeVerdict.LEADER

    @classmethod
    def unknown(cls, name: str, reason: str) -> MemberStatus:
        """The member could not be asked, or did not answer."""
        return cls(name=name, verdict=ProbeVerdict.UNREACHABLE, reason=reason, patroni_answer=False)

    @classmethod
    def not_patroni(cls, name: str, reason: str, http_status: int | None = None) -> MemberStatus:
        """The member answered, but not with Patroni's JSON: answered, not the leader.

        Only a member that holds the leader lock can be routed to, and Patroni shows that
        with its own JSON; whatever else answers is not it. It must not block routing to
        the member that does hold the lock either (the DCS lock is the quorum, not the
        number of well-formed answers).
        """
        return cls(
            name=name,
            verdict=ProbeVerdict.NOT_LEADER,
            reason=reason,
            http_status=http_status,
            patroni_answer=False,
        )

    @classmethod
    def from_api_response(
        cls,
        name: str,
        http_status: int,
        body: object,
        *,
        health_path: str = DEFAULT_HEALTH_CHECK_PATH,
        leader_roles: frozenset[str] = LEADER_ROLES,
    ) -> MemberStatus:
        """Interpret Patroni's answer to ``GET <health_path>``.

        Patroni answers every health path with the same JSON document as ``GET
        /patroni``; only the status code differs. A body that is not a JSON object with
        at least ``state`` or ``role`` is not Patroni (a proxy's error page, another
        service on a reused IP): an answer, but not the leader's (:meth:`not_patroni`).
        """
        if not isinstance(body, Mapping) or not ({"state", "role"} & body.keys()):
            return cls.not_patroni(
                name, f"HTTP {http_status} on {health_path} without Patroni JSON", http_status
            )
        role = _role(body.get("role"))
        state = _str(body.get("state"))
        patroni = body.get("patroni")
        patroni_info: Mapping[str, Any] = patroni if isinstance(patroni, Mapping) else {}
        wal, received, paused = _positions(body)
        tags = body.get("tags")
        fields: dict[str, Any] = {
            "name": name,
            "http_status": http_status,
            "role": role,
            "state": state,
            "timeline": _int(body.get("timeline")),
            "wal_position": wal,
            "received_position": received,
            "replay_paused": paused,
            "replication_state": _str(body.get("replication_state")),
            "patroni_name": _str(patroni_info.get("name"), MAX_NAME_CHARS),
            "patroni_scope": _str(patroni_info.get("scope")),
            "patroni_version": _version(patroni_info.get("version")),
            "noloadbalance": isinstance(tags, Mapping) and bool(tags.get("noloadbalance")),
            "walsenders": _walsenders(body.get("replication")),
            "failsafe_active": body.get("failsafe_mode_is_active") is True,
        }
        if http_status == 200:
            if state == "running" and role in leader_roles:
                return cls(
                    verdict=ProbeVerdict.LEADER,
                    claims_leadership=True,
                    reason=f"HTTP 200 on {health_path}: {role}, running",
                    **fields,
                )
            return cls(
                verdict=ProbeVerdict.NOT_LEADER,
                claims_leadership=True,
                reason=f"HTTP 200 on {health_path} but role={role}, state={state}",
                **fields,
            )
        if 400 <= http_status < 600:
            return cls(
                verdict=ProbeVerdict.NOT_LEADER,
                reason=f"HTTP {http_status} on {health_path}: {role}, {state}",
                **fields,
            )
        return cls.not_patroni(name, f"unexpected HTTP {http_status} on {health_path}", http_status)


#: The longest Patroni string (role, state, replication state, scope) kept from an answer.
#: Patroni's own are at most about 40 characters ("running custom bootstrap script"); a
#: member may send up to the 64 KiB body cap, and 64 such members made an 8 MiB status.
MAX_FIELD_CHARS = 64
#: ``patroni.name`` is compared with the Pod's name (at most 253 characters): kept whole
#: up to that, so a real name is never cut.
MAX_NAME_CHARS = 253


def _role(value: object) -> str | None:
    role = _str(value)
    if role is None:
        return None
    return ROLE_ALIASES.get(role, role)


def _str(value: object, limit: int = MAX_FIELD_CHARS) -> str | None:
    """A non-empty string, cut to ``limit`` characters plus "…" (never equal to a real
    value: Patroni's roles, states and names have no "…"), else ``None``."""
    if not isinstance(value, str) or not value:
        return None
    return value if len(value) <= limit else value[:limit] + "…"


def _int(value: object) -> int | None:
    # bool is an int in Python; Patroni never sends one for these fields.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _version(value: object) -> tuple[int, ...] | None:
    """``"4.1.5"`` → ``(4, 1, 5)``; a suffix such as ``4.2.0.dev1`` keeps its numeric head."""
    if not isinstance(value, str):
        return None
    parts: list[int] = []
    for part in value.split(".")[:3]:
        digits = part[: len(part) - len(part.lstrip("0123456789"))] or None
        if digits is None:
            break
        parts.append(int(digits))
        if digits != part:
            break
    return tuple(parts) if parts else None


def _walsenders(value: object) -> tuple[WalSender, ...]:
    """The ``replication`` list; entries without a string ``application_name`` are skipped
    (no member can be matched to them). The body cap (64 KiB) bounds their number."""
    if not isinstance(value, list):
        return ()
    found = []
    for entry in value:
        if not isinstance(entry, Mapping):
            continue
        name = _str(entry.get("application_name"), MAX_NAME_CHARS)
        if name is None:
            continue
        found.append(WalSender(name, _str(entry.get("state")), _str(entry.get("sync_state"))))
    return tuple(found)


def _positions(body: Mapping[str, Any]) -> tuple[int | None, int | None, bool]:
    """WAL positions and replay pause from ``xlog``.

    Patroni 3.0 to 4.1 send the same ``xlog`` object (``get_postgresql_status`` in
    ``patroni/api.py``): ``location`` on a primary; ``received_location``,
    ``replayed_location``, ``replayed_timestamp`` and ``paused`` on a replica. There is no
    other spelling (no ``wal`` key in any of these releases).
    """
    section = body.get("xlog")
    if not isinstance(section, Mapping):
        return None, None, False
    location = _int(section.get("location"))
    if location is not None:
        return location, None, False
    replayed = _int(section.get("replayed_location"))
    received = _int(section.get("received_location"))
    return replayed, received, section.get("paused") is True
