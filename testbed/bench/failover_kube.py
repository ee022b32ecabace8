"""Failovers on the real control plane, timed where clients see them: the EndpointSlice.

``testbed.bench.failover_patroni`` ends at the hook's reply, applied by the stand-in to a model
of the Service. Clients follow the EndpointSlice that the real endpointslice controller writes one
hop later, so this benchmark runs the same failovers on the real control plane
(kube-apiserver, kube-controller-manager, etcd; the rig of ``tests/test_kube_e2e.py``:
:func:`testbed.metacontroller.kube_rig.kube_rig`) and times, on one monotonic clock, for each
failover:

* **trigger**: the SIGKILL, the SIGTERM (graceful stop) or the ``POST /switchover``;
* **promotion**: Patroni's first 200 with ``role: primary`` on ``GET /primary`` of the new
  leader (polled every 10 ms on every other member, :meth:`PatroniCluster.watch_leader`);
* **Service write**: the watch event of the primary Service carrying a selector on the new
  leader (the hook's reply, applied by Metacontroller: what the endpointslice controller
  reacts to);
* **slice**: the watch event after which the primary Service's EndpointSlices (label
  ``kubernetes.io/service-name``) list exactly the new leader's Pod IP as ready.

Every time comes from a watch on the API server or from Patroni, none from Metacontroller's
side, so the benchmark runs the same on the stand-in (:mod:`testbed.metacontroller.kube`) and on a
real
Metacontroller (``PGFH_METACONTROLLER_BINARY``,
:mod:`testbed.metacontroller.metacontroller_binary`), whose
calls to the hook leave no record here. Hops: promotion→Service write (the hook's probe round
and reply plus Metacontroller applying it; ``testbed.bench.failover_patroni`` times the reply
alone), Service write→slice (the endpointslice controller and the readiness the kubelet stand-in
reports), promotion→slice (what clients wait for after Patroni is done) and trigger→slice.
Hook calls and failed calls are counted from the hook's own ``/metrics``. Over the whole
run, from the watches: never two Pods ready at once in the primary slice, the Service never
deleted, its selector never empty. The ground-truth sampler and the writer of
``testbed.bench.failover_patroni`` run beside it, following the *slice* (a write goes to the
Pod IP the slice lists ready, as a client through kube-proxy would).

DCS modes (``--dcs``, comma-separated, each on a cluster of its own in a namespace of its own):

* ``etcd``: the devcluster's default (members 127.0.0.2-4). A switchover changes no Pod:
  only the healthy resync (``PGFH_RESYNC_HEALTHY_SECONDS``, 1 s) brings the sync after it;
* ``endpoints`` / ``configmaps``: Patroni 4.1 on its Kubernetes DCS against this very API
  server (:mod:`testbed.patroni.kubernetes_dcs`, members 127.0.0.12-14), the leader lock in
  Endpoints or ConfigMaps. Patroni labels its own Pods (``role``, ``status``), so the hook
  goes event-driven (``status.switchoverDetection: RoleLabel``, a 30 s healthy resync) and a
  switchover is followed through the Pod change, not the timer.

Usage (real Patroni: take the machine's lock)::

    flock /tmp/pgfh-realcluster.lock .venv/bin/python -m testbed.bench.failover_kube --failovers 21
    flock /tmp/pgfh-realcluster.lock .venv/bin/python -m testbed.bench.failover_kube \\
        --dcs endpoints,configmaps --failovers 6
    ... --quick        # one kill, one graceful stop, one switchover per DCS mode
    PGFH_METACONTROLLER_BINARY=/path/to/metacontroller ...   # a real Metacontroller

Figures are printed, never asserted; the exit status is 1 only if an invariant broke.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
from prometheus_client.parser import text_string_to_metric_families

from hooks.core.switchover import spread_resync
from hooks.domain.model import DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS, ResyncTiming
from hooks.shell.config import HookSettings
from testbed.bench.failover_patroni import KINDS, Sampler, Writer, percentile
from testbed.kubernetes import ControlPlane, start_control_plane
from testbed.kubernetes.accounts import metacontroller_kubeconfig
from testbed.kubernetes.podnet import ensure_pod_network, pod_ip
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import CLUSTER, SERVICE, rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig, SliceWatch, kube_rig
from testbed.metacontroller.loop import POD_NAME_LABEL
from testbed.metacontroller.metacontroller_binary import ENV_BINARY
from testbed.metacontroller.reflector import Reflector
from testbed.patroni import PatroniCluster
from testbed.patroni.kubernetes_dcs import KubernetesDCS, create_member_pods, grant_patroni_rights

DCS_MODES = ("etcd", "endpoints", "configmaps")
#: The Kubernetes-DCS clusters' block (tests/test_patroni_kubernetes_dcs.py): not 127.0.0.2-4.
KUBERNETES_FIRST_IP = 12
#: How long one failover may take end to end (a kill waits for the 20 s TTL).
FAILOVER_TIMEOUT = 90.0
#: After the new leader is promoted, how long the slice may take to list it (a poll miss).
SLICE_TIMEOUT = 30.0
#: How far apart two watches (each in its own thread) may report causally ordered events.
WATCH_SLACK = 0.25
#: The side-by-side Service with ``publishNotReadyAddresses`` (not one of Patroni's names).
MIRROR_SERVICE = "pg-orders-primary-pnr"
#: The side-by-side Service without a selector, its EndpointSlice written directly.
DIRECT_SERVICE = "pg-orders-primary-direct"
#: The hops of the main table: ``(label, seconds of a failover)``.
HOPS: Sequence[tuple[str, Callable[[KubeFailover], float]]] = (
    ("trigger→promotion (Patroni)", lambda f: f.promotion - f.trigger),
    ("promotion→Service write (hook + Metacontroller)", lambda f: f.service - f.promotion),
    ("Service write→slice", lambda f: f.slice - f.service),
    ("promotion→slice", lambda f: f.slice - f.promotion),
    ("trigger→slice", lambda f: f.slice - f.trigger),
)
#: The readiness table: what the endpointslice hop waits for, and the same hop for a Service
#: with ``publishNotReadyAddresses: true`` (:class:`NotReadyMirror`), side by side.
READINESS_HOPS: Sequence[tuple[str, Callable[[KubeFailover], float]]] = (
    ("Service write→slice", lambda f: f.slice - f.service),
    ("of it, waiting for the new leader's Pod Ready", lambda f: f.readiness_wait),
    ("Service write→slice, publishNotReadyAddresses", lambda f: f.pnr_hop),
    ("promotion→slice, publishNotReadyAddresses", lambda f: f.service - f.promotion + f.pnr_hop),
    ("Service write→slice, no selector, slice written directly", lambda f: f.direct_hop),
    (
        "promotion→slice, no selector, slice written",
        lambda f: f.service - f.promotion + f.direct_hop,
    ),
)
T = TypeVar("T")


@dataclass
class KubeFailover:
    """One failover: its times (``time.monotonic()``) and what the hook said before it."""

    dcs: str
    kind: str
    old: str
    new: str
    trigger: float
    promotion: float
    service: float
    slice: float
    #: ``status.switchoverDetection`` when it was triggered, and the healthy resync period
    #: that goes with it (the hook's settings: :func:`resync_period`).
    detection: str | None = None
    resync_period: float | None = None
    #: When the cluster's next scheduled resync was due after the trigger (the hook's
    #: phase-spread slot, :func:`next_slot`): a slice moved before it came from an event.
    resync_due: float | None = None
    #: Ground truth in [trigger, slice moved]: no leader at all; a leader, the slice elsewhere.
    no_leader: float = 0.0
    misrouted: float = 0.0
    #: When the new leader's Pod turned Ready after the trigger (``None``: it stayed Ready).
    #: A replica that stops streaming turns NotReady (Patroni's /readiness), and the kubelet
    #: probes once a period: the slice waits for it.
    new_ready: float | None = None
    #: The mirror with ``publishNotReadyAddresses``: its selector written, its slice moved.
    pnr_started: float = 0.0
    pnr_slice: float = 0.0
    #: The selector-less Service whose EndpointSlice is written directly: likewise.
    direct_started: float = 0.0
    direct_slice: float = 0.0

    @property
    def readiness_wait(self) -> float:
        """How long the slice waited after the Service write for the new Pod to be Ready."""
        if self.new_ready is None or self.new_ready < self.trigger:
            return 0.0
        return max(0.0, min(self.new_ready, self.slice) - self.service)

    @property
    def pnr_hop(self) -> float:
        return self.pnr_slice - self.pnr_started

    @property
    def direct_hop(self) -> float:
        return self.direct_slice - self.direct_started


@dataclass
class SliceRoute:
    """The members the primary Service's EndpointSlice lists ready now (what kube-proxy
    would route to): the sampler's and the writer's view of the route in this benchmark."""

    rig: KubeRig

    @property
    def cluster(self) -> PatroniCluster:
        return self.rig.cluster

    def selected(self) -> list[str]:
        by_ip = {pod_ip(m.ip): m.name for m in self.rig.cluster.members}
        return sorted(by_ip.get(address, address) for address in self.rig.slices.ready())


@dataclass
class Invariants:
    """What must hold over a whole run, from the watches (not from the hook's own word)."""

    most_ready_at_once: int = 0
    service_deleted: int = 0
    empty_selectors: int = 0
    selector_changes: int = 0
    hook_errors: int = 0
    syncs: int = 0
    writes_on_non_leader: int = 0
    #: The same for the publishNotReadyAddresses mirror's slice and the direct one.
    mirror_most_ready_at_once: int = 0
    direct_most_ready_at_once: int = 0

    @property
    def broken(self) -> list[str]:
        problems = []
        if self.mirror_most_ready_at_once > 1:
            problems.append(f"{self.mirror_most_ready_at_once} Pods ready at once in the mirror")
        if self.direct_most_ready_at_once > 1:
            problems.append(f"{self.direct_most_ready_at_once} Pods ready in the direct slice")
        if self.most_ready_at_once > 1:
            problems.append(f"{self.most_ready_at_once} Pods ready at once in the primary slice")
        if self.service_deleted:
            problems.append(f"the primary Service was deleted {self.service_deleted} time(s)")
        if self.empty_selectors:
            problems.append(f"the Service's selector was empty {self.empty_selectors} time(s)")
        if self.writes_on_non_leader:
            problems.append(f"{self.writes_on_non_leader} writes landed on a non-leader")
        return problems


@dataclass
class RunResult:
    """One DCS mode's failovers, invariants and client writes."""

    dcs: str
    failovers: list[KubeFailover] = field(default_factory=list)
    invariants: Invariants = field(default_factory=Invariants)
    writes: dict[str, Any] = field(default_factory=dict)
    #: The ``SwitchoverDetection`` condition of the last status (Kubernetes DCS: why).
    detection_condition: dict[str, Any] | None = None
    #: How long the failovers took, and the syncs in that time (Pod events bring syncs).
    seconds: float = 0.0
    syncs: int = 0
    #: What the watches saw (for the JSON output, to read a hop after the fact).
    trace: dict[str, list[Any]] = field(default_factory=dict)


# ------------------------------------------------------------------------------ pure parts


def resync_period(detection: str | None, timing: ResyncTiming | None = None) -> float:
    """The healthy resync period the hook asks for under ``detection`` (no ``pollSeconds``
    in the benchmark's spec): the healthy setting, at least 30 s when event-driven
    (:func:`hooks.core.switchover.healthy_resync`)."""
    timing = timing or HookSettings().resync
    period = max(timing.healthy, timing.degraded)
    if detection == "RoleLabel":
        period = max(DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS, period)
    return period


def next_slot(period: float, key: str, wall: float) -> float:
    """Seconds from the wall-clock time ``wall`` to the next resync slot of the parent
    ``key`` (its ``metadata.uid``). The hook phase-spreads every healthy resync onto the
    slots ``slot + k·period`` (:func:`hooks.core.switchover.spread_resync`, which adds a
    period when the slot is less than half a period away): a resync of a routed cluster
    lands on one of them, so none falls between ``wall`` and ``wall`` plus this."""
    return spread_resync(period, key, wall) % period


def first_selector(
    selectors: Sequence[tuple[float, Mapping[str, str]]], pod: str, after: float
) -> float | None:
    """When the Service's watch first showed a selector on ``pod``, from ``after`` on."""
    for at, selector in selectors:
        if at >= after and selector.get(POD_NAME_LABEL) == pod:
            return at
    return None


def first_ready(
    history: Sequence[tuple[float, tuple[str, ...]]], addresses: tuple[str, ...], after: float
) -> float | None:
    """When the slices first listed exactly ``addresses`` ready, from ``after`` on."""
    for at, ready in history:
        if at >= after and ready == addresses:
            return at
    return None


def hook_counts(hook: GunicornHook) -> tuple[float, float]:
    """The hook's own count of answered sync/finalize calls and of calls it failed (4xx on
    ``/sync``, 5xx), from its ``/metrics``: the same on the stand-in and on a real
    Metacontroller, which records nothing of its calls here. Fleet-wide: a parent of an
    earlier namespace still being finalized counts too."""
    response = requests.get(f"{hook.url}/metrics", timeout=5, verify=hook.verify)
    response.raise_for_status()
    return call_counts(response.text)


def call_counts(exposition: str) -> tuple[float, float]:
    """Answered calls (``pgfh_sync_duration_seconds_count``, every hook) and failed ones
    (``pgfh_internal_errors_total`` and ``pgfh_bad_requests_total`` of the Metacontroller
    endpoints) in the hook's text exposition."""
    calls = failed = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "pgfh_sync_duration_seconds_count":
                calls += sample.value
            elif sample.name in ("pgfh_internal_errors_total", "pgfh_bad_requests_total") and (
                sample.labels.get("endpoint") in ("sync", "customize")
            ):
                failed += sample.value
    return calls, failed


def invariants_of(
    rig: KubeRig, calls: tuple[float, float] = (0.0, 0.0), writes_on_non_leader: int = 0
) -> Invariants:
    """The invariants over everything the rig's watches saw; ``calls``: the hook's answered
    and failed calls over the run (:func:`hook_counts`, after minus before)."""
    return Invariants(
        most_ready_at_once=rig.slices.most_ready_at_once(),
        service_deleted=len(rig.slices.service_deleted),
        empty_selectors=sum(
            1 for _, selector in rig.slices.selectors if not selector.get(POD_NAME_LABEL)
        ),
        selector_changes=len(rig.slices.selectors),
        hook_errors=int(calls[1]),
        syncs=int(calls[0]),
        writes_on_non_leader=writes_on_non_leader,
    )


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.3f} / {percentile(values, 0.95):.3f} / {max(values):.3f}"


