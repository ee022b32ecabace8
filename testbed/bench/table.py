"""The benchmark table: each ratio measured side by side in one run, printed as markdown.

Rows (each with the goal the hook was built to):

* sync latency with 3 healthy members ÷ one direct probe of a member (goal ≤ 2),
  against the real Patroni cluster (devcluster) and against the fake members;
* sync latency with one hung member (goal ≤ probe deadline + 100 ms);
* sync latency with 9 members ÷ with 3 (goal ≤ 1.3: the probes run in parallel);
* syncs/s of one pod (2 cores shared with the load client and the fakes) under the
  production gunicorn config, beside GET /healthz's rate under the same client
  (goal ≥ 400 syncs/s);
* memory of one hook pod (RSS and PSS of gunicorn's master + workers) after warm-up and
  after the load run;
* routing lag: ``python -m testbed.bench.failover_patroni`` (real failovers followed by the real
  hook).

"Side by side": the two series of a ratio are sampled alternately (one of each per
round), so both see the same machine. A sync is the full round trip Metacontroller sees
(POST /sync of the steady-state recorded request over a kept-alive connection to the
hook under ``gunicorn -c python:hooks.shell.gunicorn_conf``); a direct probe is one
``GET /primary`` on a fresh connection (Patroni closes every connection), from the same
process. Every sync reply is checked (strict parsing, Service kept, pinned on the leader).
The hook runs as in production but for two settings the loopback rig needs: caller
authentication is on (every sync carries the rig's bearer token), loopback is an allowed
Pod network (``PGFH_ALLOWED_POD_CIDRS=127.0.0.0/8``, set by the rig) and the fakes'
ephemeral ports are allowed Patroni ports besides 8008.

Run (the real cluster binds fixed addresses, other people use it: take the lock)::

    flock -w 1800 /tmp/pgfh-cluster.lock .venv/bin/python -m testbed.bench.table

``--no-patroni`` skips the real cluster (and the lock). Loopback only; every loop is
bounded by its sample count.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hooks.domain.members import ProbeTarget
from hooks.patroni import PatroniProber
from hooks.shell.config import HookSettings
from testbed.bench.common import check_sync_reply, encode, recorded_body, steady_body
from testbed.bench.load import measure
from testbed.fakes.patroni_fast import HUNG, LEADER, REPLICA, fake_members
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook

DEADLINE = HookSettings().probe_deadline  # the production default, 2 s
#: The hook's settings on this rig: real Patroni on 8008, fakes on ephemeral ports, all on
#: loopback (which production never probes unless told to).
RIG_ENV = {"PGFH_ALLOWED_PATRONI_PORTS": "1024-65535", "PGFH_ALLOWED_POD_CIDRS": "127.0.0.0/8"}


@dataclass
class Series:
    name: str
    samples: list[float]  # seconds

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p90(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


class SyncClient:
    """One kept-alive connection to the hook, posting one request body, checking replies."""

    def __init__(self, hook: GunicornHook, body: dict[str, Any], leader: str) -> None:
        host, port = hook.url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.data = encode(body)
        self.leader = leader
        # As Metacontroller calls it: with the bearer token from the hook's Secret.
        self.headers = {"Content-Type": "application/json", **hook.headers}

    def __call__(self) -> float:
        started = time.perf_counter()
        self.conn.request("POST", "/sync", body=self.data, headers=self.headers)
        response = self.conn.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - started
        problem = check_sync_reply(response.status, data, self.leader)
        if problem is not None:
            raise AssertionError(f"wrong sync reply: {problem}")
        return elapsed

    def close(self) -> None:
        self.conn.close()


class Healthz(SyncClient):
    """GET /healthz on a kept-alive connection: the floor of any request to the hook."""

    def __init__(self, hook: GunicornHook) -> None:
        host, port = hook.url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def __call__(self) -> float:
        started = time.perf_counter()
        self.conn.request("GET", "/healthz")
        response = self.conn.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise AssertionError(f"/healthz answered {response.status}")
        return elapsed


def direct_probe(host: str, port: int) -> Callable[[], float]:
    """One GET /primary on a fresh connection, as a prober does (Patroni closes it)."""

    def probe() -> float:
        started = time.perf_counter()
        conn = http.client.HTTPConnection(host, port, timeout=5)
        try:
            conn.request("GET", "/primary", headers={"Accept": "application/json"})
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        return time.perf_counter() - started

    return probe


def side_by_side(
    *series: tuple[str, Callable[[], float]], rounds: int, warmup: int = 20
) -> list[Series]:
    """Alternate the measurements (one of each per round), ``rounds`` times after ``warmup``."""
    results = [Series(name, []) for name, _ in series]
    for index in range(warmup + rounds):
        for result, (_, measure_once) in zip(results, series, strict=True):
            value = measure_once()
            if index >= warmup:
                result.samples.append(value)
    return results


def probe_round(hosts: Sequence[str], port: int, names: Sequence[str]) -> Callable[[], float]:
    """The hook's own probe round (hooks.patroni, in this process: no HTTP front)."""
    settings = HookSettings.from_env(RIG_ENV)
    prober = PatroniProber.from_settings(settings)
    targets = [
        ProbeTarget(
            pod=name, url=f"http://{host}:{port}/primary", connect_timeout=0.5, read_timeout=1.0
        )
        for name, host in zip(names, hosts, strict=True)
    ]

    def run() -> float:
        started = time.perf_counter()
        result = prober.probe(targets)
        elapsed = time.perf_counter() - started
        if sum(1 for status in result.values() if status.is_leader) != 1:
            raise AssertionError(f"probe round without exactly one leader: {result}")
        return elapsed

    return run


