"""The rig on the real control plane: the local Patroni cluster as Pods of a real API server,
the kubelet stand-in, the hook's CompositeController, and Metacontroller (the stand-in of
:mod:`testbed.metacontroller.kube`, or a real binary named by ``PGFH_METACONTROLLER_BINARY``).

Shared by the end-to-end tests and ``make demo``, so both show the same thing:

* each member is the StatefulSet Pod of its name, with the labels of ``primarySelector`` and
  ``statefulset.kubernetes.io/pod-name``, bound to the kubelet stand-in's Node, its Pod IP
  ``198.18.0.N`` standing for the member's ``127.0.0.N`` (:mod:`testbed.kubernetes.podnet`), and the
  readiness probe Patroni Pods commonly carry: ``httpGet /readiness`` on 8008, every second;
* the primary Service's EndpointSlices are written by the real endpointslice controller;
  :class:`SliceWatch` follows them (and the Service) from a watch, so a test can prove that
  no two Pods were ever ready in them at once and that the Service was never deleted.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.kubernetes.kubelet import POD_IP_ANNOTATION, KubeletStandIn
from testbed.kubernetes.podnet import pod_ip
from testbed.kubernetes.pods import NODE, patroni_pod
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.kubernetes.watch import Reflector
from testbed.metacontroller.harness import CLUSTER, PRIMARY_SELECTOR, SERVICE
from testbed.metacontroller.kube import KubeMetacontroller
from testbed.metacontroller.kube_records import KubeSyncRecord
from testbed.metacontroller.kube_setup import install
from testbed.metacontroller.metacontroller_binary import (
    ENV_BINARY,
    MetacontrollerBinary,
    binary_from_env,
)
from testbed.metacontroller.metacontroller_replica import BinaryReplica, StandinReplica
from testbed.metacontroller.supervisor import Container, Supervisor
from testbed.patroni import PatroniCluster

PARENT_API = "adg.io/v1alpha1"
PARENTS = "postgresqlclusters"
#: What the hook must be told to probe the test Pod network (and nothing else).
HOOK_ENV = {"PGFH_ALLOWED_POD_CIDRS": "198.18.0.0/24"}


def member_pod(name: str, loopback: str, namespace: str) -> dict[str, Any]:
    """Member ``name`` of the rig's cluster, its Pod IP the one of ``loopback``."""
    return patroni_pod(
        name, namespace, PRIMARY_SELECTOR, annotations={POD_IP_ANNOTATION: pod_ip(loopback)}
    )


def cluster_resource(namespace: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": CLUSTER, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": PARENT_API,
        "kind": "PostgreSQLCluster",
        "metadata": metadata,
        "spec": {
            "primarySelector": dict(PRIMARY_SELECTOR),
            "serviceRef": {"name": SERVICE},
            "healthCheckPath": "/primary",
        },
    }


