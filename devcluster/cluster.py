"""A real 3-member Patroni cluster on loopback, for tests, the demo and benchmarks.

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
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import importlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

import yaml

from devcluster import _http
from devcluster._proc import (
    ENV_BASE_DIR,
    ENV_WATCHDOG,
    Proc,
    kill_all,
    postmaster_pid,
    shutdown,
    teardown_base_dir,
    wait_gone,
)
from devcluster._runtime import Runtime, cluster_user, resolve_runtime
from devcluster.errors import ClusterError
from devcluster.leftovers import MARKER, check_ports_free, kill_leftovers

log = logging.getLogger("devcluster")

SCOPE = "pg-orders"
NAMESPACE = "/service/"
FIRST_MEMBER_IP = 2  # pg-orders-0 is 127.0.0.2, like a pod IP
PG_PORT = 5432
API_PORT = 8008
ETCD_HOST = "127.0.0.1"
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
SUPERUSER = "postgres"
REPLICATION_USER = "replicator"

T = TypeVar("T")

_LIVE: weakref.WeakSet[PatroniCluster] = weakref.WeakSet()


def poll_until(
    check: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
    details: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` until it returns something truthy; bounded by ``timeout`` and a call count.

    Raises :class:`ClusterError` naming ``what`` (plus ``details()``, e.g. log tails) on timeout.
    """
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        value = check()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval, remaining))
    extra = f"\n{details()}" if details is not None else ""
    raise ClusterError(f"timed out after {timeout:.1f}s waiting for {what}{extra}")


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file (or a note that it does not exist yet)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"<{path}: {exc.strerror}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class RestApiTLS:
    """HTTPS for every member's REST API: Patroni's ``restapi`` TLS settings.

    The files are copied into the run's base dir (the cluster user must read them). The
    server certificate must name every member's address (127.0.0.x) as an IP SAN.
    ``client_certfile``/``client_keyfile`` are what the members present to each other
    (``ctl.certfile``, needed with ``verify_client: required``) and what the harness's own
    requests present.
    """

    certfile: Path
    keyfile: Path
    cafile: Path
    client_certfile: Path
    client_keyfile: Path
    verify_client: str = "required"


