"""The monitoring kit for real: kube-state-metrics (the pinned Go build) with
deploy/monitoring/kube-state-metrics-config.yaml against the real API server, scraped by a real
Prometheus that evaluates deploy/monitoring/alerts.rules.yaml.

The PostgreSQLCluster's status is what the hook itself answers (its pipeline run on a recorded
request with fake probe answers), written through the status subresource as Metacontroller
writes it: first a healthy cluster, then the middle of a failover (no member answers as leader),
then healthy again. The per-cluster alert ``PgfhClusterNoRoutedLeader`` must fire from the real
``pgfh_cluster_condition`` series and resolve after. Its ``for: 1m`` is scaled to 2 s in the
copy of the rules Prometheus loads (the expressions are the kit's own, unchanged): what is under
test is that the series kube-state-metrics really exports satisfy the rules, not the wait.

Not here: a SIGKILL of a real member (that needs the Metacontroller stand-in on the real API
server driving the hook), and the dashboard's panels over the hook's and Metacontroller's own
metrics (tests/test_monitoring_*.py checks those names offline; test_prometheus_failover.py
scrapes the hook for real).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.kube_state_metrics import KubeStateMetrics, running_kube_state_metrics
from testbed.kubernetes.rest import KubeRest, resource_path
from tests.helpers import P0, P1, P2, down, fixture, leader, replica, run
from tests.prometheus import Prometheus, running_prometheus

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "deploy" / "monitoring"
ALERT = "PgfhClusterNoRoutedLeader"
CLUSTERS = "adg.io/v1alpha1"


def hook_status(answers: dict[str, Any]) -> dict[str, Any]:
    """The status the hook answers for the recorded cluster, given these probe answers."""
    _, outcome = run(fixture("sync-service-selects-old-leader.json"), answers)
    status: dict[str, Any] = outcome.body["status"]
    return status


HEALTHY = {P0: replica(P0), P1: leader(P1), P2: replica(P2)}
FAILING_OVER = {P0: down(P0), P1: replica(P1), P2: replica(P2)}


def scaled_rules(directory: Path) -> Path:
    """The kit's rules with every ``for:`` cut to 2 s (expressions unchanged)."""
    text = (MONITORING / "alerts.rules.yaml").read_text()
    scaled = re.sub(r"(?m)^(\s+for:\s*)\d+[smh]\s*$", r"\g<1>2s", text)
    assert scaled != text
    path = directory / "alerts.rules.yaml"
    path.write_text(scaled)
    return path


@pytest.fixture
def cluster(control_plane: ControlPlane, kube_rest: KubeRest, kube_namespace: str) -> str:
    control_plane.kubectl("apply", "--server-side", "-f", str(REPO / "metacontroller" / "crd.yaml"))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/postgresqlclusters.adg.io", "--timeout=60s"
    )
    body = fixture("sync-service-selects-old-leader.json")["parent"]
    kube_rest.create(
        resource_path(CLUSTERS, "postgresqlclusters", kube_namespace),
        {
            "apiVersion": CLUSTERS,
            "kind": "PostgreSQLCluster",
            "metadata": {"name": body["metadata"]["name"]},
            "spec": body["spec"],
        },
    )
    return str(body["metadata"]["name"])


def write_status(rest: KubeRest, namespace: str, name: str, status: dict[str, Any]) -> None:
    path = resource_path(CLUSTERS, "postgresqlclusters", namespace, name) + "/status"
    rest.merge_patch(path, {"status": None})
    rest.merge_patch(path, {"status": status})


@pytest.fixture
def monitoring(
    control_plane: ControlPlane, cluster: str, tmp_path: Path
) -> Iterator[tuple[KubeStateMetrics, Prometheus]]:
    config = MONITORING / "kube-state-metrics-config.yaml"
    with running_kube_state_metrics(control_plane, config, tmp_path) as ksm:
        rules = scaled_rules(tmp_path)
        target = ksm.url.removeprefix("http://")
        with running_prometheus(tmp_path, {"kube-state-metrics": target}, rules) as prometheus:
            yield ksm, prometheus


