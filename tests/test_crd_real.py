"""The PostgreSQLCluster CRD on the real API server (issue 24, item 2).

``metacontroller/crd.yaml`` is applied to the test control plane's kube-apiserver, and:

* every spec the docs call invalid that a CRD can refuse (OpenAPI bounds, enums, patterns,
  ``x-kubernetes-validations`` CEL for the cross-field rules) is refused at create time with a
  message naming the field, and the hook's own loader (``hooks.loaders.schemas.load_spec``)
  refuses the same spec naming that field or its parent: one table, both ways;
* every PostgreSQLCluster in the repository (the examples, the full CRs in the docs, the parents
  of the recorded Metacontroller requests) is accepted;
* the server's defaults are the loader's: the defaulted spec the server stores loads to the same
  value as the spec as written, and every default the loader fills in is a CRD default, except
  the listed ones a CRD cannot hold;
* the status subresource keeps status across spec updates, and a spec write cannot set status;
* ``kubectl get pgc`` (the pinned kubectl) shows the README's columns from a status written
  through the subresource.

The offline checks (tests/test_manifests_*.py, tests/test_crd_spec_fields.py) stay as the fast first
line; where they and this server disagree, the server is right.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from marshmallow import Schema, fields, missing

from hooks.loaders.schemas import ClusterSpecSchema, load_spec
from testbed.kubernetes import ControlPlane
from testbed.kubernetes.rest import KubeApiError, KubeRest
from tests.manifest_helpers import CRD_FILE, EXAMPLE_FULL, EXAMPLE_SEED, FIXTURES, REPO, load_one

API = "/apis/adg.io/v1alpha1"
CRD_NAME = "postgresqlclusters.adg.io"
#: The field manager of every test apply (tests/test_manifests_real.py uses the same).
MANAGER = "pgfh-tests"


def apply_crd(control_plane: ControlPlane) -> None:
    """Server-side apply the CRD file and wait until the server serves the kind."""
    control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}",
        "-f", str(CRD_FILE),
    )  # fmt: skip
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=30s")


@pytest.fixture(scope="module")
def pgc_crd(control_plane: ControlPlane) -> None:
    apply_crd(control_plane)


def pgc_path(namespace: str, name: str | None = None, sub: str = "") -> str:
    path = f"{API}/namespaces/{namespace}/postgresqlclusters"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def cr(spec: dict[str, Any], name: str = "pg-orders") -> dict[str, Any]:
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name},
        "spec": spec,
    }


def seed_spec() -> dict[str, Any]:
    return copy.deepcopy(load_one(EXAMPLE_SEED)["spec"])


# ------------------------------------------------------------------- invalid specs

Edit = Callable[[dict[str, Any]], None]


def setting(path: str, value: Any) -> Edit:
    """An edit that sets ``spec.<path>`` (dots; ``[n]`` for a list index) to ``value``."""

    def edit(spec: dict[str, Any]) -> None:
        keys: list[str | int] = [
            int(k) if k.isdigit() else k for k in re.split(r"\.|\[(\d+)\]", path) if k
        ]
        node: Any = spec
        for key, after in itertools.pairwise(keys):
            if isinstance(key, int):
                node = node[key]
            else:
                node = node.setdefault(key, [] if isinstance(after, int) else {})
        node[keys[-1]] = copy.deepcopy(value)  # rows must not share (and edit) one value

    return edit


def removing(key: str) -> Edit:
    return lambda spec: spec.pop(key)


def both(*edits: Edit) -> Edit:
    def edit(spec: dict[str, Any]) -> None:
        for one in edits:
            one(spec)

    return edit


PORT = {"name": "postgresql", "port": 5432}
HTTPS = setting("patroni.scheme", "https")
REPLICAS = setting("replicaService", {"name": "pg-orders-replicas"})
BACKUP = setting(
    "backup",
    {"schedule": "0 3 * * *", "image": "postgres:18", "pvcName": "backups", "secretName": "repl"},
)
ROLE_LABEL = setting("switchover.roleLabel", {"key": "spilo-role"})

#: (id, edit of the seed example's spec, the field the server must name). Each row is a rule
#: that docs/deploy.md's CR reference or docs/troubleshooting.md states; the hook's loader
#: refuses each too, naming that field or one above it.
INVALID: list[tuple[str, Edit, str]] = [
    # spec.primarySelector: required, at least one label, labels valid
    ("no-selector", removing("primarySelector"), "spec.primarySelector"),
    ("empty-selector", setting("primarySelector", {}), "spec.primarySelector"),
    ("selector-bad-key", setting("primarySelector", {"bad key": "x"}), "spec.primarySelector"),
    ("selector-long-key", setting("primarySelector", {"a" * 64: "x"}), "spec.primarySelector"),
    ("selector-bad-value", setting("primarySelector.application", "pat roni"),
     "spec.primarySelector.application"),
    ("selector-long-value", setting("primarySelector.application", "a" * 64),
     "spec.primarySelector.application"),
    # spec.serviceRef.name: required, DNS-1035 label, not Patroni's own objects
    ("no-serviceRef", removing("serviceRef"), "spec.serviceRef"),
    ("no-service-name", setting("serviceRef", {}), "spec.serviceRef.name"),
    ("service-name-upper", setting("serviceRef.name", "Pg_Orders"), "spec.serviceRef.name"),
    ("service-name-64", setting("serviceRef.name", "p" * 64), "spec.serviceRef.name"),
    ("service-name-digit", setting("serviceRef.name", "1pg"), "spec.serviceRef.name"),
    # Python's "$" matched before a trailing newline: the hook took these, the server did not.
    ("service-name-newline", setting("serviceRef.name", "pg-orders-primary\n"),
     "spec.serviceRef.name"),
    ("selector-value-newline", setting("primarySelector.application", "patroni\n"),
     "spec.primarySelector.application"),
    ("selector-key-newline", setting("primarySelector", {"application\n": "patroni"}),
     "spec.primarySelector"),
    ("service-is-scope", setting("serviceRef.name", "pg-orders"), "spec.serviceRef.name"),
    ("service-is-leader", setting("serviceRef.name", "pg-orders-leader"), "spec.serviceRef.name"),
    ("service-is-config", setting("serviceRef.name", "pg-orders-config"), "spec.serviceRef.name"),
    ("service-is-sync", setting("serviceRef.name", "pg-orders-sync"), "spec.serviceRef.name"),
    ("service-is-failover", setting("serviceRef.name", "pg-orders-failover"),
     "spec.serviceRef.name"),
    # spec.healthCheckPath: only Patroni's leader paths
    ("path-replica", setting("healthCheckPath", "/replica"), "spec.healthCheckPath"),
    ("path-typo", setting("healthCheckPath", "/primry"), "spec.healthCheckPath"),
    # spec.patroni
    ("patroni-port-0", setting("patroni.port", 0), "spec.patroni.port"),
    ("patroni-port-70000", setting("patroni.port", 70000), "spec.patroni.port"),
    ("patroni-port-string", setting("patroni.port", "8008"), "spec.patroni.port"),
    ("patroni-scheme", setting("patroni.scheme", "ftp"), "spec.patroni.scheme"),
    ("tls-without-https", setting("patroni.tls.serverName", "pg.example"),
     "spec.patroni.tls.serverName"),
    ("tls-ip-address", both(HTTPS, setting("patroni.tls.serverName", "10.0.0.1")),
     "spec.patroni.tls.serverName"),
    ("tls-upper-case", both(HTTPS, setting("patroni.tls.serverName", "Pg.Example")),
     "spec.patroni.tls.serverName"),
    ("tls-empty", both(HTTPS, setting("patroni.tls.serverName", "")),
     "spec.patroni.tls.serverName"),
    ("connect-fast", setting("patroni.connectTimeoutSeconds", 0.01),
     "spec.patroni.connectTimeoutSeconds"),
    ("connect-slow", setting("patroni.connectTimeoutSeconds", 6),
     "spec.patroni.connectTimeoutSeconds"),
    ("read-slow", setting("patroni.readTimeoutSeconds", 10), "spec.patroni.readTimeoutSeconds"),
    ("read-string", setting("patroni.readTimeoutSeconds", "1"), "spec.patroni.readTimeoutSeconds"),
    ("name-guard-number", setting("patroni.memberNameMustMatchPod", 1),
     "spec.patroni.memberNameMustMatchPod"),
    ("bootstrap-labels-bad-key", setting("patroni.bootstrapLabels", {"bad key": "x"}),
     "spec.patroni.bootstrapLabels"),
    ("bootstrap-labels-bad-value", setting("patroni.bootstrapLabels", {"a": "b c"}),
     "spec.patroni.bootstrapLabels.a"),
    ("bootstrap-labels-long-value", setting("patroni.bootstrapLabels", {"a": "b" * 64}),
     "spec.patroni.bootstrapLabels.a"),
    # spec.service
    ("service-external-name", setting("service.type", "ExternalName"), "spec.service.type"),
    ("no-ports", setting("service.ports", []), "spec.service.ports"),
    ("17-ports", setting("service.ports", [{"name": f"p{i}", "port": 1000 + i} for i in range(17)]),
     "spec.service.ports"),
    ("duplicate-port", setting("service.ports", [PORT, {"name": "other", "port": 5432}]),
     "spec.service.ports[1]"),
    ("duplicate-port-name", setting("service.ports", [PORT, {"name": "postgresql", "port": 1}]),
     "spec.service.ports"),
    ("port-name-16", setting("service.ports", [{"name": "p" * 16, "port": 5432}]),
     "spec.service.ports[0].name"),
    ("port-name-upper", setting("service.ports", [{"name": "PG", "port": 5432}]),
     "spec.service.ports[0].name"),
    ("port-no-name", setting("service.ports", [{"port": 5432}]), "spec.service.ports[0].name"),
    ("port-70000", setting("service.ports", [{"name": "pg", "port": 70000}]),
     "spec.service.ports[0].port"),
    ("target-0", setting("service.ports", [{**PORT, "targetPort": 0}]),
     "spec.service.ports[0].targetPort"),
    ("target-70000", setting("service.ports", [{**PORT, "targetPort": 70000}]),
     "spec.service.ports[0].targetPort"),
    ("target-bad-name", setting("service.ports", [{**PORT, "targetPort": "Bad_Name"}]),
     "spec.service.ports[0].targetPort"),
    ("target-no-letter", setting("service.ports", [{**PORT, "targetPort": "5432"}]),
     "spec.service.ports[0].targetPort"),
    ("target-double-dash", setting("service.ports", [{**PORT, "targetPort": "pg--a"}]),
     "spec.service.ports[0].targetPort"),
    ("target-16", setting("service.ports", [{**PORT, "targetPort": "p" * 16}]),
     "spec.service.ports[0].targetPort"),
    ("protocol-udp", setting("service.ports", [{**PORT, "protocol": "UDP"}]),
     "spec.service.ports[0].protocol"),
    ("label-bad-key", setting("service.labels", {"-team": "a"}), "spec.service.labels"),
    ("label-bad-value", setting("service.labels", {"team": "a b"}), "spec.service.labels.team"),
    ("label-number", setting("service.labels", {"team": 1}), "spec.service.labels.team"),
    ("annotation-bad-key", setting("service.annotations", {"a/b/c": "x"}),
     "spec.service.annotations"),
    ("annotation-long-prefix", setting("service.annotations", {"a" * 254 + "/b": "x"}),
     "spec.service.annotations"),
    # spec.replicaService
    ("replica-no-name", setting("replicaService", {}), "spec.replicaService.name"),
    ("replica-is-primary", setting("replicaService", {"name": "pg-orders-primary"}),
     "spec.replicaService.name"),
    ("replica-is-config", setting("replicaService", {"name": "pg-orders-config"}),
     "spec.replicaService.name"),
    ("replica-is-scope", setting("replicaService", {"name": "pg-orders"}),
     "spec.replicaService.name"),
    ("replica-name-upper", setting("replicaService", {"name": "Pg-RO"}),
     "spec.replicaService.name"),
    ("lag-negative", both(REPLICAS, setting("replicaService.maxLagBytes", -1)),
     "spec.replicaService.maxLagBytes"),
    ("lag-string", both(REPLICAS, setting("replicaService.maxLagBytes", "16MB")),
     "spec.replicaService.maxLagBytes"),
    ("lag-fraction", both(REPLICAS, setting("replicaService.maxLagBytes", 1.5)),
     "spec.replicaService.maxLagBytes"),
    ("when-no-replica", both(REPLICAS, setting("replicaService.whenNoReplica", "Sometimes")),
     "spec.replicaService.whenNoReplica"),
    ("consistency", both(REPLICAS, setting("replicaService.consistency", "sync")),
     "spec.replicaService.consistency"),
    ("traffic-distribution",
     both(REPLICAS, setting("replicaService.trafficDistribution", "PreferSameNode")),
     "spec.replicaService.trafficDistribution"),
    ("replica-type", both(REPLICAS, setting("replicaService.type", "ExternalName")),
     "spec.replicaService.type"),
    ("paused-string", both(REPLICAS, setting("replicaService.includePausedReplicas", "yes")),
     "spec.replicaService.includePausedReplicas"),
    ("replica-label-value", both(REPLICAS, setting("replicaService.labels", {"a": "b c"})),
     "spec.replicaService.labels.a"),
    ("replica-annotation-key", both(REPLICAS, setting("replicaService.annotations", {"": "x"})),
     "spec.replicaService.annotations"),
    # spec.backup
    ("backup-no-schedule", both(BACKUP, lambda s: s["backup"].pop("schedule")),
     "spec.backup.schedule"),
    ("backup-no-image", both(BACKUP, lambda s: s["backup"].pop("image")), "spec.backup.image"),
    ("backup-no-pvc", both(BACKUP, lambda s: s["backup"].pop("pvcName")), "spec.backup.pvcName"),
    ("backup-no-secret", both(BACKUP, lambda s: s["backup"].pop("secretName")),
     "spec.backup.secretName"),
    ("schedule-4-fields", both(BACKUP, setting("backup.schedule", "0 3 * *")),
     "spec.backup.schedule"),
    ("schedule-tz", both(BACKUP, setting("backup.schedule", "TZ=UTC 0 3 * * *")),
     "spec.backup.schedule"),
    ("schedule-every", both(BACKUP, setting("backup.schedule", "@every 1h")),
     "spec.backup.schedule"),
    ("image-space", both(BACKUP, setting("backup.image", "postgres 18")), "spec.backup.image"),
    ("image-newline", both(BACKUP, setting("backup.image", "postgres:18\n")), "spec.backup.image"),
    ("schedule-newline", both(BACKUP, setting("backup.schedule", "@daily\n")),
     "spec.backup.schedule"),
    ("pvc-newline", both(BACKUP, setting("backup.pvcName", "backups\n")), "spec.backup.pvcName"),
    ("quantity-newline", both(BACKUP, setting("backup.resources.limits", {"cpu": "1\n"})),
     "spec.backup.resources.limits.cpu"),
    ("port-name-newline", setting("service.ports", [{"name": "pg\n", "port": 5432}]),
     "spec.service.ports[0].name"),
    ("pvc-upper", both(BACKUP, setting("backup.pvcName", "Backups")), "spec.backup.pvcName"),
    ("secret-underscore", both(BACKUP, setting("backup.secretName", "pg_repl")),
     "spec.backup.secretName"),
    ("keep-0", both(BACKUP, setting("backup.keep", 0)), "spec.backup.keep"),
    ("keep-101", both(BACKUP, setting("backup.keep", 101)), "spec.backup.keep"),
    ("run-as-root", both(BACKUP, setting("backup.runAsUser", 0)), "spec.backup.runAsUser"),
    ("deadline-59", both(BACKUP, setting("backup.activeDeadlineSeconds", 59)),
     "spec.backup.activeDeadlineSeconds"),
    ("deadline-week-plus", both(BACKUP, setting("backup.activeDeadlineSeconds", 604801)),
     "spec.backup.activeDeadlineSeconds"),
    ("quantity-negative", both(BACKUP, setting("backup.resources.limits", {"cpu": "-1"})),
     "spec.backup.resources.limits.cpu"),
    # A CEL rule on a map's value names it [key], an OpenAPI check .key.
    ("quantity-negative-int", both(BACKUP, setting("backup.resources.limits", {"cpu": -1})),
     "spec.backup.resources.limits[cpu]"),
    ("quantity-word", both(BACKUP, setting("backup.resources.requests", {"memory": "lots"})),
     "spec.backup.resources.requests.memory"),
    ("quantity-float", both(BACKUP, setting("backup.resources.limits", {"cpu": 0.5})),
     "spec.backup.resources.limits.cpu"),
    ("resource-bad-name", both(BACKUP, setting("backup.resources.requests", {"c p u": "1"})),
     "spec.backup.resources.requests"),
    # spec.switchover
    ("poll-below-degraded", setting("switchover.pollSeconds", 0.2), "spec.switchover.pollSeconds"),
    ("poll-301", setting("switchover.pollSeconds", 301), "spec.switchover.pollSeconds"),
    ("poll-string", setting("switchover.pollSeconds", "1"), "spec.switchover.pollSeconds"),
    ("event-driven-fast", setting("switchover.eventDrivenResyncSeconds", 0.1),
     "spec.switchover.eventDrivenResyncSeconds"),
    ("role-label-no-key", setting("switchover.roleLabel", {}), "spec.switchover.roleLabel.key"),
    ("role-label-selects", setting("switchover.roleLabel", {"key": "cluster-name"}),
     "spec.switchover.roleLabel.key"),
    ("role-label-bad-key", setting("switchover.roleLabel", {"key": "spilo role"}),
     "spec.switchover.roleLabel.key"),
    ("role-label-long-name", setting("switchover.roleLabel", {"key": "x/" + "a" * 64}),
     "spec.switchover.roleLabel.key"),
    ("role-values-equal", both(ROLE_LABEL, setting("switchover.roleLabel.replicaValue", "primary")),
     "spec.switchover.roleLabel.replicaValue"),
    ("role-value-defaults-equal",
     both(ROLE_LABEL, setting("switchover.roleLabel.leaderValue", "replica")),
     "spec.switchover.roleLabel.replicaValue"),
    ("role-value-empty", both(ROLE_LABEL, setting("switchover.roleLabel.leaderValue", "")),
     "spec.switchover.roleLabel.leaderValue"),
]  # fmt: skip


def invalid_spec(edit: Edit) -> dict[str, Any]:
    spec = seed_spec()
    edit(spec)
    return spec


def _dotted(field: str) -> str:
    """``spec.a[0].b`` (``spec.m[key]``) as the hook's loader spells it: ``spec.a.0.b``."""
    return re.sub(r"\[([^\]]+)\]", r".\1", field)


