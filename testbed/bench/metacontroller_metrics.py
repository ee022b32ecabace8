"""Which series a real Metacontroller serves, with which labels, while its hook works, while
every hook pod is down and while the hook answers 500; and what its standby serves.

The alerts of ``deploy/monitoring/alerts.rules.yaml`` must select series that exist. Reading
Metacontroller's source says which ones it *registers*; this scrapes the binary itself
(``--metrics-address``, on a loopback port) in the states an on-call person must be told
about, so the names, the label sets and how each counter moves are seen, not inferred:

1. **healthy**: the hook answers (through a relay of this script, so that it can fail);
2. **hook down**: the relay's port refuses connections (every hook pod gone);
3. **hook 500**: the relay answers every call with HTTP 500;
4. **standby**: a second process with ``--leader-election`` beside the leader;
5. **hook Deployment unavailable**: kube-state-metrics' own Deployment series for a
   ``pg-failover-hook`` Deployment none of whose Pods runs (no scheduler here), the series
   the alert on every hook pod down selects.

Nothing but the control plane, the hook under gunicorn, the binary and the relay runs (no
Patroni: with no member Pods the hook answers every sync 200 with ``NoMembers``, which is
enough for Metacontroller to call it). Usage (the binary is built on the machine; nothing
here builds it)::

    flock /tmp/pgfh-heavy.lock env PGFH_METACONTROLLER_BINARY=/path/to/metacontroller \\
        .venv/bin/python -m testbed.bench.metacontroller_metrics --out /tmp/mc-metrics

It prints, per state, every Metacontroller, work queue and leader election sample of the
hook's controller, and writes each full exposition to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from testbed.kubernetes import ControlPlane, start_control_plane
from testbed.kubernetes.accounts import metacontroller_kubeconfig
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.kubernetes.servers import Server, http_refusal
from testbed.metacontroller.gunicorn import GunicornHook, free_port
from testbed.metacontroller.harness import rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, PARENT_API, PARENTS, cluster_resource
from testbed.metacontroller.kube_setup import install
from testbed.metacontroller.metacontroller_binary import MetacontrollerBinary, binary_from_env

#: The families an alert may select (the rest are Go runtime and process series).
PREFIXES = (
    "metacontroller_",
    "workqueue_",
    "leader_election_",
    "rest_client_requests_total",
    "kube_deployment_",
)
#: How long each state lasts before it is scraped.
DWELL = 25.0


class Relay:
    """The hook's URL as Metacontroller knows it: forwards to the hook, refuses connections
    (``down``), or answers 500 (``fail``)."""

    def __init__(self, hook: GunicornHook) -> None:
        self.hook = hook
        self.port = free_port()
        self.mode = "forward"
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def listen(self) -> None:
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if relay.mode == "fail":
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                answer = requests.post(
                    relay.hook.url + self.path,
                    data=body,
                    headers=headers,
                    timeout=10,
                    verify=relay.hook.verify,
                )
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("Content-Type", ""))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, format: str, *args: object) -> None:
                return

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def metrics_url(binary: MetacontrollerBinary) -> str:
    (address,) = [a.split("=", 1)[1] for a in binary.args if a.startswith("--metrics-address=")]
    return f"http://{address}/metrics"


def interesting(exposition: str) -> list[str]:
    """The samples an alert may select, one line each: ``name{labels} value``."""
    lines = []
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if not sample.name.startswith(PREFIXES) or sample.name.endswith("_bucket"):
                continue
            if sample.name.startswith("workqueue_") and not str(
                sample.labels.get("name", "")
            ).startswith("CompositeController-"):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            lines.append(f"{sample.name}{{{labels}}} {sample.value:g}")
    return lines


def scrape(binary: MetacontrollerBinary, state: str, out: Path) -> None:
    text = requests.get(metrics_url(binary), timeout=5).text
    (out / f"{state}.prom").write_text(text)
    print(f"\n## {state} ({time.strftime('%H:%M:%S', time.gmtime())} UTC)", flush=True)
    for line in interesting(text):
        print(f"  {line}", flush=True)


@contextlib.contextmanager
def standby_of(binary: MetacontrollerBinary, work: Path) -> Iterator[MetacontrollerBinary]:
    """A second process with the same arguments but ports of its own: it waits for the
    lease the first one holds."""
    args = [a for a in binary.args if not a.startswith(("--metrics-address", "--health-probe"))]
    args += [
        f"--metrics-address=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{free_port()}",
    ]
    standby = MetacontrollerBinary(binary.binary, binary.kubeconfig, work / "standby.log", args)
    standby.start()
    try:
        yield standby
    finally:
        standby.stop()


def hook_deployment(namespace: str) -> dict[str, object]:
    """A Deployment named as deploy/base's, whose Pods never run (nothing schedules them)."""
    labels = {"app.kubernetes.io/name": "pg-failover-hook"}
    container = {"name": "hook", "image": "pg-failover-hook"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "pg-failover-hook", "namespace": namespace},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def scrape_deployments(plane: ControlPlane, admin: KubeRest, work: Path, out: Path) -> None:
    """kube-state-metrics (the pinned build, its built-in Deployment metrics only) on a
    hook Deployment with no available replica."""
    namespace = "pg-failover-hook"
    with contextlib.suppress(KubeApiError):
        admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    admin.create(resource_path("apps/v1", "deployments", namespace), hook_deployment(namespace))
    port, telemetry = free_port(), free_port()
    server = Server(
        "kube-state-metrics",
        [
            str(plane.binaries.path("kube-state-metrics")),
            f"--kubeconfig={plane.admin_kubeconfig}",
            "--resources=deployments",
            "--host=127.0.0.1",
            f"--port={port}",
            "--telemetry-host=127.0.0.1",
            f"--telemetry-port={telemetry}",
        ],
        work / "kube-state-metrics.log",
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        server.wait_until(lambda: http_refusal(url), 60, "serving /metrics")
        time.sleep(5)
        text = requests.get(url, timeout=5).text
        (out / "ksm-deployments.prom").write_text(text)
        print("\n## kube-state-metrics, the hook Deployment with no Pod running", flush=True)
        for line in interesting(text):
            if 'deployment="pg-failover-hook"' in line:
                print(f"  {line}", flush=True)
    finally:
        server.stop()


def run(out: Path, dwell: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="pgfh-mc-metrics-"))
    out.mkdir(parents=True, exist_ok=True)
    plane = start_control_plane(work / "controlplane")
    (work / "hook").mkdir()
    try:
        with rig_hook(work / "hook", env=HOOK_ENV) as hook:
            relay = Relay(hook)
            relay.listen()
            admin = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
            install(admin, relay.url, hook.token)
            namespace = f"mc-metrics-{uuid.uuid4().hex[:6]}"
            admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
            admin.create(resource_path(PARENT_API, PARENTS, namespace), cluster_resource(namespace))
            binary = binary_from_env(metacontroller_kubeconfig(plane), work, namespace)
            if binary is None:
                raise SystemExit("PGFH_METACONTROLLER_BINARY is not set")
            print(f"binary {binary.binary} {' '.join(binary.args)}; log {binary.log_path}")
            binary.start()
            try:
                time.sleep(dwell)
                scrape(binary, "healthy", out)
                relay.close()
                time.sleep(dwell)
                scrape(binary, "hook-down", out)
                relay.mode = "fail"
                relay.listen()
                time.sleep(dwell)
                scrape(binary, "hook-500", out)
                with standby_of(binary, work) as standby:
                    time.sleep(5)
                    scrape(standby, "standby", out)
                scrape_deployments(plane, admin, work, out)
            finally:
                binary.stop()
                relay.close()
                admin.close()
    finally:
        plane.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/mc-metrics"))
    parser.add_argument("--dwell", type=float, default=DWELL, help="seconds in each state")
    args = parser.parse_args(argv)
    run(args.out, args.dwell)
    return 0


if __name__ == "__main__":
    sys.exit(main())
