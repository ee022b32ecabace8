"""Offline checks of what the read-only Service and the backups add to the manifests.

Test design notes:

* The children the hook *emits* are Kubernetes objects too: sample replies (every child kind,
  every shape: a listed slice, an empty one, IPv6, a suspended CronJob) are rendered from
  the full example CR and validated with kubernetes-validate, strict, against Kubernetes 1.32,
  like tests/test_manifests.py validates what ``kubectl kustomize`` renders. A negative
  control proves the strict check fails on an unknown field.
* The CRD's new fields and the hook's marshmallow schema must agree on what is valid: a
  table of values is run through both (jsonschema on the CRD after the API server's
  defaulting; ``load_spec`` for the hook), and both must accept or both refuse.
* The CRD's defaults for the new groups are the hook's own defaults.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from hooks.schemas import load_spec
from tests.child_helpers import (
    MIB,
    answer,
    backup_fields,
    children_of,
    cluster_answers,
    observed,
    request_body,
    rs_spec,
)
from tests.helpers import P0, P1, P2, make_pod, run
from tests.test_manifests import (
    EXAMPLE_FULL,
    K8S_VERSION,
    K8S_VERSIONS,
    crd_schema,
    load_one,
    pruned_fields,
    validate_cr,
    with_defaults,
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


# ------------------------------------------------------------- CRD ⇔ marshmallow


def cr(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": "pg-orders", "namespace": "databases"},
        "spec": spec,
    }


def _replica(**fields: Any) -> dict[str, Any]:
    return rs_spec(**fields)


def _backup(**fields: Any) -> dict[str, Any]:
    spec = rs_spec()
    spec["backup"] = backup_fields(**fields)
    return spec


VALUES = [
    ("defaults", rs_spec(), True),
    ("whenNoReplica UseLeader", _replica(whenNoReplica="UseLeader"), True),
    ("whenNoReplica Empty", _replica(whenNoReplica="Empty"), True),
    ("whenNoReplica Sometimes", _replica(whenNoReplica="Sometimes"), False),
    ("maxLagBytes 0", _replica(maxLagBytes=0), True),
    ("maxLagBytes -1", _replica(maxLagBytes=-1), False),
    ("maxLagBytes a string", _replica(maxLagBytes="16MB"), False),
    ("maxLagBytes 1.5", _replica(maxLagBytes=1.5), False),
    ("name upper case", _replica(name="Pg-RO"), False),
    ("type ExternalName", _replica(type="ExternalName"), False),
    ("no name", {**rs_spec(), "replicaService": {}}, False),
    ("backup", _backup(), True),
    ("@daily", _backup(schedule="@daily"), True),
    ("steps and lists", _backup(schedule="*/15 1,2 * JAN-MAR MON-FRI"), True),
    ("four fields", _backup(schedule="0 3 * *"), False),
    ("TZ prefix", _backup(schedule="TZ=UTC 0 3 * * *"), False),
    ("@every", _backup(schedule="@every 1h"), False),
    ("image with a space", _backup(image="postgres 18"), False),
    ("pvc upper case", _backup(pvcName="Backups"), False),
    ("secret dotted", _backup(secretName="pg.repl"), True),
    ("keep 0", _backup(keep=0), False),
    ("keep 101", _backup(keep=101), False),
    ("runAsUser 0", _backup(runAsUser=0), False),
    ("deadline 59", _backup(activeDeadlineSeconds=59), False),
    ("quantities", _backup(resources={"requests": {"cpu": "250m", "memory": 1024}}), True),
    ("quantity 1e3", _backup(resources={"limits": {"cpu": "1e3"}}), True),
    ("negative quantity", _backup(resources={"limits": {"cpu": "-1"}}), False),
    ("quantity word", _backup(resources={"limits": {"memory": "lots"}}), False),
    ("quantity float", _backup(resources={"limits": {"cpu": 0.5}}), False),
    (
        "no schedule",
        {**rs_spec(), "backup": {"image": "i", "pvcName": "p", "secretName": "s"}},
        False,
    ),
]


@pytest.mark.parametrize(("what", "spec", "valid"), VALUES, ids=[v[0] for v in VALUES])
def test_the_crd_and_the_hook_agree_on_the_new_fields(
    what: str, spec: dict[str, Any], valid: bool
) -> None:
    import jsonschema

    schema = crd_schema()
    try:
        validate_cr(with_defaults(cr(spec), schema), schema)
        crd_valid = True
    except jsonschema.ValidationError:
        crd_valid = False
    loaded, problems = load_spec(spec)
    assert (crd_valid, loaded is not None) == (valid, valid), problems


@pytest.mark.parametrize(
    ("what", "spec"),
    [
        ("replica name is the primary's", _replica(name="pg-orders-primary")),
        ("replica name is Patroni's config", _replica(name="pg-orders-config")),
        ("label value spaced", _replica(labels={"a": "b c"})),
    ],
)
def test_rules_only_the_hook_checks(what: str, spec: dict[str, Any]) -> None:
    """Rules the CRD schema does not express (as for spec.service): the hook reports them
    in SpecValid and keeps every child as it is."""
    schema = crd_schema()
    validate_cr(with_defaults(cr(spec), schema), schema)
    loaded, problems = load_spec(spec)
    assert loaded is None
    assert [p.field for p in problems] == ["spec.replicaService"]


def test_the_crd_defaults_the_new_groups_like_the_hook() -> None:
    spec = _backup()
    schema = crd_schema()
    defaulted = with_defaults(cr(spec), schema)["spec"]
    assert defaulted["replicaService"] == {
        "name": "pg-orders-replicas",
        "maxLagBytes": 16 * MIB,
        "whenNoReplica": "KeepEndpoints",
        "includePausedReplicas": False,
        "type": "ClusterIP",
    }
    assert {k: v for k, v in defaulted["backup"].items() if k not in spec["backup"]} == {
        "keep": 3,
        "runAsUser": 999,
        "activeDeadlineSeconds": 21600,
    }
    assert load_spec(spec) == load_spec(defaulted)
    assert pruned_fields(cr(defaulted), schema) == []
