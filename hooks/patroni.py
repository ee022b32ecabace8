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
timeouts, no retries (the next resync is the retry), a shared thread pool.

The HTTP client is **urllib3** (the transport under requests), used as Patroni's own
``patroni/request.py`` uses it: one ``PoolManager`` per process, ``retries=False``,
``redirect=False``, ``preload_content=False`` with a bounded body read and a
``urllib3.Timeout(connect, read, total)`` (a requests ``Session`` only added CPU: see
bench/README.md). TLS: the CA bundle and client certificate of :class:`PatroniTLS` on every
https pool, read per connection so a renewed Secret needs no restart, and
``spec.patroni.tls.serverName`` as SNI and ``assert_hostname``.
"""

from __future__ import annotations

import contextvars
import ipaddress
import json
import os
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Protocol

import urllib3
from urllib3.exceptions import (
    ProtocolError,
)
from urllib3.util import Url

from hooks.config import HookSettings, PatroniTLS
from hooks.members import MemberStatus, ProbeTarget
from hooks.model import LEADER_PATHS, field_default
from hooks.policy import ProbePolicy
from hooks.probe_failures import describe_failure

_CHUNK = 8192
_TIMEOUTS = frozenset({"connect timeout", "read timeout"})
_HEADERS = {"Accept": "application/json", "User-Agent": "pg-failover-hook"}
#: Most URL verdicts a prober remembers (a few per member of every cluster it probes).
_CHECKED_URLS = 4096


class Prober(Protocol):
    """Anything that can ask a set of members; injected into the app (tests use fakes)."""

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target; return one status per target's pod name."""
        ...


