"""The local demo (``make demo``): a real failover, followed by the real hook.

It starts a 3-member Patroni cluster (PostgreSQL and etcd from PyPI wheels, members on
127.0.0.2-4 like pods), serves the hook under gunicorn with the production config module,
drives it with the Metacontroller stand-in (a development stand-in: production runs real
Metacontroller), then kills the leader and prints a timeline of what happened, then does a
planned switchover, and prints the final Service and PostgreSQLCluster status. Everything
it started is stopped on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from devcluster import ClusterError, PatroniCluster
from standin.gunicorn import gunicorn_hook
from standin.harness import SERVICE, Rig, start_rig
from standin.loop import SyncRecord


class Clock:
    """Prints lines stamped with seconds since an origin: the event each timeline starts from.

    :meth:`start` names that event in a heading line, so that ``t +0.000s`` is the kill (or
    the switchover request) and a negative ``t`` can only be something seen before it.
    """

    def __init__(self) -> None:
        self.origin = time.monotonic()

    def start(self, origin: float, event: str) -> None:
        """Count from ``origin`` (a ``time.monotonic()`` stamp), the moment of ``event``."""
        self.origin = origin
        print(f"   t = seconds since {event}", flush=True)

    def say(self, message: str, at: float | None = None) -> None:
        offset = (at if at is not None else time.monotonic()) - self.origin
        print(f"  t{offset:+8.3f}s  {message}", flush=True)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--no-switchover", action="store_true", help="only the kill")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    # Ctrl-C must clean up even when the demo was started with SIGINT ignored (e.g. `make
    # demo &` from a script): restore Python's own handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(
        "pg-failover-hook demo: a real Patroni failover, followed by the real hook.\n"
        "Needs: Linux, Python 3.11+ with venv; everything else came from PyPI into .venv.\n"
        "PostgreSQL refuses to run as root, so as root the cluster runs as user 'postgres'\n"
        "(created as 'pgfailover' if missing).\n",
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


def run(*, switchover: bool) -> int:
    clock = Clock()
    print("1. Starting etcd and three Patroni members (pg-orders-0..2 on 127.0.0.2-4) ...")
    with PatroniCluster() as cluster:
        leader = cluster.leader()
        print(f"   cluster up in {cluster.startup_seconds:.1f} s, Patroni leader: {leader}")
        print("2. Serving the hook under gunicorn (hooks.gunicorn_conf) ...")
        workdir = Path(tempfile.mkdtemp(prefix="pgfh-demo-"))
        with gunicorn_hook(workdir) as hook:
            print(f"   hook at {hook.url}; its JSON logs: {hook.log_path}")
            print("3. Metacontroller stand-in: customize, then sync; replies applied as")
            print("   Metacontroller applies them (children left out deleted, status replaced)")
            rig = start_rig(cluster, hook.url)
            try:
                assert leader is not None
                first = rig.wait_selected(leader, timeout=15)
                print(f"   Service {SERVICE} selects {leader} ({_took(first)})\n")
                _kill_leader(rig, clock)
                if switchover:
                    _switchover(rig, clock)
                _final_state(rig)
            finally:
                rig.standin.stop()
        print(f"\nStopping the hook and the cluster ... (logs of this run: {workdir})")
    print("done: nothing left running.")
    return 0


def _kill_leader(rig: Rig, clock: Clock) -> None:
    cluster = rig.cluster
    old = cluster.leader()
    assert old is not None
    print(f"4. SIGKILL of the leader {old} (Patroni and PostgreSQL, no clean release):")
    count = len(rig.records)
    with cluster.watch_leader(exclude={old}) as watch:
        killed = cluster.kill_member(old)
        clock.start(killed, f"the SIGKILL of {old}")
        clock.say(f"leader {old} killed", killed)
        rig.pod_changed(old, ready=False)
        clock.say(f"kubelet marks pod {old} not ready -> related-Pod event -> immediate sync")
        print(
            f"             ... Patroni waits for the leader lock to expire (ttl {cluster.ttl} s);"
        )
        print("             meanwhile every sync keeps the Service and asks to resync in 0.3 s")
        election = watch.result(timeout=90)
    moved = rig.wait_selected(election.name, timeout=15, after=count)
    waiting = [
        r for r in rig.records[count:] if killed <= r.started and r.finished <= moved.started
    ]
    reasons = sorted({r.reason or r.error or "?" for r in waiting})
    clock.say(f"Patroni: {election.name} answers 200 on /primary", election.first_200)
    clock.say(f"Patroni: {election.name} reports role primary (promoted)", election.first_primary)
    clock.say(f"Service {SERVICE} now selects {moved.selected[0]}", moved.finished)
    lag = moved.finished - election.first_primary
    print(f"   routing lag (promoted -> Service moved): {lag:.3f} s")
    print(f"   {len(waiting)} syncs kept the Service on {old} meanwhile ({', '.join(reasons)})\n")
    print(f"   restarting {old}: it rejoins as a replica (pg_rewind) ...")
    cluster.start_member(old)
    rig.pod_changed(old, ready=True)
    time.sleep(1.0)
    print(f"   {old} streams again; the Service stays on {rig.selected()}\n")


def _switchover(rig: Rig, clock: Clock) -> None:
    cluster = rig.cluster
    print("5. Planned switchover through Patroni's REST API (POST /switchover):")
    print("   no Pod changes, so only the hook's resyncAfterSeconds brings the next sync")
    count = len(rig.records)
    result = cluster.switchover()
    clock.start(result.requested_at, "the POST /switchover request")
    clock.say(f"POST /switchover to {result.old_leader}", result.requested_at)
    clock.say(f"Patroni: {result.new_leader} reports role primary", result.election.first_primary)
    moved = rig.wait_selected(result.new_leader, timeout=15, after=count)
    clock.say(f"Service {SERVICE} now selects {moved.selected[0]}", moved.finished)
    print(f"   routing lag: {moved.finished - result.election.first_primary:.3f} s")
    cluster.wait_for_replicas(timeout=60)
    count = len(rig.records)
    rig.wait_record(lambda r: True, timeout=10, what="a sync after the switchover", after=count)
    print(f"   {result.old_leader} streams again as a replica\n")


def _final_state(rig: Rig) -> None:
    service = rig.service() or {}
    shown = {
        "metadata": {
            k: v
            for k, v in service.get("metadata", {}).items()
            if k in ("name", "namespace", "labels")
        },
        "spec": {
            k: v
            for k, v in service.get("spec", {}).items()
            if k in ("type", "clusterIP", "ports", "selector")
        },
    }
    print("6. Final state")
    print(f"   Service {SERVICE} (as applied by the stand-in):")
    print(_indent(json.dumps(shown, indent=2)))
    print("   PostgreSQLCluster databases/pg-orders status:")
    print(_indent(json.dumps(rig.status(), indent=2)))
    errors = [r for r in rig.records if r.error]
    two = [r for r in rig.records if len(r.selected) > 1]
    print(
        f"   {len(rig.records)} syncs in all, {len(errors)} failed calls, "
        f"{len(two)} replies selecting two pods, Service dropped: "
        f"{'yes' if SERVICE in rig.standin.world.deleted_services else 'never'}"
    )


def _took(record: SyncRecord) -> str:
    return f"sync took {1000 * (record.finished - record.started):.1f} ms"


def _indent(text: str) -> str:
    return "\n".join(f"     {line}" for line in text.splitlines())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
