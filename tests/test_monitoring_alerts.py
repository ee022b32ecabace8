"""Monitoring: the alerts, and the metric names.

The test design notes are those of tests/test_monitoring_ksm.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests import monitoring_cases
from tests.helpers import heading_anchor
from tests.monitoring_cases import (
    PROMETHEUS_RULE,
    RULE_TESTS,
    RULES,
    RUNBOOK,
    alerts,
    known_metrics,
    load_yaml,
    metric_names,
    promtool,
    recorded_samples,
    render_prometheus_rule,
)

#: The shared fixture (pytest finds fixtures among a module's names).
hook_metrics = monitoring_cases.hook_metrics


def test_prometheusrule_is_generated_from_the_rules_file() -> None:
    assert PROMETHEUS_RULE.read_text() == render_prometheus_rule(), (
        "regenerate it: .venv/bin/python -m tests.test_monitoring"
    )
    assert load_yaml(PROMETHEUS_RULE)["spec"]["groups"] == load_yaml(RULES)["groups"]


def test_promtool_checks_the_rules_file() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A wrong expectation is reported: the suite is not vacuous."""
    suite = load_yaml(RULE_TESTS)
    suite["rule_files"] = [str(RULES)]
    first = next(t for t in suite["tests"] if any(c["exp_alerts"] for c in t["alert_rule_test"]))
    for case in first["alert_rule_test"]:
        case["exp_alerts"] = [] if case["exp_alerts"] else [{"exp_labels": {"severity": "x"}}]
    suite["tests"] = [first]
    broken = tmp_path / "broken.test.yaml"
    broken.write_text(yaml.safe_dump(suite))
    result = subprocess.run(
        [promtool(), "test", "rules", str(broken)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration such as 1m30s or 150m."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * units[u] for n, u in parts)


def test_every_alert_fires_and_stays_silent_in_the_unit_tests() -> None:
    suite = load_yaml(RULE_TESTS)
    cases: dict[str, list[tuple[int, float, bool]]] = {}
    for index, test in enumerate(suite["tests"]):
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(
                (index, parse_duration(case["eval_time"]), bool(case["exp_alerts"]))
            )
    for alert in alerts():
        name = alert["alert"]
        seen = cases.get(name, [])
        firing = [(i, t) for i, t, fires in seen if fires]
        silent = [(i, t) for i, t, fires in seen if not fires]
        assert firing, f"{name}: no unit test where it fires"
        assert silent, f"{name}: no unit test where it stays silent"
        if "for" in alert:
            # Pending: silent earlier in the same series as a firing case.
            assert any(i == j and t < u for i, t in silent for j, u in firing), (
                f"{name}: no unit test checks it is silent before its for: {alert['for']}"
            )


def test_every_alert_is_annotated_as_kube_prometheus_does() -> None:
    runbook = RUNBOOK.read_text()
    anchors = {
        heading_anchor(line.lstrip("#").strip())
        for line in runbook.splitlines()
        if line.startswith("## ")
    }
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))
    for alert in alerts():
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, alert["alert"]
        assert alert["labels"]["severity"] in ("warning", "critical")
        url = annotations["runbook_url"]
        assert url == f"docs/runbook.md#{alert['alert'].lower()}", url
        assert url.split("#")[1] in anchors, f"docs/runbook.md has no section for {url}"
        if "pgfh_cluster_" in alert["expr"] and "count(pgfh_cluster_info)" not in alert["expr"]:
            # Per-cluster alerts name the cluster.
            assert re.search(
                r"\$labels\.namespace\s*}}/{{\s*\$labels\.name\s*}}", annotations["description"]
            ), alert["alert"]


def test_runbook_links_resolve() -> None:
    """Every relative link of the runbook names an existing doc and, if any, heading."""
    text = RUNBOOK.read_text()
    links = re.findall(r"\]\(([^)#]*\.md|)(?:#([^)]+))?\)", text)
    assert links
    for target, anchor in links:
        doc = RUNBOOK.parent / target if target else RUNBOOK
        assert doc.is_file(), f"docs/runbook.md links to {target}, which does not exist"
        if anchor:
            headings = {
                heading_anchor(line.lstrip("#").strip())
                for line in doc.read_text().splitlines()
                if re.match(r"#{1,6} ", line)
            }
            assert anchor in headings, f"docs/runbook.md: no heading #{anchor} in {doc.name}"


