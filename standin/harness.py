"""The local rig: real Patroni cluster + real hook under gunicorn + Metacontroller stand-in.

Shared by the failover tests, the demo and the benchmarks, so all three measure the
same thing. Kubernetes is modelled only where the hook can see it:

* each Patroni member plays the StatefulSet Pod of the same name (``pg-orders-0`` on
  127.0.0.2, ...), with the labels a StatefulSet and ``primarySelector`` give it;
* killing or stopping a member is also a Pod change (the kubelet marks the container
  not ready), which the stand-in delivers as an informer event: an immediate sync;
* a planned switchover changes no Pod, so only ``resyncAfterSeconds`` brings the next
  sync, exactly as with an etcd DCS in a real cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from devcluster import PatroniCluster
from standin.apply import World
from standin.loop import MetacontrollerStandIn, SyncRecord, make_pod

NAMESPACE = "databases"
CLUSTER = "pg-orders"
SERVICE = "pg-orders-primary"
READ_ONLY_SERVICE = "pg-orders-replicas"
PRIMARY_SELECTOR = {"application": "patroni", "cluster-name": CLUSTER}
PARENT_UID = "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"


def cluster_parent(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The PostgreSQLCluster, with the three seed fields only unless ``spec`` says more."""
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": NAMESPACE,
            "uid": PARENT_UID,
            "generation": 1,
            "finalizers": ["metacontroller.io/compositecontroller-pg-failover-hook"],
        },
        "spec": spec
        or {
            "primarySelector": dict(PRIMARY_SELECTOR),
            "serviceRef": {"name": SERVICE},
            "healthCheckPath": "/primary",
        },
    }


class PodModel:
    """The member Pods as Kubernetes would show them; bumps resourceVersion on change."""

    def __init__(self, cluster: PatroniCluster) -> None:
        self.cluster = cluster
        self.not_ready: set[str] = set()
        self.version = 1

    def pods(self) -> dict[str, dict[str, Any]]:
        return {
            m.name: make_pod(
                m.name,
                m.ip,
                labels=dict(PRIMARY_SELECTOR),
                namespace=NAMESPACE,
                ready=m.name not in self.not_ready,
                resource_version=self.version,
            )
            for m in self.cluster.members
        }

    def set_ready(self, name: str, ready: bool) -> dict[str, dict[str, Any]]:
        (self.not_ready.discard if ready else self.not_ready.add)(name)
        self.version += 1
        return self.pods()


@dataclass
class Rig:
    """A running stand-in driving the hook for the local cluster."""

    cluster: PatroniCluster
    standin: MetacontrollerStandIn
    model: PodModel

    @property
    def records(self) -> list[SyncRecord]:
        return self.standin.stats.records

    def selected(self) -> list[str]:
        with self.standin.lock:
            return self.standin.world.selected_pods(SERVICE)

    def status(self) -> dict[str, Any]:
        with self.standin.lock:
            return dict(self.standin.world.parent.get("status") or {})

    def service(self) -> dict[str, Any] | None:
        with self.standin.lock:
            return self.standin.world.services.get(SERVICE)

    def read_only(self) -> list[str]:
        """The Pods the read-only Service routes to now (what kube-proxy would use)."""
        with self.standin.lock:
            return self.standin.world.endpoint_pods(READ_ONLY_SERVICE)

    def pod_changed(self, name: str, *, ready: bool) -> None:
        """What the kubelet and the informer would report after a member stops or starts."""
        self.standin.update_pods(self.model.set_ready(name, ready))

    def wait_selected(self, pod: str, timeout: float, *, after: int = 0) -> SyncRecord:
        """Wait until a sync has pointed the Service at ``pod``; return that sync's record."""
        return self.wait_record(
            lambda r: r.selected == (pod,), timeout, f"Service on {pod}", after=after
        )

    def wait_record(
        self,
        predicate: Callable[[SyncRecord], bool],
        timeout: float,
        what: str,
        *,
        after: int = 0,
    ) -> SyncRecord:
        """Wait for a sync record (from index ``after`` on) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        seen = after
        while True:
            records = self.records
            for record in records[seen:]:
                if predicate(record):
                    return record
            seen = len(records)
            if time.monotonic() > deadline:
                last = records[-1] if records else None
                raise TimeoutError(f"no sync gave {what} within {timeout} s; last: {last}")
            time.sleep(0.005)


def start_rig(
    cluster: PatroniCluster,
    hook_url: str,
    *,
    resync_period: float = 30.0,
    on_record: Callable[[SyncRecord], None] | None = None,
    headers: Mapping[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> Rig:
    """Start the stand-in for ``cluster`` against the hook at ``hook_url``.

    ``headers`` authenticate the calls; by default those of the rig hook at ``hook_url``.
    ``spec`` replaces the seed spec (e.g. to add ``replicaService``); records then also
    carry the Pods that the read-only Service ``READ_ONLY_SERVICE`` routes to.
    """
    model = PodModel(cluster)
    world = World(parent=cluster_parent(spec), pods=model.pods())
    standin = MetacontrollerStandIn(
        hook_url,
        world,
        service_name=SERVICE,
        resync_period=resync_period,
        on_record=on_record,
        headers=headers,
        read_only_service=READ_ONLY_SERVICE,
    )
    standin.start()
    return Rig(cluster, standin, model)