@dataclass
class SliceWatch:
    """The primary Service's ready endpoints over time, from watches (not polls)."""

    rest: KubeRest
    namespace: str
    service: str = SERVICE
    #: ``(monotonic time, ready addresses)`` at every change of the union over its slices.
    history: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    #: Times the Service was seen DELETED.
    service_deleted: list[float] = field(default_factory=list)
    #: ``(monotonic time, spec.selector)`` at every change of the Service's selector, from the
    #: watch: when the stand-in's write of a new selector reached the server's watchers.
    selectors: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    on_change: Callable[[tuple[str, ...]], None] | None = None
    _slices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _reflectors: list[Reflector] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> SliceWatch:
        slices = resource_path("discovery.k8s.io/v1", "endpointslices", self.namespace)
        services = resource_path("v1", "services", self.namespace)
        self._reflectors = [
            Reflector(self.rest, slices, self._on_slice, name="slices").start(),
            Reflector(self.rest, services, self._on_service, name="services").start(),
        ]
        for reflector in self._reflectors:
            reflector.wait_synced(10)
        return self

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()

    def _on_slice(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        labels = obj["metadata"].get("labels") or {}
        if labels.get("kubernetes.io/service-name") != self.service:
            return
        name = obj["metadata"]["name"]
        ready = tuple(
            sorted(
                address
                for endpoint in obj.get("endpoints") or []
                if (endpoint.get("conditions") or {}).get("ready")
                for address in endpoint.get("addresses") or []
            )
        )
        with self._lock:
            if kind == "DELETED":
                self._slices.pop(name, None)
            else:
                self._slices[name] = ready
            union = tuple(sorted({a for addresses in self._slices.values() for a in addresses}))
            if self.history and self.history[-1][1] == union:
                return
            self.history.append((time.monotonic(), union))
        if self.on_change is not None:
            self.on_change(union)
        with self._changed:
            self._changed.notify_all()

    def _on_service(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if obj["metadata"]["name"] != self.service:
            return
        if kind == "DELETED":
            self.service_deleted.append(time.monotonic())
            return
        selector = dict((obj.get("spec") or {}).get("selector") or {})
        with self._lock:
            if not self.selectors or self.selectors[-1][1] != selector:
                self.selectors.append((time.monotonic(), selector))

    def ready(self) -> tuple[str, ...]:
        with self._lock:
            return self.history[-1][1] if self.history else ()

    def wait_ready(self, addresses: tuple[str, ...], timeout: float, what: str) -> float:
        """Wait until exactly ``addresses`` are ready; the time they first were."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                with self._lock:
                    if self.history and self.history[-1][1] == addresses:
                        return self.history[-1][0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"the {self.service} EndpointSlice did not list {what} "
                        f"{list(addresses)} ready within {timeout} s; now {list(self.ready())}"
                    )
                self._changed.wait(min(left, 0.2))

    def most_ready_at_once(self) -> int:
        with self._lock:
            return max((len(addresses) for _, addresses in self.history), default=0)


@dataclass
class KubeRig:
    cluster: PatroniCluster
    rest: KubeRest
    namespace: str
    slices: SliceWatch
    controller: KubeMetacontroller | None
    binary: MetacontrollerBinary | None
    kubelet: KubeletStandIn | None = None
    #: How :meth:`restart_controller` makes the next stand-in (the rig's own arguments).
    controller_kubeconfig: Path | None = None
    on_record: Callable[[KubeSyncRecord], None] | None = None
    #: The records of stand-ins stopped by :meth:`restart_controller`.
    _past_records: list[KubeSyncRecord] = field(default_factory=list)
    #: With ``replicas``: Metacontroller's replicas under the kubelet's restarts
    #: (:mod:`testbed.metacontroller.supervisor`), and how to make them again
    #: (:meth:`start_controller`).
    supervisor: Supervisor | None = None
    make_supervisor: Callable[[], Supervisor] | None = None
    #: Every stand-in controller a supervised replica started, and every client it used.
    supervised: list[KubeMetacontroller] = field(default_factory=list)
    supervised_rests: list[KubeRest] = field(default_factory=list)

    @property
    def records(self) -> list[KubeSyncRecord]:
        """Every hook call of the run, across restarts of the stand-in."""
        now = list(self.controller.records) if self.controller is not None else []
        supervised = [r for c in list(self.supervised) for r in c.records]
        return sorted([*self._past_records, *now, *supervised], key=lambda r: r.started)

    def forbidden(self) -> list[str]:
        """Every call of the stand-in (controllers and lease clients) refused with 403."""
        rests = [c.rest for c in [self.controller, *self.supervised] if c is not None]
        return [call for rest in [*rests, *self.supervised_rests] for call in rest.forbidden]

    def describe_control_path(self) -> str:
        """Where Metacontroller is (no lease, exited, in back-off), for a failing test."""
        if self.supervisor is not None:
            return self.supervisor.describe()
        if self.binary is not None and self.binary.process is not None:
            code = self.binary.process.poll()
            return "the binary is running" if code is None else f"the binary exited with {code}"
        return "the stand-in is running" if self.controller is not None else "no Metacontroller"

    def stop_controller(self) -> None:
        """Metacontroller gone (a crash, a rollout): nothing syncs until
        :meth:`start_controller`. The stand-in's records are kept."""
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self.controller is not None:
            self.controller.stop()
            self._past_records.extend(self.controller.records)
            self.controller = None
        if self.binary is not None:
            self.binary.stop()

    def start_controller(self) -> None:
        """Metacontroller back: a new process with empty caches, which lists everything,
        then syncs every parent (a real binary: the same binary started again); with
        replicas, every replica made again (they campaign for the Lease first)."""
        if self.make_supervisor is not None:
            self.supervisor = self.make_supervisor().start()
            return
        if self.binary is not None:
            self.binary.start()
            return
        assert self.controller_kubeconfig is not None, "the rig was made without kube_rig"
        controller = KubeMetacontroller(self.controller_kubeconfig, on_record=self.on_record)
        controller.start()
        self.controller = controller

    def leader_ip(self, name: str) -> str:
        return pod_ip(self.cluster.member(name).ip)

    def parent_path(self) -> str:
        return resource_path(PARENT_API, PARENTS, self.namespace, CLUSTER)

    def parent(self) -> dict[str, Any] | None:
        try:
            return self.rest.get(self.parent_path())
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise


@contextlib.contextmanager
def kube_rig(
    cluster: PatroniCluster,
    kubeconfig: Path,
    namespace: str,
    hook_url: str,
    token: str | None,
    *,
    on_change: Callable[[tuple[str, ...]], None] | None = None,
    on_record: Callable[[KubeSyncRecord], None] | None = None,
    work_dir: Path | None = None,
    controller_kubeconfig: Path | None = None,
    create_pods: bool = True,
    controller_spec: Mapping[str, Any] | None = None,
    replicas: int | None = None,
    parent_labels: Mapping[str, str] | None = None,
) -> Iterator[KubeRig]:
    """Pods, kubelet, CompositeController, Metacontroller and the PostgreSQLCluster; all of
    it stopped (the cluster's objects deleted with the namespace by the caller) on exit.
    ``kubeconfig`` sets things up (an admin's); Metacontroller runs with
    ``controller_kubeconfig`` when given (e.g. its least-privilege ServiceAccount's,
    :func:`testbed.kubernetes.accounts.metacontroller_kubeconfig`), else with ``kubeconfig``.
    ``create_pods=False``: the member Pods exist already (Patroni on its Kubernetes DCS
    patches its own Pod, so they are made before it starts:
    :func:`testbed.patroni.kubernetes_dcs.create_member_pods`). ``controller_spec``: fields of
    the shipped CompositeController's spec replaced (``None``: removed), e.g. a test's
    ``resyncPeriodSeconds`` (:func:`testbed.metacontroller.kube_setup.install`).
    ``replicas``: Metacontroller as that many replicas with leader election, each restarted
    as the kubelet restarts a container (:mod:`testbed.metacontroller.supervisor`); the stand-in's
    are
    :class:`testbed.metacontroller.metacontroller_replica.StandinReplica`, a binary's run with the
    values'
    ``--leader-election``. Without it: one process without supervision (the stand-in
    without leader election). ``parent_labels``: the PostgreSQLCluster's labels (e.g. a
    shard's)."""
    controller_config = controller_kubeconfig or kubeconfig
    rest = KubeRest.from_kubeconfig(kubeconfig)
    install(rest, hook_url, token, controller_spec)
    with KubeletStandIn(rest, NODE) as kubelet:
        for member in cluster.members if create_pods else ():
            _create_pod(rest, member_pod(member.name, member.ip, namespace))
        slices = SliceWatch(rest, namespace, on_change=on_change).start()
        binary = None
        if replicas is None:  # supervised replicas are made by _supervisor_maker below
            binary = binary_from_env(controller_config, work_dir or Path("/tmp"), namespace)
        controller = None
        if replicas is None and binary is None:
            controller = KubeMetacontroller(controller_config, on_record=on_record)
            controller.start()
        elif binary is not None:
            binary.start()
        rig = KubeRig(
            cluster,
            rest,
            namespace,
            slices,
            controller,
            binary,
            kubelet,
            controller_config,
            on_record,
        )
        if replicas is not None:
            rig.make_supervisor = _supervisor_maker(
                rig, controller_config, work_dir or Path("/tmp"), namespace, replicas
            )
            rig.start_controller()
        try:
            rest.create(
                resource_path(PARENT_API, PARENTS, namespace),
                cluster_resource(namespace, parent_labels),
            )
            yield rig
        finally:
            rig.stop_controller()
            slices.stop()
    rest.close()


def _supervisor_maker(
    rig: KubeRig, kubeconfig: Path, work_dir: Path, namespace: str, replicas: int
) -> Callable[[], Supervisor]:
    """How :meth:`KubeRig.start_controller` makes the replicas: the stand-in's, or the
    binary ``PGFH_METACONTROLLER_BINARY`` names (each start a new container name)."""
    made = [0]
    binary = os.environ.get(ENV_BINARY)

    def make(replica: int) -> Container:
        made[0] += 1
        name = f"mc-{replica}-{made[0]}"
        if binary:
            return BinaryReplica(name, Path(binary), kubeconfig, work_dir, namespace)

        def controller() -> KubeMetacontroller:
            made_controller = KubeMetacontroller(kubeconfig, on_record=rig.on_record)
            rig.supervised.append(made_controller)
            return made_controller

        return StandinReplica(
            name, kubeconfig, namespace, controller, on_rest=rig.supervised_rests.append
        )

    return lambda: Supervisor(make, replicas)


def _create_pod(rest: KubeRest, pod: dict[str, Any], timeout: float = 30.0) -> None:
    """Create a Pod; retried while the namespace's ``default`` ServiceAccount (which
    admission requires) is not made yet by the serviceaccount controller."""
    deadline = time.monotonic() + timeout
    path = resource_path("v1", "pods", pod["metadata"]["namespace"])
    while True:
        try:
            rest.create(path, pod)
            return
        except KubeApiError as error:
            if error.status != 403 and "serviceaccount" not in error.message.lower():
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
