"""The CRD and the hook's marshmallow schema agree on ``spec.replicaService`` and
``spec.backup``.

Test design: a table of values is run through both (jsonschema on the CRD after the API
server's defaulting; ``load_spec`` for the hook), and both must accept or both refuse; the
cross-field rules are CEL in the CRD, which this model does not run (the real API server does,
in tests/test_crd_real.py); and the CRD's defaults for the two groups are the hook's own
defaults.
"""

from __future__ import annotations

from typing import Any

import pytest

from hooks.loaders.schemas import load_spec
from tests.child_helpers import MIB, backup_fields, rs_spec
from tests.manifest_helpers import crd_schema, pruned_fields, validate_cr, with_defaults


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
    ("consistency lag", _replica(consistency="lag"), True),
    ("consistency synchronous", _replica(consistency="synchronous"), True),
    ("consistency quorum", _replica(consistency="quorum"), True),
    ("consistency sync", _replica(consistency="sync"), False),
    ("consistency Quorum", _replica(consistency="Quorum"), False),
    ("trafficDistribution PreferSameZone", _replica(trafficDistribution="PreferSameZone"), True),
    ("trafficDistribution PreferClose", _replica(trafficDistribution="PreferClose"), True),
    ("trafficDistribution PreferSameNode", _replica(trafficDistribution="PreferSameNode"), False),
    ("trafficDistribution lowercase", _replica(trafficDistribution="prefersamezone"), False),
    ("maxLagBytes 0", _replica(maxLagBytes=0), True),
    ("maxLagBytes -1", _replica(maxLagBytes=-1), False),
    ("maxLagBytes a string", _replica(maxLagBytes="16MB"), False),
    ("maxLagBytes 1.5", _replica(maxLagBytes=1.5), False),
    ("name upper case", _replica(name="Pg-RO"), False),
    ("type ExternalName", _replica(type="ExternalName"), False),
    ("label value spaced", _replica(labels={"a": "b c"}), False),
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
    ],
)
def test_cross_field_rules_are_cel_rules_of_the_crd(what: str, spec: dict[str, Any]) -> None:
    """Cross-field rules are the CRD's ``x-kubernetes-validations`` (CEL), which this offline
    model does not evaluate: it accepts the spec, the hook refuses it (SpecValid), and the real
    API server refuses it too (tests/test_crd_real.py, the same specs)."""
    schema = crd_schema()
    validate_cr(with_defaults(cr(spec), schema), schema)
    rules = [r["fieldPath"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]]
    assert ".replicaService.name" in rules
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
        "consistency": "lag",
        "type": "ClusterIP",
    }
    assert {k: v for k, v in defaulted["backup"].items() if k not in spec["backup"]} == {
        "keep": 3,
        "runAsUser": 999,
        "activeDeadlineSeconds": 21600,
    }
    assert load_spec(spec) == load_spec(defaulted)
    assert pruned_fields(cr(defaulted), schema) == []
