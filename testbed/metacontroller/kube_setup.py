"""Installing what Metacontroller needs into a test API server, for a hook on loopback.

The stand-in (:mod:`testbed.metacontroller.kube`) and a real Metacontroller binary
(:mod:`testbed.metacontroller.metacontroller_binary`) both read the CompositeController from the API
server,
so it must be there, and the hook it names must be reachable: the repository's
``metacontroller/compositecontroller.yaml`` names ``pg-failover-hook.pg-failover-hook.svc:8080``,
which only a cluster's DNS resolves. :func:`install` applies (server-side) Metacontroller's
CRDs (``tests/data/metacontroller-crds-v1.yaml``, the v4.17.2 chart's), our CRD
(``metacontroller/crd.yaml``), waits until they are established, then the CompositeController
with every hook URL and the ``endpointConfigs`` host moved to the loopback hook, and the
bearer-token Secret it names holding the hook's token. Nothing else of the file changes.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from testbed.kubernetes.rest import KubeApiError, KubeRest

REPO = Path(__file__).resolve().parents[2]
METACONTROLLER_CRDS = REPO / "tests" / "data" / "metacontroller-crds-v1.yaml"
OUR_CRD = REPO / "metacontroller" / "crd.yaml"
COMPOSITE_CONTROLLER = REPO / "metacontroller" / "compositecontroller.yaml"
IN_CLUSTER_HOOK = "http://pg-failover-hook.pg-failover-hook.svc:8080"
MANAGER = "pgfh-test-setup"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CC_PATH = "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers"


def local_controller(hook_url: str, source: Path = COMPOSITE_CONTROLLER) -> dict[str, Any]:
    """The CompositeController of ``source`` with its hooks at ``hook_url`` (pure)."""
    controller: dict[str, Any] = yaml.safe_load(source.read_text())
    base = hook_url.rstrip("/")
    for hook in (controller["spec"].get("hooks") or {}).values():
        webhook = hook.get("webhook") or {}
        if str(webhook.get("url", "")).startswith(IN_CLUSTER_HOOK):
            webhook["url"] = base + webhook["url"][len(IN_CLUSTER_HOOK) :]
    for entry in controller["spec"].get("endpointConfigs") or []:
        if entry.get("host") == urlsplit(IN_CLUSTER_HOOK).netloc:
            entry["host"] = urlsplit(base).netloc
    return controller


def apply_crds(rest: KubeRest, *files: Path, timeout: float = 30.0) -> None:
    """Server-side apply every CRD in ``files`` and wait until each is Established."""
    names = []
    for path in files or (METACONTROLLER_CRDS, OUR_CRD):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                rest.apply(f"{CRD_PATH}/{doc['metadata']['name']}", doc, MANAGER)
                names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = rest.get(f"{CRD_PATH}/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established within {timeout} s")
            time.sleep(0.1)


def install(
    rest: KubeRest,
    hook_url: str,
    token: str | None,
    spec: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
) -> dict[str, Any]:
    """CRDs, the token Secret and the loopback CompositeController; the CompositeController
    as the server stored it. ``spec``: fields of the shipped spec replaced (``None``:
    removed), e.g. a test's ``resyncPeriodSeconds`` or a ``parentResource`` that selects a
    share of the parents; ``name``: another name than the shipped one (several at once)."""
    apply_crds(rest)
    controller = local_controller(hook_url)
    if name is not None:
        controller["metadata"]["name"] = name
    for field, value in (spec or {}).items():
        if value is None:
            controller["spec"].pop(field, None)
        else:
            controller["spec"][field] = value
    for entry in controller["spec"].get("endpointConfigs") or []:
        ref = (entry.get("authorization") or {}).get("secretRef")
        if not ref or token is None:
            continue
        namespace = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ref["namespace"]},
        }
        rest.apply(f"/api/v1/namespaces/{ref['namespace']}", namespace, MANAGER)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": ref["name"], "namespace": ref["namespace"]},
            "data": {ref["key"]: base64.b64encode(token.encode()).decode()},
        }
        rest.apply(f"/api/v1/namespaces/{ref['namespace']}/secrets/{ref['name']}", secret, MANAGER)
    name = controller["metadata"]["name"]
    for _ in range(50):  # the new CRD's endpoint may lag its Established condition briefly
        try:
            return rest.apply(f"{CC_PATH}/{name}", controller, MANAGER)
        except KubeApiError as error:
            if error.status != 404:
                raise
            time.sleep(0.1)
    raise TimeoutError("the compositecontrollers endpoint never appeared")
