"""Small builders shared by the tests: fixtures on disk, member answers, fake probers."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hooks.core import keeping
from hooks.core.outcome import SyncOutcome
from hooks.core.switchover import spread_resync
from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.domain.model import ResyncTiming
from hooks.domain.observed import Child, Pod
from hooks.domain.request import SyncRequest
from hooks.loaders.envelope import load_sync_request
from hooks.loaders.observed import load_child, load_pod, load_pods
from hooks.probe.plan import probe_targets
from hooks.shell.config import AuthSettings
from hooks.sync import reconcile
from testbed.fakes.patroni_wire import patroni_body

#: For tests of what the hook answers, not of who may ask: the app's default requires a
#: bearer token (tests/test_security_*.py covers that).
NO_AUTH = AuthSettings(mode="none")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "metacontroller"
SYNC_FIXTURES = sorted(
    p.name for p in FIXTURES.glob("*.json") if p.name != "customize-request.json"
)


def fixture(name: str) -> dict[str, Any]:
    """A Metacontroller request body recorded from v4.17.2's Go types (deep copy)."""
    return copy.deepcopy(json.loads((FIXTURES / name).read_text()))


def polled(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as an etcd/Consul-DCS cluster would send it: no Patroni role evidence.

    The recorded fixtures come from a Kubernetes-DCS cluster, whose member Pods carry
    Patroni's ``role`` label and ``status`` annotation; with both agreeing with Patroni,
    the hook asks for the long event-driven resync (hooks/core/switchover.py). A test of a
    polled cluster's resync or status strips them here (in place; returns ``body``).
    """
    for pod in body.get("related", {}).get("Pod.v1", {}).values():
        metadata = pod.get("metadata", {})
        metadata.get("labels", {}).pop("role", None)
        metadata.get("annotations", {}).pop("status", None)
    return body


def leader(name: str, timeline: int = 1) -> MemberStatus:
    """What Patroni's leader answers on /primary."""
    return MemberStatus.from_api_response(
        name, 200, patroni_body("primary", timeline=timeline, name=name)
    )


def replica(name: str, timeline: int = 1) -> MemberStatus:
    """What a streaming replica answers on /primary."""
    return MemberStatus.from_api_response(
        name, 503, patroni_body("replica", timeline=timeline, name=name)
    )


def down(name: str, reason: str = "connection refused") -> MemberStatus:
    return MemberStatus.unknown(name, reason)


class FakeProber:
    """Answers from a table; records what it was asked (so tests can prove no I/O)."""

    def __init__(self, answers: Mapping[str, MemberStatus] | None = None) -> None:
        self.answers = dict(answers or {})
        self.calls: list[list[ProbeTarget]] = []

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        self.calls.append(list(targets))
        return {
            t.pod: self.answers.get(t.pod) or MemberStatus.unknown(t.pod, "connection refused")
            for t in targets
        }


# ------------------------------------- raw objects as the loaders type them (hooks.loaders)


def loaded_pod(raw: Mapping[str, Any]) -> Pod:
    """A raw Pod as :mod:`hooks.loaders.observed` loads it (named by its own metadata)."""
    return load_pod("Pod.v1", raw["metadata"]["name"], raw)


def loaded_pods(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, Pod]:
    return load_pods("Pod.v1", raw)


def loaded_child(raw: Mapping[str, Any], group: str | None = None) -> Child:
    """A raw observed child as loaded under ``group`` (default: its own kind and apiVersion)."""
    group = group or f"{raw.get('kind')}.{raw.get('apiVersion')}"
    return load_child(group, raw["metadata"]["name"], raw)


def preserved(raw: Mapping[str, Any], group: str | None = None) -> dict[str, Any]:
    """:func:`hooks.core.keeping.preserved` of a raw observed child (see :func:`loaded_child`)."""
    return keeping.preserved(loaded_child(raw, group))


# ------------------------------------------------- the pipeline without HTTP (one copy)

#: The one "now" of the tests: a fixed clock, so resync phases and timestamps are stable.
NOW = datetime(2026, 8, 20, 10, 0, 0, tzinfo=UTC)
#: Resync periods nobody would pick as defaults (healthy 7 s, degraded 0.25 s), so an
#: assertion on ``resyncAfterSeconds`` cannot pass by coincidence.
TIMING = ResyncTiming(healthy=7.0, degraded=0.25)


def run(
    body: Mapping[str, Any],
    answers: Mapping[str, MemberStatus] | None = None,
    *,
    now: datetime = NOW,
    timing: ResyncTiming = TIMING,
) -> tuple[SyncRequest, SyncOutcome]:
    """The app's pipeline without HTTP: load, plan, fake-probe, decide.

    Only the planned targets are "answered", so a Pod the planner skips (no IP, a
    hostname) never is, as in production.
    """
    request = load_sync_request(copy.deepcopy(dict(body)))
    targets = probe_targets(request)
    probes = FakeProber(answers).probe(targets) if targets else {}
    return request, reconcile(request, probes, now=now, timing=timing)


def fed_back(body: Mapping[str, Any], outcome: SyncOutcome) -> dict[str, Any]:
    """The next request after Metacontroller wrote ``outcome``'s status."""
    following = copy.deepcopy(dict(body))
    following["parent"]["status"] = copy.deepcopy(outcome.body["status"])
    return following


# ------------------------------------------------------------ plain-dict builders
# Added for the unit tests of the decision core (tests/test_sync_*.py, test_schemas.py):
# small, literal Kubernetes objects shaped like the recorded fixtures, without the
# bulk (managedFields, container specs) that the decision never reads.

NAMESPACE = "databases"
CLUSTER = "pg-orders"
#: The members' Pod names (pg-orders-0 ...), as in the recorded requests.
P0, P1, P2, P3 = (f"{CLUSTER}-{i}" for i in range(4))
SERVICE_NAME = "pg-orders-primary"
PARENT_UID = "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"


def claims(
    name: str, role: str = "replica", state: str = "running", timeline: int = 1
) -> MemberStatus:
    """A member answering HTTP 200 on /primary with the given role and state."""
    return MemberStatus.from_api_response(
        name, 200, patroni_body(role, state, timeline=timeline, name=name)
    )


def healthy(
    leading: str = P0, timeline: int = 1, names: Sequence[str] = (P0, P1, P2)
) -> dict[str, MemberStatus]:
    """The leader ``leading`` and streaming replicas, as each answers on /primary."""
    return {n: leader(n, timeline) if n == leading else replica(n, timeline) for n in names}


def spread(period: float, now: datetime, body: Mapping[str, Any] | None = None) -> float:
    """The phase-spread healthy resync the hook answers at ``now`` for ``body``'s parent.

    ``body``: a sync request or a parent (default: :func:`sync_body`'s parent); the key is
    its ``metadata.uid``, else ``namespace/name``, as in :mod:`hooks.sync`.
    """
    parent = (body or {}).get("parent", body) or {}
    meta = parent.get("metadata", {"uid": PARENT_UID})
    key = meta.get("uid") or f"{meta['namespace']}/{meta['name']}"
    return spread_resync(period, key, now.timestamp())


def without_resync(reply: Mapping[str, Any]) -> dict[str, Any]:
    """A reply without ``resyncAfterSeconds``: the one part of it that moves with the clock."""
    return {k: v for k, v in reply.items() if k != "resyncAfterSeconds"}


POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
SELECTOR = {"application": "patroni", "cluster-name": CLUSTER}


def seed_spec(**overrides: Any) -> dict[str, Any]:
    """The three spec fields the recorded fixtures use, plus ``overrides``."""
    spec: dict[str, Any] = {
        "primarySelector": dict(SELECTOR),
        "serviceRef": {"name": SERVICE_NAME},
        "healthCheckPath": "/primary",
    }
    spec.update(copy.deepcopy(overrides))
    return spec


def member_ip(name: str) -> str:
    """A stable, distinct pod IP per StatefulSet ordinal: pg-orders-N → 10.244.N.10."""
    return f"10.244.{int(name.rsplit('-', 1)[1])}.10"


def make_pod(
    name: str,
    ip: object = "auto",
    *,
    labels: Mapping[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A related Patroni Pod; ``ip=None`` leaves ``status.podIP`` out entirely."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "uid": f"uid-{name}",
        "resourceVersion": "1000",
        "labels": dict(labels)
        if labels is not None
        else {**SELECTOR, POD_NAME_LABEL: name, "role": "replica"},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-08-20T09:47:22Z"
        metadata["deletionGracePeriodSeconds"] = 30
    status: dict[str, Any] = {"phase": "Running"}
    if ip is not None:
        status["podIP"] = member_ip(name) if ip == "auto" else ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": status}


def service_selector(pod: str) -> dict[str, str]:
    """The selector the hook pins on ``pod`` for the default spec."""
    return {**SELECTOR, POD_NAME_LABEL: pod}


def make_service(
    name: str = SERVICE_NAME,
    pod: str | None = "pg-orders-0",
    *,
    selector: Mapping[str, str] | None = None,
    last_applied: bool = True,
) -> dict[str, Any]:
    """An observed Service as the informer delivers it after Metacontroller created it.

    ``selector`` overrides the live ``spec.selector`` (a hand edit); the last-applied
    annotation still records what the hook asked for (pinned on ``pod``).
    """
    applied_selector = service_selector(pod) if pod else dict(SELECTOR)
    labels = {"app.kubernetes.io/managed-by": "pg-failover-hook", "controller-uid": PARENT_UID}
    applied = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "labels": dict(labels),
            "name": name,
            "namespace": NAMESPACE,
        },
        "spec": {
            "ports": [{"name": "postgresql", "port": 5432, "protocol": "TCP", "targetPort": 5432}],
            "selector": applied_selector,
            "type": "ClusterIP",
        },
    }
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "uid": f"uid-svc-{name}",
        "resourceVersion": "2000",
        "creationTimestamp": "2026-08-20T09:12:04Z",
        "labels": dict(labels),
        "ownerReferences": [
            {
                "apiVersion": "adg.io/v1alpha1",
                "kind": "PostgreSQLCluster",
                "name": CLUSTER,
                "uid": PARENT_UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": [{"manager": "metacontroller", "operation": "Update"}],
    }
    if last_applied:
        metadata["annotations"] = {
            "metacontroller.k8s.io/last-applied-configuration": json.dumps(
                applied, separators=(",", ":"), sort_keys=True
            )
        }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "10.96.143.27",
            "clusterIPs": ["10.96.143.27"],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "postgresql", "port": 5432, "protocol": "TCP", "targetPort": 5432}],
            "selector": dict(selector) if selector is not None else applied_selector,
            "sessionAffinity": "None",
            "type": "ClusterIP",
        },
        "status": {"loadBalancer": {}},
    }


