"""Every hook pod down for minutes while Patroni fails over: how long after the hook's return
the primary Service's EndpointSlice lists the new leader, on the real control plane.

``tests/test_kube_faults.py`` runs the 10 s and 60 s outages in ``make test``; this is the
5-minute one (too long for CI). The rig of those tests
(:func:`testbed.metacontroller.kube_rig.kube_rig`:
real kube-apiserver, kube-controller-manager and etcd, the kubelet stand-in, real Patroni,
the hook under gunicorn) with the Metacontroller stand-in, or a real binary named by
``PGFH_METACONTROLLER_BINARY``; the CompositeController as shipped
(metacontroller/compositecontroller.yaml), or with ``--resync-period N`` / ``--no-resync``.

One run: the hook stopped (every pod gone: connections refused), the leader SIGKILLed at
once (Patroni elects after its 20 s TTL, inside the outage), the hook back after
``--outage`` s at the same URL; then the time until the slice lists the new leader's Pod IP
(waited for up to ``--wait`` s). What bounds it: the next sync, which client-go's backoff
(5 ms doubling per parent to 1000 s) puts up to about the outage's length again after a
failure, and the ``resyncPeriodSeconds`` tick, at most one period away; plus one probe
round (2 s) and the endpointslice controller's hop.

Usage (real Patroni and the control plane: take the machine's lock)::

    flock /tmp/pgfh-heavy.lock .venv/bin/python -m testbed.bench.hooks_down
    PGFH_METACONTROLLER_BINARY=/path/to/metacontroller flock /tmp/pgfh-heavy.lock \\
        .venv/bin/python -m testbed.bench.hooks_down --outage 300

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from testbed.kubernetes import start_control_plane
from testbed.kubernetes.accounts import metacontroller_kubeconfig
from testbed.kubernetes.podnet import ensure_pod_network
from testbed.kubernetes.rest import KubeApiError, KubeRest
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig, kube_rig
from testbed.metacontroller.kube_setup import COMPOSITE_CONTROLLER
from testbed.metacontroller.metacontroller_binary import ENV_BINARY
from testbed.patroni import PatroniCluster

#: Members on 127.0.0.52-54 and their etcd on .51: no test or benchmark uses that block.
FIRST_IP = 52
PROBE_DEADLINE = 2.0
SLICE_HOP = 1.0


def shipped_period() -> int | None:
    spec = yaml.safe_load(COMPOSITE_CONTROLLER.read_text())["spec"]
    period = spec.get("resyncPeriodSeconds")
    return int(period) if period is not None else None


class Hook:
    """The hook that goes away (every pod) and comes back at the same URL and token."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.starts = 0
        self.port: int | None = None
        self.token: str | None = None
        self.running: GunicornHook | None = None
        self._stack: contextlib.ExitStack | None = None

    def start(self) -> GunicornHook:
        self.starts += 1
        workdir = self.work_dir / f"hook-{self.starts}"
        workdir.mkdir(parents=True)
        stack = contextlib.ExitStack()
        hook = stack.enter_context(
            gunicorn_hook(workdir, env=HOOK_ENV, port=self.port, token=self.token)
        )
        self._stack, self.running = stack, hook
        self.port, self.token = int(hook.url.rsplit(":", 1)[1]), hook.token
        return hook

    def stop(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def sync_calls(self) -> list[str]:
        assert self.running is not None
        return [line for line in self.running.log_lines() if '"POST /sync' in line]


def one_outage(rig: KubeRig, hook: Hook, outage: float, wait: float) -> dict[str, Any]:
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    rig.slices.wait_ready((rig.leader_ip(leader),), 60, f"the leader {leader}")
    down = time.monotonic()
    hook.stop()
    try:
        with cluster.watch_leader(exclude={leader}) as watch:
            cluster.kill_member(leader)
            election = watch.result(timeout=90)
        time.sleep(max(0.0, down + outage - time.monotonic()))
    finally:
        hook.start()
    back = time.monotonic()
    figures: dict[str, Any] = {
        "outage_s": round(back - down, 1),
        "promoted_after_down_s": round(election.first_primary - down, 1),
    }
    try:
        moved = rig.slices.wait_ready(
            (rig.leader_ip(election.name),), wait, f"the new leader {election.name}"
        )
        figures["routed_after_back_s"] = round(moved - back, 2)
    except TimeoutError:
        figures["routed_after_back_s"] = None
        figures["not_routed_within_s"] = wait
    figures["hook_calls_since_back"] = len(hook.sync_calls())
    if rig.controller is not None:
        figures["failed_calls_while_down"] = sum(
            1 for r in rig.records if r.error and down <= r.started < back
        )
    figures["most_ready_at_once"] = rig.slices.most_ready_at_once()
    figures["service_deleted"] = len(rig.slices.service_deleted)
    cluster.start_member(leader)  # rejoins as a replica for the next run
    return figures


def run(outage: float, runs: int, wait: float, period: int | None) -> list[dict[str, Any]]:
    work_dir = Path(tempfile.mkdtemp(prefix="pgfh-bench-hooks-down-"))
    ensure_pod_network()
    plane = start_control_plane(work_dir / "controlplane", log=lambda line: print(f"  {line}"))
    admin = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    namespace = f"bench-hooks-{uuid.uuid4().hex[:6]}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    hook = Hook(work_dir)
    results = []
    try:
        hook.start()
        assert hook.running is not None
        with (
            PatroniCluster(first_ip=FIRST_IP, etcd_host=f"127.0.0.{FIRST_IP - 1}") as cluster,
            kube_rig(
                cluster,
                plane.admin_kubeconfig,
                namespace,
                hook.running.url,
                hook.token,
                work_dir=work_dir,
                controller_kubeconfig=metacontroller_kubeconfig(plane),
                controller_spec={"resyncPeriodSeconds": period},
            ) as rig,
        ):
            for index in range(runs):
                print(
                    f"run {index + 1}: hooks down {outage:g} s, the leader killed ...", flush=True
                )
                figures = one_outage(rig, hook, outage, wait)
                print(f"  {json.dumps(figures)}", flush=True)
                results.append(figures)
                time.sleep(5)
    finally:
        hook.stop()
        with contextlib.suppress(KubeApiError):
            admin.delete(f"/api/v1/namespaces/{namespace}")
        admin.close()
        plane.stop()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.bench.hooks_down", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--outage", type=float, default=300.0, help="hooks down (s)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--wait", type=float, default=1200.0, help="give up after (s)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resync-period", type=int, help="resyncPeriodSeconds (else shipped)")
    group.add_argument("--no-resync", action="store_true", help="no resyncPeriodSeconds")
    args = parser.parse_args(argv)
    period = (
        None if args.no_resync else (args.resync_period if args.resync_period else shipped_period())
    )
    binary = os.environ.get(ENV_BINARY)
    who = f"real Metacontroller ({binary})" if binary else "the Metacontroller stand-in"
    print(
        f"{who}; resyncPeriodSeconds {period if period is not None else 'absent'}; "
        f"bound with it: {period} + {PROBE_DEADLINE:g} + {SLICE_HOP:g} s",
        flush=True,
    )
    results = run(args.outage, args.runs, args.wait, period)
    print()
    print(
        "| Metacontroller | resyncPeriodSeconds | outage (s) | promoted after (s) "
        "| routed after the hook's return (s) | hook calls since |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        routed = r["routed_after_back_s"]
        print(
            f"| {'real ' + Path(binary).name if binary else 'stand-in'} "
            f"| {period if period is not None else 'absent'} | {r['outage_s']} "
            f"| {r['promoted_after_down_s']} "
            f"| {routed if routed is not None else f'not within {args.wait:g}'} "
            f"| {r['hook_calls_since_back']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
