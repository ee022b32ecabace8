"""The primary Service: selects the one Pod Patroni confirms as leader, and nothing else.

Routed: the Service named ``spec.serviceRef.name`` selects ``primarySelector`` plus the
leader's ``statefulset.kubernetes.io/pod-name`` (one Pod at most); a Service we own under
an old ``serviceRef`` name is moved along (never dropped, never left on a stale leader).
In doubt: every primary Service is kept exactly as observed (a hand-edited selector too),
and none is created. The members it chooses among are the Pods ``primarySelector``
matches: its ``/customize`` rule relates them.

Pure, like every part (:mod:`hooks.parts.base`).
"""

from __future__ import annotations

from typing import Any

from hooks.core import manifests
from hooks.core.conditions import CONDITION_ROUTED
from hooks.core.routing import Decision
from hooks.domain.model import POD_NAME_LABEL, SERVICE_KEY, ClusterSpec, Condition
from hooks.domain.observed import ServiceChild
from hooks.domain.request import SyncRequest
from hooks.parts.base import ChildGroup, Part, PartContext, PartPlan
from hooks.parts.readonly_objects import is_read_only_service


def plan(context: PartContext) -> PartPlan:
    """The primary Service(s), ``status.primary``/``service`` and ``PrimaryRouted``."""
    spec, request, route, keep = context.spec, context.request, context.route, context.keep
    primaries = primary_services(request)
    if route.routed:
        leader = route.leader
        assert leader is not None
        children = []
        if spec.service_name not in primaries:
            children.append(desired_service(spec, request.namespace, leader))
        for name, observed in sorted(primaries.items()):
            if name == spec.service_name:
                children.append(desired_service(spec, request.namespace, leader))
            else:
                # A Service we own under an old serviceRef name: never dropped (only a
                # finalize may drop children), and never left on a stale leader.
                kept = keep(observed)
                kept.setdefault("spec", {})["selector"] = _selector(spec, leader)
                children.append(kept)
        primary: str | None = leader
        timeline = route.timeline
        message = (
            f"Patroni reports {leader} as leader"
            f"{f' (timeline {timeline})' if timeline is not None else ''}; "
            f"Service {spec.service_name} selects it"
        )
    else:
        children = [keep(obj) for _, obj in sorted(primaries.items())]
        primary = observed_primary(request)
        message = f"{route.why}; {keeping_phrase(request)}"
    status: dict[str, Any] = {} if primary is None else {"primary": primary}
    status["service"] = spec.service_name
    condition = Condition(
        CONDITION_ROUTED, "True" if route.routed else "False", route.decision.value, message
    )
    return PartPlan(children, status, condition)


def related_rules(spec: ClusterSpec, uid: str | None) -> list[dict[str, Any]]:
    """The member Pods, by ``primarySelector`` (never empty: the schema requires a label)."""
    return [
        {
            "apiVersion": "v1",
            "resource": "pods",
            "labelSelector": {"matchLabels": dict(spec.primary_selector)},
        }
    ]


PART = Part(
    name="primary Service",
    condition=CONDITION_ROUTED,
    reasons=Decision,
    child_groups=(ChildGroup(SERVICE_KEY, "v1", "services"),),
    related_rules=related_rules,
    plan=plan,
)


def desired_service(spec: ClusterSpec, namespace: str, leader: str) -> dict[str, Any]:
    """The primary Service, as we want it, with only the fields we own."""
    return manifests.service(
        spec.service_name,
        namespace,
        labels=spec.service_labels,
        annotations=spec.service_annotations,
        service_type=spec.service_type,
        ports=spec.service_ports,
        selector=_selector(spec, leader),
    )


def primary_services(request: SyncRequest) -> dict[str, ServiceChild]:
    """Observed Services that route to the primary: all but our read-only Services.

    The names in the spec decide first: the one named like ``spec.serviceRef`` is the
    primary's and the one named like ``spec.replicaService`` is not, whatever they were
    before a change of the spec swapped the names; the others go by their label.
    """
    spec = request.spec
    primary = spec.service_name if spec is not None else None
    read_only = spec.replica_service.name if spec and spec.replica_service else None
    return {
        name: service
        for name, service in request.services.items()
        if name == primary or (name != read_only and not is_read_only_service(service))
    }


def observed_primary(request: SyncRequest) -> str | None:
    """The pod the primary Service selects now, if any."""
    name = request.spec.service_name if request.spec is not None else ""
    primaries = primary_services(request)
    candidates = [primaries[name]] if name in primaries else []
    if not candidates:
        candidates = [obj for _, obj in sorted(primaries.items())]
    for service in candidates:
        target = _selected_pod(service)
        if isinstance(target, str):
            return target
    return None


def keeping_phrase(request: SyncRequest) -> str:
    """What a reply in doubt keeps: each primary Service and the pod it selects."""
    primaries = primary_services(request)
    if not primaries:
        return "no Service is created until a leader is confirmed"
    parts = []
    for name, service in sorted(primaries.items()):
        target = _selected_pod(service)
        parts.append(f"Service {name} on {target}" if target else f"Service {name} as it is")
    return "keeping " + ", ".join(parts)


def _selected_pod(service: ServiceChild) -> object:
    """The selector's pod-name value as observed (free input: not necessarily a string)."""
    return service.selector.get(POD_NAME_LABEL) if service.selector is not None else None


def _selector(spec: ClusterSpec, leader: str) -> dict[str, str]:
    return {**spec.primary_selector, POD_NAME_LABEL: leader}
