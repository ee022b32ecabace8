"""Load on ONE hook pod: many concurrent syncs under the production gunicorn config.

Three processes share the machine, each measured on its own:

* the hook: ``gunicorn -c python:hooks.shell.gunicorn_conf 'hooks.shell.app:create_app()'`` (via
  :func:`testbed.metacontroller.gunicorn.gunicorn_hook`), ``GUNICORN_WORKERS``/``GUNICORN_THREADS``
  as in
  production (2 × 16), JSON logs and the access log on;
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
every loop is bounded by ``--duration`` and ``--max-requests``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testbed.bench.common import (
    check_sync_reply,
    children,
    cpu_seconds,
    encode,
    pod_memory,
    recorded_body,
    steady_body,
)
from testbed.fakes.patroni_fast import LEADER, REPLICA, FakeMembers, fake_members
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook

OK = "ok"
HEADERS = {
    "Content-Type": "application/json",
    "User-Agent": "Go-http-client/1.1",
    "Accept-Encoding": "gzip",
}


# ------------------------------------------------------------------ the load generator


@dataclass(frozen=True, slots=True)
class Record:
    sent: float  # monotonic (CLOCK_MONOTONIC is system-wide: comparable across processes)
    done: float
    outcome: str  # OK, "WRONG 200: ...", "HTTP 503", "connection reset", ...


def _classify(error: BaseException) -> str:
    if isinstance(error, http.client.RemoteDisconnected):
        return "closed without a reply"
    if isinstance(error, ConnectionResetError):
        return "connection reset"
    if isinstance(error, BrokenPipeError):
        return "broken pipe"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return "client timeout"
    return f"error {type(error).__name__}"


def _client(
    url: str,
    method: str,
    path: str,
    body: bytes | None,
    leader: str | None,
    concurrency: int,
    duration: float,
    max_requests: int,
    credentials: dict[str, str],
    pipe: multiprocessing.connection.Connection,
    rate: float | None = None,
) -> None:
    """The load generator process: ``concurrency`` keep-alive clients for ``duration`` s.

    ``credentials``: the headers that authenticate to the hook (its bearer token), sent
    on every request as Metacontroller does (also to the open /healthz: same work).
    ``rate``: requests per second of all clients together, paced (each client sends on its
    own schedule, phases spread; a client that falls behind sends at once and does not
    catch up), the way a fleet's resyncs arrive; ``None``: as fast as replies come back.
    """
    headers = {**HEADERS, **credentials}
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    budget = iter(range(max_requests))
    budget_lock = threading.Lock()
    started = time.monotonic()
    ends_at = started + duration
    results: list[list[Record]] = [[] for _ in range(concurrency)]

    def check(status: int, data: bytes) -> str:
        if status != 200:
            return f"HTTP {status}"
        if leader is None:
            return OK if data == b'{"status":"ok"}' else f"WRONG 200: {data[:80]!r}"
        problem = check_sync_reply(status, data, leader)
        return OK if problem is None else f"WRONG 200: {problem}"

    def run(index: int, records: list[Record]) -> None:
        conn: http.client.HTTPConnection | None = None
        interval = concurrency / rate if rate else 0.0
        next_at = started + interval * index / concurrency
        while time.monotonic() < ends_at:
            if rate:
                time.sleep(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at + interval, time.monotonic())
                if time.monotonic() >= ends_at:
                    break
            with budget_lock:
                if next(budget, None) is None:
                    break
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=10)
            sent = time.monotonic()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                outcome = check(response.status, data)
                if response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as error:
                outcome = _classify(error)
                if conn is not None:
                    conn.close()
                conn = None
            records.append(Record(sent, time.monotonic(), outcome))
        if conn is not None:
            conn.close()

    before = os.times()
    pipe.send(("started", started))
    threads = [
        threading.Thread(target=run, args=(i, results[i]), daemon=True) for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration + 15)
    after = os.times()
    cpu = (after.user - before.user) + (after.system - before.system)
    pipe.send(("done", [r for rs in results for r in rs], cpu))


# ----------------------------------------------------------------------- one run


@dataclass
class KillReport:
    pid: int
    at: float  # seconds after the run started
    #: Outcomes of requests sent before the kill and finished after it.
    in_flight: dict[str, int]
    #: Non-OK outcomes of requests sent after the kill (kept-alive connections to the
    #: dead worker, and anything else).
    after: dict[str, int]
    respawned_after: float | None


@dataclass
class RunReport:
    name: str
    concurrency: int
    duration: float
    requests: int
    ok: int
    #: OK replies per second over the measured window (after warm-up), whole run.
    rate: float
    #: ... and before the kill only (both workers alive), and after it, if there was one.
    rate_before_kill: float | None
    rate_after_kill: float | None
    p50_ms: float
    p99_ms: float
    max_ms: float
    outcomes: dict[str, int]
    wrong: list[str]
    cpu: dict[str, float]
    kill: KillReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def run_load(
    hook: GunicornHook,
    *,
    name: str,
    method: str,
    path: str,
    body: bytes | None,
    leader: str | None,
    concurrency: int,
    duration: float,
    warmup: float = 1.0,
    kill_at: float | None = None,
    members: FakeMembers | None = None,
    max_requests: int = 2_000_000,
    profile: Path | None = None,
    rate: float | None = None,
) -> RunReport:
    """Drive ``hook`` from a separate client process; SIGKILL a worker at ``kill_at`` s."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    client = context.Process(
        target=_client,
        args=(
            hook.url,
            method,
            path,
            body,
            leader,
            concurrency,
            duration,
            max_requests,
            hook.headers,
            child,
            rate,
        ),
        name="load-client",
        daemon=True,
    )
    master = hook.process.pid
    client.start()
    child.close()
    try:
        if not parent.poll(30):
            raise RuntimeError("the load client did not start")
        tag, started = parent.recv()
        assert tag == "started"
        hook_pids = [master, *children(master)]
        cpu_before = {pid: cpu_seconds(pid) for pid in hook_pids}
        spy = _start_profiler(master, profile, duration - warmup - 0.5) if profile else None
        fakes_before = cpu_seconds(members.pid) if members else 0.0
        lost_cpu = 0.0
        kill: tuple[int, float] | None = None
        respawned: float | None = None
        if kill_at is not None:
            time.sleep(max(0.0, started + kill_at - time.monotonic()))
            workers = children(master)
            victim = workers[0]
            lost_cpu = cpu_seconds(victim) - cpu_before.get(victim, 0.0)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            kill = (victim, killed_at)
            for _ in range(2000):  # bounded: 20 s
                fresh = set(children(master)) - set(workers)
                if fresh:
                    respawned = time.monotonic() - killed_at
                    for pid in fresh:
                        cpu_before[pid] = cpu_seconds(pid)
                    break
                time.sleep(0.01)
        if not parent.poll(duration + 60):
            raise RuntimeError("the load client did not finish")
        tag, records, client_cpu = parent.recv()
        assert tag == "done"
        if spy is not None:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(5)
        ended = time.monotonic()
        hook_cpu = lost_cpu + sum(
            max(0.0, cpu_seconds(pid) - cpu_before.get(pid, cpu_seconds(pid)))
            for pid in {master, *children(master), *cpu_before}
            if kill is None or pid != kill[0]
        )
        fakes_cpu = (cpu_seconds(members.pid) - fakes_before) if members else 0.0
        per_worker = {
            pid: round(cpu_seconds(pid) - cpu_before.get(pid, 0.0), 2) for pid in children(master)
        }
    finally:
        client.join(10)
        if client.is_alive():
            client.kill()
            client.join(5)
        parent.close()

    measured = [r for r in records if r.sent >= started + warmup]
    ok = [r for r in measured if r.outcome == OK]
    latencies = sorted((r.done - r.sent) * 1000 for r in ok)
    window = max(1e-9, max((r.done for r in measured), default=ended) - (started + warmup))
    rate_before = rate_after = None
    kill_report = None
    if kill is not None:
        victim, killed_at = kill
        before = [r for r in ok if r.done < killed_at]
        rate_before = len(before) / max(1e-9, killed_at - (started + warmup))
        after_kill = [r for r in ok if r.sent >= killed_at]
        rate_after = len(after_kill) / max(1e-9, started + warmup + window - killed_at)
        in_flight = Counter(r.outcome for r in records if r.sent < killed_at <= r.done)
        after = Counter(r.outcome for r in records if r.sent >= killed_at and r.outcome != OK)
        kill_report = KillReport(
            victim, killed_at - started, dict(in_flight), dict(after), respawned
        )
    outcomes = Counter("WRONG 200" if r.outcome.startswith("WRONG") else r.outcome for r in records)
    return RunReport(
        name=name,
        concurrency=concurrency,
        duration=duration,
        requests=len(records),
        ok=sum(1 for r in records if r.outcome == OK),
        rate=len(ok) / window,
        rate_before_kill=rate_before,
        rate_after_kill=rate_after,
        p50_ms=_percentile(latencies, 0.50),
        p99_ms=_percentile(latencies, 0.99),
        max_ms=latencies[-1] if latencies else float("nan"),
        outcomes=dict(outcomes),
        wrong=sorted({r.outcome for r in records if r.outcome.startswith("WRONG")})[:5],
        cpu={
            "wall": round(ended - started, 2),
            "hook": round(hook_cpu, 2),
            "fake_patroni": round(fakes_cpu, 2),
            "client": round(client_cpu, 2),
        },
        kill=kill_report,
        extra={"cpu_per_live_worker": per_worker},
    )


