"""The transport of one probe: requests' adapter, urllib3's pools and sockets that can be cut.

**The deadline is enforced here, not by the timeouts.** requests' read timeout bounds each
``recv``: a member that sends a byte every 0.3 s is never "timed out". Every socket a probe
opens (TCP, then TLS) is attached to its :class:`InFlight`, whose :meth:`InFlight.cut` shuts
it down at the round's deadline: a ``recv`` blocked in another thread returns at once. A
round cuts its pool threads' probes itself; the probe it runs in its own thread is
:meth:`Cutter.watch`ed by the process's one :class:`Cutter` thread.

The HTTP client is **requests** (HTTP/1.x and TLS are its and urllib3's, not ours), through
its transport API: one :class:`requests.adapters.HTTPAdapter` per process, whose ``send``
each probe calls with its prepared GET. No ``Session``: a Session's work per request is
merging its settings with the environment's (proxies, netrc, a CA bundle: none may apply
here), its cookie jar (a member's cookie must never travel to another member: with no jar
there is none to travel) and redirects (never followed, nor looked at). So: no proxy, netrc
or CA bundle from the environment, no redirect, no cookie, ``stream=True`` with a body read
capped at ``max_body_bytes``, ``(connect, read)`` timeouts cut to what is left of the round.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util import Url

from hooks.domain.members import ProbeTarget

#: Connection pools kept (one per member address and serverName; each only recycles a
#: connection object: every probe closes its connection, as Patroni does).
_POOLS = 1024
#: Connection objects a pool keeps for reuse: as many as probes of one member can run at
#: once in a process (a gunicorn worker's request threads). Past it, urllib3 logs "pool is
#: full, discarding connection" at WARNING for every probe that ends: log noise, and a
#: formatted log line's CPU on each.
_POOL_SIZE = 32


class ProbeFailure(Exception):
    """A probe that failed with a reason already worked out (internal)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InFlight:
    """One member's probe while it runs: its socket, so that the round can cut it off.

    The worker attaches each socket it opens (:class:`_Connection`, :class:`CutOffTLSSocket`);
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


class Cutter:
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
        self._heap: list[tuple[float, int, InFlight]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, probe: InFlight) -> None:
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
running = threading.local()


def current_probe() -> InFlight | None:
    probe: InFlight | None = getattr(running, "probe", None)
    return probe


def probe_here() -> InFlight:
    probe = current_probe()
    if probe is None:  # the adapter is the prober's own: only _exchange calls it
        raise RuntimeError("no probe runs in this thread")
    return probe


class CutOffTLSSocket(ssl.SSLSocket):
    """An SSLSocket that is attached to its probe before the handshake starts.

    ``SSLContext.sslsocket_class`` (public since Python 3.7) makes the context's
    ``wrap_socket`` return this class: a member that trickles its handshake is cut off at
    the round's deadline like one that trickles its answer.
    """

    def do_handshake(self, block: bool = False) -> None:
        probe = current_probe()
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
    probe = current_probe()
    if probe is not None and isinstance(sock, socket.socket):
        probe.attach(sock)
        probe.connected = True


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


class ProbeAdapter(HTTPAdapter):
    """requests' adapter with the probe's pool, TLS context and serverName, and cut-off sockets.

    Only the prober (:mod:`hooks.patroni`) sends through it, for the probe of its thread,
    whose URL is already checked and parsed: the pool comes from that (no proxy is ever looked up,
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
        probe = probe_here()
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
        url = probe_here().url
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