def test_the_issue_s_alerts_are_all_there() -> None:
    expected = {
        "PgfhClusterNoRoutedLeader",
        "PgfhServiceOnNonLeader",
        "PgfhMemberUnreachable",
        "PgfhReadOnlyServiceEmpty",
        "PgfhBackupFailed",
        "PgfhBackupTooOld",
        "PgfhHookSeesNoLeader",
        "PgfhHookErrors",
        "PgfhHookRefusedCalls",
        "PgfhHookSyncLatencyNearTimeout",
        "PgfhMetacontrollerNotSyncing",
        "PgfhMetacontrollerSyncErrors",
        "PgfhPrimaryFlapping",
        "PgfhPrimarySelectorNotUnique",
        # Issue 28: what an on-call person sees of the control path.
        "PgfhHookPodsDown",
        "PgfhMetacontrollerNoLeader",
        "PgfhMetacontrollerDown",
    }
    assert {a["alert"] for a in alerts()} == expected


def test_refused_calls_alert_is_visible_within_a_minute() -> None:
    """Issue 15: a hook answering 401 to every call must show within about a minute."""
    (alert,) = [a for a in alerts() if a["alert"] == "PgfhHookRefusedCalls"]
    assert "for" not in alert or parse_duration(alert["for"]) == 0
    windows = [parse_duration(w) for w in re.findall(r"\[(\w+)\]", alert["expr"])]
    assert windows and max(windows) <= 60
    assert "pgfh_auth_failures_total" in alert["expr"]


def test_metric_name_extraction() -> None:
    assert metric_names(
        'sum by (namespace, job) (rate(pgfh_x_total{a="b c", d=~"e|f"}[5m])) / on (x) foo > 0'
    ) == {"pgfh_x_total", "foo"}
    assert metric_names('rate({__name__=~"a_total|b_total", e="x"}[1m])') == {"a_total", "b_total"}


#: Labels the scrape adds (target labels): not in the exposition, so not checked against it.
TARGET_LABELS = frozenset({"job", "namespace", "instance", "pod", "service", "endpoint"})


#: Series families the recorded scrapes must back whenever a rule selects them.
RECORDED_PREFIXES = ("metacontroller_", "workqueue_", "leader_election_", "kube_deployment_")


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Every ``name{matchers}`` of an expression, its matchers as (label, op, value)."""
    found = []
    for name, body in re.findall(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", expr):
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body)
        found.append((name, matchers))
    return found


def satisfies(labels: dict[str, str], label: str, op: str, value: str) -> bool:
    actual = labels.get(label, "")
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    matched = re.fullmatch(value, actual) is not None
    return matched if op == "=~" else not matched


def test_selectors_match_the_recorded_scrapes() -> None:
    """A hand-made selector is proven against itself."""
    recorded = [("workqueue_depth", {"name": "CompositeController-x", "controller": "c"})]
    assert selectors('rate(a{b="c", d=~"e|f"}[5m]) + g{h!="i"}') == [
        ("a", [("b", "=", "c"), ("d", "=~", "e|f")]),
        ("g", [("h", "!=", "i")]),
    ]
    good = [("name", "=~", "CompositeController-.*"), ("job", "=", "metacontroller")]
    assert any(
        n == "workqueue_depth" and all(satisfies(la, *m) for m in good if m[0] not in TARGET_LABELS)
        for n, la in recorded
    )
    assert not satisfies({"name": "CompositeController-x"}, "name", "=", "CompositeController-y")


def test_every_series_of_metacontroller_an_alert_selects_was_seen_on_the_real_binary() -> None:
    """Issue 28: the alerts on Metacontroller and on the hook's Deployment select series that
    exist, with the labels they match on, as a real v4.17.2 binary and kube-state-metrics
    served them (not as its source was read): every name, every non-target label matcher."""
    recorded = recorded_samples()
    names = {name for name, _ in recorded}
    assert {"leader_election_master_status", "workqueue_work_duration_seconds_count"} <= names
    checked = 0
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            for name, matchers in selectors(rule["expr"]):
                if not name.startswith(RECORDED_PREFIXES):
                    continue
                checked += 1
                own = [m for m in matchers if m[0] not in TARGET_LABELS]
                assert any(
                    n == name and all(satisfies(labels, *m) for m in own) for n, labels in recorded
                ), f"{rule.get('alert') or rule.get('record')}: no recorded {name} with {own}"
    assert checked >= 6


def test_every_metric_an_alert_names_is_exported(hook_metrics: set[str]) -> None:
    known = known_metrics(hook_metrics)
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - known
            assert not unknown, f"{rule.get('alert') or rule.get('record')}: {unknown}"
