"""The hook under real gunicorn with the production config module.

Test design: one gunicorn (2 workers × 8 threads) per test module; requests go over
loopback; every Patroni member address in the requests points at a closed loopback
port, so each sync is a quick, real "no leader" decision. What is checked is what only
a real server shows: JSON logs from app *and* gunicorn, metrics merged across worker
processes, and a graceful SIGTERM.
"""

from __future__ import annotations

import http.client
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.multiprocess import MultiProcessCollector

from testbed.metacontroller.gunicorn import GunicornHook, free_port, gunicorn_hook
from tests.helpers import fixture

pytestmark = pytest.mark.gunicorn


def sync_body() -> dict[str, Any]:
    body = fixture("sync-no-leader-during-failover.json")
    closed = free_port()
    body["parent"]["spec"]["patroni"] = {"port": closed}
    for pod in body["related"]["Pod.v1"].values():
        pod["status"]["podIP"] = "127.0.0.1"
        pod["status"]["podIPs"] = [{"ip": "127.0.0.1"}]
    return body


#: The members in ``sync_body`` point at a closed ephemeral port: allow those ports.
EPHEMERAL_PORTS = {"PGFH_ALLOWED_PATRONI_PORTS": "1024-65535"}


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with gunicorn_hook(tmp_path_factory.mktemp("gunicorn"), env=EPHEMERAL_PORTS) as running:
        yield running


def test_sync_under_gunicorn_keeps_the_service_when_no_member_answers(hook: GunicornHook) -> None:
    response = requests.post(f"{hook.url}/sync", json=sync_body(), timeout=5, headers=hook.headers)
    assert response.status_code == 200
    reply = response.json()
    assert [c["metadata"]["name"] for c in reply["children"]] == ["pg-orders-primary"]
    assert (
        reply["children"][0]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"]
        == "pg-orders-0"
    )
    assert reply["resyncAfterSeconds"] < 1


def accesses(hook: GunicornHook) -> int:
    return sum('"gunicorn.access"' in line for line in hook.log_lines())


def test_every_log_line_is_json_and_sync_lines_name_the_cluster(hook: GunicornHook) -> None:
    accesses_before = accesses(hook)
    requests.post(
        f"{hook.url}/sync",
        json=sync_body(),
        timeout=5,
        headers={**hook.headers, "X-Request-Id": "req-123"},
    )
    # gunicorn writes the access line after the response: wait for it (bounded), not a
    # fixed sleep that a loaded machine outlasts.
    deadline = time.monotonic() + 10
    while accesses(hook) <= accesses_before:
        assert time.monotonic() < deadline, "no access line for the sync within 10 s"
        time.sleep(0.05)
    records = [json.loads(line) for line in hook.log_lines() if line.strip()]
    assert records, "gunicorn printed nothing"
    sync_lines = [
        r for r in records if r.get("logger") == "hooks.app" and "keeping routing" in r["message"]
    ]
    assert sync_lines and all(r["cluster"] == "databases/pg-orders" for r in sync_lines)
    assert any(r.get("request_id") == "req-123" for r in sync_lines)
    assert any(r.get("logger") == "gunicorn.error" for r in records), (
        "gunicorn's own lines are JSON too"
    )
    assert any(r.get("logger") == "gunicorn.access" for r in records)


NO_LEADER_REPLIES = ("pgfh_sync_replies_total", {"decision": "NoLeader"})


def replies_per_worker(metrics_dir: Path) -> dict[str, float]:
    """``NoLeader`` replies counted by each worker process, from its own multiprocess files
    (``<type>_<pid>.db``), read one process at a time: what the merge in /metrics adds up."""
    by_pid: dict[str, list[str]] = {}
    for path in sorted(metrics_dir.glob("*.db")):
        by_pid.setdefault(path.stem.rsplit("_", 1)[-1], []).append(str(path))
    name, labels = NO_LEADER_REPLIES
    counts: dict[str, float] = {}
    for pid, files in by_pid.items():
        merged = MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
        counts[pid] = sum(
            sample.value
            for metric in merged
            for sample in metric.samples
            if sample.name == name and sample.labels == labels
        )
    return counts


