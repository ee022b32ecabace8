"""A short smoke run of the load benchmark (bench/load.py), and big requests over gunicorn.

Test design: the benchmark's own code, shortened (a few seconds, 8 clients): the hook
under the production gunicorn config, fake Patroni members in their own process, the
load client in another, one worker SIGKILLed half-way. Only correctness is asserted,
never a rate or a latency: no WRONG 200 (every 200 pins the Service on the fake leader
and keeps it), replies did flow before and after the kill, gunicorn replaced the worker,
and the figures the benchmark reports exist. Loopback only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from bench.common import encode
from bench.load import OK, measure, report
from standin.apply import check_reply
from standin.gunicorn import free_port, gunicorn_hook
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
