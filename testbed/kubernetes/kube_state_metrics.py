"""kube-state-metrics (the pinned Go module's build) against the test control plane.

Run with the monitoring kit's own configuration (``deploy/monitoring/kube-state-metrics-config
.yaml``: each PostgreSQLCluster's status as ``pgfh_cluster_*`` series), custom-resource metrics
only, on a loopback port the kernel hands out; stopped with the context. Bounded start: it
must serve ``/metrics`` within the timeout or the start fails naming its log.
"""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.kubernetes.servers import ControlPlane, Server, free_port, http_refusal


@dataclass(frozen=True)
class KubeStateMetrics:
    url: str  # http://127.0.0.1:PORT (serves /metrics)
    server: Server

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            return str(response.read().decode())


@contextlib.contextmanager
def running_kube_state_metrics(
    plane: ControlPlane, config_file: Path, run_dir: Path, timeout: float = 60
) -> Iterator[KubeStateMetrics]:
    port, telemetry = free_port(), free_port()
    server = Server(
        "kube-state-metrics",
        [
            str(plane.binaries.path("kube-state-metrics")),
            f"--kubeconfig={plane.admin_kubeconfig}",
            f"--custom-resource-state-config-file={config_file}",
            "--custom-resource-state-only",
            "--host=127.0.0.1",
            f"--port={port}",
            "--telemetry-host=127.0.0.1",
            f"--telemetry-port={telemetry}",
        ],
        run_dir / "kube-state-metrics.log",
    )
    server.start()
    running = KubeStateMetrics(f"http://127.0.0.1:{port}", server)
    try:
        server.wait_until(
            lambda: http_refusal(f"{running.url}/metrics"), timeout, "serving /metrics"
        )
        yield running
    finally:
        server.stop()
