"""The one manifest of a Patroni member Pod in the test bed, and the Node it runs on.

Every rig that creates member Pods on the real API server (the Metacontroller rig, the
Kubernetes-DCS cluster, the fleet and walk benchmarks, the kubectl plugin's and the control
plane's tests) and the in-memory stand-in that hands Pods to the hook as an informer would
build them here, so a field the hook starts to read is added in one place.

The Pod is a StatefulSet's as Patroni's own ``kubernetes/patroni_k8s.yaml`` writes it: one
container with PostgreSQL's and Patroni's ports, the StatefulSet's Pod-name label, and
Patroni's ``/readiness`` as the readiness probe (docs/deploy.md, "Readiness probe of the
Patroni Pods"), which the kubelet stand-in (:mod:`testbed.kubernetes.kubelet`) runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The Node the kubelet stand-in registers and the Pods are bound to.
NODE = "pgfh-node-0"
#: The label a StatefulSet puts on each of its Pods: its name.
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
#: Patroni's REST API port and PostgreSQL's, as the member containers declare them.
PATRONI_PORT, POSTGRES_PORT = 8008, 5432
#: The readiness probe of a Patroni Pod.
READINESS_PROBE: dict[str, Any] = {
    "httpGet": {"path": "/readiness", "port": PATRONI_PORT},
    "periodSeconds": 1,
    "timeoutSeconds": 1,
    "failureThreshold": 3,
}


def patroni_pod(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    *,
    annotations: Mapping[str, str] | None = None,
    node: str | None = NODE,
    readiness: Mapping[str, Any] | None = READINESS_PROBE,
    image: str = "registry.invalid/patroni:testbed",  # never pulled: no kubelet pulls here
) -> dict[str, Any]:
    """Member ``name``'s Pod, its ``labels`` plus the StatefulSet's Pod-name label.

    ``node``: the Node it is bound to (``None``: unscheduled); ``readiness``: its readiness
    probe (``None`` when whoever plays the kubelet writes the status itself).
    """
    container: dict[str, Any] = {
        "name": "patroni",
        "image": image,
        "ports": [
            {"name": "postgresql", "containerPort": POSTGRES_PORT},
            {"name": "patroni", "containerPort": PATRONI_PORT},
        ],
    }
    if readiness is not None:
        container["readinessProbe"] = dict(readiness)
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [container]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**labels, POD_NAME_LABEL: name},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


def running_status(ip: str, *, ready: bool) -> dict[str, Any]:
    """What a kubelet writes for a running member at ``ip`` (``ready``: its probe passed)."""
    flag = "True" if ready else "False"
    return {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "127.0.0.1",
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "PodScheduled", "status": "True"},
            {"type": "ContainersReady", "status": flag},
            {"type": "Ready", "status": flag},
        ],
    }
