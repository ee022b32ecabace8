"""Moving from deploy/ to deploy/mtls/ without a failed sync (docs/upgrade.md).

During a rolling update pods of the old and the new template serve side by side, and the
objects of one ``kubectl apply`` land one after the other, so at any moment Metacontroller may
be calling with the old or the new CompositeController, through the old or the new Service
and NetworkPolicy, a pod of the old or the new template. A step is safe when **every**
combination serves the call: the URL's port is a Service port whose target is a container
port of that pod, the container listening there speaks the URL's scheme (HTTPS exactly when
it has a certificate) and accepts the credentials the CompositeController sends (token,
client certificate), and the ingress policy admits the port.

The documented steps (deploy/ → deploy/mtls-transition/ → patch the CompositeController with
deploy/mtls's patch → deploy/mtls/) pass; applying deploy/mtls/ directly does not.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from hooks.shell.config import HookSettings
from tests.manifest_helpers import HOOK_NAME, find, rendered

REPO = Path(__file__).resolve().parent.parent


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what `kubectl patch --type merge` applies)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def state(target: str) -> dict[str, Any]:
    objects = rendered(target)
    return {
        "cc": find(objects, "CompositeController"),
        "service": find(objects, "Service", HOOK_NAME),
        "deployment": find(objects, "Deployment", HOOK_NAME),
        "ingress": find(objects, "NetworkPolicy", "pg-failover-hook-ingress"),
    }


def cc_patched(previous: dict[str, Any]) -> dict[str, Any]:
    """Step 2: `kubectl patch compositecontroller … --type merge --patch-file …`."""
    patch = yaml.safe_load((REPO / "deploy/mtls/compositecontroller-patch.yaml").read_text())
    return {**previous, "cc": merge_patch(previous["cc"], patch)}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def call_problems(
    cc: dict[str, Any],
    service: dict[str, Any],
    deployment: dict[str, Any],
    ingress: dict[str, Any],
) -> list[str]:
    """Why a hook call of ``cc`` would fail on a pod of ``deployment`` (empty: it works)."""
    problems = []
    pod = deployment["spec"]["template"]["spec"]
    entries = cc["spec"].get("endpointConfigs") or []
    for hook_name, hook in sorted(cc["spec"]["hooks"].items()):
        url = urlsplit(hook["webhook"]["url"])
        where = f"{hook_name} {url.scheme}://…:{url.port}"
        (entry,) = [e for e in entries if e["host"] == url.netloc] or [{}]
        ports = [p for p in service["spec"]["ports"] if p["port"] == url.port]
        if not ports:
            problems.append(f"{where}: the Service has no port {url.port}")
            continue
        target = ports[0]["targetPort"]
        serving = [
            (c, p)
            for c in pod["containers"]
            for p in c.get("ports", [])
            if target in (p.get("name"), p["containerPort"])
        ]
        if not serving:
            problems.append(f"{where}: no container port {target!r} in the pod")
            continue
        container, port = serving[0]
        env = _env(container)
        settings = HookSettings.from_env(env)
        bind_port = int(env.get("GUNICORN_BIND", "0.0.0.0:8080").rsplit(":", 1)[1])
        if bind_port != port["containerPort"]:
            problems.append(f"{where}: {container['name']} listens on {bind_port}")
        if (settings.server_tls is not None) != (url.scheme == "https"):
            problems.append(f"{where}: {container['name']} does not speak {url.scheme}")
        if settings.auth.tokens_required and not entry.get("authorization"):
            problems.append(f"{where}: {container['name']} needs the token, none is sent")
        if settings.auth.certificate_required and not entry.get("clientTLS"):
            problems.append(f"{where}: {container['name']} needs a client certificate")
        if url.scheme == "https" and not entry.get("caBundle"):
            problems.append(f"{where}: Metacontroller cannot verify the hook's certificate")
        # Metacontroller's rules (a pod selector in a peer); scrapers have a port of their own.
        metacontroller = [
            rule
            for rule in ingress["spec"]["ingress"]
            if any("podSelector" in peer for peer in rule.get("from", []))
        ]
        admitted = [
            rule
            for rule in metacontroller
            if {"port": port["containerPort"], "protocol": "TCP"} in rule.get("ports", [])
        ]
        if not metacontroller or len(admitted) != len(metacontroller):
            problems.append(f"{where}: the ingress policy does not admit {port['containerPort']}")
    return problems


def step_problems(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Every mix of old and new objects a step can pass through must serve every call."""
    problems = []
    for cc, service, deployment, ingress in itertools.product(
        *[(before[k], after[k]) for k in ("cc", "service", "deployment", "ingress")]
    ):
        for problem in call_problems(cc, service, deployment, ingress):
            if problem not in problems:
                problems.append(problem)
    return problems


