"""The primary Service: selects the one Pod Patroni confirms as leader, and nothing else.

Routed: the Service named ``spec.serviceRef.name`` selects ``primarySelector`` plus the
leader's ``statefulset.kubernetes.io/pod-name`` (one Pod at most); a Service we own under
an old ``serviceRef`` name is moved along (never dropped, never left on a stale leader).
In doubt: every primary Service is kept exactly as observed (a hand-edited selector too),
and none is created. The members it chooses among are the Pods ``primarySelector``
matches: its ``/customize`` rule relates them.

**A Service of that name that is not ours.** The second ``/customize`` rule relates the
Service named ``spec.serviceRef.name`` whoever owns it. Seen there but not among the
children, it exists outside this controller (made by hand, by Helm, by the operator this
hook replaces): Metacontroller's create of it would fail with 409 AlreadyExists on every
sync, swallowed, and its selector would never be pinned. So the reply leaves it out (it is
not a child: nothing is dropped, nothing is created), and ``PrimaryRouted`` (so ``Ready``)
is ``False``/``ServiceNotOwned`` with who owns it and how to hand it over:
``kubectl pgfh adopt`` labels it ``controller-uid=<parent UID>``, the selector
Metacontroller claims orphans by (``generateSelector``), and Metacontroller adopts it on
its next sync; a Service another controller controls is never taken silently.

Pure, like every part (:mod:`hooks.children.base`).
"""

from __future__ import annotations

from typing import Any

from hooks.children.base import ChildGroup, Part, PartContext, PartPlan
from hooks.children.services import foreign_service, primary_services
from hooks.core import manifests
from hooks.core.conditions import CONDITION_ROUTED
from hooks.core.routing import Decision, Route
from hooks.domain.model import (
    CONTROLLER_UID_LABEL,
    POD_NAME_LABEL,
    SERVICE_KEY,
    ClusterSpec,
    Condition,
)
from hooks.domain.observed import ServiceChild
from hooks.domain.request import SyncRequest

#: Why no member is seen when the request relates no Pods at all (not even an empty group).
NO_POD_RULE = (
    "Metacontroller related no Pods to this cluster: its cached customize answer for it "
    "has no Pod rule (given while this install did not serve the cluster; it is asked "
    "again when the spec changes, or within 20 minutes)"
)


def plan(context: PartContext) -> PartPlan:
    """The primary Service(s), ``status.primary``/``service`` and ``PrimaryRouted``."""
    spec, request, route, keep = context.spec, context.request, context.route, context.keep
    primaries = primary_services(request)
    foreign = foreign_service(request, spec.service_name)
    if foreign is not None:
        return _not_owned(context, foreign, primaries)
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
        if any(m.name == leader and m.failsafe_active for m in context.members):
            # Patroni keeps a primary through a DCS outage only while every member
            # acknowledges it (failsafe_mode): routed as always, and said, since the
            # cluster cannot fail over until the DCS is back.
            message += (
                "; Patroni failsafe mode is active: the DCS is unreachable and every member "
                "acknowledged this leader (no failover is possible until the DCS is back)"
            )
    else:
        children = [keep(obj) for _, obj in sorted(primaries.items())]
        primary = observed_primary(request)
        why = route.why
        if route.decision is Decision.NO_MEMBERS and not request.pods_related:
            why = NO_POD_RULE
        message = f"{why}; {keeping_phrase(request)}"
    status: dict[str, Any] = {} if primary is None else {"primary": primary}
    status["service"] = spec.service_name
    condition = Condition(
        CONDITION_ROUTED, "True" if route.routed else "False", route.decision.value, message
    )
    return PartPlan(children, status, condition)


def related_rules(spec: ClusterSpec, uid: str | None) -> list[dict[str, Any]]:
    """The member Pods, by ``primarySelector`` (never empty: the schema requires a label),
    and the Service ``spec.serviceRef`` names, by name, whoever owns it (scoped to the
    parent's namespace by :func:`hooks.children.related_rules`)."""
    return [
        {
            "apiVersion": "v1",
            "resource": "pods",
            "labelSelector": {"matchLabels": dict(spec.primary_selector)},
        },
        {"apiVersion": "v1", "resource": "services", "names": [spec.service_name]},
    ]


def _not_owned(
    context: PartContext, foreign: ServiceChild, primaries: dict[str, ServiceChild]
) -> PartPlan:
    """``spec.serviceRef`` names a Service outside this controller: never claim it is pinned.

    The foreign Service is left out of the reply (it is not a child, so Metacontroller
    neither deletes it nor, without a create, fails on it with 409 every sync), unless it
    is being deleted: then the desired Service is asked for, and Metacontroller creates it
    once the name is free. Services we own under an old ``serviceRef`` name keep being
    moved to a confirmed leader (they are still ours and may still carry traffic).
    """
    spec, request, route, keep = context.spec, context.request, context.route, context.keep
    leader = route.leader if route.routed else None
    children = []
    for _, observed in sorted(primaries.items()):
        kept = keep(observed)
        if leader is not None:
            kept.setdefault("spec", {})["selector"] = _selector(spec, leader)
        children.append(kept)
    if foreign.deleting and leader is not None:
        children.append(desired_service(spec, request.namespace, leader))
    primary = leader if leader is not None and primaries else observed_primary(request)
    status: dict[str, Any] = {} if primary is None else {"primary": primary}
    status["service"] = spec.service_name
    condition = Condition(
        CONDITION_ROUTED,
        "False",
        Decision.SERVICE_NOT_OWNED.value,
        not_owned_message(request, foreign, route),
    )
    return PartPlan(children, status, condition)


def not_owned_message(request: SyncRequest, foreign: ServiceChild, route: Route) -> str:
    """Who owns the Service, that its selector is not pinned, and how to hand it over."""
    name = foreign.name
    finding = f"Patroni reports {route.leader} as leader" if route.routed else route.why
    owners = ", ".join(o.describe() for o in foreign.owners) or "no owner references"
    head = f"Service {name} exists but is not owned by this PostgreSQLCluster ({owners})"
    adopt = f"kubectl pgfh adopt {request.name} -n {request.namespace}"
    if foreign.deleting:
        return f"{head}: it is being deleted, and is created anew once it is gone ({finding})"
    controller = foreign.controller
    uid_label = foreign.labels.get(CONTROLLER_UID_LABEL)
    if controller is not None:
        tail = (
            f"{controller.kind} {controller.name} controls it, so it is not taken over: "
            f"stop that controller, then hand it over with `{adopt} --force` (removes that "
            "controller reference), or set spec.serviceRef.name to a new name"
        )
    elif request.uid and uid_label == request.uid:
        tail = (
            f"it is labelled {CONTROLLER_UID_LABEL}={uid_label} for adoption; Metacontroller "
            "adopts it on its next sync (if this stays, check that Metacontroller may update "
            "Services)"
        )
    else:
        tail = (
            f"hand it over with `{adopt}` (labels it {CONTROLLER_UID_LABEL}="
            f"{request.uid or '<uid>'}; Metacontroller adopts it and the selector is pinned "
            "from its next sync), or set spec.serviceRef.name to a new name"
        )
    return f"{head}: its selector is not pinned to the leader ({finding}); {tail}"


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
