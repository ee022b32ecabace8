"""Metacontroller's ClusterRole (``clusterRole.rules`` in deploy/metacontroller-values.yaml).

Test design notes:

* What Metacontroller must be allowed to do is computed, not copied: the parent and child types
  from every CompositeController that ``kubectl kustomize`` renders for every kustomization
  under ``deploy/`` (the base and each overlay), the related types from what the real
  ``/customize`` handler answers for specs with and without the optional parts, the Secrets
  (and ConfigMaps) from the rendered ``endpointConfigs``, the child kinds the sync hook answers
  with when every optional part is asked for; plus what Metacontroller itself does
  whatever the controller (leader election, Events, its own objects), each with the v4.17.2
  call that needs it.
* The rules are checked the way the API server's RBAC authorizer reads them (a rule matches
  when its apiGroups, resources, verbs and, if set, resourceNames all match) and must contain
  no ``*`` in any field.
* Minimality: dropping any one rule must leave some need uncovered, so no rule is there for
  nothing. Negative controls: the chart's own default (``*``) is refused, and a rule set
  missing a child type is reported.
* The chart renders the list verbatim as the ClusterRole's ``rules``
  (templates/clusterrole.yaml); the ClusterRole it would render is validated with
  kubernetes-validate, like every manifest under deploy/.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest
import yaml
from flask.testing import FlaskClient

from tests.child_helpers import backup_fields, cluster_answers, request_body, rs_spec
from tests.helpers import P0, fixture, run
from tests.manifest_helpers import K8S_VERSIONS, REPO, rendered

HELM_VALUES = REPO / "deploy" / "metacontroller-values.yaml"
#: The lease Metacontroller's leader election holds (--leader-election-id's default).
LEASE_NAME = "metacontroller"
#: What the default --apply-strategy=dynamic-apply does to a child (manage_children.go
#: DynamicApply.Apply, controllerref adoptChild): no patch, which only server-side apply sends.
CHILD_VERBS = ("get", "list", "watch", "create", "update", "delete")
INFORMER_VERBS = ("list", "watch")


@dataclass(frozen=True)
class Need:
    """One API request Metacontroller makes, and why."""

    group: str
    resource: str
    verb: str
    why: str
    name: str | None = None


def kustomizations() -> list[str]:
    """Every kustomization a cluster admin may apply: deploy/ and each overlay under it."""
    found = sorted(
        str(path.parent.relative_to(REPO))
        for path in (REPO / "deploy").rglob("kustomization.yaml")
        # base, deploy/sharding's shard-<k> parts and components (deploy/large-install) are
        # pieces of other kustomizations.
        if path.parent.name != "base"
        and not path.parent.name.startswith("shard-")
        and yaml.safe_load(path.read_text(encoding="utf-8")).get("kind") != "Component"
    )
    assert "deploy" in found and len(found) >= 3, found
    return found


def split_api_version(api_version: str) -> str:
    """The API group of ``group/version`` (``""`` for the core group's ``v1``)."""
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def rules() -> list[dict[str, Any]]:
    values = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    result = values["clusterRole"]["rules"]
    assert isinstance(result, list) and result
    return result


def allows(rule_set: Iterable[Mapping[str, Any]], need: Need) -> bool:
    """Whether some rule grants ``need``, as the RBAC authorizer decides (no wildcards)."""
    for rule in rule_set:
        if need.group not in rule.get("apiGroups", []):
            continue
        if need.resource not in rule.get("resources", []):
            continue
        if need.verb not in rule.get("verbs", []):
            continue
        names = rule.get("resourceNames")
        if names and need.name not in names:
            continue
        return True
    return False


def wildcards(rule_set: Iterable[Mapping[str, Any]]) -> list[str]:
    found = []
    for index, rule in enumerate(rule_set):
        for key, values in rule.items():
            for value in values if isinstance(values, list) else [values]:
                if "*" in str(value):
                    found.append(f"rule {index} {key}: {value}")
    return found


# ------------------------------------------------------------------------- the needs


def metacontroller_own_needs() -> list[Need]:
    """What Metacontroller v4.17.2 does whatever controllers it runs."""
    needs = [
        Need("metacontroller.k8s.io", kind, verb, "pkg/server/server.go: manager cache watch")
        for kind in ("compositecontrollers", "decoratorcontrollers")
        for verb in ("get", "list", "watch")
    ]
    needs += [
        Need("metacontroller.k8s.io", "controllerrevisions", verb, "controller_revision.go")
        for verb in ("get", "list", "watch", "create", "update", "delete")
    ]
    needs += [
        Need("apiextensions.k8s.io", "customresourcedefinitions", verb, "parent CRD, cached Get")
        for verb in ("get", *INFORMER_VERBS)
    ]
    needs += [
        Need("coordination.k8s.io", "leases", "create", "leader election: LeaseLock.Create"),
        Need("coordination.k8s.io", "leases", "get", "LeaseLock.Get", name=LEASE_NAME),
        Need("coordination.k8s.io", "leases", "update", "LeaseLock.Update", name=LEASE_NAME),
    ]
    # Core v1 only: pkg/events/events.go EventSinkImpl{CoreV1().Events}, and leader election
    # through controller-runtime v0.24.1's GetEventRecorderFor (the core recorder);
    # Metacontroller never records through the events.k8s.io recorder (GetEventRecorder).
    needs += [
        Need("", "events", verb, "pkg/events/events.go EventSinkImpl; leader election")
        for verb in ("create", "patch")
    ]
    needs += [
        Need("", "namespaces", verb, "customize/manager.go: namespaces informer")
        for verb in INFORMER_VERBS
    ]
    return needs


def compositecontrollers() -> dict[str, dict[str, Any]]:
    """The CompositeControllers each kustomization renders (deploy/sharding: one per shard)."""
    found = {}
    for target in kustomizations():
        ccs = [o for o in rendered(target) if o["kind"] == "CompositeController"]
        assert ccs, f"{target} renders no CompositeController"
        for cc in ccs:
            found[f"{target}: {cc['metadata']['name']}"] = cc
    return found


def controller_needs(cc: Mapping[str, Any]) -> list[Need]:
    """Parent, status, finalizers and children of one CompositeController."""
    spec = cc["spec"]
    parent = spec["parentResource"]
    group, resource = split_api_version(parent["apiVersion"]), parent["resource"]
    needs = [
        Need(group, resource, verb, "parent: informer, live Get, finalizer AtomicUpdate")
        for verb in ("get", "list", "watch", "update")
    ]
    needs.append(Need(group, f"{resource}/status", "update", "AtomicStatusUpdate"))
    needs.append(Need(group, f"{resource}/finalizers", "update", "blockOwnerDeletion"))
    for child in spec["childResources"]:
        child_group = split_api_version(child["apiVersion"])
        needs += [
            Need(child_group, child["resource"], verb, "child: manage_children.go")
            for verb in CHILD_VERBS
        ]
    needs += secret_needs(spec.get("endpointConfigs", []))
    for hook in spec["hooks"].values():
        needs += secret_needs([hook.get("webhook", {})])
    return needs


def secret_needs(configs: Iterable[Mapping[str, Any]]) -> list[Need]:
    """Every Secret / ConfigMap an endpoint config refers to: read through the cached client."""
    needs = []
    for config in configs:
        for key in ("authorization", "basicAuth", "clientTLS", "caBundle"):
            setting = config.get(key)
            if not isinstance(setting, Mapping):
                continue
            if "secretRef" in setting:
                needs += [
                    Need("", "secrets", verb, f"pkg/hooks {key}: cached client Get")
                    for verb in ("get", *INFORMER_VERBS)
                ]
            if "configMapRef" in setting:
                needs += [
                    Need("", "configmaps", verb, f"pkg/hooks {key}: cached client Get")
                    for verb in ("get", *INFORMER_VERBS)
                ]
    return needs


def customize_requests() -> list[dict[str, Any]]:
    """Customize requests whose answers name every related type the hook can ask for."""
    seed = fixture("customize-request.json")
    full = yaml.safe_load(
        (REPO / "metacontroller" / "example-postgresqlcluster-full.yaml").read_text()
    )
    with_full_spec = copy.deepcopy(seed)
    with_full_spec["parent"]["spec"] = full["spec"]
    assert "backup" in full["spec"] and "replicaService" in full["spec"]
    return [seed, with_full_spec]


def related_needs(client: FlaskClient) -> list[Need]:
    needs = []
    kinds = set()
    for body in customize_requests():
        response = client.post("/customize", data=json.dumps(body), content_type="application/json")
        assert response.status_code == 200, response.get_data(as_text=True)
        for rule in response.get_json()["relatedResources"]:
            group = split_api_version(rule["apiVersion"])
            kinds.add((group, rule["resource"]))
            needs += [
                Need(group, rule["resource"], verb, "customize/manager.go: related informer")
                for verb in ("get", *INFORMER_VERBS)
            ]
    # The full spec (with spec.backup) must have made the hook name its backup Jobs.
    assert {("", "pods"), ("batch", "jobs")} <= kinds, kinds
    return needs


#: The resource of each kind the sync hook can answer with (the children Metacontroller writes).
CHILD_RESOURCES = {
    ("", "Service"): "services",
    ("discovery.k8s.io", "EndpointSlice"): "endpointslices",
    ("batch", "CronJob"): "cronjobs",
}


def emitted_child_needs() -> list[Need]:
    """What Metacontroller must do with every kind of child the sync hook answers with."""
    spec = {**rs_spec(), "backup": backup_fields()}  # every optional child asked for
    _, outcome = run(request_body(spec=spec), cluster_answers(P0))
    kinds = {(split_api_version(c["apiVersion"]), c["kind"]) for c in outcome.body["children"]}
    assert kinds == set(CHILD_RESOURCES), f"a new child kind: map it to its resource: {kinds}"
    return [
        Need(group, CHILD_RESOURCES[(group, kind)], verb, "a child the hook answers with")
        for group, kind in sorted(kinds)
        for verb in CHILD_VERBS
    ]


def all_needs(client: FlaskClient) -> list[Need]:
    needs = metacontroller_own_needs() + related_needs(client) + emitted_child_needs()
    for cc in compositecontrollers().values():
        needs += controller_needs(cc)
    return needs


# ------------------------------------------------------------------------------ tests


def test_the_rules_hold_no_wildcard() -> None:
    assert wildcards(rules()) == []


def test_the_rules_cover_everything_metacontroller_does_for_the_hook(
    client: FlaskClient,
) -> None:
    missing = [need for need in all_needs(client) if not allows(rules(), need)]
    assert missing == []


def test_every_rule_is_needed(client: FlaskClient) -> None:
    needs = all_needs(client)
    current = rules()
    for index, rule in enumerate(current):
        without = current[:index] + current[index + 1 :]
        uncovered = [need for need in needs if not allows(without, need)]
        assert uncovered, f"rule {index} is needed by nothing: {rule}"


def test_every_overlay_renders_the_same_types() -> None:
    """All overlays manage the same parent and children, so one rule set serves them all."""
    kinds = {
        target: (
            cc["spec"]["parentResource"]["apiVersion"],
            cc["spec"]["parentResource"]["resource"],
            sorted((c["apiVersion"], c["resource"]) for c in cc["spec"]["childResources"]),
        )
        for target, cc in compositecontrollers().items()
    }
    assert len(set(map(repr, kinds.values()))) == 1, kinds


def test_the_apply_strategy_is_the_default_that_never_patches_children() -> None:
    """With --apply-strategy=server-side-apply every child write is a PATCH: the child rules
    would need "patch" (and CHILD_VERBS with them)."""
    values = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    strategies = [a for a in values["commandArgs"] if a.startswith("--apply-strategy")]
    assert strategies in ([], ["--apply-strategy=dynamic-apply"]), strategies
    for rule in rules():
        if {"services", "endpointslices", "cronjobs"} & set(rule["resources"]):
            assert "patch" not in rule["verbs"], rule


def test_the_lease_is_the_one_leader_election_uses() -> None:
    values = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    args = values["commandArgs"]
    assert "--leader-election" in args
    # The defaults the lease rule relies on: leases, named "metacontroller", own namespace.
    for flag in ("--leader-election-resource-lock", "--leader-election-id"):
        assert not any(a.startswith(flag) for a in args), f"{flag} changed: update the rule"


def test_the_chart_would_render_a_valid_clusterrole() -> None:
    """templates/clusterrole.yaml: ``rules: {{ toYaml .Values.clusterRole.rules }}``."""
    values = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    assert values.get("rbac", {}).get("create", True) is not False
    assert not values["clusterRole"].get("aggregationRule"), "aggregation would add rules"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "metacontroller"},
        "rules": values["clusterRole"]["rules"],
    }
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(role, version, strict=True)


