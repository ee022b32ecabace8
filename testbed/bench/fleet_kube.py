"""The fleet on the REAL control plane, driven by the Metacontroller stand-in or by a real
Metacontroller binary: one command for the next calibration of ``testbed/bench/fleet_model.py``.

What runs (all on loopback, all stopped at the end):

* the project's control plane (real kube-apiserver, kube-controller-manager, etcd:
  :mod:`testbed.kubernetes`) and the test Pod network (:mod:`testbed.kubernetes.podnet`);
* the hook under its production gunicorn config (2 workers x 16 threads, as
  ``deploy/base/deployment.yaml``), with the CompositeController as shipped (hooks moved to
  loopback; ``resyncPeriodSeconds`` as shipped, or ``--resync-period``);
* N PostgreSQLClusters of 3 member Pods each, laid out in one namespace, in 100, or one per
  namespace (``--layout``); the Pods' status is written here (Running, Pod IP, Ready), as a
  kubelet would, without a thread per Pod;
* fake Patroni members (:func:`testbed.fakes.patroni_fast.fleet_members`, one asyncio process):
  every
  cluster's 3 members on the same 3 loopback addresses 127.0.0.231-233 (Pod IPs
  198.18.0.231-233 through the Pod network's map) and a port of their own per cluster
  (``spec.patroni.port``; the hook is told ``PGFH_ALLOWED_PATRONI_PORTS=1024-65535``). The
  Pod network maps only a /24, and widening it would change a machine-wide nftables table
  other runs use at the same time; a port per cluster reaches any N with 3 addresses;
* Metacontroller: a real binary when ``PGFH_METACONTROLLER_BINARY`` names one (run as its
  least-privilege ServiceAccount with ``deploy/metacontroller-values.yaml``'s flags:
  :mod:`testbed.metacontroller.metacontroller_binary`), else the stand-in
  (:mod:`testbed.metacontroller.kube`) in a
  process of its own, so that its CPU is its own.

Measured in a window of ``--duration`` s after every cluster's Service selects its first
leader: syncs/s asked (N / poll, or with ``--dcs-churn`` N / 30 s + every Pod's patch) vs
served (the hook's access log), Metacontroller's CPU (``/proc/<pid>/stat``) per sync and in
cores, its RSS, the hook's CPU, Metacontroller's work queue (wait and work from its
``workqueue_*`` series), and the lag from a switchover to the Service's selector naming the
new leader (seen on a watch):

* **event-less**: the fake members swap the leader and no Pod changes (a DCS other than
  Kubernetes'): only the hook's poll (``resyncAfterSeconds``) finds it;
* **Pod event**: the members swap and a Pod changes at once: the old leader's Pod turns
  NotReady (a killed leader), or with ``--dcs-churn`` the role labels move (Patroni's
  Kubernetes DCS).

``--dcs-churn`` patches every member Pod's ``status`` annotation every 10 s, with Patroni's
``role`` labels on the Pods, as Patroni's Kubernetes DCS does. ``--pprof`` starts the binary
with ``--pprof-address`` and saves a CPU profile of the window, and prints its top functions
(``go tool pprof -top``). The cost of ``resyncPeriodSeconds`` is measured side by side: run
with ``--resync-period 0`` (absent) and with the shipped 60 s.

Usage (the control plane and many processes: take the machine's lock)::

    flock /tmp/pgfh-heavy.lock .venv/bin/python -m testbed.bench.fleet_kube --clusters 200
    PGFH_METACONTROLLER_BINARY=/path/to/metacontroller flock /tmp/pgfh-heavy.lock \\
        .venv/bin/python -m testbed.bench.fleet_kube --clusters 1000 --poll 5 --pprof

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import multiprocessing.synchronize
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYOUTS = ("one-namespace", "100-namespaces", "per-namespace")
MEMBERS = 3
#: Members listen on 127.0.0.231-233 (Pod IPs 198.18.0.231-233): no test or benchmark uses them.
FIRST_HOST = 231
EVENTLESS = "event-less"
POD_EVENT = "pod-event"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
ROLE_LABEL = "role"
#: Patroni's Kubernetes DCS: each member patches its Pod every loop_wait (10 s by default).
CHURN_PERIOD = 10.0
#: The hook's healthy resync while the role labels agree (the CRD's eventDrivenResyncSeconds).
EVENT_DRIVEN_RESYNC = 30.0
WORKQUEUE = "CompositeController-pg-failover-hook"


# ------------------------------------------------------------------ pure parts


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
    from testbed.metacontroller.kube_rig import patroni_pod

    name = cluster_name(index)
    labels = {
        "application": "patroni",
        "cluster-name": name,
        POD_NAME_LABEL: pod_name(index, member),
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
        readiness=False,
    )


def pod_status(pod_ip: str, ready: bool) -> dict[str, Any]:
    """What a kubelet writes for a running member (``ready``: its readiness probe)."""
    flag = "True" if ready else "False"
    return {
        "phase": "Running",
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "hostIP": "127.0.0.1",
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "PodScheduled", "status": "True"},
            {"type": "ContainersReady", "status": flag},
            {"type": "Ready", "status": flag},
        ],
    }


def parent(index: int, namespace: str, port: int, poll: float) -> dict[str, Any]:
    name = cluster_name(index)
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name, "namespace": namespace},
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


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank (``q`` in 0..100)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def lag_summary(values: Sequence[float], missed: int = 0) -> str:
    """``p50/p90/p99/max`` in seconds, and how many never moved within the wait."""
    if not values:
        return f"none measured{f' ({missed} not moved)' if missed else ''}"
    parts = "/".join(f"{percentile(values, q):.2f}" for q in (50, 90, 99))
    text = f"p50/p90/p99/max {parts}/{max(values):.2f} s (n={len(values)})"
    return text + (f", {missed} not moved" if missed else "")


def syncs_asked(clusters: int, poll: float, churn: bool, period: int | None) -> float:
    """The syncs a second the fleet asks for: each polled cluster one a poll; with churn the
    event-driven resync plus one per Pod patch; plus the resyncPeriodSeconds tick's share."""
    base = (
        clusters / EVENT_DRIVEN_RESYNC + clusters * MEMBERS / CHURN_PERIOD
        if churn
        else (clusters / poll)
    )
    return base + (clusters / period if period else 0.0)


