"""What ``resyncPeriodSeconds`` costs a fleet, and what it buys after every hook pod was down.

Run ``python -m testbed.bench.fleet.resync`` (modelled, virtual clock; about ten minutes of CPU).
The fleet model of :mod:`testbed.bench.fleet.model` with client-go's real work-queue rate limiter
(:mod:`testbed.metacontroller.ratelimit`, shared with the stand-in): a failed sync is
``AddRateLimited`` (5 ms doubling per parent up to 1000 s, and 10 retries/s for the whole queue), a
successful one ``Forget``s; a ``resyncPeriodSeconds`` tick ``Add``s every parent of the
install at once (no rate limiter).

For each setting, two runs of the recommended settings (docs/scale.md, "What to set"):

* **steady**: the fleet as in :mod:`testbed.bench.fleet.table` (switchovers spread over the
  run): the period's cost in API requests/s and hook syncs/s, and in the lag of a Pod-changing
  switchover (each tick's burst goes to the tail of the FIFO queue and every event waits
  behind it);
* **outage**: every hook pod down for ``--outage`` s (each call refused at once) with the
  switchovers inside it: the recovery, from the outage's end to the Service on the new
  leader (the modelled lag ends at Metacontroller's Service PUT; the real control plane
  adds the endpointslice hop, tens of ms). Without a period only the backoff (and the
  30-min cache flush) brings a parent back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from testbed.bench.fleet.model import POD_CHANGING, Result, run_modelled
from testbed.bench.fleet.real_hook import calibrate
from testbed.bench.fleet.settings import Mix, Row, recommended, recommended_row
from testbed.bench.fleet.table import fmt, settings_text

#: The warm-up before the outage starts (s of the run).
OUTAGE_AT = 30.0


def rows(
    n: int, periods: Sequence[float | None], outage: float, switchovers: int, mix: Mix
) -> list[Row]:
    mc, policy, _, _ = recommended(n, mix)
    out: list[Row] = []
    for period in periods:
        settings = replace(mc, resync_period=period)
        label = "absent" if period is None else f"{period:g} s"
        # Two periods at least, so that the share of switchovers a tick's burst delays is the
        # long-run one (one tick in a short run over-counts it).
        steady = max(180.0, 2 * (period or 0.0) + 60.0)
        fleet = {"mc": settings, "mix": mix, "policy": policy}
        out.append(recommended_row(f"steady, period {label}", n, steady, switchovers, **fleet))
        # Long enough for the slowest way back: the backoff's 1000 s cap (+ the bucket's
        # pace), or one period, after the outage.
        tail = (period if period is not None else 1000.0) + 120.0
        out.append(
            recommended_row(
                f"hooks down {outage:g} s, period {label}",
                n,
                OUTAGE_AT + outage + tail,
                min(switchovers, n // 10),
                **fleet,
                hooks_down_at=OUTAGE_AT,
                hooks_down_for=outage,
            )
        )
    return out


def line(result: Result) -> str:
    r = result
    if r.row.hooks_down_at is not None:
        values = r.recovery
        q = (
            " / ".join(
                fmt(values[min(len(values) - 1, max(0, int(p * len(values)) - 1))])
                for p in (0.5, 0.99, 1.0)
            )
            if values
            else "–"
        )
        unrec = f", {r.unrecovered} not routed" if r.unrecovered else ""
        figures = f"recovery p50 / p99 / max {q} s [{len(values)}{unrec}]"
    else:
        figures = (
            f"Pod-changing lag p50 / p99 / max {fmt(r.lag(POD_CHANGING, 0.5))} / "
            f"{fmt(r.lag(POD_CHANGING, 0.99))} / {fmt(r.lag(POD_CHANGING, 1.0))} s "
            f"[{len(r.lags[POD_CHANGING])}]"
        )
    return (
        f"| {r.row.label} | {r.row.n:,} | {settings_text(r.row)} | {figures} "
        f"| {r.api_per_second:.0f} ({r.api_peak}) | {r.syncs_per_second:.0f} "
        f"| {r.queue_wait_p99:.2f} | {r.hook_errors} |"
    )


HEAD = (
    "| row | N | settings | figures | API req/s (peak 1 s) | hook syncs/s "
    "| queue wait p99 (s) | hook errors |\n|---|---|---|---|---|---|---|---|"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.bench.fleet.resync", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--n", type=int, action="append", help="fleet sizes (5000)")
    parser.add_argument(
        "--period", type=float, action="append", help="resyncPeriodSeconds tried (60, 300)"
    )
    parser.add_argument("--outage", type=float, default=300.0, help="hooks down (s)")
    parser.add_argument("--switchovers", type=int, default=600)
    parser.add_argument("--cpu", type=float, help="hook CPU per sync (s); else calibrated")
    parser.add_argument(
        "--polled",
        action="store_true",
        help="every cluster polled (etcd), as the real-binary runs; else the stated mix",
    )
    args = parser.parse_args(argv)
    mix = Mix(polled=1.0) if args.polled else Mix()
    periods: list[float | None] = [None, *(args.period or [60.0, 300.0])]
    if args.cpu is None:
        print("calibrating: one real hook pod, 20 steady clusters, 12 s ...", flush=True)
        latencies, cpu = calibrate()
    else:
        latencies, cpu = [0.006] * 10, args.cpu
    print(
        f"  sync latency p50 {statistics.median(latencies) * 1000:.1f} ms; "
        f"hook CPU {cpu * 1000:.2f} ms/sync",
        flush=True,
    )
    lines = []
    for n in args.n or [5000]:
        for row in rows(n, periods, args.outage, args.switchovers, mix):
            started = time.process_time()
            result = run_modelled(row, latencies, cpu)
            lines.append(line(result))
            print(f"{lines[-1]}  ({time.process_time() - started:.0f} s CPU)", flush=True)
    print()
    print(HEAD)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
