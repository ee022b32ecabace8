"""Fleet benchmark: N Patroni clusters behind one Metacontroller queue.

Run ``python -m testbed.bench.fleet.table`` for the full table (``--help`` for single rows). What it
models is Metacontroller v4.17.2, as read in its source (paths in its repository):

* One work queue per CompositeController: client-go's rate-limiting FIFO without
  priority (``pkg/controller/composite/controller.go`` ``newParentController``). A key
  is in the queue at most once (client-go ``queue.go``: the ``dirty`` set), a key being
  synced is not handed to a second worker but re-queued when its sync ends
  (``processing``), and ``AddAfter`` keeps the earlier of two pending times
  (``delaying_queue.go`` ``insert``, client-go v0.36.3 as Metacontroller v4.17.2's go.mod
  pins it): a waiting entry fires once, whether or not the key was queued meanwhile.
* ``--workers`` goroutines drain it (``processNextWorkItem``).
* Every API request of the install goes through one client-go token bucket
  (``--client-go-qps``, ``--client-go-burst``; ``pkg/cmd/metacontroller/main.go`` sets
  them on the REST config; client-go waits for a token, FIFO, blocking the caller).
* A sync: the hook call (no API request: the parent, children and related Pods come
  from informer caches), then the children: a Service PUT only when it differs, then the
  status: one live GET always, a PUT only when the status changed
  (``updateParentStatus`` → ``AtomicStatusUpdate``).
* ``resyncAfterSeconds`` is ``AddAfter`` (``enqueueParentObjectAfter``).
* Our status PUT is a parent update event, our Service PUT a child event: each
  enqueues the parent once more (``updateParentObject``, ``onChildUpdate``), after a
  watch delay.
* A related Pod's change enqueues its parent at once (customize ``findRelatedParents``).
* ``resyncPeriodSeconds`` set: a ticker of that period (raised to 1 s when below, so
  ``0`` means every second) lists every parent from the cache and enqueues each
  (``pkg/dynamic/informer/informer.go`` ``eventHandler.start``/``resync``); the ticker
  runs only when the period is below ``--cache-flush-interval``. Absent: no ticker, but
  the shared informer's own resync at ``--cache-flush-interval`` (30 min) does the same
  (``AddEventHandler`` → ``addHandler`` with the relist period). Both are modelled.
* With shards, each install has its own queue, workers and bucket, and enqueues only
  the parents its ``parentResource.labelSelector`` matches (``enqueueParentObject``).

The hook is either REAL (gunicorn pods under ``hooks/shell/gunicorn_conf.py``, the recorded
request bodies, the fake fleet of ``testbed/fakes/patroni_fast.py``, in real time) or MODELLED
(a virtual clock; each sync holds one of the hook pods' cores for the hook CPU per sync
and lasts a sample of the sync latencies, both measured on the real hook at the start of
the same run). The API server is always modelled: a GET takes ``API_GET`` seconds, a PUT
``API_PUT``, a watch event arrives ``WATCH_DELAY`` after the write.

The lag of a switchover is measured from the moment the new leader answers 200 on the
health path to the moment Metacontroller's Service PUT selecting it returns.

The benchmark's parts, each a module of ``testbed/bench/fleet/``: the inputs and presets
(:mod:`~testbed.bench.fleet.settings`), the virtual clock and client-go's queue and bucket
(:mod:`~testbed.bench.fleet.virtual_queue`), the fleet model (:mod:`~testbed.bench.fleet.model`),
the real hook pods (:mod:`~testbed.bench.fleet.real_hook`); this module prints the table and runs
them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from testbed.bench.fleet.model import EVENTLESS, POD_CHANGING, Result, run_modelled
from testbed.bench.fleet.real_hook import calibrate, run_real
from testbed.bench.fleet.settings import (
    SHIPPED,
    SHIPPED_POLICY,
    TODAY,
    TODAY_POLICY,
    Mix,
    Row,
    full_rows,
)

# ----------------------------------------------------------------------------- table


def settings_text(row: Row) -> str:
    mc = row.mc
    period = "absent" if mc.resync_period is None else f"{mc.resync_period:g}"
    shards = f"{mc.shards}×" if mc.shards > 1 else ""
    pol = row.policy
    event = "—" if pol.event_resync is None else f"{pol.event_resync:g}"
    return (
        f"{shards}W{mc.workers} Q{mc.qps:g}/B{mc.burst} period {period}; "
        f"poll {pol.poll:g} s, event-driven {event}; {row.hook_pods} hook pods"
        + (f" × {row.hook_threads} threads" if row.hook_threads != 16 else "")
    )


def fmt(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"


def table(results: Sequence[Result]) -> str:
    head = (
        "| row | N | settings | mode | Pod-changing lag p50 / p99 / max (s) [n] "
        "| event-less lag p50 / p90 / p99 / max (s) [n] | API req/s (peak 1 s) "
        "| hook syncs/s | hook CPU (cores) | queue wait p99 (s) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in results:
        pc, el = POD_CHANGING, EVENTLESS
        pod = (
            f"{fmt(r.lag(pc, 0.5))} / {fmt(r.lag(pc, 0.99))} / {fmt(r.lag(pc, 1.0))} "
            f"[{len(r.lags[pc])}"
            + (f", {r.unfinished[pc]} unfinished" if r.unfinished[pc] else "")
            + "]"
        )
        less = (
            f"{fmt(r.lag(el, 0.5))} / {fmt(r.lag(el, 0.9))} / {fmt(r.lag(el, 0.99))} / "
            f"{fmt(r.lag(el, 1.0))} [{len(r.lags[el])}"
            + (f", {r.unfinished[el]} unfinished" if r.unfinished[el] else "")
            + "]"
        )
        lines.append(
            f"| {r.row.label} | {r.row.n:,} | {settings_text(r.row)} | {r.mode} | {pod} | {less} "
            f"| {r.api_per_second:.0f} ({r.api_peak}) | {r.syncs_per_second:.0f} "
            f"| {r.hook_cores:.2f} ({r.hook_cpu_per_sync * 1000:.1f} ms/sync) "
            f"| {r.queue_wait_p99:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.bench.fleet.table", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=180.0, help="seconds per modelled row")
    parser.add_argument("--switchovers", type=int, default=600, help="per modelled row")
    parser.add_argument("--real-n", type=int, default=200, help="N of the real-vs-model check")
    parser.add_argument("--real-duration", type=float, default=60.0)
    parser.add_argument("--skip-real", action="store_true", help="no real rows; calibration only")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)

    print("calibrating: one real hook pod, 20 steady clusters, 12 s ...", flush=True)
    latencies, cpu = calibrate()
    print(
        f"  sync latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {sorted(latencies)[int(0.99 * len(latencies))] * 1000:.1f} ms; "
        f"hook CPU {cpu * 1000:.2f} ms/sync ({len(latencies)} syncs)",
        flush=True,
    )
    results: list[Result] = []
    if not args.skip_real:
        for label, mc, policy in (
            ("today, real", TODAY, TODAY_POLICY),
            ("shipped, real", SHIPPED, SHIPPED_POLICY),
        ):
            row = Row(
                label,
                args.real_n,
                mc,
                policy,
                mix=Mix(polled=1.0),
                duration=args.real_duration,
                switchovers=args.real_n // 2,
            )
            print(f"real: {label} N={row.n} ...", flush=True)
            real, _ = run_real(row)
            print(f"  load average after it: {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
            results.append(real)
            model = replace(
                row,
                label=label.replace("real", "model of it"),
                policy=replace(policy, from_reply=False),
            )
            results.append(run_modelled(model, latencies, cpu))
            print(table(results[-2:]), flush=True)
    for row in full_rows(args.duration, args.switchovers):
        print(f"modelled: {row.label} N={row.n} ...", flush=True)
        started = time.process_time()
        results.append(run_modelled(row, latencies, cpu))
        print(f"  ({time.process_time() - started:.0f} s CPU)", flush=True)
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "label": r.row.label,
                        "n": r.row.n,
                        "settings": settings_text(r.row),
                        "mode": r.mode,
                        "lags": r.lags,
                        "unfinished": r.unfinished,
                        "api_per_second": r.api_per_second,
                        "api_peak": r.api_peak,
                        "syncs_per_second": r.syncs_per_second,
                        "hook_cpu_per_sync": r.hook_cpu_per_sync,
                        "queue_wait_p99": r.queue_wait_p99,
                        "hook_errors": r.hook_errors,
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
