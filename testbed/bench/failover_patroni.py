"""Failovers on the real local Patroni cluster, followed by the real hook: routing lag.

Usage (from the repo root, with the project's venv)::

    python -m testbed.bench.failover_patroni                # 12: graceful, kill, switchover x 4
    python -m testbed.bench.failover_patroni --failovers 21 # the chaos run (>= 20 failovers)
    python -m testbed.bench.failover_patroni --kinds graceful,switchover --failovers 4
    # (quick, no TTL waits)

Each failover is one of:

* ``graceful``: SIGTERM of the leader's Patroni (it releases the leader lock); the Pod
  turns not ready, which Metacontroller sees as a related-Pod event (an immediate sync);
* ``kill``: SIGKILL of the leader's Patroni and PostgreSQL (no release: Patroni waits for
  the lock's TTL, 20 s here); the Pod turns not ready;
* ``switchover``: Patroni's ``POST /switchover``; no Pod changes at all, so only the hook's
  ``resyncAfterSeconds`` brings the next sync (as with an etcd DCS in Kubernetes).

Measured per failover, all on one monotonic clock:

* Patroni's own time from the trigger to the new leader's first ``role: primary`` answer;
* the routing lag: from that promotion to the first sync whose applied reply moved the
  Service (the stand-in applies replies the way Metacontroller does);
* a ground-truth sampler (every 20 ms, ``GET /primary`` on every member, independent of
  the hook) against the Service's selection: time with no leader at all, and time when a
  leader existed but the Service selected another pod;
* a client writing one row every 50 ms to "the Service" (the pod IP the selector names):
  writes that failed, and writes that landed anywhere but the leader (must be 0: a
  replica refuses writes);
* invariants over every sync: the Service never selects two pods, is never dropped, and
  no hook call fails.

Then the sync latency against the three real members is compared with one direct probe
of a member, side by side in one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import requests

from testbed.bench.stats import p50_p95_max
from testbed.metacontroller.gunicorn import credentials_for, gunicorn_hook
from testbed.metacontroller.harness import SERVICE, Rig, start_rig
from testbed.patroni import PatroniCluster

KINDS = ("graceful", "kill", "switchover")


@dataclass
class Failover:
    """One failover's figures (seconds)."""

    kind: str
    old: str
    new: str
    promotion: float  # trigger → new leader reports role primary
    routing_lag: float  # promotion → Service moved
    no_leader: float = 0.0  # sampler: no member was leader
    misrouted: float = 0.0  # sampler: a leader existed, the Service selected another pod


class Routed(Protocol):
    """What the sampler and the writer need of a rig: the cluster, and the members that
    clients are routed to now (the stand-in's Service here; the real EndpointSlice's ready
    addresses in :mod:`testbed.bench.failover_kube`)."""

    @property
    def cluster(self) -> PatroniCluster: ...

    def selected(self) -> list[str]: ...


@dataclass
class Sample:
    at: float
    leaders: tuple[str, ...]
    selected: tuple[str, ...]


@dataclass
class Writes:
    ok: int = 0
    failed: int = 0
    on_non_leader: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    failed_at: list[float] = field(default_factory=list)


class Sampler:
    """Polls Patroni's /primary on every member (ground truth) and the Service's selection."""

    def __init__(self, rig: Routed, interval: float = 0.02, max_seconds: float = 3600) -> None:
        self.rig = rig
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._max = max_seconds
        self._thread = threading.Thread(target=self._run, name="truth-sampler", daemon=True)
        self._session = requests.Session()
        self._session.trust_env = False

    def _leader_now(self) -> tuple[str, ...]:
        leaders = []
        for member in self.rig.cluster.members:
            try:
                answer = self._session.get(f"{member.api_url}/primary", timeout=(0.2, 0.3))
                if answer.status_code == 200 and answer.json().get("role") == "primary":
                    leaders.append(member.name)
            except (requests.RequestException, ValueError):
                pass
        return tuple(leaders)

    def _run(self) -> None:
        ends = time.monotonic() + self._max
        while not self._stop.is_set() and time.monotonic() < ends:
            leaders = self._leader_now()
            self.samples.append(Sample(time.monotonic(), leaders, tuple(self.rig.selected())))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._session.close()

    def classify(self, moments: Sequence[float]) -> dict[str, int]:
        """For each moment: was there no leader, a leader the Service selected, or another?"""
        counts = {"no_leader": 0, "service_on_leader": 0, "service_elsewhere": 0}
        for moment in moments:
            before = [s for s in self.samples if s.at <= moment]
            if not before:
                continue
            sample = before[-1]
            if not sample.leaders:
                counts["no_leader"] += 1
            elif sample.selected == sample.leaders[:1]:
                counts["service_on_leader"] += 1
            else:
                counts["service_elsewhere"] += 1
        return counts

    def between(self, start: float, end: float) -> tuple[float, float]:
        """(no-leader seconds, misrouted seconds) in [start, end]."""
        no_leader = misrouted = 0.0
        window = [s for s in self.samples if start <= s.at <= end]
        for before, after in itertools.pairwise(window):
            span = after.at - before.at
            if not before.leaders:
                no_leader += span
            elif before.selected != before.leaders[:1]:
                misrouted += span
        return no_leader, misrouted


