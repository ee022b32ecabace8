"""The operations kit in deploy/monitoring/: state metrics, alerts, runbook, dashboard.

Test design notes:

* kube-state-metrics' custom-resource-state config is checked against a strict JSON schema
  that encodes KSM's own Go types (``pkg/customresourcestate/config.go`` and
  ``config_metrics_types.go``: every field name, ``additionalProperties: false``), plus the
  semantics those types leave open: every ``path``/``labelsFromPath``/``valueFrom`` must name a
  field that the CRD's status schema declares (walked as KSM walks objects: an array yields
  one metric per element, an object one per key), and every gauge value must be a type KSM
  converts (number, boolean, condition status, RFC 3339 time). The Helm values must carry the
  same document.
* The alerts: ``promtool check rules`` and ``promtool test rules`` (tests/monitoring/) run
  here, so ``make test`` runs them. A structural check proves the unit tests are complete:
  every alert has a case where it fires and one where it is silent, and every alert with a
  ``for:`` is checked silent while pending. The PrometheusRule must equal the rules file.
* Every metric an alert or a dashboard panel names must be exported by someone: the hook
  (scraped from a real app's /metrics), the state-metrics config, kube-state-metrics' own
  cronjob series, or Metacontroller (names from its source, listed below).
* promtool comes from Debian's ``prometheus`` package (.ci/run installs it): missing, the
  tests fail with the install hint instead of skipping.

Regenerate deploy/monitoring/prometheusrule.yaml after editing the rules file with
``.venv/bin/python -m tests.test_monitoring``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hooks.domain.members import MemberStatus
from hooks.shell import metrics
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.fakes.patroni_wire import patroni_body
from tests.helpers import NO_AUTH, heading_anchor, leader, make_service, replica, sync_body

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


# ---------------------------------------------------------------- kube-state-metrics config

_PATH = {"type": "array", "items": {"type": "string"}}
_LABELS_FROM_PATH = {"type": "object", "additionalProperties": _PATH}
_COMMON_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"labelsFromPath": _LABELS_FROM_PATH, "path": _PATH}

#: KSM's config types as a JSON schema (v2.13+: Metrics/MetricsSpec/Resource/Generator/Metric,
#: MetricGauge/MetricInfo/MetricStateSet with the inlined MetricMeta and Labels). Strict: a
#: misspelt key, which KSM's YAML decoder would silently ignore, is an error here.
KSM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["spec"],
    "properties": {
        # Not a field of the Go type (ignored by the decoder); KSM's docs write it.
        "kind": {"const": "CustomResourceStateMetrics"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["resources"],
            "properties": {
                "resources": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["groupVersionKind", "metrics"],
                        "properties": {
                            "commonLabels": _COMMON_LABELS,
                            "labelsFromPath": _LABELS_FROM_PATH,
                            "metricNamePrefix": {"type": "string"},
                            "groupVersionKind": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["group", "version", "kind"],
                                "properties": {
                                    "group": {"type": "string"},
                                    "version": {"type": "string"},
                                    "kind": {"type": "string"},
                                },
                            },
                            "resourcePlural": {"type": "string"},
                            "errorLogV": {"type": "integer", "minimum": 0},
                            "metrics": {
                                "type": "array",
                                "minItems": 1,
                                "items": {"$ref": "#/$defs/generator"},
                            },
                        },
                    },
                }
            },
        },
    },
    "$defs": {
        "generator": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "help", "each"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                "help": {"type": "string", "minLength": 1},
                "commonLabels": _COMMON_LABELS,
                "labelsFromPath": _LABELS_FROM_PATH,
                "errorLogV": {"type": "integer", "minimum": 0},
                "each": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["type"],
                    "properties": {
                        # configOverrides lower-cases it; metric.Type is gauge|stateset|info.
                        "type": {"enum": ["Gauge", "StateSet", "Info"]},
                        "gauge": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                **_META,
                                "labelFromKey": {"type": "string"},
                                "valueFrom": _PATH,
                                "valueType": {"enum": ["", "duration", "quantity"]},
                                "nilIsZero": {"type": "boolean"},
                            },
                        },
                        "info": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {**_META, "labelFromKey": {"type": "string"}},
                        },
                        "stateSet": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["list", "labelName"],
                            "properties": {
                                **_META,
                                "list": {"type": "array", "items": {"type": "string"}},
                                "labelName": {"type": "string"},
                                "valueFrom": _PATH,
                            },
                        },
                    },
                    # The union's discriminator must name the member that is set, and only it.
                    "oneOf": [
                        {
                            "properties": {"type": {"const": t}},
                            "required": [t.lower() if t != "StateSet" else "stateSet"],
                            "not": {
                                "anyOf": [
                                    {"required": [o]}
                                    for o in ("gauge", "info", "stateSet")
                                    if o != (t.lower() if t != "StateSet" else "stateSet")
                                ]
                            },
                        }
                        for t in ("Gauge", "StateSet", "Info")
                    ],
                },
            },
        }
    },
}

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: ObjectMeta fields a CRD's schema leaves undeclared (metadata is just "type: object").
_OBJECT_META = {"name": {"type": "string"}, "namespace": {"type": "string"}}


def crd_schema() -> dict[str, Any]:
    crd = load_yaml(CRD_FILE)
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def resolve(schema: Mapping[str, Any], path: list[str], where: str) -> Mapping[str, Any]:
    """The sub-schema that KSM's path ``path`` reaches from ``schema``, or a test failure.

    A ``[key=value]`` segment selects an element of an array (its ``items``, whose
    properties must include ``key``); any other segment must be a declared property.
    """
    node = schema
    for segment in path:
        if segment.startswith("[") and segment.endswith("]"):
            key = segment[1:-1].split("=", 1)[0]
            assert node.get("type") == "array", f"{where}: {segment} filters a non-array"
            node = node["items"]
            assert key in node.get("properties", {}), f"{where}: {segment}: no field {key!r}"
            continue
        if node.get("type") == "array" and segment.isdigit():
            node = node["items"]
            continue
        properties = node.get("properties", {})
        if segment in _OBJECT_META and not properties and where.endswith("metadata"):
            node = _OBJECT_META[segment]
            continue
        assert segment in properties, f"{where}: {'.'.join(path)}: no field {segment!r}"
        node = properties[segment]
    return node


def resolve_from_root(path: list[str], where: str) -> Mapping[str, Any]:
    root = crd_schema()
    if path[:1] == ["metadata"]:
        assert len(path) == 2 and path[1] in _OBJECT_META, f"{where}: {path}"
        return _OBJECT_META[path[1]]
    return resolve(root, path, where)


def is_gauge_value(node: Mapping[str, Any]) -> bool:
    """Whether KSM's toFloat64 converts every value this schema allows."""
    kind = node.get("type")
    if kind in ("integer", "number", "boolean"):
        return True
    if kind == "string":
        if node.get("format") == "date-time":
            return True
        allowed = {str(v).lower() for v in node.get("enum", ())}
        return bool(allowed) and allowed <= {"true", "false", "unknown", "yes", "no"}
    return False


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