def summarize(
    failovers: Sequence[KubeFailover],
    hops: Sequence[tuple[str, Callable[[KubeFailover], float]]] = HOPS,
) -> list[str]:
    """A markdown table: p50 / p95 / max of every hop, per DCS mode and kind."""
    header = "| DCS | failover | n | " + " | ".join(label for label, _ in hops) + " |"
    lines = [header, "|" + "---|" * (3 + len(hops))]
    for dcs in DCS_MODES:
        for kind in KINDS:
            chosen = [f for f in failovers if f.dcs == dcs and f.kind == kind]
            if not chosen:
                continue
            cells = [_stats([hop(f) for f in chosen]) for _, hop in hops]
            lines.append(f"| {dcs} | {kind} | {len(chosen)} | " + " | ".join(cells) + " |")
    return lines


def _wait(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout} s")
        time.sleep(0.02)


# ------------------------------------------------------------------------------ the rig


class PodReadiness:
    """Every Pod's Ready condition in a namespace over time, from a watch (the kubelet
    stand-in writes it from Patroni's ``/readiness``, probed once a ``periodSeconds``)."""

    def __init__(self, rest: KubeRest, namespace: str) -> None:
        #: ``(monotonic time, Pod name, Ready)`` at every change.
        self.changes: list[tuple[float, str, bool]] = []
        self._last: dict[str, bool] = {}
        self._lock = threading.Lock()
        path = resource_path("v1", "pods", namespace)
        self._reflector = Reflector(rest, path, self._on_pod, name="bench-pods")

    def start(self) -> PodReadiness:
        self._reflector.start()
        self._reflector.wait_synced(10)
        return self

    def stop(self) -> None:
        self._reflector.stop()

    def _on_pod(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = kind != "DELETED" and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        )
        name = str(obj["metadata"]["name"])
        with self._lock:
            if self._last.get(name) != ready:
                self._last[name] = ready
                self.changes.append((time.monotonic(), name, ready))

    def turned_ready(self, name: str, after: float, until: float) -> float | None:
        """When ``name`` first turned Ready in [after, until] (``None``: it did not). The
        slice and Pod watches run in threads of their own, so the caller allows ``until`` a
        little past the slice's move: the Pod event may be handled just after the slice's."""
        with self._lock:
            found = [
                at for at, pod, up in self.changes if pod == name and up and after <= at <= until
            ]
        return found[0] if found else None


