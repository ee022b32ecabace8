"""Client downtime as a client sees it: writes through kube-proxy's ClusterIP during failovers.

Usage (root; it starts the real cluster, so take the lock)::

    flock /tmp/pgfh-realcluster.lock .venv/bin/python -m testbed.bench.client_downtime \\
        --failovers 21
    ... --kinds switchover --failovers 3          # quick, no TTL waits

    PGFH_METACONTROLLER_BINARY=/path/to/metacontroller ...   # a real Metacontroller

Everything is real except the kubelet and Metacontroller (their stand-ins, as in the
end-to-end tests; ``PGFH_METACONTROLLER_BINARY`` runs a real Metacontroller instead): the
control plane (kube-apiserver, kube-controller-manager's endpointslice
controller, etcd), Patroni 4.1 with PostgreSQL 18 (the devcluster), the hook under gunicorn,
kube-proxy (nftables mode, or iptables) in a network namespace of this run
(:mod:`testbed.kubernetes.netns`), PgBouncer (Debian's) in the same namespace, and libpq clients
(:mod:`testbed.bench.client_writer`) writing one row every 50 ms each, all at once, through:

* ``direct-new``: the ClusterIP, a new connection per write;
* ``direct-kept``: the ClusterIP, one kept connection, reopened only when it breaks;
* ``direct-kept-rw``: the same with ``target_session_attrs=read-write``, dropped on a
  read-only error;
* ``pgbouncer-debian``: PgBouncer with the package's defaults, towards the ClusterIP;
* ``pgbouncer-checked``: PgBouncer with transaction pooling and a server check that fails on a
  member in recovery (:mod:`testbed.bench.pgbouncer`).

Per failover (SIGKILL, graceful stop, planned switchover, cycled): the trigger, Patroni's promotion,
the primary Service's selector on the new leader (a watch: the hook's reply as Metacontroller wrote
it, whichever Metacontroller runs), the EndpointSlice listing only the new leader (a watch),
kube-proxy's rules sending only to it (read back from the namespace's netfilter every 50 ms), and
per client the figures of :mod:`testbed.bench.downtime_figures`. After a window of ``--window``
seconds past the rules' move, the namespace's connections left on the old leader are counted and
terminated, so that the next failover starts clean. Tables in Markdown on stdout (and JSON with
``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from testbed.bench.client_rig import CLIENT_PATHS, ClientRig, client_rig
from testbed.bench.downtime_figures import (
    ClientFigures,
    Timeline,
    client_figures,
    client_table,
    hop_table,
)
from testbed.bench.failover_kube_figures import controller_line, first_selector
from testbed.bench.writers import terminate_namespace_backends
from testbed.kubernetes import ControlPlane, start_control_plane
from testbed.kubernetes.accounts import metacontroller_kubeconfig
from testbed.kubernetes.podnet import ensure_pod_network
from testbed.kubernetes.rest import KubeRest
from testbed.metacontroller.harness import rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, kube_rig
from testbed.patroni import PatroniCluster

KINDS = ("kill", "graceful", "switchover")
LOGIN_RETRY_WAIT = 16.0


def one_failover(rig: ClientRig, kind: str, window: float) -> tuple[Timeline, list[ClientFigures]]:
    kube = rig.kube
    cluster = kube.cluster
    leader = cluster.leader()
    if leader is None:
        raise RuntimeError("no leader before the failover")
    old_ip = cluster.member(leader).ip
    old, trigger, election = cluster.fail_over(kind, timeout=90, poll_interval=0.01)
    new_ip = cluster.member(election.name).ip
    slice_moved: float | None
    rules_moved: float | None
    try:
        slice_moved = kube.slices.wait_ready((kube.leader_ip(election.name),), 30, election.name)
    except TimeoutError:
        slice_moved = None
    try:
        rules_moved = rig.wait_rules((kube.leader_ip(election.name),), 30, since=trigger)
    except TimeoutError:
        rules_moved = None
    # Every client's first write on the new leader, up to PgBouncer's default 15 s
    # server_login_retry past the rules' move (a client stuck on the demoted member never gets
    # there: it costs this wait).
    rig.writers.wait_ok_on(new_ip, list(rig.writers.records), trigger, timeout=LOGIN_RETRY_WAIT)
    end = max(time.monotonic(), (rules_moved or trigger) + window)
    time.sleep(max(0.0, end - time.monotonic()))
    service_moved = first_selector(kube.slices.selectors, election.name, trigger)
    timeline = Timeline(
        kind,
        old_ip,
        new_ip,
        trigger,
        election.first_primary,
        slice_moved,
        rules_moved,
        end,
        service_moved,
    )
    samples = rig.sampler.between(trigger, end)
    figures = [
        client_figures(timeline, name, rig.writers.snapshot(name), samples)
        for name in rig.writers.records
    ]
    # Clean slate for the next failover: whatever the clients left on the old leader goes.
    left = 0
    if kind == "graceful":
        cluster.wait_stopped(old)
    if kind == "switchover":
        left = terminate_namespace_backends(cluster, old_ip)
    else:
        cluster.start_member(old)
    cluster.wait_for_replicas(timeout=120)
    print(
        f"  {kind:10s} {old} -> {election.name}: "
        f"promotion {election.first_primary - trigger:6.2f} s"
        f", Service +{_s(service_moved, election.first_primary)}"
        f", slice +{_s(slice_moved, election.first_primary)}, rules +{_s(rules_moved, slice_moved)}"
        f"; downtime "
        + ", ".join(f"{f.writer} {_s(f.downtime, 0.0)}" for f in figures)
        + (f"; {left} connections left on the old leader terminated" if left else ""),
        flush=True,
    )
    return timeline, figures


def _s(value: float | None, since: float | None) -> str:
    if value is None or since is None:
        return "never"
    return f"{value - since:.2f}"


@contextlib.contextmanager
def running(work: Path, paths: Sequence[str], mode: str) -> Iterator[ClientRig]:
    """The whole rig, from a fresh control plane and cluster; everything stopped on exit."""
    ensure_pod_network()
    (work / "hook").mkdir(parents=True, exist_ok=True)  # gunicorn_hook writes into it
    plane: ControlPlane = start_control_plane(work / "controlplane")
    try:
        with (
            PatroniCluster() as cluster,
            rig_hook(work / "hook", source="worktree", env=HOOK_ENV) as hook,
        ):
            cluster.wait_for_replicas(timeout=90)
            admin = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
            namespace = f"downtime-{uuid.uuid4().hex[:6]}"
            admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
            with kube_rig(
                cluster,
                plane.admin_kubeconfig,
                namespace,
                hook.url,
                hook.token,
                work_dir=work,
                controller_kubeconfig=metacontroller_kubeconfig(plane),
            ) as kube:
                leader = cluster.leader()
                assert leader is not None
                kube.slices.wait_ready((kube.leader_ip(leader),), 60, leader)
                with client_rig(plane, kube, work, paths, mode=mode) as rig:
                    yield rig
            admin.close()
    finally:
        plane.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--failovers", type=int, default=21)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, cycled")
    parser.add_argument("--paths", default=",".join(CLIENT_PATHS), help="client paths")
    parser.add_argument("--mode", default="auto", help="kube-proxy mode: auto, nftables, iptables")
    parser.add_argument("--window", type=float, default=10.0, help="s after the rules moved")
    parser.add_argument(
        "--stop-at",
        type=float,
        help="no new failover after this Unix time (a shared machine's deadline); the rest is kept",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    paths = [p for p in args.paths.split(",") if p]
    if set(kinds) - set(KINDS) or set(paths) - set(CLIENT_PATHS):
        parser.error(f"kinds among {KINDS}, paths among {tuple(CLIENT_PATHS)}")
    work = Path(tempfile.mkdtemp(prefix="pgfh-downtime-"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    runs: list[tuple[Timeline, list[ClientFigures]]] = []
    with running(work, paths, args.mode) as rig:
        print(
            f"kube-proxy {rig.proxy.mode} mode"
            + (
                f" (nftables failed: {rig.proxy.fallback_reason})"
                if rig.proxy.fallback_reason
                else ""
            )
            + f"; ClusterIP {rig.cluster_ip}; {args.failovers} failovers ({', '.join(kinds)})",
            flush=True,
        )
        for _, kind in zip(range(args.failovers), itertools.cycle(kinds), strict=False):
            if args.stop_at is not None and time.time() > args.stop_at:
                print(f"stopped after {len(runs)} failovers: --stop-at reached", flush=True)
                break
            try:
                runs.append(one_failover(rig, kind, args.window))
            except Exception as error:  # keep the failovers measured so far, say why it ended
                print(f"failover {len(runs) + 1} ({kind}) failed, stopping: {error}", flush=True)
                break
        alive = rig.writers.alive()
        mode = rig.proxy.mode
    load_after = os.getloadavg()
    hops = hop_table([t for t, _ in runs])
    clients = client_table(runs, paths)
    print(
        f"\nRun {started}, kube-proxy {mode} mode, load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; writers alive at the end: {alive}; {controller_line()}\n"
    )
    print("\n".join(hops))
    print()
    print("\n".join(clients))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "started": started,
                    "mode": mode,
                    "metacontroller": controller_line(),
                    "load": [load_before, load_after],
                    "runs": [
                        {
                            "timeline": dataclasses.asdict(t),
                            "clients": [dataclasses.asdict(f) for f in fs],
                        }
                        for t, fs in runs
                    ],
                    "hop_table": hops,
                    "client_table": clients,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
