"""The hook's own settings, read once from the environment at start-up.

Everything here is per hook deployment, not per cluster: the per-cluster knobs live
in the PostgreSQLCluster spec (see :mod:`hooks.domain.model`, loaded by
:mod:`hooks.loaders.schemas`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from hooks.domain.model import ResyncTiming
from hooks.loaders.jsonbody import MAX_JSON_DEPTH
from hooks.probe.policy import ProbePolicy, parse_networks, parse_ports
from hooks.probe.settings import DEFAULT_MAX_BODY_BYTES, DEFAULT_PROBE_DEADLINE
from hooks.probe.tls import PatroniTLS

T = TypeVar("T")


#: ``token``: bearer token required. ``mtls``: verified client certificate required.
#: ``token+mtls``: both. ``none``: no caller authentication (development only).
AUTH_MODES = ("token", "mtls", "token+mtls", "none")
DEFAULT_TOKENS_PATH = "/etc/pg-failover-hook/auth"


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """How callers of ``/sync`` and ``/customize`` must authenticate."""

    mode: str = "token"
    #: A directory (one token per file, e.g. a mounted Secret with several keys) or a
    #: file (one token per line).
    tokens_path: str = DEFAULT_TOKENS_PATH
    #: mTLS: names (subject CN or DNS/URI SAN) a client certificate must carry; empty
    #: accepts any certificate the client CA signed.
    client_names: frozenset[str] = field(default_factory=frozenset)

    @property
    def tokens_required(self) -> bool:
        return self.mode in ("token", "token+mtls")

    @property
    def certificate_required(self) -> bool:
        return self.mode in ("mtls", "token+mtls")


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """HTTPS for the hook's own listener (gunicorn), and the CA of client certificates."""

    cert_file: str
    key_file: str
    #: CA that signs Metacontroller's client certificate; needed for mTLS.
    client_ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class HookSettings:
    """Settings of one hook process."""

    #: Overall bound of one probe round (all members, concurrently). It must stay well
    #: below the CompositeController's webhook timeout (5 s in our manifest).
    probe_deadline: float = DEFAULT_PROBE_DEADLINE
    #: Largest Patroni response body we read; Patroni's own answers are about 1 KiB.
    max_probe_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Largest sync request accepted (``PGFH_MAX_REQUEST_BYTES``). Unset, it follows the
    #: members cap (:func:`request_cap`): a cluster the hook would probe always fits, and
    #: every request thread can hold one at once within the pod's memory limit
    #: (testbed/bench/memory.py measures it).
    max_request_bytes: int = field(default_factory=lambda: request_cap(ProbePolicy().max_members))
    #: Bytes of request bodies one worker reads and loads at once
    #: (``PGFH_MAX_BODY_BYTES_IN_FLIGHT``; unset: 2 × ``max_request_bytes``): the pod's
    #: memory bound (hooks/shell/budget.py, measured by testbed/bench/memory.py).
    max_body_bytes_in_flight: int = field(
        default_factory=lambda: 2 * request_cap(ProbePolicy().max_members)
    )
    #: Deepest bracket nesting accepted in a request body. Real requests nest about 15
    #: levels (managedFields inside related Pods); anything far deeper is hostile.
    max_json_depth: int = MAX_JSON_DEPTH
    resync: ResyncTiming = field(default_factory=ResyncTiming)
    #: Where probes may go: Patroni ports, Pod networks, members per request.
    probe_policy: ProbePolicy = field(default_factory=ProbePolicy)
    #: Log format: "json" (production) or "text" (a developer's terminal).
    log_format: str = "json"
    log_level: str = "INFO"
    #: Record Kubernetes Events on transitions (needs RBAC: deploy/events overlay).
    emit_events: bool = False
    #: This replica's name in Events (the Downward API's pod name).
    instance: str = "pg-failover-hook"
    #: Who may call /sync and /customize. The default requires a bearer token.
    auth: AuthSettings = field(default_factory=AuthSettings)
    #: HTTPS on the hook's listener; ``None`` serves plain HTTP.
    server_tls: ServerTLS | None = None
    #: TLS towards Patroni members whose spec says ``scheme: https``.
    patroni_tls: PatroniTLS = field(default_factory=PatroniTLS)
    #: Request threads of each gunicorn worker (``GUNICORN_THREADS``): how many syncs one
    #: worker runs at once. 16: see docs/scale.md; testbed/bench/memory.py for what they cost.
    request_threads: int = 16
    #: Pool probes one sync's round may have in flight at once (``PGFH_PROBE_THREADS_PER_ROUND``);
    #: the pool is this times ``request_threads``, so a round never waits for a thread and
    #: one cluster's hung members cannot starve another's probes (hooks/patroni.py).
    probe_threads_per_round: int = 16
    #: Close a caller's keep-alive connection after its n-th request (0: never), so that
    #: the load spreads over the hook pods: see :func:`closes_connection`.
    connection_max_requests: int = 100

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HookSettings:
        """Read ``PGFH_*`` variables; anything unset keeps its default."""
        env = os.environ if env is None else env
        default = cls()

        def number(name: str, fallback: float) -> float:
            raw = env.get(name)
            if raw is None or raw == "":
                return fallback
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
            if not math.isfinite(value):
                raise ValueError(f"{name}={raw!r} must be a finite number")
            if value <= 0:
                raise ValueError(f"{name}={raw!r} must be positive")
            return value

        def count(name: str, fallback: int) -> int:
            value = number(name, fallback)
            if value != int(value):
                raise ValueError(f"{name}={env[name]!r} must be a whole number")
            return int(value)

        log_format = env.get("PGFH_LOG_FORMAT", "").strip().lower() or default.log_format
        if log_format not in ("json", "text"):
            raise ValueError(f"PGFH_LOG_FORMAT={log_format!r} must be json or text")
        log_level = env.get("PGFH_LOG_LEVEL", "").strip().upper() or default.log_level
        if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(
                f"PGFH_LOG_LEVEL={log_level!r} must be DEBUG, INFO, WARNING, ERROR or CRITICAL"
            )

        def parsed(name: str, parse: Callable[[str], T], fallback: T) -> T:
            raw = env.get(name, "").strip()
            if not raw:
                return fallback
            try:
                return parse(raw)
            except ValueError as error:
                raise ValueError(f"{name}={raw!r}: {error}") from None

        policy = ProbePolicy(
            allowed_ports=parsed(
                "PGFH_ALLOWED_PATRONI_PORTS", parse_ports, default.probe_policy.allowed_ports
            ),
            allowed_networks=parsed(
                "PGFH_ALLOWED_POD_CIDRS", parse_networks, default.probe_policy.allowed_networks
            ),
            max_members=count("PGFH_MAX_MEMBERS", default.probe_policy.max_members),
        )
        max_request = count("PGFH_MAX_REQUEST_BYTES", request_cap(policy.max_members))
        auth, server_tls = _auth_and_tls(env)
        patroni_tls = PatroniTLS(
            ca_file=_path(env, "PGFH_PATRONI_CA_FILE"),
            client_cert_file=_path(env, "PGFH_PATRONI_CLIENT_CERT_FILE"),
            client_key_file=_path(env, "PGFH_PATRONI_CLIENT_KEY_FILE"),
        )
        if bool(patroni_tls.client_cert_file) != bool(patroni_tls.client_key_file):
            raise ValueError(
                "PGFH_PATRONI_CLIENT_CERT_FILE and PGFH_PATRONI_CLIENT_KEY_FILE "
                "must be set together"
            )
        return cls(
            probe_deadline=number("PGFH_PROBE_DEADLINE_SECONDS", default.probe_deadline),
            max_probe_body_bytes=count("PGFH_MAX_PROBE_BODY_BYTES", default.max_probe_body_bytes),
            max_request_bytes=max_request,
            max_body_bytes_in_flight=count("PGFH_MAX_BODY_BYTES_IN_FLIGHT", 2 * max_request),
            max_json_depth=count("PGFH_MAX_JSON_DEPTH", default.max_json_depth),
            resync=ResyncTiming(
                healthy=number("PGFH_RESYNC_HEALTHY_SECONDS", default.resync.healthy),
                degraded=number("PGFH_RESYNC_DEGRADED_SECONDS", default.resync.degraded),
                min_poll=number("PGFH_MIN_POLL_SECONDS", default.resync.min_poll),
                refused=number("PGFH_RESYNC_REFUSED_SECONDS", default.resync.refused),
            ),
            probe_policy=policy,
            request_threads=count("GUNICORN_THREADS", default.request_threads),
            probe_threads_per_round=count(
                "PGFH_PROBE_THREADS_PER_ROUND", default.probe_threads_per_round
            ),
            log_format=log_format,
            log_level=log_level,
            emit_events=_flag(env, "PGFH_EMIT_EVENTS"),
            instance=env.get("POD_NAME") or default.instance,
            auth=auth,
            server_tls=server_tls,
            patroni_tls=patroni_tls,
            connection_max_requests=(
                0
                if env.get("PGFH_CONNECTION_MAX_REQUESTS", "").strip() == "0"
                else count("PGFH_CONNECTION_MAX_REQUESTS", default.connection_max_requests)
            ),
        )