class Mirror:
    """A second Service that follows the primary Service's selector from a watch, one write
    later, to measure another way of publishing the leader side by side in the same run.
    :attr:`writes` holds when each change of the primary was seen (so a mirror's figure is
    timed from the primary's Service write, its own write included)."""

    def __init__(self, rest: KubeRest, namespace: str, name: str) -> None:
        self.rest = rest
        self.namespace = namespace
        self.name = name
        #: ``(monotonic time the primary's change was seen, its selector)``.
        self.writes: list[tuple[float, dict[str, str]]] = []
        self.slices = SliceWatch(rest, namespace, service=name)
        self._written: dict[str, str] | None = None
        self.ports: list[dict[str, Any]] = []
        path = resource_path("v1", "services", namespace)
        self._reflector = Reflector(rest, path, self._on_service, name=f"bench-{name}")

    def start(self, timeout: float = 30.0) -> Mirror:
        primary = _wait(
            lambda: self._primary(), timeout, f"the primary Service {SERVICE} to be created"
        )
        spec = primary["spec"]
        self._written = dict(spec.get("selector") or {})
        self.ports = [
            {k: v for k, v in port.items() if k in ("name", "port", "protocol", "targetPort")}
            for port in spec.get("ports") or []
        ]
        self._create(self._written)
        self.writes.append((time.monotonic(), dict(self._written)))
        self.slices.start()
        self._reflector.start()
        self._reflector.wait_synced(10)
        return self

    def stop(self) -> None:
        self._reflector.stop()
        self.slices.stop()

    def _create(self, selector: dict[str, str]) -> None:
        raise NotImplementedError

    def _follow(self, selector: dict[str, str]) -> None:
        raise NotImplementedError

    def _service_path(self) -> str:
        return resource_path("v1", "services", self.namespace, self.name)

    def _primary(self) -> dict[str, Any] | None:
        try:
            return self.rest.get(resource_path("v1", "services", self.namespace, SERVICE))
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def _on_service(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if obj["metadata"]["name"] != SERVICE or kind == "DELETED":
            return
        selector = dict((obj.get("spec") or {}).get("selector") or {})
        if not selector or selector == self._written:
            return
        seen = time.monotonic()
        self._follow(selector)
        self._written = selector
        self.writes.append((seen, selector))


class NotReadyMirror(Mirror):
    """The primary Service with ``publishNotReadyAddresses: true``: the endpointslice
    controller lists the selected Pod ready whatever its Ready condition."""

    def __init__(self, rest: KubeRest, namespace: str, name: str = MIRROR_SERVICE) -> None:
        super().__init__(rest, namespace, name)

    def _create(self, selector: dict[str, str]) -> None:
        spec = {"selector": selector, "ports": self.ports, "publishNotReadyAddresses": True}
        self.rest.create(
            resource_path("v1", "services", self.namespace),
            {"apiVersion": "v1", "kind": "Service", "metadata": self._meta(), "spec": spec},
        )

    def _meta(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace}

    def _follow(self, selector: dict[str, str]) -> None:
        self.rest.merge_patch(self._service_path(), {"spec": {"selector": selector}})


class DirectSliceMirror(Mirror):
    """A Service without a selector whose one EndpointSlice is written directly (as Patroni
    writes its leader Endpoints with ``use_endpoints``, or as the hook could have
    Metacontroller write it as a child): the selected Pod's IP, ready, no controller hop.
    ``pod_ip`` gives a member's Pod IP without an API call (the hook has every related Pod's
    IP in its request)."""

    def __init__(
        self,
        rest: KubeRest,
        namespace: str,
        pod_ip: Callable[[str], str],
        name: str = DIRECT_SERVICE,
    ) -> None:
        super().__init__(rest, namespace, name)
        self.pod_ip = pod_ip

    def _slice_path(self) -> str:
        return resource_path("discovery.k8s.io/v1", "endpointslices", self.namespace, self.name)

    def _endpoints(self, selector: dict[str, str]) -> list[dict[str, Any]]:
        pod = selector.get(POD_NAME_LABEL)
        if not pod:
            return []
        return [
            {
                "addresses": [self.pod_ip(pod)],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": self.namespace},
            }
        ]

    def _create(self, selector: dict[str, str]) -> None:
        meta = {"name": self.name, "namespace": self.namespace}
        ports = [{"name": p.get("name"), "port": p.get("port")} for p in self.ports]
        self.rest.create(
            resource_path("v1", "services", self.namespace),
            {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {"ports": ports}},
        )
        self.rest.create(
            resource_path("discovery.k8s.io/v1", "endpointslices", self.namespace),
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    **meta,
                    "labels": {
                        "kubernetes.io/service-name": self.name,
                        "endpointslice.kubernetes.io/managed-by": "bench.pg-failover-hook",
                    },
                },
                "addressType": "IPv4",
                "ports": [
                    {"name": p.get("name"), "port": p.get("port"), "protocol": "TCP"}
                    for p in self.ports
                ],
                "endpoints": self._endpoints(selector),
            },
        )

    def _follow(self, selector: dict[str, str]) -> None:
        self.rest.merge_patch(self._slice_path(), {"endpoints": self._endpoints(selector)})