@contextmanager
def members_body(
    hook: GunicornHook, behaviours: Sequence[str], first_host: int, **spec: Any
) -> Iterator[tuple[dict[str, Any], str, Any]]:
    """Fake members + the steady request for them; pg-orders-1 leads."""
    with fake_members(behaviours, first_host=first_host) as fakes:
        first = recorded_body(fakes.hosts, fakes.port, fakes.names)
        first["parent"]["spec"]["patroni"].update(spec)
        yield steady_body(hook.url, first), fakes.names[1], fakes


@dataclass
class Row:
    measure: str
    value: str
    goal: str
    verdict: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _ratio_row(name: str, top: Series, bottom: Series, goal: float) -> Row:
    ratio = top.p50 / bottom.p50
    verdict = "met" if ratio <= goal else f"missed by {ratio / goal - 1:.0%}"
    return Row(
        name,
        f"**{ratio:.2f}** ({_ms(top.p50)} ÷ {_ms(bottom.p50)}, p50 of {len(top.samples)}; "
        f"p90 {_ms(top.p90)} ÷ {_ms(bottom.p90)})",
        f"≤ {goal:g}",
        verdict,
    )


def real_patroni_rows(hook: GunicornHook, rounds: int) -> list[Row]:
    from testbed.patroni import API_PORT, PatroniCluster

    cluster = PatroniCluster()
    cluster.start(timeout=90)
    try:
        leader = cluster.leader()
        assert leader is not None
        ips = [cluster.member(name).ip for name in cluster.names()]
        body = steady_body(hook.url, recorded_body(ips, API_PORT, cluster.names()))
        client = SyncClient(hook, body, leader)
        try:
            sync, probe, round_ = side_by_side(
                ("sync", client),
                ("probe", direct_probe(cluster.member(leader).ip, API_PORT)),
                ("round", probe_round(ips, API_PORT, cluster.names())),
                rounds=rounds,
            )
        finally:
            client.close()
    finally:
        cluster.stop()
    return [
        _ratio_row(
            "sync (3 healthy members) ÷ one direct probe — **real Patroni 4.1.5**",
            sync,
            probe,
            2.0,
        ),
        _ratio_row(
            "↳ the hook's probe round alone (3 members, in-process) ÷ one direct probe — "
            "real Patroni",
            round_,
            probe,
            2.0,
        ),
    ]