def _is_within(hook_field: str, server_field: str) -> bool:
    """Whether the hook's field is the server's, a parent of it, or a part of it (a map's
    value: the hook says ``spec.service.labels.team.value``, the server ``...labels.team``)."""
    hook, server = _dotted(hook_field).split("."), _dotted(server_field).split(".")
    shorter = min(len(hook), len(server))
    return hook[:shorter] == server[:shorter]


@pytest.mark.parametrize(("what", "edit", "field"), INVALID, ids=[row[0] for row in INVALID])
def test_the_server_and_the_hook_refuse_each_invalid_spec(
    what: str, edit: Edit, field: str, pgc_crd: None, kube_rest: KubeRest, kube_namespace: str
) -> None:
    spec = invalid_spec(edit)
    with pytest.raises(KubeApiError) as refused:
        kube_rest.create(pgc_path(kube_namespace), cr(spec))
    error = refused.value
    assert error.status == 422, error
    causes = [c.get("field") for c in error.body.get("details", {}).get("causes", [])]
    assert field in causes, (causes, error.message)
    assert f"{field}:" in error.message or f"{field} " in error.message, error.message
    loaded, problems = load_spec(spec)
    assert loaded is None, f"the hook accepted {what}"
    assert any(_is_within(p.field, field) for p in problems), (field, problems)


