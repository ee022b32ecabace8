"""Offline checks of every child the hook emits, against Kubernetes' own schemas.

Test design: the children the hook *emits* are Kubernetes objects too: sample replies
(every child kind, every shape: the primary and read-only Services, a listed slice, an
empty one, IPv6, a suspended CronJob) are rendered from the full example CR and validated
with kubernetes-validate, strict, against every Kubernetes version tests/test_manifests_*.py
validates the rendered manifests for. A negative control proves the strict check fails on
an unknown field.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.child_helpers import (
    MIB,
    answer,
    children_of,
    cluster_answers,
    observed,
    request_body,
)
from tests.helpers import P0, P1, P2, make_pod, run
from tests.manifest_helpers import (
    EXAMPLE_FULL,
    K8S_VERSION,
    K8S_VERSIONS,
    load_one,
)


def full_example_spec() -> dict[str, Any]:
    spec: dict[str, Any] = load_one(EXAMPLE_FULL)["spec"]
    # The example CR describes another cluster; point it at the test Pods' labels.
    spec["primarySelector"] = {"application": "patroni", "cluster-name": "pg-orders"}
    spec["healthCheckPath"] = "/primary"
    return spec


def patroni_pod(name: str, ip: str | None = None) -> dict[str, Any]:
    pod = make_pod(name) if ip is None else make_pod(name, ip=ip)
    pod["spec"] = {
        "nodeName": "kind-worker",
        "containers": [
            {
                "name": "patroni",
                "ports": [
                    {"name": "postgresql", "containerPort": 5432},
                    {"name": "patroni", "containerPort": 8008},
                ],
            }
        ],
    }
    return pod


def sample_children() -> list[tuple[str, dict[str, Any]]]:
    """Every kind and shape of child the hook emits, from the full example spec."""
    spec = full_example_spec()
    samples: list[tuple[str, dict[str, Any]]] = []
    pods = [patroni_pod(n) for n in (P0, P1, P2)]
    body = request_body(spec=spec, pods=pods)
    _, outcome = run(body, cluster_answers(P0))
    samples += [(f"routed {c['kind']}", c) for c in outcome.body["children"]]

    lagging = cluster_answers(
        P0, pg_orders_1=answer(P1, behind=64 * MIB), pg_orders_2=answer(P2, behind=64 * MIB)
    )
    empty_spec = copy.deepcopy(spec)
    empty_spec["replicaService"]["whenNoReplica"] = "Empty"
    _, outcome = run(request_body(spec=empty_spec, pods=pods), lagging)
    samples += [
        ("empty slice", c) for c in outcome.body["children"] if c["kind"] == "EndpointSlice"
    ]

    v6 = [patroni_pod(n, f"fd00:10:244::{i + 1}") for i, n in enumerate((P0, P1, P2))]
    _, outcome = run(request_body(spec=spec, pods=v6), cluster_answers(P0))
    samples += [("IPv6 slice", c) for c in outcome.body["children"] if c["kind"] == "EndpointSlice"]

    stored = observed(*children_of(outcome, "CronJob").values())
    without = copy.deepcopy(spec)
    del without["backup"], without["replicaService"]
    _, outcome = run(request_body(spec=without, pods=pods, cronjobs=stored), cluster_answers(P0))
    samples += [
        ("suspended CronJob", c) for c in outcome.body["children"] if c["kind"] == "CronJob"
    ]
    return samples


SAMPLES = sample_children()


def test_the_samples_cover_every_child_kind_and_shape() -> None:
    kinds = sorted({c["kind"] for _, c in SAMPLES})
    assert kinds == ["CronJob", "EndpointSlice", "Service"]
    assert any(c.get("endpoints") is None for _, c in SAMPLES if c["kind"] == "EndpointSlice")
    assert any(c.get("addressType") == "IPv6" for _, c in SAMPLES)
    assert any(c["spec"].get("suspend") is True for _, c in SAMPLES if c["kind"] == "CronJob")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("what", "child"), SAMPLES, ids=[w for w, _ in SAMPLES])
def test_every_emitted_child_validates_strictly(
    what: str, child: dict[str, Any], version: str
) -> None:
    obj = copy.deepcopy(child)
    # What Metacontroller adds before it creates the object.
    obj["metadata"].setdefault("labels", {})["controller-uid"] = "6f1d8c3e"
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path)
        pytest.fail(f"{what} is invalid for Kubernetes {version}: {where}: {error.message}")


def test_strict_validation_negative_control() -> None:
    slice_ = next(copy.deepcopy(c) for _, c in SAMPLES if c["kind"] == "EndpointSlice")
    slice_["endpoints"][0]["targetReference"] = slice_["endpoints"][0].pop("targetRef")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(slice_, K8S_VERSION, strict=True)


def test_the_example_slice_resolves_the_named_target_port() -> None:
    slice_ = next(c for w, c in SAMPLES if w == "routed EndpointSlice")
    assert slice_["ports"] == [
        {"name": "postgresql", "port": 5432, "protocol": "TCP"},
        {"name": "exporter", "port": 9187, "protocol": "TCP"},
    ]
