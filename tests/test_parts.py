"""The child-part registry: one interface, iterated by the sync, ``/customize`` and the
declared-children check.

Test design: the registry is read as data (its child groups against the shipped
CompositeController), and a throw-away part registered for one test proves that a new part
needs no other wiring: its children, status field and condition reach the sync reply, its
rule reaches ``/customize``, its child type reaches the declared-children check, and its
observed children are kept by a finalize or an invalid-spec reply's rules like any other.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from hooks import children
from hooks.children import backup, primary, readonly
from hooks.children.base import ChildGroup, Part, PartContext, PartPlan
from hooks.domain.model import ClusterSpec, Condition, ResyncTiming
from hooks.loaders.envelope import load_sync_request
from hooks.sync import reconcile
from pgfh_plugin import checks
from tests.helpers import CLUSTER, NAMESPACE, leader, replica, sync_body

NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)
TIMING = ResyncTiming(healthy=7.0, degraded=0.25)
CC = "metacontroller/compositecontroller.yaml"
WIDGET_KEY = "Widget.example.com/v1"


def test_the_registry_holds_the_three_parts_primary_first() -> None:
    assert children.PARTS == (primary.PART, readonly.PART, backup.PART)
    assert children.PRIMARY is primary.PART
    conditions = [part.condition for part in children.PARTS]
    assert conditions == ["PrimaryRouted", "ReplicasRouted", "BackupScheduled"]
    for part in children.PARTS:
        assert issubclass(part.reasons, enum.Enum) and len(part.reasons) > 0, part.name


def test_the_compositecontroller_declares_exactly_the_registered_child_types() -> None:
    with open(CC, encoding="utf-8") as handle:
        controller = yaml.safe_load(handle)
    declared = [(c["apiVersion"], c["resource"]) for c in controller["spec"]["childResources"]]
    assert declared == [(c.api_version, c.resource) for c in children.child_resources()]
    assert {c["updateStrategy"]["method"] for c in controller["spec"]["childResources"]} == {
        "InPlace"
    }


def test_child_resources_say_which_spec_field_needs_each_type() -> None:
    assert [(c.resource, c.needed_by) for c in children.child_resources()] == [
        ("services", ()),
        ("endpointslices", ("replicaService",)),
        ("cronjobs", ("backup",)),
    ]
    assert children.planned_groups() == {
        "EndpointSlice.discovery.k8s.io/v1",
        "CronJob.batch/v1",
    }


# ------------------------------------------------------------ a part added for one test


class WidgetReason(enum.Enum):
    READY = "WidgetReady"


def _widget_plan(context: PartContext) -> PartPlan:
    observed = context.request.other_children.get(WIDGET_KEY, {})
    children = [context.keep(obj) for _, obj in sorted(observed.items())]
    children.append(
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": f"{context.request.name}-widget", "namespace": NAMESPACE},
            "spec": {"leader": context.leader},
        }
    )
    condition = Condition("WidgetReady", "True", WidgetReason.READY.value, "the widget is ready")
    return PartPlan(children, {"widget": context.leader}, condition)


def _widget_rules(spec: ClusterSpec, uid: str | None) -> list[Mapping[str, Any]]:
    return [{"apiVersion": "example.com/v1", "resource": "gadgets", "labelSelector": {}}]


WIDGET = Part(
    name="widget",
    condition="WidgetReady",
    reasons=WidgetReason,
    child_groups=(ChildGroup(WIDGET_KEY, "example.com/v1", "widgets", "widget"),),
    related_rules=_widget_rules,
    plan=_widget_plan,
)


@pytest.fixture
def widget_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(children, "OPTIONAL", (*children.OPTIONAL, WIDGET))
    monkeypatch.setattr(children, "PARTS", (*children.PARTS, WIDGET))


def _widget(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "w-1"},
        "spec": {"leader": "old"},
    }


def _answers() -> dict[str, Any]:
    names = [f"{CLUSTER}-{i}" for i in range(3)]
    return {n: leader(n) if n == names[0] else replica(n) for n in names}


@pytest.mark.usefixtures("widget_registered")
def test_a_registered_part_reaches_the_reply_with_no_other_wiring() -> None:
    body = sync_body(extra_children={WIDGET_KEY: {"old-widget": _widget("old-widget")}})
    request = load_sync_request(copy.deepcopy(body))
    outcome = reconcile(request, _answers(), now=NOW, timing=TIMING)
    widgets = [c for c in outcome.body["children"] if c["kind"] == "Widget"]
    # The observed one is kept (once: the part owns its group), the new one is added.
    assert [w["metadata"]["name"] for w in widgets] == ["old-widget", f"{CLUSTER}-widget"]
    assert outcome.body["status"]["widget"] == f"{CLUSTER}-0"
    types = [c["type"] for c in outcome.body["status"]["conditions"]]
    assert types.index("WidgetReady") == types.index("SwitchoverDetection") - 1
    # A finalize or an invalid spec keeps the part's condition as it was.
    routed = copy.deepcopy(body)
    routed["parent"]["status"] = outcome.body["status"]
    routed["parent"]["spec"]["serviceRef"] = {"name": "NOT A NAME"}
    frozen = reconcile(load_sync_request(routed), {}, now=NOW, timing=TIMING)
    kept = [c for c in frozen.body["status"]["conditions"] if c["type"] == "WidgetReady"]
    assert [c["reason"] for c in kept] == ["WidgetReady"]
    assert "old-widget" in {c["metadata"]["name"] for c in frozen.body["children"]}


@pytest.mark.usefixtures("widget_registered")
def test_a_registered_part_reaches_customize_and_the_declared_children_check() -> None:
    request = load_sync_request(sync_body())
    assert request.spec is not None
    rules = children.related_rules(request.spec, "u-1")
    assert rules[-1]["resource"] == "gadgets" and rules[0]["resource"] == "pods"
    cluster = {"metadata": {"name": CLUSTER}, "spec": {"widget": {"size": 1}}}
    in_place = {"method": "InPlace"}
    controller = {
        "metadata": {"name": "pg"},
        "spec": {
            "parentResource": {"apiVersion": "adg.io/v1alpha1", "resource": "postgresqlclusters"},
            "childResources": [
                {"apiVersion": "v1", "resource": "services", "updateStrategy": in_place}
            ],
        },
    }
    results, _ = checks.controller([controller], [cluster])
    missing = [c.detail for c in results if not c.ok]
    assert missing == [
        f"does not declare child example.com/v1 widgets (needed by spec.widget of {CLUSTER})"
    ]


def _by_name_rules(spec: ClusterSpec, uid: str | None) -> list[Mapping[str, Any]]:
    return [
        {"apiVersion": "v1", "resource": "services", "names": ["pg-orders"]},
        {"apiVersion": "v1", "resource": "secrets", "names": ["pg-orders"]},
        {"apiVersion": "example.com/v1", "resource": "services", "names": ["pg-orders"]},
        {"apiVersion": "v1", "resource": "services", "names": ["pg-orders", "pg-orders-ro"]},
    ]


BY_NAME = Part(
    name="by-name",
    condition="WidgetReady",
    reasons=WidgetReason,
    child_groups=(),
    related_rules=_by_name_rules,
    plan=_widget_plan,
)


def test_rules_by_name_merge_per_api_version_and_resource_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rule per (apiVersion, resource): another resource or another group's resource of
    the same name is a rule of its own, and a name already listed is not listed twice."""
    monkeypatch.setattr(children, "PARTS", (BY_NAME,))
    spec = load_sync_request(sync_body()).spec
    assert spec is not None
    rules = children.related_rules(spec, "u-1", "db")
    assert [(r["apiVersion"], r["resource"], r["names"], r["namespace"]) for r in rules] == [
        ("v1", "services", ["pg-orders", "pg-orders-ro"], "db"),
        ("v1", "secrets", ["pg-orders"], "db"),
        ("example.com/v1", "services", ["pg-orders"], "db"),
    ]


def test_rules_without_a_namespace_name_none() -> None:
    """Without the parent's namespace (an unscoped call) the rules carry no namespace key at
    all, not a null one; with it, every rule is scoped to it."""
    spec = load_sync_request(sync_body()).spec
    assert spec is not None
    assert all("namespace" not in rule for rule in children.related_rules(spec, "u-1"))
    assert all(rule["namespace"] == "db" for rule in children.related_rules(spec, "u-1", "db"))