#: Forks of this process so far, as seen in the child (``os.register_at_fork``): pools
#: made before a fork belong to the parent.
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class _Failure(Exception):
    """A probe that failed with a reason already worked out (internal)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PatroniProber:
    """Concurrent, bounded probes with :mod:`urllib3`.

    The defaults are :class:`~hooks.config.HookSettings`' (the operator's ``PGFH_*``).

    :param deadline: the bound of one whole round, in seconds.
    :param max_body_bytes: the largest body read from a member (Patroni's is ~1 KiB).
    :param threads: size of the process-wide pool shared by all concurrent syncs.
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
        threads: int = field_default(HookSettings, "probe_threads"),
        policy: ProbePolicy | None = None,
        tls: PatroniTLS | None = None,
    ):
        self.deadline = deadline
        self.max_body_bytes = max_body_bytes
        self.threads = threads
        self.policy = policy
        self.tls = tls or PatroniTLS()
        self._lock = threading.Lock()
        #: (fork generation, thread pool, connection pools) of the process using them.
        self._state: tuple[int, ThreadPoolExecutor, urllib3.PoolManager] | None = None
        self._checked: dict[str, tuple[str | None, Url | None]] = {}

    @classmethod
    def from_settings(cls, settings: HookSettings) -> PatroniProber:
        """The prober the hook runs with these settings (the app and the benchmarks)."""
        return cls(
            deadline=settings.probe_deadline,
            max_body_bytes=settings.max_probe_body_bytes,
            threads=settings.probe_threads,
            policy=settings.probe_policy,
            tls=settings.patroni_tls,
        )

    # The thread pool and the connection pools are created on first use in the process
    # that uses them: gunicorn forks workers, and threads do not survive a fork (nor
    # should two processes share a socket).
    def _pools(self) -> tuple[ThreadPoolExecutor, urllib3.PoolManager]:
        state = self._state
        if state is not None and state[0] == _forks:
            return state[1], state[2]
        with self._lock:
            if self._state is None or self._state[0] != _forks:
                executor = ThreadPoolExecutor(
                    max_workers=self.threads, thread_name_prefix="patroni-probe"
                )
                http = urllib3.PoolManager(
                    # One connection pool per member address (and serverName), least
                    # recently used dropped first; a pool only recycles connection
                    # objects: every probe closes its connection, as Patroni does.
                    num_pools=256,
                    maxsize=self.threads,
                    block=False,
                    # Verified against this CA bundle, or the system's trust store (which
                    # will not know a private CA: the reason then says where to set one).
                    cert_reqs=ssl.CERT_REQUIRED,
                    ca_certs=self.tls.ca_file,
                    cert_file=self.tls.client_cert_file if self.tls.client_key_file else None,
                    key_file=self.tls.client_key_file if self.tls.client_cert_file else None,
                )
                self._state = (_forks, executor, http)
            return self._state[1], self._state[2]

    def close(self) -> None:
        """Stop the pools (tests and graceful shutdown)."""
        with self._lock:
            state, self._state = self._state, None
        if state is not None:
            state[1].shutdown(wait=False, cancel_futures=True)
            state[2].clear()

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target concurrently; return within about ``deadline`` seconds."""
        if not targets:
            return {}
        ends_at = time.monotonic() + self.deadline
        pool, _ = self._pools()
        futures: dict[str, Future[MemberStatus]] = {}
        for target in targets:
            context = contextvars.copy_context()  # log fields follow the probe's thread
            futures[target.pod] = pool.submit(context.run, self.probe_one, target, ends_at)
        wait(futures.values(), timeout=max(0.0, ends_at - time.monotonic()))
        results: dict[str, MemberStatus] = {}
        for pod, future in futures.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                results[pod] = future.result()
            else:
                future.cancel()
                results[pod] = MemberStatus.unknown(pod, self._late)
        return results

    @property
    def _late(self) -> str:
        return f"no answer within the {self.deadline:g} s probe deadline"

    def probe_one(self, target: ProbeTarget, ends_at: float) -> MemberStatus:
        """One bounded GET; never raises."""
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
            return MemberStatus.unknown(target.pod, refused or "refused")
        try:
            return self._probe_one(target, url, ends_at)
        except Exception as error:
            reason = (
                error.reason if isinstance(error, _Failure) else describe_failure(error, target)
            )
            if reason in _TIMEOUTS and time.monotonic() >= ends_at:
                # The timeout was cut to what was left of the round: say what probe()
                # says about the same member, or the reason would depend on which
                # thread noticed first.
                reason = self._late
            return MemberStatus.unknown(target.pod, reason)

    def _probe_one(self, target: ProbeTarget, url: Url, ends_at: float) -> MemberStatus:
        remaining = ends_at - time.monotonic()
        if remaining <= 0:
            return MemberStatus.unknown(target.pod, self._late)
        _, http = self._pools()
        name = target.server_name if url.scheme == "https" else None
        pool = http.connection_from_host(
            url.host,
            url.port,
            url.scheme,
            # Connect to the pod IP, but send SNI and verify the certificate for the
            # spec's serverName: both are part of the pool key, so each name has its own
            # pools and nothing leaks from one cluster's settings to another's.
            pool_kwargs={"server_hostname": name, "assert_hostname": name} if name else None,
        )
        response = pool.urlopen(
            "GET",
            url.path or "/",
            headers=_HEADERS,
            redirect=False,
            retries=False,
            assert_same_host=False,
            preload_content=False,
            # The read timeout is also cut to what the connect left of the round.
            timeout=urllib3.Timeout(
                connect=min(target.connect_timeout, remaining),
                read=min(target.read_timeout, remaining),
                total=remaining,
            ),
        )
        try:
            status_code = response.status
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                return MemberStatus.not_patroni(
                    target.pod, f"body larger than {self.max_body_bytes} bytes", status_code
                )
            body = bytearray()
            try:
                # read1: whatever has arrived, after one socket read at most. A full-size
                # read loops until it has a whole chunk, so a member that drips a byte
                # at a time would hold this thread far past the deadline.
                while chunk := response.read1(_CHUNK, decode_content=True):
                    body += chunk
                    if len(body) > self.max_body_bytes:
                        return MemberStatus.not_patroni(
                            target.pod, f"body larger than {self.max_body_bytes} bytes", status_code
                        )
                    if time.monotonic() > ends_at:
                        return MemberStatus.unknown(target.pod, self._late)
            except ProtocolError as error:
                raise _Failure(describe_failure(error, target, in_body=True)) from error
        finally:
            # One request per connection (Patroni closes it anyway): never a half-read
            # or server-closed connection left for the next probe.
            response.close()
            response.release_conn()
        try:
            document = json.loads(body)
        except ValueError:
            return MemberStatus.not_patroni(
                target.pod,
                f"HTTP {status_code} on {target.health_path} with a non-JSON body",
                status_code,
            )
        return MemberStatus.from_api_response(
            target.pod,
            status_code,
            document,
            health_path=target.health_path,
            leader_roles=target.leader_roles,
        )


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
