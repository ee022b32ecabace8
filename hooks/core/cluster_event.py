"""Which Kubernetes Event a sync reply deserves, if any (pure; sent by :mod:`hooks.shell.events`).

The trigger is a *transition* visible in the parent's own status (the decision differs
from the ``Ready`` reason recorded there), and the Event's name is derived from the
parent's UID, the transition and the previous condition's ``lastTransitionTime``: two hook
replicas that see the same transition (a retried sync, a stale cache) create the same
name, and the API server refuses the second with 409. So Events are de-duplicated
across replicas without shared state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from hooks.core.outcome import SyncOutcome
from hooks.core.routing import Decision
from hooks.domain.request import SyncRequest


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """An ``events.k8s.io/v1`` Event about one PostgreSQLCluster."""

    name: str
    namespace: str
    type: str
    reason: str
    action: str
    note: str
    regarding: Mapping[str, str]


#: Decisions that are not a routing doubt but still need a person: a Warning Event.
_WARNED = (Decision.INVALID_SPEC, Decision.SERVICE_NOT_OWNED)


def event_for(request: SyncRequest, outcome: SyncOutcome) -> ClusterEvent | None:
    """The Event a reply deserves, if any (pure)."""
    if request.finalizing or not outcome.transition:
        return None
    if outcome.primary_changed:
        kind, reason, action = "Normal", "PrimaryChanged", "RoutePrimary"
        note = (
            f"Service {request.spec.service_name if request.spec else '?'} moved from "
            f"{outcome.previous_primary or '(none)'} to {outcome.primary}: {outcome.message}"
        )
    elif outcome.decision.degraded or outcome.decision in _WARNED:
        kind, reason, action = "Warning", outcome.decision.value, "KeepRouting"
        note = outcome.message
    else:
        return None
    uid = request.uid or ""
    ready = request.previous.ready
    since = ready.last_transition_time if ready is not None else None
    key = "|".join([uid, reason, str(outcome.primary), since or ""])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return ClusterEvent(
        name=f"{request.name[:200]}.{digest}",
        namespace=request.namespace,
        type=kind,
        reason=reason,
        action=action,
        note=note[:1000],
        regarding={
            "apiVersion": request.api_version,
            "kind": request.kind,
            "name": request.name,
            "namespace": request.namespace,
            "uid": uid,
        },
    )