def series(prometheus: Prometheus, expr: str) -> list[dict[str, Any]]:
    return prometheus.query(expr)


def test_per_cluster_alerts_fire_from_real_series_and_resolve(
    kube_rest: KubeRest,
    kube_namespace: str,
    cluster: str,
    monitoring: tuple[KubeStateMetrics, Prometheus],
) -> None:
    ksm, prometheus = monitoring
    write_status(kube_rest, kube_namespace, cluster, hook_status(HEALTHY))
    selector = f'namespace="{kube_namespace}", name="{cluster}"'
    prometheus.wait(
        "the healthy cluster's series",
        lambda: series(
            prometheus, f'pgfh_cluster_condition{{{selector}, type="Ready", status="True"}} == 1'
        ),
        30,
    )
    info = series(prometheus, f"pgfh_cluster_info{{{selector}}}")
    assert [s["metric"]["primary"] for s in info] == [P1]
    assert "pgfh_cluster_member_reachable" in ksm.metrics()

    def ours() -> list[dict[str, Any]]:
        # This cluster's alerts only: kube-state-metrics exports every PostgreSQLCluster of the
        # shared server, and another module's cluster without a leader may still be there
        # while its namespace is deleted (seen in a full run).
        return [
            a
            for a in prometheus.alerts(ALERT)
            if (a["labels"].get("namespace"), a["labels"].get("name")) == (kube_namespace, cluster)
        ]

    time.sleep(3)  # longer than the scaled for: nothing may fire on a healthy cluster
    assert not ours()

    write_status(kube_rest, kube_namespace, cluster, hook_status(FAILING_OVER))
    firing = prometheus.wait(
        f"{ALERT} firing",
        lambda: [a for a in ours() if a["state"] == "firing"],
        30,
    )
    assert firing[0]["labels"]["namespace"] == kube_namespace
    assert firing[0]["labels"]["name"] == cluster
    assert firing[0]["labels"]["reason"] == "NoLeader"

    write_status(kube_rest, kube_namespace, cluster, hook_status(HEALTHY))
    prometheus.wait(f"{ALERT} resolved", lambda: not ours(), 30)


def _cluster_panel_queries() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "pgfh_cluster_" in target.get("expr", "")
    ]
    assert len(queries) >= 10
    return queries


def test_every_per_cluster_dashboard_query_returns_data(
    kube_rest: KubeRest,
    kube_namespace: str,
    cluster: str,
    monitoring: tuple[KubeStateMetrics, Prometheus],
) -> None:
    """The dashboard's panels over kube-state-metrics' series, with its variables set to this
    cluster, over a run that goes healthy → failing over → healthy (a "not Ready" table has
    rows only in the middle, a primary change only after it); the backup panel needs a
    cluster with spec.backup, which this one has not."""
    _, prometheus = monitoring
    pending = [q for q in _cluster_panel_queries() if "backup" not in q]

    def still_empty(queries: list[str]) -> list[str]:
        time.sleep(3)  # a few scrapes of the new status
        empty = []
        for query in queries:
            expr = (
                query.replace("$namespace", kube_namespace)
                .replace("$cluster", cluster)
                .replace("$__range", "5m")
                .replace("$__rate_interval", "1m")
            )
            if not series(prometheus, expr):
                empty.append(query)
        return empty

    write_status(kube_rest, kube_namespace, cluster, hook_status(HEALTHY))
    prometheus.wait(
        "the cluster's series",
        lambda: series(prometheus, f'pgfh_cluster_info{{namespace="{kube_namespace}"}}'),
        30,
    )
    pending = still_empty(pending)
    write_status(kube_rest, kube_namespace, cluster, hook_status(FAILING_OVER))
    pending = still_empty(pending)
    promoted = {P0: replica(P0, timeline=2), P1: replica(P1, timeline=2), P2: leader(P2, 2)}
    write_status(kube_rest, kube_namespace, cluster, hook_status(promoted))
    assert still_empty(pending) == []
