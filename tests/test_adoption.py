"""``kubectl pgfh adopt``'s plan (pure), case by case, and what the patch does to a Service.

The plan is checked on plain objects shaped as the API server returns them. What the patch
then makes Metacontroller do is checked with the stand-in's copy of Metacontroller's
three-way merge (:mod:`testbed.metacontroller.dynamic_apply`, modelled on
``pkg/dynamic/apply/apply.go``):
with the record ``adopt`` writes, the hook's first reply leaves exactly its own selector (the
previous owner's ``role`` key removed) and keeps every other field; without the record the
old key would stay. The whole path against the real API server and Metacontroller is
tests/test_service_adoption_real.py; the CLI's refusals of bad arguments are here.
"""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest

from hooks.domain.model import CONTROLLER_UID_LABEL, LAST_APPLIED_ANNOTATION, POD_NAME_LABEL
from pgfh_plugin import adoption, cli
from testbed.metacontroller.dynamic_apply import apply_update

UID = "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"
SELECTOR = {"application": "patroni", "cluster-name": "pg-orders"}
SEED_SELECTOR = {**SELECTOR, "role": "master", POD_NAME_LABEL: "pg-orders-1"}
OPERATOR = {
    "apiVersion": "acid.example/v1",
    "kind": "PostgresCluster",
    "name": "orders",
    "uid": "uid-op",
    "controller": True,
}
PLAIN_OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "inventory", "uid": "uid-cm"}


def cluster(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": "pg-orders", "namespace": "databases", "uid": UID},
        "spec": {"primarySelector": SELECTOR, "serviceRef": {"name": "pg-orders-primary"}, **spec},
    }


def service(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "pg-orders-primary",
            "namespace": "databases",
            "uid": "uid-svc",
            "resourceVersion": "4711",
            "labels": {"app": "pg-orders"},
        },
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.9",
            "selector": dict(SEED_SELECTOR),
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP", "targetPort": 5432}],
        },
    }
    for key, value in changes.items():
        section, field = key.split("__")
        if value is None:
            obj[section].pop(field, None)
        else:
            obj[section][field] = value
    return obj


def ours() -> dict[str, Any]:
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "name": "pg-orders",
        "uid": UID,
        "controller": True,
    }


# ------------------------------------------------------------------------- the plan


def test_an_orphan_is_labelled_and_given_the_record_of_its_selector() -> None:
    planned = adoption.plan(cluster(), service(), force=False)
    assert not planned.refused and planned.notes == ()
    assert planned.patch is not None
    meta = planned.patch["metadata"]
    assert set(meta) == {"resourceVersion", "labels", "annotations"}, "nothing else changes"
    assert meta["resourceVersion"] == "4711", "conditional: a changed Service is a 409"
    assert meta["labels"] == {CONTROLLER_UID_LABEL: UID}
    record = json.loads(meta["annotations"][LAST_APPLIED_ANNOTATION])
    assert record == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "pg-orders-primary",
            "namespace": "databases",
            "labels": {CONTROLLER_UID_LABEL: UID},
        },
        "spec": {"selector": SEED_SELECTOR},
    }
    assert planned.message.startswith(f"Service pg-orders-primary labelled controller-uid={UID}")
    assert "until then it is unchanged" in planned.message


@pytest.mark.parametrize(
    ("svc", "message"),
    [
        (None, "no Service pg-orders-primary in namespace databases: the hook creates it"),
        (
            service(metadata__ownerReferences=[ours()]),
            "Service pg-orders-primary is already a child of PostgreSQLCluster databases/pg-orders",
        ),
    ],
)
def test_nothing_to_do(svc: dict[str, Any] | None, message: str) -> None:
    planned = adoption.plan(cluster(), svc, force=True)
    assert (planned.patch, planned.refused, planned.message) == (None, False, message)


@pytest.mark.parametrize("force", [False, True])
def test_refusals_that_force_does_not_lift(force: bool) -> None:
    deleting = adoption.plan(
        cluster(), service(metadata__deletionTimestamp="2026-12-04T10:00:00Z"), force=force
    )
    assert deleting.refused and deleting.patch is None
    assert "is being deleted" in deleting.message
    typed = adoption.plan(cluster(), service(spec__type="LoadBalancer"), force=force)
    assert typed.refused and typed.patch is None
    assert typed.message.startswith(
        "Service pg-orders-primary is of type LoadBalancer and the cluster's spec.service.type "
        "is ClusterIP"
    )
    assert "set spec.service.type: LoadBalancer first" in typed.message
    matching = adoption.plan(
        cluster(service={"type": "LoadBalancer"}), service(spec__type="LoadBalancer"), force=force
    )
    assert not matching.refused and matching.patch is not None
    broken = adoption.plan({"metadata": {"name": "x", "namespace": "y"}}, service(), force=force)
    assert (broken.patch, broken.refused) == (None, False)
    assert broken.message == "PostgreSQLCluster y/x has no UID or no spec.serviceRef.name"


def test_another_controllers_service_is_refused_unless_forced() -> None:
    owned = service(metadata__ownerReferences=[PLAIN_OWNER, OPERATOR])
    refused = adoption.plan(cluster(), owned, force=False)
    assert refused.refused and refused.patch is None
    assert refused.message.startswith(
        "Service pg-orders-primary is controlled by PostgresCluster orders (acid.example/v1): "
        "adopting it would make two controllers fight over its selector"
    )
    assert "run again with --force, which removes that controller reference" in refused.message
    forced = adoption.plan(cluster(), owned, force=True)
    assert not forced.refused and forced.patch is not None
    # Only the controller reference goes; a plain owner (garbage collection) stays.
    assert forced.patch["metadata"]["ownerReferences"] == [PLAIN_OWNER]
    assert forced.notes == (
        "removed the controller reference to PostgresCluster orders (acid.example/v1)",
    )