@dataclass
class Bench:
    """The rig and what this benchmark watches beside it."""

    rig: KubeRig
    pods: PodReadiness
    mirror: NotReadyMirror
    direct: DirectSliceMirror
    hook: GunicornHook


def pods_ready(rig: KubeRig) -> bool:
    """Every member Pod Ready (the kubelet stand-in's probe passed since a restart)."""
    for member in rig.cluster.members:
        pod = rig.rest.get(f"/api/v1/namespaces/{rig.namespace}/pods/{member.name}")
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return False
    return True


def status_of(rig: KubeRig) -> dict[str, Any]:
    parent = rig.parent() or {}
    return dict(parent.get("status") or {})


def settle(rig: KubeRig, want_detection: str | None, timeout: float = 60.0) -> None:
    """Before a failover: the cluster healthy, every Pod Ready, the slice on the leader, and
    (Kubernetes DCS) the hook's switchover detection back to ``want_detection``."""
    leader = rig.cluster.wait_healthy(timeout=timeout)
    _wait(lambda: True if pods_ready(rig) else None, timeout, "every member Pod Ready")
    rig.slices.wait_ready((rig.leader_ip(leader),), timeout, f"the leader {leader}")
    if want_detection is not None:
        _wait(
            lambda: True if status_of(rig).get("switchoverDetection") == want_detection else None,
            timeout,
            f"status.switchoverDetection {want_detection}",
        )


