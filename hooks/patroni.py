"""Probing Patroni's REST API: the only outbound I/O of the hook.

Each member gets one ``GET`` of its health path. All members of a cluster are asked
concurrently, and the whole round has one deadline: a member that accepts the
connection and never answers (Patroni does exactly that for ~2 s while it shuts down)
costs the sync at most the deadline, never more. Nothing here raises: every failure
becomes :meth:`MemberStatus.unknown` (no answer) or :meth:`MemberStatus.not_patroni`
(an answer that is not Patroni's JSON) with a short, stable reason (stable, because it can
end up in a status condition, and a message that changes on every sync would make
Metacontroller write the status again and again).

Modelled on Patroni's own ``fetch_nodes_statuses`` (``patroni/ha.py``): fixed small
timeouts, no retries (the next resync is the retry), a thread pool.

The HTTP client is **requests** (HTTP/1.x and TLS are its and urllib3's, not ours), through
its transport API: one :class:`requests.adapters.HTTPAdapter` per process, whose ``send``
each probe calls with its prepared GET. No ``Session``: a Session's work per request is
merging its settings with the environment's (proxies, netrc, a CA bundle: none may apply
here), its cookie jar (a member's cookie must never travel to another member: with no jar
there is none to travel) and redirects (never followed, nor looked at). So: no proxy, netrc
or CA bundle from the environment, no redirect, no cookie, ``stream=True`` with a body read
capped at ``max_body_bytes``, ``(connect, read)`` timeouts cut to what is left of the round.
What the parsed answer means is :mod:`hooks.patroni_answer`'s, pure.

**The deadline is enforced here, not by the timeouts.** requests' read timeout bounds each
``recv``: a member that sends a byte every 0.3 s is never "timed out". A round probes its
first member in the calling (request) thread and every other one in a pool thread, all at
once; at the deadline every probe still running has its socket shut down (:class:`_Probe`):
the request thread's by the process's one :class:`_Cutter` thread, the pool's by the round
itself. So a trickling or hung member holds a thread no longer than the round that asked
it, and a pool thread is held at most one deadline per probe.

**Fairness: a bound per round.** A round holds at most ``round_threads`` pool threads at
once (16); each probe that ends starts the next member waiting. So the pool (``threads``,
256 = 16 request threads x 16) always has room for every round in progress, and one
cluster whose 63 members accept and never answer delays only itself: before the bound, 16
such rounds queued 1,008 probes on 256 threads, and every other cluster's probes waited
behind them, were cut at their deadline and reported unreachable (a quiet cluster's
failover was not followed). A healthy 64-member cluster's probes take milliseconds each,
so four waves of 16 cost it nothing noticeable. (The first member in the request thread
saves its hand-off to the pool and back: a one-member round uses no pool thread at all.)

TLS: one :class:`ssl.SSLContext` per set of files (:class:`TLSContexts`), verified against
the CA bundle (``check_hostname``: the pod IP, or ``spec.patroni.tls.serverName`` as SNI and
the name checked), with the client certificate; rebuilt when a file changes (inode, size or
mtime), so a renewed Secret is used without a restart and without a context per connection.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import ipaddress
import itertools
import logging
import os
import socket
import ssl
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util import Url

from hooks.core.policy import ProbePolicy
from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.domain.model import LEADER_PATHS, field_default
from hooks.loaders.patroni_answer import head_verdict, status_from_body, too_large
from hooks.shell.config import HookSettings, PatroniTLS
from hooks.shell.probe_failures import describe_failure

log = logging.getLogger(__name__)

#: Most bytes taken per read of the body.
_CHUNK = 16384
#: Most URL verdicts a prober remembers (a few per member of every cluster it probes).
_CHECKED_URLS = 4096
#: How long a round waits, after its deadline, for the probes it cut off to close their
#: sockets (they do within a millisecond once their socket is shut down).
_GRACE = 0.05
#: Connection pools kept (one per member address and serverName; each only recycles a
#: connection object: every probe closes its connection, as Patroni does).
_POOLS = 1024
#: Connection objects a pool keeps for reuse: as many as probes of one member can run at
#: once in a process (a gunicorn worker's request threads). Past it, urllib3 logs "pool is
#: full, discarding connection" at WARNING for every probe that ends: log noise, and a
#: formatted log line's CPU on each.
_POOL_SIZE = 32
#: The request's headers, exactly (a Session's defaults would add Accept-Encoding, and
#: ``Connection: keep-alive`` where Patroni closes every connection anyway).
_HEADERS = {
    "User-Agent": "pg-failover-hook",
    "Accept": "application/json",
    "Connection": "close",
}


class Prober(Protocol):
    """Anything that can ask a set of members; injected into the app (tests use fakes)."""

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target; return one status per target's pod name."""
        ...


