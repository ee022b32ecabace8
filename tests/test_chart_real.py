"""The Helm chart on the real API server (issue 32, item 4): the pinned helm
(testbed/kubernetes/go/helm)
against the real kube-apiserver of testbed/kubernetes/.

* ``helm template`` of every values choice (the defaults and each overlay's) passes the
  server's server-side-apply dry run with no error and no warning;
* ``helm install`` with one values set, then ``helm upgrade`` with another and back, change
  exactly what the values name: the events overlay's RBAC and NetworkPolicy appear and go, the
  Deployment's image and the HPA's bounds follow, the sharded controllers replace the single
  one; a token written into the auth Secret out of band (as deploy/rotate-credentials.sh does)
  survives every upgrade; ``helm uninstall`` leaves the CRD (``crd.keep``).

* ``helm upgrade`` from the previous chart version (0.1.0, packaged in
  tests/fixtures/charts/) to this one: the CRD gains the new schema (a field 0.1.0's server
  refuses is then stored), a PostgreSQLCluster and an out-of-band token survive, and the
  release history names both chart versions. Like tests/test_manifests_real.py, the module runs on a
control plane of its own: the chart's cluster-scoped objects (the CRD, the CompositeController,
the admission policies) would collide with what other modules leave on the session's server,
and helm refuses to adopt objects it did not create.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops import chart
from testbed.kubernetes import ControlPlane
from tests.controlplane_fixtures import running_control_plane
from tests.manifest_helpers import METACONTROLLER_CRDS, REPO
from tests.test_chart import helm, settings_of

CHART = REPO / "charts" / "pg-failover-hook"
RELEASE = "pg-failover-hook"
RELEASE_NAMESPACE = "default"
NAMESPACE = "pg-failover-hook"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own empty server, with Metacontroller's CRDs (its chart installs them)."""
    with running_control_plane(tmp_path_factory) as plane:
        plane.kubectl("apply", "--server-side", "-f", str(METACONTROLLER_CRDS), timeout=120)
        plane.kubectl(
            "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", timeout=90
        )
        yield plane


def run_helm(plane: ControlPlane, *args: str, values: dict[str, Any] | None = None) -> str:
    """helm against ``plane`` as admin; fails on an error or a warning."""
    sets = [a for s in settings_of(values or {}) for a in ("--set", s)]
    result = subprocess.run(
        [helm(), "--kubeconfig", str(plane.admin_kubeconfig), *args, *sets],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**plane.env(), "HELM_CACHE_HOME": str(plane.run_dir / "helm-cache"),
             "HELM_CONFIG_HOME": str(plane.run_dir / "helm-config"),
             "HELM_DATA_HOME": str(plane.run_dir / "helm-data")},
    )  # fmt: skip
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    assert "warning" not in result.stderr.lower(), f"helm {' '.join(args)}:\n{result.stderr}"
    return result.stdout


def get(plane: ControlPlane, *what: str) -> dict[str, Any] | None:
    result = plane.kubectl("get", *what, "-o", "json", check=False)
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_every_values_choice_passes_the_servers_dry_run(control_plane: ControlPlane) -> None:
    """Server-side apply, dry run: the API server (CRD schemas of Metacontroller's kinds,
    admission policy compilation, every built-in kind's validation) accepts each rendering."""
    namespace = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    control_plane.kubectl("apply", "--server-side", "-f", "-", input_text=namespace)
    try:
        for variant in chart.VARIANTS:
            manifests = run_helm(
                control_plane, "template", RELEASE, str(CHART), values=dict(variant.values)
            )
            result = control_plane.kubectl(
                "apply", "--server-side", "--dry-run=server", "--field-manager=pgfh-tests",
                "-f", "-", input_text=manifests, check=False, timeout=120,
            )  # fmt: skip
            assert result.returncode == 0, f"{variant.name}: {result.stderr}"
            assert result.stderr.strip() == "", f"{variant.name} warned: {result.stderr}"
            rendered = [d for d in yaml.safe_load_all(manifests) if d]
            assert result.stdout.count("(server dry run)") == len(rendered), result.stdout
    finally:
        control_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=true", timeout=120)


