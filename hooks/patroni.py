"""Probing Patroni's REST API: the only outbound I/O of the hook.

Each member gets one ``GET`` of its health path. All members of a cluster are asked
concurrently, and the whole round has one deadline: a member that accepts the
connection and never answers (Patroni does exactly that for ~2 s while it shuts down)
costs the sync at most the deadline, never more. Nothing here raises: every failure
becomes :meth:`MemberStatus.unknown` with a short, stable reason (stable, because it can
end up in a status condition, and a message that changes on every sync would make
Metacontroller write the status again and again).

Modelled on Patroni's own ``fetch_nodes_statuses`` (``patroni/ha.py``): fixed small
timeouts, no retries (the next resync is the retry), a shared thread pool.
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
from typing import Any, Protocol, cast

import requests
import requests.adapters
import urllib3
from urllib3.util.ssl_match_hostname import CertificateError

from hooks.config import PatroniTLS
from hooks.members import MemberStatus, ProbeTarget
from hooks.policy import ProbePolicy
from hooks.schemas import LEADER_PATHS

_CHUNK = 8192
_TIMEOUTS = frozenset({"connect timeout", "read timeout"})


class Prober(Protocol):
    """Anything that can ask a set of members; injected into the app (tests use fakes)."""

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target; return one status per target's pod name."""
        ...


class _NoRedirectSession(requests.Session):
    """A Session that never looks at ``Location``.

    Even with ``allow_redirects=False``, requests prepares ``Response.next`` for a 3xx
    answer, and to do so it reads the whole body (``Response.content``: no cap, no
    deadline) before it raises ``TooManyRedirects`` (``max_redirects = 0``). With no
    redirect target, a 3xx is an ordinary answer whose body we read, capped.
    """

    def get_redirect_target(self, resp: requests.Response) -> str | None:
        return None


#: The name to verify the current https probe's certificate against, when it is not the
#: IP connected to (``spec.patroni.tls.serverName``). Set by the probing thread itself
#: for the one request it is about to make (each probe runs in its own context copy).
_SERVER_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pgfh_server_name", default=None
)


class _ServerNameAdapter(requests.adapters.HTTPAdapter):
    """Connect to the pod IP, but send SNI and verify the certificate for another name.

    Patroni's certificate often names a DNS name (``pg-orders.databases.svc``) rather than
    every pod IP. urllib3 supports exactly this with ``server_hostname`` (SNI) and
    ``assert_hostname`` (verification) on the pool; both are part of the pool key, so
    each name gets its own pools and nothing leaks from one cluster's settings to another.
    """

    def build_connection_pool_key_attributes(
        self, request: requests.PreparedRequest, verify: Any, cert: Any = None
    ) -> Any:  # requests' stubs type these as private TypedDicts without these two keys
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert
        )
        name = _SERVER_NAME.get()
        if name is not None and host_params.get("scheme") == "https":
            extra = cast(dict[str, Any], pool_kwargs)
            extra["server_hostname"] = name
            extra["assert_hostname"] = name
        return host_params, pool_kwargs


class PatroniProber:
    """Concurrent, bounded probes with :mod:`requests`.

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
        deadline: float = 2.0,
        max_body_bytes: int = 65536,
        threads: int = 64,
        policy: ProbePolicy | None = None,
        tls: PatroniTLS | None = None,
    ):
        self.deadline = deadline
        self.max_body_bytes = max_body_bytes
        self.threads = threads
        self.policy = policy
        self.tls = tls or PatroniTLS()
        # Verified against this CA bundle, or the default trust store (which will not
        # know a private CA: the reason then says where to configure one).
        self._verify: str | bool = self.tls.ca_file or True
        self._cert = (
            (self.tls.client_cert_file, self.tls.client_key_file)
            if self.tls.client_cert_file and self.tls.client_key_file
            else None
        )
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid: int | None = None
        self._local = threading.local()

    # The pool is created on first use in the process that uses it: gunicorn forks
    # workers, and threads do not survive a fork.
    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(
                    max_workers=self.threads, thread_name_prefix="patroni-probe"
                )
                self._executor_pid = os.getpid()
            return self._executor

    def close(self) -> None:
        """Stop the pool (tests and graceful shutdown)."""
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = _NoRedirectSession()
            # No proxies, .netrc or CA overrides from the environment: probes go
            # straight to the pod IP, and nothing but our settings shapes them.
            session.trust_env = False
            session.max_redirects = 0
            session.mount("https://", _ServerNameAdapter())
            self._local.session = session
        return session

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target concurrently; return within about ``deadline`` seconds."""
        if not targets:
            return {}
        ends_at = time.monotonic() + self.deadline
        pool = self._pool()
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
        refused = target_problem(target.url, self.policy)
        if refused is not None:
            return MemberStatus.unknown(target.pod, refused)
        try:
            return self._probe_one(target, ends_at)
        except Exception as error:
            reason = _describe(error, target.server_name)
            if reason in _TIMEOUTS and time.monotonic() >= ends_at:
                # The timeout was cut to what was left of the round: say what probe()
                # says about the same member, or the reason would depend on which
                # thread noticed first.
                reason = self._late
            return MemberStatus.unknown(target.pod, reason)

    def _probe_one(self, target: ProbeTarget, ends_at: float) -> MemberStatus:
        remaining = ends_at - time.monotonic()
        if remaining <= 0:
            return MemberStatus.unknown(target.pod, self._late)
        timeout = (min(target.connect_timeout, remaining), min(target.read_timeout, remaining))
        _SERVER_NAME.set(target.server_name)
        with self._session().get(
            target.url,
            timeout=timeout,
            allow_redirects=False,
            stream=True,
            headers={"Accept": "application/json", "User-Agent": "pg-failover-hook"},
            verify=self._verify,
            cert=self._cert,
        ) as response:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                return MemberStatus.unknown(
                    target.pod, f"body larger than {self.max_body_bytes} bytes"
                )
            body = bytearray()
            # read1: whatever has arrived, after one socket read at most. A full-size
            # read (iter_content) loops until it has a whole chunk, so a member that
            # drips a byte at a time would hold this thread far past the deadline.
            while chunk := response.raw.read1(_CHUNK, decode_content=True):
                body += chunk
                if len(body) > self.max_body_bytes:
                    return MemberStatus.unknown(
                        target.pod, f"body larger than {self.max_body_bytes} bytes"
                    )
                if time.monotonic() > ends_at:
                    return MemberStatus.unknown(target.pod, self._late)
            status_code = response.status_code
        try:
            document = json.loads(body)
        except ValueError:
            return MemberStatus.unknown(
                target.pod, f"HTTP {status_code} on {target.health_path} with a non-JSON body"
            )
        return MemberStatus.from_api_response(
            target.pod,
            status_code,
            document,
            health_path=target.health_path,
            leader_roles=target.leader_roles,
        )


