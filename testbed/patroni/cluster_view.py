"""The local Patroni cluster as tests read it: its layout, each member's status, waiting, SQL.

The read side of :class:`testbed.patroni.cluster.PatroniCluster` (its first base class):
where things are (addresses, logs, members by name or address), who is primary and who
streams right now, bounded waits for a healthy cluster or a new leader, and SQL on a member.
It starts and stops nothing; the lifecycle is :mod:`testbed.patroni.cluster`'s, the member
control API that breaks the cluster on purpose :mod:`testbed.patroni.cluster_control`'s.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from testbed.patroni import etcd, kubernetes_dcs, member_api
from testbed.patroni import sql as sql_
from testbed.patroni.election import (
    LeaderElection,
    LeaderWatch,
    MemberStatus,
    member_status,
)
from testbed.patroni.errors import ClusterError
from testbed.patroni.layout import (
    API_PORT,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    PG_PORT,
    Member,
)
from testbed.patroni.waiting import poll_until, tail


class ClusterView:
    """Layout, inspection, waiting and SQL of a :class:`~testbed.patroni.cluster.PatroniCluster`."""

    # Set by PatroniCluster's constructor and lifecycle.
    base_dir: Path
    members: list[Member]
    scope: str
    first_ip: int
    etcd_host: str
    kubernetes: kubernetes_dcs.KubernetesDCS | None
    superuser_password: str
    _n_members: int
    _etcd_popen: subprocess.Popen[bytes] | None
    _failed: bool

    # ----------------------------------------------------------------- layout & lookup

    @property
    def logs_dir(self) -> Path:
        """All log files: ``etcd.log``, ``<member>.patroni.log``, ``<member>.postgresql.log``."""
        return self.base_dir / "logs"

    @property
    def etcd_log(self) -> Path:
        """etcd's stdout/stderr."""
        return self.logs_dir / "etcd.log"

    @property
    def etcd_url(self) -> str:
        """The DCS endpoint Patroni uses."""
        return etcd.url(self.etcd_host)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Every (address, port) the cluster listens on."""
        addrs = []
        if self.kubernetes is None:
            addrs += [(self.etcd_host, ETCD_CLIENT_PORT), (self.etcd_host, ETCD_PEER_PORT)]
        for i in range(self._n_members):
            ip = f"127.0.0.{self.first_ip + i}"
            addrs += [(ip, PG_PORT), (ip, API_PORT)]
        return addrs

    def log_files(self) -> dict[str, Path]:
        """Name → path of every log the harness keeps (for people debugging a failed run)."""
        files = {"etcd": self.etcd_log, "watchdog": self.logs_dir / "watchdog.log"}
        for m in self.members:
            files[f"{m.name}.patroni"] = m.patroni_log
            files[f"{m.name}.postgresql"] = m.postgres_log
        return files

    def member(self, name_or_ip: str) -> Member:
        """Look a member up by name (``pg-orders-1``) or address (``127.0.0.3``)."""
        for m in self.members:
            if name_or_ip in (m.name, m.ip):
                return m
        raise KeyError(f"no member {name_or_ip!r}; members: {[m.name for m in self.members]}")

    def names(self) -> list[str]:
        """Member names in order."""
        return [m.name for m in self.members]

    # ----------------------------------------------------------------- inspection

    def status(self, name: str, timeout: float = 1.0) -> MemberStatus:
        """GET ``/primary`` and ``/replica`` on one member (their bodies are Patroni's status)."""
        return member_status(self.member(name), timeout)

    def statuses(self) -> list[MemberStatus]:
        """:meth:`status` of every member."""
        return [self.status(m.name) for m in self.members]

    def patroni_info(self, name: str, timeout: float = 2.0) -> dict[str, Any]:
        """``GET /patroni`` of a member (full JSON; ``{}`` when it does not answer)."""
        return member_api.patroni_info(self.member(name), timeout)

    def primaries(self) -> list[str]:
        """Members that answer 200 on ``/primary`` right now."""
        found = []
        for m in self.members:
            if m.api_get("/primary", timeout=0.5).status == 200:
                found.append(m.name)
        return found

    def leader(self) -> str | None:
        """The member answering 200 on ``/primary`` now; None in the middle of a failover.

        Raises :class:`ClusterError` if two members answer 200 at once (split brain), since
        every test built on this harness assumes that never happens.
        """
        found = self.primaries()
        if len(found) > 1:
            raise ClusterError(f"more than one member answers 200 on /primary: {found}")
        return found[0] if found else None

    def replicas(self) -> list[str]:
        """Members that are streaming replicas right now."""
        return [s.name for s in self.statuses() if s.streaming]

    def dcs_leader(self) -> str | None:
        """Who holds the leader lock in the DCS (it outlives a killed leader until its TTL)."""
        if self.kubernetes is not None:
            return kubernetes_dcs.leader_key_holder(self.kubernetes, self.scope)
        return etcd.leader_key_holder(self.etcd_host, self.scope)

    def diagnostics(self, names: Iterable[str] | None = None, lines: int = 25) -> str:
        """Statuses, PIDs and log tails, for error messages: enough to debug a failed CI run."""
        chosen = list(names) if names is not None else self.names()
        out = []
        for name in chosen:
            m = self.member(name)
            out.append(f"--- {self.status(name, timeout=0.5)}; pids {m.pids()}")
            out.append(f"--- {m.patroni_log} (tail):\n{tail(m.patroni_log, lines)}")
            out.append(f"--- {m.postgres_log} (tail):\n{tail(m.postgres_log, lines // 2)}")
        return "\n".join(out)

    # ----------------------------------------------------------------- waiting

    def _check_processes(self, expected: Iterable[Member]) -> None:
        """Fail fast (with the log) when a Patroni that should run has exited."""
        for m in expected:
            if m._popen is not None and m._popen.poll() is not None:
                code = m._popen.returncode
                raise ClusterError(
                    f"Patroni of {m.name} exited with {code}\n{self.diagnostics([m.name], 40)}"
                )
        if self._etcd_popen is not None and self._etcd_popen.poll() is not None:
            raise ClusterError(f"etcd exited; {self.etcd_log}:\n{tail(self.etcd_log)}")

    def wait_healthy(self, timeout: float = 60.0) -> str:
        """Wait until exactly one member is primary and every other member streams; return leader.

        Every member's Patroni must be running (restart stopped ones with :meth:`start_member`).
        """
        expected = list(self.members)
        last: list[MemberStatus] = []

        def healthy() -> str | None:
            nonlocal last
            self._check_processes(expected)
            last = self.statuses()
            primaries = [s.name for s in last if s.primary]
            if len(primaries) == 1 and all(s.streaming for s in last if not s.primary):
                return primaries[0]
            return None

        def details() -> str:
            stuck = [s.name for s in last if not (s.primary or s.streaming)] or self.names()
            return (
                "\n".join(map(str, last))
                + f"\n{self.diagnostics(stuck)}\n--- {self.etcd_log}:\n{tail(self.etcd_log, 10)}"
            )

        try:
            return poll_until(
                healthy,
                timeout,
                interval=0.2,
                what="one leader + streaming replicas",
                details=details,
            )
        except ClusterError:
            self._failed = True
            raise

    def wait_for_replicas(self, n: int | None = None, timeout: float = 60.0) -> list[str]:
        """Wait until at least ``n`` members (default: all but one) are streaming replicas."""
        want = len(self.members) - 1 if n is None else n

        def enough() -> list[str] | None:
            found = self.replicas()
            return found if len(found) >= want else None

        return poll_until(
            enough,
            timeout,
            what=f"{want} streaming replicas",
            details=lambda: "\n".join(map(str, self.statuses())),
        )

    def watch_leader(
        self, exclude: Iterable[str] = (), poll_interval: float = 0.025
    ) -> LeaderWatch:
        """Start polling ``/primary`` on members not in ``exclude``; see :class:`LeaderWatch`."""
        skip = set(exclude)
        return LeaderWatch([m for m in self.members if m.name not in skip], poll_interval)

    def wait_for_leader(
        self, exclude: Iterable[str] = (), timeout: float = 60.0, poll_interval: float = 0.025
    ) -> LeaderElection:
        """Poll every ``poll_interval`` s until a member (not in ``exclude``) is primary."""
        watch = self.watch_leader(exclude, poll_interval)
        return watch.result(timeout, details=self._statuses_text)

    def _statuses_text(self) -> str:
        return "\n".join(map(str, self.statuses()))

    # ----------------------------------------------------------------- SQL

    def dsn(self, member_or_ip: str, dbname: str = "postgres") -> str:
        """libpq connection string for the superuser on a member (TCP, password auth)."""
        return sql_.dsn(self.member(member_or_ip), self.superuser_password, dbname)

    def execute(
        self,
        member_or_ip: str,
        sql: str,
        params: tuple[Any, ...] | dict[str, Any] | None = None,
        dbname: str = "postgres",
        timeout: float = 10.0,
    ) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit) through psycopg2 (:func:`testbed.patroni.sql.execute`)."""
        return sql_.execute(self.dsn(member_or_ip, dbname), sql, params, timeout)

    def wait_for_rows(
        self,
        member_or_ip: str,
        sql: str,
        params: tuple[Any, ...] | dict[str, Any] | None = None,
        timeout: float = 10.0,
        interval: float = 0.05,
    ) -> list[tuple[Any, ...]]:
        """Repeat a query until it returns rows (:func:`testbed.patroni.sql.wait_for_rows`)."""
        return sql_.wait_for_rows(
            self.dsn(member_or_ip), member_or_ip, sql, params, timeout, interval
        )