class _Failure(Exception):
    """A probe that failed with a reason already worked out (internal)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------- one probe in flight


class _Probe:
    """One member's probe while it runs: its socket, so that the round can cut it off.

    The worker attaches each socket it opens (:class:`_Connection`, :class:`_TLSSocket`);
    the round calls :meth:`cut` at its deadline, which shuts the socket down: a ``recv``
    blocked in another thread returns at once. Under the lock, so a socket is never shut
    down after its probe has finished with it.
    """

    __slots__ = (
        "_lock",
        "_sock",
        "connected",
        "context",
        "cut_off",
        "done",
        "ends_at",
        "target",
        "url",
    )

    def __init__(self, target: ProbeTarget, ends_at: float) -> None:
        self.target = target
        self.ends_at = ends_at
        #: The target's URL, checked and parsed (the adapter picks the pool by it).
        self.url: Url | None = None
        #: The TLS context of an https probe (its files as they are now).
        self.context: ssl.SSLContext | None = None
        #: The TCP connection (and TLS handshake) is up: a timeout now is the read's.
        self.connected = False
        self.cut_off = False
        #: The worker is done with it: nothing left to cut.
        self.done = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def attach(self, sock: socket.socket) -> None:
        """The probe now talks over ``sock``; shut it at once if the round has ended."""
        with self._lock:
            self._sock = sock
            if self.cut_off:
                _shutdown(sock)

    def cut(self) -> None:
        """The round has ended without this probe's answer: stop its I/O now."""
        with self._lock:
            self.cut_off = True
            if self._sock is not None:
                _shutdown(self._sock)

    def finish(self) -> None:
        """The worker is done with the probe (its sockets are closed or about to be)."""
        with self._lock:
            self._sock = None
            self.done = True


def _shutdown(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also for an SSLSocket: SSLSocket.shutdown would drop
    # its SSL object under the thread that is reading with it.
    with contextlib.suppress(OSError):  # closed already, or never connected
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Cutter:
    """The thread that cuts request-thread probes off at their deadlines.

    A pool thread's probe is cut by the round that waits for it; the probe a round runs in
    its own thread has nobody else to do it, so it is :meth:`watch`ed here. One thread per
    process, asleep until the earliest deadline of a probe still running: finished probes
    are dropped when they come to the front, so under a steady load it wakes about once a
    deadline, not once a probe. Bounded: it holds the probes of one deadline's worth of
    rounds at most (each a few hundred bytes).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Probe]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, probe: _Probe) -> None:
        """Cut ``probe`` at its ``ends_at`` unless it has finished by then."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="patroni-probe-cutter", daemon=True
                )
                self._thread.start()
            heap = self._heap
            # Woken only when the new deadline comes first: the usual case is a later one.
            earlier = not heap or probe.ends_at < heap[0][0]
            heapq.heappush(heap, (probe.ends_at, next(self._order), probe))
            if earlier:
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        heap = self._heap
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                while heap and (heap[0][2].done or heap[0][0] <= now):
                    probe = heapq.heappop(heap)[2]
                    if not probe.done:
                        probe.cut()
                self._cond.wait(heap[0][0] - now if heap else None)


#: The probe the current thread runs (the connection classes attach to it).
_running = threading.local()


def _current() -> _Probe | None:
    probe: _Probe | None = getattr(_running, "probe", None)
    return probe


