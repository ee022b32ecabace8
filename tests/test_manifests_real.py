"""Every manifest of the repository applied to the real API server (issue 24, item 3).

Each install an admin can make (``deploy/`` and its overlays ``events``, ``mtls``,
``mtls-transition``, ``sharding``; ``metacontroller/``; the example PostgreSQLClusters; the
monitoring objects, after the Prometheus Operator's CRDs) is rendered by the pinned kubectl's
kustomize and really applied with server-side apply, after Metacontroller's CRDs: no error and no
warning (a deprecation warning fails the test), and every rendered object is then on the
server. The installs exclude each other (one namespace, one CompositeController name, the
sharding overlay's admission policy), so the module runs on a control plane of its own (other
modules leave cluster-scoped objects, such as an admission policy or the CRD, on the session's
server under other field managers) and each test deletes what it applied, as an admin who
switches installs would; the mTLS migration of docs/upgrade.md is
applied in its documented order, over the running base.

The Prometheus Operator's CRDs come from its Go module (``example/prometheus-operator-crd/`` of
``github.com/prometheus-operator/prometheus-operator``, the version pinned below), fetched with
``go mod download`` into Go's module cache, as the control plane's own modules are.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.binaries import find_go
from tests.controlplane_fixtures import running_control_plane
from tests.manifest_helpers import EXAMPLE_FULL, EXAMPLE_SEED, METACONTROLLER_CRDS, REPO

MANAGER = "pgfh-tests"
#: The Prometheus Operator whose ServiceMonitor and PrometheusRule CRDs the monitoring objects
#: are applied against.
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
MONITORING_CRDS = (
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
)
INSTALLS = ["deploy", "deploy/events", "deploy/mtls", "deploy/mtls-transition", "deploy/sharding"]
DELETE_TIMEOUT = "120s"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own empty server, in place of the session's shared one."""
    with running_control_plane(tmp_path_factory) as plane:
        yield plane


def _clean(result: subprocess.CompletedProcess[str], what: str) -> str:
    """kubectl's stdout, failing on an error or on anything on stderr (warnings included)."""
    assert result.returncode == 0, f"{what} failed:\n{result.stderr}"
    assert "Warning:" not in result.stderr, f"{what} warned:\n{result.stderr}"
    assert result.stderr.strip() == "", f"{what} wrote to stderr:\n{result.stderr}"
    return result.stdout


def render(control_plane: ControlPlane, target: str) -> str:
    return _clean(
        control_plane.kubectl("kustomize", str(REPO / target), check=False), f"kustomize {target}"
    )


def apply(control_plane: ControlPlane, manifests: str, what: str) -> str:
    return _clean(
        control_plane.kubectl(
            "apply", "--server-side", f"--field-manager={MANAGER}", "-f", "-",
            input_text=manifests, check=False, timeout=120,
        ),
        f"kubectl apply --server-side ({what})",
    )  # fmt: skip


def objects_of(manifests: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifests) if doc]


def assert_on_the_server(control_plane: ControlPlane, manifests: str, what: str) -> None:
    """Every object of ``manifests`` exists on the server (the apply really happened)."""
    listed = json.loads(
        _clean(
            control_plane.kubectl(
                "get", "-f", "-", "-o", "json", input_text=manifests, check=False
            ),
            f"kubectl get ({what})",
        )
    )
    found = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in listed["items"]
    }
    wanted = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        for o in objects_of(manifests)
    }
    assert found == wanted


def delete(control_plane: ControlPlane, manifests: str) -> None:
    """Delete what ``manifests`` created, but keep CRDs (other tests' objects live in them)."""
    kept = [o for o in objects_of(manifests) if o["kind"] != "CustomResourceDefinition"]
    if not kept:
        return
    control_plane.kubectl(
        "delete", "--ignore-not-found", "--wait", f"--timeout={DELETE_TIMEOUT}", "-f", "-",
        input_text=yaml.safe_dump_all(kept), timeout=180,
    )  # fmt: skip


@pytest.fixture(scope="module")
def metacontroller_crds(control_plane: ControlPlane) -> None:
    """Metacontroller's CRDs (its kinds: CompositeController, ...), as its chart installs them."""
    manifests = METACONTROLLER_CRDS.read_text(encoding="utf-8")
    apply(control_plane, manifests, "Metacontroller's CRDs")
    for crd in objects_of(manifests):
        control_plane.kubectl(
            "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}",
            "--timeout=30s",
        )  # fmt: skip


@pytest.fixture
def installed(control_plane: ControlPlane, metacontroller_crds: None) -> Iterator[list[str]]:
    """What a test applied (rendered manifests), deleted afterwards in reverse order."""
    applied: list[str] = []
    try:
        yield applied
    finally:
        for manifests in reversed(applied):
            delete(control_plane, manifests)


