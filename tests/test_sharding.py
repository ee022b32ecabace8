"""deploy/sharding/: K CompositeControllers, K Metacontroller installs, one admission policy.

Validated offline like the rest of deploy/ (tests/test_manifests_*.py): rendered with
kustomize, every object against Kubernetes' schemas (the ValidatingAdmissionPolicy needs
1.30+), the CompositeControllers against Metacontroller's CRD; the policy's CEL rules are
evaluated with cel-python on the requests the API server would send; the overlay is
exactly what ``deploy/sharding/shards.py generate`` writes (no hand edits drift).
"""

from __future__ import annotations

import collections
import copy
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from tests.admission_cases import SHARD_CASES, Case
from tests.manifest_helpers import (
    CC_FILE,
    HELM_VALUES,
    K8S_VERSIONS,
    REPO,
    compositecontroller_schema,
    find,
    find_all,
    load_one,
    pruned_fields,
    rendered,
    validate_cr,
)

SHARDING = REPO / "deploy" / "sharding"
SCRIPT = SHARDING / "shards.py"


def _shards() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shards", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shards = _shards()
K = shards.SHARDS
LABEL = shards.LABEL
POLICY = "pg-failover-hook-shard-label"


def test_overlay_is_what_the_generator_writes() -> None:
    expected = shards.files(K, shards.QPS, shards.BURST)
    on_disk = {
        str(p.relative_to(SHARDING)): p.read_text(encoding="utf-8")
        for p in SHARDING.rglob("*.yaml")
    }
    assert on_disk == expected


def test_generator_writes_another_k(tmp_path: Path) -> None:
    for k in (1, 3, 8):
        files = shards.files(k, 100, 10)
        assert len([f for f in files if f.startswith("shard-")]) == k
        assert len([f for f in files if f.startswith("values/")]) == k
        assert f'"{k - 1}"' in files["admission.yaml"]


@pytest.mark.parametrize("version", [v for v in K8S_VERSIONS if v >= "1.30"])
def test_overlay_renders_and_every_object_validates(version: str) -> None:
    objects = rendered("deploy/sharding")
    for obj in objects:
        if obj["kind"] == "CompositeController":
            continue  # Metacontroller's CRD: test_shard_compositecontrollers_*
        kubernetes_validate.validate(obj, version, strict=True)
    # Exactly the base's objects, minus its CompositeController, plus the shards and policy.
    base = sorted((o["kind"], o["metadata"]["name"]) for o in rendered("deploy"))
    here = sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    expected = [x for x in base if x[0] != "CompositeController"]
    expected += [("CompositeController", f"pg-failover-hook-{k}") for k in range(K)]
    expected += [
        ("ValidatingAdmissionPolicy", "pg-failover-hook-shard-label"),
        ("ValidatingAdmissionPolicyBinding", "pg-failover-hook-shard-label"),
    ]
    assert here == sorted(expected)
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pg-failover-hook"


def test_shard_compositecontrollers_validate_and_select_their_shard() -> None:
    schema = compositecontroller_schema()
    shipped = load_one(CC_FILE)
    assert shipped["spec"].pop("resyncPeriodSeconds") == 60
    for k in range(K):
        cc = find(rendered("deploy/sharding"), "CompositeController", f"pg-failover-hook-{k}")
        validate_cr(cc, schema)
        assert pruned_fields(cc, schema) == []
        assert cc["metadata"]["labels"][LABEL] == str(k)
        parent = cc["spec"]["parentResource"]
        assert parent.pop("labelSelector") == {"matchLabels": {LABEL: str(k)}}
        # Everything else is the shipped controller (same hooks, children, auth) less its
        # resyncPeriodSeconds: a shard is a large install (deploy/large-install/).
        assert cc["spec"] == shipped["spec"]


def test_negative_control_a_shard_controller_with_a_typo_is_caught() -> None:
    schema = compositecontroller_schema()
    cc = copy.deepcopy(find_all(rendered("deploy/sharding"), "CompositeController")[0])
    cc["spec"]["parentResource"]["labelSelectors"] = cc["spec"]["parentResource"].pop(
        "labelSelector"
    )
    assert pruned_fields(cc, schema) == [".spec.parentResource.labelSelectors"]


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """--target-label-selector as Metacontroller parses it (labels.Parse): here k=v pairs."""
    return all(labels.get(k) == v for k, v in (p.split("=", 1) for p in selector.split(",")))


