"""Metacontroller's related-object event path: what is measured, and how it is printed.

Metacontroller's CPU and Go runtime figures per second of a churn, the machine's load, the
hook errors in its log, ``findRelatedParents``' CPU from a pprof profile, the probes' lags and
the timeline lines that show where in the window the tail lies; one shape's result line.
Used by :mod:`testbed.bench.related_walk`.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from testbed.bench.common import cpu_seconds


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ measuring


def metrics_url(args: Sequence[str]) -> str | None:
    """Metacontroller's /metrics from its ``--metrics-address`` argument."""
    for arg in args:
        if arg.startswith("--metrics-address="):
            return f"http://{arg.split('=', 1)[1]}/metrics"
    return None


#: Go runtime figures of Metacontroller's /metrics sampled each second of a churn.
GO_METRICS = ("go_gc_duration_seconds_sum", "go_gc_duration_seconds_count", "go_goroutines")


def machine_sample(pid: int, url: str | None) -> dict[str, float]:
    """Metacontroller's CPU, this bench process's CPU (patchers, probes and the bench hook
    share its GIL), the load average, and Go's GC totals: cumulative, diffed per slice."""
    out = {
        "mc_cpu": cpu_seconds(pid),
        "bench_cpu": time.process_time(),
        "load1": os.getloadavg()[0],
    }
    if url:
        try:
            text = requests.get(url, timeout=0.5).text
        except requests.RequestException:
            return out
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in GO_METRICS:
                out[name] = float(value)
    return out


def timeline_lines(
    timeline: Sequence[tuple[float, int, Mapping[str, float]]],
    offsets: Sequence[float],
    lags: Sequence[float],
    patch_seconds: Sequence[float] = (),
    slice_s: float = 10.0,
) -> list[str]:
    """Per ``slice_s`` of the churn: patches/s reached, Metacontroller's and the bench's
    cores, GC pause and cycles, the load, and the probes' lag max there, with the longest
    time the API server took to answer a probe's PATCH (pure)."""
    out = []
    i = 0
    while i < len(timeline):
        t0, n0, a = timeline[i]
        j = next(
            (k for k in range(i + 1, len(timeline)) if timeline[k][0] >= t0 + slice_s - 0.5), None
        )
        if j is None:
            break
        t1, n1, b = timeline[j]
        span = t1 - t0
        in_slice = [lag for at, lag in zip(offsets, lags, strict=True) if t0 <= at < t1]
        answered = [d for at, d in zip(offsets, patch_seconds, strict=False) if t0 <= at < t1]
        diff = {key: b.get(key, 0.0) - a.get(key, 0.0) for key in b}
        out.append(
            f"{t0:5.1f}-{t1:5.1f} s: patches {(n1 - n0) / span:5.0f}/s, "
            f"MC {diff.get('mc_cpu', 0.0) / span:.2f} core, "
            f"bench {diff.get('bench_cpu', 0.0) / span:.2f} core, "
            f"GC {diff.get('go_gc_duration_seconds_count', 0.0):.0f} cycles "
            f"{diff.get('go_gc_duration_seconds_sum', 0.0) * 1000:.1f} ms paused, "
            f"goroutines {b.get('go_goroutines', 0.0):.0f}, load {b.get('load1', 0.0):.1f}, "
            f"probes {len(in_slice)} lag max {max(in_slice, default=float('nan')):.3f} s"
            + (f" (PATCH answered within {max(answered):.3f} s)" if answered else "")
        )
        i = j
    return out


def hook_errors(log: Path) -> int:
    """Metacontroller's "Unhandled Error" lines so far (a hook call failed or timed out)."""
    try:
        return log.read_text(errors="replace").count('"msg":"Unhandled Error"')
    except FileNotFoundError:
        return 0


def wait_quiet(pid: int, limit: float, idle: float = 0.05) -> float:
    """Seconds until the process uses under ``idle`` of a core over 2 s (bounded)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = cpu_seconds(pid)
        time.sleep(2.0)
        if cpu_seconds(pid) - before < idle * 2.0:
            return time.monotonic() - started
    return float("nan")


def walk_seconds(profile: Path, go: str = "go") -> float | None:
    """CPU seconds in ``findRelatedParents`` (cumulative) in a pprof CPU profile."""
    out = subprocess.run(
        [go, "tool", "pprof", "-top", "-cum", "-nodefraction=0", str(profile)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    for line in out.splitlines():
        if "findRelatedParents" in line and "func" not in line.split()[-1][:4]:
            cum = line.split()[3]
            return _seconds(cum)
    return None


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(ms|s|us|µs|min)?", text)
    if not match:
        return float("nan")
    value = float(match.group(1))
    return value * {"ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60.0}.get(match.group(2) or "s", 1.0)


@dataclass
class ShapeResult:
    shape: str
    startup_drain: float
    events: int
    seconds: float
    cpu_per_event_ms: float
    walk_per_parent_event_us: float | None
    lag: list[float]
    lost: int
    errors: int = 0
    serving: int = 0

    def line(self, parents: int) -> str:
        lag = self.lag
        walk = (
            "n/a"
            if self.walk_per_parent_event_us is None
            else f"{self.walk_per_parent_event_us:.2f}"
        )
        return (
            f"{self.shape:12} parents={parents} served={self.serving} "
            f"start-drain={self.startup_drain:6.1f}s "
            f"events={self.events} ({self.events / self.seconds:.0f}/s) "
            f"MC CPU/event={self.cpu_per_event_ms:.3f} ms  walk/parent/event={walk} us  "
            f"lag p50/p90/p99/max={percentile(lag, 0.5):.3f}/{percentile(lag, 0.9):.3f}/"
            f"{percentile(lag, 0.99):.3f}/{max(lag, default=float('nan')):.3f} s "
            f"(probes {len(lag)}, not synced {self.lost}; hook errors {self.errors})"
        )
