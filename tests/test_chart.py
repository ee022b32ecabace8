"""The Helm chart (charts/pg-failover-hook/) renders what deploy/ renders (issue 32, item 4).

The chart is written by ``python -m ops.chart`` from ``kubectl kustomize`` of deploy/ and its
overlays; these tests prove, with the pinned helm (built from its Go module like the control
plane's programs, ``testbed/kubernetes/go/helm``), that

* the chart on disk is what the generator makes of today's deploy/ (a change to deploy/ without
  ``python -m ops.chart`` fails here);
* ``helm template`` with the defaults gives exactly the objects of ``kubectl kustomize deploy``,
  and each overlay's values exactly that overlay's objects (parsed and compared whole; the one
  deliberate difference, the CRD's keep annotation, is named and checked);
* ``helm lint --strict`` passes, and invalid values fail ``helm template`` with a message that
  names the value.

The real API server's side (server-side dry run, install and upgrade) is in
tests/test_chart_real.py.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops import chart
from testbed.kubernetes import binaries
from testbed.kubernetes.binaries import ensure_helm, pinned_version
from tests.manifest_helpers import REPO, kubectl, rendered, with_component

CHART = REPO / "charts" / "pg-failover-hook"


@functools.cache
def helm() -> str:
    return str(ensure_helm(log=lambda line: print(f"\n{line}", flush=True)))


def helm_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False)


def template(*settings: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``--set`` settings, as parsed objects."""
    args = [arg for setting in settings for arg in ("--set", setting)]
    result = helm_run("template", "pg-failover-hook", str(CHART), *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def settings_of(values: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += settings_of(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    keyed = {chart.key_of(o): o for o in objects}
    assert len(keyed) == len(objects), "two objects with the same kind, namespace and name"
    return keyed


def without_keep(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's objects less the CRD's keep annotation (checked present, then removed)."""
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] == "CustomResourceDefinition":
            assert obj["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    return out


def test_the_helm_is_the_pinned_one() -> None:
    result = helm_run("version", "--template", "{{ .Version }}")
    assert result.stdout == pinned_version("helm", "helm.sh/helm/v4")


def test_the_chart_is_what_the_generator_makes_of_deploy() -> None:
    lines: list[str] = []
    assert chart.main(["--check", "--kubectl", kubectl()], out=lines.append) == 0, "\n".join(lines)


def test_a_stale_chart_fails_the_check(tmp_path: Path) -> None:
    """The negative control: a chart whose Deployment was edited by hand is found stale."""
    copy_of = tmp_path / "chart"
    chart.write(chart.chart_files(kubectl()), copy_of)
    deployment = next((copy_of / "templates").glob("*-deployment-pg-failover-hook.yaml"))
    deployment.write_text(deployment.read_text().replace("maxSurge: 1", "maxSurge: 2"))
    (copy_of / "templates" / "99-extra.yaml").write_text("")
    lines: list[str] = []
    assert chart.main(["--check", "--kubectl", kubectl(), "--chart", str(copy_of)], lines.append)
    text = "\n".join(lines)
    assert re.search(r"^-\s+maxSurge: 2$", text, re.MULTILINE), text
    assert re.search(r"^\+\s+maxSurge: 1$", text, re.MULTILINE), text
    assert "not generated (stale): templates/99-extra.yaml" in text
    assert text.endswith("run `python -m ops.chart` and commit the result")


@pytest.mark.parametrize("variant", chart.VARIANTS, ids=lambda v: v.name)
def test_each_values_choice_renders_exactly_its_kustomize_target(variant: chart.Variant) -> None:
    helm_objects = without_keep(template(*settings_of(dict(variant.values))))
    kustomize_objects = rendered(variant.target)
    ours, theirs = by_key(helm_objects), by_key(kustomize_objects)
    assert sorted(ours) == sorted(theirs)
    for key, obj in theirs.items():
        assert ours[key] == obj, f"{key} differs between helm and kubectl kustomize"


@pytest.mark.parametrize("variant", chart.VARIANTS, ids=lambda v: v.name)
def test_large_install_renders_its_target_with_the_large_install_component(
    variant: chart.Variant, tmp_path: Path
) -> None:
    """``largeInstall=true`` with each values choice: exactly its kustomize target with
    deploy/large-install/ as a component; deploy/sharding/ as it is (each shard already uses
    it, and kustomize refuses to remove a field that is not there)."""
    target = variant.target
    if variant.name != "sharding":
        target = with_component(variant.target, "deploy/large-install", tmp_path)
    settings = [*settings_of(dict(variant.values)), "largeInstall=true"]
    ours = by_key(without_keep(template(*settings)))
    theirs = by_key(rendered(target))
    assert sorted(ours) == sorted(theirs)
    for key, obj in theirs.items():
        assert ours[key] == obj, f"{key} differs between helm and kubectl kustomize"
    controllers = [o for o in theirs.values() if o["kind"] == "CompositeController"]
    assert controllers and all("resyncPeriodSeconds" not in o["spec"] for o in controllers)


def test_the_comparison_sees_a_changed_field() -> None:
    """The negative control of the test above: one value away from the defaults, one field of
    one object differs, and the comparison says so."""
    ours = by_key(without_keep(template("image.tag=0.1.1")))
    theirs = by_key(rendered("deploy"))
    differing = [key for key in theirs if ours[key] != theirs[key]]
    assert differing == [("apps", "Deployment", "pg-failover-hook", "pg-failover-hook")]


def test_helm_has_a_cache_key_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding helm did not rebuild the control plane: a change of go/helm changes helm's key
    only, and the control plane's key never reads go/helm."""
    go_dir = tmp_path / "go"
    shutil.copytree(binaries.GO_DIR, go_dir)
    monkeypatch.setattr(binaries, "GO_DIR", go_dir)
    before = (binaries.cache_key("go"), binaries.cache_key("go", binaries.HELM_PROGRAMS))
    (go_dir / "helm" / "go.sum").write_text("changed\n")
    after = (binaries.cache_key("go"), binaries.cache_key("go", binaries.HELM_PROGRAMS))
    assert after[0] == before[0]
    assert after[1] != before[1]
    assert before[0] != before[1]


def test_the_crd_keep_annotation_is_the_only_difference_and_can_be_turned_off() -> None:
    kept = by_key(template())
    crd_key = next(k for k in kept if k[1] == "CustomResourceDefinition")
    assert kept[crd_key]["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    plain = by_key(template("crd.keep=false"))
    assert "annotations" not in plain[crd_key]["metadata"]
    assert plain == by_key(rendered("deploy"))


def test_the_values_set_what_they_name() -> None:
    objects = by_key(
        template(
            "image.repository=registry.example/team/pgfh",
            "image.tag=0.2.0",
            "image.pullPolicy=Always",
            "resources.limits.memory=512Mi",
            "autoscaling.minReplicas=4",
            "autoscaling.maxReplicas=12",
            "nodeSelector.pool=system",
            "priorityClassName=system-cluster-critical",
            "createNamespace=false",
            "mtls.mode=transition",
        )
    )
    deployment = objects[("apps", "Deployment", "pg-failover-hook", "pg-failover-hook")]
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["hook-tls", "hook"]
    for container in pod["containers"]:
        assert container["image"] == "registry.example/team/pgfh:0.2.0"
        assert container["imagePullPolicy"] == "Always"
        assert container["resources"] == {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert "tolerations" not in pod
    hpa = objects[
        ("autoscaling", "HorizontalPodAutoscaler", "pg-failover-hook", "pg-failover-hook")
    ]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (4, 12)
    assert not [k for k in objects if k[1] == "Namespace"]


def test_helm_lint_is_clean() -> None:
    result = helm_run("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("mtls.mode=maybe", "at '/mtls/mode': value must be one of 'off', 'transition', 'on'"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of"),
        ("autoscaling.minReplicas=0", "at '/autoscaling/minReplicas': minimum: got 0, want 1"),
        ("autoscaling.maxReplicas=ten", "at '/autoscaling/maxReplicas': got string, want integer"),
        ("events.enabled=yes", "at '/events/enabled': got string, want boolean"),
        ("evnets.enabled=true", "additional properties 'evnets' not allowed"),
        ("image.tag=", "at '/image/tag': minLength: got 0, want 1"),
        ("resources.limits.memory=lots", "at '/resources/limits/memory': 'lots' does not match"),
    ],
)
def test_an_invalid_value_fails_with_a_message_naming_it(setting: str, message: str) -> None:
    result = helm_run("template", "x", str(CHART), "--set", setting)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["events.enabled=true", "mtls.mode=on"],
            "pg-failover-hook: events.enabled=true, mtls.mode=on: choose at most one of "
            "events.enabled, mtls.mode (not off) and sharding.enabled",
        ),
        (
            ["sharding.enabled=true", "mtls.mode=transition"],
            "pg-failover-hook: mtls.mode=transition, sharding.enabled=true: choose at most one",
        ),
        (
            ["autoscaling.minReplicas=5", "autoscaling.maxReplicas=3"],
            "pg-failover-hook: autoscaling.minReplicas (5) is greater than "
            "autoscaling.maxReplicas (3)",
        ),
    ],
)
def test_values_that_contradict_each_other_fail_by_name(settings: list[str], message: str) -> None:
    args = [arg for setting in settings for arg in ("--set", setting)]
    result = helm_run("template", "x", str(CHART), *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_values_yaml_documents_every_value() -> None:
    """Every key of values.yaml has a comment above it (or above its group), and the schema
    knows exactly the keys values.yaml has."""
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    top = [i for i, line in enumerate(lines) if line and line[0].isalpha()]
    for index in top:
        assert lines[index - 1].startswith("#") or lines[index - 1][0].isalpha(), lines[index]
    values = yaml.safe_load(text)
    schema = chart.schema()
    assert set(values) == set(schema["properties"])


def test_an_invalid_value_fails_helm_install_too(tmp_path: Path) -> None:
    """``helm install`` checks the schema before it talks to any server (no kubeconfig here)."""
    result = subprocess.run(
        [helm(), "install", "pg-failover-hook", str(CHART), "--dry-run=client",
         "--set", "mtls.mode=maybe"],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
             "KUBECONFIG": str(tmp_path / "none")},
    )  # fmt: skip
    assert result.returncode != 0
    assert "INSTALLATION FAILED: values don't meet the specifications" in result.stderr
    assert "at '/mtls/mode': value must be one of 'off', 'transition', 'on'" in result.stderr