def _token_secret(plane: ControlPlane) -> dict[str, str]:
    secret = get(plane, "secret", "-n", NAMESPACE, "pg-failover-hook-auth")
    assert secret is not None
    data: dict[str, str] = secret.get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _hook(plane: ControlPlane) -> dict[str, Any]:
    deployment = get(plane, "deployment", "-n", NAMESPACE, "pg-failover-hook")
    assert deployment is not None
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_install_then_upgrade_between_values_sets_and_uninstall(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    plane = control_plane
    ns = ("-n", RELEASE_NAMESPACE)
    run_helm(plane, "install", RELEASE, str(CHART), *ns)
    try:
        assert _hook(plane)["image"] == "ghcr.io/adg-io/pg-failover-hook:0.1.0"
        assert get(plane, "clusterrole", "pg-failover-hook-events") is None
        assert get(plane, "compositecontroller", "pg-failover-hook") is not None
        # What deploy/rotate-credentials.sh token does to the Secret (ops/rotation/): keys the
        # chart does not render, which no upgrade may take away.
        plane.kubectl(
            "patch", "secret", "-n", NAMESPACE, "pg-failover-hook-auth", "--type", "merge",
            "-p", json.dumps({"stringData": {"token": "s3cret", "token-20261205": "s3cret"}}),
        )  # fmt: skip

        # Upgrade 1: the events overlay, another image, other HPA bounds.
        run_helm(
            plane, "upgrade", RELEASE, str(CHART), *ns,
            values={"events": {"enabled": True}, "image": {"tag": "0.1.1"},
                    "autoscaling": {"minReplicas": 4, "maxReplicas": 12}},
        )  # fmt: skip
        hook = _hook(plane)
        assert hook["image"] == "ghcr.io/adg-io/pg-failover-hook:0.1.1"
        assert {"name": "PGFH_EMIT_EVENTS", "value": "true"} in hook["env"]
        hpa = get(plane, "hpa", "-n", NAMESPACE, "pg-failover-hook")
        assert hpa is not None
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (4, 12)
        assert get(plane, "clusterrole", "pg-failover-hook-events") is not None
        assert get(plane, "networkpolicy", "-n", NAMESPACE, "pg-failover-hook-egress-apiserver")
        assert _token_secret(plane) == {"token": "s3cret", "token-20261205": "s3cret"}

        # Upgrade 2: sharded; the events overlay's objects go, the single controller gives way
        # to five.
        run_helm(plane, "upgrade", RELEASE, str(CHART), *ns, values={"sharding": {"enabled": True}})
        assert get(plane, "clusterrole", "pg-failover-hook-events") is None
        assert (
            get(plane, "networkpolicy", "-n", NAMESPACE, "pg-failover-hook-egress-apiserver")
            is None
        )
        assert {"name": "PGFH_EMIT_EVENTS", "value": "true"} not in _hook(plane)["env"]
        assert _hook(plane)["image"] == "ghcr.io/adg-io/pg-failover-hook:0.1.0"
        assert get(plane, "compositecontroller", "pg-failover-hook") is None
        listed = get(plane, "compositecontrollers")
        assert listed is not None
        assert sorted(c["metadata"]["name"] for c in listed["items"]) == [
            f"pg-failover-hook-{k}" for k in range(5)
        ]
        assert get(plane, "validatingadmissionpolicy", "pg-failover-hook-shard-label")

        # Upgrade 3: back to the defaults, which is what `kubectl apply -k deploy/` makes. An
        # upgrade given no values reuses the last ones (helm's rule): --reset-values says so.
        run_helm(plane, "upgrade", RELEASE, str(CHART), *ns, "--reset-values")
        listed = get(plane, "compositecontrollers")
        assert listed is not None
        assert [c["metadata"]["name"] for c in listed["items"]] == ["pg-failover-hook"]
        assert get(plane, "validatingadmissionpolicy", "pg-failover-hook-shard-label") is None
        assert _token_secret(plane) == {"token": "s3cret", "token-20261205": "s3cret"}
        history = json.loads(run_helm(plane, "history", RELEASE, *ns, "-o", "json"))
        assert [h["revision"] for h in history] == [1, 2, 3, 4]
        assert history[-1]["status"] == "deployed"
    finally:
        run_helm(plane, "uninstall", RELEASE, *ns, "--wait", "--timeout", "120s")
    # crd.keep: the CRD (and so every PostgreSQLCluster) outlives the release.
    assert get(plane, "crd", "postgresqlclusters.adg.io") is not None
    assert get(plane, "compositecontroller", "pg-failover-hook") is None
    assert get(plane, "deployment", "-n", NAMESPACE, "pg-failover-hook") is None


PREVIOUS_CHART = REPO / "tests" / "fixtures" / "charts" / "pg-failover-hook-0.1.0.tgz"


def _apply_cluster(plane: ControlPlane, name: str) -> subprocess.CompletedProcess[str]:
    """Server-side apply of a PostgreSQLCluster asking for same-zone reads (a field 0.1.0's
    CRD does not know; server-side apply refuses an undeclared field)."""
    cluster = {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "primarySelector": {"app": name},
            "serviceRef": {"name": f"{name}-primary"},
            "replicaService": {"name": f"{name}-replicas", "trafficDistribution": "PreferClose"},
        },
    }
    return plane.kubectl(
        "apply", "--server-side", "-f", "-", input_text=json.dumps(cluster), check=False
    )


