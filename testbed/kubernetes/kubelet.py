"""A stand-in of the kubelet: it runs no container, it reports Pods as a kubelet would.

No kubelet can run here. The endpointslice controller lists a Pod as an endpoint when the Pod
names an existing Node (``spec.nodeName``), has ``status.podIP``/``podIPs``, a phase that is not
terminal, and, for ``ready``, the Ready condition (``staging/src/k8s.io/endpointslice``). So this
stand-in registers a Node and, for every Pod bound to it:

* **starts** it: phase Running and the Pod IP. The IP is what the test's process behind that Pod
  really listens on, given by the annotation :data:`POD_IP_ANNOTATION` (the stand-in for the
  CNI's address allocation); a Pod without it stays Pending, as one whose sandbox never came up;
* **probes** it as the kubelet's prober does (``pkg/kubelet/prober``): the first container's
  ``readinessProbe`` ``httpGet`` at the Pod IP, every ``periodSeconds``, each try bounded by
  ``timeoutSeconds``, Ready after ``successThreshold`` successes in a row and not Ready after
  ``failureThreshold`` failures in a row (Ready False until the first success, as a kubelet
  starts a container); it writes ``Ready`` and ``ContainersReady`` only when they change;
* **terminates** it: a deleted Pod (``deletionTimestamp``) turns not Ready at once, the
  ``on_terminate`` callback stops what plays its container, and the Pod object is removed with
  a UID precondition, as the kubelet's final delete does.

Where it differs from a kubelet: no containers, images, restarts, liveness or startup probes,
node heartbeats or leases (node-lifecycle is off, so nothing expects them), and it writes with
the admin's credentials rather than a ``system:node:`` identity.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

from testbed.kubernetes.pods import NODE
from testbed.kubernetes.rest import KubeApiError, KubeRest
from testbed.kubernetes.watch import Reflector

POD_IP_ANNOTATION = "kubelet-standin.pgfh.test/pod-ip"
LOG = logging.getLogger("controlplane.kubelet")
#: The longest a probe may take whatever the Pod says (a hung member must not stall the worker).
PROBE_TIMEOUT_CAP = 5.0
#: Each watch call ends after this (the reconnects are :mod:`testbed.kubernetes.watch`'s).
WATCH_SECONDS = 30


@dataclass(frozen=True)
class ReadinessProbe:
    """The parts of a container's ``readinessProbe`` a kubelet uses for an ``httpGet``."""

    path: str
    port: int
    scheme: str
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, pod: dict[str, Any]) -> ReadinessProbe | None:
        containers = pod.get("spec", {}).get("containers") or []
        probe = (containers[0] if containers else {}).get("readinessProbe") or {}
        http_get = probe.get("httpGet")
        if not http_get:
            return None
        port = http_get.get("port")
        if isinstance(port, str):  # a named port: look it up in the container's ports
            named = {p.get("name"): p.get("containerPort") for p in containers[0].get("ports", [])}
            port = named.get(port)
        if not isinstance(port, int):
            return None
        return cls(
            path=http_get.get("path", "/"),
            port=port,
            scheme=str(http_get.get("scheme", "HTTP")).lower(),
            period=float(probe.get("periodSeconds", 10)),
            timeout=min(float(probe.get("timeoutSeconds", 1)), PROBE_TIMEOUT_CAP),
            success_threshold=int(probe.get("successThreshold", 1)),
            failure_threshold=int(probe.get("failureThreshold", 3)),
        )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeletStandIn:
    """Plays the kubelet of the Node ``node_name`` until :meth:`stop`."""

    def __init__(
        self,
        api: KubeRest,
        node_name: str = NODE,
        *,
        on_terminate: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.on_terminate = on_terminate
        self._stop = threading.Event()
        self._workers: dict[str, _PodWorker] = {}
        self._lock = threading.Lock()
        self._reflector: Reflector | None = None
        self._session = requests.Session()
        self._session.trust_env = False  # probes go to the Pod IP only, never to a proxy

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> KubeletStandIn:
        self.register_node()
        self._reflector = Reflector(
            self.api,
            "/api/v1/pods",
            self._on_pod,
            watch_seconds=WATCH_SECONDS,
            name="kubelet-standin",
            params={"fieldSelector": f"spec.nodeName={self.node_name}"},
        ).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._reflector is not None:
            self._reflector.stop()  # the open watch ends now, not at its timeout
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            worker.stop()
        self._session.close()

    def __enter__(self) -> KubeletStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def register_node(self) -> None:
        """The Node object the Pods name, Ready, as ``kubelet --register-node`` would make it."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name},
            },
        }
        with contextlib.suppress(KubeApiError):  # already registered
            self.api.create("/api/v1/nodes", body)
        self.api.strategic_patch(
            f"/api/v1/nodes/{self.node_name}/status",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "kubelet stand-in",
                            "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now(),
                        }
                    ]
                }
            },
        )

    # -- the watch -------------------------------------------------------------------------
    def _on_pod(self, kind: str, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        """The Pods bound to this Node, from :class:`testbed.kubernetes.watch.Reflector` (a
        kubelet's Pod source is a client-go reflector too: ``pkg/kubelet/config/apiserver.go``)."""
        if kind == "DELETED":
            self._forget(pod)
        else:
            self._handle(pod)

    def _key(self, pod: dict[str, Any]) -> str:
        meta = pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}/{meta['uid']}"

    def _handle(self, pod: dict[str, Any]) -> None:
        if self._stop.is_set():
            return
        key = self._key(pod)
        with self._lock:
            worker = self._workers.get(key)
            if worker is None:
                worker = _PodWorker(self, pod)
                self._workers[key] = worker
                worker.start()
            else:
                worker.update(pod)

    def _forget(self, pod: dict[str, Any]) -> None:
        with self._lock:
            worker = self._workers.pop(self._key(pod), None)
        if worker is not None:
            worker.stop()

    # -- writes ----------------------------------------------------------------------------
    def patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            self.api.strategic_patch(path, {"status": status})
        except KubeApiError as error:
            if error.status != 404:
                LOG.warning("kubelet stand-in: status of %s: %s", meta["name"], error)
        except requests.RequestException as error:
            LOG.warning("kubelet stand-in: status of %s: %s", meta["name"], error)

    def final_delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(KubeApiError, requests.RequestException):
            self.api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )


