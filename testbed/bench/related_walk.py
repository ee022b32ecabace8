"""Metacontroller's related-object event path at fleet size, on the real binary.

Every Pod (and Service) event of the cluster runs ``findRelatedParents``
(``pkg/controller/common/customize/manager.go`` 353-397, v4.17.2) on the Pod informer's single
handler goroutine: it walks every parent of the parent informer and matches each parent's
customize rules. This bench measures what one parent costs per event for each customize-reply
shape the product could send, and the Pod-event lag under churn:

* N PostgreSQLClusters (3 member Pods each, labelled with the cluster's ``primarySelector``)
  over K namespaces, plus ``--bystanders`` Pods that no parent relates;
* a bench hook on loopback: ``/customize`` answers the chosen shape (built by the product's own
  :func:`hooks.parts.related_rules` and :func:`hooks.core.scope.serves`), ``/sync`` answers at
  once and records when each parent's sync arrived (so only Metacontroller's cost is measured,
  not the product's probe round);
* the real binary (``PGFH_METACONTROLLER_BINARY``) with ``deploy/metacontroller-values.yaml``'s
  arguments and ``--pprof-address``, restarted for each shape (its customize cache is keyed by
  parent UID and generation, so a new shape needs a new process);
* churn: annotation patches at R/s (Patroni's Kubernetes DCS writes its member status into
  the Pod's annotations every ``loop_wait``) on member Pods or on bystanders; every 0.5 s a
  probe flips a label on one member Pod (a role change) and the lag is the time until that
  parent's sync reaches the hook.

Figures: Metacontroller CPU per event (``/proc/<pid>/stat``), the CPU in
``findRelatedParents`` per parent per event (a CPU profile over the churn, ``go tool pprof``),
the probes' lag, and the start-up drain (the initial Pod adds × parents).

    flock /tmp/pgfh-heavy.lock env PGFH_METACONTROLLER_BINARY=/path/to/metacontroller \\
        python -m testbed.bench.related_walk --parents 1000 --rate 40 --seconds 20 \\
        --shapes labels,ns-labels,names,no-service,shard-aware
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from hooks.core.scope import serves
from hooks.loaders.envelope import load_customize_call
from hooks.shell.handler import handle_customize
from testbed.kubernetes import ControlPlane, start_control_plane
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.gunicorn import free_port
from testbed.metacontroller.kube_rig import patroni_pod
from testbed.metacontroller.kube_setup import MANAGER, apply_crds, local_controller
from testbed.metacontroller.metacontroller_binary import (
    ENV_BINARY,
    MetacontrollerBinary,
    command_args,
)

PARENT_API = "adg.io/v1alpha1"
PARENTS = "postgresqlclusters"
CC_PATH = "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers"
SHARD_LABEL = "pg-failover-hook.adg.io/shard"
#: The customize-reply shapes measured (see :func:`customize_answer`).
SHAPES = ("labels", "ns-labels", "names", "no-service", "shard-aware")


# ------------------------------------------------------------------ the shapes (pure)


def customize_answer(shape: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The customize reply of ``shape`` for a request ``body``.

    * ``labels``: what the product sent before this change (member Pods by label, without a
      namespace; the Service by name in the parent's namespace);
    * ``ns-labels``: the shipped rules (:func:`hooks.parts.related_rules`: the label rule
      scoped to the parent's namespace), answered for every parent;
    * ``names``: member Pods by ``names`` + namespace (the bench's Pods are ``<cluster>-0..2``);
    * ``no-service``: ``labels`` without the Service rule;
    * ``shard-aware``: the shipped handler (:func:`hooks.shell.handler.handle_customize`):
      ``ns-labels`` for parents the calling CompositeController serves, none for others.
    """
    if shape == "shard-aware":
        return handle_customize(body, request_id="bench").body
    _, spec, uid, scope = load_customize_call(body)
    shipped = handle_customize({**body, "controller": None}, request_id="bench").body[
        "relatedResources"
    ]
    parent = body["parent"]["metadata"]
    if spec is None:
        return {"relatedResources": []}
    pods = {"apiVersion": "v1", "resource": "pods"}
    service = {"apiVersion": "v1", "resource": "services", "names": [spec.service_name]}
    service["namespace"] = parent["namespace"]
    selector = {"matchLabels": dict(spec.primary_selector)}
    rules: list[dict[str, Any]]
    if shape == "ns-labels":
        rules = list(shipped)
    elif shape == "labels":
        rules = [{**pods, "labelSelector": selector}, service]
    elif shape == "no-service":
        rules = [{**pods, "labelSelector": selector}]
    elif shape == "names":
        names = [f"{parent['name']}-{i}" for i in range(3)]
        rules = [{**pods, "names": names, "namespace": parent["namespace"]}, service]
    else:
        raise ValueError(f"unknown shape {shape!r}")
    del uid, scope
    return {"relatedResources": rules}


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ the bench hook


