"""The fleet on the real control plane: its objects and the writers that change them.

Names, namespaces (``--layout``), member Pods, Pod status as a kubelet would write it, the
PostgreSQLClusters and the switchover plan are pure; :class:`Fleet` creates and patches them
through per-thread clients, :class:`Churn` patches every member Pod every 10 s as Patroni's
Kubernetes DCS does. Used by :mod:`testbed.bench.fleet.on_kube`.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.kubernetes.pods import patroni_pod, running_status

LAYOUTS = ("one-namespace", "100-namespaces", "per-namespace")
MEMBERS = 3
#: Members listen on 127.0.0.231-233 (Pod IPs 198.18.0.231-233): no test or benchmark uses them.
FIRST_HOST = 231
EVENTLESS = "event-less"
POD_EVENT = "pod-event"
ROLE_LABEL = "role"
#: Patroni's Kubernetes DCS: each member patches its Pod every loop_wait (10 s by default).
CHURN_PERIOD = 10.0
#: The hook's healthy resync while the role labels agree (the CRD's eventDrivenResyncSeconds).
EVENT_DRIVEN_RESYNC = 30.0


def namespace_of(index: int, layout: str, prefix: str = "fleet") -> str:
    """The namespace of cluster ``index`` in ``layout``."""
    if layout == "one-namespace":
        return f"{prefix}-0"
    if layout == "100-namespaces":
        return f"{prefix}-{index % 100}"
    if layout == "per-namespace":
        return f"{prefix}-{index}"
    raise ValueError(f"unknown layout {layout!r}; one of {', '.join(LAYOUTS)}")


def namespaces(clusters: int, layout: str, prefix: str = "fleet") -> list[str]:
    """Every namespace the layout uses, each once, in order of first use."""
    return list(dict.fromkeys(namespace_of(i, layout, prefix) for i in range(clusters)))


def cluster_name(index: int) -> str:
    return f"pg-{index:05d}"


def pod_name(index: int, member: int) -> str:
    return f"{cluster_name(index)}-{member}"


def member_host(member: int) -> str:
    return f"127.0.0.{FIRST_HOST + member}"


def status_annotation(role: str, beat: int) -> str:
    """Patroni's ``status`` annotation of its Kubernetes DCS (what changes every loop)."""
    return json.dumps(
        {"role": role, "state": "running", "version": "4.0.4", "xlog_location": 50331648 + beat}
    )


def member_pod(
    index: int, member: int, namespace: str, *, leader: int, churn: bool
) -> dict[str, Any]:
    """Member ``member`` of cluster ``index``: the labels ``primarySelector`` selects and the
    StatefulSet's Pod name label; with ``churn`` Patroni's role label and status annotation.
    No readiness probe: the harness writes each Pod's status itself."""
    name = cluster_name(index)
    labels = {
        "application": "patroni",
        "cluster-name": name,
    }
    annotations: dict[str, str] = {}
    if churn:
        role = "primary" if member == leader else "replica"
        labels[ROLE_LABEL] = role
        annotations["status"] = status_annotation(role, 0)
    return patroni_pod(
        pod_name(index, member),
        namespace,
        labels,
        annotations=annotations,
        node="pgfh-fleet-node",
        readiness=None,
    )


#: The label that puts a PostgreSQLCluster in a CompositeController's share (deploy/sharding).
SHARD_LABEL = "pg-failover-hook.adg.io/shard"


def parent(
    index: int, namespace: str, port: int, poll: float, shard: int | None = None
) -> dict[str, Any]:
    """Cluster ``index``'s PostgreSQLCluster; with ``shard``, labelled for that share."""
    name = cluster_name(index)
    labels = {} if shard is None else {SHARD_LABEL: str(shard)}
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "primarySelector": {"application": "patroni", "cluster-name": name},
            "serviceRef": {"name": f"{name}-primary"},
            "healthCheckPath": "/primary",
            "patroni": {"port": port},
            "switchover": {"pollSeconds": poll},
        },
    }


@dataclass(frozen=True)
class Switch:
    """One planned switchover: ``at`` s into the window, of ``cluster``, of ``kind``."""

    at: float
    cluster: int
    kind: str


