"""Metacontroller's related-object event path at fleet size, on the real binary.

Every Pod (and Service) event of the cluster runs ``findRelatedParents``
(``pkg/controller/common/customize/manager.go`` 353-397, v4.17.2) on the Pod informer's single
handler goroutine: it walks every parent of the parent informer and matches each parent's
customize rules. This bench measures what one parent costs per event for each customize-reply
shape the product could send, and the Pod-event lag under churn:

* N PostgreSQLClusters (3 member Pods each, labelled with the cluster's ``primarySelector``)
  over K namespaces, plus ``--bystanders`` Pods that no parent relates;
* a bench hook on loopback: ``/customize`` answers the chosen shape (built by the product's own
  :func:`hooks.children.related_rules` and :func:`hooks.core.scope.serves`), ``/sync`` answers at
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

The parts: the shapes, the bench hook and the fleet (:mod:`testbed.bench.related_walk_rig`), what
is measured and printed (:mod:`testbed.bench.related_walk_figures`); this module runs the churn
and each shape's Metacontroller.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import requests

from hooks.core.scope import serves
from hooks.loaders.envelope import load_customize_call
from testbed.bench.common import cpu_seconds
from testbed.bench.related_walk_figures import (
    ShapeResult,
    hook_errors,
    machine_sample,
    metrics_url,
    timeline_lines,
    wait_quiet,
    walk_seconds,
)
from testbed.bench.related_walk_rig import (
    CC_PATH,
    SHAPES,
    SHARD_LABEL,
    BenchHook,
    Fleet,
    create_fleet,
    customize_answer,
    parent_object,
)
from testbed.kubernetes import ControlPlane, start_control_plane
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.gunicorn import free_port
from testbed.metacontroller.kube_setup import MANAGER, apply_crds, local_controller
from testbed.metacontroller.metacontroller_binary import (
    ENV_BINARY,
    MetacontrollerBinary,
    command_args,
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