@dataclass
class BenchHook:
    """``/customize`` answers ``shape``; ``/sync`` answers at once and records arrivals."""

    shape: str = "labels"
    port: int = field(default_factory=free_port)
    syncs: dict[str, list[float]] = field(default_factory=dict)
    customizes: int = 0
    answers: dict[tuple[str, object, object], dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> BenchHook:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                if self.path.startswith("/customize"):
                    meta = body["parent"]["metadata"]
                    key = (hook.shape, meta.get("uid"), meta.get("generation"))
                    with hook.lock:
                        hook.customizes += 1
                        reply = hook.answers.get(key)
                    if reply is None:
                        # Memoized: Metacontroller calls customize from the event handler
                        # with a 2 s timeout, and this bench hook shares a GIL with the
                        # patchers; the product's own answer is a few hundred µs.
                        reply = customize_answer(hook.shape, body)
                        with hook.lock:
                            hook.answers[key] = reply
                else:
                    meta = body["parent"]["metadata"]
                    with hook.lock:
                        hook.syncs.setdefault(meta["name"], []).append(time.monotonic())
                    reply = {"status": {}, "children": []}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024  # Metacontroller's 64 workers connect at once

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()

    def synced(self) -> int:
        with self.lock:
            return len(self.syncs)

    def first_sync_after(self, name: str, since: float) -> float | None:
        with self.lock:
            return next((t for t in self.syncs.get(name, ()) if t >= since), None)


# ------------------------------------------------------------------ the fleet


def parent_object(name: str, namespace: str, shard: int) -> dict[str, Any]:
    return {
        "apiVersion": PARENT_API,
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name, "namespace": namespace, "labels": {SHARD_LABEL: str(shard)}},
        "spec": {
            "primarySelector": {"application": "patroni", "cluster-name": name},
            "serviceRef": {"name": f"{name}-primary"},
            "healthCheckPath": "/primary",
        },
    }


