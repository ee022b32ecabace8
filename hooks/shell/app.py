"""The HTTP shell: Flask views that read the body, authenticate, and delegate.

``create_app`` is the WSGI app factory (``gunicorn 'hooks.shell.app:create_app()'``). Its
dependencies (settings, prober, clock, Events) are injected, so tests run the real app
with a fake prober or against real Patroni, and nothing happens at import time. The
pipeline itself (validate → probe → decide → reply, and what is logged, counted and
recorded as an Event) is :mod:`hooks.shell.handler`'s.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, g, request
from werkzeug.exceptions import BadRequest, HTTPException

from hooks.loaders.jsonbody import JsonRefused, bounded_loads
from hooks.patroni import PatroniProber, Prober
from hooks.shell import metrics
from hooks.shell.auth import Authenticator
from hooks.shell.budget import ByteBudget
from hooks.shell.config import HookSettings
from hooks.shell.events import EventEmitter, in_cluster_events_api
from hooks.shell.handler import Deps, Reply, answer_sync, handle_customize, load_sync
from hooks.shell.logs import configure as configure_logging

log = logging.getLogger("hooks.app")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Endpoints only Metacontroller may call; health and metrics stay open.
_PROTECTED = frozenset({"sync", "customize"})
#: Flask endpoint → metric label (the path, as before, for the known ones).
_ENDPOINTS = {
    "sync": "sync",
    "customize": "customize",
    "healthz": "healthz",
    "readyz": "readyz",
    "prometheus": "metrics",
}


def _utc_now() -> datetime:
    return datetime.now(UTC)


def create_app(
    settings: HookSettings | None = None,
    prober: Prober | None = None,
    clock: Callable[[], datetime] = _utc_now,
    events: EventEmitter | None = None,
) -> Flask:
    """Build the hook's Flask app.

    Without injected dependencies it reads ``PGFH_*`` settings from the environment,
    configures JSON logging, probes real Patroni members and (if enabled) records
    Events with the pod's service account.
    """
    if settings is None:
        settings = HookSettings.from_env()
        configure_logging(settings.log_format, settings.log_level)
    if events is None and settings.emit_events:
        events = EventEmitter(in_cluster_events_api, instance=settings.instance, clock=clock)
    prober = prober or PatroniProber.from_settings(settings)
    authenticator = None if settings.auth.mode == "none" else Authenticator(settings.auth)
    if authenticator is None:
        log.warning("caller authentication is OFF (PGFH_AUTH=none): for development only")
    budget = ByteBudget(settings.max_body_bytes_in_flight)
    views = _Views(Deps(settings, prober, clock, events), authenticator, budget)
    app = Flask("hooks")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.before_request(_request_id)
    app.before_request(views.authenticate)
    app.after_request(_echo_request_id)
    app.add_url_rule("/sync", "sync", views.sync, methods=["POST"])
    app.add_url_rule("/customize", "customize", views.customize, methods=["POST"])
    app.add_url_rule("/healthz", "healthz", _healthz, methods=["GET"])
    app.add_url_rule("/readyz", "readyz", views.readyz, methods=["GET"])
    app.add_url_rule("/metrics", "prometheus", _prometheus, methods=["GET"])
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal_error)
    return app


@dataclass(frozen=True, slots=True)
class _Views:
    """The views that need the app's dependencies."""

    deps: Deps
    authenticator: Authenticator | None
    budget: ByteBudget

    def sync(self) -> Response:
        # The body is read, decoded and loaded within the byte budget, then let go: the
        # probe round (up to its deadline) runs with the loaded request only.
        with self._room() as granted:
            if not granted:
                return _busy()
            settings = self.deps.settings
            body = _json_body(settings.max_json_depth, settings.max_request_bytes)
            loaded = load_sync(self.deps, body, request_id=g.request_id)
            del body
        if isinstance(loaded, Reply):
            return _reply(loaded)
        return _reply(answer_sync(self.deps, loaded, request_id=g.request_id, started=g.started))

    def customize(self) -> Response:
        with self._room() as granted:
            if not granted:
                return _busy()
            settings = self.deps.settings
            body = _json_body(settings.max_json_depth, settings.max_request_bytes)
            return _reply(handle_customize(body, request_id=g.request_id))

    def _room(self) -> AbstractContextManager[bool]:
        """Room in the byte budget for this body (its Content-Length, else the cap) while it
        is read, decoded and loaded (hooks/shell/budget.py)."""
        settings = self.deps.settings
        size = request.content_length
        return self.budget.held(
            settings.max_request_bytes if size is None else size, settings.probe_deadline
        )

    def readyz(self) -> Response:
        # Not ready while no caller could authenticate: a rollout whose Secret has no
        # usable token stops at the first new pod instead of replacing working ones.
        auth = self.authenticator
        problem = auth.ready_problem() if auth is not None else None
        if problem is not None:
            return _reply(Reply({"status": "not ready", "reason": problem}, status=503))
        return _reply(Reply({"status": "ready"}))

    def authenticate(self) -> Response | None:
        """Before the body is read: an unauthenticated caller costs no parsing, no probe."""
        auth = self.authenticator
        if auth is None or request.endpoint not in _PROTECTED:
            return None
        verdict = auth.check(request.headers.get("Authorization"), _peer_certificate())
        if verdict.ok:
            return None
        metrics.AUTH_FAILURES.labels(verdict.reason).inc()
        log.warning(
            "refused a %s call: %s",
            request.endpoint,
            verdict.reason,
            extra={"request_id": g.request_id, "remote_addr": request.remote_addr},
        )
        # Nothing about why: a caller probing for tokens learns only "no".
        if verdict.status == 403:
            return _reply(Reply({"error": "forbidden"}, status=403))
        response = _reply(Reply({"error": "unauthorized"}, status=401))
        if self.deps.settings.auth.tokens_required:
            response.headers["WWW-Authenticate"] = 'Bearer realm="pg-failover-hook"'
        return response


