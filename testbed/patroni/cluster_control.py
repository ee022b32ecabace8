"""The member control API tests drive: stop, kill and restart members, switch over, pause.

The failures tests inject into the local Patroni cluster, and Patroni's own controls
(``POST /switchover``, ``PATCH /config`` for maintenance mode, failsafe mode and the rest of the
dynamic configuration, etcd SIGSTOPped as a partitioned DCS): :class:`MemberControl`, the
second base class of :class:`testbed.patroni.cluster.PatroniCluster`, above
:class:`testbed.patroni.cluster_view.ClusterView` whose status and waits it uses.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from testbed.patroni import member_api
from testbed.patroni._proc import Proc, kill_all, wait_gone
from testbed.patroni.cluster_view import ClusterView
from testbed.patroni.election import (
    LeaderLoss,
    SwitchoverResult,
)
from testbed.patroni.errors import ClusterError
from testbed.patroni.layout import Member
from testbed.patroni.waiting import poll_until

log = logging.getLogger("devcluster")


class MemberControl(ClusterView, abc.ABC):
    """Failure injection and Patroni's controls of a cluster (its lifecycle: the subclass)."""

    # Set by PatroniCluster's constructor and lifecycle.
    _lock: threading.RLock
    _etcd: Proc | None

    @abc.abstractmethod
    def _launch_patroni(self, m: Member) -> None:
        """Start member ``m``'s Patroni (the lifecycle's job: :mod:`testbed.patroni.cluster`)."""

    def lose_leader(
        self,
        how: str,
        timeout: float,
        poll_interval: float = 0.025,
        on_trigger: Callable[[str], None] | None = None,
    ) -> LeaderLoss:
        """Stop the leader (``how``: "graceful", SIGTERM, or "kill", SIGKILL) with the other
        members watched from before the trigger, and wait until Patroni promoted one of them.

        ``on_trigger(old)`` runs right after the trigger, inside the watch (a rig without a
        kubelet reports the old leader's Pod NotReady there, as a kubelet would).
        """
        if how not in ("graceful", "kill"):
            raise ValueError(f"how must be graceful or kill, not {how!r}")
        old = self.leader()
        if old is None:
            raise RuntimeError("no leader to lose")
        with self.watch_leader(exclude={old}, poll_interval=poll_interval) as watch:
            if how == "graceful":
                trigger = self.stop_member_gracefully(old, wait=False)
            else:
                trigger = self.kill_member(old)
            if on_trigger is not None:
                on_trigger(old)
            election = watch.result(timeout=timeout)
        return LeaderLoss(old, trigger, election)

    def fail_over(self, kind: str, timeout: float, poll_interval: float = 0.025) -> LeaderLoss:
        """One leader change of ``kind``: "switchover" (Patroni's ``POST /switchover``),
        "graceful" or "kill" (:meth:`lose_leader`)."""
        if kind == "switchover":
            result = self.switchover(timeout=timeout)
            return LeaderLoss(result.old_leader, result.requested_at, result.election)
        return self.lose_leader(kind, timeout, poll_interval)

    # ----------------------------------------------------------------- failure injection

    def stop_member_gracefully(self, name: str, wait: bool = True, timeout: float = 30.0) -> float:
        """SIGTERM a member's Patroni: it stops PostgreSQL and releases the leader lock.

        Returns the monotonic time the signal was sent. With ``wait=False`` it returns at once
        (start a :meth:`watch_leader` first, or call :meth:`wait_stopped` later).
        """
        with self._lock:
            m = self.member(name)
            if m._patroni is None or not m._patroni.alive():
                raise ClusterError(f"{name} is not running")
            sent = time.monotonic()
            m._patroni.signal(signal.SIGTERM)
        if wait:
            self.wait_stopped(name, timeout)
        return sent

    def wait_stopped(self, name: str, timeout: float = 30.0) -> None:
        """Wait for a member's Patroni and PostgreSQL to exit after a graceful stop."""
        m = self.member(name)
        if m._popen is not None:
            try:
                m._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._failed = True
                raise ClusterError(
                    f"Patroni of {name} did not exit within {timeout}s after SIGTERM\n"
                    f"{self.diagnostics([name])}"
                ) from None
        pm = m.postmaster
        if pm is not None and wait_gone([pm], 10.0):
            # Patroni exited but left PostgreSQL running: not a graceful stop; clean up.
            kill_all([pm])
            self._failed = True
            raise ClusterError(f"PostgreSQL of {name} survived its Patroni's SIGTERM; killed it")

    def kill_member(self, name: str) -> float:
        """SIGKILL a member's Patroni, postmaster and all their children (a crashed node).

        No leader lock is released, so a failover follows only once the TTL expires. Returns
        the monotonic time of the kill.
        """
        with self._lock:
            m = self.member(name)
            targets = [p for p in (m._patroni, m.postmaster) if p is not None and p.alive()]
            if not targets:
                raise ClusterError(f"{name} is not running")
            killed_at = time.monotonic()
            survivors = kill_all(targets)
            if m._popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    m._popen.wait(timeout=5)
            if survivors:
                raise ClusterError(f"could not kill {name}: {[p.describe() for p in survivors]}")
            return killed_at

    def start_member(self, name: str, wait: bool = True, timeout: float = 120.0) -> None:
        """(Re)start a stopped or killed member; with ``wait``, until it streams as a replica.

        If the member was killed while leader, its lock is still in etcd until the TTL expires
        and a restarted Patroni would simply take the leadership back (no failover at all). So
        while other members run, this first waits until the lock has moved to one of them.
        After a kill, Patroni rewinds the old timeline with pg_rewind (or, if that fails,
        re-clones the member), which is what makes the rejoin reliable.
        """
        m = self.member(name)
        if m.running:
            raise ClusterError(f"{name} is already running")
        others = [o for o in self.members if o.name != name and o.running]
        deadline = time.monotonic() + timeout
        if others and self.dcs_leader() == name:
            log.info("%s still holds the leader lock; waiting for the failover first", name)
            poll_until(
                lambda: self.dcs_leader() not in (name, None),
                timeout=max(1.0, deadline - time.monotonic()),
                interval=0.2,
                what=f"the leader lock of the stopped {name} to move to another member",
                details=self._statuses_text,
            )
        with self._lock:
            self._launch_patroni(m)
        if not wait:
            return

        def rejoined() -> bool:
            self._check_processes([m])
            s = self.status(name)
            return s.streaming if others else s.primary

        poll_until(
            rejoined,
            max(1.0, deadline - time.monotonic()),
            what=f"{name} to rejoin as a {'streaming replica' if others else 'primary'}",
            details=lambda: self.diagnostics([name], 40),
        )

    def ensure_healthy(self, timeout: float = 120.0) -> str:
        """Start every member that is not running, then :meth:`wait_healthy`; return leader."""
        deadline = time.monotonic() + timeout
        for m in self.members:
            if not m.running:
                self.start_member(m.name, wait=False, timeout=timeout)
        return self.wait_healthy(timeout=max(1.0, deadline - time.monotonic()))

    def switchover(self, candidate: str | None = None, timeout: float = 60.0) -> SwitchoverResult:
        """Planned leader change through Patroni's ``POST /switchover`` on the current leader.

        ``candidate`` defaults to the first streaming replica. The request carries no
        credentials: the harness configures no REST API authentication.
        """
        old = self.leader()
        if old is None:
            raise ClusterError(f"switchover needs a leader\n{self._statuses_text()}")
        if candidate is None:
            streaming = [n for n in self.replicas() if n != old]
            if not streaming:
                raise ClusterError(f"no streaming replica to switch to\n{self._statuses_text()}")
            candidate = streaming[0]
        if candidate == old:
            raise ClusterError(f"{candidate} is already the leader")
        leader = self.member(old)
        with self.watch_leader(exclude={old}) as watch:
            requested_at = time.monotonic()
            member_api.post_switchover(leader, old, candidate, timeout)
            election = watch.result(
                max(1.0, timeout - (time.monotonic() - requested_at)), self._statuses_text
            )
        if election.name != candidate:
            raise ClusterError(f"switchover to {candidate} made {election.name} the leader")
        return SwitchoverResult(old, election.name, requested_at, election)

    def set_maintenance_mode(self, enabled: bool, timeout: float = 15.0) -> None:
        """Pause (or resume) Patroni's automation: ``PATCH /config {"pause": ...}``.

        While paused Patroni neither fails over nor "repairs" members, e.g. it no longer
        resumes a WAL replay paused with ``pg_wal_replay_pause()`` (Patroni 4 does that at
        the next HA loop otherwise). Returns once every running member reports the mode.
        """
        running = [m for m in self.members if m.running]
        if not running:
            raise ClusterError("no running member to configure")
        target = self.member(self.leader() or running[0].name)
        member_api.patch_pause(target, enabled)
        poll_until(
            lambda: all(member_api.reports_pause(m) is enabled for m in running),
            timeout,
            what=f"every member to report pause={enabled}",
            details=self._statuses_text,
        )

    def patch_config(self, patch: dict[str, Any]) -> dict[str, Any]:
        """``PATCH /config`` on the leader (or any running member): Patroni's dynamic
        configuration, e.g. ``{"synchronous_mode": True}``; ``None`` removes a key. Patroni
        applies it at each member's next HA loop: wait for its effect, not for this call."""
        running = [m for m in self.members if m.running]
        if not running:
            raise ClusterError("no running member to configure")
        return member_api.patch_config(self.member(self.leader() or running[0].name), patch)

    @contextlib.contextmanager
    def maintenance_mode(self, timeout: float = 15.0) -> Iterator[None]:
        """``with cluster.maintenance_mode():`` — paused automation, resumed on exit."""
        self.set_maintenance_mode(True, timeout)
        try:
            yield
        finally:
            self.set_maintenance_mode(False, timeout)

    def set_failsafe_mode(self, enabled: bool, timeout: float = 30.0) -> None:
        """Turn Patroni's ``failsafe_mode`` on (or off): ``PATCH /config``.

        On: returns once the leader has written every running member to the DCS's
        ``/failsafe`` key (``GET /failsafe``), which it does in its next HA loop; only then
        does a DCS outage keep it primary (``Ha.check_failsafe_topology``). Off: ``null``
        removes the setting (Patroni's default, off).
        """
        patch = {"failsafe_mode": True if enabled else None}

        def accepted() -> bool:
            for member in self.members:
                if member.running:
                    try:
                        member_api.patch_config(member, patch)
                        return True
                    except ClusterError:
                        continue
            return False

        poll_until(
            accepted,
            timeout,
            what=f"a member to accept PATCH /config {patch}",
            details=self._statuses_text,
        )
        if not enabled:
            return
        wanted = {m.name for m in self.members if m.running}

        def written() -> bool:
            leader = self.leader()
            listed = member_api.failsafe_members(self.member(leader)) if leader else None
            return wanted <= set(listed or {})

        poll_until(
            written,
            timeout,
            what=f"the /failsafe key to list {sorted(wanted)}",
            details=self._statuses_text,
        )

    @contextlib.contextmanager
    def failsafe_mode(self, timeout: float = 30.0) -> Iterator[None]:
        """``with cluster.failsafe_mode():`` — failsafe on, off again on exit."""
        self.set_failsafe_mode(True, timeout)
        try:
            yield
        finally:
            self.set_failsafe_mode(False, timeout)

    @contextlib.contextmanager
    def dcs_paused(self, limit: float = 120.0) -> Iterator[float]:
        """etcd SIGSTOPped for the block: it answers nothing, as a DCS behind a partition
        does (connections open, no reply). Resumed however the block ends, and by a timer
        after ``limit`` s at the latest. Yields the monotonic time it was stopped."""
        proc = self._etcd
        if proc is None:
            raise ClusterError("no etcd to pause (not started, or the Kubernetes DCS)")
        timer = threading.Timer(limit, proc.signal, (signal.SIGCONT,))
        timer.daemon = True
        if not proc.signal(signal.SIGSTOP):
            raise ClusterError(f"etcd is gone: {proc.describe()}")
        stopped = time.monotonic()
        timer.start()
        try:
            yield stopped
        finally:
            timer.cancel()
            proc.signal(signal.SIGCONT)