def test_helm_upgrade_from_the_previous_chart_version(control_plane: ControlPlane) -> None:
    plane = control_plane
    ns = ("-n", RELEASE_NAMESPACE)
    run_helm(plane, "install", RELEASE, str(PREVIOUS_CHART), *ns)
    try:
        # 0.1.0's CRD has no trafficDistribution: the server refuses the field.
        refused = _apply_cluster(plane, "pg-new-field")
        assert refused.returncode != 0, refused.stdout
        assert "trafficDistribution: field not declared in schema" in refused.stderr
        existing = {
            "apiVersion": "adg.io/v1alpha1", "kind": "PostgreSQLCluster",
            "metadata": {"name": "pg-before", "namespace": "default"},
            "spec": {"primarySelector": {"app": "pg-before"}, "serviceRef": {"name": "pg-b"}},
        }  # fmt: skip
        plane.kubectl("apply", "--server-side", "-f", "-", input_text=json.dumps(existing))
        plane.kubectl(
            "patch", "secret", "-n", NAMESPACE, "pg-failover-hook-auth", "--type", "merge",
            "-p", json.dumps({"stringData": {"token": "s3cret"}}),
        )  # fmt: skip

        run_helm(plane, "upgrade", RELEASE, str(CHART), *ns)

        history = json.loads(run_helm(plane, "history", RELEASE, *ns, "-o", "json"))
        assert [(h["revision"], h["chart"]) for h in history] == [
            (1, "pg-failover-hook-0.1.0"),
            (2, f"pg-failover-hook-{chart.CHART_VERSION}"),
        ], history
        assert history[-1]["status"] == "deployed"
        assert chart.CHART_VERSION != "0.1.0"
        # The CRD was upgraded with the release (it is a template, kept on uninstall), so the
        # field is now stored; the cluster made under 0.1.0 is still there.
        accepted = _apply_cluster(plane, "pg-new-field")
        assert accepted.returncode == 0, accepted.stderr
        after = get(plane, "postgresqlcluster", "-n", "default", "pg-new-field")
        assert after is not None
        assert after["spec"]["replicaService"]["trafficDistribution"] == "PreferClose"
        assert get(plane, "postgresqlcluster", "-n", "default", "pg-before") is not None
        assert _token_secret(plane) == {"token": "s3cret"}
        assert get(plane, "compositecontroller", "pg-failover-hook") is not None
    finally:
        plane.kubectl(
            "delete", "postgresqlclusters", "-n", "default", "--all", "--wait=false",
            check=False,
        )  # fmt: skip
        run_helm(plane, "uninstall", RELEASE, *ns, "--wait", "--timeout", "120s")


def _spec_of_rendered(plane: ControlPlane, kind: str, values: dict[str, Any]) -> dict[str, Any]:
    manifests = run_helm(plane, "template", RELEASE, str(CHART), values=values)
    found = [d for d in yaml.safe_load_all(manifests) if d and d["kind"] == kind]
    assert len(found) == 1
    spec: dict[str, Any] = found[0]["spec"]
    return spec


def test_the_mtls_migration_of_docs_upgrade_md_runs_as_helm_upgrades(
    control_plane: ControlPlane,
) -> None:
    """docs/upgrade.md's three steps with the chart: upgrade to ``mtls.mode=transition``, patch
    the CompositeController by hand (step 2, as documented), upgrade to ``mtls.mode=on``: no
    step fails (helm's apply does not trip over the fields the hand patch set) and the result is
    the chart's ``mtls.mode=on`` rendering."""
    plane = control_plane
    ns = ("-n", RELEASE_NAMESPACE)
    run_helm(plane, "install", RELEASE, str(CHART), *ns)
    try:
        run_helm(
            plane, "upgrade", RELEASE, str(CHART), *ns, "--reuse-values",
            values={"mtls": {"mode": "transition"}},
        )  # fmt: skip
        deployment = get(plane, "deployment", "-n", NAMESPACE, "pg-failover-hook")
        assert deployment is not None
        containers = deployment["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["hook-tls", "hook"]
        service = get(plane, "service", "-n", NAMESPACE, "pg-failover-hook")
        assert service is not None
        assert [p["port"] for p in service["spec"]["ports"]] == [8080, 9090, 8443]
        plane.kubectl(
            "patch", "compositecontroller", "pg-failover-hook", "--type", "merge",
            "--patch-file", str(REPO / "deploy" / "mtls" / "compositecontroller-patch.yaml"),
        )  # fmt: skip
        run_helm(
            plane, "upgrade", RELEASE, str(CHART), *ns, "--reuse-values",
            values={"mtls": {"mode": "on"}},
        )  # fmt: skip
        controller = get(plane, "compositecontroller", "pg-failover-hook")
        assert controller is not None
        wanted = _spec_of_rendered(plane, "CompositeController", {"mtls": {"mode": "on"}})
        assert controller["spec"]["hooks"] == wanted["hooks"]
        assert controller["spec"]["endpointConfigs"] == wanted["endpointConfigs"]
        assert wanted["hooks"]["sync"]["webhook"]["url"].startswith("https://")
        service = get(plane, "service", "-n", NAMESPACE, "pg-failover-hook")
        assert service is not None
        assert sorted(p["port"] for p in service["spec"]["ports"]) == [8443, 9090]
        deployment = get(plane, "deployment", "-n", NAMESPACE, "pg-failover-hook")
        assert deployment is not None
        containers = deployment["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["hook"]
        assert {"name": "PGFH_AUTH", "value": "token+mtls"} in containers[0]["env"]
    finally:
        run_helm(plane, "uninstall", RELEASE, *ns, "--wait", "--timeout", "120s")