def _probe_here() -> _Probe:
    probe = _current()
    if probe is None:  # the adapter is the prober's own: only _exchange calls it
        raise RuntimeError("no probe runs in this thread")
    return probe


class _TLSSocket(ssl.SSLSocket):
    """An SSLSocket that is attached to its probe before the handshake starts.

    ``SSLContext.sslsocket_class`` (public since Python 3.7) makes the context's
    ``wrap_socket`` return this class: a member that trickles its handshake is cut off at
    the round's deadline like one that trickles its answer.
    """

    def do_handshake(self, block: bool = False) -> None:
        probe = _current()
        if probe is not None:
            probe.attach(self)
        super().do_handshake(block)


class _Connection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _connected(self.sock)


class _TLSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _connected(self.sock)


def _connected(sock: Any) -> None:
    probe = _current()
    if probe is not None and isinstance(sock, socket.socket):
        probe.attach(sock)
        probe.connected = True


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


# ----------------------------------------------------------------------------- TLS


class TLSContexts:
    """One client :class:`ssl.SSLContext` for the files of a :class:`PatroniTLS`.

    Built on first use, and again whenever a file's inode, size or mtime changes (a Secret
    volume swaps a symlink to a new directory: a new inode), so a renewed CA bundle or client
    certificate is used from the next probe on. Building costs 0.25 ms with a CA file,
    0.8 ms with a client certificate, ~20 ms with the system roots: once per change, not
    once per connection. A file that cannot be read or loaded is every https probe's
    reason, naming the setting, until it is fixed.
    """

    def __init__(self, tls: PatroniTLS) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._built: tuple[tuple[object, ...], ssl.SSLContext | str] | None = None

    def context(self) -> ssl.SSLContext:
        """The context for the files as they are now; :class:`_Failure` if unusable."""
        signature = self._signature()
        if isinstance(signature, str):
            raise _Failure(signature)
        built = self._built
        if built is None or built[0] != signature:
            with self._lock:
                built = self._built
                if built is None or built[0] != signature:
                    built = (signature, self._build())
                    self._built = built
        if isinstance(built[1], str):
            raise _Failure(built[1])
        return built[1]

    def problem(self) -> str | None:
        """Why https probes fail with these files, or ``None`` (start-up check)."""
        try:
            self.context()
        except _Failure as failure:
            return failure.reason
        return None

    def _files(self) -> list[tuple[str, str]]:
        tls = self.tls
        files = [("PGFH_PATRONI_CA_FILE", tls.ca_file)]
        if tls.client_cert_file and tls.client_key_file:
            files += [
                ("PGFH_PATRONI_CLIENT_CERT_FILE", tls.client_cert_file),
                ("PGFH_PATRONI_CLIENT_KEY_FILE", tls.client_key_file),
            ]
        return [(setting, path) for setting, path in files if path]

    def _signature(self) -> tuple[object, ...] | str:
        signature: list[object] = []
        for setting, path in self._files():
            try:
                stat = os.stat(path)
            except OSError as error:
                return f"TLS: cannot read {setting} {path} ({error.strerror})"
            signature.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
        return tuple(signature)

    def _build(self) -> ssl.SSLContext | str:
        tls = self.tls
        try:
            context = ssl.create_default_context(cafile=tls.ca_file)
        except (OSError, ssl.SSLError):
            return f"TLS: no CA certificate could be loaded from PGFH_PATRONI_CA_FILE {tls.ca_file}"
        if tls.client_cert_file and tls.client_key_file:
            try:
                context.load_cert_chain(tls.client_cert_file, tls.client_key_file)
            except (OSError, ssl.SSLError):
                return (
                    "TLS: the client certificate could not be loaded "
                    "(PGFH_PATRONI_CLIENT_CERT_FILE / PGFH_PATRONI_CLIENT_KEY_FILE)"
                )
        # check_hostname stays on (the default): OpenSSL checks the pod IP, or the
        # serverName sent as SNI, while it verifies the chain. urllib3 only checks names
        # itself when asked to assert another one, and it would switch check_hostname
        # off on this shared context to do so.
        context.sslsocket_class = _TLSSocket
        return context


