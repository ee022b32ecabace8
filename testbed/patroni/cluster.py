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

This module holds :class:`PatroniCluster` and its lifecycle (describe, start, stop, restart,
tear down); what it inherits has a module of its own: reading the cluster (layout, status,
waiting, SQL: :mod:`testbed.patroni.cluster_view`) and the member control API tests drive
(stop, kill and restart members, switchover, maintenance and failsafe modes, a paused DCS:
:mod:`testbed.patroni.cluster_control`). The jobs it delegates each have a module too: the
topology and a member's files (:mod:`testbed.patroni.layout`), ``patroni.yml``
(:mod:`testbed.patroni.config`), the REST API's TLS material (:mod:`testbed.patroni.tls`), etcd
(:mod:`testbed.patroni.etcd`), starting files and processes (:mod:`testbed.patroni.processes`),
member status and leader election (:mod:`testbed.patroni.election`), Patroni's Kubernetes DCS
instead of etcd (:mod:`testbed.patroni.kubernetes_dcs`), REST actions
(:mod:`testbed.patroni.member_api`), SQL (:mod:`testbed.patroni.sql`) and bounded waiting
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
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from testbed.patroni import config, etcd, kubernetes_dcs, processes, tls
from testbed.patroni._proc import Proc, shutdown, teardown_base_dir
from testbed.patroni._runtime import Runtime, cluster_user, resolve_runtime
from testbed.patroni.address_locks import AddressLocks
from testbed.patroni.cluster_control import MemberControl
from testbed.patroni.election import (
    LeaderElection,
    LeaderLoss,
    LeaderWatch,
    MemberStatus,
    SwitchoverResult,
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


class PatroniCluster(MemberControl):
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