def one_failover(bench: Bench, dcs: str, kind: str) -> KubeFailover:
    """Trigger one failover of ``kind`` and time it up to the slice; then repair."""
    rig = bench.rig
    cluster = rig.cluster
    old = cluster.leader()
    if old is None:
        raise RuntimeError("no leader before the failover")
    parent = rig.parent() or {}
    detection = (parent.get("status") or {}).get("switchoverDetection")
    uid = str(parent["metadata"]["uid"])
    _, trigger, election = cluster.fail_over(kind, timeout=FAILOVER_TIMEOUT, poll_interval=0.01)
    new = election.name
    new_ip = rig.leader_ip(new)
    rig.slices.wait_ready((new_ip,), SLICE_TIMEOUT, f"the new leader {new}")
    service = _wait(
        lambda: first_selector(rig.slices.selectors, new, trigger), 10, f"the Service on {new}"
    )
    moved = _wait(lambda: first_ready(rig.slices.history, (new_ip,), trigger), 1, "the slice")
    bench.mirror.slices.wait_ready((new_ip,), SLICE_TIMEOUT, f"the mirror on {new}")
    mirror_slice = _wait(
        lambda: first_ready(bench.mirror.slices.history, (new_ip,), trigger), 1, "the mirror"
    )
    mirror_write = _wait(
        lambda: first_selector(bench.mirror.writes, new, trigger), 1, "the mirror's write"
    )
    bench.direct.slices.wait_ready((new_ip,), SLICE_TIMEOUT, f"the direct slice on {new}")
    direct_slice = _wait(
        lambda: first_ready(bench.direct.slices.history, (new_ip,), trigger), 1, "the direct"
    )
    direct_write = _wait(
        lambda: first_selector(bench.direct.writes, new, trigger), 1, "the direct write"
    )
    failover = KubeFailover(
        dcs=dcs,
        kind=kind,
        old=old,
        new=new,
        trigger=trigger,
        promotion=election.first_primary,
        service=service,
        slice=moved,
        detection=detection,
        new_ready=bench.pods.turned_ready(new, trigger, moved + WATCH_SLACK),
        pnr_started=mirror_write,
        pnr_slice=mirror_slice,
        direct_started=direct_write,
        direct_slice=direct_slice,
    )
    failover.resync_period = resync_period(detection)
    wall = time.time() - time.monotonic()  # this clock's offset from the hook's wall clock
    failover.resync_due = trigger + next_slot(failover.resync_period, uid, trigger + wall)
    if kind != "switchover":
        if kind == "graceful":
            cluster.wait_stopped(old)
        cluster.start_member(old)
    cluster.wait_for_replicas(timeout=FAILOVER_TIMEOUT)
    return failover


