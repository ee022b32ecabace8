"""Every supported Patroni release (3.0 to 4.1) gives the same decision (issue 32, item 3).

Test design: table-driven, plain values. The answers are ``tests/fixtures/patroni/`` (each
release's REST body, written from ``patroni/api.py`` at its tag: the README there cites the
lines), the Pods carry what that release's Kubernetes DCS writes on them
(``kubernetes-role-labels.json``: the ``role`` label, ``master`` in 3.x and ``primary`` in
4.x on the lock holder, primary or standby leader, and the ``status`` annotation's role). Each
release's status code on each health path is Patroni's own rule (``do_GET`` in
``patroni/api.py``: ``/primary`` and ``/master`` 200 only for the lock holder of a cluster that
is not a standby cluster, ``/leader`` for any lock holder, ``/standby-leader`` only for the lock
holder of a standby cluster). Every case goes through the whole sync (``reconcile``) and is
reduced to the decision: ``Ready``'s reason, what the primary Service selects,
``status.primary``, the read-only endpoints, the switchover detection's reason and the
members' roles. The decision must equal Patroni 4.1.4's for every release, except where a
release lacks a field (3.0.3: no ``replication_state``, so no replica is listed for reads,
checked explicitly).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hooks.domain.members import MemberStatus
from hooks.domain.model import LEADER_PATHS, POD_NAME_LABEL
from tests.child_helpers import children_of, condition, request_body, rs_spec
from tests.helpers import P0, P1, P2, SELECTOR, make_service, run

SHAPES = Path(__file__).parent / "fixtures" / "patroni"
LABELS: dict[str, Any] = json.loads((SHAPES / "kubernetes-role-labels.json").read_text())
VERSIONS = ("3.0.3", "3.1.2", "3.2.2", "3.3.10", "4.0.10", "4.1.4")
REFERENCE = "4.1.4"
LEADER = P1
#: (cluster kind, health path) for every leader path a spec may name.
CASES = [
    ("primary", "/primary"),
    ("primary", "/master"),
    ("primary", "/read-write"),
    ("primary", "/leader"),
    ("standby", "/leader"),
    ("standby", "/standby-leader"),
    ("standby", "/standby_leader"),
    # A path that does not fit the cluster: Patroni answers 503 everywhere, never routed.
    ("primary", "/standby-leader"),
    ("standby", "/primary"),
]


def test_the_fixtures_cover_every_release_and_role() -> None:
    assert set(LABELS) == set(VERSIONS)
    for version in VERSIONS:
        for role in ("primary", "replica", "standby_leader"):
            assert (SHAPES / f"patroni-{version}-{role}.json").is_file(), (version, role)


def body(version: str, role: str, name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SHAPES / f"patroni-{version}-{role}.json").read_text())
    if "name" in loaded["patroni"]:
        loaded["patroni"]["name"] = name
    return loaded


def patroni_status_code(kind: str, path: str, holder: bool) -> int:
    """Patroni's ``do_GET`` (api.py at v4.1.4, lines 339-366; same rule since 3.0)."""
    if not holder:
        return 503
    if "standby_leader" in path or "standby-leader" in path:
        return 200 if kind == "standby" else 503
    if "leader" in path:
        return 200
    return 200 if kind == "primary" else 503


def member_role(kind: str, name: str) -> str:
    if name != LEADER:
        return "replica"
    return "primary" if kind == "primary" else "standby_leader"


def pod(version: str, kind: str, name: str) -> dict[str, Any]:
    role = member_role(kind, name)
    annotation = {"state": "running", "role": LABELS[version]["status_annotation_role"][role]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "databases",
            "uid": f"uid-{name}",
            "labels": {
                **SELECTOR,
                POD_NAME_LABEL: name,
                "role": LABELS[version]["role_label"][role],
            },
            "annotations": {"status": json.dumps(annotation)},
        },
        "status": {"phase": "Running", "podIP": f"10.244.{name[-1]}.10"},
    }


def decision(version: str, kind: str, path: str) -> dict[str, Any]:
    names = (P0, P1, P2)
    answers = {
        name: MemberStatus.from_api_response(
            name,
            patroni_status_code(kind, path, name == LEADER),
            body(version, member_role(kind, name), name),
            health_path=path,
            leader_roles=LEADER_PATHS[path],
        )
        for name in names
    }
    spec = rs_spec()
    spec["healthCheckPath"] = path
    request = request_body(
        spec=spec,
        pods=[pod(version, kind, n) for n in names],
        services=[make_service(pod=P0)],  # the Service selects a replica before the sync
    )
    _, outcome = run(request, answers)
    status = outcome.body["status"]
    (service,) = [s for n, s in children_of(outcome, "Service").items() if "primary" in n]
    return {
        "ready": condition(outcome, "Ready")["reason"],
        "selects": service["spec"]["selector"][POD_NAME_LABEL],
        "primary": status.get("primary"),
        "read_only": status.get("replicaEndpoints"),
        "read_only_reason": condition(outcome, "ReplicasRouted")["reason"],
        "detection": condition(outcome, "SwitchoverDetection")["reason"],
        "roles": [(m["name"], m.get("role")) for m in status["members"]],
    }


@pytest.mark.parametrize(("kind", "path"), CASES)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_gives_the_decision_of_patroni_4_1(
    version: str, kind: str, path: str
) -> None:
    expected = decision(REFERENCE, kind, path)
    got = decision(version, kind, path)
    if version == "3.0.3" and expected["ready"] == "LeaderFound":
        # No replication_state before 3.0.4: streaming cannot be told from archive
        # recovery, so no replica is listed (the status says why: test_patroni_versions).
        assert (got.pop("read_only"), got.pop("read_only_reason")) == ([], "NoReplicaWithinLag")
        del expected["read_only"], expected["read_only_reason"]
    assert got == expected


@pytest.mark.parametrize(("kind", "path"), CASES)
def test_the_reference_decision_is_patronis_rule(kind: str, path: str) -> None:
    """What 4.1.4 (hence every release) decides, spelled out: the lock holder is routed on
    every path Patroni answers 200 for it, with the replicas for reads and the labels
    trusted; on a path that does not fit the cluster nothing moves."""
    got = decision(REFERENCE, kind, path)
    leader_role = member_role(kind, LEADER)
    if patroni_status_code(kind, path, holder=True) == 200:
        assert got == {
            "ready": "LeaderFound",
            "selects": LEADER,
            "primary": LEADER,
            "read_only": [P0, P2],
            "read_only_reason": "ReplicasWithinLag",
            "detection": "RoleLabelsAgree",
            "roles": [(P0, "replica"), (P1, leader_role), (P2, "replica")],
        }
    else:
        assert got["ready"] == "NoLeader" and got["selects"] == P0 and got["primary"] == P0
        assert got["read_only_reason"] == "LeaderNotConfirmed"
