"""A short smoke run of the load benchmark (testbed/bench/load.py), and big requests over gunicorn.

Test design: the benchmark's own code, shortened (a few seconds, 8 clients): the hook
under the production gunicorn config, fake Patroni members in their own process, the
load client in another, one worker SIGKILLed half-way. Only correctness is asserted,
never a rate or a latency: no WRONG 200 (every 200 pins the Service on the fake leader
and keeps it), replies did flow before and after the kill, gunicorn replaced the worker,
and the figures the benchmark reports exist. Loopback only.
"""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import pytest
import requests

from testbed.bench.common import encode
from testbed.bench.load import measure, report
from testbed.bench.load_run import OK
from testbed.bench.spread import GoTransport, run_mode
from testbed.bench.stages import measure as stages_measure
from testbed.metacontroller.apply import check_reply
from testbed.metacontroller.gunicorn import free_port, gunicorn_hook
from tests.helpers import many_pods

pytestmark = [pytest.mark.slow, pytest.mark.gunicorn]

#: What a request held by a SIGKILLed worker (or sent on its dead connection) may get.
TRANSPORT_FAILURES = {
    "closed without a reply",
    "connection reset",
    "broken pipe",
    "connection refused",
    "error IncompleteRead",
    "error BadStatusLine",
}


def test_a_short_load_run_with_a_killed_worker_never_gives_a_wrong_200() -> None:
    result = measure(duration=4.0, healthz_duration=1.0, concurrency=8, warmup=0.5)
    sync = result.sync

    assert sync.outcomes.get("WRONG 200", 0) == 0, sync.wrong
    assert set(sync.outcomes) - {OK} <= TRANSPORT_FAILURES | {"HTTP 500", "HTTP 503"}, sync.outcomes
    assert sync.ok > 0 and result.healthz.ok == result.healthz.requests > 0
    assert sync.kill is not None
    assert sync.kill.respawned_after is not None, "gunicorn did not replace the worker"
    assert sync.rate_before_kill and sync.rate_after_kill, "no replies before or after"
    assert result.memory_warm["processes"] == 3 and result.memory_after["rss_kib"] > 0
    assert "| POST /sync (3 members) |" in report(result)


def test_a_paced_run_sends_no_more_than_its_schedule() -> None:
    # An upper bound only (a slow machine sends fewer): flat out, 4 clients send hundreds
    # a second; paced at 20/s they may send at most one per client per 0.2 s of the run.
    rate, duration, concurrency = 20.0, 3.0, 4
    result = measure(
        duration=duration,
        healthz_duration=1.0,
        concurrency=concurrency,
        warmup=0.5,
        kill=False,
        rate=rate,
    )
    for run in (result.healthz, result.sync):
        assert 0 < run.requests <= rate * run.duration + concurrency, run
    assert result.sync.outcomes == {OK: result.sync.requests}, result.sync.outcomes


def test_a_request_with_500_pods_is_answered_under_gunicorn(tmp_path: Path) -> None:
    body = many_pods(500)
    closed = free_port()  # every member refuses at once: no traffic leaves loopback
    body["parent"]["spec"]["patroni"] = {"port": closed}
    for pod in body["related"]["Pod.v1"].values():
        pod["status"]["podIP"] = "127.0.0.1"
        pod["status"]["podIPs"] = [{"ip": "127.0.0.1"}]
    data = encode(body)
    # Every one of the 500 members is really probed: the closed port and that many
    # members are allowed (the production default is 64 members, port 8008).
    env = {"PGFH_ALLOWED_PATRONI_PORTS": str(closed), "PGFH_MAX_MEMBERS": "500"}
    with gunicorn_hook(tmp_path, env=env) as hook:
        response = requests.post(
            f"{hook.url}/sync",
            data=data,
            headers={"Content-Type": "application/json", **hook.headers},
            timeout=30,
        )
    reply = check_reply(response.status_code, response.content)
    names = [c["metadata"]["name"] for c in reply["children"]]
    assert names == ["pg-orders-primary"], json.dumps(reply)[:500]
    members = reply["status"]["members"]
    assert len(members) == 500 and not any(m["reachable"] for m in members)
    assert reply["status"]["conditions"][0]["reason"] == "NoLeader"


def test_a_short_spread_run_reaches_the_added_pod_and_ends_connections(tmp_path: Path) -> None:
    """testbed/bench/spread.py shortened: 1 pod, then 2; the hook ends each connection after 5."""
    result = run_mode(
        5, pods=2, initial=1, rate=20, workers=3, before=2, after=3, threads=2, workdir=tmp_path
    )
    before, after = result.phases
    assert before.sent == before.ok > 0 and after.sent == after.ok > 0, result
    assert before.per_pod[1] == 0  # not routed to yet
    assert after.per_pod[1] > 0, after  # ~12 new connections, each to a random pod of 2
    assert after.closed_by_server > 0 and after.dials >= after.closed_by_server


def test_go_transport_keeps_at_most_two_idle_connections_and_reuses_the_newest() -> None:
    transport = GoTransport("127.0.0.1", free_port())  # nothing listens: no I/O below
    conns = [http.client.HTTPConnection("127.0.0.1", 1) for _ in range(3)]
    peers = []
    for conn in conns:
        conn.sock, peer = socket.socketpair()  # an idle, open, silent connection
        peers.append(peer)
        transport._put(conn)
    try:
        assert [c for c, _ in transport._idle] == conns[:2]
        assert conns[2].sock is None  # the third was closed ("too many idle")
        assert transport._get() is conns[1]  # most recently used first
        peers[0].close()  # the server ends the other one while it is idle
        assert transport._get() is not conns[0] and transport.dials == 1
    finally:
        for sock in (*peers, *(c.sock for c in conns if c.sock is not None)):
            sock.close()


def test_the_stage_split_runs_the_real_app() -> None:
    table = stages_measure(duration=2.0, concurrency=4)
    assert "| **the pod in all**" in table and "| ↳ probe round |" in table
    assert "| not in any of the above (gunicorn) |" in table
    assert "'ok'" in table and "WRONG" not in table


def test_the_probe_round_benchmark_prints_every_row_with_a_ratio() -> None:
    # testbed.bench.rounds shortened, the prober beside itself (the --against path): every round
    # is checked by the benchmark (one leader found, every TLS member answered), so a
    # broken round raises; only the table's shape is asserted here.
    from hooks import patroni
    from testbed.bench.rounds import Prober
    from testbed.bench.rounds import measure as rounds_measure

    table = rounds_measure([Prober("a", patroni), Prober("b", patroni)], samples=5)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]]
    assert [n for n in names if not n.startswith("…")] == [
        "3 healthy members: CPU ms per round, p50",
        "a hung member (first), deadline 0.5 s: wall ms, p50 of 5",
        "a hung member (last), deadline 0.5 s: wall ms, p50 of 5",
        "3 mTLS members: CPU ms per round, p50",
    ]
    hung = [float(cell) for row in rows if "hung member" in row for cell in row.split(" | ")[1:3]]
    assert all(500 <= wall < 2000 for wall in hung), hung
