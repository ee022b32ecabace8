"""The local rig: real Patroni cluster + real hook under gunicorn + Metacontroller stand-in.

Shared by the failover tests, the demo and the benchmarks, so all three measure the
same thing. Kubernetes is modelled only where the hook can see it:

* each Patroni member plays the StatefulSet Pod of the same name (``pg-orders-0`` on
  127.0.0.2, ...), with the labels a StatefulSet and ``primarySelector`` give it;
* killing or stopping a member is also a Pod change (the kubelet marks the container
  not ready), which the stand-in delivers as an informer event: an immediate sync;
* a planned switchover changes no Pod, so only ``resyncAfterSeconds`` brings the next
  sync, exactly as with an etcd DCS in a real cluster;
* unless the rig plays Patroni's Kubernetes DCS (``start_rig(..., role_labels=True)``):
  then :class:`RoleLabelKeeper` patches each member's Pod with the ``role`` label and the
  ``status`` annotation the way Patroni's ``touch_member`` does, so a switchover changes
  the old and the new leader's Pods, each change an informer event: an immediate sync.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.metacontroller.apply import World
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook
from testbed.metacontroller.loop import MetacontrollerStandIn, SyncRecord, make_pod
from testbed.patroni import LeaderLoss, PatroniCluster

NAMESPACE = "databases"
CLUSTER = "pg-orders"
SERVICE = "pg-orders-primary"
READ_ONLY_SERVICE = "pg-orders-replicas"
PRIMARY_SELECTOR = {"application": "patroni", "cluster-name": CLUSTER}
PARENT_UID = "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"


#: Where the rig's hook comes from: ``worktree`` (default: gunicorn on this checkout's code,
#: :func:`testbed.metacontroller.gunicorn.gunicorn_hook`) or ``image`` (the image built from the
#: Dockerfile,
#: run as the Deployment runs it: :func:`testbed.metacontroller.image.image_hook`).
HOOK_FROM = "PGFH_TEST_HOOK_FROM"
HOOK_SOURCES = ("worktree", "image")


def rig_hook(
    workdir: Path, *, source: str | None = None, **kwargs: Any
) -> AbstractContextManager[GunicornHook]:
    """The hook for a rig, from ``source`` (default: ``$PGFH_TEST_HOOK_FROM``, else the work
    tree); the same arguments as :func:`testbed.metacontroller.gunicorn.gunicorn_hook`, the same
    hook."""
    source = source or os.environ.get(HOOK_FROM) or "worktree"
    if source == "worktree":
        return gunicorn_hook(workdir, **kwargs)
    if source == "image":
        from testbed.metacontroller.image import image_hook

        return image_hook(workdir, **kwargs)
    raise ValueError(f"{HOOK_FROM}={source!r}: one of {', '.join(HOOK_SOURCES)}")


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
        #: Per member: Patroni's ``role`` label value and ``status`` annotation, as the
        #: Kubernetes DCS last patched them (absent: never patched, the etcd-DCS case).
        self.roles: dict[str, tuple[str | None, str]] = {}

    def pods(self) -> dict[str, dict[str, Any]]:
        pods = {
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
        for name, (label, annotation) in self.roles.items():
            metadata = pods[name]["metadata"]
            if label is not None:
                metadata["labels"][ROLE_LABEL] = label
            metadata["annotations"] = {STATUS_ANNOTATION: annotation}
        return pods

    def set_role(self, name: str, label: str | None, annotation: str) -> bool:
        """What Patroni's ``touch_member`` patches; whether the Pod changed."""
        if self.roles.get(name) == (label, annotation):
            return False
        self.roles[name] = (label, annotation)
        self.version += 1
        return True

    def set_ready(self, name: str, ready: bool) -> dict[str, dict[str, Any]]:
        (self.not_ready.discard if ready else self.not_ready.add)(name)
        self.version += 1
        return self.pods()


#: Patroni's Kubernetes-DCS defaults (``kubernetes.role_label`` and its values).
ROLE_LABEL = "role"
LEADER_LABEL_VALUE = "primary"
FOLLOWER_LABEL_VALUE = "replica"
STATUS_ANNOTATION = "status"