def test_ksm_config_follows_kube_state_metrics_config_types() -> None:
    jsonschema.validate(load_yaml(KSM_CONFIG), KSM_SCHEMA)


@pytest.mark.parametrize(
    "broken",
    [
        {"spec": {"resources": [{"groupVersionKind": {}, "metrics": []}]}},
        {"spec": {"resource": []}},
        # misspelt field name inside a gauge
        {
            "spec": {
                "resources": [
                    {
                        "groupVersionKind": {"group": "g", "version": "v", "kind": "K"},
                        "metrics": [
                            {
                                "name": "x",
                                "help": "h",
                                "each": {"type": "Gauge", "gauge": {"pth": []}},
                            }
                        ],
                    }
                ]
            }
        },
        # type says Info, the member set is gauge
        {
            "spec": {
                "resources": [
                    {
                        "groupVersionKind": {"group": "g", "version": "v", "kind": "K"},
                        "metrics": [
                            {
                                "name": "x",
                                "help": "h",
                                "each": {"type": "Info", "gauge": {"path": []}},
                            }
                        ],
                    }
                ]
            }
        },
    ],
)
def test_ksm_schema_refuses_broken_configs(broken: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, KSM_SCHEMA)


def test_ksm_config_targets_the_postgresqlcluster_crd() -> None:
    crd = load_yaml(CRD_FILE)
    (resource,) = load_yaml(KSM_CONFIG)["spec"]["resources"]
    gvk = resource["groupVersionKind"]
    assert gvk == {
        "group": crd["spec"]["group"],
        "version": crd["spec"]["versions"][0]["name"],
        "kind": crd["spec"]["names"]["kind"],
    }
    assert resource["resourcePlural"] == crd["spec"]["names"]["plural"]
    assert resource["labelsFromPath"] == {
        "namespace": ["metadata", "namespace"],
        "name": ["metadata", "name"],
    }