def test_metrics_add_up_across_worker_processes(hook: GunicornHook) -> None:
    def replies() -> float:
        text = requests.get(f"{hook.url}/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith('pgfh_sync_replies_total{decision="NoLeader"}')
        )

    metrics_dir = Path(hook.metrics_dir)
    before, before_per_worker = replies(), replies_per_worker(metrics_dir)
    sent = 0
    served: dict[str, float] = {}
    # A new connection per request: the kernel spreads them over both workers' accepts.
    # Until two distinct workers have served some (bounded: each almost always does
    # within the first 20).
    while sent < 20 or (len(served) < 2 and sent < 400):
        response = requests.post(
            f"{hook.url}/sync", json=sync_body(), timeout=5, headers=hook.headers
        )
        assert response.status_code == 200
        sent += 1
        if sent % 10 == 0 or sent >= 20:
            after = replies_per_worker(metrics_dir)
            served = {
                pid: count - before_per_worker.get(pid, 0.0)
                for pid, count in after.items()
                if count > before_per_worker.get(pid, 0.0)
            }
    assert len(served) >= 2, f"only worker(s) {sorted(served)} served {sent} syncs"
    assert sum(served.values()) == sent, served
    assert replies() == before + sent, "/metrics is the sum of every worker's counts"


def test_sigterm_stops_gracefully_within_the_graceful_timeout(tmp_path: Path) -> None:
    with gunicorn_hook(tmp_path) as running:
        started = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        code = running.process.wait(25)
        elapsed = time.monotonic() - started
    assert code == 0
    assert elapsed < 20, f"graceful stop took {elapsed:.1f} s"


def _keepalive_replies(url: str, headers: dict[str, str], count: int) -> list[tuple[int, str, int]]:
    """(status, Connection header, local port) of ``count`` GETs on keep-alive connections.

    A new connection is opened only after the server closed the last one: the local port
    tells which connection carried each request.
    """
    host, port = url.removeprefix("http://").split(":")
    seen: list[tuple[int, str, int]] = []
    conn: http.client.HTTPConnection | None = None
    for _ in range(count):
        if conn is None:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("GET", "/healthz", headers=headers)
        assert conn.sock is not None
        local_port = conn.sock.getsockname()[1]
        response = conn.getresponse()
        response.read()
        seen.append((response.status, response.getheader("Connection", ""), local_port))
        if response.will_close:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return seen


def test_the_default_keeps_a_callers_connection_for_many_requests(hook: GunicornHook) -> None:
    replies = _keepalive_replies(hook.url, hook.headers, 20)
    assert {status for status, _, _ in replies} == {200}
    assert {connection for _, connection, _ in replies} == {"keep-alive"}
    assert len({port for _, _, port in replies}) == 1


def test_a_connection_is_closed_after_pgfh_connection_max_requests(tmp_path: Path) -> None:
    env = {**EPHEMERAL_PORTS, "PGFH_CONNECTION_MAX_REQUESTS": "3"}
    with gunicorn_hook(tmp_path, env=env, workers=1, threads=2) as running:
        replies = _keepalive_replies(running.url, running.headers, 7)
        body = json.dumps(sync_body()).encode()
        host, port = running.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        sync_headers = {**running.headers, "Content-Type": "application/json"}
        try:
            statuses = []
            for _ in range(3):  # a sync is answered in full on the request that ends it
                conn.request("POST", "/sync", body=body, headers=sync_headers)
                response = conn.getresponse()
                statuses.append((response.status, response.getheader("Connection")))
                assert json.loads(response.read())["children"]
        finally:
            conn.close()
    assert [c for _, c, _ in replies] == ["keep-alive", "keep-alive", "close"] * 2 + ["keep-alive"]
    ports = [p for _, _, p in replies]
    assert ports[0] == ports[1] == ports[2] != ports[3] == ports[4] == ports[5] != ports[6]
    assert statuses == [(200, "keep-alive"), (200, "keep-alive"), (200, "close")]
