"""What one Patroni member said when it was probed, as a small immutable value.

This module is pure: it turns an HTTP status and a JSON body (or a failure reason)
into a :class:`MemberStatus`. The I/O that obtains them lives in :mod:`hooks.patroni`,
and the decisions that use them live in :mod:`hooks.sync`. Modelled on Patroni's own
``_MemberStatus.from_api_response`` / ``unknown`` pair in ``patroni/ha.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Patroni 3 said ``master``; Patroni 4 says ``primary``. Normalise to the new word.
_ROLE_ALIASES = {"master": "primary"}

#: Roles that may hold the leader lock. ``standby_leader`` leads a standby cluster.
LEADER_ROLES = frozenset({"primary", "standby_leader"})


class ProbeVerdict(enum.Enum):
    """How a member answered the health-check path."""

    #: HTTP 200 on the health path, running, and a leader role in the body.
    LEADER = "leader"
    #: A definite answer that this member is not (or not yet, or no longer) the leader.
    NOT_LEADER = "not_leader"
    #: No usable answer: refused, timed out, reset, too large, not Patroni JSON, ...
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One member to ask, and where: built from the Pod's own IP by :mod:`hooks.sync`."""

    pod: str
    url: str
    connect_timeout: float
    read_timeout: float
    #: What the path is (for messages) and which roles a leader reports there.
    health_path: str = "/primary"
    leader_roles: frozenset[str] = frozenset({"primary"})
    #: https only: verify the certificate against this name instead of the IP.
    server_name: str | None = None


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
    #: Primary: its current WAL location. Replica: the replayed location (bytes).
    wal_position: int | None = None
    #: Replica only: the received location (bytes).
    received_position: int | None = None
    replication_state: str | None = None
    patroni_name: str | None = None
    patroni_scope: str | None = None

    @property
    def reachable(self) -> bool:
        """Whether the member gave a definite answer."""
        return self.verdict is not ProbeVerdict.UNREACHABLE

    @property
    def is_leader(self) -> bool:
        """Whether Patroni itself says this member is the writable leader."""
        return self.verdict is ProbeVerdict.LEADER

    @classmethod
    def unknown(cls, name: str, reason: str) -> MemberStatus:
        """The member could not be asked, or its answer was unusable."""
        return cls(name=name, verdict=ProbeVerdict.UNREACHABLE, reason=reason)

    @classmethod
    def from_api_response(
        cls,
        name: str,
        http_status: int,
        body: object,
        *,
        health_path: str = "/primary",
        leader_roles: frozenset[str] = LEADER_ROLES,
    ) -> MemberStatus:
        """Interpret Patroni's answer to ``GET <health_path>``.

        Patroni answers every health path with the same JSON document as ``GET
        /patroni``; only the status code differs. A body that is not a JSON object with
        at least ``state`` or ``role`` is not Patroni (a proxy's error page, another
        service on a reused IP), so it counts as unreachable rather than "not leader".
        """
        if not isinstance(body, Mapping) or not ({"state", "role"} & body.keys()):
            return cls.unknown(name, f"HTTP {http_status} on {health_path} without Patroni JSON")
        role = _role(body.get("role"))
        state = _str(body.get("state"))
        patroni = body.get("patroni")
        patroni_info: Mapping[str, Any] = patroni if isinstance(patroni, Mapping) else {}
        wal, received = _positions(body)
        fields: dict[str, Any] = {
            "name": name,
            "http_status": http_status,
            "role": role,
            "state": state,
            "timeline": _int(body.get("timeline")),
            "wal_position": wal,
            "received_position": received,
            "replication_state": _str(body.get("replication_state")),
            "patroni_name": _str(patroni_info.get("name")),
            "patroni_scope": _str(patroni_info.get("scope")),
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
        return cls.unknown(name, f"unexpected HTTP {http_status} on {health_path}")


def _role(value: object) -> str | None:
    role = _str(value)
    return _ROLE_ALIASES.get(role, role) if role is not None else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object) -> int | None:
    # bool is an int in Python; Patroni never sends one for these fields.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _positions(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """WAL positions from ``xlog`` (Patroni 3/4) or ``wal`` (some releases and fields)."""
    section = body.get("xlog", body.get("wal"))
    if not isinstance(section, Mapping):
        return None, None
    location = _int(section.get("location"))
    if location is not None:
        return location, None
    replayed = _int(section.get("replayed_location"))
    received = _int(section.get("received_location"))
    return replayed, received