# -------------------------------------------------------------------- requests glue


class _Adapter(HTTPAdapter):
    """requests' adapter with the probe's pool, TLS context and serverName, and cut-off sockets.

    Only :meth:`PatroniProber._exchange` sends through it, for the probe of its thread, whose
    URL is already checked and parsed: the pool comes from that (no proxy is ever looked up,
    nor the URL parsed again). Every https pool gets the probe's :class:`ssl.SSLContext` and,
    with a serverName, that name as ``server_hostname`` (SNI and the name OpenSSL checks);
    both are part of urllib3's pool key, so a rotated context or another cluster's name gets
    its own pools.
    """

    def __init__(self) -> None:
        super().__init__(pool_connections=_POOLS, pool_maxsize=_POOL_SIZE, max_retries=0)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}

    def get_connection_with_tls_context(
        self,
        request: requests.PreparedRequest,
        verify: Any,
        proxies: Mapping[str, str] | None = None,
        cert: Any = None,
    ) -> HTTPConnectionPool:
        probe = _probe_here()
        url = probe.url
        if url is None or url.host is None:
            raise RuntimeError("the probe's URL was not checked")
        host = url.host.removeprefix("[").removesuffix("]")
        pool: HTTPConnectionPool
        if url.scheme != "https":
            pool = self.poolmanager.connection_from_host(host, url.port, "http")
            return pool
        tls: dict[str, Any] = {"ssl_context": probe.context, "cert_reqs": "CERT_REQUIRED"}
        if probe.target.server_name:
            tls["server_hostname"] = probe.target.server_name
        pool = self.poolmanager.connection_from_host(host, url.port, "https", pool_kwargs=tls)
        return pool

    def request_url(self, request: requests.PreparedRequest, proxies: Any) -> str:
        """The path: never a proxy (requests' own looks one up in ``proxies``)."""
        url = _probe_here().url
        return url.path if url is not None and url.path else "/"

    def build_response(self, req: requests.PreparedRequest, resp: Any) -> requests.Response:
        """The status and the raw urllib3 response, which the prober reads itself.

        requests' own also copies the headers into a dict of its own, works out a text
        encoding and extracts cookies into a jar: none of which the prober uses (it reads
        ``raw.headers``), and the cookies must never be kept anyway.
        """
        response = requests.Response()
        response.status_code = resp.status
        response.raw = resp
        response.reason = resp.reason
        response.url = req.url or ""
        response.request = req
        response.connection = self
        return response

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        """Nothing per connection: the context holds the CA bundle and client certificate.

        requests' own would set a CA file on the pool (its certifi bundle at least), which
        urllib3 then loads into the shared context for every connection.
        """


# ------------------------------------------------------------------------ the prober

#: Probers of this process: their pools are dropped in a forked child (threads do not
#: survive a fork, and two processes must not share connections).
_probers: weakref.WeakSet[PatroniProber] = weakref.WeakSet()


def _after_fork() -> None:
    for prober in list(_probers):
        prober._forget()


os.register_at_fork(after_in_child=_after_fork)


@dataclass(frozen=True, slots=True)
class _Pools:
    executor: ThreadPoolExecutor
    adapter: _Adapter
    cutter: _Cutter


