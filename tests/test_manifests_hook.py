"""Offline checks of the manifests: the CompositeController, caller auth, the hook Deployment.

The test design notes are those of tests/test_manifests_crd.py.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest

from tests.manifest_helpers import (
    AUTH_MOUNT,
    AUTH_SECRET,
    CC_FILE,
    DOCUMENTED_GRACEFUL_TIMEOUT,
    FINALIZER,
    FIXTURES,
    HOOK_NAME,
    METACONTROLLER_CRDS,
    METACONTROLLER_NAMESPACE,
    NAMESPACE,
    POD_LABELS,
    PROBE_DEADLINE_SECONDS,
    TARGETS,
    compositecontroller_schema,
    crd,
    find,
    load_docs,
    load_one,
    parse_duration,
    pruned_fields,
    rendered,
    restricted_problems,
    selects,
    validate_cr,
)
from tests.manifests_cases import (
    hook_container,
    hook_pod_spec,
)

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
    return {e["name"]: e.get("value", "") for e in hook_container(target)["env"]}


def _mounts(target: str) -> dict[str, dict[str, Any]]:
    """mountPath -> the mounted volume, for the hook container."""
    volumes = {v["name"]: v for v in hook_pod_spec(target)["volumes"]}
    mounts = {}
    for mount in hook_container(target)["volumeMounts"]:
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
    container = hook_container("deploy/mtls")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # the operations port
        assert container[probe]["httpGet"]["port"] == "ops", probe
        assert container[probe]["httpGet"].get("scheme", "HTTP") == "HTTP", probe
    # Everything else is the base.
    base = {(o["kind"], o["metadata"]["name"]) for o in rendered("deploy")}
    assert {(o["kind"], o["metadata"]["name"]) for o in rendered("deploy/mtls")} == base


@pytest.mark.parametrize("target", TARGETS)
def test_deployment_meets_the_restricted_policy(target: str) -> None:
    assert restricted_problems(hook_pod_spec(target)) == []


def test_restricted_check_negative_control() -> None:
    pod = hook_pod_spec()
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
    container = hook_container()
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
    container = hook_container()
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
    pod = hook_pod_spec()
    pre_stop = hook_container()["lifecycle"]["preStop"]
    assert set(pre_stop) == {"sleep"}, "native sleep action: no shell needed in the image"
    sleep = pre_stop["sleep"]["seconds"]
    graceful = _graceful_timeout()
    assert graceful == DOCUMENTED_GRACEFUL_TIMEOUT
    assert sleep >= 3, "give endpoints and kube-proxy time to stop routing to the pod"
    # The grace countdown starts before preStop: both must fit, with a margin.
    assert sleep + graceful + 2 <= pod["terminationGracePeriodSeconds"]


def test_writable_paths_are_memory_emptydirs() -> None:
    pod = hook_pod_spec()
    container = hook_container()
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
    constraints = {c["topologyKey"]: c for c in hook_pod_spec()["topologySpreadConstraints"]}
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