def test_each_install_runs_exactly_its_own_controller() -> None:
    common = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    controllers = find_all(rendered("deploy/sharding"), "CompositeController")
    lease_ids = set()
    total_qps = 0.0
    for k in range(K):
        values = yaml.safe_load((SHARDING / "values" / f"shard-{k}.yaml").read_text())
        merged = {**common, **values}  # Helm replaces lists: commandArgs is the shard's
        args = merged["commandArgs"]
        flags = dict(a.split("=", 1) for a in args if "=" in a)
        # The chart's defaults and the HA flags of the common values stay.
        for arg in common["commandArgs"]:
            if not arg.startswith(("--workers", "--client-go")):
                assert arg in args, (k, arg)
        selected = [
            cc["metadata"]["name"]
            for cc in controllers
            if _selector_matches(flags["--target-label-selector"], cc["metadata"]["labels"])
        ]
        assert selected == [f"pg-failover-hook-{k}"]
        lease_ids.add(flags["--leader-election-id"])
        # The RBAC rules are the common ones, the lease rule naming this install's lease.
        rules = copy.deepcopy(merged["clusterRole"]["rules"])
        (lease,) = [r for r in rules if r.get("resourceNames") and "leases" in r["resources"]]
        assert lease["resourceNames"] == [flags["--leader-election-id"]]
        lease["resourceNames"] = ["metacontroller"]
        assert rules == common["clusterRole"]["rules"]
        total_qps += float(flags["--client-go-qps"]) + float(flags["--client-go-burst"])
    assert len(lease_ids) == K
    # 0.2 requests/s per cluster for 5,000 clusters (docs/scale.md), burst included.
    assert total_qps == 1000


def test_shard_assignment_is_stable_and_even() -> None:
    assert shards.shard_of("databases", "pg-orders", 5) == shards.shard_of(
        "databases", "pg-orders", 5
    )
    counts = collections.Counter(shards.shard_of("ns", f"pg-{i}", K) for i in range(10_000))
    assert sorted(counts) == list(range(K))
    assert all(abs(c - 10_000 / K) < 0.05 * 10_000 / K for c in counts.values()), counts


#: Golden shards of fixed clusters for K = 2, 3, 5 and 8. A labelled cluster keeps its label
#: for ever (the admission policy refuses a change), so a change of the hash (another
#: algorithm, encoding, separator or reduction) would put every new cluster of a namespace
#: on a different shard than ``assign`` told its operator, and ``label`` would disagree
#: with the labels already set: this must fail first.
PINNED_SHARDS = {
    ("databases", "pg-orders"): (0, 0, 3, 2),
    ("databases", "pg-billing"): (1, 1, 0, 1),
    ("databases", "pg-orders-2"): (1, 1, 2, 5),
    ("default", "pg-0"): (0, 2, 4, 4),
    ("payments", "orders-eu-1"): (1, 2, 0, 1),
    ("team-a", "pg"): (0, 1, 1, 0),
}


@pytest.mark.parametrize(("namespace", "name"), list(PINNED_SHARDS))
def test_the_shard_of_a_fixed_cluster_never_changes(namespace: str, name: str) -> None:
    got = tuple(shards.shard_of(namespace, name, k) for k in (2, 3, 5, 8))
    assert got == PINNED_SHARDS[(namespace, name)]


def test_the_documented_example_is_the_pinned_shard() -> None:
    assert "assign 5 databases/pg-orders      # -> 3" in (shards.__doc__ or "")
    assert PINNED_SHARDS[("databases", "pg-orders")][2] == 3


