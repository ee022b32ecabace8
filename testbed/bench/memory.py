"""Peak memory of ONE hook pod under the worst concurrent load the hook accepts.

The worst case is every request thread of every worker parsing the largest body the hook
accepts at the same time: ``GUNICORN_WORKERS`` × ``GUNICORN_THREADS`` connections, each
sending, again and again, a sync request of ``PGFH_MAX_REQUEST_BYTES`` (minus a little) whose
bulk is *structured* JSON (many small objects: the costliest for Python, about 6 to 7 bytes
of objects per byte of text), as a Pod spec with many environment variables is. Its Pods
sit outside ``PGFH_ALLOWED_POD_CIDRS``, so no probe waits: each sync is parse, decide,
reply, and the threads overlap as much as they can. The hook runs under the production
gunicorn config (:mod:`hooks.shell.gunicorn_conf`, via
:func:`testbed.metacontroller.gunicorn.gunicorn_hook`).

Printed per pod: each worker's peak RSS (the kernel's ``VmHWM``: exact, not sampled), the
peak of the pod's summed RSS and PSS (sampled every 20 ms), and the limit of
``deploy/base/deployment.yaml`` beside them. Run with the old defaults and the new to
compare:

    flock /tmp/pgfh-heavy.lock .venv/bin/python -m testbed.bench.memory \\
        --max-request-bytes 4194304 --in-flight 1000000000   # before: 4 MiB, no budget
    flock /tmp/pgfh-heavy.lock .venv/bin/python -m testbed.bench.memory --in-flight 1000000000
    flock /tmp/pgfh-heavy.lock .venv/bin/python -m testbed.bench.memory   # the defaults

Loopback only; every loop is bounded by ``--duration`` and ``--max-requests``.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hooks.shell.config import HookSettings
from testbed.bench.common import children, encode, memory_kib, recorded_body
from testbed.metacontroller.gunicorn import gunicorn_hook

LIMIT_MIB = 256  # deploy/base/deployment.yaml, resources.limits.memory


def padded_body(members: int, size: int) -> bytes:
    """A sync request of about ``size`` bytes with ``members`` Pods (outside the probe
    CIDRs), padded with environment variables in each Pod's first container."""
    names = [f"pg-orders-{i}" for i in range(members)]
    hosts = [f"10.244.{i // 250}.{i % 250 + 1}" for i in range(members)]
    body = recorded_body(hosts, 8008, names)
    base = len(encode(body))
    entry = {"name": "PGFH_BENCH_PADDING_00000", "value": "v" * 24}
    per_entry = len(json.dumps(entry, separators=(",", ":"))) + 1
    per_pod = max(0, (size - base) // members // per_entry)
    for index, pod in enumerate(body["related"]["Pod.v1"].values()):
        containers = pod.setdefault("spec", {}).setdefault("containers", [{"name": "postgres"}])
        env = containers[0].setdefault("env", [])
        for n in range(per_pod):
            item = copy.copy(entry)
            item["name"] = f"PGFH_BENCH_{index:03d}_{n:06d}"
            env.append(item)
    data = encode(body)
    while len(data) > size:  # the estimate may overshoot by a few entries: trim
        pod = next(iter(body["related"]["Pod.v1"].values()))
        del pod["spec"]["containers"][0]["env"][-8:]
        data = encode(body)
    return data


def peak_rss_kib(pid: int) -> int:
    """The kernel's high-water mark of a process's RSS (``VmHWM``), in KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Totals:
    ok: int = 0
    refused: int = 0
    busy: int = 0
    failed: int = 0


def load(url: str, headers: dict[str, str], data: bytes, stop: float, cap: int, t: Totals) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    lock = threading.Lock()
    sent = 0
    while time.monotonic() < stop and sent < cap:
        sent += 1
        try:
            conn.request("POST", "/sync", body=data, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            status = 0
            conn.close()
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        with lock:
            if status == 200:
                t.ok += 1
            elif status in (429, 503):  # busy: 429 since 2026-12-04, 503 before
                t.busy += 1
            elif 400 <= status < 500:
                t.refused += 1
            else:
                t.failed += 1
    conn.close()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    env = {"GUNICORN_ACCESS_LOG": "0", "PGFH_LOG_LEVEL": "WARNING"}
    if args.max_request_bytes:
        env["PGFH_MAX_REQUEST_BYTES"] = str(args.max_request_bytes)
    if args.in_flight:
        env["PGFH_MAX_BODY_BYTES_IN_FLIGHT"] = str(args.in_flight)
    for item in args.env:
        key, _, value = item.partition("=")
        env[key] = value
    settings = HookSettings.from_env(env)
    cap = settings.max_request_bytes
    data = padded_body(args.members, args.body_bytes or cap - 1024)
    concurrency = args.workers * args.threads
    with (
        tempfile.TemporaryDirectory(prefix="pgfh-memory-") as tmp,
        gunicorn_hook(Path(tmp), env=env, workers=args.workers, threads=args.threads) as hook,
    ):
        headers = {**hook.headers, "Content-Type": "application/json"}
        master = hook.process.pid
        workers = children(master)
        idle = {pid: memory_kib(pid)[0] for pid in workers}
        peak_rss_sum = peak_pss_sum = 0
        totals = Totals()
        stop = time.monotonic() + args.duration
        threads = [
            threading.Thread(
                target=load,
                args=(hook.url, headers, data, stop, args.max_requests, totals),
                daemon=True,
            )
            for _ in range(concurrency)
        ]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads) and time.monotonic() < stop + 30:
            rss = pss = 0
            for pid in [master, *children(master)]:
                r, p = memory_kib(pid)
                rss, pss = rss + r, pss + p
            peak_rss_sum, peak_pss_sum = max(peak_rss_sum, rss), max(peak_pss_sum, pss)
            time.sleep(0.02)
        for thread in threads:
            thread.join(timeout=30)
        now_workers = children(master)
        hwm = {pid: peak_rss_kib(pid) for pid in now_workers}
        master_rss = memory_kib(master)[0]
        restarted = sorted(set(now_workers) - set(workers))
    return {
        "body_bytes": len(data),
        "cap": cap,
        "in_flight": settings.max_body_bytes_in_flight,
        "members": args.members,
        "env": args.env,
        "concurrency": concurrency,
        "workers": args.workers,
        "threads": args.threads,
        "idle_rss_kib": idle,
        "peak_rss_kib": hwm,
        "master_rss_kib": master_rss,
        "restarted_workers": restarted,
        "peak_pod_rss_kib": peak_rss_sum,
        "peak_pod_pss_kib": peak_pss_sum,
        "ok": totals.ok,
        "refused": totals.refused,
        "busy": totals.busy,
        "failed": totals.failed,
    }


def report(result: dict[str, Any]) -> str:
    mib = 1024
    lines = [
        f"body {result['body_bytes']:,} bytes (PGFH_MAX_REQUEST_BYTES={result['cap']:,}, "
        f"PGFH_MAX_BODY_BYTES_IN_FLIGHT={result['in_flight']:,}), "
        f"{result['members']} Pods, {result['workers']} workers x {result['threads']} threads "
        f"= {result['concurrency']} concurrent syncs {' '.join(result['env'])}",
        f"replies: {result['ok']} x 200, {result['refused']} x 4xx, {result['busy']} x 429 "
        f"(busy), {result['failed']} failed",
    ]
    for pid, peak in sorted(result["peak_rss_kib"].items()):
        idle = result["idle_rss_kib"].get(pid, 0)
        lines.append(
            f"  worker {pid}: idle RSS {idle / mib:6.1f} MiB, "
            f"peak RSS (VmHWM) {peak / mib:6.1f} MiB"
        )
    if result["restarted_workers"]:
        lines.append(f"  workers restarted during the run: {result['restarted_workers']}")
    rss, pss = result["peak_pod_rss_kib"] / mib, result["peak_pod_pss_kib"] / mib
    master = result["master_rss_kib"] / mib
    worst = master + sum(result["peak_rss_kib"].values()) / mib
    lines.append(
        f"pod (master + workers): peak RSS {rss:.1f} MiB, peak PSS {pss:.1f} MiB (sampled); "
        f"master {master:.1f} MiB + each worker's peak = {worst:.1f} MiB (the worst case); "
        f"limit {LIMIT_MIB} MiB, headroom {LIMIT_MIB - max(rss, worst):.1f} MiB"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)  # GUNICORN_THREADS default
    parser.add_argument("--members", type=int, default=HookSettings().probe_policy.max_members)
    parser.add_argument("--max-request-bytes", type=int, default=0, help="0: the hook's default")
    parser.add_argument(
        "--in-flight", type=int, default=0, help="PGFH_MAX_BODY_BYTES_IN_FLIGHT (0: default)"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        help="KEY=VALUE for the hook (e.g. MALLOC_ARENA_MAX=2)",
    )
    parser.add_argument("--body-bytes", type=int, default=0, help="0: the cap minus 1 KiB")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--max-requests", type=int, default=2000, help="per connection")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args)
    print(json.dumps(result) if args.json else report(result))


if __name__ == "__main__":
    main()
