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
timeouts, no retries (the next resync is the retry).

**Why not an HTTP client library.** Patroni's API server speaks HTTP/1.0 and closes every
connection, so nothing can be pooled: a probe is connect, one small request, read until
the answer is complete, close. The round is one non-blocking loop in the request's own
thread: every member's socket is registered with one :func:`select.poll` and the loop
advances whichever is ready (concurrent, not parallel: the waiting is what overlaps).
Measured (bench/README.md, "CPU per sync"): a three-member round cost 1.2-1.5 ms of CPU in
process with urllib3 in a shared thread pool, and costs 0.28 ms with this loop; in a loaded
hook pod a whole sync went from 4.2-5.1 to 2.5-3.0 ms (the pool's thread hand-offs and GIL
contention were most of the difference). What the bytes mean (the request sent, the
answer's head and body, Patroni's verdict) is :mod:`hooks.patroni_answer`'s, pure.

TLS: :mod:`ssl` on the same non-blocking socket, with the CA bundle and client certificate
of :class:`PatroniTLS` loaded for every connection (a renewed Secret needs no restart), and
``spec.patroni.tls.serverName`` as SNI and the name checked, else the pod IP.
"""

from __future__ import annotations

import errno
import ipaddress
import select
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import urllib3
from urllib3.util import Url

from hooks.config import HookSettings, PatroniTLS
from hooks.members import MemberStatus, ProbeTarget
from hooks.model import LEADER_PATHS, field_default
from hooks.patroni_answer import Head, read_body, read_head, request_bytes
from hooks.policy import ProbePolicy
from hooks.probe_failures import describe_failure

#: Most bytes taken from the kernel per read.
_CHUNK = 65536
#: Most URL verdicts a prober remembers (a few per member of every cluster it probes).
_CHECKED_URLS = 4096
_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT


class Prober(Protocol):
    """Anything that can ask a set of members; injected into the app (tests use fakes)."""

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target; return one status per target's pod name."""
        ...


@dataclass(slots=True)
class _Exchange:
    """One member's probe while the round runs: its socket and how far it got."""

    target: ProbeTarget
    url: Url
    sock: socket.socket | ssl.SSLSocket
    request: bytes
    #: When the current wait gives up: the connect (and TLS handshake) timeout, then the
    #: read timeout after every byte received, never past the round's end.
    gives_up_at: float
    timeout_reason: str = "connect timeout"
    connected: bool = False
    handshaking: bool = False
    sent: int = 0
    received: bytearray = field(default_factory=bytearray)
    #: The answer's status line and headers, once they are whole.
    head: Head | None = None
    #: What the socket waits for next (poll events).
    waits_for: int = _WRITE