def test_a_plain_owner_is_no_controller_and_is_kept_untouched() -> None:
    planned = adoption.plan(
        cluster(), service(metadata__ownerReferences=[PLAIN_OWNER]), force=False
    )
    assert planned.patch is not None and "ownerReferences" not in planned.patch["metadata"]


@pytest.mark.parametrize("selector", [None, {}])
def test_a_service_without_a_selector_needs_force(selector: dict[str, str] | None) -> None:
    svc = service(spec__selector=selector) if selector is not None else service(spec__selector=None)
    refused = adoption.plan(cluster(), svc, force=False)
    assert refused.refused and "has no selector: its endpoints are written by someone else" in (
        refused.message
    )
    forced = adoption.plan(cluster(), svc, force=True)
    assert forced.patch is not None
    record = json.loads(forced.patch["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    assert record["spec"] == {"selector": {}}


def test_a_stale_controller_uid_label_is_replaced_and_said() -> None:
    svc = service(metadata__labels={CONTROLLER_UID_LABEL: "uid-of-a-deleted-cluster"})
    planned = adoption.plan(cluster(), svc, force=False)
    assert planned.patch is not None
    assert planned.patch["metadata"]["labels"] == {CONTROLLER_UID_LABEL: UID}
    assert planned.notes == (
        "replaced the label controller-uid=uid-of-a-deleted-cluster of another parent",
    )


# ------------------------------------------------------------------------- pinned


def test_pinned_only_when_ours_and_exactly_the_hooks_selector() -> None:
    c = cluster()
    mine = service(metadata__ownerReferences=[ours()])
    assert adoption.pinned(c, None) is None
    assert adoption.pinned(c, service()) is None, "not ours yet"
    assert adoption.pinned(c, mine) is None, "ours, but the old selector (role key)"
    mine["spec"]["selector"] = {**SELECTOR, POD_NAME_LABEL: "pg-orders-0"}
    assert adoption.pinned(c, mine) == "pg-orders-0"
    mine["spec"]["selector"]["extra"] = "x"
    assert adoption.pinned(c, mine) is None
    other = service(metadata__ownerReferences=[OPERATOR])
    other["spec"]["selector"] = {**SELECTOR, POD_NAME_LABEL: "pg-orders-0"}
    assert adoption.pinned(c, other) is None


# ------------------------------------------- what Metacontroller's merge then does


def _merge_patch(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies ``application/merge-patch+json``."""
    result = copy.deepcopy(obj)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merge_patch(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _hook_desired(pod: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "pg-orders-primary",
            "namespace": "databases",
            "labels": {
                "app.kubernetes.io/managed-by": "pg-failover-hook",
                CONTROLLER_UID_LABEL: UID,
            },
        },
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": "postgresql", "port": 5432, "targetPort": 5432}],
            "selector": {**SELECTOR, POD_NAME_LABEL: pod},
        },
    }


def test_with_the_record_the_first_sync_leaves_exactly_the_hooks_selector() -> None:
    planned = adoption.plan(cluster(), service(), force=False)
    assert planned.patch is not None
    adopted = _merge_patch(service(), planned.patch)
    adopted["metadata"]["ownerReferences"] = [ours()]  # Metacontroller's claim
    updated = apply_update(adopted, _hook_desired("pg-orders-0"))
    assert updated["spec"]["selector"] == {**SELECTOR, POD_NAME_LABEL: "pg-orders-0"}
    assert updated["metadata"]["labels"]["app"] == "pg-orders", "their label is kept"
    assert updated["spec"]["clusterIP"] == "10.96.0.9"
    assert [p["port"] for p in updated["spec"]["ports"]] == [5432]
    # Without the record, the previous owner's key would stay beside the hook's.
    bare = copy.deepcopy(adopted)
    del bare["metadata"]["annotations"]
    assert apply_update(bare, _hook_desired("pg-orders-0"))["spec"]["selector"]["role"] == "master"


def test_in_doubt_the_echo_of_the_record_changes_nothing() -> None:
    from hooks.core.keeping import preserved
    from hooks.loaders.observed import load_child

    planned = adoption.plan(cluster(), service(), force=False)
    assert planned.patch is not None
    adopted = _merge_patch(service(), planned.patch)
    adopted["metadata"]["ownerReferences"] = [ours()]
    echo = preserved(load_child("Service.v1", "pg-orders-primary", adopted), namespace="databases")
    assert apply_update(adopted, echo)["spec"] == adopted["spec"]


# ------------------------------------------------------------------------- the CLI


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err, environ={})
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (("adopt",), "error: adopt needs the NAME of one PostgreSQLCluster\n"),
        (("adopt", "-A"), "error: adopt needs the NAME of one PostgreSQLCluster\n"),
        (("adopt", "pg", "-A"), "error: a NAME cannot be combined with -A\n"),
        (("adopt", "pg", "--wait", "601"), "error: --wait must be between 0 and 600 seconds\n"),
        (("adopt", "pg", "--wait", "-1"), "error: --wait must be between 0 and 600 seconds\n"),
    ],
)
def test_bad_arguments_are_refused_before_any_request(argv: tuple[str, ...], error: str) -> None:
    assert run(*argv, "--color", "never", "--kubeconfig", "/nonexistent") == (2, "", error)
