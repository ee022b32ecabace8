"""The chart's values: their defaults (what deploy/'s base renders), values.yaml that documents
each, and values.schema.json that helm checks them against before rendering."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from ops.chart.variants import BASE, FIELDS, GENERATED, Field, Obj, field_holders, render


def hook_default(objects: Sequence[Obj], field: Field) -> Any:
    """The value deploy/'s base renders at ``field`` (the chart's default for it)."""
    values = [
        holder.get(field.path[-1])
        for obj in objects
        if obj["kind"] == field.kind and obj["metadata"]["name"] == field.name
        for holder in field_holders(obj, field.path)
    ]
    if any(value != values[0] for value in values):
        raise SystemExit(f"{field.kind}/{field.name}: {'.'.join(field.path)} differs by item")
    return values[0] if values else None


def defaults(kubectl: str) -> dict[str, Any]:
    """The values whose defaults deploy/'s base decides."""
    base = render(BASE.target, kubectl)
    found = {f.path[-1]: hook_default(base, f) for f in FIELDS if f.how in ("scalar", "block")}
    repository, _, tag = str(found["image"]).rpartition(":")
    return {
        "repository": repository,
        "tag": tag,
        "pullPolicy": found["imagePullPolicy"],
        "resources": found["resources"],
        "minReplicas": found["minReplicas"],
        "maxReplicas": found["maxReplicas"],
    }


def values_yaml(found: Mapping[str, Any]) -> str:
    """values.yaml: every value, its default (from deploy/) and what it does."""
    resources = yaml.safe_dump({"resources": found["resources"]}, sort_keys=False).rstrip()
    return f"""# {GENERATED}
# The defaults render exactly what `kubectl kustomize deploy/` renders (tests/test_chart.py).
# values.schema.json checks every value: a wrong type, an unknown key or two overlays at once
# fail `helm install`/`helm template` with a message that names the value.

# The hook's image (the Deployment's container "hook").
image:
  repository: {found["repository"]}
  tag: {json.dumps(found["tag"])}
  pullPolicy: {found["pullPolicy"]}

# The hook container's requests and limits (docs/deploy.md, "Sizing").
{resources}

# The HorizontalPodAutoscaler's bounds. Keep minReplicas >= 2: the PodDisruptionBudget allows
# one hook Pod down at a time, and Metacontroller's calls need one ready Pod.
autoscaling:
  minReplicas: {found["minReplicas"]}
  maxReplicas: {found["maxReplicas"]}

# Scheduling of the hook Pods (none in deploy/; set for dedicated nodes).
nodeSelector: {{}}
tolerations: []
priorityClassName: ""

# Create the Namespace pg-failover-hook (with its Pod Security labels) as deploy/ does. Every
# namespaced object of the chart lives in pg-failover-hook whatever `helm -n` says (the
# CompositeController's hook URLs name it); set false if the namespace is managed elsewhere.
createNamespace: true

# Keep the PostgreSQLCluster CRD on `helm uninstall` (helm.sh/resource-policy: keep). Deleting
# the CRD deletes every PostgreSQLCluster and, through owner references, their Services.
crd:
  keep: true

# deploy/large-install/: one install of more than about 200 PostgreSQLClusters. true leaves
# resyncPeriodSeconds out of the CompositeController: its tick would queue every cluster at
# once ahead of every Pod event; recovery after every hook pod was down is then the queue's
# (about N / 10 s) or the runbook's annotation (docs/scale.md, "What to set"). Goes with any
# choice below; the shards of sharding.enabled have no period either way.
largeInstall: false

# At most ONE of the three below, as deploy/ offers one overlay at a time.

# deploy/events: the hook records Kubernetes Events on PostgreSQLClusters (RBAC for
# events.k8s.io create, a ServiceAccount token, egress to the API server and DNS).
events:
  enabled: false

# deploy/mtls ("on") and deploy/mtls-transition ("transition"): HTTPS with client
# certificates between Metacontroller and the hook. "off" is the base (HTTP + token). The three
# Secrets of deploy/mtls/kustomization.yaml must exist first; move a running install
# off -> transition -> (patch the CompositeController) -> on, as docs/upgrade.md describes.
mtls:
  mode: "off"

# deploy/sharding: 5 CompositeControllers pg-failover-hook-0..4 instead of one, and the
# admission policy that pins each PostgreSQLCluster to its shard (docs/scale.md, "Sharding").
sharding:
  enabled: false
"""


def schema() -> dict[str, Any]:
    """values.schema.json (JSON Schema draft 2020-12, which helm checks before rendering)."""
    quantity = {"type": ["string", "integer", "number"], "pattern": r"^[0-9.]+[a-zA-Z]*$"}
    amounts = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"cpu": quantity, "memory": quantity},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pg-failover-hook chart values",
        "type": "object",
        "additionalProperties": False,
        "required": ["image", "resources", "autoscaling", "events", "mtls", "sharding", "crd"],
        "properties": {
            "image": {
                "type": "object",
                "additionalProperties": False,
                "required": ["repository", "tag", "pullPolicy"],
                "properties": {
                    "repository": {"type": "string", "minLength": 1, "pattern": r"^[^:@\s]+$"},
                    "tag": {"type": "string", "minLength": 1, "pattern": r"^[\w][\w.-]{0,127}$"},
                    "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                },
            },
            "resources": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"requests": amounts, "limits": amounts},
            },
            "autoscaling": {
                "type": "object",
                "additionalProperties": False,
                "required": ["minReplicas", "maxReplicas"],
                "properties": {
                    "minReplicas": {"type": "integer", "minimum": 1},
                    "maxReplicas": {"type": "integer", "minimum": 1},
                },
            },
            "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
            "tolerations": {"type": "array", "items": {"type": "object"}},
            "priorityClassName": {"type": "string"},
            "createNamespace": {"type": "boolean"},
            "largeInstall": {"type": "boolean"},
            "crd": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"keep": {"type": "boolean"}},
            },
            "events": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"enabled": {"type": "boolean"}},
            },
            "mtls": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"mode": {"enum": ["off", "transition", "on"]}},
            },
            "sharding": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"enabled": {"type": "boolean"}},
            },
        },
    }