class Lags:
    """Switchovers in flight and their lags: a switchover is done when the cluster's Service
    selector first names the new leader's Pod after the switch (thread safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: dict[str, tuple[float, str, str]] = {}
        self.done: dict[str, list[float]] = {EVENTLESS: [], POD_EVENT: []}
        self.selected: dict[str, str] = {}

    def expect(self, service: str, pod: str, kind: str, at: float) -> None:
        with self._lock:
            self.pending[service] = (at, pod, kind)

    def observe(self, service: str, selected: str | None, now: float) -> None:
        with self._lock:
            if selected is None:
                return
            self.selected[service] = selected
            pending = self.pending.get(service)
            if pending is not None and pending[1] == selected:
                del self.pending[service]
                self.done[pending[2]].append(now - pending[0])

    def missed(self, kind: str) -> int:
        with self._lock:
            return sum(1 for _, _, k in self.pending.values() if k == kind)

    def count_selecting(self, wanted: dict[str, str]) -> int:
        with self._lock:
            return sum(1 for s, pod in wanted.items() if self.selected.get(s) == pod)


def workqueue_figures(exposition: str, name: str = WORKQUEUE) -> dict[str, float]:
    """Sums and counts of the controller's ``workqueue_*`` histograms, its depth and adds."""
    from prometheus_client.parser import text_string_to_metric_families

    figures: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "rest_client_requests_total":  # client-go's, by method
                key = f"api:{sample.labels.get('method', '?')}"
                figures[key] = figures.get(key, 0.0) + sample.value
                continue
            if sample.labels.get("name") != name or sample.name.endswith("_bucket"):
                continue
            figures[sample.name] = figures.get(sample.name, 0.0) + sample.value
    return figures