def run_on(
    bench: Bench,
    dcs: str,
    failovers: int,
    kinds: Sequence[str],
    *,
    quiet: bool = False,
    writes: bool = True,
) -> RunResult:
    """Measure ``failovers`` failovers (``kinds`` cycled) on a running rig.

    ``writes=False`` runs no writer: on the Kubernetes DCS every write moves the WAL, and
    Patroni re-patches each Pod's ``status`` annotation (``xlog_location``) every HA loop
    when it moved, which is a Pod event, hence a sync, whatever the switchover detection.
    Without writes the only Pod changes are the roles' and the kubelet's readiness.
    """
    rig = bench.rig
    result = RunResult(dcs)
    event_driven = None if dcs == "etcd" else "RoleLabel"
    settle(rig, event_driven)
    route = SliceRoute(rig)
    started, calls_before = time.monotonic(), hook_counts(bench.hook)
    writer_context = Writer(route) if writes else contextlib.nullcontext(None)
    with Sampler(route) as sampler, writer_context as writer:
        for index, kind in zip(range(failovers), itertools.cycle(kinds), strict=False):
            settle(rig, event_driven)
            failover = one_failover(bench, dcs, kind)
            failover.no_leader, failover.misrouted = sampler.between(
                failover.trigger, failover.slice
            )
            result.failovers.append(failover)
            if not quiet:
                hops = ", ".join(f"{label} {hop(failover):.3f}" for label, hop in HOPS)
                print(
                    f"  {dcs} #{index + 1:2d} {kind:10s} {failover.old} -> {failover.new} "
                    f"[{failover.detection}, resync {failover.resync_period}]: {hops}",
                    flush=True,
                )
        if writer is not None:
            done = writer.writes
            result.writes = {
                "ok": done.ok,
                "failed": done.failed,
                "failed_when": sampler.classify(done.failed_at),
                "errors": done.errors,
                "on_non_leader": done.on_non_leader,
            }
    result.seconds = time.monotonic() - started
    calls_after = hook_counts(bench.hook)
    calls = (calls_after[0] - calls_before[0], calls_after[1] - calls_before[1])
    result.syncs = int(calls[0])
    result.invariants = invariants_of(rig, calls, int(result.writes.get("on_non_leader") or 0))
    result.invariants.mirror_most_ready_at_once = bench.mirror.slices.most_ready_at_once()
    result.invariants.direct_most_ready_at_once = bench.direct.slices.most_ready_at_once()
    result.trace = {
        "pods_ready": list(bench.pods.changes),
        "slice": list(rig.slices.history),
        "selectors": list(rig.slices.selectors),
        "mirror_writes": list(bench.mirror.writes),
        "mirror_slice": list(bench.mirror.slices.history),
        "direct_writes": list(bench.direct.writes),
        "direct_slice": list(bench.direct.slices.history),
    }
    conditions = status_of(rig).get("conditions") or []
    result.detection_condition = next(
        (c for c in conditions if c.get("type") == "SwitchoverDetection"), None
    )
    return result


