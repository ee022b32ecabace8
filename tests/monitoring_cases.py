"""Shared cases and helpers of tests/test_monitoring_*.py (one module per subject)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hooks.shell import metrics
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from tests.helpers import NO_AUTH

REPO = Path(__file__).resolve().parents[1]


MONITORING = REPO / "deploy" / "monitoring"


KSM_CONFIG = MONITORING / "kube-state-metrics-config.yaml"


KSM_VALUES = MONITORING / "kube-state-metrics-values.yaml"


KPS_VALUES = MONITORING / "kube-prometheus-stack-values.yaml"


RULES = MONITORING / "alerts.rules.yaml"


PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"


DASHBOARD = MONITORING / "grafana-dashboard.json"


RULE_TESTS = REPO / "tests" / "monitoring" / "alerts.test.yaml"


RUNBOOK = REPO / "docs" / "runbook.md"


README = REPO / "README.md"


CRD_FILE = REPO / "metacontroller" / "crd.yaml"


PROMTOOL_HINT = (
    "promtool is missing: install Debian's prometheus package (apt-get install -y prometheus; "
    ".ci/run does it in CI)"
)


#: Metacontroller's own series (metacontroller v4.17.2): pkg/metrics/http.go builds
#: metacontroller_<hook>_{requests_total, request_duration_histogram_seconds,
#: in_flight_requests, dns_duration_histogram_seconds, tls_duration_histogram_seconds} for the
#: hook types of pkg/controller/common/common.go (sync, finalize, customize); the parent
#: controller's queue is client-go's workqueue named "CompositeController-<name>", exported by
#: controller-runtime's workqueue metrics provider.
METACONTROLLER_METRICS = frozenset(
    f"metacontroller_{hook}_{name}"
    for hook in ("sync", "finalize", "customize")
    for name in (
        "requests_total",
        "request_duration_histogram_seconds_bucket",
        "request_duration_histogram_seconds_count",
        "request_duration_histogram_seconds_sum",
        "in_flight_requests",
        "dns_duration_histogram_seconds_bucket",
        "tls_duration_histogram_seconds_bucket",
    )
) | frozenset(
    f"workqueue_{name}"
    for name in (
        "depth",
        "adds_total",
        "retries_total",
        "queue_duration_seconds_bucket",
        "queue_duration_seconds_count",
        "queue_duration_seconds_sum",
        "work_duration_seconds_bucket",
        "work_duration_seconds_count",
        "work_duration_seconds_sum",
        "unfinished_work_seconds",
        "longest_running_processor_seconds",
    )
)


#: kube-state-metrics' built-in CronJob series the backup alert joins with.
KSM_BUILTIN_METRICS = frozenset(
    {
        "kube_cronjob_next_schedule_time",
        "kube_cronjob_status_last_schedule_time",
        "kube_cronjob_created",
        "kube_deployment_status_replicas_available",
    }
)


#: Prometheus' own series.
PROMETHEUS_METRICS = frozenset({"up", "ALERTS"})


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def ksm_metrics() -> list[tuple[str, dict[str, Any]]]:
    """(full metric name, generator) for every metric of the config."""
    config = load_yaml(KSM_CONFIG)
    out = []
    for resource in config["spec"]["resources"]:
        prefix = resource.get("metricNamePrefix", "kube_customresource")
        for generator in resource["metrics"]:
            out.append(("_".join(p for p in (prefix, generator["name"]) if p), generator))
    return out


def ksm_exported_names() -> set[str]:
    return {name for name, _ in ksm_metrics()}


# ---------------------------------------------------------------- alerts


def render_prometheus_rule() -> str:
    """deploy/monitoring/prometheusrule.yaml: the rules file's groups in a PrometheusRule."""
    groups = load_yaml(RULES)["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "pg-failover-hook",
            "namespace": "pg-failover-hook",
            "labels": {
                "app.kubernetes.io/name": "pg-failover-hook",
                "app.kubernetes.io/part-of": "pg-failover-hook",
                "release": "kube-prometheus-stack",
            },
        },
        "spec": {"groups": groups},
    }
    header = (
        "# GENERATED from alerts.rules.yaml by `.venv/bin/python -m tests.test_monitoring`:\n"
        "# edit the rules file, then regenerate (tests/test_monitoring_*.py checks they match).\n"
        "#\n"
        "#   kubectl apply -f deploy/monitoring/prometheusrule.yaml\n"
        "#\n"
        "# kube-prometheus-stack loads PrometheusRules labelled release: <its release name>;\n"
        "# change that label if your release is not called kube-prometheus-stack.\n"
    )
    return header + yaml.safe_dump(rule, sort_keys=False, width=100, allow_unicode=True)