def queue_line(before: dict[str, float], after: dict[str, float]) -> str:
    def mean(metric: str) -> str:
        count = after.get(f"{metric}_count", 0.0) - before.get(f"{metric}_count", 0.0)
        total = after.get(f"{metric}_sum", 0.0) - before.get(f"{metric}_sum", 0.0)
        return f"{total / count * 1000:.1f} ms (n={count:.0f})" if count else "n/a"

    return (
        f"queue wait mean {mean('workqueue_queue_duration_seconds')}, "
        f"work mean {mean('workqueue_work_duration_seconds')}, "
        f"depth at end {after.get('workqueue_depth', 0):.0f}"
    )


#: The functions whose cumulative CPU the calibration needs (v4.17.2's names).
PROFILED = {
    "sync": "composite.(*parentController).syncParentObject",
    "related Pods listed": "customize.(*Manager).GetRelatedObjects",
    "findRelatedParents": "customize.(*Manager).findRelatedParents",
    "hook call (JSON)": "composite.(*parentController).callHook",
    "status update": "composite.(*parentController).updateParentStatus",
    "claim children": "composite.(*parentController).claimChildren",
}


def profiled_costs(top_cum: str, syncs: float) -> dict[str, tuple[float, float]]:
    """From ``go tool pprof -top -cum``: each of :data:`PROFILED`'s cumulative CPU (s) and
    per sync (ms), ``syncs`` being the syncs served while it profiled."""
    found: dict[str, tuple[float, float]] = {}
    for line in top_cum.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        for label, function in PROFILED.items():
            if label in found or not fields[-1].endswith(function):
                continue
            cum = fields[3]
            seconds = float(cum[:-2]) / 1000 if cum.endswith("ms") else float(cum.rstrip("s"))
            found[label] = (seconds, seconds / syncs * 1000 if syncs else float("nan"))
    return found


def api_per_sync(before: dict[str, float], after: dict[str, float], syncs: float) -> str:
    """Metacontroller's API requests in the window per sync served, by method."""
    methods = sorted(k for k in after if k.startswith("api:"))
    if not methods or not syncs:
        return "n/a"
    return ", ".join(
        f"{k[4:]} {(after[k] - before.get(k, 0.0)) / syncs:.2f}"
        for k in methods
        if after[k] - before.get(k, 0.0) > 0
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.bench.fleet_kube", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--clusters", type=int, default=20, help="PostgreSQLClusters (3 Pods)")
    parser.add_argument("--layout", choices=LAYOUTS, default="one-namespace")
    parser.add_argument("--poll", type=float, default=1.0, help="spec.switchover.pollSeconds")
    parser.add_argument("--duration", type=float, default=120.0, help="measured window (s)")
    parser.add_argument("--switchovers", type=int, default=20, help="in the window")
    parser.add_argument(
        "--resync-period",
        type=int,
        default=None,
        help="resyncPeriodSeconds (0: absent; default: as shipped)",
    )
    parser.add_argument("--dcs-churn", action="store_true", help="Kubernetes DCS Pod churn")
    parser.add_argument("--pprof", action="store_true", help="profile the binary's window")
    parser.add_argument("--pprof-out", type=Path, help="where to keep the profile")
    parser.add_argument("--settle", type=float, default=None, help="wait for convergence (s)")
    parser.add_argument("--wait", type=float, default=30.0, help="after the window, for lags")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--model", action="store_true", help="also the fleet model of the same settings"
    )
    parser.add_argument(
        "--model-only", action="store_true", help="only the model (no control plane)"
    )
    parser.add_argument(
        "--hook-cpu", type=float, default=0.005, help="hook CPU a sync for the model (s)"
    )
    args = parser.parse_args(argv)
    if args.clusters < 1 or args.clusters > 20000:
        parser.error("--clusters must be 1..20000")
    if args.poll < 0.3 or args.duration <= 0 or args.switchovers < 0:
        parser.error("--poll >= 0.3 (the CRD's minimum), --duration > 0, --switchovers >= 0")
    if args.pprof and not args.model_only and not os.environ.get("PGFH_METACONTROLLER_BINARY"):
        parser.error("--pprof profiles a real binary: set PGFH_METACONTROLLER_BINARY")
    return args