def _request_id() -> None:
    # The caller's id is echoed and logged (refused calls too): only a short, plain
    # token of it, so nobody can write arbitrary text into the logs through it.
    given = request.headers.get("X-Request-Id", "")
    g.request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
    g.started = time.perf_counter()


def _echo_request_id(response: Response) -> Response:
    response.headers["X-Request-Id"] = g.get("request_id", "")
    return response


#: Seconds Metacontroller waits before it calls again after a busy refusal.
BUSY_RETRY_AFTER_SECONDS = 1


def _busy() -> Response:
    """429 with ``Retry-After``, not 503: Metacontroller v4.17.2 requeues a 429 after its
    ``Retry-After`` seconds (``pkg/hooks/webhook.go`` ``TooManyRequestError``, then
    ``queue.AddAfter`` in ``pkg/controller/composite/controller.go``), without growing the
    parent's backoff; a 5xx would go through ``AddRateLimited`` (5 ms doubling to 1000 s)."""
    metrics.BUSY.inc()
    log.warning("busy: bodies in progress leave no room for this %s call", request.endpoint)
    response = _reply(
        Reply({"error": "busy: too many large requests in progress; retry"}, status=429)
    )
    response.headers["Retry-After"] = str(BUSY_RETRY_AFTER_SECONDS)
    return response


def _healthz() -> Response:
    return _reply(Reply({"status": "ok"}))


def _prometheus() -> Response:
    payload, content_type = metrics.exposition()
    return Response(payload, status=200, content_type=content_type)


def _http_error(error: HTTPException) -> Response:
    # 404, 405, 413 ... as JSON, never Werkzeug's HTML page.
    metrics.BAD_REQUESTS.labels(_endpoint_label()).inc()
    return _reply(Reply({"error": error.description or error.name}, status=error.code or 500))


def _internal_error(error: Exception) -> Response:
    # A bug. 500 makes Metacontroller change nothing and retry with backoff.
    metrics.ERRORS.labels(_endpoint_label()).inc()
    log.exception("internal error on %s", request.path)
    return _reply(Reply({"error": "internal error; nothing was changed"}, status=500))


def _peer_certificate() -> dict[str, Any] | None:
    """The client certificate gunicorn verified on this connection, if any.

    gunicorn asks for one (``CERT_OPTIONAL``) when a client CA is configured and refuses
    the handshake if a presented certificate does not verify; which endpoints *require*
    one is decided here, so that kubelet probes and Prometheus need none.
    """
    sock = request.environ.get("gunicorn.socket")
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is None:
        return None
    try:
        certificate = getpeercert()
    except (OSError, ValueError):
        return None
    return certificate if isinstance(certificate, dict) and certificate else None


def _endpoint_label() -> str:
    """The metric label for this request: a known endpoint, never the raw path.

    The path is chosen by the client; used as a label, every new path would create a new
    time series in every worker (a memory leak any client could drive).
    """
    rule = request.url_rule
    return _ENDPOINTS.get(rule.endpoint, "other") if rule is not None else "other"


def _json_body(max_depth: int, max_bytes: int) -> object:
    """The request's JSON, or a 400 (raised as an HTTPException) with the reason."""
    raw = request.get_data(cache=False)
    if not raw:
        raise BadRequest("empty request body: expected a JSON object")
    try:
        return bounded_loads(raw, max_bytes=max_bytes, max_depth=max_depth)
    except JsonRefused as refused:
        raise BadRequest(f"request body {refused}") from None


def _reply(reply: Reply) -> Response:
    return Response(
        json.dumps(reply.body, separators=(",", ":"), allow_nan=False),
        status=reply.status,
        content_type="application/json",
    )