def alerts() -> list[dict[str, Any]]:
    return [
        rule for group in load_yaml(RULES)["groups"] for rule in group["rules"] if "alert" in rule
    ]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, PROMTOOL_HINT
    return path


# ---------------------------------------------------------------- metric names

#: PromQL functions, keywords and aggregation operators (not metric names).
PROMQL_WORDS = frozenset(
    re.findall(
        r"\S+",
        """
        sum by on and or unless without rate irate increase changes max min count avg time
        vector group_left group_right histogram_quantile label_replace offset bool topk bottomk
        sort sort_desc ignoring clamp_min clamp_max delta deriv abs absent count_over_time
        max_over_time min_over_time avg_over_time scalar le quantile group timestamp
        last_over_time inf nan
        """,
    )
)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers outside strings, braces, by/on lists."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables ($__rate_interval, $namespace)
    names = set(re.findall(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)", text))
    names |= set(re.findall(r'__name__=~?"([^"|]+)', expr))
    for alternatives in re.findall(r'__name__=~"([^"]+)"', expr):
        names |= set(alternatives.split("|"))
    return {n for n in names if n.lower() not in PROMQL_WORDS and not re.fullmatch(r"\d.*", n)}


def recorded_names() -> set[str]:
    return {r["record"] for g in load_yaml(RULES)["groups"] for r in g["rules"] if "record" in r}


@pytest.fixture(scope="module")
def hook_metrics() -> set[str]:
    """Every series name the hook's /metrics serves once each counter has a child."""
    for counter, labels in (
        (metrics.PROBES, ("leader",)),
        (metrics.REPLIES, ("NoLeader",)),
        (metrics.BAD_REQUESTS, ("sync",)),
        (metrics.ERRORS, ("sync",)),
        (metrics.AUTH_FAILURES, ("bad_token",)),
    ):
        counter.labels(*labels)
    metrics.SYNC_SECONDS.labels("sync")
    app = create_app(settings=HookSettings(auth=NO_AUTH))
    body = app.test_client().get("/metrics").get_data(as_text=True)
    names = set()
    for line in body.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    assert "pgfh_sync_replies_total" in names
    return names


def known_metrics(hook: set[str]) -> set[str]:
    return (
        hook
        | ksm_exported_names()
        | METACONTROLLER_METRICS
        | {name for name, _ in recorded_samples()}
        | KSM_BUILTIN_METRICS
        | PROMETHEUS_METRICS
        | recorded_names()
    )


#: What a real Metacontroller v4.17.2 and kube-state-metrics served, scraped by
#: testbed/bench/metacontroller_metrics.py: hook answering, hook down, hook answering 500, a
#: standby,
#: and the hook's Deployment with no Pod available.
RECORDED_SCRAPES = REPO / "tests" / "data" / "metacontroller-metrics"


def recorded_samples() -> list[tuple[str, dict[str, str]]]:
    samples = []
    for path in sorted(RECORDED_SCRAPES.glob("*.prom")):
        for family in text_string_to_metric_families(path.read_text()):
            samples += [(sample.name, dict(sample.labels)) for sample in family.samples]
    return samples