def test_the_table_covers_each_rule_of_the_crd() -> None:
    """Every CEL rule of the CRD has a row that breaks it (a rule no row breaks is untested)."""
    crd = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = sum(len(node.get("x-kubernetes-validations", [])) for node in _nodes(schema))
    # 4 on spec, 6 string maps + 2 resource maps (keys), 2 quantities, tls, serverName, ports,
    # targetPort, roleLabel, roleLabel.key
    assert rules == 20
    cel_fields = {
        "spec.serviceRef.name",
        "spec.replicaService.name",
        "spec.switchover.roleLabel.key",
        "spec.primarySelector",
        "spec.service.labels",
        "spec.service.annotations",
        "spec.replicaService.annotations",
        "spec.backup.resources.requests",
        "spec.backup.resources.limits[cpu]",
        "spec.patroni.tls.serverName",
        "spec.patroni.bootstrapLabels",
        "spec.service.ports",
        "spec.service.ports[0].targetPort",
        "spec.switchover.roleLabel.replicaValue",
    }
    assert cel_fields <= {row[2] for row in INVALID}


def _nodes(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield schema
    for child in schema.get("properties", {}).values():
        yield from _nodes(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _nodes(schema[key])


# ------------------------------------------------------------------ valid specs


def _doc_crs() -> list[tuple[str, dict[str, Any]]]:
    """The full PostgreSQLClusters in the README and docs/ (yaml blocks with kind and spec)."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for number, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", text, re.S)):
            try:
                docs = list(yaml.safe_load_all(block))
            except yaml.YAMLError:
                continue
            for doc in docs:
                if (
                    isinstance(doc, dict)
                    and doc.get("kind") == "PostgreSQLCluster"
                    and {"apiVersion", "spec"} <= doc.keys()
                ):
                    found.append((f"{path.name}#{number}", doc))
    return found


def _fixture_parents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(FIXTURES.glob("*.json")):
        parent = json.loads(path.read_text(encoding="utf-8")).get("parent")
        if isinstance(parent, dict) and parent.get("kind") == "PostgreSQLCluster":
            found.append((path.name, parent))
    return found


EXAMPLES: list[tuple[str, dict[str, Any]]] = (
    [(path.name, load_one(path)) for path in (EXAMPLE_SEED, EXAMPLE_FULL)]
    + _doc_crs()
    + _fixture_parents()
)


def test_the_examples_are_found() -> None:
    names = [name for name, _ in EXAMPLES]
    assert len(names) >= 2 + 1 + 4, names  # both examples, a docs CR, the recorded parents


def _as_new(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as a user would create it: no server-set metadata, no status."""
    meta = obj.get("metadata", {})
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {
            "name": meta["name"],
            **{k: meta[k] for k in ("labels", "annotations") if k in meta},
        },
        "spec": obj["spec"],
    }


@pytest.mark.parametrize(("what", "obj"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_every_example_in_the_repo_is_accepted(
    what: str, obj: dict[str, Any], pgc_crd: None, kube_rest: KubeRest, kube_namespace: str
) -> None:
    created = kube_rest.create(pgc_path(kube_namespace), _as_new(obj))
    stored, problems = load_spec(created["spec"])
    assert problems == ()
    assert stored == load_spec(obj["spec"])[0]


# ---------------------------------------------------------------------- defaults


def _loader_defaults(schema: Schema, prefix: str = "spec") -> Iterator[str]:
    """Every field path the loader fills in when absent (``[]``: in each list item)."""
    for name, field in schema.fields.items():
        path = f"{prefix}.{name}"
        if field.load_default is not missing:
            yield path
        if isinstance(field, fields.Nested) and isinstance(field.schema, Schema):
            yield from _loader_defaults(field.schema, path)
        if isinstance(field, fields.List) and isinstance(field.inner, fields.Nested):
            yield from _loader_defaults(field.inner.schema, f"{path}[]")


#: Loader defaults a CRD cannot (or should not) hold, and why.
NOT_CRD_DEFAULTS = {
    # Absent means "not asked for": a CRD default would switch the feature on.
    "spec.replicaService": "an optional feature, off when absent",
    "spec.backup": "an optional feature, off when absent",
    "spec.switchover": "absent: the operator's settings",
    "spec.switchover.pollSeconds": "absent: the operator's PGFH_RESYNC_HEALTHY_SECONDS",
    "spec.switchover.roleLabel": "absent: Patroni's own role label",
    "spec.patroni.tls": "absent: verify against the pod IP",
    "spec.patroni.tls.serverName": "absent: verify against the pod IP (a CRD cannot default null)",
    "spec.replicaService.trafficDistribution": "absent: no zone preference (a CRD cannot "
    "default null)",
    # Derived from another field: OpenAPI defaults are constants.
    "spec.service.ports[].targetPort": "the port's own number",
    # Empty maps: absent and {} load the same, a default would write {} into every object.
    "spec.service.labels": "empty",
    "spec.service.annotations": "empty",
    "spec.replicaService.labels": "empty",
    "spec.replicaService.annotations": "empty",
    "spec.patroni.bootstrapLabels": "empty (no bootstrap labels: Patroni's default)",
    "spec.backup.resources": "empty",
    "spec.backup.resources.requests": "empty",
    "spec.backup.resources.limits": "empty",
}

#: Every optional section present with only its required fields, so each nested default shows.
SECTIONS = {
    "patroni": {"scheme": "https", "tls": {}},
    "service": {"ports": [{"name": "postgresql", "port": 5432}]},
    "replicaService": {"name": "pg-orders-replicas"},
    "backup": {"schedule": "@daily", "image": "postgres:18", "pvcName": "b", "secretName": "s"},
    "switchover": {"roleLabel": {"key": "spilo-role"}},
}


def _present(value: Any, path: list[str]) -> bool:
    if not path:
        return True
    key, rest = path[0], path[1:]
    if key.endswith("[]"):
        items = value.get(key[:-2]) if isinstance(value, dict) else None
        return bool(items) and all(_present(item, rest) for item in items)
    return isinstance(value, dict) and key in value and _present(value[key], rest)


def test_the_servers_defaults_are_the_loaders(
    pgc_crd: None, kube_rest: KubeRest, kube_namespace: str
) -> None:
    minimal = seed_spec()
    minimal.pop("healthCheckPath")  # the seed example writes the default out
    sections = {**seed_spec(), **copy.deepcopy(SECTIONS)}
    for name, spec in (("minimal", minimal), ("sections", sections)):
        stored = kube_rest.create(pgc_path(kube_namespace), cr(spec, name=name))["spec"]
        # One way: what the server stores loads to what the hook makes of the spec as written.
        assert load_spec(stored) == load_spec(spec), name
        assert load_spec(spec)[0] is not None
        if name == "sections":
            # The other way: every default of the loader is written by the server.
            paths = set(_loader_defaults(ClusterSpecSchema()))
            assert set(NOT_CRD_DEFAULTS) <= paths, set(NOT_CRD_DEFAULTS) - paths
            missing_defaults = sorted(
                path
                for path in paths - set(NOT_CRD_DEFAULTS)
                if not _present({"spec": stored}, path.split("."))
            )
            assert missing_defaults == []
            # ...and the listed exceptions really are not CRD defaults.
            assert "targetPort" not in stored["service"]["ports"][0]
            assert "serverName" not in stored["patroni"]["tls"]
            assert "pollSeconds" not in stored["switchover"]


# ------------------------------------------------------------ status subresource

STATUS = {
    "observedGeneration": 1,
    "primary": "pg-orders-1",
    "service": "pg-orders-primary",
    "membersAnswered": "3/3",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "LeaderFound",
            "message": "pg-orders-1 holds the leader lock",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
            "observedGeneration": 1,
        }
    ],
}


def _create_with_status(kube_rest: KubeRest, namespace: str, status: dict[str, Any]) -> None:
    kube_rest.create(pgc_path(namespace), cr(seed_spec()))
    written = kube_rest.merge_patch(pgc_path(namespace, "pg-orders", "status"), {"status": status})
    assert written["status"] == status


def test_the_status_subresource_keeps_status_across_spec_updates(
    pgc_crd: None, kube_rest: KubeRest, kube_namespace: str
) -> None:
    _create_with_status(kube_rest, kube_namespace, STATUS)
    path = pgc_path(kube_namespace, "pg-orders")
    # A spec update (merge patch and a full PUT) leaves the status alone...
    patched = kube_rest.merge_patch(path, {"spec": {"healthCheckPath": "/leader"}})
    assert patched["metadata"]["generation"] == 2
    assert patched["status"] == STATUS
    current = kube_rest.get(path)
    current["spec"]["patroni"]["port"] = 8009
    replaced = kube_rest.replace(path, current)
    assert replaced["metadata"]["generation"] == 3
    assert replaced["status"] == STATUS
    # ...and a write of the main resource cannot change the status.
    kube_rest.merge_patch(path, {"status": {"primary": "someone-else"}})
    sneaked = kube_rest.get(path)
    sneaked["status"] = {"primary": "someone-else"}
    kube_rest.replace(path, sneaked)
    assert kube_rest.get(path)["status"] == STATUS
    # A status write cannot change the spec either.
    kube_rest.merge_patch(
        pgc_path(kube_namespace, "pg-orders", "status"), {"spec": {"healthCheckPath": "/primary"}}
    )
    final = kube_rest.get(path)
    assert final["spec"]["healthCheckPath"] == "/leader"
    assert final["metadata"]["generation"] == 3


# ------------------------------------------------------------------ printer columns


def _cells(lines: list[str]) -> list[list[str]]:
    """A kubectl table cut at the header's column starts (an empty cell is ``""``)."""
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    ends = [*starts[1:], None]
    return [[line[a:b].strip() for a, b in zip(starts, ends, strict=True)] for line in lines]


def _readme_example() -> tuple[list[str], list[str]]:
    """The header and row of the README's ``kubectl get pgc`` example."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\$ kubectl get pgc -n databases\n(.*?\n.*?)\n```", text)
    assert block, "the README lost its kubectl get pgc example"
    header, row = _cells(block.group(1).splitlines())
    return header, row


def _table(control_plane: ControlPlane, namespace: str, *extra: str) -> list[list[str]]:
    shown = control_plane.kubectl("get", "pgc", "-n", namespace, *extra)
    assert shown.stderr == ""
    return _cells(shown.stdout.splitlines())


def test_kubectl_get_pgc_shows_the_readmes_columns(
    pgc_crd: None, control_plane: ControlPlane, kube_rest: KubeRest, kube_namespace: str
) -> None:
    header, row = _readme_example()
    _create_with_status(kube_rest, kube_namespace, STATUS)
    shown_header, shown_row = _table(control_plane, kube_namespace)
    assert shown_header == header
    # Every column but AGE as in the README (the README's cluster is three days old).
    assert shown_row[:-1] == row[:-1]
    wide_header, wide_row = _table(control_plane, kube_namespace, "-o", "wide")
    # -o wide puts SERVICE and LAST BACKUP before AGE (the CRD's order of the columns).
    assert wide_header == [*header[:-1], "SERVICE", "LAST BACKUP", "AGE"]
    assert wide_row[len(header) - 1 : -1] == ["pg-orders-primary", ""]


def test_kubectl_get_pgc_shows_replicas_and_the_last_backup(
    pgc_crd: None, control_plane: ControlPlane, kube_rest: KubeRest, kube_namespace: str
) -> None:
    """docs/deploy.md: REPLICAS lists the read-only Service's Pods as a JSON list."""
    status = {
        **STATUS,
        "replicaEndpoints": ["pg-orders-1", "pg-orders-2"],
        "backup": {"lastSuccessful": {"job": "j", "completionTime": "2025-01-01T03:00:00Z"}},
    }
    _create_with_status(kube_rest, kube_namespace, status)
    text = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    documented = re.search(r"`REPLICAS` lists the read-only Service's Pods\n\(`(.*?)`\)", text)
    assert documented, "docs/deploy.md lost its REPLICAS example"
    header, row = _table(control_plane, kube_namespace, "-o", "wide")
    shown = dict(zip(header, row, strict=True))
    assert shown["REPLICAS"] == documented.group(1)
    assert shown["LAST BACKUP"] not in ("", "<none>")


def test_the_crd_file_is_what_the_server_stores(
    pgc_crd: None, kube_rest: KubeRest, tmp_path: Path
) -> None:
    """The server keeps every rule of the file (none dropped as unknown)."""
    stored = kube_rest.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    wanted = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
    got_schema = stored["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    want_schema = wanted["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert got_schema == want_schema
    assert (
        stored["spec"]["versions"][0]["additionalPrinterColumns"]
        == wanted["spec"]["versions"][0]["additionalPrinterColumns"]
    )