def check_ksm_paths(generator: Mapping[str, Any], name: str) -> None:
    """Every path of one generator names a declared CRD field, walked as KSM walks it."""
    each = generator["each"]
    member = {"Gauge": "gauge", "Info": "info", "StateSet": "stateSet"}[each["type"]]
    spec = each[member]
    for label, path in generator.get("labelsFromPath", {}).items():
        assert _LABEL_NAME.match(label), f"{name}: label {label!r}"
        resolve_from_root(path, f"{name} labelsFromPath.{label}")
    base = resolve_from_root(spec.get("path", []), f"{name} path") if spec.get("path") else None
    if base is None:
        # No path: KSM hands the whole object over; labels and value resolve from the root.
        element: Mapping[str, Any] = crd_schema()
    elif base.get("type") == "array":
        element = base["items"]  # one metric per element
    else:
        element = base
    for label, path in spec.get("labelsFromPath", {}).items():
        assert _LABEL_NAME.match(label), f"{name}: label {label!r}"
        target = resolve(element, path, f"{name} labelsFromPath.{label}") if path else element
        assert target.get("type") in ("string", "integer", "boolean"), f"{name}: {label}"
    if member == "gauge":
        value_from = spec.get("valueFrom", [])
        if base is not None and base.get("type") == "object" and value_from:
            # A gauge on an object iterates its keys: KSM resolves a one-segment valueFrom
            # against the key's own value (registry_factory.go, compiledGauge.Values).
            assert len(value_from) == 1, f"{name}: valueFrom on an object must be one key"
        value = resolve(element, value_from, f"{name} valueFrom") if value_from else element
        assert is_gauge_value(value), f"{name}: KSM cannot turn {value} into a number"


def test_every_ksm_path_exists_in_the_crd_status_schema() -> None:
    metrics = ksm_metrics()
    assert metrics
    for name, generator in metrics:
        check_ksm_paths(generator, name)


def test_ksm_path_check_can_fail() -> None:
    bad = {
        "name": "x",
        "help": "h",
        "each": {"type": "Gauge", "gauge": {"path": ["status", "members"], "valueFrom": ["lag"]}},
    }
    with pytest.raises(AssertionError, match="lag"):
        check_ksm_paths(bad, "x")
    not_a_number = {
        "name": "x",
        "help": "h",
        "each": {"type": "Gauge", "gauge": {"path": ["status", "primary"]}},
    }
    with pytest.raises(AssertionError, match="cannot turn"):
        check_ksm_paths(not_a_number, "x")