def test_shard_script_commands() -> None:
    run = [sys.executable, str(SCRIPT)]
    out = subprocess.run(
        [*run, "assign", "5", "databases/pg-orders"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(shards.shard_of("databases", "pg-orders", 5))
    listing = {
        "items": [
            {"metadata": {"namespace": "a", "name": "x"}},
            {"metadata": {"namespace": "b", "name": "y", "labels": {LABEL: "1"}}},
        ]
    }
    out = subprocess.run(
        [*run, "label", "5"],
        input=yaml.safe_dump(listing),  # JSON is YAML, but the script reads JSON
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode != 0  # not JSON: refused loudly, nothing printed
    import json

    out = subprocess.run(
        [*run, "label", "5"], input=json.dumps(listing), capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines() == [
        f"kubectl label pgc -n a x {LABEL}={shards.shard_of('a', 'x', 5)}"
    ]
    bad = subprocess.run([*run, "assign", "0", "a/b"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2


# ------------------------------------------------------------ the admission policy


def _policy() -> dict[str, Any]:
    return find(rendered("deploy/sharding"), "ValidatingAdmissionPolicy", POLICY)


def _admit(
    operation: str, new: dict[str, str] | None, old: dict[str, str] | None = None
) -> list[str]:
    """Evaluate the policy's rules as the API server would: the reasons it denies with."""
    policy = _policy()
    env = celpy.Environment()

    def obj(labels: dict[str, str] | None) -> Any:
        meta: dict[str, Any] = {"name": "pg-orders", "namespace": "databases"}
        if labels is not None:
            meta["labels"] = labels
        return {"apiVersion": "adg.io/v1alpha1", "kind": "PostgreSQLCluster", "metadata": meta}

    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(obj(new)),
        "oldObject": celpy.json_to_cel(obj(old) if operation == "UPDATE" else None),
        "request": celpy.json_to_cel({"operation": operation}),
    }
    variables = {}
    for variable in policy["spec"]["variables"]:
        program = env.program(env.compile(variable["expression"]))
        variables[variable["name"]] = program.evaluate({**activation})
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in variables.items()}
    )
    denied = []
    for rule in policy["spec"]["validations"]:
        verdict = env.program(env.compile(rule["expression"])).evaluate(activation)
        assert isinstance(verdict, celpy.celtypes.BoolType), (rule["expression"], verdict)
        if not verdict:
            message = env.program(env.compile(rule["messageExpression"])).evaluate(activation)
            assert isinstance(message, str)
            denied.append(f"{rule['reason']}: {message}")
    return denied


def test_policy_matches_postgresqlclusters_and_is_bound() -> None:
    policy = _policy()
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["adg.io"]
    assert rule["resources"] == ["postgresqlclusters"]  # not /status: labels live in metadata
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = find(rendered("deploy/sharding"), "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_create_needs_a_valid_shard_label() -> None:
    assert _admit("CREATE", {LABEL: "0"}) == []
    assert _admit("CREATE", {LABEL: str(K - 1)}) == []
    (missing,) = _admit("CREATE", None)
    assert missing.startswith("Invalid: ") and "shards.py assign 5 databases/pg-orders" in missing
    assert _admit("CREATE", {"other": "x"})[0].startswith("Invalid: ")
    assert _admit("CREATE", {LABEL: str(K)})[0].startswith("Invalid: ")
    assert _admit("CREATE", {LABEL: "01"})[0].startswith("Invalid: ")


def test_the_shard_label_never_changes() -> None:
    assert _admit("UPDATE", {LABEL: "2", "x": "y"}, {LABEL: "2"}) == []
    (moved,) = _admit("UPDATE", {LABEL: "3"}, {LABEL: "2"})
    assert moved.startswith("Forbidden: ") and 'it is "2"' in moved
    # Removing it fails both rules; the API server reports the first (Invalid) only.
    removed = _admit("UPDATE", None, {LABEL: "2"})
    assert [r.split(":")[0] for r in removed] == ["Invalid", "Forbidden"]


def test_clusters_from_before_sharding_can_be_labelled_once_and_still_deleted() -> None:
    # Metacontroller must still be able to update an unlabelled parent (its finalizer).
    assert _admit("UPDATE", None, None) == []
    assert _admit("UPDATE", {LABEL: "4"}, None) == []
    assert _admit("UPDATE", {LABEL: "9"}, None)[0].startswith("Invalid: ")


@pytest.mark.parametrize("case", SHARD_CASES, ids=lambda case: case.id)
def test_case_table(case: Case) -> None:
    """tests/admission_cases.py, the table the real API server decides too
    (tests/test_admission_real.py): the first failed validation is what the server reports."""
    old = case.old["metadata"].get("labels") if case.old else None
    denied = _admit(case.operation, case.new["metadata"].get("labels"), old)
    assert (denied == []) == case.allowed, denied
    if not case.allowed:
        assert denied[0] == f"{case.reason}: {case.messages[0]}"


def _chart_pod_labels(release: str) -> dict[str, str]:
    """The labels the chart (v4.17.2 templates/_helpers.tpl selectorLabels) gives the pods."""
    return {"app.kubernetes.io/name": "metacontroller-helm", "app.kubernetes.io/instance": release}


def _selects(match_labels: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match_labels.items())


def test_each_shard_selects_only_its_own_pods() -> None:
    """The installs share a namespace: anti-affinity and metrics Services name the release."""
    common = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    pods = {k: _chart_pod_labels(shards.release(k)) for k in range(K)}
    pods[-1] = _chart_pod_labels("metacontroller")  # the unsharded install of deploy/
    services = [
        doc
        for doc in yaml.safe_load_all((SHARDING / "metacontroller-metrics.yaml").read_text())
        if doc
    ]
    assert [s["metadata"]["name"] for s in services] == [
        f"metacontroller-shard-{k}-metrics" for k in range(K)
    ]
    for k in range(K):
        values = yaml.safe_load((SHARDING / "values" / f"shard-{k}.yaml").read_text())
        # Helm merges maps and replaces lists: the shard's affinity term replaces the common one.
        (term,) = values["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        match = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert [j for j, labels in pods.items() if _selects(match, labels)] == [k]
        # The chart's Service (selector: name alone) is off; ours selects this release only.
        assert {**common["service"], **values["service"]}["enabled"] is False
        service = services[k]
        assert service["metadata"]["namespace"] == "metacontroller"
        assert [
            j for j, labels in pods.items() if _selects(service["spec"]["selector"], labels)
        ] == [k]
        assert service["spec"]["ports"] == common["service"]["ports"]
    (term,) = common["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    match = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert [j for j, labels in pods.items() if _selects(match, labels)] == [-1]


def test_negative_control_a_name_only_selector_selects_every_shard() -> None:
    """What the chart's metrics Service does: the test above would catch it."""
    name_only = {"app.kubernetes.io/name": "metacontroller-helm"}
    pods = [_chart_pod_labels(shards.release(k)) for k in range(K)]
    assert sum(_selects(name_only, labels) for labels in pods) == K


def _mib(quantity: str) -> int:
    """A Kubernetes memory quantity in Mi or Gi, in MiB."""
    units = {"Mi": 1, "Gi": 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_memory_is_sized_for_the_whole_cluster_each_install_caches() -> None:
    """Every install caches every cluster's objects (cluster-wide informers), so the
    shipped install's memory is the calibrated line at 1,000 clusters and a shard's at
    the ~1,000 K clusters of K shards; twice that is the limit (docs/scale.md)."""
    common = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))["resources"]
    assert _mib(common["requests"]["memory"]) == shards.memory_request_mib(1000)
    assert _mib(common["limits"]["memory"]) == 2 * shards.memory_request_mib(1000)
    # The measured RSS at 1,000: 274-352 MiB polled within the request, 520 MiB under
    # Patroni's Kubernetes-DCS churn within the limit.
    assert _mib(common["requests"]["memory"]) >= 352
    assert _mib(common["limits"]["memory"]) >= 520
    assert "cpu" not in common["limits"]
    for k in range(K):
        values = yaml.safe_load((SHARDING / "values" / f"shard-{k}.yaml").read_text())
        request = _mib(values["resources"]["requests"]["memory"])
        assert request == shards.memory_request_mib(1000 * K) > _mib(common["requests"]["memory"])
        assert _mib(values["resources"]["limits"]["memory"]) == 2 * request
        assert values["resources"]["requests"]["cpu"] == common["requests"]["cpu"]
    assert shards.memory_request_mib(200) == 256  # 111 MiB measured at 200


def test_memory_request_rounds_the_line_up_to_256_mib() -> None:
    assert shards.memory_request_mib(0) == 256
    assert shards.memory_request_mib(1000) == 512  # 51 + 300 = 351 MiB
    assert shards.memory_request_mib(5000) == 1792  # 51 + 1,500 = 1,551 MiB
