"""The fleet on the REAL control plane, driven by the Metacontroller stand-in or by a real
Metacontroller binary: one command for the next calibration of ``testbed/bench/fleet/model.py``.

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
  every cluster's 3 members on the same 3 loopback addresses 127.0.0.231-233 (Pod IPs
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
with ``--resync-period 0`` (absent) and with the shipped 60 s. ``--hooks-down S`` stops the
hook for S s at the window's start, makes the switchovers while it is down, and measures how
soon after its return each is routed (``--resync-annotate``: with the runbook's annotation of
every parent; :mod:`testbed.bench.fleet.kube_outage`).

Usage (the control plane and many processes: take the machine's lock)::

    flock /tmp/pgfh-heavy.lock .venv/bin/python -m testbed.bench.fleet.on_kube --clusters 200
    PGFH_METACONTROLLER_BINARY=/path/to/metacontroller flock /tmp/pgfh-heavy.lock \\
        .venv/bin/python -m testbed.bench.fleet.on_kube --clusters 1000 --poll 5 --pprof

Figures are printed, never asserted. The parts: the fleet's objects and their writers
(:mod:`testbed.bench.fleet.kube_objects`), Metacontroller for the run and its counters
(:mod:`testbed.bench.fleet.kube_controller`), the figures and the report
(:mod:`testbed.bench.fleet.kube_figures`); this module parses the arguments, runs the rig and
the window, and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from testbed.bench.fleet.kube_controller import metacontroller, profile, rss_mib, window
from testbed.bench.fleet.kube_figures import (
    Lags,
    api_per_sync,
    lag_summary,
    profiled_costs,
    queue_line,
    recovery_summary,
    report,
    syncs_asked,
)
from testbed.bench.fleet.kube_objects import (
    CHURN_PERIOD,
    EVENT_DRIVEN_RESYNC,
    EVENTLESS,
    LAYOUTS,
    MEMBERS,
    POD_EVENT,
    SHARD_LABEL,
    Churn,
    Fleet,
    cluster_name,
    member_host,
    namespaces,
    plan,
    pod_name,
)
from testbed.bench.fleet.kube_outage import annotate_all, restartable_hook
from testbed.kubernetes.pods import POD_NAME_LABEL


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.bench.fleet.on_kube", description=(__doc__ or "").split("\n\n")[0]
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
    parser.add_argument(
        "--controllers",
        type=int,
        default=1,
        help="CompositeControllers in the one install, each a share of the parents by the "
        "shard label (cluster index mod K), the k-th with the period + k x --period-step",
    )
    parser.add_argument("--period-step", type=int, default=1, help="s between the periods")
    parser.add_argument(
        "--workers", type=int, help="the binary's --workers (per controller; default: shipped)"
    )
    parser.add_argument(
        "--hooks-down",
        type=float,
        default=0.0,
        help="every hook pod down this long (s) from the window's start, the switchovers "
        "inside it; measures how soon after the hooks' return they are routed",
    )
    parser.add_argument(
        "--resync-annotate",
        action="store_true",
        help="with --hooks-down: once the hooks are back, annotate every parent as the "
        "runbook does (kubectl annotate pgc --all -A pg-failover-hook.adg.io/resync=...)",
    )
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
    if args.hooks_down < 0 or (args.resync_annotate and not args.hooks_down):
        parser.error("--hooks-down >= 0; --resync-annotate needs --hooks-down")
    if args.hooks_down and (args.pprof or args.dcs_churn or args.model or args.model_only):
        parser.error("--hooks-down measures recovery only: no --pprof, --dcs-churn or --model")
    return args


#: Hook sync latencies for the model (s): around the calibration of docs/scale.md's table.
MODEL_LATENCIES = [0.004, 0.005, 0.006, 0.006, 0.007, 0.008, 0.010, 0.014]


def model_row(args: argparse.Namespace, period: int | None) -> Any:
    """The fleet model's row of this run's settings: the shipped flags with the run's period,
    Metacontroller's calibrated cost (:data:`testbed.bench.fleet.settings.V4_17_2_COST`), one hook
    pod (this run's one gunicorn), the run's namespaces; polled clusters (or, with churn,
    busy Kubernetes-DCS ones), half the switchovers a leader's stop (its Pod changes)."""
    from dataclasses import replace

    from testbed.bench.fleet.settings import SHIPPED, V4_17_2_COST, Mix, Policy, Row

    mix = Mix(polled=0.0, busy=1.0, stops=0.5) if args.dcs_churn else Mix(polled=1.0, stops=0.5)
    return Row(
        f"model of fleet.on_kube {args.layout}",
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
    from testbed.bench.fleet.model import EVENTLESS as MODEL_EVENTLESS
    from testbed.bench.fleet.model import POD_CHANGING, run_modelled

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


def install_controllers(
    admin: Any, hook_url: str, token: str | None, period: int | None, args: argparse.Namespace
) -> list[int | None]:
    """The shipped CompositeController, or ``--controllers`` K of them in the one install,
    the k-th (``pg-failover-hook-k``) selecting the parents labelled shard k, with the period
    ``period + k x --period-step``: each has its own queue and its own tick, so a tick queues
    a K-th of the fleet, and the ticks drift apart. The periods, in order."""
    import yaml

    from testbed.metacontroller.kube_setup import COMPOSITE_CONTROLLER, install

    if args.controllers == 1:
        install(admin, hook_url, token, {"resyncPeriodSeconds": period})
        return [period]
    shipped = yaml.safe_load(COMPOSITE_CONTROLLER.read_text())["spec"]["parentResource"]
    periods = [
        None if period is None else period + k * args.period_step for k in range(args.controllers)
    ]
    for k, own in enumerate(periods):
        resource = {**shipped, "labelSelector": {"matchLabels": {SHARD_LABEL: str(k)}}}
        spec = {"resyncPeriodSeconds": own, "parentResource": resource}
        install(admin, hook_url, token, spec, name=f"pg-failover-hook-{k}")
    return periods


def wait_routed(lags: Lags, seconds: float) -> None:
    """Until every switchover in flight is routed, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while lags.pending and time.monotonic() < deadline:
        time.sleep(0.5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from testbed.fakes.patroni_fast import fleet_members
    from testbed.kubernetes import start_control_plane
    from testbed.kubernetes.accounts import metacontroller_kubeconfig
    from testbed.kubernetes.kubelet import KubeletStandIn
    from testbed.kubernetes.podnet import ensure_pod_network
    from testbed.kubernetes.rest import KubeApiError, KubeRest
    from testbed.kubernetes.watch import Reflector

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
        hooks = stack.enter_context(restartable_hook(hook_dir, hook_env, workers=2, threads=16))
        hook = hooks.hook
        install_controllers(admin, hook.url, hook.token, period, args)
        KubeletStandIn(admin, "pgfh-fleet-node").register_node()  # podgc keeps bound Pods
        for ns in [system_ns, *namespaces(clusters, args.layout, prefix)]:
            admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})

        def delete_namespaces() -> None:
            for ns in [system_ns, *namespaces(clusters, args.layout, prefix)]:
                with contextlib.suppress(KubeApiError, OSError):
                    admin.delete(f"/api/v1/namespaces/{ns}")

        stack.callback(delete_namespaces)
        fleet = Fleet(
            plane.admin_kubeconfig, args.layout, clusters, prefix, args.dcs_churn, args.controllers
        )
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
            metacontroller(
                metacontroller_kubeconfig(plane), work_dir, system_ns, args.pprof, args.workers
            )
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
        outage: float = args.hooks_down
        switches = plan(clusters, args.switchovers, outage or args.duration, args.seed)
        before = window(controller, hook.process.pid, hook.url)
        if outage:
            hooks.stop()
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
        if outage:
            time.sleep(max(0.0, before.at + outage - time.monotonic()))
            back_at = hooks.start_again()
            hook = hooks.hook
            # The window of figures is the recovery's: from the hooks' return.
            before = window(controller, hook.process.pid, hook.url)
            if args.resync_annotate:
                parents = [(fleet.ns(c), cluster_name(c)) for c in range(clusters)]
                annotated = annotate_all(admin, parents, str(int(time.time())))
                figures["annotate_s"] = round(annotated, 1)
            wait_routed(lags, args.duration)
        remaining = before.at + args.duration - time.monotonic()
        if remaining > 0 and not outage:
            time.sleep(remaining)
        after = window(controller, hook.process.pid, hook.url)
        wait_routed(lags, args.wait)
        if profiler is not None:
            profiler.join(120)
        elapsed = after.at - before.at
        syncs = after.syncs - before.syncs
        mc_cpu = after.mc_cpu - before.mc_cpu
        figures.update(
            {
                "metacontroller": "binary" if controller.binary else "stand-in",
                "resync_period": period,
                "controllers": args.controllers,
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
        if outage:
            figures["hooks_down_s"] = outage
            missed = lags.missed(EVENTLESS) + lags.missed(POD_EVENT)
            figures["recovery"] = recovery_summary(lags.finished, back_at, missed)
            figures["recoveries"] = [round(max(0.0, t - back_at), 3) for t in lags.finished]
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
