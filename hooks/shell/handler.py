"""The hook's pipeline behind HTTP: validate → probe → decide → reply, and one observer.

:func:`handle_sync` and :func:`handle_customize` take the decoded JSON body and answer a
:class:`Reply`; :mod:`hooks.shell.app` only reads the body, authenticates and writes the reply.
What a sync did is observed in one place, :func:`observe`: the log lines, the Prometheus
metrics and the Kubernetes Event, all from the :class:`~hooks.sync.SyncOutcome`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hooks.children import related_rules
from hooks.core.cluster_event import event_for
from hooks.core.outcome import SyncOutcome
from hooks.core.routing import Decision
from hooks.core.scope import serves
from hooks.domain.members import MemberStatus
from hooks.domain.request import SyncRequest
from hooks.loaders.envelope import RequestError, load_customize_call, load_sync_request
from hooks.patroni import Prober
from hooks.probe.plan import Prepared, ProbePlan, prepare
from hooks.shell import metrics
from hooks.shell.config import HookSettings
from hooks.shell.events import EventEmitter
from hooks.shell.logs import bound
from hooks.sync import reconcile

#: The HTTP shell's logger (dashboards and log queries select it by this name).
log = logging.getLogger("hooks.app")


@dataclass(frozen=True, slots=True)
class Deps:
    """What the pipeline needs from outside: settings, the prober, the clock, Events."""

    settings: HookSettings
    prober: Prober
    clock: Callable[[], datetime]
    events: EventEmitter | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A JSON reply: the body and the HTTP status."""

    body: dict[str, Any]
    status: int = 200


def handle_sync(deps: Deps, body: object, *, request_id: str, started: float) -> Reply:
    """A sync or finalize call: 400 for a broken request, else the reconciled reply.

    ``started`` is when the HTTP call came in (``time.perf_counter``), for the latency metric.
    """
    loaded = load_sync(deps, body, request_id=request_id)
    if isinstance(loaded, Reply):
        return loaded
    return answer_sync(deps, loaded, request_id=request_id, started=started)


def load_sync(deps: Deps, body: object, *, request_id: str) -> Prepared | Reply:
    """The first half of :func:`handle_sync`: the request loaded and its probes planned, in
    one pass (or a 400 reply).

    Apart so that the app can let go of the decoded body before the probe round: the
    loaded request keeps what the reply needs (the children as observed, small typed Pods),
    not the body's bulk (hooks/shell/budget.py).
    """
    try:
        policy = deps.settings.probe_policy
        return prepare(load_sync_request(body, max_pods=policy.max_members), policy)
    except RequestError as error:
        return bad_request("sync", str(error), request_id)


def answer_sync(deps: Deps, prepared: Prepared, *, request_id: str, started: float) -> Reply:
    """The second half of :func:`handle_sync`: probe, decide, observe, reply."""
    request, plan = prepared.request, prepared.plan
    hook = "finalize" if request.finalizing else "sync"
    with bound(cluster=request.cluster, request_id=request_id, hook=hook):
        answers = deps.prober.probe(plan.targets) if plan.targets else {}
        probes = {**plan.refused, **answers}
        outcome = reconcile(request, probes, now=deps.clock(), timing=deps.settings.resync)
        observe(deps, request, plan, answers, outcome)
        elapsed = time.perf_counter() - started
        metrics.SYNC_SECONDS.labels(hook).observe(elapsed)
        log.debug(
            "sync answered",
            extra={"decision": outcome.decision.value, "seconds": round(elapsed, 4)},
        )
        return Reply(outcome.body)


def handle_customize(body: object, *, request_id: str) -> Reply:
    """A customize call: every registered part's related-resource rules for a valid spec.

    None for a parent the calling install never syncs (another shard's, see
    :mod:`hooks.core.scope`): Metacontroller matches each parent's rules against every Pod
    and Service event of the cluster on one goroutine, so another shard's rules cost
    every install time on each event and buy nothing.
    """
    try:
        cluster, spec, uid, scope = load_customize_call(body)
    except RequestError as error:
        return bad_request("customize", str(error), request_id)
    if not serves(scope):
        metrics.CUSTOMIZE_REPLIES.labels("other-shard").inc()
        return Reply({"relatedResources": []})
    if spec is None:
        with bound(cluster=cluster, request_id=request_id, hook="customize"):
            log.warning("invalid spec: no related Pods until it is fixed")
        metrics.CUSTOMIZE_REPLIES.labels("invalid-spec").inc()
        return Reply({"relatedResources": []})
    namespace = cluster.partition("/")[0]
    metrics.CUSTOMIZE_REPLIES.labels("all").inc()
    return Reply({"relatedResources": related_rules(spec, uid, namespace)})


def observe(
    deps: Deps,
    request: SyncRequest,
    plan: ProbePlan,
    answers: Mapping[str, MemberStatus],
    outcome: SyncOutcome,
) -> None:
    """Logs, metrics and the Event of one sync, from its outcome (the one place)."""
    for status in answers.values():
        metrics.PROBES.labels(status.verdict.value).inc()
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
    elif outcome.decision is Decision.SELECTOR_NOT_UNIQUE:
        # Someone runs a Pod that the primary Service would select beside the leader:
        # counted on every reply (the alert), logged as an error on the transition.
        metrics.SELECTOR_CONFLICTS.inc()
        log.log(
            logging.ERROR if outcome.transition else logging.DEBUG,
            "not routing: %s",
            outcome.message,
        )
    elif outcome.decision.degraded:
        log.log(notable, "keeping routing: %s", outcome.message)
    elif outcome.decision is Decision.SERVICE_NOT_OWNED:
        log.log(notable, "service not owned: %s", outcome.message)
    elif outcome.transition:
        log.info("routing confirmed: %s", outcome.message)
    if deps.events is not None:
        event = event_for(request, outcome)
        if event is not None:
            deps.events.emit(event)


def bad_request(endpoint: str, message: str, request_id: str) -> Reply:
    """HTTP 400 with the reason: counted and logged."""
    metrics.BAD_REQUESTS.labels(endpoint).inc()
    log.warning("bad %s request: %s", endpoint, message, extra={"request_id": request_id})
    return Reply({"error": message}, status=400)
