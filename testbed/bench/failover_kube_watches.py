"""Failovers on the real control plane: what the benchmark watches beside the rig.

Every Pod's Ready condition over time (:class:`PodReadiness`); two side-by-side Services that
follow the primary Service's selector one write later (:class:`NotReadyMirror` with
``publishNotReadyAddresses``, :class:`DirectSliceMirror` without a selector, its EndpointSlice
written directly); the members the primary slice lists ready, as the sampler's and the
writer's route (:class:`SliceRoute`). Used by :mod:`testbed.bench.failover_kube`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from testbed.kubernetes.podnet import pod_ip
from testbed.kubernetes.pods import POD_NAME_LABEL
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.kubernetes.watch import Reflector
from testbed.metacontroller.harness import SERVICE
from testbed.metacontroller.kube_rig import KubeRig, SliceWatch
from testbed.patroni import PatroniCluster

#: The side-by-side Service with ``publishNotReadyAddresses`` (not one of Patroni's names).
MIRROR_SERVICE = "pg-orders-primary-pnr"
#: The side-by-side Service without a selector, its EndpointSlice written directly.
DIRECT_SERVICE = "pg-orders-primary-direct"
T = TypeVar("T")


def wait_until(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """``check()`` every 20 ms until it returns a value; a ``TimeoutError`` naming ``what``
    after ``timeout`` s (every wait of the benchmark is bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout} s")
        time.sleep(0.02)


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
        primary = wait_until(
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