@contextlib.contextmanager
def benchmark_rig(
    plane: ControlPlane,
    dcs: str,
    hook: GunicornHook,
    work_dir: Path,
    *,
    etcd_cluster: PatroniCluster | None = None,
    first_ip: int | None = None,
) -> Iterator[Bench]:
    """A namespace, a Patroni cluster on ``dcs``, and the rig on them (Metacontroller's
    stand-in under its own least-privilege ServiceAccount); all gone on exit.
    ``etcd_cluster``: the etcd-DCS cluster to use instead of starting one (the test suite's
    session cluster, which holds the same addresses). ``first_ip``: the members on
    ``127.0.0.<first_ip>`` and up (and etcd on the address below), away from a cluster that
    holds the usual block."""
    if dcs not in DCS_MODES:
        raise ValueError(f"dcs must be one of {DCS_MODES}, not {dcs!r}")
    admin = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    namespace = f"bench-{dcs[:5]}-{uuid.uuid4().hex[:6]}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    controller = metacontroller_kubeconfig(plane)
    try:
        with contextlib.ExitStack() as stack:
            if dcs == "etcd":
                cluster = etcd_cluster or stack.enter_context(
                    PatroniCluster()
                    if first_ip is None
                    else PatroniCluster(first_ip=first_ip, etcd_host=f"127.0.0.{first_ip - 1}")
                )
            else:
                kubernetes = KubernetesDCS(
                    server=plane.server_url,
                    ca_file=plane.ca_file,
                    token=grant_patroni_rights(admin, namespace),
                    namespace=namespace,
                    use_endpoints=dcs == "endpoints",
                )
                first = KUBERNETES_FIRST_IP if first_ip is None else first_ip
                members = {f"{CLUSTER}-{i}": f"127.0.0.{first + i}" for i in range(3)}
                create_member_pods(admin, kubernetes, CLUSTER, members)
                cluster = stack.enter_context(PatroniCluster(first_ip=first, kubernetes=kubernetes))
            rig = stack.enter_context(
                kube_rig(
                    cluster,
                    plane.admin_kubeconfig,
                    namespace,
                    hook.url,
                    hook.token,
                    work_dir=work_dir,
                    controller_kubeconfig=controller,
                    create_pods=dcs == "etcd",
                )
            )
            pods = PodReadiness(admin, namespace).start()
            stack.callback(pods.stop)
            mirror = NotReadyMirror(KubeRest.from_kubeconfig(plane.admin_kubeconfig), namespace)
            stack.callback(mirror.rest.close)
            mirror.start()
            stack.callback(mirror.stop)
            direct = DirectSliceMirror(
                KubeRest.from_kubeconfig(plane.admin_kubeconfig), namespace, rig.leader_ip
            )
            stack.callback(direct.rest.close)
            direct.start()
            stack.callback(direct.stop)
            yield Bench(rig, pods, mirror, direct, hook)
    finally:
        with contextlib.suppress(KubeApiError):
            admin.delete(f"/api/v1/namespaces/{namespace}")
        admin.close()


def run(
    dcs_modes: Sequence[str],
    failovers: int,
    kinds: Sequence[str],
    *,
    writes: bool = True,
    first_ip: int | None = None,
) -> list[RunResult]:
    """Start the control plane and the hook once, then each DCS mode's cluster in turn."""
    work_dir = Path(tempfile.mkdtemp(prefix="pgfh-bench-kube-"))
    ensure_pod_network()
    plane = start_control_plane(work_dir / "controlplane", log=lambda line: print(f"  {line}"))
    results = []
    (work_dir / "hook").mkdir()
    try:
        with rig_hook(work_dir / "hook", env=HOOK_ENV) as hook:
            for dcs in dcs_modes:
                print(f"{dcs}: starting the cluster and the rig ...", flush=True)
                with benchmark_rig(plane, dcs, hook, work_dir, first_ip=first_ip) as bench:
                    results.append(run_on(bench, dcs, failovers, kinds, writes=writes))
    finally:
        plane.stop()
    return results


