"""Load on ONE hook pod: many concurrent syncs under the production gunicorn config.

Three processes share the machine, each measured on its own:

* the hook: ``gunicorn -c python:hooks.shell.gunicorn_conf 'hooks.shell.app:create_app()'`` (via
  :func:`testbed.metacontroller.gunicorn.gunicorn_hook`), ``GUNICORN_WORKERS``/``GUNICORN_THREADS``
  as in production (2 × 16), JSON logs and the access log on;
* the fake Patroni members (:mod:`testbed.fakes.patroni_fast`): one process, one member per
  loopback address, answering like Patroni (HTTP/1.0, close after the ~1 KiB JSON);
* the load generator: one process, ``--concurrency`` threads, each a persistent
  keep-alive ``http.client`` connection sending the steady-state sync request (Go's
  net/http keeps connections alive the same way) with the hook's bearer token (caller
  authentication is on, as in production), verifying every reply.

Half-way through the run one gunicorn worker is SIGKILLed. Requests it held fail
(connection reset / no reply) and Metacontroller would retry them; what must never
happen is a WRONG 200, so every 200 is checked to pin the Service on the fake leader,
keep it (name, v1/Service, namespace) and pass Metacontroller's strict parsing.

Run: ``.venv/bin/python -m testbed.bench.load [--duration 20] [--concurrency 32]``. Loopback only;
every loop is bounded by ``--duration`` and ``--max-requests``. One run's client threads, worker
kill and profiler are :mod:`testbed.bench.load_run`; this module sets up the pod, runs the
``/healthz`` and sync runs, and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from testbed.bench.common import (
    encode,
    pod_memory,
    recorded_body,
    steady_body,
)
from testbed.bench.load_run import RunReport, run_load
from testbed.fakes.patroni_fast import LEADER, REPLICA, FakeMembers, fake_members
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook

_LINE = re.compile(r":\d+\)$")


def profile_summary(path: Path, top: int = 25) -> str:
    """Inclusive and self shares of the busiest frames in py-spy's collapsed stacks.

    Idle frames (threads waiting in select/wait/accept) are left out, so the shares are
    of the time the workers spent on the CPU (or holding it, for the GIL).
    """
    idle = ("select (selectors", "wait (threading", "_worker (concurrent", "accept (")
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        # One entry per function, not per line: "f (file.py:12)" -> "f (file.py)".
        frames = [_LINE.sub(")", f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames or not count.isdigit() or any(frames[-1].startswith(i) for i in idle):
            continue
        n = int(count)
        total += n
        for frame in set(frames):
            inclusive[frame] += n
        own[frames[-1]] += n
    lines = [f"{total} busy samples; inclusive share of the busiest frames:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    lines.append("self share:")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


# -------------------------------------------------------------------- the scenario


@dataclass
class LoadResult:
    sync: RunReport
    healthz: RunReport
    memory_warm: dict[str, int]
    memory_after: dict[str, int]
    workers: int
    threads: int
    request_bytes: int
    cores: int = field(default_factory=lambda: os.cpu_count() or 0)


@contextmanager
def loaded_pod(
    workdir: Path, *, workers: int, threads: int, members: int = 3
) -> Iterator[tuple[GunicornHook, FakeMembers, bytes, str]]:
    """Fake members (pg-orders-1 leads) + the hook under gunicorn + the steady request."""
    behaviours = [REPLICA] * members
    behaviours[1] = LEADER
    with (
        fake_members(behaviours) as fakes,
        gunicorn_hook(
            workdir,
            workers=workers,
            threads=threads,
            # The fakes share one ephemeral port: allow exactly it (loopback is allowed
            # by the rig, PGFH_ALLOWED_POD_CIDRS=127.0.0.0/8).
            env={"PGFH_ALLOWED_PATRONI_PORTS": str(fakes.port)},
        ) as hook,
    ):
        body = steady_body(hook.url, recorded_body(fakes.hosts, fakes.port, fakes.names))
        yield hook, fakes, encode(body), fakes.names[1]


def measure(
    *,
    duration: float,
    healthz_duration: float,
    concurrency: int,
    workers: int = 2,
    threads: int = 16,
    kill: bool = True,
    warmup: float = 1.0,
    profile: Path | None = None,
    rate: float | None = None,
) -> LoadResult:
    with (
        tempfile.TemporaryDirectory(prefix="pgfh-load-") as tmp,
        loaded_pod(Path(tmp), workers=workers, threads=threads) as (hook, fakes, body, leader),
    ):
        run = partial(run_load, hook, concurrency=concurrency)
        sync_run = partial(run, method="POST", path="/sync", body=body, leader=leader)
        sync_run(name="warm-up", duration=min(3.0, duration), warmup=0.0)
        memory_warm = pod_memory(hook.process.pid)
        healthz = run(
            name="GET /healthz",
            method="GET",
            path="/healthz",
            body=None,
            leader=None,
            duration=healthz_duration,
            warmup=warmup,
            members=fakes,
            rate=rate,
        )
        sync = sync_run(
            name="POST /sync (3 members)",
            duration=duration,
            warmup=warmup,
            kill_at=duration / 2 if kill else None,
            members=fakes,
            profile=profile,
            rate=rate,
        )
        memory_after = pod_memory(hook.process.pid)
    return LoadResult(sync, healthz, memory_warm, memory_after, workers, threads, len(body))


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


def report(result: LoadResult) -> str:
    lines = [
        f"machine: {result.cores} cores shared by the hook (gunicorn {result.workers} workers × "
        f"{result.threads} threads), the fake Patroni process and the load client",
        f"sync request: {result.request_bytes} bytes (recorded fixture, steady state, 3 members)",
        "",
        "| run | clients | replies OK | rate (/s) | p50 ms | p99 ms | max ms | CPU s: hook / "
        "fakes / client (wall) | hook CPU ms per reply |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in (result.healthz, result.sync):
        cpu = run.cpu
        lines.append(
            f"| {run.name} | {run.concurrency} | {run.ok}/{run.requests} | {run.rate:.0f} | "
            f"{run.p50_ms:.1f} | {run.p99_ms:.1f} | {run.max_ms:.1f} | {cpu['hook']} / "
            f"{cpu['fake_patroni']} / {cpu['client']} ({cpu['wall']}) | "
            f"{1000 * cpu['hook'] / max(1, run.ok):.2f} |"
        )
    sync = result.sync
    lines.append("")
    lines.append(f"sync outcomes: {sync.outcomes}")
    lines.append(f"CPU s per live worker: healthz {result.healthz.extra}, sync {sync.extra}")
    if sync.rate_before_kill is not None and sync.rate_after_kill is not None:
        lines.append(
            f"sync rate before the kill (both workers up): {sync.rate_before_kill:.0f}/s; "
            f"after it: {sync.rate_after_kill:.0f}/s (keep-alive clients reconnect to "
            "whichever worker accepts first, and stay there)"
        )
    if sync.kill is not None:
        k = sync.kill
        respawn = f"{k.respawned_after:.2f} s" if k.respawned_after is not None else "not seen"
        lines.append(
            f"SIGKILL of worker {k.pid} at {k.at:.1f} s: in-flight requests got {k.in_flight}; "
            f"failures after the kill: {k.after or 'none'}; new worker after {respawn}"
        )
    lines.append(f"WRONG 200 replies: {sync.outcomes.get('WRONG 200', 0)} {sync.wrong or ''}")
    lines.append(
        f"memory (master + workers): after warm-up RSS {_mib(result.memory_warm['rss_kib'])} "
        f"(PSS {_mib(result.memory_warm['pss_kib'])}, {result.memory_warm['processes']} "
        f"processes); after the run RSS {_mib(result.memory_after['rss_kib'])} "
        f"(PSS {_mib(result.memory_after['pss_kib'])})"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="sync run, seconds")
    parser.add_argument("--healthz-duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=int(os.environ.get("GUNICORN_WORKERS", 2)))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("GUNICORN_THREADS", 16)))
    parser.add_argument("--no-kill", action="store_true", help="do not kill a worker")
    parser.add_argument(
        "--rate", type=float, help="paced: requests/s of all clients together (default: flat out)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--profile", type=Path, help="py-spy the workers during the sync run (raw output file)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 600 or not 1 <= args.healthz_duration <= 600:
        parser.error("durations must be between 1 and 600 s")
    if args.rate is not None and not 1 <= args.rate <= 10_000:
        parser.error("--rate must be between 1 and 10000 requests/s")
    result = measure(
        duration=args.duration,
        healthz_duration=args.healthz_duration,
        concurrency=args.concurrency,
        workers=args.workers,
        threads=args.threads,
        kill=not args.no_kill,
        profile=args.profile,
        rate=args.rate,
    )
    print(report(result))
    if args.profile:
        print(profile_summary(args.profile))
    if args.json:
        args.json.write_text(json.dumps(_plain(result), indent=2))
    return 1 if result.sync.outcomes.get("WRONG 200") else 0


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