#: OpenSSL verification codes (X509_V_ERR_*) that mean "not signed by a CA we trust".
_UNTRUSTED = frozenset({2, 18, 19, 20, 21})
#: OpenSSL alerts and errors that mean the member refused our client certificate.
_CLIENT_CERT_REFUSED = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


def _tls_reason(error: ssl.SSLError, server_name: str | None) -> str:
    """A stable reason for a TLS failure, saying which side to fix."""
    if isinstance(error, ssl.SSLCertVerificationError):
        code = getattr(error, "verify_code", None)
        if code in _UNTRUSTED:
            return "TLS: certificate not signed by a trusted CA (PGFH_PATRONI_CA_FILE)"
        if code == 10:
            return "TLS: certificate expired"
        if code in (62, 64):
            return _name_mismatch(server_name)
        return f"TLS: certificate rejected (code {code})"
    reason = getattr(error, "reason", None) or type(error).__name__
    # A member that refuses our certificate (or wants one) either sends an alert or just
    # closes the connection, whichever its TLS stack gets to first: one reason for both,
    # or the status would flip between two messages from sync to sync.
    if reason in _CLIENT_CERT_REFUSED or isinstance(error, ssl.SSLEOFError):
        return "TLS: the member ended the handshake (client certificate refused or missing?)"
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return "TLS: the member does not speak TLS on this port"
    return f"TLS handshake failed ({reason})"


def _name_mismatch(server_name: str | None) -> str:
    names = f"serverName {server_name}" if server_name else "the pod IP"
    return f"TLS: certificate does not name {names}"


def target_problem(url: str, policy: ProbePolicy | None) -> str | None:
    """Why ``url`` must not be requested, or ``None``; nothing is sent for a refused URL.

    Targets are built by :func:`hooks.sync.plan_probes` from a Pod IP, the spec's port and
    a leader path, so none of this should ever trip. It is checked here, on the exact URL
    about to be requested, so that no other code path can make the hook request a
    hostname (DNS, and whatever it resolves to), credentials, a query, or another path.
    """
    try:
        parsed = urllib3.util.parse_url(url)
    except urllib3.exceptions.LocationParseError:
        return "refused: not a valid URL"
    if parsed.scheme not in ("http", "https"):
        return "refused: scheme is not http or https"
    if parsed.auth or parsed.query is not None or parsed.fragment is not None:
        return "refused: URL carries credentials, a query or a fragment"
    if parsed.path not in LEADER_PATHS:
        return "refused: path is not one of Patroni's leader paths"
    host = (parsed.host or "").removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "refused: host is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return "refused: host is not an IP address"
    if parsed.port is None:
        return "refused: no port"
    if url != f"{parsed.scheme}://{parsed.host}:{parsed.port}{parsed.path}":
        # parse_url normalises ("/../primary" → "/primary", case, ...): only a URL that
        # is already in that form is requested, so what was checked is what is sent.
        return "refused: URL is not in canonical form"
    if policy is not None:
        port = policy.port_problem(parsed.port)
        if port is not None:
            return f"refused: {port}"
        return policy.address_problem(ip)
    return None


def _describe(error: BaseException, server_name: str | None = None) -> str:
    """A short reason that is the same every time the same failure happens.

    requests' messages embed object addresses (``<HTTPConnection object at 0x7f…>``),
    which would make every status write differ; walk the cause chain instead.
    """
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return "connect timeout"
    if isinstance(error, requests.exceptions.ReadTimeout):
        return "read timeout"
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return _tls_reason(current, server_name)
        if isinstance(current, CertificateError):  # urllib3's own name check (serverName)
            return _name_mismatch(server_name)
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, ConnectionResetError):
            return "connection reset"
        if isinstance(current, TimeoutError):
            return "read timeout"
        for arg in getattr(current, "args", ()):
            if isinstance(arg, BaseException) and id(arg) not in seen:
                current = arg
                break
        else:
            current = current.__cause__ or current.__context__
    # The body is read from urllib3 directly, so its errors arrive unwrapped.
    if isinstance(
        error, requests.exceptions.ChunkedEncodingError | urllib3.exceptions.ProtocolError
    ):
        return "connection broken mid-body"
    if isinstance(error, requests.exceptions.ConnectionError):
        return "connection failed"
    return f"probe failed ({type(error).__name__})"