#: Hook sync latencies for the model (s): around the calibration of docs/scale.md's table.
MODEL_LATENCIES = [0.004, 0.005, 0.006, 0.006, 0.007, 0.008, 0.010, 0.014]


def model_row(args: argparse.Namespace, period: int | None) -> Any:
    """The fleet model's row of this run's settings: the shipped flags with the run's period,
    Metacontroller's calibrated cost (:data:`testbed.bench.fleet_settings.V4_17_2_COST`), one hook
    pod (this run's one gunicorn), the run's namespaces; polled clusters (or, with churn,
    busy Kubernetes-DCS ones), half the switchovers a leader's stop (its Pod changes)."""
    from dataclasses import replace

    from testbed.bench.fleet_settings import SHIPPED, V4_17_2_COST, Mix, Policy, Row

    mix = Mix(polled=0.0, busy=1.0, stops=0.5) if args.dcs_churn else Mix(polled=1.0, stops=0.5)
    return Row(
        f"model of fleet_kube {args.layout}",
        args.clusters,
        replace(SHIPPED, resync_period=period, cost=V4_17_2_COST),
        Policy(poll=args.poll, event_resync=EVENT_DRIVEN_RESYNC, from_reply=False, spread=True),
        mix,
        hook_pods=1,
        namespaces=len(namespaces(args.clusters, args.layout)),
        duration=args.duration + 20,
        warmup=20.0,
        switchovers=args.switchovers,
        hook_cpu=args.hook_cpu,
    )


def model_lines(args: argparse.Namespace, period: int | None) -> list[str]:
    """The model of the run's settings twice: each process with cores of its own (a
    cluster), and Metacontroller and the hook on 2 shared cores (this machine)."""
    from dataclasses import replace

    row = model_row(args, period)
    return [
        *_model_lines(row, args.hook_cpu, "own cores"),
        *_model_lines(replace(row, shared_cores=2), args.hook_cpu, "2 cores shared, as here"),
    ]


def _model_lines(row: Any, hook_cpu: float, cores: str) -> list[str]:
    from testbed.bench.fleet_model import EVENTLESS as MODEL_EVENTLESS
    from testbed.bench.fleet_model import POD_CHANGING, run_modelled

    result = run_modelled(row, MODEL_LATENCIES, hook_cpu)

    def lags(klass: str) -> str:
        values = result.lags[klass]
        return lag_summary(values, result.unfinished[klass])

    per_sync = result.mc_cores / result.syncs_per_second * 1000 if result.syncs_per_second else 0
    return [
        f"model (same settings, {row.namespaces} namespaces, Metacontroller's calibrated "
        f"cost, {cores}):",
        f"  syncs/s {result.syncs_per_second:.1f}; Metacontroller {result.mc_cores:.3f} cores, "
        f"{per_sync:.2f} ms a sync; hook {result.hook_cores:.3f} cores",
        f"  event-less switchover lag {lags(MODEL_EVENTLESS)}",
        f"  Pod-event lag {lags(POD_CHANGING)}",
        f"  queue wait p99 {result.queue_wait_p99:.2f} s",
    ]


def resync_period(args: argparse.Namespace) -> int | None:
    """The period the run uses: ``--resync-period`` (0: absent), else the shipped one."""
    if args.resync_period is not None:
        return args.resync_period or None
    import yaml

    from testbed.metacontroller.kube_setup import COMPOSITE_CONTROLLER

    period = yaml.safe_load(COMPOSITE_CONTROLLER.read_text())["spec"].get("resyncPeriodSeconds")
    return int(period) if period is not None else None


# ------------------------------------------------------------------ the I/O shell