# ------------------------------------------------------------------- negative controls


CHART_DEFAULT = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]


def test_negative_control_the_charts_default_is_refused() -> None:
    assert wildcards(CHART_DEFAULT) == [
        "rule 0 apiGroups: *",
        "rule 0 resources: *",
        "rule 0 verbs: *",
    ]
    assert wildcards([{"apiGroups": [""], "resources": ["pods/*"], "verbs": ["get"]}])


def test_negative_control_a_missing_child_type_is_reported(client: FlaskClient) -> None:
    without_cronjobs = [r for r in rules() if "cronjobs" not in r["resources"]]
    missing = {(n.group, n.resource) for n in all_needs(client) if not allows(without_cronjobs, n)}
    assert missing == {("batch", "cronjobs")}


def test_negative_control_resource_names_restrict_a_rule() -> None:
    rule = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}
    named = {**rule, "resourceNames": ["other"]}
    need = Need("coordination.k8s.io", "leases", "get", "", name=LEASE_NAME)
    assert allows([rule], need) and not allows([named], need)


@pytest.mark.parametrize("key", ["authorization", "clientTLS", "caBundle"])
def test_negative_control_every_secret_reference_is_a_need(key: str) -> None:
    assert secret_needs([{key: {"secretRef": {"name": "x", "namespace": "y"}}}])
    assert secret_needs([{key: {"configMapRef": {"name": "x"}}}])[0].resource == "configmaps"
