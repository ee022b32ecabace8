"""What a member says about itself, and who became leader when: the harness's view of Patroni.

:class:`MemberStatus` is one member's ``/primary`` and ``/replica`` answers read once;
:class:`LeaderWatch` polls ``/primary`` on several members at once to time a failover.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from testbed.patroni.errors import ClusterError
from testbed.patroni.layout import Member

log = logging.getLogger("devcluster")


@dataclass(frozen=True)
class MemberStatus:
    """What a member's REST API says right now (``reachable`` False: no answer at all)."""

    name: str
    reachable: bool
    primary: bool  # 200 on GET /primary
    replica: bool  # 200 on GET /replica
    role: str | None
    state: str | None
    replication_state: str | None
    timeline: int | None
    error: str = ""

    @property
    def streaming(self) -> bool:
        """A running replica whose WAL receiver streams from the leader."""
        return self.replica and self.replication_state == "streaming"

    def __str__(self) -> str:
        if not self.reachable:
            return f"{self.name}: unreachable ({self.error})"
        flags = "PRIMARY " if self.primary else ("replica " if self.replica else "")
        return (
            f"{self.name}: {flags}role={self.role} state={self.state} "
            f"replication_state={self.replication_state} timeline={self.timeline}"
        )


class LeaderElection(NamedTuple):
    """Who became leader and when (``time.monotonic()`` values, comparable with other events)."""

    name: str
    #: First 200 on ``/primary`` (Patroni 4.1's first one after a promotion may say role replica).
    first_200: float
    #: First 200 on ``/primary`` whose body says ``role: primary``.
    first_primary: float


@dataclass(frozen=True)
class SwitchoverResult:
    """Outcome of :meth:`PatroniCluster.switchover`."""

    old_leader: str
    new_leader: str
    requested_at: float  # monotonic time the POST was sent
    election: LeaderElection

    @property
    def seconds(self) -> float:
        """From the request to the first 200 with role primary on the new leader."""
        return self.election.first_primary - self.requested_at


class LeaderWatch:
    """Polls ``/primary`` on some members in background threads until one is primary.

    Polling starts on construction, *before* the caller triggers a failover, so the measured
    times do not depend on how long the trigger itself blocks (a graceful stop takes ~2 s, a
    switchover POST blocks until Patroni reports success). One thread per member, so a member
    whose API hangs (a stopping Patroni keeps the port open without answering) cannot delay the
    detection on the others.
    """

    def __init__(
        self, members: Iterable[Member], poll_interval: float = 0.025, max_seconds: float = 300
    ) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first_200: dict[str, float] = {}
        self._first_primary: dict[str, float] = {}
        self._interval = poll_interval
        self._deadline = time.monotonic() + max_seconds
        self.started_at = time.monotonic()
        self._threads = [
            threading.Thread(
                target=self._poll, args=(m,), name=f"leader-watch-{m.name}", daemon=True
            )
            for m in members
        ]
        for t in self._threads:
            t.start()

    def _poll(self, member: Member) -> None:
        max_polls = int((self._deadline - time.monotonic()) / self._interval) + 2
        for _ in range(max_polls):
            if self._stop.is_set() or time.monotonic() >= self._deadline:
                return
            try:
                resp = member.api_get("/primary", timeout=0.5)
                now = time.monotonic()
                if resp.status == 200:
                    with self._lock:
                        self._first_200.setdefault(member.name, now)
                        if resp.json().get("role") == "primary":
                            self._first_primary.setdefault(member.name, now)
                            self._stop.set()
                            return
            except Exception:  # a poller thread must never die with a traceback
                log.exception("leader watch on %s", member.name)
            self._stop.wait(self._interval)

    def result(self, timeout: float, details: Callable[[], str] | None = None) -> LeaderElection:
        """Block until a member answers 200 with role primary (or raise after ``timeout``)."""
        self._stop.wait(max(0.0, timeout - (time.monotonic() - self.started_at)))
        self.cancel()
        with self._lock:
            if not self._first_primary:
                seen = ", ".join(f"{n} (200 as replica)" for n in self._first_200) or "none"
                extra = f"\n{details()}" if details is not None else ""
                raise ClusterError(
                    f"no member became primary within {timeout:.1f}s; 200 seen from: {seen}{extra}"
                )
            name = min(self._first_primary, key=self._first_primary.__getitem__)
            return LeaderElection(name, self._first_200[name], self._first_primary[name])

    def cancel(self) -> None:
        """Stop polling and join the threads (each finishes its current 0.5 s-bounded GET)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> LeaderWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


def member_status(member: Member, timeout: float = 1.0) -> MemberStatus:
    """GET ``/primary`` and ``/replica`` on one member (their bodies are Patroni's status)."""
    name = member.name
    primary = member.api_get("/primary", timeout=timeout)
    if primary.status == 0:
        return MemberStatus(name, False, False, False, None, None, None, None, primary.error)
    replica = member.api_get("/replica", timeout=timeout)
    body = (replica if replica.status else primary).json()
    return MemberStatus(
        name=name,
        reachable=True,
        primary=primary.status == 200,
        replica=replica.status == 200,
        role=body.get("role"),
        state=body.get("state"),
        replication_state=body.get("replication_state"),
        timeline=body.get("timeline"),
    )


class LeaderLoss(NamedTuple):
    """What :meth:`PatroniCluster.lose_leader` / :meth:`~PatroniCluster.fail_over` did: the
    old leader, when it was triggered (``time.monotonic()``), and Patroni's election of the
    next one."""

    old: str
    trigger: float
    election: LeaderElection
