"""One load run against a hook pod: the client threads, the worker kill, the profiler.

:func:`run_load` starts ``--concurrency`` client threads, each a persistent keep-alive
``http.client`` connection sending one request again and again (with the hook's bearer token,
as Metacontroller does) and classifying every reply (a WRONG 200 is one that does not pin the
Service on the leader or fails Metacontroller's strict parsing); it can SIGKILL a gunicorn
worker half-way and run py-spy on the pod meanwhile. Its :class:`RunReport` holds the rates,
latencies, outcomes and the processes' CPU. Used by :mod:`testbed.bench.load` and
:mod:`testbed.bench.stages`.
"""

from __future__ import annotations

import http.client
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testbed.bench.common import (
    check_sync_reply,
    children,
    cpu_seconds,
)
from testbed.bench.stats import percentile
from testbed.fakes.patroni_fast import FakeMembers
from testbed.metacontroller.gunicorn import GunicornHook

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
        p50_ms=percentile(latencies, 0.50),
        p99_ms=percentile(latencies, 0.99),
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
