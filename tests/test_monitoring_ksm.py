"""Monitoring: the kube-state-metrics config.

The operations kit in deploy/monitoring/: state metrics, alerts, runbook, dashboard.

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

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.monitoring_cases import (
    CRD_FILE,
    KPS_VALUES,
    KSM_CONFIG,
    KSM_VALUES,
    ksm_metrics,
    load_yaml,
)

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