class PatroniProber:
    """Concurrent, bounded probes on non-blocking sockets, one poll loop per round.

    The defaults are :class:`~hooks.config.HookSettings`' (the operator's ``PGFH_*``).
    The prober holds no connection and no thread: any number of request threads may
    call :meth:`probe` at once, and a forked worker needs nothing rebuilt.

    :param deadline: the bound of one whole round, in seconds.
    :param max_body_bytes: the largest body read from a member (Patroni's is ~1 KiB).
    :param policy: checked again for every target just before connecting (the targets
        were planned under it already: this is the second lock on the same door). Without
        one, only the shape of each target is checked.
    :param tls: CA bundle and client certificate for ``https`` members. Files are read
        for every connection (Patroni closes each one), so renewed files in a mounted
        Secret are used without a restart.
    """

    def __init__(
        self,
        *,
        deadline: float = field_default(HookSettings, "probe_deadline"),
        max_body_bytes: int = field_default(HookSettings, "max_probe_body_bytes"),
        policy: ProbePolicy | None = None,
        tls: PatroniTLS | None = None,
    ):
        self.deadline = deadline
        self.max_body_bytes = max_body_bytes
        self.policy = policy
        self.tls = tls or PatroniTLS()
        self._checked: dict[str, tuple[str | None, Url | None]] = {}

    @classmethod
    def from_settings(cls, settings: HookSettings) -> PatroniProber:
        """The prober the hook runs with these settings (the app and the benchmarks)."""
        return cls(
            deadline=settings.probe_deadline,
            max_body_bytes=settings.max_probe_body_bytes,
            policy=settings.probe_policy,
            tls=settings.patroni_tls,
        )

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target concurrently; return within about ``deadline`` seconds."""
        if not targets:
            return {}
        return self._guarded_round(targets, time.monotonic() + self.deadline)

    def probe_one(self, target: ProbeTarget, ends_at: float) -> MemberStatus:
        """One bounded GET that gives up at ``ends_at`` (``time.monotonic``); never raises."""
        return self._guarded_round([target], ends_at)[target.pod]

    def _guarded_round(
        self, targets: Sequence[ProbeTarget], ends_at: float
    ) -> dict[str, MemberStatus]:
        try:
            return self._round(targets, ends_at)
        except Exception as error:  # a bug or the OS out of resources: no member is known
            return {
                target.pod: MemberStatus.unknown(target.pod, describe_failure(error, target))
                for target in targets
            }

    @property
    def _late(self) -> str:
        return f"no answer within the {self.deadline:g} s probe deadline"

    # ------------------------------------------------------------------ the round

    def _round(self, targets: Sequence[ProbeTarget], ends_at: float) -> dict[str, MemberStatus]:
        results: dict[str, MemberStatus] = {}
        waiting: dict[int, _Exchange] = {}
        poller = select.poll()

        def finish(fd: int, status: MemberStatus) -> None:
            # One request per connection, as Patroni does: nothing half-read is kept.
            exchange = waiting.pop(fd)
            results[exchange.target.pod] = status
            poller.unregister(fd)
            exchange.sock.close()

        try:
            for target in targets:
                exchange = self._start(target, ends_at, results)
                if exchange is not None:
                    waiting[exchange.sock.fileno()] = exchange
                    poller.register(exchange.sock, exchange.waits_for)
            while waiting:
                now = time.monotonic()
                for fd, exchange in list(waiting.items()):
                    if now >= exchange.gives_up_at:
                        # A timeout cut to what was left of the round is the round's
                        # deadline: one reason for the same member whatever ran out first.
                        reason = self._late if now >= ends_at else exchange.timeout_reason
                        finish(fd, MemberStatus.unknown(exchange.target.pod, reason))
                if not waiting:
                    break
                soonest = min(e.gives_up_at for e in waiting.values())
                # poll() rounds a fractional millisecond up: never woken before a bound.
                for fd, _events in poller.poll(max(0.0, soonest - now) * 1000):
                    exchange = waiting[fd]
                    status = self._advance(exchange, ends_at)
                    if status is not None:
                        finish(fd, status)
                    else:
                        poller.modify(fd, exchange.waits_for)
        finally:
            for exchange in waiting.values():
                exchange.sock.close()
        return {target.pod: results[target.pod] for target in targets}

    def _start(
        self, target: ProbeTarget, ends_at: float, results: dict[str, MemberStatus]
    ) -> _Exchange | None:
        """Open the connection (non-blocking); ``None`` with a result if it ended already."""
        # The same members are probed every second: remember each URL's verdict (the
        # policy is fixed for this prober; the check is pure).
        checked = self._checked.get(target.url)
        if checked is None:
            checked = _checked(target.url, self.policy)
            if len(self._checked) >= _CHECKED_URLS:
                self._checked.clear()
            self._checked[target.url] = checked
        refused, url = checked
        if url is None:
            results[target.pod] = MemberStatus.unknown(target.pod, refused or "refused")
            return None
        now = time.monotonic()
        if now >= ends_at:
            results[target.pod] = MemberStatus.unknown(target.pod, self._late)
            return None
        host = (url.host or "").strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as error:
            results[target.pod] = MemberStatus.unknown(target.pod, describe_failure(error, target))
            return None
        sock.setblocking(False)
        exchange = _Exchange(
            target,
            url,
            sock,
            request_bytes(url.host or "", url.port or 0, url.path or "/"),
            gives_up_at=min(now + target.connect_timeout, ends_at),
        )
        try:
            code = sock.connect_ex((host, url.port or 0))
        except OSError as error:
            code = error.errno or errno.EINVAL
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            results[target.pod] = MemberStatus.unknown(
                target.pod, describe_failure(_connect_error(code), target)
            )
            return None
        return exchange

    def _advance(self, exchange: _Exchange, ends_at: float) -> MemberStatus | None:
        """Do what the ready socket allows; a status once the probe is over."""
        try:
            return self._step(exchange, ends_at)
        except Exception as error:
            return MemberStatus.unknown(
                exchange.target.pod,
                describe_failure(error, exchange.target, in_body=exchange.head is not None),
            )

    def _step(self, exchange: _Exchange, ends_at: float) -> MemberStatus | None:
        if not exchange.connected:
            # Writable after a non-blocking connect: connected, or failed (the error is
            # read from the socket, as connect() would have raised it).
            code = exchange.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise _connect_error(code)
            exchange.connected = True
            if exchange.url.scheme == "https":
                exchange.sock = self._wrap(exchange)
                exchange.handshaking = True
        if exchange.handshaking:
            if not self._handshake(exchange):
                return None
            exchange.handshaking = False
        if exchange.sent < len(exchange.request):
            if not self._send(exchange):
                return None
            exchange.gives_up_at = min(time.monotonic() + exchange.target.read_timeout, ends_at)
            exchange.timeout_reason = "read timeout"
            exchange.waits_for = _READ
        return self._receive(exchange, ends_at)

    def _wrap(self, exchange: _Exchange) -> ssl.SSLSocket:
        name = exchange.target.server_name or (exchange.url.host or "").strip("[]")
        return _tls_context(self.tls).wrap_socket(
            exchange.sock, server_hostname=name, do_handshake_on_connect=False
        )

    @staticmethod
    def _handshake(exchange: _Exchange) -> bool:
        sock = exchange.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            exchange.waits_for = _READ
            return False
        except ssl.SSLWantWriteError:
            exchange.waits_for = _WRITE
            return False
        return True

    @staticmethod
    def _send(exchange: _Exchange) -> bool:
        try:
            exchange.sent += exchange.sock.send(exchange.request[exchange.sent :])
        except (BlockingIOError, ssl.SSLWantWriteError):
            pass
        except ssl.SSLWantReadError:
            exchange.waits_for = _READ
            return False
        exchange.waits_for = _WRITE
        return exchange.sent >= len(exchange.request)

    def _receive(self, exchange: _Exchange, ends_at: float) -> MemberStatus | None:
        """Read what has arrived (TLS may hold more than one record); done at the end."""
        while True:
            try:
                chunk = exchange.sock.recv(_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError):
                return None
            except ssl.SSLWantWriteError:
                exchange.waits_for = _WRITE
                return None
            if not chunk:
                return self._answer(exchange, complete=True)
            exchange.received += chunk
            exchange.gives_up_at = min(time.monotonic() + exchange.target.read_timeout, ends_at)
            status = self._answer(exchange, complete=False)
            if status is not None:
                return status
            if not isinstance(exchange.sock, ssl.SSLSocket) and len(chunk) < _CHUNK:
                return None  # the kernel had no more; wait for the next poll

    def _answer(self, exchange: _Exchange, *, complete: bool) -> MemberStatus | None:
        """The member's status once its answer is whole; ``None`` while more may come.

        ``complete``: the member closed the connection.
        """
        if exchange.head is None:
            head = read_head(exchange.target, exchange.received, closed=complete)
            if not isinstance(head, Head):
                return head
            exchange.head = head
        return read_body(
            exchange.target,
            exchange.head,
            exchange.received,
            closed=complete,
            cap=self.max_body_bytes,
        )


def _connect_error(code: int) -> OSError:
    """The exception a blocking ``connect()`` would have raised for ``errno`` ``code``."""
    return OSError(code, errno.errorcode.get(code, "connect failed"))


def _tls_context(tls: PatroniTLS) -> ssl.SSLContext:
    """A client context from the files as they are now (renewals need no restart)."""
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.client_cert_file and tls.client_key_file:
        context.load_cert_chain(tls.client_cert_file, tls.client_key_file)
    return context


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
