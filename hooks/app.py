"""The HTTP shell around the decision core: request → validate → probe → decide → reply.

``create_app`` is the WSGI app factory (``gunicorn 'hooks.app:create_app()'``). Its
dependencies (settings, prober, clock) are injected, so tests run the real app with a
fake prober or against real Patroni, and nothing happens at import time.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from hooks import metrics
from hooks.auth import Authenticator
from hooks.config import HookSettings
from hooks.events import EventEmitter, event_for, in_cluster_events_api
from hooks.logs import bound
from hooks.logs import configure as configure_logging
from hooks.parts import related_rules
from hooks.patroni import PatroniProber, Prober
from hooks.probing import apply_policy, plan_probes
from hooks.routing import Decision
from hooks.schemas import (
    RequestError,
    load_customize_parent,
    load_sync_request,
    nesting_problem,
)
from hooks.sync import reconcile

log = logging.getLogger("hooks.app")


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
    prober = prober or PatroniProber(
        deadline=settings.probe_deadline,
        max_body_bytes=settings.max_probe_body_bytes,
        threads=settings.probe_threads,
        policy=settings.probe_policy,
        tls=settings.patroni_tls,
    )
    authenticator = None if settings.auth.mode == "none" else Authenticator(settings.auth)
    if authenticator is None:
        log.warning("caller authentication is OFF (PGFH_AUTH=none): for development only")
    app = Flask("hooks")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]

    @app.before_request
    def _request_id() -> None:
        # The caller's id is echoed and logged (refused calls too): only a short, plain
        # token of it, so nobody can write arbitrary text into the logs through it.
        given = request.headers.get("X-Request-Id", "")
        g.request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        g.started = time.perf_counter()

    @app.before_request
    def _authenticate() -> Response | None:
        # Before the body is read: an unauthenticated caller costs no parsing, no probe.
        if authenticator is None or request.endpoint not in _PROTECTED:
            return None
        verdict = authenticator.check(request.headers.get("Authorization"), _peer_certificate())
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
            return _reply({"error": "forbidden"}, status=403)
        response = _reply({"error": "unauthorized"}, status=401)
        if settings.auth.tokens_required:
            response.headers["WWW-Authenticate"] = 'Bearer realm="pg-failover-hook"'
        return response

    @app.after_request
    def _echo_request_id(response: Response) -> Response:
        response.headers["X-Request-Id"] = g.get("request_id", "")
        return response

    @app.post("/sync")
    def sync() -> Response:
        body = _json_body(settings.max_json_depth)
        try:
            sync_request = apply_policy(load_sync_request(body), settings.probe_policy)
        except RequestError as error:
            return _bad_request("sync", str(error))
        hook = "finalize" if sync_request.finalizing else "sync"
        with bound(cluster=sync_request.cluster, request_id=g.request_id, hook=hook):
            plan = plan_probes(sync_request, settings.probe_policy)
            answers = prober.probe(plan.targets) if plan.targets else {}
            for status in answers.values():
                metrics.PROBES.labels(status.verdict.value).inc()
            probes = {**plan.refused, **answers}
            outcome = reconcile(sync_request, probes, now=clock(), timing=settings.resync)
            # Warnings on transitions only: a cluster without a leader is re-synced every
            # fraction of a second, and must not flood the logs while it stays so.
            notable = logging.WARNING if outcome.transition else logging.DEBUG
            if plan.refused:
                # Someone may be trying to aim the probes (a forged Pod status): counted
                # always, logged with the addresses when the decision changes.
                metrics.REFUSED_ADDRESSES.inc(len(plan.refused))
                log.log(
                    notable,
                    "not probing: %s",
                    "; ".join(f"{pod}: {s.reason}" for pod, s in sorted(plan.refused.items())),
                )
            metrics.REPLIES.labels(outcome.decision.value).inc()
            if outcome.decision is Decision.INVALID_SPEC:
                metrics.INVALID_SPECS.inc()
                log.log(notable, "invalid spec: %s", outcome.message)
            elif outcome.primary_changed:
                metrics.PRIMARY_CHANGES.inc()
                log.info(
                    "primary changed from %s to %s",
                    outcome.previous_primary or "(none)",
                    outcome.primary,
                    extra={"old_leader": outcome.previous_primary, "new_leader": outcome.primary},
                )
            elif outcome.decision.degraded:
                log.log(notable, "keeping routing: %s", outcome.message)
            elif outcome.transition:
                log.info("routing confirmed: %s", outcome.message)
            if events is not None:
                event = event_for(sync_request, outcome)
                if event is not None:
                    events.emit(event)
            elapsed = time.perf_counter() - g.started
            metrics.SYNC_SECONDS.labels(hook).observe(elapsed)
            log.debug(
                "sync answered",
                extra={"decision": outcome.decision.value, "seconds": round(elapsed, 4)},
            )
            return _reply(outcome.body)

    @app.post("/customize")
    def customize() -> Response:
        body = _json_body(settings.max_json_depth)
        try:
            cluster, spec, uid = load_customize_parent(body)
        except RequestError as error:
            return _bad_request("customize", str(error))
        if spec is not None:
            # Every registered part's rules (hooks.parts): the member Pods, backup Jobs ...
            return _reply({"relatedResources": related_rules(spec, uid)})
        else:
            with bound(cluster=cluster, request_id=g.request_id, hook="customize"):
                log.warning("invalid spec: no related Pods until it is fixed")
        return _reply({"relatedResources": []})

    @app.get("/healthz")
    def healthz() -> Response:
        return _reply({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        # Not ready while no caller could authenticate: a rollout whose Secret has no
        # usable token stops at the first new pod instead of replacing working ones.
        problem = authenticator.ready_problem() if authenticator is not None else None
        if problem is not None:
            return _reply({"status": "not ready", "reason": problem}, status=503)
        return _reply({"status": "ready"})

    @app.get("/metrics")
    def prometheus() -> Response:
        payload, content_type = metrics.exposition()
        return Response(payload, status=200, content_type=content_type)

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Response:
        # 404, 405, 413 ... as JSON, never Werkzeug's HTML page.
        metrics.BAD_REQUESTS.labels(_endpoint_label()).inc()
        return _reply({"error": error.description or error.name}, status=error.code or 500)

    @app.errorhandler(Exception)
    def _internal_error(error: Exception) -> Response:
        # A bug. 500 makes Metacontroller change nothing and retry with backoff.
        metrics.ERRORS.labels(_endpoint_label()).inc()
        log.exception("internal error on %s", request.path)
        return _reply({"error": "internal error; nothing was changed"}, status=500)

    return app


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Endpoints only Metacontroller may call; health and metrics stay open.
_PROTECTED = frozenset({"sync", "customize"})


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


#: Flask endpoint → metric label (the path, as before, for the known ones).
_ENDPOINTS = {
    "sync": "sync",
    "customize": "customize",
    "healthz": "healthz",
    "readyz": "readyz",
    "prometheus": "metrics",
}


def _json_body(max_depth: int) -> object:
    """The request's JSON, or a 400 (raised as an HTTPException) with the reason."""
    from werkzeug.exceptions import BadRequest

    raw = request.get_data(cache=False)
    if not raw:
        raise BadRequest("empty request body: expected a JSON object")
    problem = nesting_problem(raw, max_depth)
    if problem is not None:
        raise BadRequest(f"request body {problem}")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:  # not reachable after the depth check; kept as a last resort
        raise BadRequest("request body nests too deeply") from None
    except UnicodeDecodeError:
        raise BadRequest("request body is not UTF-8") from None
    except ValueError as error:
        raise BadRequest(f"request body is not valid JSON: {error}") from None


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _bad_request(endpoint: str, message: str) -> Response:
    metrics.BAD_REQUESTS.labels(endpoint).inc()
    log.warning("bad %s request: %s", endpoint, message, extra={"request_id": g.request_id})
    return _reply({"error": message}, status=400)


def _reply(body: dict[str, Any], status: int = 200) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":"), allow_nan=False),
        status=status,
        content_type="application/json",
    )