def _standin_main(kubeconfig: str, stop: multiprocessing.synchronize.Event) -> None:
    """The stand-in in a process of its own (its CPU then is its own)."""
    from testbed.metacontroller.kube import KubeMetacontroller

    controller = KubeMetacontroller(Path(kubeconfig))
    controller.start(sync_timeout=120)
    try:
        stop.wait(7200)
    finally:
        controller.stop()


@dataclass
class Controller:
    """Metacontroller as this run has it: a binary or the stand-in's process."""

    pid: int
    stop: Callable[[], None]
    metrics_url: str | None = None
    pprof_url: str | None = None
    binary: Path | None = None
    log: Path | None = None


@contextlib.contextmanager
def metacontroller(
    kubeconfig: Path, work_dir: Path, system_ns: str, pprof: bool
) -> Iterator[Controller]:
    from testbed.metacontroller.gunicorn import free_port
    from testbed.metacontroller.metacontroller_binary import binary_from_env

    binary = binary_from_env(kubeconfig, work_dir, system_ns)
    if binary is not None:
        pprof_url = None
        if pprof:
            address = f"127.0.0.1:{free_port()}"
            binary.args.append(f"--pprof-address={address}")
            pprof_url = f"http://{address}/debug/pprof/profile"
        binary.start()
        assert binary.process is not None
        (address,) = [a.split("=", 1)[1] for a in binary.args if a.startswith("--metrics-address=")]
        try:
            yield Controller(
                binary.process.pid,
                binary.stop,
                f"http://{address}/metrics",
                pprof_url,
                binary.binary,
                binary.log_path,
            )
        finally:
            binary.stop()
        return
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    process = context.Process(
        target=_standin_main, args=(str(kubeconfig), stop), name="standin", daemon=True
    )
    process.start()
    assert process.pid is not None

    def stop_it() -> None:
        stop.set()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(5)

    try:
        yield Controller(process.pid, stop_it)
    finally:
        stop_it()


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_cpu(pid: int) -> float:
    from testbed.bench.common import children, cpu_seconds

    return sum(cpu_seconds(p) for p in [pid, *children(pid)])