def load_line() -> str:
    """The machine's load while it ran: what a reader needs to weigh the figures."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


def controller_line() -> str:
    """Which Metacontroller applied the replies: the figures differ by it."""
    binary = os.environ.get(ENV_BINARY)
    return f"Metacontroller: the binary {binary}" if binary else "Metacontroller: the stand-in"


def report(results: Sequence[RunResult]) -> list[str]:
    failovers = [f for r in results for f in r.failovers]
    lines = [controller_line(), "", *summarize(failovers)]
    lines += [
        "",
        "Where the endpointslice hop goes, and the same Service with "
        "publishNotReadyAddresses (a mirror, one write later, timed from that write):",
        "",
    ]
    lines += summarize(failovers, READINESS_HOPS)
    waited = sum(1 for f in failovers if f.readiness_wait > 0)
    lines.append(
        f"\nEach cell: p50 / p95 / max in seconds, on one monotonic clock. The slice waited for "
        f"the new leader's Pod to turn Ready in {waited} of {len(failovers)} failovers."
    )
    for r in results:
        inv = r.invariants
        w = r.writes
        lines.append(
            f"\n{r.dcs}: {len(r.failovers)} failovers, {inv.syncs} hook calls answered "
            f"({inv.hook_errors} failed; the hook's /metrics, every parent on the server), "
            f"{inv.selector_changes} selector changes; at most {inv.most_ready_at_once} "
            f"Pod ready at once in the primary slice; Service deleted {inv.service_deleted} "
            f"times; empty selectors {inv.empty_selectors}."
        )
        lines.append(
            f"  {r.syncs} hook calls in the {r.seconds:.0f} s of failovers: "
            f"{60 * r.syncs / max(r.seconds, 1e-9):.0f} a minute."
        )
        when = w.get("failed_when") or {}
        lines.append(
            "  no writer in this run"
            if not w
            else (
                f"  writes through the slice (one every 50 ms): {w.get('ok')} ok, "
                f"{w.get('failed')} failed ({when.get('no_leader')} with no leader, "
                f"{when.get('service_elsewhere')} with a leader but the slice not on it yet, "
                f"{when.get('service_on_leader')} with the slice on the leader), "
                f"{w.get('on_non_leader')} on a non-leader."
            )
        )
        no_leader = sum(f.no_leader for f in r.failovers)
        misrouted = sum(f.misrouted for f in r.failovers)
        lines.append(
            f"  ground truth (20 ms sampler): no leader {no_leader:.2f} s in total; a leader "
            f"but the slice elsewhere {misrouted:.3f} s in total."
        )
        detections = sorted({str(f.detection) for f in r.failovers})
        resyncs = [f.resync_period for f in r.failovers if f.resync_period is not None]
        lines.append(
            f"  switchoverDetection at the triggers: {', '.join(detections)}; healthy resync "
            f"period {min(resyncs, default=0):.1f}–{max(resyncs, default=0):.1f} s"
        )
        if r.detection_condition is not None:
            c = r.detection_condition
            lines.append(
                f"  SwitchoverDetection: {c.get('status')} {c.get('reason')}: {c.get('message')}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dcs", default="etcd", help=f"comma-separated, among {DCS_MODES}")
    parser.add_argument("--failovers", type=int, default=21, help="per DCS mode")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, cycled")
    parser.add_argument("--quick", action="store_true", help="one failover of each kind")
    parser.add_argument("--no-writes", action="store_true", help="no client writing meanwhile")
    parser.add_argument(
        "--first-ip",
        type=int,
        help="members on 127.0.0.N and up (etcd on N-1): away from a cluster on the usual block",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    modes = [m for m in args.dcs.split(",") if m]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"kinds must be among {KINDS}")
    if not modes or set(modes) - set(DCS_MODES):
        parser.error(f"--dcs must be among {DCS_MODES}")
    count = len(kinds) if args.quick else args.failovers
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"{started}: {count} failovers per DCS mode ({', '.join(modes)}); {load_line()}; "
        f"{controller_line()}"
    )
    results = run(modes, count, kinds, writes=not args.no_writes, first_ip=args.first_ip)
    lines = report(results)
    print("\n".join(lines))
    print(f"\nafter the run: {load_line()}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "dcs": r.dcs,
                        "failovers": [asdict(f) for f in r.failovers],
                        "invariants": asdict(r.invariants),
                        "writes": r.writes,
                        "detection_condition": r.detection_condition,
                        "seconds": r.seconds,
                        "trace": r.trace,
                        "syncs": r.syncs,
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    broken = [f"{r.dcs}: {problem}" for r in results for problem in r.invariants.broken]
    for problem in broken:
        print(f"INVARIANT BROKEN: {problem}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