def test_a_warning_of_the_server_fails_the_apply(
    control_plane: ControlPlane,
) -> None:
    """The negative control: the server warns (here, a memory quantity in millibytes), and the
    apply that succeeded fails the check anyway."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "warned", "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "i", "resources": {"limits": {"memory": "100m"}}}]
        },
    }
    with pytest.raises(AssertionError, match=r"(?s)warned:.*fractional byte value"):
        apply(control_plane, yaml.safe_dump(pod), "a Pod the server warns about")
    assert control_plane.kubectl("get", "pod", "-n", "default", "warned").returncode == 0
    control_plane.kubectl("delete", "pod", "-n", "default", "warned", "--wait=false")


@pytest.mark.parametrize("target", INSTALLS)
def test_each_install_applies_without_error_or_warning(
    target: str, control_plane: ControlPlane, installed: list[str]
) -> None:
    manifests = render(control_plane, target)
    installed.append(manifests)
    apply(control_plane, manifests, target)
    assert_on_the_server(control_plane, manifests, target)


def test_the_cluster_scoped_objects_apply_alone(
    control_plane: ControlPlane, installed: list[str]
) -> None:
    manifests = render(control_plane, "metacontroller")
    installed.append(manifests)
    assert {o["kind"] for o in objects_of(manifests)} == {
        "CustomResourceDefinition",
        "CompositeController",
    }
    apply(control_plane, manifests, "metacontroller/")
    assert_on_the_server(control_plane, manifests, "metacontroller/")


def test_the_example_clusters_apply_after_the_install(
    control_plane: ControlPlane, installed: list[str]
) -> None:
    base = render(control_plane, "deploy")
    installed.append(base)
    apply(control_plane, base, "deploy")
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/postgresqlclusters.adg.io", "--timeout=30s"
    )
    namespace = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "databases"}}
    )
    examples = "---\n".join(p.read_text(encoding="utf-8") for p in (EXAMPLE_SEED, EXAMPLE_FULL))
    installed.append(namespace)
    apply(control_plane, namespace, "namespace databases")
    installed.append(examples)
    apply(control_plane, examples, "the examples")
    assert_on_the_server(control_plane, examples, "the examples")


def test_the_mtls_migration_applies_in_its_documented_order(
    control_plane: ControlPlane, installed: list[str]
) -> None:
    """docs/upgrade.md: deploy/, then deploy/mtls-transition/, the CompositeController patch,
    then deploy/mtls/, each over the one before."""
    for target in ("deploy", "deploy/mtls-transition"):
        manifests = render(control_plane, target)
        installed.append(manifests)
        apply(control_plane, manifests, target)
    _clean(
        control_plane.kubectl(
            "patch", "compositecontroller", "pg-failover-hook", "--type", "merge",
            "--patch-file", str(REPO / "deploy/mtls/compositecontroller-patch.yaml"), check=False,
        ),
        "kubectl patch compositecontroller",
    )  # fmt: skip
    final = render(control_plane, "deploy/mtls")
    installed.append(final)
    apply(control_plane, final, "deploy/mtls")
    assert_on_the_server(control_plane, final, "deploy/mtls")
    wanted = next(o for o in objects_of(final) if o["kind"] == "Deployment")
    shown = json.loads(
        control_plane.kubectl(
            "get", "deployment", "-n", "pg-failover-hook", "pg-failover-hook", "-o", "json"
        ).stdout
    )
    # Server-side apply removed the transition's second container: the pods are deploy/mtls's.
    names = [c["name"] for c in shown["spec"]["template"]["spec"]["containers"]]
    assert names == [c["name"] for c in wanted["spec"]["template"]["spec"]["containers"]]


# ------------------------------------------------------------------------ monitoring


def prometheus_operator_crds() -> str:
    """The ServiceMonitor and PrometheusRule CRDs of the pinned Prometheus Operator module."""
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
    result = subprocess.run(
        [str(find_go()), "mod", "download", "-json", PROMETHEUS_OPERATOR],
        capture_output=True, text=True, env=env, timeout=600, check=False, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, f"go mod download {PROMETHEUS_OPERATOR}:\n{result.stderr}"
    folder = Path(json.loads(result.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return "---\n".join((folder / name).read_text(encoding="utf-8") for name in MONITORING_CRDS)


def test_the_monitoring_objects_apply_after_the_prometheus_operators_crds(
    control_plane: ControlPlane, installed: list[str]
) -> None:
    crds = prometheus_operator_crds()
    assert {o["spec"]["names"]["kind"] for o in objects_of(crds)} == {
        "ServiceMonitor",
        "PrometheusRule",
    }
    apply(control_plane, crds, "the Prometheus Operator's CRDs")
    for crd in objects_of(crds):
        control_plane.kubectl(
            "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}",
            "--timeout=30s",
        )  # fmt: skip
    base = render(control_plane, "deploy")
    installed.append(base)
    apply(control_plane, base, "deploy")
    monitoring = "---\n".join(
        (REPO / "deploy" / "monitoring" / name).read_text(encoding="utf-8")
        for name in ("servicemonitor.yaml", "prometheusrule.yaml")
    )
    installed.append(monitoring)
    apply(control_plane, monitoring, "deploy/monitoring")
    assert_on_the_server(control_plane, monitoring, "deploy/monitoring")
