"""Loopback fake Patroni members: real TCP servers that misbehave on purpose.

Each :class:`FakeMember` listens on its own loopback address (Linux routes all of
127.0.0.0/8 to ``lo``, no aliases needed) and answers like Patroni's REST API does:
HTTP/1.0, no ``Content-Length``, one request per connection. What it answers, for each
:class:`Behaviour` and path, is :mod:`testbed.fakes.patroni_model`'s (the benchmarks' fleet
plays the same replies); this module only plays them on a socket, a thread per connection.
The behaviour can be switched while it runs, and it records every connection
(:class:`Exchange`), so a test can prove that a redirect target saw no request or that
the prober stopped reading a huge body early.

The hook probes ``<podIP>:<spec.patroni.port>``, one port for every member; a
:class:`FakeCluster` therefore binds its members to 127.0.0.10, .11, .12 ... on one
port number that is free on all of them.

Every loop here is bounded in iterations and in time, all servers run in daemon
threads, and :meth:`FakeMember.close` (called by fixtures' teardown) stops them and
closes every socket: the test suite turns a ``ResourceWarning`` into an error.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from testbed.fakes.patroni_model import (
    DRIP,
    DRIP_INTERVAL,
    GARBAGE,
    HUGE_BODY,
    HUNG,
    LEADER,
    MASTER_V3,
    NOT_PATRONI,
    PROMOTING,
    REFUSED,
    REPLICA,
    RESET_MID_BODY,
    STOPPING,
    Behaviour,
    Drip,
    Hold,
    Identity,
    Kind,
    Reply,
    Send,
    Stream,
    Wait,
    huge,
    raw,
    recorded,
    redirect,
    reply,
    slow,
)
from testbed.fakes.patroni_wire import bind, bind_shared_port

__all__ = [
    "DRIP", "DRIP_INTERVAL", "GARBAGE", "HUGE_BODY", "HUNG", "LEADER", "MASTER_V3",
    "NOT_PATRONI", "PROMOTING", "REFUSED", "REPLICA", "RESET_MID_BODY", "STOPPING",
    "Behaviour", "Exchange", "FakeCluster", "FakeMember", "FullBacklog", "Kind", "fake_cluster",
    "huge", "raw", "recorded", "redirect", "slow",
]  # fmt: skip

#: Upper bounds that keep a broken test from hanging the suite.
MAX_LIFETIME = 60.0  # seconds a fake serves at most
MAX_CONNECTIONS = 500  # connections a fake accepts at most
MAX_HOLD = 20.0  # seconds a hung connection is held at most
REQUEST_TIMEOUT = 2.0  # seconds to wait for a request's head
MAX_REQUEST_BYTES = 16 * 1024
SEND_CHUNK = 16 * 1024
#: Small server send buffer, so bytes "sent" are close to bytes the client took in.
SEND_BUFFER = 32 * 1024

#: First address of a cluster's members; the next ones follow (127.0.0.11, ...).
CLUSTER_BASE = "127.0.0."
CLUSTER_FIRST_HOST = 10


@dataclass
class Exchange:
    """One accepted connection, as the fake saw it."""

    request_line: str | None = None
    #: Bytes of the answer (head and body) that the kernel accepted from us.
    bytes_sent: int = 0
    #: How it ended: "answered", "client closed", "reset sent", "released", ...
    outcome: str = ""
    #: A TLS member: whether the handshake completed.
    handshake: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class FakeMember:
    """One fake Patroni REST API on ``host:port``.

    :param sock: an already bound (not yet listening) socket to serve on; without
        one, the fake binds ``host`` on an ephemeral port.
    :param tls: serve HTTPS with this server context (its certificate, and whether it
        requires a client certificate): the wrong certificate, CA or client certificate
        is a failure mode like any other.
    """

    def __init__(
        self,
        behaviour: Behaviour = LEADER,
        *,
        host: str = "127.0.0.1",
        name: str = "pg-0",
        timeline: int = 1,
        sock: socket.socket | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.timeline = timeline
        self.tls = tls
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._release = threading.Event()
        self._exchanges: list[Exchange] = []
        self._connections: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._listener_stop: threading.Event | None = None
        self._accept_thread: threading.Thread | None = None
        self._behaviour = behaviour
        self._started = time.monotonic()
        if sock is None:
            sock = bind(host, 0)
        self.host, self.port = sock.getsockname()[:2]
        if behaviour.kind is Kind.REFUSED:
            sock.close()  # the port was free a moment ago; now nothing listens there
        else:
            self._listen(sock)

    # ---------------------------------------------------------------- control

    @property
    def behaviour(self) -> Behaviour:
        return self._behaviour

    @behaviour.setter
    def behaviour(self, behaviour: Behaviour) -> None:
        """Switch at runtime; REFUSED closes the listener, anything else reopens it."""
        with self._lock:
            was_refused = self._behaviour.kind is Kind.REFUSED
            self._behaviour = behaviour
        if behaviour.kind is Kind.REFUSED and not was_refused:
            self._stop_listening()
        elif was_refused and behaviour.kind is not Kind.REFUSED:
            self._listen(bind(self.host, self.port))

    def url(self, path: str = "/primary") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://{host}:{self.port}{path}"

    def release(self) -> None:
        """Let the connections held so far go (they close without an answer).

        Connections that arrive afterwards are held again.
        """
        with self._lock:
            held, self._release = self._release, threading.Event()
        held.set()

    @property
    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return list(self._exchanges)

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        return len(self.exchanges)

    @property
    def handshakes(self) -> int:
        """TLS handshakes completed so far."""
        return sum(e.handshake for e in self.exchanges)

    @property
    def requests(self) -> list[str]:
        """Request lines received so far (``GET /primary HTTP/1.1``)."""
        return [e.request_line for e in self.exchanges if e.request_line is not None]

    def wait_done(self, timeout: float = 5.0) -> bool:
        """Wait until every connection so far has ended; False on timeout."""
        ends_at = time.monotonic() + timeout
        return all(e.done.wait(max(0.0, ends_at - time.monotonic())) for e in self.exchanges)

    def close(self) -> None:
        """Stop serving, unblock and close every connection, join the threads."""
        self._stop.set()
        self.release()
        self._stop_listening()
        with self._lock:
            live = list(self._connections)
            threads = list(self._threads)
        for conn in live:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        ends_at = time.monotonic() + 5.0
        for thread in threads:
            thread.join(max(0.0, ends_at - time.monotonic()))

    def __enter__(self) -> FakeMember:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------- listening

    def _listen(self, sock: socket.socket) -> None:
        sock.listen(64)
        sock.settimeout(0.05)
        stop = threading.Event()
        thread = threading.Thread(
            target=self._accept_loop, args=(sock, stop), name=f"fake-{self.name}", daemon=True
        )
        with self._lock:
            self._listener, self._listener_stop, self._accept_thread = sock, stop, thread
        thread.start()

    def _stop_listening(self) -> None:
        with self._lock:
            stop, thread = self._listener_stop, self._accept_thread
            self._listener = self._listener_stop = self._accept_thread = None
        if stop is not None and thread is not None:
            stop.set()
            thread.join(2.0)

    def _accept_loop(self, listener: socket.socket, stop: threading.Event) -> None:
        try:
            accepted = 0
            while (
                not stop.is_set()
                and not self._stop.is_set()
                and accepted < MAX_CONNECTIONS
                and time.monotonic() - self._started < MAX_LIFETIME
            ):
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                accepted += 1
                exchange = Exchange()
                handler = threading.Thread(
                    target=self._handle,
                    args=(conn, exchange),
                    name=f"fake-{self.name}-conn",
                    daemon=True,
                )
                with self._lock:
                    self._exchanges.append(exchange)
                    self._connections.add(conn)
                    self._threads.append(handler)
                handler.start()
        finally:
            listener.close()

    # -------------------------------------------------------------- answering

    def _handle(self, conn: socket.socket, exchange: Exchange) -> None:
        reset = False
        try:
            conn.settimeout(REQUEST_TIMEOUT)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            if self.tls is not None:
                raw = conn
                try:
                    conn = self.tls.wrap_socket(raw, server_side=True)
                except OSError as error:  # ssl.SSLError included
                    exchange.outcome = f"handshake failed ({type(error).__name__})"
                    return
                with self._lock:  # close() must shut the TLS socket down now
                    self._connections.discard(raw)
                    self._connections.add(conn)
                exchange.handshake = True
            exchange.request_line = _read_request_line(conn)
            if exchange.request_line is None:
                exchange.outcome = "no request"
                return
            behaviour = self.behaviour
            reset = self._answer(conn, exchange, behaviour)
        except OSError as error:
            exchange.outcome = f"client closed ({type(error).__name__})"
        finally:
            if reset:
                # SO_LINGER on, timeout 0: close() sends RST instead of FIN.
                with suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with self._lock:
                self._connections.discard(conn)
            conn.close()
            exchange.done.set()

    def _answer(self, conn: socket.socket, exchange: Exchange, behaviour: Behaviour) -> bool:
        """Play the model's reply; True if the connection must end with a reset."""
        assert exchange.request_line is not None
        identity = Identity(self.name, self.timeline)
        answer: Reply = reply(behaviour, identity, exchange.request_line)
        for step in answer.steps:
            if isinstance(step, Send):
                self._send(conn, exchange, step.data)
            elif isinstance(step, Wait):
                if self._stop.wait(step.seconds):
                    exchange.outcome = "stopped"
                    return False
            elif isinstance(step, Drip):
                for index in range(len(step.data)):
                    if self._stop.wait(step.interval):
                        break
                    self._send(conn, exchange, step.data[index : index + 1])
            elif isinstance(step, Stream):
                if not self._stream(conn, exchange, step.size):
                    exchange.outcome = "stopped"
                    return False
            elif isinstance(step, Hold):
                self._hold(exchange)
                return False
        exchange.outcome = answer.outcome
        return answer.reset

    def _hold(self, exchange: Exchange) -> None:
        """Keep the connection until released, closed, or held too long."""
        with self._lock:
            release = self._release
        ends_at = time.monotonic() + MAX_HOLD
        while not release.wait(0.05) and not self._stop.is_set():
            if time.monotonic() > ends_at:
                exchange.outcome = "held too long"
                return
        exchange.outcome = "released"

    def _stream(self, conn: socket.socket, exchange: Exchange, size: int) -> bool:
        """Send ``size`` filler bytes (bounded in time); True if all went."""
        chunk = b"x" * SEND_CHUNK
        remaining = size
        ends_at = time.monotonic() + MAX_HOLD
        while remaining > 0 and not self._stop.is_set() and time.monotonic() < ends_at:
            try:
                sent = conn.send(chunk[: min(remaining, SEND_CHUNK)])
            except TimeoutError:
                continue  # the client is not reading; it will close, or the bound ends us
            remaining -= sent
            exchange.bytes_sent += sent
        return remaining == 0

    @staticmethod
    def _send(conn: socket.socket, exchange: Exchange, data: bytes) -> None:
        conn.sendall(data)
        exchange.bytes_sent += len(data)


