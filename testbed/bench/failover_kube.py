"""Failovers on the real control plane, timed where clients see them: the EndpointSlice.

``testbed.bench.failover_patroni`` ends at the hook's reply, applied by the stand-in to a model
of the Service. Clients follow the EndpointSlice that the real endpointslice controller writes one
hop later, so this benchmark runs the same failovers on the real control plane
(kube-apiserver, kube-controller-manager, etcd; the rig of ``tests/test_kube_e2e.py``:
:func:`testbed.metacontroller.kube_rig.kube_rig`) and times, on one monotonic clock, for each
failover:

* **trigger**: the SIGKILL, the SIGTERM (graceful stop) or the ``POST /switchover``;
* **promotion**: Patroni's first 200 with ``role: primary`` on ``GET /primary`` of the new
  leader (polled every 10 ms on every other member, :meth:`PatroniCluster.watch_leader`);
* **Service write**: the watch event of the primary Service carrying a selector on the new
  leader (the hook's reply, applied by Metacontroller: what the endpointslice controller
  reacts to);
* **slice**: the watch event after which the primary Service's EndpointSlices (label
  ``kubernetes.io/service-name``) list exactly the new leader's Pod IP as ready.

Every time comes from a watch on the API server or from Patroni, none from Metacontroller's side, so
the benchmark runs the same on the stand-in (:mod:`testbed.metacontroller.kube`) and on a real
Metacontroller (``PGFH_METACONTROLLER_BINARY``,
:mod:`testbed.metacontroller.metacontroller_binary`), whose calls to the hook leave no record here.
Hops: promotion→Service write (the hook's probe round and reply plus Metacontroller applying it;
``testbed.bench.failover_patroni`` times the reply alone), Service write→slice (the endpointslice
controller and the readiness the kubelet stand-in reports), promotion→slice (what clients wait for
after Patroni is done) and trigger→slice. Hook calls and failed calls are counted from the hook's
own ``/metrics``. Over the whole run, from the watches: never two Pods ready at once in the primary
slice, the Service never deleted, its selector never empty. The ground-truth sampler and the writer
of ``testbed.bench.failover_patroni`` run beside it, following the *slice* (a write goes to the Pod
IP the slice lists ready, as a client through kube-proxy would).

DCS modes (``--dcs``, comma-separated, each on a cluster of its own in a namespace of its own):

* ``etcd``: the devcluster's default (members 127.0.0.2-4). A switchover changes no Pod:
  only the healthy resync (``PGFH_RESYNC_HEALTHY_SECONDS``, 1 s) brings the sync after it;
* ``endpoints`` / ``configmaps``: Patroni 4.1 on its Kubernetes DCS against this very API
  server (:mod:`testbed.patroni.kubernetes_dcs`, members 127.0.0.12-14), the leader lock in
  Endpoints or ConfigMaps. Patroni labels its own Pods (``role``, ``status``), so the hook
  goes event-driven (``status.switchoverDetection: RoleLabel``, a 30 s healthy resync) and a
  switchover is followed through the Pod change, not the timer.

Usage (real Patroni: take the machine's lock)::

    flock /tmp/pgfh-realcluster.lock .venv/bin/python -m testbed.bench.failover_kube --failovers 21
    flock /tmp/pgfh-realcluster.lock .venv/bin/python -m testbed.bench.failover_kube \\
        --dcs endpoints,configmaps --failovers 6
    ... --quick        # one kill, one graceful stop, one switchover per DCS mode
    PGFH_METACONTROLLER_BINARY=/path/to/metacontroller ...   # a real Metacontroller

Figures are printed, never asserted; the exit status is 1 only if an invariant broke. The parts:
what a failover and a run record, and the tables (:mod:`testbed.bench.failover_kube_figures`);
what is watched beside the rig (:mod:`testbed.bench.failover_kube_watches`); this module builds
the rig, runs the failovers and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from testbed.bench.failover_kube_figures import (
    DCS_MODES,
    HOPS,
    Invariants,
    KubeFailover,
    RunResult,
    call_counts,
    controller_line,
    first_ready,
    first_selector,
    load_line,
    next_slot,
    report,
    resync_period,
)
from testbed.bench.failover_kube_watches import (
    DirectSliceMirror,
    NotReadyMirror,
    PodReadiness,
    SliceRoute,
    wait_until,
)
from testbed.bench.failover_patroni import KINDS, Sampler, Writer
from testbed.kubernetes import ControlPlane, start_control_plane
from testbed.kubernetes.accounts import metacontroller_kubeconfig
from testbed.kubernetes.podnet import ensure_pod_network
from testbed.kubernetes.pods import POD_NAME_LABEL
from testbed.kubernetes.rest import KubeApiError, KubeRest
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import CLUSTER, rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig, kube_rig
from testbed.patroni import PatroniCluster
from testbed.patroni.kubernetes_dcs import KubernetesDCS, create_member_pods, grant_patroni_rights

#: The Kubernetes-DCS clusters' block: not the session cluster's 127.0.0.2-4, nor the 12-14 of
#: tests/test_patroni_kubernetes_dcs.py, which may run at the same time on the other worker.
KUBERNETES_FIRST_IP = 22
#: How long one failover may take end to end (a kill waits for the 20 s TTL).
FAILOVER_TIMEOUT = 90.0
#: After the new leader is promoted, how long the slice may take to list it (a poll miss).
SLICE_TIMEOUT = 30.0
#: How far apart two watches (each in its own thread) may report causally ordered events.
WATCH_SLACK = 0.25


def hook_counts(hook: GunicornHook) -> tuple[float, float]:
    """The hook's own count of answered sync/finalize calls and of calls it failed (4xx on
    ``/sync``, 5xx), from its ``/metrics``: the same on the stand-in and on a real
    Metacontroller, which records nothing of its calls here. Fleet-wide: a parent of an
    earlier namespace still being finalized counts too."""
    response = requests.get(f"{hook.url}/metrics", timeout=5, verify=hook.verify)
    response.raise_for_status()
    return call_counts(response.text)


def invariants_of(
    rig: KubeRig, calls: tuple[float, float] = (0.0, 0.0), writes_on_non_leader: int = 0
) -> Invariants:
    """The invariants over everything the rig's watches saw; ``calls``: the hook's answered
    and failed calls over the run (:func:`hook_counts`, after minus before)."""
    return Invariants(
        most_ready_at_once=rig.slices.most_ready_at_once(),
        service_deleted=len(rig.slices.service_deleted),
        empty_selectors=sum(
            1 for _, selector in rig.slices.selectors if not selector.get(POD_NAME_LABEL)
        ),
        selector_changes=len(rig.slices.selectors),
        hook_errors=int(calls[1]),
        syncs=int(calls[0]),
        writes_on_non_leader=writes_on_non_leader,
    )


@dataclass
class Bench:
    """The rig and what this benchmark watches beside it."""

    rig: KubeRig
    pods: PodReadiness
    mirror: NotReadyMirror
    direct: DirectSliceMirror
    hook: GunicornHook


def pods_ready(rig: KubeRig) -> bool:
    """Every member Pod Ready (the kubelet stand-in's probe passed since a restart)."""
    for member in rig.cluster.members:
        pod = rig.rest.get(f"/api/v1/namespaces/{rig.namespace}/pods/{member.name}")
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return False
    return True


def status_of(rig: KubeRig) -> dict[str, Any]:
    parent = rig.parent() or {}
    return dict(parent.get("status") or {})


def settle(rig: KubeRig, want_detection: str | None, timeout: float = 60.0) -> None:
    """Before a failover: the cluster healthy, every Pod Ready, the slice on the leader, and
    (Kubernetes DCS) the hook's switchover detection back to ``want_detection``."""
    leader = rig.cluster.wait_healthy(timeout=timeout)
    wait_until(lambda: True if pods_ready(rig) else None, timeout, "every member Pod Ready")
    rig.slices.wait_ready((rig.leader_ip(leader),), timeout, f"the leader {leader}")
    if want_detection is not None:
        wait_until(
            lambda: True if status_of(rig).get("switchoverDetection") == want_detection else None,
            timeout,
            f"status.switchoverDetection {want_detection}",
        )


def one_failover(bench: Bench, dcs: str, kind: str) -> KubeFailover:
    """Trigger one failover of ``kind`` and time it up to the slice; then repair."""
    rig = bench.rig
    cluster = rig.cluster
    old = cluster.leader()
    if old is None:
        raise RuntimeError("no leader before the failover")
    parent = rig.parent() or {}
    detection = (parent.get("status") or {}).get("switchoverDetection")
    uid = str(parent["metadata"]["uid"])
    _, trigger, election = cluster.fail_over(kind, timeout=FAILOVER_TIMEOUT, poll_interval=0.01)
    new = election.name
    new_ip = rig.leader_ip(new)
    rig.slices.wait_ready((new_ip,), SLICE_TIMEOUT, f"the new leader {new}")
    service = wait_until(
        lambda: first_selector(rig.slices.selectors, new, trigger), 10, f"the Service on {new}"
    )
    moved = wait_until(lambda: first_ready(rig.slices.history, (new_ip,), trigger), 1, "the slice")
    bench.mirror.slices.wait_ready((new_ip,), SLICE_TIMEOUT, f"the mirror on {new}")
    mirror_slice = wait_until(
        lambda: first_ready(bench.mirror.slices.history, (new_ip,), trigger), 1, "the mirror"
    )
    mirror_write = wait_until(
        lambda: first_selector(bench.mirror.writes, new, trigger), 1, "the mirror's write"
    )
    bench.direct.slices.wait_ready((new_ip,), SLICE_TIMEOUT, f"the direct slice on {new}")
    direct_slice = wait_until(
        lambda: first_ready(bench.direct.slices.history, (new_ip,), trigger), 1, "the direct"
    )
    direct_write = wait_until(
        lambda: first_selector(bench.direct.writes, new, trigger), 1, "the direct write"
    )
    failover = KubeFailover(
        dcs=dcs,
        kind=kind,
        old=old,
        new=new,
        trigger=trigger,
        promotion=election.first_primary,
        service=service,
        slice=moved,
        detection=detection,
        new_ready=bench.pods.turned_ready(new, trigger, moved + WATCH_SLACK),
        pnr_started=mirror_write,
        pnr_slice=mirror_slice,
        direct_started=direct_write,
        direct_slice=direct_slice,
    )
    failover.resync_period = resync_period(detection)
    wall = time.time() - time.monotonic()  # this clock's offset from the hook's wall clock
    failover.resync_due = trigger + next_slot(failover.resync_period, uid, trigger + wall)
    if kind != "switchover":
        if kind == "graceful":
            cluster.wait_stopped(old)
        cluster.start_member(old)
    cluster.wait_for_replicas(timeout=FAILOVER_TIMEOUT)
    return failover


def run_on(
    bench: Bench,
    dcs: str,
    failovers: int,
    kinds: Sequence[str],
    *,
    quiet: bool = False,
    writes: bool = True,
) -> RunResult:
    """Measure ``failovers`` failovers (``kinds`` cycled) on a running rig.

    ``writes=False`` runs no writer: on the Kubernetes DCS every write moves the WAL, and
    Patroni re-patches each Pod's ``status`` annotation (``xlog_location``) every HA loop
    when it moved, which is a Pod event, hence a sync, whatever the switchover detection.
    Without writes the only Pod changes are the roles' and the kubelet's readiness.
    """
    rig = bench.rig
    result = RunResult(dcs)
    event_driven = None if dcs == "etcd" else "RoleLabel"
    settle(rig, event_driven)
    route = SliceRoute(rig)
    started, calls_before = time.monotonic(), hook_counts(bench.hook)
    writer_context = Writer(route) if writes else contextlib.nullcontext(None)
    with Sampler(route) as sampler, writer_context as writer:
        for index, kind in zip(range(failovers), itertools.cycle(kinds), strict=False):
            settle(rig, event_driven)
            failover = one_failover(bench, dcs, kind)
            failover.no_leader, failover.misrouted = sampler.between(
                failover.trigger, failover.slice
            )
            result.failovers.append(failover)
            if not quiet:
                hops = ", ".join(f"{label} {hop(failover):.3f}" for label, hop in HOPS)
                print(
                    f"  {dcs} #{index + 1:2d} {kind:10s} {failover.old} -> {failover.new} "
                    f"[{failover.detection}, resync {failover.resync_period}]: {hops}",
                    flush=True,
                )
        if writer is not None:
            done = writer.writes
            result.writes = {
                "ok": done.ok,
                "failed": done.failed,
                "failed_when": sampler.classify(done.failed_at),
                "errors": done.errors,
                "on_non_leader": done.on_non_leader,
            }
    result.seconds = time.monotonic() - started
    calls_after = hook_counts(bench.hook)
    calls = (calls_after[0] - calls_before[0], calls_after[1] - calls_before[1])
    result.syncs = int(calls[0])
    result.invariants = invariants_of(rig, calls, int(result.writes.get("on_non_leader") or 0))
    result.invariants.mirror_most_ready_at_once = bench.mirror.slices.most_ready_at_once()
    result.invariants.direct_most_ready_at_once = bench.direct.slices.most_ready_at_once()
    result.trace = {
        "pods_ready": list(bench.pods.changes),
        "slice": list(rig.slices.history),
        "selectors": list(rig.slices.selectors),
        "mirror_writes": list(bench.mirror.writes),
        "mirror_slice": list(bench.mirror.slices.history),
        "direct_writes": list(bench.direct.writes),
        "direct_slice": list(bench.direct.slices.history),
    }
    conditions = status_of(rig).get("conditions") or []
    result.detection_condition = next(
        (c for c in conditions if c.get("type") == "SwitchoverDetection"), None
    )
    return result


@contextlib.contextmanager
def benchmark_rig(
    plane: ControlPlane,
    dcs: str,
    hook: GunicornHook,
    work_dir: Path,
    *,
    etcd_cluster: PatroniCluster | None = None,
    first_ip: int | None = None,
) -> Iterator[Bench]:
    """A namespace, a Patroni cluster on ``dcs``, and the rig on them (Metacontroller's
    stand-in under its own least-privilege ServiceAccount); all gone on exit.
    ``etcd_cluster``: the etcd-DCS cluster to use instead of starting one (the test suite's
    session cluster, which holds the same addresses). ``first_ip``: the members on
    ``127.0.0.<first_ip>`` and up (and etcd on the address below), away from a cluster that
    holds the usual block."""
    if dcs not in DCS_MODES:
        raise ValueError(f"dcs must be one of {DCS_MODES}, not {dcs!r}")
    admin = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    namespace = f"bench-{dcs[:5]}-{uuid.uuid4().hex[:6]}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    controller = metacontroller_kubeconfig(plane)
    try:
        with contextlib.ExitStack() as stack:
            if dcs == "etcd":
                cluster = etcd_cluster or stack.enter_context(
                    PatroniCluster()
                    if first_ip is None
                    else PatroniCluster(first_ip=first_ip, etcd_host=f"127.0.0.{first_ip - 1}")
                )
            else:
                kubernetes = KubernetesDCS(
                    server=plane.server_url,
                    ca_file=plane.ca_file,
                    token=grant_patroni_rights(admin, namespace),
                    namespace=namespace,
                    use_endpoints=dcs == "endpoints",
                )
                first = KUBERNETES_FIRST_IP if first_ip is None else first_ip
                members = {f"{CLUSTER}-{i}": f"127.0.0.{first + i}" for i in range(3)}
                create_member_pods(admin, kubernetes, CLUSTER, members)
                cluster = stack.enter_context(PatroniCluster(first_ip=first, kubernetes=kubernetes))
            rig = stack.enter_context(
                kube_rig(
                    cluster,
                    plane.admin_kubeconfig,
                    namespace,
                    hook.url,
                    hook.token,
                    work_dir=work_dir,
                    controller_kubeconfig=controller,
                    create_pods=dcs == "etcd",
                )
            )
            pods = PodReadiness(admin, namespace).start()
            stack.callback(pods.stop)
            mirror = NotReadyMirror(KubeRest.from_kubeconfig(plane.admin_kubeconfig), namespace)
            stack.callback(mirror.rest.close)
            mirror.start()
            stack.callback(mirror.stop)
            direct = DirectSliceMirror(
                KubeRest.from_kubeconfig(plane.admin_kubeconfig), namespace, rig.leader_ip
            )
            stack.callback(direct.rest.close)
            direct.start()
            stack.callback(direct.stop)
            yield Bench(rig, pods, mirror, direct, hook)
    finally:
        with contextlib.suppress(KubeApiError):
            admin.delete(f"/api/v1/namespaces/{namespace}")
        admin.close()


def run(
    dcs_modes: Sequence[str],
    failovers: int,
    kinds: Sequence[str],
    *,
    writes: bool = True,
    first_ip: int | None = None,
) -> list[RunResult]:
    """Start the control plane and the hook once, then each DCS mode's cluster in turn."""
    work_dir = Path(tempfile.mkdtemp(prefix="pgfh-bench-kube-"))
    ensure_pod_network()
    plane = start_control_plane(work_dir / "controlplane", log=lambda line: print(f"  {line}"))
    results = []
    (work_dir / "hook").mkdir()
    try:
        with rig_hook(work_dir / "hook", env=HOOK_ENV) as hook:
            for dcs in dcs_modes:
                print(f"{dcs}: starting the cluster and the rig ...", flush=True)
                with benchmark_rig(plane, dcs, hook, work_dir, first_ip=first_ip) as bench:
                    results.append(run_on(bench, dcs, failovers, kinds, writes=writes))
    finally:
        plane.stop()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dcs", default="etcd", help=f"comma-separated, among {DCS_MODES}")
    parser.add_argument("--failovers", type=int, default=21, help="per DCS mode")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, cycled")
    parser.add_argument("--quick", action="store_true", help="one failover of each kind")
    parser.add_argument("--no-writes", action="store_true", help="no client writing meanwhile")
    parser.add_argument(
        "--first-ip",
        type=int,
        help="members on 127.0.0.N and up (etcd on N-1): away from a cluster on the usual block",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    modes = [m for m in args.dcs.split(",") if m]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"kinds must be among {KINDS}")
    if not modes or set(modes) - set(DCS_MODES):
        parser.error(f"--dcs must be among {DCS_MODES}")
    count = len(kinds) if args.quick else args.failovers
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"{started}: {count} failovers per DCS mode ({', '.join(modes)}); {load_line()}; "
        f"{controller_line()}"
    )
    results = run(modes, count, kinds, writes=not args.no_writes, first_ip=args.first_ip)
    lines = report(results)
    print("\n".join(lines))
    print(f"\nafter the run: {load_line()}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "dcs": r.dcs,
                        "failovers": [asdict(f) for f in r.failovers],
                        "invariants": asdict(r.invariants),
                        "writes": r.writes,
                        "detection_condition": r.detection_condition,
                        "seconds": r.seconds,
                        "trace": r.trace,
                        "syncs": r.syncs,
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    broken = [f"{r.dcs}: {problem}" for r in results for problem in r.invariants.broken]
    for problem in broken:
        print(f"INVARIANT BROKEN: {problem}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