def test_ksm_config_covers_the_status_the_issue_asks_for() -> None:
    """Ready/PrimaryRouted status and reason, primary, members and reachable members,
    read-only endpoints, last backup success."""
    by_name = dict(ksm_metrics())
    condition = by_name["pgfh_cluster_condition"]["each"]["gauge"]
    assert condition["path"] == ["status", "conditions"]
    assert set(condition["labelsFromPath"]) >= {"type", "status", "reason"}
    info = by_name["pgfh_cluster_info"]["each"]["info"]["labelsFromPath"]
    assert info["primary"] == ["status", "primary"]
    members = by_name["pgfh_cluster_member_reachable"]["each"]["gauge"]
    assert members["path"] == ["status", "members"] and members["valueFrom"] == ["reachable"]
    assert by_name["pgfh_cluster_replica_endpoint_info"]["each"]["info"]["path"] == [
        "status",
        "replicaEndpoints",
    ]
    backup = by_name["pgfh_cluster_backup_last_success_timestamp_seconds"]["each"]["gauge"]
    assert backup["path"] == ["status", "backup", "lastSuccessful"]
    assert backup["valueFrom"] == ["completionTime"]


@pytest.mark.parametrize(
    ("values_file", "key"), [(KSM_VALUES, None), (KPS_VALUES, "kube-state-metrics")]
)
def test_helm_values_load_the_same_ksm_config(values_file: Path, key: str | None) -> None:
    values = load_yaml(values_file)
    ksm = values[key] if key else values
    assert set(ksm) == {"customResourceState", "rbac"}
    assert ksm["customResourceState"]["enabled"] is True
    assert ksm["customResourceState"]["config"] == load_yaml(KSM_CONFIG), (
        f"{values_file.name} must carry kube-state-metrics-config.yaml unchanged"
    )
    rules = ksm["rbac"]["extraRules"]
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted[("adg.io", "postgresqlclusters")] >= {"list", "watch"}
    assert granted[("apiextensions.k8s.io", "customresourcedefinitions")] >= {"list", "watch"}


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
        "# edit the rules file, then regenerate (tests/test_monitoring.py checks they match).\n"
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


# ---------------------------------------------------------------- metric names

#: PromQL functions, keywords and aggregation operators (not metric names).
_PROMQL_WORDS = frozenset(
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
    return {n for n in names if n.lower() not in _PROMQL_WORDS and not re.fullmatch(r"\d.*", n)}


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


def test_metric_name_extraction() -> None:
    assert metric_names(
        'sum by (namespace, job) (rate(pgfh_x_total{a="b c", d=~"e|f"}[5m])) / on (x) foo > 0'
    ) == {"pgfh_x_total", "foo"}
    assert metric_names('rate({__name__=~"a_total|b_total", e="x"}[1m])') == {"a_total", "b_total"}


#: What a real Metacontroller v4.17.2 and kube-state-metrics served, scraped by
#: testbed/bench/metacontroller_metrics.py: hook answering, hook down, hook answering 500, a
#: standby,
#: and the hook's Deployment with no Pod available.
RECORDED_SCRAPES = REPO / "tests" / "data" / "metacontroller-metrics"
#: Labels the scrape adds (target labels): not in the exposition, so not checked against it.
TARGET_LABELS = frozenset({"job", "namespace", "instance", "pod", "service", "endpoint"})
#: Series families the recorded scrapes must back whenever a rule selects them.
RECORDED_PREFIXES = ("metacontroller_", "workqueue_", "leader_election_", "kube_deployment_")


def recorded_samples() -> list[tuple[str, dict[str, str]]]:
    samples = []
    for path in sorted(RECORDED_SCRAPES.glob("*.prom")):
        for family in text_string_to_metric_families(path.read_text()):
            samples += [(sample.name, dict(sample.labels)) for sample in family.samples]
    return samples


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


# ---------------------------------------------------------------- dashboard

GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__range": "1h",
    "$__interval": "1m",
    "$namespace": "db",
    "$cluster": "pg",
    "$job": "pg-failover-hook",
}


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