def fake_rows(hook: GunicornHook, rounds: int, hung_rounds: int) -> list[Row]:
    rows: list[Row] = []
    three = [REPLICA, LEADER, REPLICA]
    nine = [REPLICA, LEADER] + [REPLICA] * 7
    with (
        members_body(hook, three, 40) as (body3, leader3, fakes3),
        members_body(hook, nine, 50) as (body9, leader9, fakes9),
    ):
        sync3 = SyncClient(hook, body3, leader3)
        healthz = Healthz(hook)
        sync9 = SyncClient(hook, body9, leader9)
        try:
            sync, probe, round_, floor = side_by_side(
                ("sync", sync3),
                ("probe", direct_probe(fakes3.hosts[1], fakes3.port)),
                ("round", probe_round(fakes3.hosts, fakes3.port, fakes3.names)),
                ("healthz", healthz),
                rounds=rounds,
            )
            rows.append(
                _ratio_row("sync (3 healthy members) ÷ one direct probe — fakes", sync, probe, 2.0)
            )
            rows.append(
                _ratio_row(
                    "↳ the hook's probe round alone (3 members, in-process) ÷ one direct "
                    "probe — fakes",
                    round_,
                    probe,
                    2.0,
                )
            )
            rest = sync.p50 - floor.p50 - round_.p50
            rows.append(
                Row(
                    "↳ where a sync's time goes (p50, fakes)",
                    f"{_ms(sync.p50)} = GET /healthz round trip {_ms(floor.p50)} (gunicorn + "
                    f"Flask floor) + probe round {_ms(round_.p50)} + the rest {_ms(rest)} "
                    "(26 KB body: send, JSON, validation, decision, reply)",
                    "",
                    "",
                )
            )
            s9, s3, r9, r3 = side_by_side(
                ("9 members", sync9),
                ("3 members", sync3),
                ("round of 9", probe_round(fakes9.hosts, fakes9.port, fakes9.names)),
                ("round of 3", probe_round(fakes3.hosts, fakes3.port, fakes3.names)),
                rounds=rounds,
            )
            rows.append(_ratio_row("sync with 9 members ÷ with 3 — fakes", s9, s3, 1.3))
            rows.append(
                _ratio_row(
                    "↳ the hook's probe round alone (in-process): 9 members ÷ 3 — fakes",
                    r9,
                    r3,
                    1.3,
                )
            )
        finally:
            sync3.close()
            sync9.close()
            healthz.close()
    # pg-orders-2 accepts and never answers; readTimeoutSeconds 5 (the spec's maximum)
    # so that only the round's deadline can end the wait.
    with members_body(hook, [REPLICA, LEADER, HUNG], 60, readTimeoutSeconds=5) as (
        body,
        leader,
        _,
    ):
        client = SyncClient(hook, body, leader)
        try:
            hung = Series("hung", [client() for _ in range(hung_rounds)])
        finally:
            client.close()
    bound = DEADLINE + 0.1
    worst = max(hung.samples)
    rows.append(
        Row(
            "sync with one hung member (probe deadline "
            f"{DEADLINE:g} s, spec read timeout 5 s) — fakes",
            f"**{_ms(hung.p50)}** p50, {_ms(worst)} max of {len(hung.samples)}",
            f"≤ {_ms(bound)}",
            "met" if worst <= bound else f"missed by {_ms(worst - bound)}",
        )
    )
    return rows


def load_rows(duration: float) -> tuple[list[Row], str]:
    result = measure(duration=duration, healthz_duration=duration / 2, concurrency=32, kill=False)
    sync, healthz = result.sync, result.healthz
    rows = [
        Row(
            f"syncs/s of one pod (gunicorn {result.workers}×{result.threads}, "
            f"{result.cores} cores shared with client + fakes), 32 keep-alive clients",
            f"**{sync.rate:.0f}/s** (p50 {sync.p50_ms:.1f} ms, p99 {sync.p99_ms:.1f} ms; "
            f"hook CPU {1000 * sync.cpu['hook'] / max(1, sync.ok):.2f} ms/sync); "
            f"GET /healthz: {healthz.rate:.0f}/s",
            "≥ 400/s",
            "met" if sync.rate >= 400 else f"missed by {1 - sync.rate / 400:.0%}",
        ),
        Row(
            "memory of one hook pod (master + 2 workers: RSS sum / PSS sum)",
            f"after warm-up {result.memory_warm['rss_kib'] / 1024:.0f} / "
            f"{result.memory_warm['pss_kib'] / 1024:.0f} MiB; after the load run "
            f"{result.memory_after['rss_kib'] / 1024:.0f} / "
            f"{result.memory_after['pss_kib'] / 1024:.0f} MiB",
            "(reported)",
            "",
        ),
    ]
    cpu = sync.cpu
    note = (
        f"load run CPU seconds in {cpu['wall']} s wall (2 cores = {2 * cpu['wall']:.0f}): "
        f"hook {cpu['hook']}, fake Patroni {cpu['fake_patroni']}, client {cpu['client']}; "
        f"outcomes {sync.outcomes}"
    )
    return rows, note


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| measure | value | goal | |", "|---|---|---|---|"]
    lines += [f"| {r.measure} | {r.value} | {r.goal} | {r.verdict} |" for r in rows]
    lines.append(
        "| routing lag (failover → Service on the new leader) | "
        "see `python -m testbed.bench.failover_patroni` | | |"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-patroni", action="store_true", help="skip the real cluster")
    parser.add_argument("--rounds", type=int, default=300, help="samples per latency series")
    parser.add_argument("--hung-rounds", type=int, default=5)
    parser.add_argument("--load-seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    if not (10 <= args.rounds <= 5000 and 1 <= args.hung_rounds <= 50):
        parser.error("--rounds 10..5000, --hung-rounds 1..50")
    if not 2 <= args.load_seconds <= 300:
        parser.error("--load-seconds 2..300")
    rows: list[Row] = []
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="pgfh-table-") as tmp,
        gunicorn_hook(Path(tmp), workers=2, threads=16, env=RIG_ENV) as hook,
    ):
        if not args.no_patroni:
            rows += real_patroni_rows(hook, args.rounds)
        rows += fake_rows(hook, args.rounds, args.hung_rounds)
    load, note = load_rows(args.load_seconds)
    rows += load
    print(markdown(rows))
    print()
    print(note)
    print(f"(table measured in {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