class PatroniProber:
    """Concurrent, bounded probes through :mod:`requests` in a thread pool.

    The defaults are :class:`~hooks.shell.config.HookSettings`' (the operator's ``PGFH_*``).
    Any number of request threads may call :meth:`probe` at once; the pool, the cutter
    and the adapter are made on first use in the process that uses them (gunicorn forks).

    :param deadline: the bound of one whole round, in seconds.
    :param max_body_bytes: the largest body read from a member (Patroni's is ~1 KiB).
    :param policy: checked again for every target just before connecting (the targets
        were planned under it already: this is the second lock on the same door). Without
        one, only the shape of each target is checked.
    :param tls: CA bundle and client certificate for ``https`` members (see
        :class:`TLSContexts`).
    :param threads: the most pool probes in flight at once in this process. Each holds its
        thread one deadline at most; threads are started only when that many are needed.
        At least ``round_threads`` times the request threads (gunicorn's ``threads``), so
        that no round ever waits for a pool thread.
    :param round_threads: the most pool probes one round has in flight at once; its other
        members wait for one of them to end (see the module docstring, "Fairness").
    """

    def __init__(
        self,
        *,
        deadline: float = field_default(HookSettings, "probe_deadline"),
        max_body_bytes: int = field_default(HookSettings, "max_probe_body_bytes"),
        policy: ProbePolicy | None = None,
        tls: PatroniTLS | None = None,
        threads: int = 256,
        round_threads: int = 16,
    ):
        self.deadline = deadline
        self.max_body_bytes = max_body_bytes
        self.policy = policy
        self.tls = tls or PatroniTLS()
        self.threads = threads
        self.round_threads = round_threads
        self.contexts = TLSContexts(self.tls)
        self._checked: dict[
            str, tuple[str | None, Url | None, requests.PreparedRequest | None]
        ] = {}
        self._lock = threading.Lock()
        self._pools: _Pools | None = None
        _probers.add(self)

    @classmethod
    def from_settings(cls, settings: HookSettings) -> PatroniProber:
        """The prober the hook runs with these settings (the app and the benchmarks).

        Unusable TLS files are logged here, once, as well as being every https probe's
        reason (the hook may serve clusters that do not use TLS: it starts anyway).
        """
        prober = cls(
            deadline=settings.probe_deadline,
            max_body_bytes=settings.max_probe_body_bytes,
            policy=settings.probe_policy,
            tls=settings.patroni_tls,
            threads=settings.request_threads * settings.probe_threads_per_round,
            round_threads=settings.probe_threads_per_round,
        )
        if prober.contexts._files():
            problem = prober.contexts.problem()
            if problem is not None:
                log.error("https members cannot be probed: %s", problem)
        return prober

    def close(self) -> None:
        """Stop the pool and drop the connections (tests and shutdown)."""
        with self._lock:
            pools, self._pools = self._pools, None
        if pools is not None:
            pools.executor.shutdown(wait=False, cancel_futures=True)
            pools.cutter.stop()
            pools.adapter.close()

    def _forget(self) -> None:
        # In a forked child: the parent's threads are gone and its lock may be held.
        self._lock = threading.Lock()
        self._pools = None

    def _pools_here(self) -> _Pools:
        pools = self._pools
        if pools is not None:
            return pools
        with self._lock:
            if self._pools is None:
                self._pools = _Pools(
                    ThreadPoolExecutor(self.threads, thread_name_prefix="patroni-probe"),
                    _Adapter(),
                    _Cutter(),
                )
            return self._pools

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target concurrently; return within about ``deadline`` seconds."""
        if not targets:
            return {}
        return self._round(targets, time.monotonic() + self.deadline)

    def probe_one(self, target: ProbeTarget, ends_at: float) -> MemberStatus:
        """One bounded GET that gives up at ``ends_at`` (``time.monotonic``); never raises."""
        return self._round([target], ends_at)[target.pod]

    @property
    def _late(self) -> str:
        return f"no answer within the {self.deadline:g} s probe deadline"

    # ------------------------------------------------------------------ the round

    def _round(self, targets: Sequence[ProbeTarget], ends_at: float) -> dict[str, MemberStatus]:
        """Probe ``targets`` until ``ends_at``: the first in this thread, the others in the
        pool, at most ``round_threads`` of them at once (each finished probe starts the next
        one waiting): one cluster's hung members hold no more of the pool than that."""
        first, *rest = targets
        probes = {target.pod: _Probe(target, ends_at) for target in rest}
        waiting = deque(rest)
        futures: dict[str, Future[MemberStatus]] = {}
        lock = threading.Lock()
        closed = [False]

        def start_next() -> None:
            with lock:
                if closed[0] or not waiting:
                    return
                probe = probes[waiting.popleft().pod]
                context = contextvars.copy_context()  # log fields follow the probe's thread
                future = pools.executor.submit(context.run, self._ask, probe)
                futures[probe.target.pod] = future
            future.add_done_callback(lambda _: start_next())

        try:
            pools = self._pools_here()
            for _ in range(min(self.round_threads, len(rest))):
                start_next()
            # The first member in this thread, meanwhile; the cutter ends it at the deadline.
            here = _Probe(first, ends_at)
            pools.cutter.watch(here)
            statuses = {first.pod: self._ask(here)}
            while rest:
                with lock:
                    running = [f for f in futures.values() if not f.done()]
                    if not running and not waiting:
                        break
                left = ends_at - time.monotonic()
                if left <= 0:
                    break
                if running:
                    wait(running, timeout=left, return_when=FIRST_COMPLETED)
                else:  # a probe just ended; its callback is starting the next one
                    time.sleep(min(left, 0.001))
            with lock:
                closed[0] = True
                started = dict(futures)
            late = [(probes[pod], f) for pod, f in started.items() if not f.done()]
            for probe, future in late:
                future.cancel()
                probe.cut()
            if late:
                wait([future for _, future in late], timeout=_GRACE)
            for target in rest:
                begun = started.get(target.pod)
                statuses[target.pod] = (
                    self._result(target.pod, begun)
                    if begun is not None
                    else MemberStatus.unknown(target.pod, self._late)
                )
            return {target.pod: statuses[target.pod] for target in targets}
        except Exception as error:  # a bug or the OS out of resources: no member is known
            with lock:
                closed[0] = True
            for probe in probes.values():
                probe.cut()
            return {
                target.pod: MemberStatus.unknown(target.pod, describe_failure(error, target))
                for target in targets
            }

    def _result(self, pod: str, future: Future[MemberStatus]) -> MemberStatus:
        if future.done() and not future.cancelled() and future.exception() is None:
            return future.result()
        return MemberStatus.unknown(pod, self._late)

    def _ask(self, probe: _Probe) -> MemberStatus:
        """One member's probe, in a pool thread or the round's own; never raises."""
        target = probe.target
        if probe.cut_off:
            return MemberStatus.unknown(target.pod, self._late)
        _running.probe = probe
        answered = [False]
        try:
            return self._exchange(probe, answered)
        except Exception as error:
            return MemberStatus.unknown(target.pod, self._reason(error, probe, answered[0]))
        finally:
            _running.probe = None
            probe.finish()

    def _reason(self, error: Exception, probe: _Probe, answered: bool) -> str:
        if isinstance(error, _Failure):
            return error.reason
        timed_out = _timed_out(error)
        if probe.cut_off or (timed_out and time.monotonic() >= probe.ends_at):
            # Cut off, or a timeout cut to what was left of the round: the round's
            # deadline, one reason for the same member whatever ran out first.
            return self._late
        if timed_out:
            return "read timeout" if probe.connected else "connect timeout"
        return describe_failure(error, probe.target, in_body=answered)

    def _exchange(self, probe: _Probe, answered: list[bool]) -> MemberStatus:
        target = probe.target
        refused, url, request = self._check(target.url)
        if url is None or request is None:
            return MemberStatus.unknown(target.pod, refused or "refused")
        probe.url = url
        if url.scheme == "https":
            probe.context = self.contexts.context()
        remaining = probe.ends_at - time.monotonic()
        if remaining <= 0:
            return MemberStatus.unknown(target.pod, self._late)
        # The adapter only reads the prepared GET: every probe of the URL sends the same one.
        response = self._pools_here().adapter.send(
            request,
            stream=True,
            timeout=(min(target.connect_timeout, remaining), min(target.read_timeout, remaining)),
        )
        try:
            answered[0] = True
            return self._read(probe, response)
        finally:
            # One request per connection, as Patroni does: nothing half-read is kept.
            response.close()

    def _read(self, probe: _Probe, response: requests.Response) -> MemberStatus:
        target, cap, code = probe.target, self.max_body_bytes, response.status_code
        raw: urllib3.HTTPResponse = response.raw
        verdict = head_verdict(
            target,
            code,
            content_lengths=raw.headers.getlist("Content-Length"),
            transfer_coded="Transfer-Encoding" in raw.headers,
            cap=cap,
        )
        if verdict is not None:
            return verdict
        body = bytearray()
        # read1: whatever has arrived, after one socket read at most (a full-size read
        # loops until it has its whole size); the deadline is checked between reads, and
        # a read that blocks past it is ended by the round's cut.
        while chunk := raw.read1(_CHUNK):
            body += chunk
            if len(body) > cap:
                return too_large(target, code, cap)
            if time.monotonic() >= probe.ends_at:
                return MemberStatus.unknown(target.pod, self._late)
        if probe.cut_off:
            return MemberStatus.unknown(target.pod, self._late)
        return status_from_body(target, code, bytes(body))

    def _check(self, url: str) -> tuple[str | None, Url | None, requests.PreparedRequest | None]:
        # The same members are probed every second: remember each URL's verdict (the
        # policy is fixed for this prober; the check is pure) and its prepared GET
        # (preparing one is a fifth of a probe's CPU).
        checked = self._checked.get(url)
        if checked is None:
            refused, parsed = _checked(url, self.policy)
            request = None
            if parsed is not None:
                request = requests.Request("GET", url, headers=_HEADERS).prepare()
            checked = (refused, parsed, request)
            if len(self._checked) >= _CHECKED_URLS:
                self._checked.clear()
            self._checked[url] = checked
        return checked


