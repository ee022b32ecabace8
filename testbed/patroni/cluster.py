"""A real 3-member Patroni cluster on loopback, for tests, the demo and benchmarks: its lifecycle.

Topology (fixed by the project, it plays a Kubernetes StatefulSet ``pg-orders``): members
``pg-orders-0..2`` on 127.0.0.2-4, PostgreSQL on port 5432 and the Patroni REST API on port 8008
of each address, one etcd on 127.0.0.1:2379 used through Patroni's ``etcd3:`` section (etcd 3.5
has the v2 API off). Timing profile ``ttl 20 / loop_wait 2 / retry_timeout 5``: 20 s is the
smallest TTL Patroni accepts, so a crashed leader is replaced as fast as Patroni allows.

Why the harness is this careful about processes: Patroni starts the postmaster *detached*, so
stopping Patroni does not stop PostgreSQL, and a test that fails half-way, a Ctrl-C or a killed
pytest must not leave servers holding the ports (the next run would fail to start, or worse,
talk to the old cluster). Hence: every process is tracked by PID + start time, teardown kills by
PID (postmasters found through ``postmaster.pid``), every process carries the run's base dir in
its environment so leftovers of a crashed run can be found and killed before the next start,
and a watchdog process tears the cluster down if the harness process dies without doing so.

This module holds :class:`PatroniCluster`, the lifecycle (start, stop, restart) and the
failures tests inject; the jobs it delegates each have a module: the topology and a member's
files (:mod:`testbed.patroni.layout`), ``patroni.yml`` (:mod:`testbed.patroni.config`), the REST
API's TLS
material (:mod:`testbed.patroni.tls`), etcd (:mod:`testbed.patroni.etcd`), starting files and
processes
(:mod:`testbed.patroni.processes`), member status and leader election
(:mod:`testbed.patroni.election`),
Patroni's Kubernetes DCS instead of etcd (:mod:`testbed.patroni.kubernetes_dcs`),
REST actions (:mod:`testbed.patroni.rest`), SQL (:mod:`testbed.patroni.sql`) and bounded waiting
(:mod:`testbed.patroni.waiting`). Every public name of those is importable from here and from
:mod:`testbed.patroni`, as before the split.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from testbed.patroni import config, etcd, kubernetes_dcs, processes, rest, tls
from testbed.patroni import sql as sql_
from testbed.patroni._proc import Proc, kill_all, shutdown, teardown_base_dir, wait_gone
from testbed.patroni._runtime import Runtime, cluster_user, resolve_runtime
from testbed.patroni.address_locks import AddressLocks
from testbed.patroni.election import (
    LeaderElection,
    LeaderLoss,
    LeaderWatch,
    MemberStatus,
    SwitchoverResult,
    member_status,
)
from testbed.patroni.errors import ClusterError
from testbed.patroni.layout import (
    API_PORT,
    ETCD_CLIENT_PORT,
    ETCD_HOST,
    ETCD_PEER_PORT,
    FIRST_MEMBER_IP,
    NAMESPACE,
    PG_PORT,
    REPLICATION_USER,
    SCOPE,
    SUPERUSER,
    Member,
    RestApiTLS,
)
from testbed.patroni.leftovers import check_ports_free, kill_leftovers
from testbed.patroni.waiting import poll_until, tail

__all__ = [
    "API_PORT",
    "ETCD_CLIENT_PORT",
    "ETCD_HOST",
    "ETCD_PEER_PORT",
    "FIRST_MEMBER_IP",
    "NAMESPACE",
    "PG_PORT",
    "REPLICATION_USER",
    "SCOPE",
    "SUPERUSER",
    "LeaderElection",
    "LeaderLoss",
    "LeaderWatch",
    "Member",
    "MemberStatus",
    "PatroniCluster",
    "RestApiTLS",
    "SwitchoverResult",
    "poll_until",
    "running_cluster",
    "tail",
]

log = logging.getLogger("devcluster")

_LIVE: weakref.WeakSet[PatroniCluster] = weakref.WeakSet()


class PatroniCluster:
    """Start, inspect, break and tear down the local Patroni cluster. Use as a context manager.

    >>> with PatroniCluster() as cluster:          # doctest: +SKIP
    ...     leader = cluster.leader()
    ...     cluster.kill_member(leader)
    ...     new = cluster.wait_for_leader(exclude={leader}, timeout=60)
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        members: int = 3,
        *,
        scope: str = SCOPE,
        ttl: int = 20,
        loop_wait: int = 2,
        retry_timeout: int = 5,
        user: str | None = None,
        superuser_password: str = "postgres-devcluster",
        replication_password: str = "replicator-devcluster",
        kill_leftovers: bool = True,
        keep: bool = False,
        fsync: bool = False,
        restapi_tls: RestApiTLS | None = None,
        first_ip: int = FIRST_MEMBER_IP,
        etcd_host: str = ETCD_HOST,
        kubernetes: kubernetes_dcs.KubernetesDCS | None = None,
    ) -> None:
        """Describe the cluster; nothing starts before :meth:`start`.

        ``base_dir``: where everything lives (a fresh temp dir by default, removed on
        :meth:`stop`; a given dir must be empty or hold an earlier run of this harness).
        ``keep``: leave data and logs on :meth:`stop`. ``fsync`` is off by default: the data is
        thrown away and an OS crash is not among the failures this harness simulates (SIGKILL
        keeps the page cache), while fsync on a slow CI disk costs seconds per start.
        ``restapi_tls``: serve the REST API over HTTPS (see :class:`RestApiTLS`).
        ``first_ip``/``etcd_host``: another address block (members on ``127.0.0.<first_ip>``
        and up, etcd on ``etcd_host``), for a second, small cluster next to the default one.
        ``kubernetes``: keep the DCS in that namespace of a real API server through Patroni's
        ``kubernetes:`` section (no etcd is started); each member's Pod must exist before
        :meth:`start` (:func:`testbed.patroni.kubernetes_dcs.create_member_pods`).
        """
        if not 1 <= members <= 200:
            raise ValueError("members must be between 1 and 200")
        if not 2 <= first_ip <= 254 - members:
            raise ValueError("first_ip must leave room for the members in 127.0.0.2-254")
        if ipaddress.ip_address(etcd_host) not in ipaddress.ip_network("127.0.0.0/8"):
            raise ValueError("etcd_host must be a loopback address")
        self.first_ip, self.etcd_host = first_ip, etcd_host
        self.kubernetes = kubernetes
        self.restapi_tls = restapi_tls
        if loop_wait + 2 * retry_timeout > ttl:
            raise ValueError("Patroni requires loop_wait + 2 * retry_timeout <= ttl")
        self.scope = scope
        self.ttl, self.loop_wait, self.retry_timeout = ttl, loop_wait, retry_timeout
        self.superuser_password = superuser_password
        self.replication_password = replication_password
        self.fsync = fsync
        self.keep = keep
        self._user_name = user
        self._kill_leftovers = kill_leftovers
        self._given_base_dir = base_dir
        self._n_members = members
        self.base_dir: Path = base_dir or Path("/nonexistent-devcluster-not-started")
        self.members: list[Member] = []
        self.runtime: Runtime | None = None
        self._etcd_popen: subprocess.Popen[bytes] | None = None
        self._etcd: Proc | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._started = False
        self._failed = False
        self._lock = threading.RLock()
        self._address_locks: AddressLocks | None = None
        self.startup_seconds: float | None = None

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

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> PatroniCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop(keep_logs=True if exc is not None else None)
        except ClusterError as err:
            if exc is None:
                raise
            print(f"devcluster: teardown after an error also failed: {err}", file=sys.stderr)

    def start(self, timeout: float = 60.0) -> None:
        """Start etcd and all members; return when there is one leader and all others stream.

        On failure everything started so far is killed, the logs are kept, and the
        :class:`ClusterError` carries the tails of the relevant logs.
        """
        with self._lock:
            if self._started:
                raise ClusterError("cluster already started")
            # Another run on this machine's same addresses: wait for it (not part of timeout).
            self._address_locks = AddressLocks(self.addresses)
            waited = self._address_locks.acquire()
            if waited > 1.0:
                log.warning("waited %.0f s for another devcluster run on these addresses", waited)
            t0 = time.monotonic()
            self._started = True
            _LIVE.add(self)
            try:
                self._prepare(t0 + timeout)
                if self.kubernetes is None:
                    self._start_etcd(deadline=t0 + min(timeout, 30))
                for m in self.members:
                    self._launch_patroni(m)
                self.wait_healthy(timeout=max(1.0, t0 + timeout - time.monotonic()))
            except BaseException:
                self._failed = True
                with contextlib.suppress(Exception):
                    self.stop(keep_logs=True)
                raise
            self.startup_seconds = time.monotonic() - t0
            log.info("cluster up in %.1fs: leader %s", self.startup_seconds, self.leader())

    def restart(self, timeout: float = 90.0) -> None:
        """Throw the cluster away (logs kept) and start a fresh one in a new base dir.

        For test fixtures that must recover from a cluster a previous test left broken.
        """
        self.stop(keep_logs=True)
        self._failed = False
        self.start(timeout=timeout)

    def stop(self, keep_logs: bool | None = None) -> None:
        """Tear everything down by PID; safe to call repeatedly, after failures, from atexit.

        Order: Patroni first (SIGKILL, so it cannot restart a postmaster behind our back), then
        the postmasters with SIGQUIT (immediate shutdown: fast, yet the postmaster still removes
        its shared memory), then etcd, then SIGKILL for anything of this run still alive,
        found by PID and by a scan of ``/proc`` for processes of this base dir.

        Files: with ``keep`` (constructor) nothing is removed; otherwise data is removed and the
        logs are kept if ``keep_logs`` is true (default: only when something failed).
        """
        with self._lock:
            if not self._started:
                return
            self._started = False
            _LIVE.discard(self)
            try:
                survivors = self._kill_everything()
                self._stop_watchdog()
            finally:
                if self._address_locks is not None:
                    self._address_locks.release()
            keep_logs = self._failed if keep_logs is None else keep_logs
            self._remove_files(keep_logs or bool(survivors))
            if survivors:
                raise ClusterError("could not stop: " + ", ".join(p.describe() for p in survivors))

    def _kill_everything(self) -> list[Proc]:
        known = [m._patroni for m in self.members] + [m.postmaster for m in self.members]
        known.append(self._etcd)
        survivors = shutdown([p for p in known if p is not None and p.alive()])
        for popen in [m._popen for m in self.members] + [self._etcd_popen]:
            if popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=5)
        for m in self.members:
            m._popen, m._patroni = None, None
        self._etcd_popen, self._etcd = None, None
        # Anything of this run not tracked above, e.g. a postmaster whose Patroni was restarted.
        if self.base_dir.is_dir():
            survivors += teardown_base_dir(self.base_dir)
        return [p for p in survivors if p.alive()]

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            processes.stop_watchdog(self._watchdog)
            self._watchdog = None

    def _remove_files(self, keep_logs: bool) -> None:
        if self.keep or not self.base_dir.is_dir():
            if self.keep:
                log.info("kept %s", self.base_dir)
            return
        if not keep_logs and self._given_base_dir is None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            return
        # Data is big (~100 MB per member) and useless after the fact; configs and logs are not.
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
        shutil.rmtree(self.base_dir / "etcd", ignore_errors=True)
        if keep_logs:
            log.warning("devcluster logs kept in %s", self.logs_dir)
            print(f"devcluster: logs kept in {self.logs_dir}", file=sys.stderr)

    # ----------------------------------------------------------------- start-up steps

    def _prepare(self, deadline: float) -> None:
        """Kill leftovers, make the base dir, pick the runtime, write configs, start watchdog."""
        if self._kill_leftovers:
            killed = kill_leftovers(self.addresses)
            if killed:
                log.warning("killed leftovers of earlier runs: %s", "; ".join(killed))
        check_ports_free(self.addresses)
        user = cluster_user(self._user_name)
        self.base_dir = processes.make_base_dir(
            self._given_base_dir, self.scope, user.uid, user.gid
        )
        self.logs_dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.logs_dir, user.uid, user.gid)
        self.runtime = resolve_runtime(self._user_name, writable=[self.base_dir, self.logs_dir])
        log.info("runtime: %s; user %s", self.runtime.source, self.runtime.user.name)
        processes.write_marker(self.base_dir, self.scope)
        self._watchdog = processes.start_watchdog(self.base_dir, self.logs_dir / "watchdog.log")
        tls_files = tls.copy_files(self.restapi_tls, self.tls_dir, user.uid, user.gid)
        if self.kubernetes is not None:
            kubernetes_dcs.write_member_files(
                self.kubernetes, self.kubernetes_dir, user.uid, user.gid
            )
        client_context = tls.client_context(tls_files)
        self.members = []
        for i in range(self._n_members):
            m = Member(
                name=f"{self.scope}-{i}",
                ip=f"127.0.0.{self.first_ip + i}",
                dir=self.base_dir / f"{self.scope}-{i}",
                logs_dir=self.logs_dir,
                tls=client_context,
            )
            sock = m.socket_dir / f".s.PGSQL.{m.pg_port}"
            if len(str(sock)) > 100:
                raise ClusterError(f"base dir too deep: socket path {sock} exceeds ~100 bytes")
            for d in (m.dir, m.socket_dir):
                d.mkdir(mode=0o700, exist_ok=True)
                os.chown(d, user.uid, user.gid)
            m.config_file.write_text(yaml.safe_dump(self.patroni_config(m), sort_keys=False))
            m.config_file.chmod(0o600)
            os.chown(m.config_file, user.uid, user.gid)
            self.members.append(m)
        if time.monotonic() > deadline:
            raise ClusterError("start timeout used up while preparing")

    @property
    def kubernetes_dir(self) -> Path:
        """The members' kubeconfig and the API server's CA, for the cluster user."""
        return self.base_dir / "kubernetes"

    @property
    def tls_dir(self) -> Path:
        """Where the REST API's TLS files are copied for the cluster user."""
        return self.base_dir / "tls"

    def _env(self) -> dict[str, str]:
        assert self.runtime is not None
        return processes.environment(self.runtime, self.base_dir)

    def _start_etcd(self, deadline: float) -> None:
        assert self.runtime is not None
        self._etcd_popen, self._etcd = etcd.start(
            self.runtime.etcd, self.etcd_host, self.base_dir, self.etcd_log, self._env(), deadline
        )

    def patroni_config(self, m: Member) -> dict[str, Any]:
        """The ``patroni.yml`` of member ``m`` (as a dict; written as YAML)."""
        assert self.runtime is not None
        return config.patroni_config(
            m,
            scope=self.scope,
            ttl=self.ttl,
            loop_wait=self.loop_wait,
            retry_timeout=self.retry_timeout,
            etcd_host=self.etcd_host,
            pg_bin_dir=self.runtime.pg_bin_dir,
            superuser_password=self.superuser_password,
            replication_password=self.replication_password,
            fsync=self.fsync,
            restapi_tls=self.restapi_tls,
            tls_dir=self.tls_dir,
            kubernetes=None
            if self.kubernetes is None
            else kubernetes_dcs.config_section(m.pg_port),
        )

    def _launch_patroni(self, m: Member) -> None:
        assert self.runtime is not None
        env = self._env()
        if self.kubernetes is not None:
            kubeconfig = self.kubernetes_dir / "kubeconfig"
            env.update(kubernetes_dcs.member_environment(self.kubernetes, m.ip, kubeconfig))
        popen = processes.launch_patroni(self.runtime, m, env)
        previous = m._popen
        if previous is not None:
            # Reap the earlier Patroni (stopped or killed without a wait), so its Popen is not
            # garbage-collected with a "still running" ResourceWarning.
            with contextlib.suppress(subprocess.TimeoutExpired):
                previous.wait(timeout=5)
        m._popen = popen
        m._patroni = Proc.of(popen.pid)

    # ----------------------------------------------------------------- inspection

    def status(self, name: str, timeout: float = 1.0) -> MemberStatus:
        """GET ``/primary`` and ``/replica`` on one member (their bodies are Patroni's status)."""
        return member_status(self.member(name), timeout)

    def statuses(self) -> list[MemberStatus]:
        """:meth:`status` of every member."""
        return [self.status(m.name) for m in self.members]

    def patroni_info(self, name: str, timeout: float = 2.0) -> dict[str, Any]:
        """``GET /patroni`` of a member (full JSON; ``{}`` when it does not answer)."""
        return rest.patroni_info(self.member(name), timeout)

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

    def wait_for_leader(
        self, exclude: Iterable[str] = (), timeout: float = 60.0, poll_interval: float = 0.025
    ) -> LeaderElection:
        """Poll every ``poll_interval`` s until a member (not in ``exclude``) is primary."""
        watch = self.watch_leader(exclude, poll_interval)
        return watch.result(timeout, details=self._statuses_text)

    def _statuses_text(self) -> str:
        return "\n".join(map(str, self.statuses()))

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
            rest.post_switchover(leader, old, candidate, timeout)
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
        rest.patch_pause(target, enabled)
        poll_until(
            lambda: all(rest.reports_pause(m) is enabled for m in running),
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
        return rest.patch_config(self.member(self.leader() or running[0].name), patch)

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
                        rest.patch_config(member, patch)
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
            listed = rest.failsafe_members(self.member(leader)) if leader else None
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


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[PatroniCluster]:
    """``with running_cluster() as c:`` — shorthand for the context manager."""
    with PatroniCluster(**kwargs) as cluster:
        yield cluster


@atexit.register
def _stop_live_clusters() -> None:
    """Last line of defence at interpreter exit (the watchdog covers harder deaths)."""
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop(keep_logs=True)