class FakeCluster:
    """Members on 127.0.0.10, .11, ... that all listen on one port number."""

    def __init__(self, count: int, *, first_host: int = CLUSTER_FIRST_HOST) -> None:
        self.hosts = [f"{CLUSTER_BASE}{first_host + i}" for i in range(count)]
        self.port, self._socks = bind_shared_port(self.hosts)
        self.members: list[FakeMember] = []

    def start(self, behaviours: Sequence[Behaviour], names: Sequence[str]) -> list[FakeMember]:
        """Start one member per reserved address (in order), with these behaviours."""
        assert len(behaviours) == len(names) == len(self._socks) and not self.members
        for sock, behaviour, name in zip(self._socks, behaviours, names, strict=True):
            self.members.append(
                FakeMember(behaviour, host=sock.getsockname()[0], name=name, sock=sock)
            )
        self._socks = []
        return self.members

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        for member in self.members:
            member.close()


@contextmanager
def fake_cluster(
    behaviours: Sequence[Behaviour], names: Sequence[str] | None = None
) -> Iterator[FakeCluster]:
    """A started :class:`FakeCluster`, closed on exit."""
    cluster = FakeCluster(len(behaviours))
    try:
        cluster.start(behaviours, names or [f"pg-{i}" for i in range(len(behaviours))])
        yield cluster
    finally:
        cluster.close()


class FullBacklog:
    """An address where TCP connects time out: a listener that never accepts.

    ``listen(0)`` with one connection already queued makes Linux drop further SYNs, so
    a client's ``connect()`` waits for its SYN retransmit (1 s) and times out first:
    the loopback equivalent of a black-holed pod IP.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._listener = bind(host, 0)
        self._listener.listen(0)
        self.host, self.port = self._listener.getsockname()[:2]
        self._fillers: list[socket.socket] = []
        for _ in range(8):  # bounded: the queue holds one or two on every Linux seen
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.settimeout(0.2)
            try:
                filler.connect((self.host, self.port))
            except TimeoutError:
                filler.close()
                break
            self._fillers.append(filler)
        else:
            self.close()
            raise RuntimeError("the listen backlog never filled up")

    def url(self, path: str = "/primary") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def close(self) -> None:
        for filler in self._fillers:
            filler.close()
        self._fillers = []
        self._listener.close()

    def __enter__(self) -> FullBacklog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# -------------------------------------------------------------------- helpers


def _read_request_line(conn: socket.socket) -> str | None:
    """Read a request head; return its first line, or None if the client sent none."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST_BYTES:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    if not data:
        return None
    return data.split(b"\r\n", 1)[0].decode("latin-1")