def _timed_out(error: BaseException) -> bool:
    """Whether a timeout (requests', urllib3's or the socket's) is in ``error``'s chain."""
    seen: set[int] = set()
    queue: list[BaseException] = [error]
    while queue and len(seen) < 32:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, requests.Timeout | TimeoutError) or (
            # urllib3's NewConnectionError is a ConnectTimeoutError: a refusal is not one.
            isinstance(current, urllib3.exceptions.TimeoutError)
            and not isinstance(current, urllib3.exceptions.NewConnectionError)
        ):
            return True
        queue.extend(arg for arg in current.args if isinstance(arg, BaseException))
        for linked in (getattr(current, "reason", None), current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                queue.append(linked)
    return False


def target_problem(url: str, policy: ProbePolicy | None) -> str | None:
    """Why ``url`` must not be requested, or ``None``; nothing is sent for a refused URL.

    Targets are built by :func:`hooks.probing.plan_probes` from a Pod IP, the spec's port and
    a leader path, so none of this should ever trip. It is checked here, on the exact URL
    about to be requested, so that no other code path can make the hook request a
    hostname (DNS, and whatever it resolves to), credentials, a query, or another path.
    """
    return _checked(url, policy)[0]


def _checked(url: str, policy: ProbePolicy | None) -> tuple[str | None, Url | None]:
    """:func:`target_problem`, and the parsed URL when there is none."""
    try:
        parsed = urllib3.util.parse_url(url)
    except urllib3.exceptions.LocationParseError:
        return "refused: not a valid URL", None
    if parsed.scheme not in ("http", "https"):
        return "refused: scheme is not http or https", None
    if parsed.auth or parsed.query is not None or parsed.fragment is not None:
        return "refused: URL carries credentials, a query or a fragment", None
    if parsed.path not in LEADER_PATHS:
        return "refused: path is not one of Patroni's leader paths", None
    host = (parsed.host or "").removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "refused: host is not an IP address", None
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return "refused: host is not an IP address", None
    if parsed.port is None:
        return "refused: no port", None
    if url != f"{parsed.scheme}://{parsed.host}:{parsed.port}{parsed.path}":
        # parse_url normalises ("/../primary" → "/primary", case, ...): only a URL that
        # is already in that form is requested, so what was checked is what is sent.
        return "refused: URL is not in canonical form", None
    if policy is not None:
        port = policy.port_problem(parsed.port)
        if port is not None:
            return f"refused: {port}", None
        address = policy.address_problem(ip)
        if address is not None:
            return address, None
    return None, parsed