def pod_object(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """An unscheduled Pod (no kubelet runs it: only its labels and changes matter here)."""
    return patroni_pod(name, namespace, labels, node=None, readiness=False)


@dataclass(frozen=True)
class Fleet:
    parents: int
    namespaces: int
    bystanders: int
    shards: int

    def namespace(self, i: int) -> str:
        return f"walk-{i % self.namespaces}"

    def members(self) -> list[tuple[str, str, str]]:
        """(namespace, pod, cluster) of every member Pod."""
        return [
            (self.namespace(i), f"pg-{i}-{m}", f"pg-{i}")
            for i in range(self.parents)
            for m in range(3)
        ]

    def bystander_pods(self) -> list[tuple[str, str]]:
        return [(self.namespace(i), f"other-{i}") for i in range(self.bystanders)]


def _retrying(call: Callable[[], object], tries: int = 50) -> None:
    for _ in range(tries):
        try:
            call()
            return
        except KubeApiError as error:
            if error.status == 409 and "already exists" in error.message:
                return
            if error.status not in (403, 404, 409, 429, 500):
                raise
            time.sleep(0.2)
    call()


def create_fleet(rest_pool: Sequence[KubeRest], fleet: Fleet) -> None:
    for n in range(fleet.namespaces):
        namespace = {"metadata": {"name": f"walk-{n}"}}
        _retrying(partial(rest_pool[0].create, "/api/v1/namespaces", namespace))
    posts: list[tuple[str, dict[str, Any]]] = []
    for ns, pod, cluster in fleet.members():
        labels = {"application": "patroni", "cluster-name": cluster}
        posts.append((resource_path("v1", "pods", ns), pod_object(pod, ns, labels)))
    for ns, pod in fleet.bystander_pods():
        body = pod_object(pod, ns, {"application": "other"})
        posts.append((resource_path("v1", "pods", ns), body))
    for i in range(fleet.parents):
        ns = fleet.namespace(i)
        body = parent_object(f"pg-{i}", ns, i % fleet.shards)
        posts.append((resource_path(PARENT_API, PARENTS, ns), body))
    _run_jobs(rest_pool, posts)


def _run_jobs(rest_pool: Sequence[KubeRest], posts: Sequence[tuple[str, dict[str, Any]]]) -> None:
    def run(k: int) -> None:
        path, body = posts[k]
        _retrying(partial(rest_pool[k % len(rest_pool)].create, path, body))

    with ThreadPoolExecutor(len(rest_pool)) as pool:
        for future in [pool.submit(run, k) for k in range(len(posts))]:
            future.result()


# ------------------------------------------------------------------ measuring


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics_url(args: Sequence[str]) -> str | None:
    """Metacontroller's /metrics from its ``--metrics-address`` argument."""
    for arg in args:
        if arg.startswith("--metrics-address="):
            return f"http://{arg.split('=', 1)[1]}/metrics"
    return None


#: Go runtime figures of Metacontroller's /metrics sampled each second of a churn.
GO_METRICS = ("go_gc_duration_seconds_sum", "go_gc_duration_seconds_count", "go_goroutines")


def machine_sample(pid: int, url: str | None) -> dict[str, float]:
    """Metacontroller's CPU, this bench process's CPU (patchers, probes and the bench hook
    share its GIL), the load average, and Go's GC totals: cumulative, diffed per slice."""
    out = {
        "mc_cpu": cpu_seconds(pid),
        "bench_cpu": time.process_time(),
        "load1": os.getloadavg()[0],
    }
    if url:
        try:
            text = requests.get(url, timeout=0.5).text
        except requests.RequestException:
            return out
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in GO_METRICS:
                out[name] = float(value)
    return out


def timeline_lines(
    timeline: Sequence[tuple[float, int, Mapping[str, float]]],
    offsets: Sequence[float],
    lags: Sequence[float],
    patch_seconds: Sequence[float] = (),
    slice_s: float = 10.0,
) -> list[str]:
    """Per ``slice_s`` of the churn: patches/s reached, Metacontroller's and the bench's
    cores, GC pause and cycles, the load, and the probes' lag max there, with the longest
    time the API server took to answer a probe's PATCH (pure)."""
    out = []
    i = 0
    while i < len(timeline):
        t0, n0, a = timeline[i]
        j = next(
            (k for k in range(i + 1, len(timeline)) if timeline[k][0] >= t0 + slice_s - 0.5), None
        )
        if j is None:
            break
        t1, n1, b = timeline[j]
        span = t1 - t0
        in_slice = [lag for at, lag in zip(offsets, lags, strict=True) if t0 <= at < t1]
        answered = [d for at, d in zip(offsets, patch_seconds, strict=False) if t0 <= at < t1]
        diff = {key: b.get(key, 0.0) - a.get(key, 0.0) for key in b}
        out.append(
            f"{t0:5.1f}-{t1:5.1f} s: patches {(n1 - n0) / span:5.0f}/s, "
            f"MC {diff.get('mc_cpu', 0.0) / span:.2f} core, "
            f"bench {diff.get('bench_cpu', 0.0) / span:.2f} core, "
            f"GC {diff.get('go_gc_duration_seconds_count', 0.0):.0f} cycles "
            f"{diff.get('go_gc_duration_seconds_sum', 0.0) * 1000:.1f} ms paused, "
            f"goroutines {b.get('go_goroutines', 0.0):.0f}, load {b.get('load1', 0.0):.1f}, "
            f"probes {len(in_slice)} lag max {max(in_slice, default=float('nan')):.3f} s"
            + (f" (PATCH answered within {max(answered):.3f} s)" if answered else "")
        )
        i = j
    return out


def hook_errors(log: Path) -> int:
    """Metacontroller's "Unhandled Error" lines so far (a hook call failed or timed out)."""
    try:
        return log.read_text(errors="replace").count('"msg":"Unhandled Error"')
    except FileNotFoundError:
        return 0


def wait_quiet(pid: int, limit: float, idle: float = 0.05) -> float:
    """Seconds until the process uses under ``idle`` of a core over 2 s (bounded)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = cpu_seconds(pid)
        time.sleep(2.0)
        if cpu_seconds(pid) - before < idle * 2.0:
            return time.monotonic() - started
    return float("nan")


def walk_seconds(profile: Path, go: str = "go") -> float | None:
    """CPU seconds in ``findRelatedParents`` (cumulative) in a pprof CPU profile."""
    out = subprocess.run(
        [go, "tool", "pprof", "-top", "-cum", "-nodefraction=0", str(profile)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    for line in out.splitlines():
        if "findRelatedParents" in line and "func" not in line.split()[-1][:4]:
            cum = line.split()[3]
            return _seconds(cum)
    return None


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(ms|s|us|µs|min)?", text)
    if not match:
        return float("nan")
    value = float(match.group(1))
    return value * {"ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60.0}.get(match.group(2) or "s", 1.0)


@dataclass
class ShapeResult:
    shape: str
    startup_drain: float
    events: int
    seconds: float
    cpu_per_event_ms: float
    walk_per_parent_event_us: float | None
    lag: list[float]
    lost: int
    errors: int = 0
    serving: int = 0

    def line(self, parents: int) -> str:
        lag = self.lag
        walk = (
            "n/a"
            if self.walk_per_parent_event_us is None
            else f"{self.walk_per_parent_event_us:.2f}"
        )
        return (
            f"{self.shape:12} parents={parents} served={self.serving} "
            f"start-drain={self.startup_drain:6.1f}s "
            f"events={self.events} ({self.events / self.seconds:.0f}/s) "
            f"MC CPU/event={self.cpu_per_event_ms:.3f} ms  walk/parent/event={walk} us  "
            f"lag p50/p90/p99/max={percentile(lag, 0.5):.3f}/{percentile(lag, 0.9):.3f}/"
            f"{percentile(lag, 0.99):.3f}/{max(lag, default=float('nan')):.3f} s "
            f"(probes {len(lag)}, not synced {self.lost}; hook errors {self.errors})"
        )


_FLIPS = itertools.count()


def _fetch(url: str, timeout: float, into: dict[str, bytes]) -> None:
    """A CPU profile from Metacontroller's pprof endpoint (it answers after the window)."""
    into["p"] = requests.get(url, timeout=timeout).content


def churn(
    rest_pool: Sequence[KubeRest],
    targets: Sequence[tuple[str, str]],
    rate: float,
    seconds: float,
    hook: BenchHook,
    probes: Sequence[tuple[str, str, str]],
    probe_every: float = 0.5,
    sample: Callable[[], dict[str, float]] | None = None,
    timeline: list[tuple[float, int, dict[str, float]]] | None = None,
    offsets: list[float] | None = None,
    patch_seconds: list[float] | None = None,
) -> tuple[int, float, list[float], int]:
    """Annotation patches at ``rate``/s over ``targets`` for ``seconds``; a role-label flip
    on a random member every ``probe_every`` s. (patches done, seconds they took, probe
    lags, probes lost). With ``sample``, ``timeline`` gets (s into the churn, patches done,
    ``sample()``) every second, ``offsets`` each synced probe's time into the churn and
    ``patch_seconds`` how long its PATCH took to be answered (the API server's share of
    the lag): where in the window the tail lies, and what the process and the machine did
    then."""
    done = [0]
    stop = threading.Event()
    lock = threading.Lock()
    rng = random.Random(7)

    def patcher(k: int) -> None:
        rest = rest_pool[k % len(rest_pool)]
        interval = len(rest_pool) / rate
        start = time.monotonic() + k * interval / len(rest_pool)
        n = 0
        while not stop.is_set():
            at = start + n * interval
            pause = at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            ns, pod = targets[(n * len(rest_pool) + k) % len(targets)]
            body = {"metadata": {"annotations": {"status": f'{{"xlog_location": {n}}}'}}}
            try:
                rest.merge_patch(resource_path("v1", "pods", ns, pod), body)
                with lock:
                    done[0] += 1
            except (KubeApiError, requests.RequestException):
                pass
            n += 1

    threads = [
        threading.Thread(target=patcher, args=(k,), daemon=True) for k in range(len(rest_pool))
    ]
    for t in threads:
        t.start()
    began = time.monotonic()

    def sampler() -> None:
        assert sample is not None and timeline is not None
        while not stop.wait(1.0):
            timeline.append((time.monotonic() - began, done[0], sample()))

    watcher = threading.Thread(target=sampler, daemon=True)
    if sample is not None and timeline is not None:
        timeline.append((0.0, 0, sample()))
        watcher.start()
    flips: list[tuple[str, float, float]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ns, pod, cluster = rng.choice(probes)
        # A value never used before: a patch to the value a Pod already has is no event.
        body = {"metadata": {"labels": {"role": f"r{next(_FLIPS)}-{time.time_ns()}"}}}
        at = time.monotonic()
        try:
            rest_pool[0].merge_patch(resource_path("v1", "pods", ns, pod), body)
            flips.append((cluster, at, time.monotonic() - at))
        except (KubeApiError, requests.RequestException):
            pass
        time.sleep(probe_every)
    stop.set()
    for t in [*threads, watcher]:
        if t.is_alive():
            t.join(5)
    took = time.monotonic() - (end - seconds)
    settle = time.monotonic() + 60.0
    lags: list[float] = []
    lost = 0
    for cluster, at, answered in flips:
        while True:
            got = hook.first_sync_after(cluster, at)
            if got is not None:
                lags.append(got - at)
                if offsets is not None:
                    offsets.append(at - began)
                if patch_seconds is not None:
                    patch_seconds.append(answered)
                break
            if time.monotonic() > settle:
                lost += 1
                break
            time.sleep(0.05)
    return done[0], took, lags, lost


@contextmanager
def metacontroller(
    plane: ControlPlane, work: Path, pprof_port: int, name: str
) -> Iterator[MetacontrollerBinary]:
    binary = os.environ.get(ENV_BINARY)
    if not binary:
        raise SystemExit(f"set {ENV_BINARY} to the Metacontroller binary")
    args = [a for a in command_args("default") if not a.startswith("--leader-election")]
    args.append(f"--pprof-address=127.0.0.1:{pprof_port}")
    mc = MetacontrollerBinary(Path(binary), plane.admin_kubeconfig, work / f"mc-{name}.log", args)
    mc.start()
    try:
        yield mc
    finally:
        mc.stop()


def apply_controller(rest: KubeRest, hook: BenchHook, sharded: bool) -> None:
    """The shipped CompositeController at the bench hook (no token, no resync period);
    ``sharded``: selecting shard 0 only, as ``deploy/sharding/`` renders it."""
    controller = local_controller(f"http://127.0.0.1:{hook.port}")
    controller["spec"].pop("endpointConfigs", None)
    controller["spec"].pop("resyncPeriodSeconds", None)
    if sharded:
        selector = {"matchLabels": {SHARD_LABEL: "0"}}
        controller["spec"]["parentResource"]["labelSelector"] = selector
    else:
        controller["spec"]["parentResource"].pop("labelSelector", None)
    name = controller["metadata"]["name"]
    for _ in range(50):
        try:
            rest.apply(f"{CC_PATH}/{name}", controller, MANAGER)
            return
        except KubeApiError:
            time.sleep(0.2)
    raise TimeoutError("the CompositeController was not applied")


def run_shape(
    plane: ControlPlane,
    rest_pool: Sequence[KubeRest],
    fleet: Fleet,
    hook: BenchHook,
    shape: str,
    args: argparse.Namespace,
    work: Path,
) -> list[ShapeResult]:
    """One Metacontroller process answering ``shape``: started, drained, then each churn
    phase of ``--churn`` in turn (quiet again between them)."""
    hook.shape = shape
    with hook.lock:
        hook.syncs.clear()
    sharded = fleet.shards > 1 and shape in args.selector_shapes.split(",")
    apply_controller(rest_pool[0], hook, sharded)
    serving = fleet.parents // fleet.shards if sharded else fleet.parents
    served = [
        m for m in fleet.members() if not sharded or int(m[2].split("-")[1]) % fleet.shards == 0
    ]
    pprof_port = free_port()
    results = []
    with metacontroller(plane, work, pprof_port, shape) as mc:
        assert mc.process is not None
        pid = mc.process.pid
        started = time.monotonic()
        deadline = started + args.start_limit
        while hook.synced() < serving and time.monotonic() < deadline:
            time.sleep(0.5)
        quiet = wait_quiet(pid, max(1.0, deadline - time.monotonic()))
        drain = time.monotonic() - started if quiet == quiet else float("nan")
        for kind in args.churn.split(","):
            if kind == "members":
                targets = [(ns, pod) for ns, pod, _ in fleet.members()]
                rate = args.member_rate
            else:
                targets = fleet.bystander_pods()
                rate = args.rate
            profile = work / f"{shape}-{kind}.pprof"
            seconds = args.seconds
            url = f"http://127.0.0.1:{pprof_port}/debug/pprof/profile?seconds={int(seconds)}"
            got: dict[str, bytes] = {}
            fetcher = threading.Thread(target=_fetch, args=(url, seconds + 30, got), daemon=True)
            errors0 = hook_errors(mc.log_path)
            cpu0 = cpu_seconds(pid)
            fetcher.start()
            timeline: list[tuple[float, int, dict[str, float]]] = []
            offsets: list[float] = []
            patched: list[float] = []
            events, took, lags, lost = churn(
                rest_pool,
                targets,
                rate,
                seconds,
                hook,
                served,
                sample=partial(machine_sample, pid, metrics_url(mc.args)),
                timeline=timeline,
                offsets=offsets,
                patch_seconds=patched,
            )
            cpu1 = cpu_seconds(pid)
            errors = hook_errors(mc.log_path) - errors0
            fetcher.join(seconds + 40)
            walk_us = None
            if "p" in got:
                profile.write_bytes(got["p"])
                walk = walk_seconds(profile)
                if walk is not None and events:
                    walk_us = walk / (events * fleet.parents) * 1e6
            results.append(
                ShapeResult(
                    f"{shape}/{kind}",
                    drain,
                    events,
                    took,
                    (cpu1 - cpu0) / max(1, events) * 1e3,
                    walk_us,
                    lags,
                    lost,
                    errors,
                    serving,
                )
            )
            print(results[-1].line(fleet.parents), flush=True)
            for line in timeline_lines(timeline, offsets, lags, patched):
                print(f"  {line}", flush=True)
            wait_quiet(pid, 120.0)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=1)
    parser.add_argument("--bystanders", type=int, default=300)
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="parents labelled over K shards; the CompositeController selects shard 0",
    )
    parser.add_argument("--rate", type=float, default=40.0, help="annotation patches per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--churn",
        default="bystanders",
        help="comma list of phases: bystanders (Pods no parent relates: the walk alone, at "
        "--rate) and members (member Pods: each event also syncs its cluster, at --member-rate)",
    )
    parser.add_argument("--member-rate", type=float, default=280.0)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--start-limit", type=float, default=240.0)
    parser.add_argument(
        "--selector-shapes",
        default="shard-aware",
        help="with --shards > 1: the shapes run by a shard install (selecting shard 0); the "
        "others by one install serving every parent. Run first (Metacontroller's finalizer "
        "on a parent makes any later install serve it).",
    )
    args = parser.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    sharded_first = args.selector_shapes.split(",") if args.shards > 1 else []
    shapes.sort(key=lambda s: s not in sharded_first)
    for shape in shapes:
        if shape not in SHAPES:
            parser.error(f"unknown shape {shape}")
    fleet = Fleet(args.parents, args.namespaces, args.bystanders, args.shards)
    work = Path(tempfile.mkdtemp(prefix="pgfh-related-walk-"))
    print(f"work dir {work}", flush=True)
    plane = start_control_plane(work / "cp", log=lambda m: print(m, flush=True))
    hook = BenchHook().start()
    rest_pool = [KubeRest.from_kubeconfig(plane.admin_kubeconfig) for _ in range(args.clients)]
    try:
        apply_crds(rest_pool[0])
        t = time.monotonic()
        create_fleet(rest_pool, fleet)
        print(
            f"fleet: {args.parents} parents, {3 * args.parents} member Pods, "
            f"{args.bystanders} bystanders over {args.namespaces} namespace(s), "
            f"{args.shards} shard(s) (made in {time.monotonic() - t:.0f} s); churn "
            f"{args.churn} (bystanders {args.rate:g}/s, members {args.member_rate:g}/s) "
            f"for {args.seconds:g} s each",
            flush=True,
        )
        for shape in shapes:
            run_shape(plane, rest_pool, fleet, hook, shape, args, work)
    finally:
        hook.stop()
        for rest in rest_pool:
            rest.close()
        plane.stop()
    return 0


def _self_check() -> None:
    """Every shape answers for a fixture request (no control plane): ``python -m
    testbed.bench.related_walk --self-check``."""
    body = {
        "controller": {"metadata": {"name": "c"}, "spec": {"parentResource": {}}},
        "parent": parent_object("pg-1", "ns", 0)
        | {"metadata": {"name": "pg-1", "namespace": "ns", "uid": "u", "labels": {}}},
    }
    for shape in SHAPES:
        print(shape, json.dumps(customize_answer(shape, body)))
    print("serves", serves(load_customize_call(body)[3]))


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-check"]:
        _self_check()
        sys.exit(0)
    sys.exit(main())