def plan(clusters: int, switchovers: int, duration: float, seed: int = 1) -> list[Switch]:
    """``switchovers`` evenly spread over the window (after a 10 % lead-in), alternately
    event-less and Pod-event, each of a different cluster while there are enough."""
    if switchovers <= 0 or clusters <= 0:
        return []
    rng = random.Random(seed)
    order = rng.sample(range(clusters), min(clusters, switchovers))
    while len(order) < switchovers:
        order.append(rng.randrange(clusters))
    start, span = 0.1 * duration, 0.8 * duration
    step = span / switchovers
    return [
        Switch(round(start + i * step, 3), order[i], EVENTLESS if i % 2 == 0 else POD_EVENT)
        for i in range(switchovers)
    ]


@dataclass
class Fleet:
    """The clusters' objects and how to change them (Pods written by per-thread clients)."""

    kubeconfig: Path
    layout: str
    clusters: int
    prefix: str
    churn: bool
    #: CompositeControllers sharing the fleet by the shard label (1: the shipped one, unlabelled).
    controllers: int = 1
    leaders: list[int] = field(default_factory=list)
    _local: threading.local = field(default_factory=threading.local)
    _clients: list[Any] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def rest(self) -> Any:
        from testbed.kubernetes.rest import KubeRest

        client = getattr(self._local, "rest", None)
        if client is None:
            client = self._local.rest = KubeRest.from_kubeconfig(self.kubeconfig)
            with self._lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()

    def ns(self, index: int) -> str:
        return namespace_of(index, self.layout, self.prefix)

    def pod_path(self, index: int, member: int, sub: str = "") -> str:
        return f"/api/v1/namespaces/{self.ns(index)}/pods/{pod_name(index, member)}{sub}"

    def pod_ip(self, member: int) -> str:
        from testbed.kubernetes.podnet import pod_ip

        return pod_ip(member_host(member))

    def create_cluster(self, index: int, port: int, poll: float) -> None:
        from testbed.kubernetes.rest import KubeApiError
        from testbed.metacontroller.kube_rig import PARENT_API, PARENTS

        rest = self.rest()
        ns = self.ns(index)
        for member in range(MEMBERS):
            pod = member_pod(index, member, ns, leader=0, churn=self.churn)
            deadline = time.monotonic() + 60
            while True:  # the namespace's default ServiceAccount may not exist yet
                try:
                    rest.create(f"/api/v1/namespaces/{ns}/pods", pod)
                    break
                except KubeApiError as error:
                    if error.status != 403 or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            rest.strategic_patch(
                self.pod_path(index, member, "/status"),
                {"status": running_status(self.pod_ip(member), ready=True)},
            )
        from testbed.kubernetes.rest import resource_path

        shard = None if self.controllers == 1 else index % self.controllers
        rest.create(resource_path(PARENT_API, PARENTS, ns), parent(index, ns, port, poll, shard))

    def set_ready(self, index: int, member: int, ready: bool) -> None:
        # Only ContainersReady and Ready change (the last two of the kubelet's conditions).
        conditions = running_status(self.pod_ip(member), ready=ready)["conditions"][2:]
        self.rest().strategic_patch(
            self.pod_path(index, member, "/status"),
            {"status": {"conditions": conditions}},
        )

    def set_role(self, index: int, member: int, role: str, beat: int) -> None:
        self.rest().merge_patch(
            self.pod_path(index, member),
            {
                "metadata": {
                    "labels": {ROLE_LABEL: role},
                    "annotations": {"status": status_annotation(role, beat)},
                }
            },
        )


class Churn:
    """Every member Pod's status annotation patched every 10 s (Patroni's Kubernetes DCS),
    spread evenly over the period; bounded by ``until``."""

    def __init__(self, fleet: Fleet, until: float) -> None:
        self.fleet = fleet
        self.until = until
        self.patches = 0
        self.late = 0
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=12, thread_name_prefix="churn")
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def start(self) -> Churn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(CHURN_PERIOD + 5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _patch(self, index: int, member: int, beat: int) -> None:
        with contextlib.suppress(Exception):
            role = "primary" if self.fleet.leaders[index] == member else "replica"
            self.fleet.set_role(index, member, role, beat)
            self.patches += 1

    def _run(self) -> None:
        total = self.fleet.clusters * MEMBERS
        step = CHURN_PERIOD / total
        beat = 0
        started = time.monotonic()
        while not self._stop.is_set() and time.monotonic() < self.until:
            beat += 1
            for slot in range(total):
                due = started + (beat - 1) * CHURN_PERIOD + slot * step
                delay = due - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    return
                if delay < -1.0:
                    self.late += 1
                self._pool.submit(self._patch, slot // MEMBERS, slot % MEMBERS, beat)
