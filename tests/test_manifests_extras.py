"""Offline checks of the manifests: NetworkPolicy, Events, monitoring, image, Helm, docs.

The test design notes are those of tests/test_manifests_crd.py.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifest_helpers import (
    DEPLOY_DOC,
    DOCKERFILE,
    DOCKERIGNORE,
    HELM_VALUES,
    HOOK_NAME,
    METACONTROLLER_NAMESPACE,
    METACONTROLLER_POD_NAMES,
    NAMESPACE,
    POD_LABELS,
    REPO,
    SCRAPER_NAMESPACE_SELECTORS,
    SECURITY_DOC,
    SERVICEMONITOR_FILE,
    TARGETS,
    crd_schema,
    find,
    find_all,
    hadolint,
    load_one,
    parse_duration,
    rendered,
    schema_nodes,
    selects,
    with_component,
)
from tests.manifests_cases import (
    hook_container,
    hook_pod_spec,
)

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
        env = {e["name"]: e.get("value", "") for e in hook_container(target)["env"]}
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
    assert "PGFH_EMIT_EVENTS" not in {e["name"] for e in hook_container()["env"]}


def test_events_switch_is_the_one_the_hook_reads() -> None:
    from hooks.shell.config import HookSettings

    assert HookSettings.from_env({"PGFH_EMIT_EVENTS": "true"}).emit_events is True
    assert HookSettings.from_env({}).emit_events is False


def test_events_overlay() -> None:
    objects = rendered("deploy/events")
    assert find(objects, "ServiceAccount", HOOK_NAME)["automountServiceAccountToken"] is True
    assert hook_pod_spec("deploy/events")["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in hook_container("deploy/events")["env"]}
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


@pytest.mark.parametrize("resource", ["deploy", "deploy/events", "deploy/mtls"])
def test_large_install_component_drops_only_the_resync_period(
    resource: str, tmp_path: Path
) -> None:
    """deploy/large-install/ on the base or an overlay: the same objects, the
    CompositeController without resyncPeriodSeconds (docs/scale.md, "What to set")."""
    large = rendered(with_component(resource, "deploy/large-install", tmp_path))
    plain = rendered(resource)
    controller = find(plain, "CompositeController", HOOK_NAME)
    assert controller["spec"].pop("resyncPeriodSeconds") == 60
    assert large == plain


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
    assert int(users[0].split(":")[0]) == hook_pod_spec()["securityContext"]["runAsUser"]
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
    # The flags are the ones testbed/bench/fleet/table.py measured as the shipped settings
    # (issue 11).
    from testbed.bench.fleet.settings import SHIPPED

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