#: What a request holds besides its Pods: the parent, the Services, the read-only
#: EndpointSlices (one endpoint per member), the CronJob and its recent Jobs.
REQUEST_BASE_BYTES = 256 * 1024
#: What one related Pod may take in a request: the recorded Patroni Pods take 6.6 KiB
#: each (managedFields included); 16 KiB leaves room for larger Pod specs (many
#: environment variables, sidecars).
POD_BUDGET_BYTES = 16 * 1024


def request_cap(max_members: int) -> int:
    """The default ``PGFH_MAX_REQUEST_BYTES`` for a members cap: 1.25 MiB for 64 members.

    The two caps go together: a cluster within the members cap always fits (and is
    probed); one somewhat over it fits too and is refused with a condition (``SpecValid``
    False, a slow resync), without its Pods being loaded; a request far past it is refused
    with 413 before it is parsed. The body cap bounds the hook's memory: each request
    thread may parse one such body at once (testbed/bench/memory.py).
    """
    return REQUEST_BASE_BYTES + max_members * POD_BUDGET_BYTES


def closes_connection(request_number: int, max_requests: int) -> bool:
    """Whether the hook answers request number ``request_number`` of a connection with
    ``Connection: close`` (``max_requests`` is ``PGFH_CONNECTION_MAX_REQUESTS``; 0: never).

    Metacontroller calls the hook through its Service with Go's default HTTP transport,
    which keeps up to two idle connections per host alive for 90 s and reuses the most
    recently used one first; kube-proxy balances *connections*, not requests. Without an
    end to a connection, the one or two connections Metacontroller holds carry every sync
    to the one or two pods they happened to land on, and pods that the HPA adds get
    nothing while those connections live. Ending every connection after a fixed number of
    requests is stateless (gunicorn counts the requests of each connection) and costs the
    caller one new TCP connection per ``max_requests`` syncs; Go opens the next one
    without an error or a retry, and kube-proxy sends it to a random pod.
    """
    return max_requests > 0 and request_number >= max_requests