def test_every_overlay_serves_its_own_compositecontroller() -> None:
    for target in ("deploy", "deploy/mtls-transition", "deploy/mtls"):
        s = state(target)
        assert call_problems(s["cc"], s["service"], s["deployment"], s["ingress"]) == [], target


def test_the_documented_steps_to_mtls_never_fail_a_call() -> None:
    start = state("deploy")
    transition = state("deploy/mtls-transition")
    switched = cc_patched(transition)
    final = state("deploy/mtls")
    assert transition["cc"] == start["cc"], "step 1 leaves the CompositeController alone"
    assert switched["cc"] == final["cc"], "step 2's patch makes exactly deploy/mtls's spec"
    for name, (before, after) in {
        "1: apply deploy/mtls-transition": (start, transition),
        "2: patch the CompositeController": (transition, switched),
        "3: apply deploy/mtls": (switched, final),
    }.items():
        assert step_problems(before, after) == [], name


def test_applying_deploy_mtls_directly_would_fail_calls() -> None:
    problems = step_problems(state("deploy"), state("deploy/mtls"))
    assert any("no port 8443" in p or "no container port" in p for p in problems), problems


def test_the_transition_container_is_the_mtls_container() -> None:
    """No drift: the second container of the transition is deploy/mtls's hook container."""
    transition = state("deploy/mtls-transition")["deployment"]["spec"]["template"]["spec"]
    final = state("deploy/mtls")["deployment"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in transition["containers"]}
    assert set(containers) == {"hook", "hook-tls"}
    (mtls,) = final["containers"]
    twin = copy.deepcopy(containers["hook-tls"])
    twin["name"] = "hook"
    for mount in twin["volumeMounts"]:
        if mount["name"] == "metrics-tls":
            mount["name"] = "metrics"
    # Its own operations port (the "hook" container holds 9090 in the same Pod).
    twin["env"] = [e for e in twin["env"] if e["name"] != "GUNICORN_OPS_BIND"]
    for port in twin["ports"]:
        if port["name"] == "ops-tls":
            port.update(name="ops", containerPort=9090)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        twin[probe]["httpGet"]["port"] = "ops"
    key = lambda m: m["mountPath"]  # noqa: E731
    twin["volumeMounts"].sort(key=key)
    mtls = copy.deepcopy(mtls)
    mtls["volumeMounts"].sort(key=key)
    twin["env"].sort(key=lambda e: e["name"])
    mtls["env"].sort(key=lambda e: e["name"])
    assert twin == mtls
    # Its own metrics directory: each gunicorn empties it at start.
    volumes = {v["name"]: v for v in transition["volumes"]}
    assert "emptyDir" in volumes["metrics-tls"]
    plain = {m["name"]: m["mountPath"] for m in containers["hook"]["volumeMounts"]}
    tls = {m["name"]: m["mountPath"] for m in containers["hook-tls"]["volumeMounts"]}
    assert plain["metrics"] == tls["metrics-tls"] and "metrics" not in tls


@pytest.mark.parametrize("target", ["deploy", "deploy/mtls"])
def test_the_deployment_leaves_the_replica_count_to_the_hpa(target: str) -> None:
    assert "replicas" not in state(target)["deployment"]["spec"]
