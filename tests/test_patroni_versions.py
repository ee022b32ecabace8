"""Each supported Patroni release's answer shape, through the real app (issue 10).

Test design: the bodies in ``tests/fixtures/patroni/`` are Patroni 3.0.3, 3.1.2, 3.2.2,
3.3.10, 4.0.10 and 4.1.4's answers, written from ``patroni/api.py`` at those tags (see the
README there). Three loopback fake members (127.0.0.10-12) answer them byte for byte, with
Patroni's status codes (200 for the lock holder, 503 for the others); the sync goes through
``create_app`` with the real prober, as in ``test_app_faults``. What each release lacks must
show in the status, never silently: before 3.0.4 no ``replication_state`` (the read-only
Service lists none of those replicas and says why), before 3.2.0 no ``patroni.name``
(``MemberNameGuard`` is ``Unavailable``). Patroni's own read-traffic rules,
``noloadbalance`` and paused replay, are checked on the newest shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from hooks.domain.model import ResyncTiming
from hooks.patroni import PatroniProber
from hooks.probe.policy import ProbePolicy, parse_networks, parse_ports
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.fakes import patroni as fakes
from testbed.fakes.patroni import Behaviour, FakeCluster
from tests.helpers import NO_AUTH, NOW, fixture

SHAPES = Path(__file__).parent / "fixtures" / "patroni"
DEADLINE = 1.0
CAP = 64 * 1024
PODS = ("pg-orders-0", "pg-orders-1", "pg-orders-2")
LEADER = "pg-orders-1"
READ_ONLY = "pg-orders-replicas"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
LOOPBACK_FAKES = ProbePolicy(
    allowed_ports=parse_ports("1024-65535"), allowed_networks=parse_networks("127.0.0.0/8")
)


def shape(version: str, role: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((SHAPES / f"patroni-{version}-{role}.json").read_text())
    return body


@pytest.fixture
def hook() -> Iterator[FlaskClient]:
    prober = PatroniProber(deadline=DEADLINE, max_body_bytes=CAP, policy=LOOPBACK_FAKES)
    settings = HookSettings(
        probe_deadline=DEADLINE,
        max_probe_body_bytes=CAP,
        resync=ResyncTiming(healthy=1.0, degraded=0.3),
        probe_policy=LOOPBACK_FAKES,
        auth=NO_AUTH,
    )
    app: Flask = create_app(settings=settings, prober=prober, clock=lambda: NOW)
    app.config["TESTING"] = True
    yield app.test_client()


@pytest.fixture
def serve() -> Iterator[Callable[[Sequence[dict[str, Any]]], FakeCluster]]:
    """Members pg-orders-0..2 answering these bodies (200 for the leader, 503 otherwise)."""
    clusters: list[FakeCluster] = []

    def start(bodies: Sequence[dict[str, Any]]) -> FakeCluster:
        cluster = FakeCluster(len(bodies))
        clusters.append(cluster)
        behaviours: list[Behaviour] = [
            fakes.recorded(200 if name == LEADER else 503, json.dumps(body))
            for name, body in zip(PODS, bodies, strict=True)
        ]
        cluster.start(behaviours, PODS)
        return cluster

    yield start
    for cluster in clusters:
        cluster.close()


def members_of(version: str) -> list[dict[str, Any]]:
    """The three answers of a release, each member under its own name (if it sends one)."""
    bodies = []
    for name in PODS:
        body = shape(version, "primary" if name == LEADER else "replica")
        if "name" in body["patroni"]:
            body["patroni"]["name"] = name
        bodies.append(body)
    return bodies


def sync(
    hook: FlaskClient, cluster: FakeCluster, path: str = "/primary", **replica_service: Any
) -> dict[str, Any]:
    body = fixture("sync-service-selects-old-leader.json")  # the Service selects pg-orders-0
    for name, host in zip(PODS, cluster.hosts, strict=True):
        body["related"]["Pod.v1"][name]["status"]["podIP"] = host
        body["related"]["Pod.v1"][name]["status"]["podIPs"] = [{"ip": host}]
    body["parent"]["spec"].update(
        healthCheckPath=path,
        patroni={"port": cluster.port},
        replicaService={"name": READ_ONLY, **replica_service},
    )
    response = hook.post("/sync", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.data
    reply: dict[str, Any] = response.get_json()
    return reply


def condition(reply: dict[str, Any], type_: str) -> dict[str, Any]:
    (found,) = [c for c in reply["status"]["conditions"] if c["type"] == type_]
    return found


def primary_selects(reply: dict[str, Any]) -> str:
    (service,) = [
        c
        for c in reply["children"]
        if c["kind"] == "Service" and c["metadata"]["name"] == "pg-orders-primary"
    ]
    selected: str = service["spec"]["selector"][POD_NAME_LABEL]
    return selected


@pytest.mark.parametrize("version", ["3.0.3", "3.1.2", "3.2.2", "3.3.10", "4.0.10", "4.1.4"])
@pytest.mark.parametrize("path", ["/primary", "/master"])
def test_every_supported_release_is_routed_to_its_leader(
    hook: FlaskClient,
    serve: Callable[[Sequence[dict[str, Any]]], FakeCluster],
    version: str,
    path: str,
) -> None:
    reply = sync(hook, serve(members_of(version)), path)

    assert condition(reply, "Ready")["reason"] == "LeaderFound"
    assert primary_selects(reply) == LEADER
    status = reply["status"]
    assert status["primary"] == LEADER and status["timeline"] == 2
    assert [(m["name"], m.get("role")) for m in status["members"]] == [
        ("pg-orders-0", "replica"),
        ("pg-orders-1", "primary"),  # Patroni 3's "master", in Patroni 4's word
        ("pg-orders-2", "replica"),
    ]
    assert status["membersAnswered"] == "3/3"
    assert condition(reply, "MembersReachable")["reason"] == "AllMembersAnswered"


def test_patroni_3_0_3_replicas_are_left_out_and_the_status_says_why(
    hook: FlaskClient, serve: Callable[[Sequence[dict[str, Any]]], FakeCluster]
) -> None:
    reply = sync(hook, serve(members_of("3.0.3")))

    assert reply["status"]["replicaEndpoints"] == []
    routed = condition(reply, "ReplicasRouted")
    assert (routed["status"], routed["reason"]) == ("False", "NoReplicaWithinLag")
    why = "Patroni 3.0.3 reports no replication_state (since 3.0.4)"
    assert f"pg-orders-0 ({why}), pg-orders-2 ({why})" in routed["message"]


@pytest.mark.parametrize("version", ["3.1.2", "3.2.2", "3.3.10", "4.0.10", "4.1.4"])
def test_from_3_2_the_streaming_replicas_are_listed(
    hook: FlaskClient, serve: Callable[[Sequence[dict[str, Any]]], FakeCluster], version: str
) -> None:
    reply = sync(hook, serve(members_of(version)))

    assert reply["status"]["replicaEndpoints"] == ["pg-orders-0", "pg-orders-2"]
    assert condition(reply, "ReplicasRouted")["reason"] == "ReplicasWithinLag"


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (
            "3.0.3",
            (
                "False",
                "Unavailable",
                "No patroni.name in the answer (Patroni 3.0.3 on pg-orders-0, pg-orders-1, "
                "pg-orders-2; Patroni reports it since 3.2.0): memberNameMustMatchPod cannot "
                "check these members",
            ),
        ),
        ("3.2.2", ("True", "Active", None)),
        ("4.1.4", ("True", "Active", None)),
    ],
)
def test_the_member_name_guard_says_when_patroni_cannot_support_it(
    hook: FlaskClient,
    serve: Callable[[Sequence[dict[str, Any]]], FakeCluster],
    version: str,
    expected: tuple[str, str, str | None],
) -> None:
    guard = condition(sync(hook, serve(members_of(version))), "MemberNameGuard")
    assert (guard["status"], guard["reason"]) == expected[:2]
    if expected[2] is not None:
        assert guard["message"] == expected[2]


def test_a_member_tagged_noloadbalance_is_kept_out_of_read_traffic(
    hook: FlaskClient, serve: Callable[[Sequence[dict[str, Any]]], FakeCluster]
) -> None:
    bodies = members_of("4.1.4")
    # How Patroni reports it: the configured tag, under "tags" (Tags._filter_tags).
    bodies[2]["tags"] = {"noloadbalance": True}
    reply = sync(hook, serve(bodies))

    assert reply["status"]["replicaEndpoints"] == ["pg-orders-0"]
    assert (
        "left out: pg-orders-2 (tagged noloadbalance)"
        in condition(reply, "ReplicasRouted")["message"]
    )
    assert primary_selects(reply) == LEADER


@pytest.mark.parametrize(
    ("include", "listed"),
    [(None, ["pg-orders-2"]), (False, ["pg-orders-2"]), (True, ["pg-orders-0", "pg-orders-2"])],
    ids=["default", "false", "true"],
)
def test_a_replica_with_paused_replay_is_left_out_unless_the_spec_keeps_it(
    hook: FlaskClient,
    serve: Callable[[Sequence[dict[str, Any]]], FakeCluster],
    include: bool | None,
    listed: list[str],
) -> None:
    bodies = members_of("4.1.4")
    bodies[0]["xlog"]["paused"] = True
    extra = {} if include is None else {"includePausedReplicas": include}
    reply = sync(hook, serve(bodies), **extra)

    assert reply["status"]["replicaEndpoints"] == listed
    message = condition(reply, "ReplicasRouted")["message"]
    assert ("pg-orders-0 (replay paused)" in message) is (include is not True)


def with_sync_states(version: str, states: dict[str, str]) -> list[dict[str, Any]]:
    """The release's answers with the leader's ``replication[].sync_state`` set by name."""
    bodies = members_of(version)
    leader = bodies[PODS.index(LEADER)]
    for row in leader["replication"]:
        row["sync_state"] = states.get(row["application_name"], row["sync_state"])
    return bodies


@pytest.mark.parametrize("version", ["3.2.2", "4.1.4"])
def test_synchronous_reads_list_the_sync_standby_on_every_release_since_3_2(
    hook: FlaskClient, serve: Callable[[Sequence[dict[str, Any]]], FakeCluster], version: str
) -> None:
    """Patroni 3.x and 4.x send ``replication`` with ``sync_state`` on the health path."""
    bodies = with_sync_states(version, {"pg-orders-2": "sync", "pg-orders-0": "potential"})
    reply = sync(hook, serve(bodies), consistency="synchronous")
    assert reply["status"]["replicaEndpoints"] == ["pg-orders-2"]
    assert reply["status"]["replicaLevels"] == {"pg-orders-0": "potential", "pg-orders-2": "sync"}
    assert condition(reply, "ReplicasRouted")["reason"] == "SynchronousReplicasRouted"


def test_quorum_reads_on_patroni_3_say_it_has_no_quorum_commit(
    hook: FlaskClient, serve: Callable[[Sequence[dict[str, Any]]], FakeCluster]
) -> None:
    """Even if PostgreSQL reports ``quorum`` (a hand-written ``ANY`` list), Patroni 3 has no
    quorum commit: the reason names the leader's version, the fallback applies."""
    bodies = with_sync_states("3.2.2", {"pg-orders-0": "quorum", "pg-orders-2": "quorum"})
    reply = sync(hook, serve(bodies), consistency="quorum", whenNoReplica="Empty")
    assert reply["status"]["replicaEndpoints"] == []
    routed = condition(reply, "ReplicasRouted")
    assert (routed["status"], routed["reason"]) == ("False", "QuorumNotSupported")
    assert routed["message"].startswith(
        "Leader pg-orders-1 runs Patroni 3.2.2: quorum commit (synchronous_mode: quorum) "
        "needs Patroni 4.0 or later"
    )
    assert routed["message"].endswith("the read-only endpoints are empty (whenNoReplica: Empty)")
    assert primary_selects(reply) == LEADER


def test_quorum_reads_on_patroni_4_list_the_quorum_standbys(
    hook: FlaskClient, serve: Callable[[Sequence[dict[str, Any]]], FakeCluster]
) -> None:
    bodies = with_sync_states("4.1.4", {"pg-orders-0": "quorum", "pg-orders-2": "quorum"})
    reply = sync(hook, serve(bodies), consistency="quorum")
    assert reply["status"]["replicaEndpoints"] == ["pg-orders-0", "pg-orders-2"]
    assert condition(reply, "ReplicasRouted")["reason"] == "QuorumReplicasRouted"