def _conditions(ready: bool) -> list[dict[str, Any]]:
    status = "True" if ready else "False"
    now = _now()
    return [
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
        {"type": "Ready", "status": status, "lastTransitionTime": now},
    ]


class _PodWorker:
    """One Pod's start, readiness probing and termination (the kubelet's per-pod worker)."""

    def __init__(self, kubelet: KubeletStandIn, pod: dict[str, Any]) -> None:
        self.kubelet = kubelet
        self.pod = pod
        self.ready: bool | None = None
        self._streak = 0
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"kubelet-pod-{pod['metadata']['name']}", daemon=True
        )
        self._terminated = False

    def start(self) -> None:
        self._thread.start()

    def update(self, pod: dict[str, Any]) -> None:
        """A new version of the Pod. Only a deletion wakes the worker: a kubelet probes on its
        period, not when the Pod changes, and Patroni on its Kubernetes DCS patches its own
        Pod every HA loop (role label, status annotation), which would otherwise have had
        the stand-in probe at once, e.g. the moment a new leader labels itself primary."""
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self._changed.set()

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=PROBE_TIMEOUT_CAP + 5)

    def _ip(self) -> str | None:
        return (self.pod["metadata"].get("annotations") or {}).get(POD_IP_ANNOTATION)

    def _run(self) -> None:
        ip = self._ip()
        if ip is None:
            return  # no address allocated: the Pod stays Pending
        status = self.pod.get("status") or {}
        if status.get("podIP") != ip or status.get("phase") != "Running":
            self.kubelet.patch_status(
                self.pod,
                {
                    "phase": "Running",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "hostIP": "127.0.0.1",
                    "startTime": _now(),
                    "conditions": _conditions(False),
                },
            )
            self.ready = False
        while not self._stop.is_set():
            if self.pod["metadata"].get("deletionTimestamp"):
                self._terminate()
                return
            probe = ReadinessProbe.of(self.pod)
            if probe is None:
                self._set_ready(True)  # no readiness probe: Ready once running
                self._changed.wait(1.0)
                self._changed.clear()
                continue
            self._probe(ip, probe)
            self._changed.wait(probe.period)
            self._changed.clear()

    def _probe(self, ip: str, probe: ReadinessProbe) -> None:
        host = f"[{ip}]" if ":" in ip else ip
        url = f"{probe.scheme}://{host}:{probe.port}{probe.path}"
        try:
            response = self.kubelet._session.get(
                url, timeout=probe.timeout, allow_redirects=False, verify=False
            )
            ok = 200 <= response.status_code < 400  # the kubelet's rule for httpGet
            response.close()
        except requests.RequestException:
            ok = False
        if self.ready is None or ok != self.ready:
            self._streak += 1
            needed = probe.success_threshold if ok else probe.failure_threshold
            if self.ready is None or self._streak >= needed:
                self._set_ready(ok)
        else:
            self._streak = 0

    def _set_ready(self, ready: bool) -> None:
        self._streak = 0
        if ready == self.ready:
            return
        self.ready = ready
        self.kubelet.patch_status(self.pod, {"conditions": _conditions(ready)[2:]})

    def _terminate(self) -> None:
        if self._terminated:
            return
        self._terminated = True
        self._set_ready(False)
        if self.kubelet.on_terminate is not None:
            try:
                self.kubelet.on_terminate(self.pod)
            except Exception:
                name = self.pod["metadata"]["name"]
                LOG.exception("kubelet stand-in: on_terminate failed for %s", name)
        self.kubelet.final_delete(self.pod)  # after the container is gone