def _auth_and_tls(env: Mapping[str, str]) -> tuple[AuthSettings, ServerTLS | None]:
    """``PGFH_AUTH*`` and ``PGFH_TLS_*``, checked against each other.

    Inconsistent settings fail the start-up (naming the variables) rather than serve a
    hook that refuses every call, or worse, one that accepts calls it should not.
    """
    mode = env.get("PGFH_AUTH", "").strip().lower() or "token"
    if mode not in AUTH_MODES:
        raise ValueError(f"PGFH_AUTH={mode!r} must be one of {', '.join(AUTH_MODES)}")
    names = frozenset(
        n.strip() for n in env.get("PGFH_AUTH_CLIENT_NAMES", "").split(",") if n.strip()
    )
    auth = AuthSettings(
        mode=mode,
        tokens_path=env.get("PGFH_AUTH_TOKENS_PATH", "").strip() or DEFAULT_TOKENS_PATH,
        client_names=names,
    )
    cert = _path(env, "PGFH_TLS_CERT_FILE")
    key = _path(env, "PGFH_TLS_KEY_FILE")
    client_ca = _path(env, "PGFH_TLS_CLIENT_CA_FILE")
    if bool(cert) != bool(key):
        raise ValueError("PGFH_TLS_CERT_FILE and PGFH_TLS_KEY_FILE must be set together")
    if client_ca and not cert:
        raise ValueError("PGFH_TLS_CLIENT_CA_FILE needs PGFH_TLS_CERT_FILE and PGFH_TLS_KEY_FILE")
    if auth.certificate_required and not client_ca:
        raise ValueError(
            f"PGFH_AUTH={mode} needs HTTPS with client certificates: set PGFH_TLS_CERT_FILE, "
            "PGFH_TLS_KEY_FILE and PGFH_TLS_CLIENT_CA_FILE"
        )
    if names and not auth.certificate_required:
        raise ValueError("PGFH_AUTH_CLIENT_NAMES is only used with PGFH_AUTH=mtls or token+mtls")
    server_tls = ServerTLS(cert, key, client_ca) if cert and key else None
    return auth, server_tls


def _path(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name, "").strip() or None


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name}={raw!r} is not a boolean (true/false)")