@dataclass
class Member:
    """One Patroni member: static layout plus the live process handles."""

    name: str
    ip: str
    dir: Path
    logs_dir: Path
    pg_port: int = PG_PORT
    api_port: int = API_PORT
    #: The harness's HTTPS client context when the REST API uses TLS (``None``: HTTP).
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _patroni: Proc | None = field(default=None, repr=False)

    @property
    def api_url(self) -> str:
        """``http://127.0.0.x:8008`` — Patroni's REST API, what a prober would use."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.ip}:{self.api_port}"

    def api_get(self, path: str, timeout: float) -> _http.Response:
        """``GET`` on this member's REST API (over HTTPS with a client certificate if TLS)."""
        return _http.get(self.ip, self.api_port, path, timeout=timeout, tls=self.tls)

    @property
    def data_dir(self) -> Path:
        """PGDATA (created 0700 by initdb / pg_basebackup, owned by the cluster user)."""
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        """This member's own ``unix_socket_directories`` (all members share port 5432)."""
        return self.dir / "sock"

    @property
    def config_file(self) -> Path:
        """The member's ``patroni.yml``."""
        return self.dir / "patroni.yml"

    @property
    def patroni_log(self) -> Path:
        """Patroni's stdout/stderr (also bootstrap, initdb and early postmaster output)."""
        return self.logs_dir / f"{self.name}.patroni.log"

    @property
    def postgres_log(self) -> Path:
        """PostgreSQL's own log (``logging_collector``)."""
        return self.logs_dir / f"{self.name}.postgresql.log"

    @property
    def patroni_pid(self) -> int | None:
        """PID of the running Patroni process, if any."""
        return self._patroni.pid if self._patroni is not None and self._patroni.alive() else None

    @property
    def postmaster(self) -> Proc | None:
        """The running postmaster (from ``postmaster.pid``), if any."""
        return postmaster_pid(self.data_dir)

    @property
    def postmaster_pid(self) -> int | None:
        """PID of the running postmaster, if any."""
        proc = self.postmaster
        return proc.pid if proc is not None else None

    @property
    def running(self) -> bool:
        """Whether this member's Patroni process is alive (PostgreSQL may still be starting)."""
        return self.patroni_pid is not None

    def pids(self) -> dict[str, int]:
        """``{"patroni": pid, "postmaster": pid}`` for what is running now."""
        found = {"patroni": self.patroni_pid, "postmaster": self.postmaster_pid}
        return {k: v for k, v in found.items() if v is not None}


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
        """
        if not 1 <= members <= 200:
            raise ValueError("members must be between 1 and 200")
        if not 2 <= first_ip <= 254 - members:
            raise ValueError("first_ip must leave room for the members in 127.0.0.2-254")
        if ipaddress.ip_address(etcd_host) not in ipaddress.ip_network("127.0.0.0/8"):
            raise ValueError("etcd_host must be a loopback address")
        self.first_ip, self.etcd_host = first_ip, etcd_host
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
        return f"http://{self.etcd_host}:{ETCD_CLIENT_PORT}"

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Every (address, port) the cluster listens on."""
        addrs = [(self.etcd_host, ETCD_CLIENT_PORT), (self.etcd_host, ETCD_PEER_PORT)]
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
            t0 = time.monotonic()
            self._started = True
            _LIVE.add(self)
            try:
                self._prepare(t0 + timeout)
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
            survivors = self._kill_everything()
            self._stop_watchdog()
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
        if self._watchdog is None:
            return
        if self._watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                self._watchdog.stdin.close()
        try:
            self._watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait(timeout=5)
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
        self.base_dir = self._make_base_dir(user.uid, user.gid)
        self.logs_dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.logs_dir, user.uid, user.gid)
        self.runtime = resolve_runtime(self._user_name, writable=[self.base_dir, self.logs_dir])
        log.info("runtime: %s; user %s", self.runtime.source, self.runtime.user.name)
        self._write_marker()
        self._start_watchdog()
        tls_files = self._copy_tls_files(user.uid, user.gid)
        client_context = self._client_context(tls_files)
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

    def _copy_tls_files(self, uid: int, gid: int) -> dict[str, Path]:
        """The REST API's TLS files, copied where the cluster user can read them."""
        if self.restapi_tls is None:
            return {}
        directory = self.base_dir / "tls"
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chown(directory, uid, gid)
        copies: dict[str, Path] = {}
        for name in ("certfile", "keyfile", "cafile", "client_certfile", "client_keyfile"):
            source: Path = getattr(self.restapi_tls, name)
            copy = directory / name
            shutil.copyfile(source, copy)
            copy.chmod(0o600)
            os.chown(copy, uid, gid)
            copies[name] = copy
        return copies

    def _client_context(self, files: dict[str, Path]) -> ssl.SSLContext | None:
        """What the harness uses to talk to members over HTTPS (verifies their IP SANs)."""
        if not files:
            return None
        context = ssl.create_default_context(cafile=str(files["cafile"]))
        context.load_cert_chain(files["client_certfile"], files["client_keyfile"])
        return context

    def _make_base_dir(self, uid: int, gid: int) -> Path:
        if self._given_base_dir is None:
            parent = Path(tempfile.gettempdir())
            # The cluster user must traverse the parent; TMPDIR may point below /root.
            if not os.stat(parent).st_mode & 0o001:
                parent = Path("/var/tmp")
            base = Path(tempfile.mkdtemp(prefix=f"devcluster-{self.scope}-", dir=parent))
        else:
            base = self._given_base_dir.resolve()
            base.mkdir(parents=True, exist_ok=True)
            contents = [p for p in base.iterdir() if p.name != "logs"]
            if contents and not (base / MARKER).exists():
                raise ClusterError(f"{base} is neither empty nor an earlier devcluster base dir")
            teardown_base_dir(base)
            for p in contents:
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        os.chown(base, uid, gid)
        base.chmod(0o700)
        return base

    def _write_marker(self) -> None:
        me = Proc.of(os.getpid())
        marker = {
            "owner_pid": os.getpid(),
            "owner_start_time": me.start_time if me else None,
            "scope": self.scope,
            "created": time.time(),
            "argv": sys.argv,
        }
        (self.base_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")

    def _env(self) -> dict[str, str]:
        assert self.runtime is not None
        return {
            "PATH": f"{self.runtime.pg_bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TZ": "UTC",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            ENV_BASE_DIR: str(self.base_dir),
        }

    def _start_watchdog(self) -> None:
        """Start the process that cleans up if this one dies without calling :meth:`stop`.

        It blocks reading a pipe whose write end only this process holds; the pipe reaches EOF
        when this process exits for any reason (even SIGKILL), and the watchdog then kills the
        run's processes by scanning ``/proc``. It runs in its own session so a Ctrl-C aimed at
        the terminal's foreground process group does not reach it.
        """
        env = {**os.environ, ENV_WATCHDOG: "1"}
        repo = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.logs_dir / "watchdog.log", "ab") as out:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "devcluster._watchdog", str(self.base_dir)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                start_new_session=True,
            )

    def _start_etcd(self, deadline: float) -> None:
        assert self.runtime is not None
        data = self.base_dir / "etcd"
        data.mkdir(mode=0o700, exist_ok=True)
        peer = f"http://{self.etcd_host}:{ETCD_PEER_PORT}"
        argv = [
            str(self.runtime.etcd),
            "--name=devcluster",
            f"--data-dir={data}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=devcluster={peer}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self.base_dir.name}",
            "--log-level=warn",
        ]
        if _etcd_supports_no_fsync(self.runtime.etcd):
            argv.append("--unsafe-no-fsync")  # throwaway data; keeps CI disks out of the timings
        with open(self.etcd_log, "ab") as out:
            self._etcd_popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self._env(), "HOME": str(data)},
                cwd=str(data),
                start_new_session=True,
            )
        self._etcd = Proc.of(self._etcd_popen.pid)

        def healthy() -> bool:
            if self._etcd_popen is not None and self._etcd_popen.poll() is not None:
                raise ClusterError(
                    f"etcd exited with {self._etcd_popen.returncode}; "
                    f"{self.etcd_log}:\n{tail(self.etcd_log)}"
                )
            resp = _http.get(self.etcd_host, ETCD_CLIENT_PORT, "/health", timeout=1)
            return resp.status == 200 and resp.json().get("health") == "true"

        poll_until(
            healthy,
            max(1.0, deadline - time.monotonic()),
            interval=0.1,
            what=f"etcd to answer healthy on {self.etcd_url}/health",
            details=lambda: f"{self.etcd_log}:\n{tail(self.etcd_log)}",
        )

    def patroni_config(self, m: Member) -> dict[str, Any]:
        """The ``patroni.yml`` of member ``m`` (as a dict; written as YAML)."""
        assert self.runtime is not None
        return {
            "scope": self.scope,
            "namespace": NAMESPACE,
            "name": m.name,
            "log": {"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
            "restapi": {
                "listen": f"{m.ip}:{m.api_port}",
                "connect_address": f"{m.ip}:{m.api_port}",
                **self._restapi_tls_config(),
            },
            **self._ctl_tls_config(),
            "etcd3": {"hosts": [f"{self.etcd_host}:{ETCD_CLIENT_PORT}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl,
                    "loop_wait": self.loop_wait,
                    "retry_timeout": self.retry_timeout,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "postgresql": {
                        # A killed primary diverges from the new timeline; rewind it back.
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_connections": 50,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "64MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "data-checksums"],
            },
            "postgresql": {
                "listen": f"{m.ip}:{m.pg_port}",
                "connect_address": f"{m.ip}:{m.pg_port}",
                "data_dir": str(m.data_dir),
                "bin_dir": str(self.runtime.pg_bin_dir),
                "pgpass": str(m.dir / "pgpass"),
                "use_unix_socket": True,
                "authentication": {
                    "superuser": {"username": SUPERUSER, "password": self.superuser_password},
                    "replication": {
                        "username": REPLICATION_USER,
                        "password": self.replication_password,
                    },
                },
                "parameters": {
                    "unix_socket_directories": str(m.socket_dir),
                    "shared_buffers": "32MB",
                    "fsync": "on" if self.fsync else "off",
                    "logging_collector": "on",
                    "log_directory": str(self.logs_dir),
                    "log_filename": f"{m.name}.postgresql.log",
                    "log_line_prefix": "%m [%p] %q%u@%d ",
                },
                "pg_hba": [
                    "local all all trust",
                    "local replication all trust",
                    "host all all 127.0.0.0/8 scram-sha-256",
                    f"host replication {REPLICATION_USER} 127.0.0.0/8 scram-sha-256",
                ],
                "basebackup": [{"checkpoint": "fast"}],
                # If rewinding fails (or timelines diverged) rebuild from the leader instead of
                # leaving the member broken: rejoining must be reliable, the data is a copy.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }

    def _restapi_tls_config(self) -> dict[str, str]:
        if self.restapi_tls is None:
            return {}
        tls = self.base_dir / "tls"
        return {
            "certfile": str(tls / "certfile"),
            "keyfile": str(tls / "keyfile"),
            "cafile": str(tls / "cafile"),
            "verify_client": self.restapi_tls.verify_client,
        }

    def _ctl_tls_config(self) -> dict[str, Any]:
        """What members present when they call each other's REST API (the leader race)."""
        if self.restapi_tls is None:
            return {}
        tls = self.base_dir / "tls"
        return {
            "ctl": {
                "certfile": str(tls / "client_certfile"),
                "keyfile": str(tls / "client_keyfile"),
                "cacert": str(tls / "cafile"),
            }
        }

    def _launch_patroni(self, m: Member) -> None:
        assert self.runtime is not None
        rt = self.runtime
        argv = [str(rt.python), "-m", "patroni", str(m.config_file)]
        env = {**self._env(), "HOME": str(m.dir)}
        with open(m.patroni_log, "ab") as out:
            out.write(f"\n===== devcluster: starting {' '.join(argv)}\n".encode())
            out.flush()
            if rt.user.drop:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(m.dir),
                    start_new_session=True,
                    user=rt.user.uid,
                    group=rt.user.gid,
                    extra_groups=[],
                )
            else:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(m.dir),
                    start_new_session=True,
                )
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
        m = self.member(name)
        primary = m.api_get("/primary", timeout=timeout)
        if primary.status == 0:
            return MemberStatus(name, False, False, False, None, None, None, None, primary.error)
        replica = m.api_get("/replica", timeout=timeout)
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

    def statuses(self) -> list[MemberStatus]:
        """:meth:`status` of every member."""
        return [self.status(m.name) for m in self.members]

    def patroni_info(self, name: str, timeout: float = 2.0) -> dict[str, Any]:
        """``GET /patroni`` of a member (full JSON; ``{}`` when it does not answer)."""
        m = self.member(name)
        return m.api_get("/patroni", timeout=timeout).json()

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
        """Who holds the leader lock in etcd (the key outlives a killed leader until its TTL)."""
        key = f"{NAMESPACE}{self.scope}/leader"
        resp = _http.request(
            "POST",
            self.etcd_host,
            ETCD_CLIENT_PORT,
            "/v3/kv/range",
            {"key": base64.b64encode(key.encode()).decode()},
            timeout=2,
        )
        if resp.status != 200:
            raise ClusterError(f"etcd range request failed: {resp.status} {resp.error}")
        kvs = resp.json().get("kvs") or []
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

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
            resp = _http.request(
                "POST",
                leader.ip,
                leader.api_port,
                "/switchover",
                {"leader": old, "candidate": candidate},
                timeout=timeout,
                tls=leader.tls,
            )
            if resp.status != 200:
                raise ClusterError(
                    f"POST {leader.api_url}/switchover -> {resp.status} {resp.error} "
                    f"{resp.body.decode(errors='replace')}"
                )
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
        resp = _http.request(
            "PATCH", target.ip, target.api_port, "/config", {"pause": enabled}, timeout=5
        )
        if resp.status != 200:
            raise ClusterError(f"PATCH {target.api_url}/config -> {resp.status} {resp.error}")
        poll_until(
            lambda: all(
                bool(_http.get(m.ip, m.api_port, "/patroni").json().get("pause")) is enabled
                for m in running
            ),
            timeout,
            what=f"every member to report pause={enabled}",
            details=self._statuses_text,
        )

    @contextlib.contextmanager
    def maintenance_mode(self, timeout: float = 15.0) -> Iterator[None]:
        """``with cluster.maintenance_mode():`` — paused automation, resumed on exit."""
        self.set_maintenance_mode(True, timeout)
        try:
            yield
        finally:
            self.set_maintenance_mode(False, timeout)

    # ----------------------------------------------------------------- SQL

    def dsn(self, member_or_ip: str, dbname: str = "postgres") -> str:
        """libpq connection string for the superuser on a member (TCP, password auth)."""
        m = self.member(member_or_ip)
        return (
            f"host={m.ip} port={m.pg_port} dbname={dbname} user={SUPERUSER} "
            f"password={self.superuser_password} connect_timeout=5 application_name=devcluster"
        )

    def execute(
        self,
        member_or_ip: str,
        sql: str,
        params: tuple[Any, ...] | dict[str, Any] | None = None,
        dbname: str = "postgres",
        timeout: float = 10.0,
    ) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit) through psycopg2; return the rows, if any.

        ``statement_timeout`` bounds the statement itself (a write to a primary that lost its
        replicas does not block: the harness uses asynchronous replication).
        """
        # Imported by name: psycopg2 ships no type information (types-psycopg2 is not a
        # project dependency), and the module object is typed Any this way on purpose.
        psycopg2: Any = importlib.import_module("psycopg2")
        conn = psycopg2.connect(
            self.dsn(member_or_ip, dbname),
            options=f"-c statement_timeout={int(timeout * 1000)}",
        )
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql, params)
                rows = cur.fetchall() if cur.description is not None else []
        finally:
            conn.close()
        return [tuple(r) for r in rows]

    def wait_for_rows(
        self,
        member_or_ip: str,
        sql: str,
        params: tuple[Any, ...] | dict[str, Any] | None = None,
        timeout: float = 10.0,
        interval: float = 0.05,
    ) -> list[tuple[Any, ...]]:
        """Repeat a query until it returns rows (replication is asynchronous); return them.

        Errors count as "not yet": on a replica the table itself may not be replayed yet, and a
        member that is starting refuses connections for a moment.
        """
        last_error = ""

        def rows() -> list[tuple[Any, ...]] | None:
            nonlocal last_error
            try:
                return self.execute(member_or_ip, sql, params, timeout=2.0) or None
            except Exception as exc:  # psycopg2.Error, untyped
                last_error = f"{type(exc).__name__}: {exc}".strip()
                return None

        return poll_until(
            rows,
            timeout,
            interval=interval,
            what=f"rows from {sql!r} on {member_or_ip}",
            details=lambda: f"last error: {last_error or 'none (no rows)'}",
        )


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[PatroniCluster]:
    """``with running_cluster() as c:`` — shorthand for the context manager."""
    with PatroniCluster(**kwargs) as cluster:
        yield cluster


_NO_FSYNC_CACHE: dict[str, bool] = {}


def _etcd_supports_no_fsync(etcd: Path) -> bool:
    key = str(etcd)
    if key not in _NO_FSYNC_CACHE:
        try:
            out = subprocess.run(
                [key, "--help"], capture_output=True, text=True, timeout=10, check=False
            )
            _NO_FSYNC_CACHE[key] = "--unsafe-no-fsync" in out.stdout + out.stderr
        except (OSError, subprocess.SubprocessError):
            _NO_FSYNC_CACHE[key] = False
    return _NO_FSYNC_CACHE[key]


@atexit.register
def _stop_live_clusters() -> None:
    """Last line of defence at interpreter exit (the watchdog covers harder deaths)."""
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop(keep_logs=True)
