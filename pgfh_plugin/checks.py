"""``kubectl pgfh check``: what an operator would verify by hand, as pure functions.

Each function takes objects as the Kubernetes API returns them and answers :class:`Check`
values; the command line reads the objects (``pgfh_plugin.kube``) and prints the results.
The checks, and why each matters:

- **The primary Service selects exactly the pod the status names**, as the API server applies
  the selector (the Pods listed with it), and **its EndpointSlice holds that pod's IP, ready**:
  the status is what the hook answered; the selector and the slice are what traffic follows
  (an endpoint listed ``ready: false``, a leader whose readiness probe fails, gets none).
- **The CompositeController declares every child type a spec needs**, with ``InPlace``
  updates (the types of the hook's registered parts, :func:`hooks.children.child_resources`):
  Services always, EndpointSlices for ``spec.replicaService``, CronJobs for ``spec.backup``.
  An undeclared type is never observed by Metacontroller (the hook refuses to emit it), and
  without ``InPlace`` an existing child is never updated, so a failover would
  not move the Service.
- **The hook's token Secret is non-empty**: the CompositeController's ``endpointConfigs``
  name it; an empty key means Metacontroller sends no usable token and the hook answers 401
  to every call.
- **Metacontroller runs with leader election** (``--leader-election`` in its container's
  arguments): without it, two replicas would both run every controller and fight.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hooks.children import child_resources
from pgfh_plugin.kube import GROUP, PLURAL
from pgfh_plugin.report import as_mapping

#: Values Go's strconv.ParseBool reads as true (Metacontroller's flags are Go flags).
_GO_TRUE = ("1", "t", "T", "true", "TRUE", "True")


@dataclass(frozen=True)
class Check:
    """One verified fact: what was checked, whether it holds, and a plain reason."""

    subject: str
    ok: bool
    detail: str

    def as_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "ok": self.ok, "detail": self.detail}


# ------------------------------------------------------------------ per cluster


def routing(
    cluster: Mapping[str, Any],
    service: Mapping[str, Any] | None,
    selected: Sequence[Mapping[str, Any]] | None,
    slices: Sequence[Mapping[str, Any]] | None,
) -> list[Check]:
    """The primary Service of one cluster: named pod, selector, EndpointSlice.

    ``selected`` are the Pods the Service's selector matches (listed with that selector),
    ``slices`` the Service's EndpointSlices; ``None`` when they could not be read (the caller
    then adds its own failed check saying why).
    """
    name = _name(cluster)
    spec = as_mapping(cluster.get("spec"))
    status = as_mapping(cluster.get("status"))
    service_name = as_mapping(spec.get("serviceRef")).get("name") or "?"
    primary = status.get("primary")
    ready = next(
        (
            c
            for c in status.get("conditions") or []
            if isinstance(c, dict) and c.get("type") == "Ready"
        ),
        None,
    )
    checks: list[Check] = []
    if ready is None:
        checks.append(Check(name, False, "the status has no Ready condition: no sync yet?"))
    elif ready.get("status") != "True":
        checks.append(
            Check(
                name,
                False,
                f"Ready is {ready.get('status')} ({ready.get('reason')}): {ready.get('message')}",
            )
        )
    else:
        checks.append(Check(name, True, f"Ready ({ready.get('reason')})"))
    if not isinstance(primary, str) or not primary:
        checks.append(Check(name, False, "the status names no primary pod"))
        return checks

    subject = f"{name}: Service {service_name}"
    if service is None:
        checks.append(Check(subject, False, "the primary Service does not exist"))
        return checks
    selector = as_mapping(as_mapping(service.get("spec")).get("selector"))
    if not selector:
        checks.append(Check(subject, False, "the Service has no selector: it selects no pod"))
        return checks
    pod_ip: str | None = None
    selects_primary = False
    if selected is not None:
        names = sorted(str(as_mapping(p.get("metadata")).get("name")) for p in selected)
        if names == [primary]:
            checks.append(Check(subject, True, f"selects exactly {primary}, the primary"))
            selects_primary = True
            pod_ip = as_mapping(selected[0].get("status")).get("podIP") or None
        elif not names:
            checks.append(
                Check(subject, False, f"selects no pod; the status names {primary} as primary")
            )
        else:
            checks.append(
                Check(
                    subject,
                    False,
                    f"selects {', '.join(names)}; the status names {primary} as primary",
                )
            )
    if slices is None or not selects_primary:
        return checks
    addresses = sorted(_addresses(slices))
    if pod_ip is None:
        checks.append(Check(subject, False, f"the primary {primary} has no Pod IP"))
        return checks
    if not slices:
        checks.append(Check(subject, False, "the Service has no EndpointSlice"))
    elif addresses == [pod_ip] and pod_ip in _not_ready(slices):
        checks.append(
            Check(
                subject,
                False,
                f"its EndpointSlice lists {primary}'s IP {pod_ip} as not ready: the Service "
                "sends it no traffic (its readiness probe fails)",
            )
        )
    elif addresses == [pod_ip]:
        checks.append(Check(subject, True, f"its EndpointSlice holds {pod_ip}, {primary}'s IP"))
    elif pod_ip in addresses:
        others = ", ".join(a for a in addresses if a != pod_ip)
        checks.append(
            Check(subject, False, f"its EndpointSlices hold {primary}'s IP {pod_ip} and {others}")
        )
    else:
        held = ", ".join(addresses) or "no address"
        checks.append(
            Check(
                subject,
                False,
                f"its EndpointSlices hold {held}, not {primary}'s IP {pod_ip}",
            )
        )
    return checks


def _not_ready(slices: Iterable[Mapping[str, Any]]) -> set[str]:
    """Addresses an endpoint lists with ``conditions.ready: false``: kube-proxy routes no
    traffic to them. An absent ``ready`` means ready (discovery/v1 ``EndpointConditions``)."""
    found: set[str] = set()
    for s in slices:
        for endpoint in s.get("endpoints") or []:
            if (
                isinstance(endpoint, dict)
                and as_mapping(endpoint.get("conditions")).get("ready") is False
            ):
                found.update(a for a in endpoint.get("addresses") or [] if isinstance(a, str))
    return found


def _addresses(slices: Iterable[Mapping[str, Any]]) -> set[str]:
    found: set[str] = set()
    for s in slices:
        for endpoint in s.get("endpoints") or []:
            if isinstance(endpoint, dict):
                found.update(a for a in endpoint.get("addresses") or [] if isinstance(a, str))
    return found


# ------------------------------------------------------------------ installation


def controller(
    controllers: Sequence[Mapping[str, Any]], clusters: Sequence[Mapping[str, Any]]
) -> tuple[list[Check], list[Mapping[str, Any]]]:
    """The CompositeController(s) for PostgreSQLClusters, and whether they declare the children.

    Returns the checks and the matching controllers (their ``endpointConfigs`` name the
    token Secret).
    """
    ours = [c for c in controllers if _parent_is_ours(c)]
    if not ours:
        return [
            Check(
                "CompositeController",
                False,
                f"no CompositeController has parentResource {GROUP} {PLURAL}: Metacontroller "
                "never calls the hook (kubectl apply -k deploy/ installs it)",
            )
        ], []
    # The child types of the hook's registered parts, by the spec fields that need them.
    needed = []
    for kind in child_resources():
        fields = kind.needed_by
        if not fields:
            needed.append(("", kind.api_version, kind.resource))
            continue
        users = [
            _name(c) for c in clusters if any(as_mapping(c.get("spec")).get(f) for f in fields)
        ]
        if users:
            why = f"spec.{' or spec.'.join(fields)} of {', '.join(users)}"
            needed.append((why, kind.api_version, kind.resource))
    checks: list[Check] = []
    for cc in ours:
        subject = f"CompositeController {_name(cc)}"
        children = {
            (str(child.get("apiVersion")), str(child.get("resource"))): child
            for child in as_mapping(cc.get("spec")).get("childResources") or []
            if isinstance(child, dict)
        }
        for why, api_version, resource in needed:
            child = children.get((api_version, resource))
            need = f" (needed by {why})" if why else ""
            if child is None:
                checks.append(
                    Check(subject, False, f"does not declare child {api_version} {resource}{need}")
                )
                continue
            method = as_mapping(child.get("updateStrategy")).get("method") or "OnDelete"
            if method != "InPlace":
                checks.append(
                    Check(
                        subject,
                        False,
                        f"child {api_version} {resource} has updateStrategy {method}, not "
                        "InPlace: Metacontroller would not update it in place",
                    )
                )
            else:
                checks.append(
                    Check(subject, True, f"declares child {api_version} {resource} (InPlace)")
                )
    return checks, ours


def token_refs(controllers: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """The (namespace, name, key) of every Secret an ``endpointConfigs`` entry names."""
    refs: list[tuple[str, str, str]] = []
    for cc in controllers:
        for entry in as_mapping(cc.get("spec")).get("endpointConfigs") or []:
            ref = as_mapping(as_mapping(as_mapping(entry).get("authorization")).get("secretRef"))
            if ref.get("name"):
                item = (str(ref.get("namespace") or ""), str(ref["name"]), str(ref.get("key")))
                if item not in refs:
                    refs.append(item)
    return refs


def no_token_ref(controllers: Iterable[Mapping[str, Any]]) -> Check:
    names = ", ".join(_name(c) for c in controllers)
    return Check(
        f"CompositeController {names}",
        False,
        "has no endpointConfigs authorization secretRef: Metacontroller sends no token and the "
        "hook refuses every call (see docs/security.md)",
    )


def token(ref: tuple[str, str, str], secret: Mapping[str, Any] | None) -> Check:
    """The token Secret holds a non-blank value under the key Metacontroller reads."""
    namespace, name, key = ref
    subject = f"Secret {namespace}/{name}"
    if secret is None:
        return Check(subject, False, "does not exist: Metacontroller has no token to send")
    raw = as_mapping(secret.get("data")).get(key)
    if raw is None:
        return Check(subject, False, f"has no key {key!r}: Metacontroller has no token to send")
    try:
        value = base64.b64decode(str(raw), validate=True)
    except (binascii.Error, ValueError):
        return Check(subject, False, f"key {key!r} is not valid base64")
    if not value.strip():
        return Check(
            subject,
            False,
            f"key {key!r} is empty: the hook refuses every call (set a token, docs/security.md)",
        )
    return Check(subject, True, f"key {key!r} holds a token ({len(value)} bytes)")


def leader_election(workloads: Sequence[Mapping[str, Any]], namespace: str) -> list[Check]:
    """Every Metacontroller Deployment/StatefulSet in ``namespace`` runs ``--leader-election``."""
    found = [w for w in workloads if _runs_metacontroller(w)]
    if not found:
        return [
            Check(
                "Metacontroller",
                False,
                f"no Deployment or StatefulSet running a metacontroller image in namespace "
                f"{namespace} (pass --metacontroller-namespace)",
            )
        ]
    checks = []
    for w in found:
        subject = f"Metacontroller {w.get('kind', 'workload')} {_name(w)}"
        replicas = as_mapping(w.get("spec")).get("replicas", 1)
        if _leader_election_on(w):
            checks.append(
                Check(subject, True, f"runs with --leader-election ({replicas} replica(s))")
            )
        else:
            checks.append(
                Check(
                    subject,
                    False,
                    "runs without --leader-election: with more than one replica every replica "
                    "runs every controller (deploy/metacontroller-values.yaml turns it on)",
                )
            )
    return checks


def _containers(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    pod_spec = as_mapping(as_mapping(as_mapping(workload.get("spec")).get("template")).get("spec"))
    return [c for c in pod_spec.get("containers") or [] if isinstance(c, dict)]


def _runs_metacontroller(workload: Mapping[str, Any]) -> bool:
    return any("metacontroller" in str(c.get("image", "")) for c in _containers(workload))


def _leader_election_on(workload: Mapping[str, Any]) -> bool:
    """Go's flag parsing: ``-flag``/``--flag`` alone, or ``=value`` that ParseBool reads true."""
    on = False
    for c in _containers(workload):
        if "metacontroller" not in str(c.get("image", "")):
            continue
        for arg in [*(c.get("command") or []), *(c.get("args") or [])]:
            flag, _, value = str(arg).lstrip("-").partition("=")
            if str(arg).startswith("-") and flag == "leader-election":
                on = value in _GO_TRUE if "=" in str(arg) else True
    return on


def _parent_is_ours(cc: Mapping[str, Any]) -> bool:
    parent = as_mapping(as_mapping(cc.get("spec")).get("parentResource"))
    return parent.get("apiVersion") == f"{GROUP}/v1alpha1" and parent.get("resource") == PLURAL


def _name(obj: Mapping[str, Any]) -> str:
    meta = as_mapping(obj.get("metadata"))
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))
