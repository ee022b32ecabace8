"""Monitoring: the dashboard, and the hook's status through series to alerts.

The test design notes are those of tests/test_monitoring_ksm.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks.domain.members import MemberStatus
from testbed.fakes.patroni_wire import patroni_body
from tests import monitoring_cases
from tests.helpers import leader, make_service, replica, sync_body
from tests.monitoring_cases import (
    DASHBOARD,
    KSM_CONFIG,
    METACONTROLLER_METRICS,
    PROMETHEUS_RULE,
    README,
    REPO,
    alerts,
    known_metrics,
    ksm_exported_names,
    ksm_metrics,
    load_yaml,
    metric_names,
    promtool,
    render_prometheus_rule,
)

# ---------------------------------------------------------------- dashboard

GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__range": "1h",
    "$__interval": "1m",
    "$namespace": "db",
    "$cluster": "pg",
    "$job": "pg-failover-hook",
}

#: The shared fixture (pytest finds fixtures among a module's names).
hook_metrics = monitoring_cases.hook_metrics


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every query, template variables included."""
    board = dashboard()
    queries = [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.*), *\w+\)", variable["query"]["query"])
            assert match, variable["query"]
            queries.append((f"variable {variable['name']}", match.group(1)))
    return queries


def substitute(expr: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def test_dashboard_loads_with_the_four_sections() -> None:
    board = dashboard()
    assert board["uid"] == "pg-failover-hook" and board["title"]
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Fleet overview", "Cluster $namespace/$cluster", "Hook", "Metacontroller"]
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "job", "namespace", "cluster"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["description"], panel["title"]
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"]


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses every query (as recording rules, after Grafana's substitution)."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": substitute(expr)}
                    for i, (_, expr) in enumerate(panel_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_query_names_an_exported_metric(hook_metrics: set[str]) -> None:
    known = known_metrics(hook_metrics)
    seen: set[str] = set()
    for title, expr in panel_queries():
        names = metric_names(substitute(expr))
        assert names, f"{title}: {expr} names no metric"
        assert not names - known, f"{title}: {names - known} is exported by nobody"
        seen |= names
    # The four sources each feed the dashboard.
    assert seen & hook_metrics
    assert seen & ksm_exported_names()
    assert seen & METACONTROLLER_METRICS
    assert "pgfh_sync_replies_total" in seen  # routing decisions


def test_readme_lists_every_alert() -> None:
    observe = README.read_text().split("## Observe", 1)[1]
    for alert in alerts():
        assert f"| `{alert['alert']}` |" in observe, f"README's Observe section: {alert['alert']}"


# ---------------------------------------------------------------- hook status → series → alerts
# The hook's real replies (through the app, probes from a table) are turned into series the way
# kube-state-metrics' custom-resource-state code turns objects into series (the subset of
# registry_factory.go this config uses, modelled here: KSM is a Go binary, not installable in
# the test environment), then promtool evaluates the alerts' expressions on them. This ties
# the status values the hook writes (condition types, reasons, "True"/"False", member roles) to
# the label matchers of the alerts.


def _ksm_get(obj: Any, path: list[str]) -> Any:
    for segment in path:
        if obj is None:
            return None
        if segment.startswith("[") and segment.endswith("]"):
            key, _, value = segment[1:-1].partition("=")
            obj = (
                next((e for e in obj if isinstance(e, dict) and str(e.get(key)) == value), None)
                if isinstance(obj, list)
                else None
            )
        elif isinstance(obj, dict):
            obj = obj.get(segment)
        elif isinstance(obj, list) and segment.isdigit():
            obj = obj[int(segment)] if int(segment) < len(obj) else None
        else:
            return None
    return obj


def _ksm_float(value: Any) -> float:
    """KSM's toFloat64 for the types this config reads."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    lowered = str(value).lower()
    if lowered in ("true", "yes"):
        return 1.0
    if lowered in ("false", "no", "unknown"):
        return 0.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float(value)


def _ksm_labels(obj: Any, paths: Mapping[str, list[str]]) -> dict[str, str]:
    labels = {}
    for label, path in paths.items():
        value = _ksm_get(obj, path)
        if value is not None:
            labels[label] = str(value).lower() if isinstance(value, bool) else str(value)
    return labels


def ksm_series(obj: Mapping[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    """The series kube-state-metrics would serve for ``obj`` with our config."""
    (resource,) = load_yaml(KSM_CONFIG)["spec"]["resources"]
    gvk = resource["groupVersionKind"]
    base = {
        "customresource_group": gvk["group"],
        "customresource_version": gvk["version"],
        "customresource_kind": gvk["kind"],
        **_ksm_labels(obj, resource["labelsFromPath"]),
    }
    out: list[tuple[str, dict[str, str], float]] = []
    for name, generator in ksm_metrics():
        each = generator["each"]
        spec = each[{"Gauge": "gauge", "Info": "info"}[each["type"]]]
        value = _ksm_get(obj, spec.get("path", []))
        paths = spec.get("labelsFromPath", {})
        found: list[tuple[dict[str, str], float]] = []
        if each["type"] == "Info":
            elements = value if isinstance(value, list) else [value]
            for element in elements:
                labels = _ksm_labels(element, paths)
                if labels:
                    found.append((labels, 1.0))
        elif isinstance(value, list):
            for element in value:
                got = _ksm_get(element, spec.get("valueFrom", []))
                if got is None and not spec.get("nilIsZero"):
                    continue
                found.append((_ksm_labels(element, paths), _ksm_float(got or 0)))
        elif isinstance(value, dict):
            (key,) = spec["valueFrom"]
            if key in value:
                found.append((_ksm_labels(value, paths), _ksm_float(value[key])))
        elif value is not None:
            found.append(({}, _ksm_float(value)))
        out.extend((name, {**base, **labels}, v) for labels, v in found)
    return out


def _selector(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@pytest.fixture
def cluster_states(client: Any, prober: Any) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Series of three clusters whose status the hook wrote: healthy, no leader, and a
    leader the hook cannot route to while the Service still selects pg-orders-0."""
    p0, p1, p2 = (f"pg-orders-{i}" for i in range(3))
    scenarios = {
        "healthy": {p0: leader(p0), p1: replica(p1), p2: replica(p2)},
        "noleader": {p0: replica(p0), p1: replica(p1), p2: replica(p2)},
        "mismatch": {
            p0: replica(p0),
            p1: MemberStatus.from_api_response(p1, 200, patroni_body("primary", name="pg-x")),
            p2: replica(p2),
        },
    }
    states = {}
    for name, answers in scenarios.items():
        prober.answers = answers
        reply = client.post("/sync", json=sync_body(services=[make_service(pod=p0)]))
        assert reply.status_code == 200, reply.get_data(as_text=True)
        status = reply.get_json()["status"]
        obj = {"metadata": {"namespace": "databases", "name": name}, "status": status}
        states[name] = ksm_series(obj)
    return states


def test_hook_statuses_become_the_series_the_alerts_select(
    cluster_states: dict[str, list[tuple[str, dict[str, str], float]]], tmp_path: Path
) -> None:
    series = [s for states in cluster_states.values() for s in states]
    names = {n for n, _, _ in series}
    assert {"pgfh_cluster_info", "pgfh_cluster_condition", "pgfh_cluster_member_reachable"} <= names
    by_alert = {a["alert"]: a["expr"] for a in alerts()}

    def expected(cluster: str, alert: str) -> list[dict[str, Any]]:
        """What the alert's expression must return for one cluster."""
        states = cluster_states[cluster]
        if alert == "PgfhClusterNoRoutedLeader":
            return [
                # A filtering comparison keeps the metric name.
                {"labels": _selector("pgfh_cluster_condition", labels), "value": 0}
                for n, labels, _ in states
                if n == "pgfh_cluster_condition"
                and labels["type"] == "PrimaryRouted"
                and labels["status"] == "False"
            ]
        info = next(labels for n, labels, _ in states if n == "pgfh_cluster_info")
        return [
            {"labels": _selector("", {**labels, "primary": info["primary"]}), "value": v}
            for n, labels, v in states
            if n == "pgfh_cluster_member_reachable"
            and labels.get("role") in ("primary", "standby_leader")
            and labels["member"] != info.get("primary")
            and any(
                c["type"] == "PrimaryRouted" and c["status"] == "False"
                for m, c, _ in states
                if m == "pgfh_cluster_condition"
            )
        ]

    tests = []
    for alert in ("PgfhClusterNoRoutedLeader", "PgfhServiceOnNonLeader"):
        samples = [s for cluster in cluster_states for s in expected(cluster, alert)]
        tests.append({"expr": by_alert[alert], "eval_time": "2m", "exp_samples": samples})
    suite = {
        "rule_files": [],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _selector(n, labels), "values": f"{v:g}x5"}
                    for n, labels, v in series
                ],
                "promql_expr_test": tests,
            }
        ],
    }
    # The scenarios are what they claim: only "noleader" and "mismatch" are unrouted, only
    # "mismatch" has a leader that is not the selected pod.
    assert [c for c in cluster_states if expected(c, "PgfhClusterNoRoutedLeader")] == [
        "noleader",
        "mismatch",
    ]
    assert [c for c in cluster_states if expected(c, "PgfhServiceOnNonLeader")] == ["mismatch"]
    path = tmp_path / "states.test.yaml"
    path.write_text(yaml.safe_dump(suite))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


if __name__ == "__main__":
    PROMETHEUS_RULE.write_text(render_prometheus_rule())
    print(f"wrote {PROMETHEUS_RULE.relative_to(REPO)}", file=sys.stderr)