# ------------------------------------------------------------------------ profiling


def _start_profiler(master: int, output: Path, seconds: float) -> subprocess.Popen[bytes]:
    """py-spy (a sampling profiler, from PyPI) on gunicorn's master and its workers."""
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return subprocess.Popen(
        [
            str(py_spy),
            "record",
            "--pid",
            str(master),
            "--subprocesses",
            "--rate",
            "250",
            "--duration",
            str(max(1, int(seconds))),
            "--nonblocking",  # never pause the workers: sampling must not change the run
            "--gil",  # only the thread holding the GIL: where the CPU goes
            "--format",
            "raw",
            "--output",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


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
        run_load(
            hook,
            name="warm-up",
            method="POST",
            path="/sync",
            body=body,
            leader=leader,
            concurrency=concurrency,
            duration=min(3.0, duration),
            warmup=0.0,
        )
        memory_warm = pod_memory(hook.process.pid)
        healthz = run_load(
            hook,
            name="GET /healthz",
            method="GET",
            path="/healthz",
            body=None,
            leader=None,
            concurrency=concurrency,
            duration=healthz_duration,
            warmup=warmup,
            members=fakes,
            rate=rate,
        )
        sync = run_load(
            hook,
            name="POST /sync (3 members)",
            method="POST",
            path="/sync",
            body=body,
            leader=leader,
            concurrency=concurrency,
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
