"""The hook's own alerts, evaluated by a real Prometheus during a real SIGKILL failover.

Test design: the session's 3-member Patroni cluster, the hook under gunicorn (2 workers, the
production config module), the Metacontroller stand-in applying every reply, and a real
Prometheus (Debian's ``prometheus`` package, as promtool) on an ephemeral loopback port with
its own temporary storage, scraping the hook's /metrics and evaluating
deploy/monitoring/alerts.rules.yaml every second. The leader is SIGKILLed; Patroni promotes
another member once its TTL (20 s in the devcluster) expires.

What it proves, through Prometheus' HTTP API:

* the no-leader alert the hook's metrics can carry, ``PgfhHookSeesNoLeader``
  (``pgfh_sync_replies_total`` with a degraded decision: the hook's metrics have no cluster
  label), is pending during the TTL window (its ``for: 1m`` is longer than this failover, so
  it never fires: an ordinary failover does not page);
* it resolves (no longer active) within a few scrapes after the Service moved;
* the range query of ``ALERTS`` agrees: pending samples inside the window, none afterwards.

The per-cluster alerts read kube-state-metrics' series, which need a Kubernetes API server;
they are unit-tested with promtool series (tests/monitoring/alerts.test.yaml).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import Rig
from tests.prometheus import Prometheus, running_prometheus

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "monitoring" / "alerts.rules.yaml"
ALERT = "PgfhHookSeesNoLeader"


@pytest.fixture
def prometheus(tmp_path: Path, hook: GunicornHook) -> Iterator[Prometheus]:
    target = urlsplit(hook.url).netloc
    assert target.startswith("127."), target
    with running_prometheus(
        tmp_path, {"pg-failover-hook": target}, RULES, labels={"namespace": "pgfh"}
    ) as running:
        yield running


@dataclass
class AlertLog:
    """States of one alert as /api/v1/alerts showed them, polled every 0.25 s."""

    prometheus: Prometheus
    name: str
    samples: list[tuple[float, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        deadline = time.monotonic() + 120  # bounded even if the test forgets to stop it
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                active = self.prometheus.alerts(self.name)
                state = active[0]["state"] if active else None
                self.samples.append((time.monotonic(), state))
            except requests.RequestException:
                pass
            self._stop.wait(0.25)

    def stop(self) -> None:
        self._stop.set()

    def states(self, start: float, end: float) -> set[str | None]:
        return {state for t, state in self.samples if start <= t <= end}


def test_the_no_leader_alert_is_pending_during_the_ttl_window_and_resolves_after_the_move(
    rig: Rig, prometheus: Prometheus
) -> None:
    # Prometheus scrapes the hook and evaluates the hook's rules; nothing is active yet.
    prometheus.wait(
        "scrape of the hook",
        lambda: any(
            r["value"][1] == "1"
            for r in prometheus.get("/api/v1/query", query='up{job="pg-failover-hook"}')["result"]
        ),
        15,
    )

    def evaluated() -> bool:
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"] if r.get("name") == ALERT]
        return bool(rules) and rules[0]["health"] == "ok" and bool(rules[0].get("lastEvaluation"))

    prometheus.wait(f"evaluation of {ALERT}", evaluated, 15)
    prometheus.wait(
        f"{ALERT} inactive on the healthy cluster", lambda: not prometheus.alerts(ALERT), 10
    )

    log = AlertLog(prometheus, ALERT)
    poller = threading.Thread(target=log.run, name="alert-poller", daemon=True)
    poller.start()
    try:
        _, killed_at, election = rig.lose_leader("kill", timeout=60)
        moved = rig.wait_selected(election.name, timeout=10)
        # Resolved: not active any more, a few scrapes after the Service moved.
        prometheus.wait(
            f"resolution of {ALERT}", lambda: log.samples and log.samples[-1][1] is None, 15
        )
        resolved_at = time.monotonic()
    finally:
        log.stop()
        poller.join(timeout=5)

    window = log.states(killed_at, election.first_primary)
    assert "pending" in window, f"{ALERT} was never pending between the kill and the promotion"
    assert "firing" not in window, f"{ALERT} fired within its for: 1m during a 20 s failover"
    assert resolved_at - moved.finished < 10, (
        f"{ALERT} resolved {resolved_at - moved.finished:.1f} s after the Service moved"
    )
    pending_from = min(t for t, s in log.samples if s == "pending")
    print(
        f"\n{ALERT}: pending {pending_from - killed_at:.1f} s after the SIGKILL, promotion after "
        f"{election.first_primary - killed_at:.1f} s, Service moved after "
        f"{moved.finished - killed_at:.1f} s, alert resolved "
        f"{resolved_at - moved.finished:.1f} s after the move"
    )

    # The same story in Prometheus' ALERTS series (written for pending and firing alerts).
    to_wall = time.time() - time.monotonic()
    series = prometheus.get(
        "/api/v1/query_range",
        query=f'ALERTS{{alertname="{ALERT}"}}',
        start=killed_at + to_wall - 5,
        end=time.time(),
        step="1s",
    )["result"]
    pending = [
        float(t) - to_wall
        for s in series
        if s["metric"]["alertstate"] == "pending"
        for t, _ in s["values"]
    ]
    assert any(killed_at <= t <= election.first_primary for t in pending), series
    assert all(s["metric"]["alertstate"] == "pending" for s in series), series
    assert max(pending) < moved.finished + 5, "ALERTS still pending 5 s after the Service moved"