@dataclass
class Fleet:
    """The clusters' objects and how to change them (Pods written by per-thread clients)."""

    kubeconfig: Path
    layout: str
    clusters: int
    prefix: str
    churn: bool
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
                {"status": pod_status(self.pod_ip(member), True)},
            )
        from testbed.kubernetes.rest import resource_path

        rest.create(resource_path(PARENT_API, PARENTS, ns), parent(index, ns, port, poll))

    def set_ready(self, index: int, member: int, ready: bool) -> None:
        self.rest().strategic_patch(
            self.pod_path(index, member, "/status"),
            {"status": {"conditions": pod_status(self.pod_ip(member), ready)["conditions"][2:]}},
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


@dataclass
class Window:
    """Counters at the start of the measured window."""

    at: float
    mc_cpu: float
    hook_cpu: float
    own_cpu: float
    syncs: float
    queue: dict[str, float]


def hook_syncs(url: str) -> float:
    """Sync and finalize calls the hook answered (its ``pgfh_sync_duration_seconds_count``):
    the same on the stand-in and on a binary."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pgfh_sync_duration_seconds_count"
    )


def scrape(url: str | None) -> dict[str, float]:
    import requests

    if url is None:
        return {}
    try:
        return workqueue_figures(requests.get(url, timeout=10).text)
    except requests.RequestException:
        return {}


def window(controller: Controller, hook_pid: int, hook_url: str) -> Window:
    from testbed.bench.common import cpu_seconds

    return Window(
        time.monotonic(),
        cpu_seconds(controller.pid),
        tree_cpu(hook_pid),
        cpu_seconds(os.getpid()),
        hook_syncs(hook_url),
        scrape(controller.metrics_url),
    )


def profile(controller: Controller, seconds: int, out: Path, result: list[str]) -> None:
    """Fetch the binary's CPU profile of ``seconds`` to ``out``; its top functions into
    ``result``."""
    import requests

    assert controller.pprof_url is not None
    try:
        answer = requests.get(f"{controller.pprof_url}?seconds={seconds}", timeout=seconds + 30)
        answer.raise_for_status()
        out.write_bytes(answer.content)
    except requests.RequestException as error:
        result.append(f"pprof failed: {error}")
        return
    go = shutil.which("go") or "/usr/local/go/bin/go"
    top = subprocess.run(
        [go, "tool", "pprof", "-top", "-nodecount=25", str(controller.binary), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    result.append(top.stdout or top.stderr)
    cum = subprocess.run(
        [go, "tool", "pprof", "-top", "-cum", "-nodecount=400", str(controller.binary), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    result.append(cum.stdout or cum.stderr)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from testbed.fakes.patroni_fast import fleet_members
    from testbed.kubernetes import start_control_plane
    from testbed.kubernetes.accounts import metacontroller_kubeconfig
    from testbed.kubernetes.kubelet import KubeletStandIn
    from testbed.kubernetes.podnet import ensure_pod_network
    from testbed.kubernetes.rest import KubeApiError, KubeRest
    from testbed.metacontroller.gunicorn import gunicorn_hook
    from testbed.metacontroller.kube_setup import install
    from testbed.metacontroller.reflector import Reflector

    period = resync_period(args)
    clusters: int = args.clusters
    work_dir = Path(tempfile.mkdtemp(prefix="pgfh-bench-fleet-kube-"))
    prefix = f"fleet-{uuid.uuid4().hex[:4]}"
    system_ns = f"{prefix}-system"
    names = [[pod_name(c, m) for m in range(MEMBERS)] for c in range(clusters)]
    lags = Lags()
    figures: dict[str, Any] = {"clusters": clusters, "layout": args.layout, "poll": args.poll}
    hook_env = {
        "PGFH_ALLOWED_POD_CIDRS": "198.18.0.0/24",
        "PGFH_ALLOWED_PATRONI_PORTS": "1024-65535",
        "PGFH_LOG_LEVEL": "WARNING",
    }
    ensure_pod_network()
    print(f"  work dir {work_dir}", flush=True)
    lifetime = 600 + args.duration + args.wait + clusters * 0.5
    with contextlib.ExitStack() as stack:
        plane = start_control_plane(work_dir / "controlplane", log=lambda line: print(f"  {line}"))
        stack.callback(plane.stop)
        admin = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
        stack.callback(admin.close)
        members = stack.enter_context(
            fleet_members(
                clusters,
                MEMBERS,
                lifetime,
                hosts=[member_host(m) for m in range(MEMBERS)],
                member_names=names,
            )
        )
        hook_dir = work_dir / "hook"
        hook_dir.mkdir()
        hook = stack.enter_context(gunicorn_hook(hook_dir, env=hook_env, workers=2, threads=16))
        install(admin, hook.url, hook.token, {"resyncPeriodSeconds": period})
        KubeletStandIn(admin, "pgfh-fleet-node").register_node()  # podgc keeps bound Pods
        for ns in [system_ns, *namespaces(clusters, args.layout, prefix)]:
            admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})

        def delete_namespaces() -> None:
            for ns in [system_ns, *namespaces(clusters, args.layout, prefix)]:
                with contextlib.suppress(KubeApiError, OSError):
                    admin.delete(f"/api/v1/namespaces/{ns}")

        stack.callback(delete_namespaces)
        fleet = Fleet(plane.admin_kubeconfig, args.layout, clusters, prefix, args.dcs_churn)
        fleet.leaders = [0] * clusters
        stack.callback(fleet.close)

        def on_service(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            meta = obj["metadata"]
            if kind == "DELETED" or not str(meta.get("namespace", "")).startswith(prefix):
                return
            selector = (obj.get("spec") or {}).get("selector") or {}
            lags.observe(
                f"{meta['namespace']}/{meta['name']}",
                selector.get(POD_NAME_LABEL),
                time.monotonic(),
            )

        services = Reflector(admin, "/api/v1/services", on_service, name="services").start()
        stack.callback(services.stop)
        services.wait_synced(30)
        created = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda c: fleet.create_cluster(c, members.ports[c], args.poll), range(clusters)
                )
            )
        figures["create_s"] = round(time.monotonic() - created, 1)
        print(f"  {clusters} clusters created in {figures['create_s']} s", flush=True)
        controller = stack.enter_context(
            metacontroller(metacontroller_kubeconfig(plane), work_dir, system_ns, args.pprof)
        )
        started = time.monotonic()
        wanted = {
            f"{fleet.ns(c)}/{cluster_name(c)}-primary": pod_name(c, 0) for c in range(clusters)
        }
        settle = args.settle if args.settle is not None else 120 + clusters * 0.3
        while lags.count_selecting(wanted) < clusters:
            if time.monotonic() - started > settle:
                raise TimeoutError(
                    f"{lags.count_selecting(wanted)} of {clusters} Services selected their "
                    f"leader within {settle:.0f} s of Metacontroller's start"
                )
            time.sleep(0.5)
        figures["converged_s"] = round(time.monotonic() - started, 1)
        print(f"  every Service on its leader {figures['converged_s']} s after start", flush=True)
        time.sleep(5)  # the first syncs' status writes settle
        churn = None
        if args.dcs_churn:
            churn = Churn(fleet, time.monotonic() + args.duration + args.wait + 30).start()
            stack.callback(churn.stop)
            time.sleep(CHURN_PERIOD)  # one full period of churn before the window
        switches = plan(clusters, args.switchovers, args.duration, args.seed)
        before = window(controller, hook.process.pid, hook.url)
        pprof_result: list[str] = []
        profiler = None
        if controller.pprof_url is not None:
            seconds = int(min(30, max(5, args.duration - 5)))
            profiler = threading.Thread(
                target=profile,
                args=(controller, seconds, work_dir / "metacontroller.cpu.pprof", pprof_result),
                daemon=True,
            )
            profiler.start()
        restore: list[tuple[float, int, int]] = []
        beat = 10_000
        for switch in switches:
            delay = before.at + switch.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for due, index, member in [r for r in restore if r[0] <= time.monotonic()]:
                restore.remove((due, index, member))
                with contextlib.suppress(KubeApiError):
                    fleet.set_ready(index, member, True)
            c = switch.cluster
            old = fleet.leaders[c]
            new = (old + 1) % MEMBERS
            service = f"{fleet.ns(c)}/{cluster_name(c)}-primary"
            members.set_leader(c, new)
            fleet.leaders[c] = new
            at = time.monotonic()
            lags.expect(service, pod_name(c, new), switch.kind, at)
            if switch.kind == POD_EVENT:
                if args.dcs_churn:
                    beat += 1
                    fleet.set_role(c, old, "replica", beat)
                    fleet.set_role(c, new, "primary", beat)
                else:
                    fleet.set_ready(c, old, False)  # the killed leader's Pod
                    restore.append((at + 10, c, old))
        remaining = before.at + args.duration - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        after = window(controller, hook.process.pid, hook.url)
        wait_until = time.monotonic() + args.wait
        while lags.pending and time.monotonic() < wait_until:
            time.sleep(0.5)
        if profiler is not None:
            profiler.join(120)
        elapsed = after.at - before.at
        syncs = after.syncs - before.syncs
        mc_cpu = after.mc_cpu - before.mc_cpu
        figures.update(
            {
                "metacontroller": "binary" if controller.binary else "stand-in",
                "resync_period": period,
                "dcs_churn": args.dcs_churn,
                "window_s": round(elapsed, 1),
                "syncs_asked_per_s": round(
                    syncs_asked(clusters, args.poll, args.dcs_churn, period), 1
                ),
                "syncs_served_per_s": round(syncs / elapsed, 1),
                "mc_cores": round(mc_cpu / elapsed, 3),
                "mc_ms_per_sync": round(mc_cpu / syncs * 1000, 2) if syncs else None,
                "mc_rss_mib": round(rss_mib(controller.pid), 1),
                "hook_cores": round((after.hook_cpu - before.hook_cpu) / elapsed, 3),
                "hook_ms_per_sync": round((after.hook_cpu - before.hook_cpu) / syncs * 1000, 2)
                if syncs
                else None,
                "harness_cores": round((after.own_cpu - before.own_cpu) / elapsed, 3),
                "eventless_lag": lag_summary(lags.done[EVENTLESS], lags.missed(EVENTLESS)),
                "pod_event_lag": lag_summary(lags.done[POD_EVENT], lags.missed(POD_EVENT)),
                "eventless_lags": [round(v, 3) for v in lags.done[EVENTLESS]],
                "pod_event_lags": [round(v, 3) for v in lags.done[POD_EVENT]],
                "queue": queue_line(before.queue, after.queue) if after.queue else "n/a (stand-in)",
                "api_per_sync": api_per_sync(before.queue, after.queue, syncs),
                "load_average_1m": round(os.getloadavg()[0], 1),
            }
        )
        if churn is not None:
            figures["churn_patches_per_s"] = round(
                churn.patches / max(1.0, time.monotonic() - before.at + CHURN_PERIOD), 1
            )
            figures["churn_late"] = churn.late
        if pprof_result:
            profiled = int(min(30, max(5, args.duration - 5)))
            if len(pprof_result) > 1:
                costs = profiled_costs(pprof_result[1], figures["syncs_served_per_s"] * profiled)
                figures["pprof_ms_per_sync"] = {k: round(v[1], 3) for k, v in costs.items()}
                pprof_result[1] = "\n".join(pprof_result[1].splitlines()[:40])
            figures["pprof_top"] = pprof_result
            if args.pprof_out is not None:
                shutil.copy(work_dir / "metacontroller.cpu.pprof", args.pprof_out)
        if controller.log is not None and controller.log.exists():
            figures["mc_log_errors"] = sum(
                1
                for line in controller.log.read_text(errors="replace").splitlines()
                if '"error"' in line
            )
    return figures


def report(figures: dict[str, Any]) -> list[str]:
    """The run's figures, one per line (the lags' raw values stay in the JSON)."""
    lines = [
        f"{figures['metacontroller']}, {figures['clusters']} clusters, {figures['layout']}, "
        f"poll {figures['poll']:g} s, resyncPeriodSeconds {figures['resync_period'] or 'absent'}"
        f"{', DCS churn' if figures['dcs_churn'] else ''}; window {figures['window_s']} s",
        f"  syncs/s asked {figures['syncs_asked_per_s']}, served {figures['syncs_served_per_s']}",
        f"  Metacontroller {figures['mc_cores']} cores, {figures['mc_ms_per_sync']} ms CPU a sync, "
        f"RSS {figures['mc_rss_mib']} MiB",
        f"  hook {figures['hook_cores']} cores, {figures['hook_ms_per_sync']} ms a sync; "
        f"this harness {figures['harness_cores']} cores",
        f"  event-less switchover lag {figures['eventless_lag']}",
        f"  Pod-event lag {figures['pod_event_lag']}",
        f"  Metacontroller {figures['queue']}",
        f"  Metacontroller's API requests a sync: {figures.get('api_per_sync', 'n/a')}",
    ]
    if "pprof_ms_per_sync" in figures:
        costs = ", ".join(f"{k} {v} ms" for k, v in figures["pprof_ms_per_sync"].items())
        lines.append(f"  profile, CPU per sync served: {costs}")
    if "churn_patches_per_s" in figures:
        lines.append(
            f"  churn {figures['churn_patches_per_s']} Pod patches/s ({figures['churn_late']} late)"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model_only:
        for line in model_lines(args, resync_period(args)):
            print(line, flush=True)
        return 0
    figures = run(args)
    for line in report(figures):
        print(line, flush=True)
    for text in figures.pop("pprof_top", []):
        print(text, flush=True)
    print(json.dumps(figures), flush=True)
    if args.model:
        for line in model_lines(args, resync_period(args)):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