def touch_member_patch(name: str, body: Mapping[str, Any]) -> tuple[str | None, str]:
    """The label value and annotation Patroni 4.1's ``touch_member`` would write.

    From ``patroni/dcs/kubernetes.py``: the leader-lock holder gets the leader value, a
    running member of another role the follower value, anything else no label; the
    annotation is the member's JSON (compact). Patroni derives both from its own state;
    here they come from the member's REST answer (``GET /patroni``), which reports the
    same state (the lock holder is the member whose role is primary or standby_leader).
    ``xlog_location`` is left out: the devcluster is idle, and the churn of a busy
    cluster's annotation is the fleet benchmark's business.
    """
    role, state = body.get("role"), body.get("state")
    if role in ("primary", "standby_leader"):
        label: str | None = LEADER_LABEL_VALUE
    elif state == "running":
        label = FOLLOWER_LABEL_VALUE if role == "replica" else str(role)
    else:
        label = None
    data = {
        "conn_url": f"postgres://{name}:5432/postgres",
        "api_url": f"http://{name}:8008/patroni",
        "state": state,
        "role": role,
        "version": (body.get("patroni") or {}).get("version"),
        "timeline": body.get("timeline"),
    }
    return label, json.dumps(data, separators=(",", ":"))


@dataclass
class RoleLabelKeeper:
    """Plays Patroni's Kubernetes DCS for the stand-in: the Pods follow the members' roles.

    Every ``interval`` it asks each member's REST API (bounded by ``timeout``) and patches
    the member's Pod when the label or annotation Patroni would write differs; a member
    that does not answer keeps its Pod as it is (a dead Patroni patches nothing: a killed
    leader's Pod keeps ``role=primary`` until the kubelet marks it NotReady).
    """

    cluster: PatroniCluster
    model: PodModel
    standin: MetacontrollerStandIn
    interval: float = 0.05
    timeout: float = 0.5
    patches: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.step()  # the Pods carry their roles before the first sync
        self._thread = threading.Thread(target=self._run, name="role-label-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def step(self) -> bool:
        """One round over the members; whether any Pod changed."""
        changed = False
        for member in self.cluster.members:
            response = member.api_get("/patroni", timeout=self.timeout)
            body = response.json() if response.status == 200 else {}
            if not body.get("role"):
                continue
            label, annotation = touch_member_patch(member.name, body)
            with self.standin.lock:
                changed |= self.model.set_role(member.name, label, annotation)
        if changed:
            self.patches += 1
            with self.standin.lock:
                pods = self.model.pods()
            self.standin.update_pods(pods)
        return changed

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.step()


@dataclass
class Rig:
    """A running stand-in driving the hook for the local cluster."""

    cluster: PatroniCluster
    standin: MetacontrollerStandIn
    model: PodModel
    keeper: RoleLabelKeeper | None = None

    def stop(self) -> None:
        """Stop the stand-in (and the role-label keeper, if any)."""
        if self.keeper is not None:
            self.keeper.stop()
        self.standin.stop()

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
        with self.standin.lock:
            pods = self.model.set_ready(name, ready)
        self.standin.update_pods(pods)

    def lose_leader(self, how: str, timeout: float, poll_interval: float = 0.025) -> LeaderLoss:
        """Stop the leader (``how``: "graceful" or "kill") as a failover test or benchmark
        does (:meth:`PatroniCluster.lose_leader`), reporting its Pod NotReady as the kubelet
        would right after the trigger."""
        return self.cluster.lose_leader(
            how, timeout, poll_interval, on_trigger=lambda old: self.pod_changed(old, ready=False)
        )

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
    role_labels: bool = False,
) -> Rig:
    """Start the stand-in for ``cluster`` against the hook at ``hook_url``.

    ``headers`` authenticate the calls; by default those of the rig hook at ``hook_url``.
    ``spec`` replaces the seed spec (e.g. to add ``replicaService``); records then also
    carry the Pods that the read-only Service ``READ_ONLY_SERVICE`` routes to.
    ``role_labels`` plays Patroni's Kubernetes DCS (:class:`RoleLabelKeeper`); without it
    the Pods carry no role evidence, as with an etcd DCS. Stop the rig with
    :meth:`Rig.stop`.
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
    keeper = RoleLabelKeeper(cluster, model, standin) if role_labels else None
    if keeper is not None:
        keeper.start()
    standin.start()
    return Rig(cluster, standin, model, keeper)