#: Pass as ``sync_body(spec=OMIT)`` to leave ``parent.spec`` out entirely.
OMIT: Any = object()
_SEED: Any = object()


def sync_body(
    *,
    spec: object = _SEED,
    pods: Sequence[Mapping[str, Any]] | None = None,
    services: Sequence[Mapping[str, Any]] = (),
    status: Mapping[str, Any] | None = None,
    generation: int = 1,
    finalizing: bool = False,
    extra_children: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A v1 sync request body; by default three running members and no Service."""
    if pods is None:
        pods = [make_pod(f"{CLUSTER}-{i}") for i in range(3)]
    parent: dict[str, Any] = {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": NAMESPACE,
            "uid": PARENT_UID,
            "generation": generation,
            "resourceVersion": "3000",
        },
    }
    if spec is _SEED:
        parent["spec"] = seed_spec()
    elif spec is not OMIT:
        parent["spec"] = copy.deepcopy(spec)
    if status is not None:
        parent["status"] = copy.deepcopy(dict(status))
    children: dict[str, Any] = {
        "Service.v1": {s["metadata"]["name"]: copy.deepcopy(dict(s)) for s in services}
    }
    for group, objects in (extra_children or {}).items():
        children[group] = copy.deepcopy(dict(objects))
    return {
        "controller": {
            "apiVersion": "metacontroller.k8s.io/v1alpha1",
            "kind": "CompositeController",
        },
        "parent": parent,
        "children": children,
        "related": {"Pod.v1": {p["metadata"]["name"]: copy.deepcopy(dict(p)) for p in pods}},
        "finalizing": finalizing,
    }


def _without(key: str) -> dict[str, Any]:
    spec = seed_spec()
    del spec[key]
    return spec


def _target_port(value: object) -> dict[str, Any]:
    return seed_spec(service={"ports": [{"name": "pg", "port": 5432, "targetPort": value}]})


def _reserved(name: str) -> dict[str, Any]:
    return seed_spec(serviceRef={"name": name})


#: Invalid specs, each with the dotted field a SpecProblem must name:
#: ``(test id, parent.spec, field)``. ``OMIT`` means "no spec key at all".
INVALID_SPECS: list[tuple[str, object, str]] = [
    # primarySelector
    ("primarySelector missing", _without("primarySelector"), "spec.primarySelector"),
    ("primarySelector empty", seed_spec(primarySelector={}), "spec.primarySelector"),
    ("primarySelector a list", seed_spec(primarySelector=["a=b"]), "spec.primarySelector"),
    ("label key with a space", seed_spec(primarySelector={"bad key": "x"}), "spec.primarySelector"),
    ("label key starting -", seed_spec(primarySelector={"-app": "x"}), "spec.primarySelector"),
    ("label key empty prefix", seed_spec(primarySelector={"/app": "x"}), "spec.primarySelector"),
    ("label key empty", seed_spec(primarySelector={"": "x"}), "spec.primarySelector"),
    (
        "label key upper prefix",
        seed_spec(primarySelector={"A.io/app": "x"}),
        "spec.primarySelector",
    ),
    ("label key two slashes", seed_spec(primarySelector={"a/b/c": "x"}), "spec.primarySelector"),
    ("label key too long", seed_spec(primarySelector={"k" * 64: "x"}), "spec.primarySelector"),
    ("label value spaced", seed_spec(primarySelector={"app": "a b"}), "spec.primarySelector"),
    ("label value too long", seed_spec(primarySelector={"app": "v" * 64}), "spec.primarySelector"),
    ("label value ends -", seed_spec(primarySelector={"app": "x-"}), "spec.primarySelector"),
    (
        "label value a number",
        seed_spec(primarySelector={"app": 5}),
        "spec.primarySelector.app.value",
    ),
    # serviceRef
    ("serviceRef missing", _without("serviceRef"), "spec.serviceRef"),
    ("serviceRef a string", seed_spec(serviceRef="pg-orders-primary"), "spec.serviceRef"),
    ("serviceRef without name", seed_spec(serviceRef={}), "spec.serviceRef.name"),
    ("name upper case", seed_spec(serviceRef={"name": "Pg-Primary"}), "spec.serviceRef.name"),
    ("name starts with digit", seed_spec(serviceRef={"name": "1pg"}), "spec.serviceRef.name"),
    ("name underscore", seed_spec(serviceRef={"name": "pg_primary"}), "spec.serviceRef.name"),
    ("name dotted", seed_spec(serviceRef={"name": "pg.primary"}), "spec.serviceRef.name"),
    ("name ends with -", seed_spec(serviceRef={"name": "pg-"}), "spec.serviceRef.name"),
    ("name empty", seed_spec(serviceRef={"name": ""}), "spec.serviceRef.name"),
    ("name 64 chars", seed_spec(serviceRef={"name": "p" * 64}), "spec.serviceRef.name"),
    ("name a number", seed_spec(serviceRef={"name": 5}), "spec.serviceRef.name"),
    ("name is <scope>", _reserved(CLUSTER), "spec.serviceRef"),
    ("name is <scope>-config", _reserved(f"{CLUSTER}-config"), "spec.serviceRef"),
    ("name is <scope>-leader", _reserved(f"{CLUSTER}-leader"), "spec.serviceRef"),
    ("name is <scope>-sync", _reserved(f"{CLUSTER}-sync"), "spec.serviceRef"),
    ("name is <scope>-failover", _reserved(f"{CLUSTER}-failover"), "spec.serviceRef"),
    # healthCheckPath
    ("path /replica", seed_spec(healthCheckPath="/replica"), "spec.healthCheckPath"),
    ("path /primry", seed_spec(healthCheckPath="/primry"), "spec.healthCheckPath"),
    ("path /health", seed_spec(healthCheckPath="/health"), "spec.healthCheckPath"),
    ("path /readiness", seed_spec(healthCheckPath="/readiness"), "spec.healthCheckPath"),
    ("path without slash", seed_spec(healthCheckPath="primary"), "spec.healthCheckPath"),
    ("path with query", seed_spec(healthCheckPath="/primary?lag=1MB"), "spec.healthCheckPath"),
    ("path empty", seed_spec(healthCheckPath=""), "spec.healthCheckPath"),
    ("path null", seed_spec(healthCheckPath=None), "spec.healthCheckPath"),
    # patroni
    ("patroni a list", seed_spec(patroni=[]), "spec.patroni"),
    ("port 0", seed_spec(patroni={"port": 0}), "spec.patroni.port"),
    ("port 70000", seed_spec(patroni={"port": 70000}), "spec.patroni.port"),
    ("port negative", seed_spec(patroni={"port": -1}), "spec.patroni.port"),
    ("port a string", seed_spec(patroni={"port": "8008"}), "spec.patroni.port"),
    ("port true", seed_spec(patroni={"port": True}), "spec.patroni.port"),
    ("port a float", seed_spec(patroni={"port": 8008.5}), "spec.patroni.port"),
    ("scheme ftp", seed_spec(patroni={"scheme": "ftp"}), "spec.patroni.scheme"),
    (
        "serverName with http",
        seed_spec(patroni={"tls": {"serverName": "pg-orders.databases.svc"}}),
        "spec.patroni.tls",
    ),
    (
        "serverName an IP",
        seed_spec(patroni={"scheme": "https", "tls": {"serverName": "10.244.1.17"}}),
        "spec.patroni.tls.serverName",
    ),
    (
        "serverName upper case",
        seed_spec(patroni={"scheme": "https", "tls": {"serverName": "PG.example"}}),
        "spec.patroni.tls.serverName",
    ),
    (
        "serverName with a scheme",
        seed_spec(patroni={"scheme": "https", "tls": {"serverName": "https://pg.example"}}),
        "spec.patroni.tls.serverName",
    ),
    ("tls a string", seed_spec(patroni={"scheme": "https", "tls": "on"}), "spec.patroni.tls"),
    ("scheme HTTP", seed_spec(patroni={"scheme": "HTTP"}), "spec.patroni.scheme"),
    (
        "connect timeout 0",
        seed_spec(patroni={"connectTimeoutSeconds": 0}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "connect timeout tiny",
        seed_spec(patroni={"connectTimeoutSeconds": 0.01}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "connect timeout 5.5",
        seed_spec(patroni={"connectTimeoutSeconds": 5.5}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "connect timeout -1",
        seed_spec(patroni={"connectTimeoutSeconds": -1}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "connect timeout NaN",
        seed_spec(patroni={"connectTimeoutSeconds": float("nan")}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "connect timeout inf",
        seed_spec(patroni={"connectTimeoutSeconds": float("inf")}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "connect timeout word",
        seed_spec(patroni={"connectTimeoutSeconds": "fast"}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "connect timeout true",
        seed_spec(patroni={"connectTimeoutSeconds": True}),
        "spec.patroni.connectTimeoutSeconds",
    ),
    (
        "read timeout 0",
        seed_spec(patroni={"readTimeoutSeconds": 0}),
        "spec.patroni.readTimeoutSeconds",
    ),
    (
        "read timeout 60",
        seed_spec(patroni={"readTimeoutSeconds": 60}),
        "spec.patroni.readTimeoutSeconds",
    ),
    (
        "read timeout NaN",
        seed_spec(patroni={"readTimeoutSeconds": float("nan")}),
        "spec.patroni.readTimeoutSeconds",
    ),
    # service
    ("type ExternalName", seed_spec(service={"type": "ExternalName"}), "spec.service.type"),
    ("no ports", seed_spec(service={"ports": []}), "spec.service.ports"),
    ("ports an object", seed_spec(service={"ports": {"name": "pg"}}), "spec.service.ports"),
    (
        "duplicate port names",
        seed_spec(service={"ports": [{"name": "pg", "port": 5432}, {"name": "pg", "port": 5433}]}),
        "spec.service.ports",
    ),
    (
        "duplicate port numbers",
        seed_spec(service={"ports": [{"name": "pg", "port": 5432}, {"name": "pg2", "port": 5432}]}),
        "spec.service.ports",
    ),
    (
        "port without name",
        seed_spec(service={"ports": [{"port": 5432}]}),
        "spec.service.ports.0.name",
    ),
    (
        "port name upper",
        seed_spec(service={"ports": [{"name": "PG", "port": 5432}]}),
        "spec.service.ports.0.name",
    ),
    (
        "service port 0",
        seed_spec(service={"ports": [{"name": "pg", "port": 0}]}),
        "spec.service.ports.0.port",
    ),
    (
        "protocol UDP",
        seed_spec(service={"ports": [{"name": "pg", "port": 5432, "protocol": "UDP"}]}),
        "spec.service.ports.0.protocol",
    ),
    ("targetPort 0", _target_port(0), "spec.service.ports.0.targetPort"),
    ("targetPort 70000", _target_port(70000), "spec.service.ports.0.targetPort"),
    ("targetPort true", _target_port(True), "spec.service.ports.0.targetPort"),
    ("targetPort a float", _target_port(5432.5), "spec.service.ports.0.targetPort"),
    ("targetPort a list", _target_port([5432]), "spec.service.ports.0.targetPort"),
    ("targetPort Bad_Name", _target_port("Bad_Name"), "spec.service.ports.0.targetPort"),
    ("targetPort 16 chars", _target_port("p" * 16), "spec.service.ports.0.targetPort"),
    ("targetPort empty", _target_port(""), "spec.service.ports.0.targetPort"),
    ("targetPort starts -", _target_port("-pg"), "spec.service.ports.0.targetPort"),
    ("targetPort digits string", _target_port("5432"), "spec.service.ports.0.targetPort"),
    ("targetPort double -", _target_port("pg--sql"), "spec.service.ports.0.targetPort"),
    ("service label key", seed_spec(service={"labels": {"bad key": "x"}}), "spec.service"),
    ("service label value", seed_spec(service={"labels": {"app": "a b"}}), "spec.service"),
    ("annotation key", seed_spec(service={"annotations": {"bad key": "x"}}), "spec.service"),
    # spec itself
    ("spec missing", OMIT, "spec"),
    ("spec null", None, "spec"),
    ("spec a list", [seed_spec()], "spec"),
    ("spec a string", "primarySelector: x", "spec"),
    ("spec a number", 5, "spec"),
]


def many_pods(count: int) -> dict[str, Any]:
    """The recorded request with ``count`` realistic Pods (clones of the recorded ones)."""
    body = fixture("sync-service-selects-old-leader.json")
    recorded = list(body["related"]["Pod.v1"].values())
    pods = {}
    for index in range(count):
        pod = copy.deepcopy(recorded[index % len(recorded)]) if index >= 3 else recorded[index]
        name = f"pg-orders-{index}"
        pod["metadata"]["name"] = name
        pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = name
        pod["status"]["podIP"] = f"10.244.{index // 250}.{index % 250 + 1}"
        pods[name] = pod
    body["related"]["Pod.v1"] = pods
    return body


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, code ticks, emphasis stars and link
    targets dropped, other punctuation but '-' and '_' dropped, spaces to '-'
    (``(`client_downtime.py`)`` → ``client_downtimepy``: GitHub keeps the underscore)."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``check`` every 0.2 s until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")
