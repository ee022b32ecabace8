"""The local demo (``make demo``): a real failover on a real Kubernetes control plane.

It starts the test control plane (kube-apiserver, kube-controller-manager and etcd from the
pinned Go modules, built once per machine: about 10 minutes the first time, seconds after),
a 3-member Patroni cluster (PostgreSQL and etcd from PyPI wheels, members on 127.0.0.2-4)
whose members are Pods of that API server (Pod IPs 198.18.0.2-4, Ready from Patroni's
``/readiness`` through the kubelet stand-in), the hook under gunicorn with the production
config module, and Metacontroller's stand-in against the API server (a real Metacontroller
binary instead if ``PGFH_METACONTROLLER_BINARY`` names one). It applies a PostgreSQLCluster,
then kills the leader and does a planned switchover, printing ``kubectl get pgc`` and the
primary Service's EndpointSlice (written by the real endpointslice controller) each time they
change. Everything it started is stopped on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from testbed.kubernetes import ControlPlane, ControlPlaneError, start_control_plane
from testbed.kubernetes.podnet import ensure_pod_network
from testbed.metacontroller.gunicorn import gunicorn_hook
from testbed.metacontroller.harness import SERVICE
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig, kube_rig
from testbed.patroni import ClusterError, PatroniCluster

NAMESPACE = "databases"


class Clock:
    """Prints lines stamped with seconds since an origin the demo moves to each event.

    :meth:`start` names that event in a heading line, so that ``t +0.000s`` is the kill (or
    the switchover request) and a negative ``t`` can only be something seen before it.
    """

    def __init__(self) -> None:
        self.origin = time.monotonic()
        self.lock = threading.Lock()

    def start(self, origin: float, event: str) -> None:
        """Count from ``origin`` (a ``time.monotonic()`` stamp), the moment of ``event``."""
        self.origin = origin
        print(f"   t = seconds since {event}", flush=True)

    def say(self, message: str, at: float | None = None) -> None:
        offset = (at if at is not None else time.monotonic()) - self.origin
        with self.lock:
            print(f"  t{offset:+8.3f}s  {message}", flush=True)


class PgcPrinter:
    """Prints ``kubectl get pgc`` (without AGE) whenever its line changes."""

    def __init__(self, plane: ControlPlane, clock: Clock) -> None:
        self.plane = plane
        self.clock = clock
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PgcPrinter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def wait_first(self, timeout: float) -> None:
        """Wait until the first line was printed (the stand-in wrote a status)."""
        deadline = time.monotonic() + timeout
        while not self.last and time.monotonic() < deadline:
            time.sleep(0.1)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            shown = self.plane.kubectl("get", "pgc", "-n", NAMESPACE, check=False, timeout=10)
            lines = shown.stdout.strip().splitlines()
            if len(lines) < 2:
                continue
            line = " ".join(lines[1].split()[:-1])  # AGE dropped: it changes every second
            if line != self.last:
                self.last = line
                self.clock.say(f"kubectl get pgc: {line}")


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--no-switchover", action="store_true", help="only the kill")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(
        "pg-failover-hook demo: a real Patroni failover on a real Kubernetes API server.\n"
        "Needs: Linux, root (the test Pod network: ip route + nftables), Python 3.11+ with venv;\n"
        "the control plane's binaries are built from pinned Go modules the first time (about\n"
        "10 minutes), later runs start it in seconds. PostgreSQL refuses to run as root, so\n"
        "the cluster runs as user 'postgres' (created as 'pgfailover' if missing).\n",
        flush=True,
    )
    try:
        return run(switchover=not args.no_switchover)
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started has been stopped.", flush=True)
        return 130
    except ClusterError as error:
        print(f"\nthe local Patroni cluster failed:\n{error}", file=sys.stderr, flush=True)
        return 1
    except ControlPlaneError as error:
        print(f"\nthe control plane failed: {error}", file=sys.stderr, flush=True)
        return 1


def run(*, switchover: bool) -> int:
    clock = Clock()
    workdir = Path(tempfile.mkdtemp(prefix="pgfh-demo-"))
    print("1. Starting the control plane (kube-apiserver, kube-controller-manager, etcd) ...")
    ensure_pod_network()
    plane = start_control_plane(workdir / "controlplane", log=lambda line: print(f"   {line}"))
    try:
        print(f"   up in {plane.started_seconds:.1f} s at {plane.server_url}")
        print(f"   try it yourself: KUBECONFIG={plane.admin_kubeconfig} kubectl get pgc -A")
        plane.kubectl("create", "namespace", NAMESPACE)
        print("2. Starting etcd and three Patroni members (pg-orders-0..2 on 127.0.0.2-4) ...")
        with PatroniCluster() as cluster:
            print(f"   cluster up in {cluster.startup_seconds:.1f} s, leader: {cluster.leader()}")
            print("3. Serving the hook under gunicorn (hooks.shell.gunicorn_conf) ...")
            (workdir / "hook").mkdir()
            with gunicorn_hook(workdir / "hook", env=HOOK_ENV) as hook:
                print(f"   hook at {hook.url}; its JSON logs: {hook.log_path}")
                print("4. Pods, kubelet stand-in, Metacontroller, then the PostgreSQLCluster:")
                clock.start(time.monotonic(), "the PostgreSQLCluster was applied")

                def slice_changed(ready: tuple[str, ...]) -> None:
                    shown = ", ".join(ready) or "none"
                    clock.say(f"EndpointSlice of {SERVICE}: ready {shown}")

                with kube_rig(
                    cluster,
                    plane.admin_kubeconfig,
                    NAMESPACE,
                    hook.url,
                    hook.token,
                    on_change=slice_changed,
                    work_dir=workdir,
                ) as rig:
                    printer = PgcPrinter(plane, clock).start()
                    printer.wait_first(30)
                    try:
                        _story(rig, clock, switchover)
                    finally:
                        printer.stop()
            print(f"\nStopping the hook and the cluster ... (logs of this run: {workdir})")
    finally:
        plane.stop()
    print("done: nothing left running.")
    return 0


def _story(rig: KubeRig, clock: Clock, switchover: bool) -> None:
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    rig.slices.wait_ready((rig.leader_ip(leader),), 60, f"the leader {leader}")
    print(f"   clients reach {leader} ({rig.leader_ip(leader)}) through {SERVICE}\n")

    print(f"5. SIGKILL of the leader {leader} (Patroni and PostgreSQL, no clean release):")
    with cluster.watch_leader(exclude={leader}) as watch:
        killed = cluster.kill_member(leader)
        clock.start(killed, f"the SIGKILL of {leader}")
        clock.say(
            f"leader {leader} killed; Patroni waits for its lock to expire (ttl {cluster.ttl} s)"
        )
        election = watch.result(timeout=90)
    clock.say(f"Patroni: {election.name} promoted", election.first_primary)
    moved = rig.slices.wait_ready((rig.leader_ip(election.name),), 30, election.name)
    print(f"   routing lag (promoted -> slice lists it): {moved - election.first_primary:.3f} s")
    print(f"   restarting {leader}: it rejoins as a replica ...")
    cluster.start_member(leader)
    cluster.wait_for_replicas(timeout=90)
    time.sleep(1.5)
    print()

    if switchover:
        print("6. Planned switchover through Patroni's REST API (POST /switchover):")
        result = cluster.switchover()
        clock.start(result.requested_at, "the POST /switchover request")
        clock.say(f"POST /switchover away from {result.old_leader}", result.requested_at)
        clock.say(f"Patroni: {result.new_leader} promoted", result.election.first_primary)
        moved = rig.slices.wait_ready((rig.leader_ip(result.new_leader),), 30, result.new_leader)
        print(f"   routing lag: {moved - result.election.first_primary:.3f} s")
        cluster.wait_for_replicas(timeout=90)
        time.sleep(1.5)
        print()

    errors = [r for r in rig.records if r.error]
    print(
        f"7. {len(rig.records)} hook calls, {len(errors)} failed; at most "
        f"{rig.slices.most_ready_at_once()} Pod ready in the primary slice at any time; "
        f"Service deleted: {'yes' if rig.slices.service_deleted else 'never'}"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
