"""``python -m testbed.patroni``: run the local cluster by hand.

* ``up``      start the cluster, print members and leader, report leader changes, until Ctrl-C
              (or SIGTERM); then tear everything down. For manual experiments: kill a member's
              processes from another terminal (PIDs are printed) and watch the failover.
* ``status``  ask each member's REST API (127.0.0.2-4:8008) what it is.
* ``cleanup`` kill leftovers of crashed runs (``--force``: also runs whose owner still lives).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from testbed.patroni import _http
from testbed.patroni.cluster import (
    API_PORT,
    FIRST_MEMBER_IP,
    SCOPE,
    PatroniCluster,
)
from testbed.patroni.errors import ClusterError
from testbed.patroni.leftovers import kill_leftovers


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_up(args: argparse.Namespace) -> int:
    """Start, show, watch, tear down."""
    # SIGTERM (e.g. `timeout`, a process supervisor) must tear down like Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    cluster = PatroniCluster(base_dir=args.base_dir, members=args.members, keep=args.keep)
    try:
        t0 = time.monotonic()
        cluster.start(timeout=args.timeout)
        print(f"cluster {SCOPE} up in {time.monotonic() - t0:.1f}s, base dir {cluster.base_dir}")
        assert cluster.runtime is not None
        print(f"runtime: {cluster.runtime.source}; running as {cluster.runtime.user.name}")
        print(f"etcd: {cluster.etcd_url}   logs: {cluster.logs_dir}")
        for m in cluster.members:
            print(f"  {m.name}  {m.api_url}  postgres://{m.ip}:{m.pg_port}  pids {m.pids()}")
        print(f"superuser password: {cluster.superuser_password}")
        leader = cluster.leader()
        print(f"leader: {leader}   (Ctrl-C to stop)", flush=True)
        deadline = time.monotonic() + args.duration if args.duration else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.5)
            now = cluster.leader()
            if now != leader:
                stamp = time.strftime("%H:%M:%S")
                print(f"{stamp} leader: {leader} -> {now}", flush=True)
                leader = now
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        cluster.stop(keep_logs=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abort teardown
        cluster.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    print("stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """One GET /patroni per member address."""
    for i in range(args.members):
        ip = f"127.0.0.{FIRST_MEMBER_IP + i}"
        resp = _http.get(ip, API_PORT, "/patroni", timeout=1)
        if resp.status == 0:
            print(f"{ip}: no answer ({resp.error})")
            continue
        info = resp.json()
        name = info.get("patroni", {}).get("name")
        print(
            f"{ip}: {name} role={info.get('role')} state={info.get('state')} "
            f"replication_state={info.get('replication_state')} timeline={info.get('timeline')}"
        )
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    """Kill leftovers of earlier runs."""
    addresses = [("127.0.0.1", 2379), ("127.0.0.1", 2380)]
    for i in range(args.members):
        addresses += [(f"127.0.0.{FIRST_MEMBER_IP + i}", p) for p in (5432, API_PORT)]
    killed = kill_leftovers(addresses, force=args.force)
    for line in killed:
        print(f"killed {line}")
    print(f"{len(killed)} process(es) killed")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m testbed.patroni", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run the cluster in the foreground until Ctrl-C")
    up.add_argument("--base-dir", type=Path, default=None, help="default: a fresh temp dir")
    up.add_argument("--keep", action="store_true", help="keep data and logs after stopping")
    up.add_argument("--timeout", type=float, default=90.0, help="start-up timeout in seconds")
    up.add_argument("--duration", type=float, default=0.0, help="stop after N seconds (0: never)")
    for p in (up, sub.add_parser("status", help="ask each member's REST API")):
        p.add_argument("--members", type=int, default=3)
    cleanup = sub.add_parser("cleanup", help="kill leftovers of crashed runs")
    cleanup.add_argument("--members", type=int, default=3)
    cleanup.add_argument("--force", action="store_true", help="also runs whose owner is alive")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    handlers = {"up": cmd_up, "status": cmd_status, "cleanup": cmd_cleanup}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