class Writer:
    """Writes a row every ``interval`` to the pod the Service selects."""

    def __init__(self, rig: Routed, interval: float = 0.05, max_seconds: float = 3600) -> None:
        self.rig = rig
        self.interval = interval
        self.writes = Writes()
        self._stop = threading.Event()
        self._max = max_seconds
        self._thread = threading.Thread(target=self._run, name="service-writer", daemon=True)

    def _run(self) -> None:
        import psycopg2

        cluster = self.rig.cluster
        ends = time.monotonic() + self._max
        while not self._stop.is_set() and time.monotonic() < ends:
            selected = self.rig.selected()
            attempt = time.monotonic()  # classify a failure by when it was tried, not ended
            if selected:
                member = cluster.member(selected[0])
                try:
                    conn = psycopg2.connect(
                        cluster.dsn(member.name),
                        connect_timeout=1,
                        options="-c statement_timeout=1000",
                    )
                    try:
                        conn.autocommit = True
                        with conn.cursor() as cursor:
                            cursor.execute("INSERT INTO bench_writes (at) VALUES (now())")
                            cursor.execute("SELECT pg_is_in_recovery()")
                            row = cursor.fetchone()
                            in_recovery = bool(row and row[0])
                        self.writes.ok += 1
                        if in_recovery:
                            self.writes.on_non_leader += 1
                    finally:
                        conn.close()
                except psycopg2.Error as error:
                    self.writes.failed += 1
                    self.writes.failed_at.append(attempt)
                    kind = type(error).__name__
                    self.writes.errors[kind] = self.writes.errors.get(kind, 0) + 1
            self._stop.wait(self.interval)

    def __enter__(self) -> Writer:
        cluster = self.rig.cluster
        cluster.execute(
            cluster.leader() or "pg-orders-0",
            "CREATE TABLE IF NOT EXISTS bench_writes (id bigserial primary key, at timestamptz)",
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def one_failover(rig: Rig, kind: str) -> tuple[Failover, float]:
    """Trigger one failover of ``kind``; return its figures and the trigger time."""
    cluster = rig.cluster
    old = cluster.leader()
    if old is None:
        raise RuntimeError("no leader before the failover")
    count = len(rig.records)
    if kind == "switchover":
        result = cluster.switchover()
        trigger, election = result.requested_at, result.election
    else:
        _, trigger, election = rig.lose_leader(kind, timeout=90, poll_interval=0.01)
    moved = rig.wait_selected(election.name, timeout=30, after=count)
    # The promotion is seen by a 10 ms poll (see watch_leader), the Service move by the sync
    # that applied it: a lag within a poll interval can come out slightly negative.
    failover = Failover(
        kind=kind,
        old=old,
        new=election.name,
        promotion=election.first_primary - trigger,
        routing_lag=moved.finished - election.first_primary,
    )
    if kind != "switchover":
        if kind == "graceful":
            cluster.wait_stopped(old)
        cluster.start_member(old)
        rig.pod_changed(old, ready=True)
    cluster.wait_for_replicas(timeout=90)
    return failover, trigger


def sync_vs_direct_probe(rig: Rig, hook_url: str, rounds: int = 200) -> dict[str, float]:
    """Median sync latency (3 real members) and median direct probe, interleaved."""
    body = rig.standin.world.sync_request()
    session = requests.Session()
    session.trust_env = False
    leader = rig.cluster.leader()
    member = rig.cluster.member(leader or "pg-orders-0")
    syncs, probes = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        response = session.get(f"{member.api_url}/primary", timeout=(1, 2))
        probes.append(time.perf_counter() - started)
        assert response.status_code == 200
        started = time.perf_counter()
        reply = session.post(
            f"{hook_url}/sync", json=body, timeout=5, headers=credentials_for(hook_url)
        )
        syncs.append(time.perf_counter() - started)
        assert reply.status_code == 200
    session.close()
    return {
        "sync_p50_ms": 1000 * statistics.median(syncs),
        "probe_p50_ms": 1000 * statistics.median(probes),
        "ratio": statistics.median(syncs) / statistics.median(probes),
    }


def summarize(failovers: list[Failover]) -> list[str]:
    lines = [
        "| failover | n | Patroni promotion p50 / max (s) | routing lag p50 / p95 / max (s) |",
        "|---|---|---|---|",
    ]
    for kind in KINDS:
        chosen = [f for f in failovers if f.kind == kind]
        if not chosen:
            continue
        promo = [f.promotion for f in chosen]
        lag = [f.routing_lag for f in chosen]
        lines.append(
            f"| {kind} | {len(chosen)} | {statistics.median(promo):.2f} / {max(promo):.2f} | "
            f"{p50_p95_max(lag)} |"
        )
    return lines


@contextmanager
def running_rig(workdir: Path) -> Iterator[tuple[Rig, str]]:
    with PatroniCluster() as cluster, gunicorn_hook(workdir) as hook:
        rig = start_rig(cluster, hook.url)
        try:
            leader = cluster.leader()
            assert leader is not None
            rig.wait_selected(leader, timeout=15)
            yield rig, hook.url
        finally:
            rig.standin.stop()


def run(failovers: int, kinds: Sequence[str], probe_rounds: int) -> dict[str, Any]:
    """Start the cluster, the hook and the stand-in, then :func:`run_on` them."""
    workdir = Path(tempfile.mkdtemp(prefix="pgfh-bench-"))
    with running_rig(workdir) as (rig, hook_url):
        return run_on(rig, hook_url, failovers, kinds, probe_rounds)


def run_on(
    rig: Rig,
    hook_url: str,
    failovers: int,
    kinds: Sequence[str],
    probe_rounds: int,
    *,
    quiet: bool = False,
) -> dict[str, Any]:
    """Measure on a running rig (also used by the short chaos test in the suite)."""
    results: list[Failover] = []
    latency = sync_vs_direct_probe(rig, hook_url, probe_rounds)
    with Sampler(rig) as sampler, Writer(rig) as writer:
        for index, kind in zip(range(failovers), itertools.cycle(kinds), strict=False):
            failover, trigger = one_failover(rig, kind)
            failover.no_leader, failover.misrouted = sampler.between(trigger, time.monotonic())
            results.append(failover)
            if not quiet:
                print(
                    f"  #{index + 1:2d} {kind:10s} {failover.old} -> {failover.new}: "
                    f"promotion {failover.promotion:6.2f} s, "
                    f"routing lag {failover.routing_lag:.3f} s, "
                    f"no leader {failover.no_leader:5.2f} s, Service on a non-leader while a "
                    f"leader existed {failover.misrouted:.3f} s",
                    flush=True,
                )
        failed_when = sampler.classify(writer.writes.failed_at)
    records = rig.records
    invariants = {
        "syncs": len(records),
        "failed_hook_calls": sum(1 for r in records if r.error),
        "replies_selecting_two_pods": sum(1 for r in records if len(r.selected) > 1),
        "service_dropped": SERVICE in rig.standin.world.deleted_services,
    }
    return {
        "failovers": [f.__dict__ for f in results],
        "table": summarize(results),
        "latency": latency,
        "writes": {
            "ok": writer.writes.ok,
            "failed": writer.writes.failed,
            "failed_when": failed_when,
            "errors": writer.writes.errors,
            "on_non_leader": writer.writes.on_non_leader,
        },
        "invariants": invariants,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--failovers", type=int, default=12)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, cycled in order")
    parser.add_argument("--probe-rounds", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        parser.error(f"kinds must be among {KINDS}")
    print(
        f"Running {args.failovers} failovers ({', '.join(kinds)}) on the local cluster ...",
        flush=True,
    )
    results = run(args.failovers, kinds, args.probe_rounds)
    print("\nRouting lag after promotion (promotion = new leader first reports role primary):")
    print("\n".join(results["table"]))
    total_no_leader = sum(f["no_leader"] for f in results["failovers"])
    total_misrouted = sum(f["misrouted"] for f in results["failovers"])
    writes = results["writes"]
    latency = results["latency"]
    print(
        f"\nGround truth (20 ms sampler): no leader at all for {total_no_leader:.2f} s in total; "
        f"Service on a non-leader while a leader existed for {total_misrouted:.3f} s in total."
    )
    when = writes["failed_when"]
    print(
        f"Writes through the Service (one every 50 ms): {writes['ok']} ok, {writes['failed']} "
        f"failed ({when['no_leader']} while no member was leader, "
        f"{when['service_elsewhere']} while a leader existed but the Service was not on it yet, "
        f"{when['service_on_leader']} while the Service was on the leader), "
        f"{writes['on_non_leader']} landed on a non-leader."
    )
    print(
        f"Sync with 3 real members: p50 {latency['sync_p50_ms']:.2f} ms; one direct probe: "
        f"p50 {latency['probe_p50_ms']:.2f} ms; ratio {latency['ratio']:.2f} (goal <= 2)."
    )
    print(f"Invariants: {json.dumps(results['invariants'])}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    bad = results["invariants"]
    return (
        1
        if bad["failed_hook_calls"] or bad["replies_selecting_two_pods"] or bad["service_dropped"]
        else 0
    )


if __name__ == "__main__":
    sys.exit(main())
