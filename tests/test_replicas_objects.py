"""The read-only Service part: its objects, and each member state.

Unit tests of the read-only Service (:mod:`hooks.children.readonly`, through ``reconcile``).

Test design notes
-----------------
* Plain dicts only, through the app's pipeline minus HTTP (load → plan probes → a fake
  prober that plays Patroni → reconcile), like tests/test_sync_*.py. Observed children are
  made by applying the hook's own desired objects with the Metacontroller stand-in, so they
  carry exactly what Metacontroller and the API server add.
* Member states are built from Patroni 4.1 bodies whose only varying parts are the ones the
  rule reads (role, state, replication_state, replayed location, patroni name and scope);
  the leader is always at ``LEADER_AT`` so a replica's lag is stated directly.
* The doubt cases reuse tests/test_sync_routing.py's table of primary doubts, plus the doubts that
  are specific to replicas; every one must keep the observed read-only objects exactly.
* Invariants over every scenario: nothing observed is dropped outside finalize, the
  primary Service and the read-only endpoints never share a Pod (except ``UseLeader``), no
  server-owned field is echoed, and the reply converges when its status is fed back (also
  when only lag values moved inside a category: the status holds no byte counts).
"""

from __future__ import annotations

from typing import Any

import pytest

from hooks.children.read_members import format_bytes
from hooks.domain.members import MemberStatus
from tests.child_helpers import (
    MIB,
    READ_ONLY,
    SLICE,
    answer,
    children_of,
    cluster_answers,
    condition,
    listed_slice,
    request_body,
    rs_spec,
)
from tests.helpers import (
    NAMESPACE,
    P0,
    P1,
    P2,
    down,
    make_pod,
    member_ip,
    run,
)
from tests.replicas_cases import (
    endpoints_of,
    member_version,
    paused_member,
    routed,
    tagged_member,
)

# ================================================================ the objects


def test_the_first_routed_sync_creates_the_read_only_service_and_its_slice() -> None:
    _, outcome = run(request_body(), routed())

    services = children_of(outcome, "Service")
    assert services[READ_ONLY] == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": READ_ONLY,
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/managed-by": "pg-failover-hook",
                "pg-failover-hook.adg.io/service": "read-only",
            },
        },
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": "postgresql", "port": 5432, "targetPort": 5432, "protocol": "TCP"}],
        },
    }
    assert "selector" not in services[READ_ONLY]["spec"]
    assert children_of(outcome, "EndpointSlice") == {
        SLICE: {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": SLICE,
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": READ_ONLY,
                    "endpointslice.kubernetes.io/managed-by": "pg-failover-hook.adg.io",
                    "app.kubernetes.io/managed-by": "pg-failover-hook",
                },
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [member_ip(name)],
                    "conditions": {"ready": True, "serving": True, "terminating": False},
                    "targetRef": {
                        "kind": "Pod",
                        "namespace": NAMESPACE,
                        "name": name,
                        "uid": f"uid-{name}",
                    },
                }
                for name in (P1, P2)
            ],
            "ports": [{"name": "postgresql", "port": 5432, "protocol": "TCP"}],
        }
    }
    status = outcome.body["status"]
    assert (status["replicaService"], status["replicaEndpoints"]) == (READ_ONLY, [P1, P2])
    ready = condition(outcome, "ReplicasRouted")
    assert (ready["status"], ready["reason"]) == ("True", "ReplicasWithinLag")
    assert ready["message"] == (
        "2 replica(s) within 16 MiB of leader pg-orders-0: pg-orders-1, pg-orders-2"
    )


def test_type_labels_annotations_and_ports_of_the_read_only_service() -> None:
    spec = rs_spec(
        type="LoadBalancer",
        labels={"team": "orders", "pg-failover-hook.adg.io/service": "not-ours"},
        annotations={"example.com/lb": "internal"},
    )
    spec["service"] = {
        "ports": [
            {"name": "pg", "port": 5433, "targetPort": 5432},
            {"name": "metrics", "port": 9187},
        ]
    }
    _, outcome = run(request_body(spec=spec), routed())

    service = children_of(outcome, "Service")[READ_ONLY]
    assert service["spec"] == {
        "type": "LoadBalancer",
        "ports": [
            {"name": "pg", "port": 5433, "targetPort": 5432, "protocol": "TCP"},
            {"name": "metrics", "port": 9187, "targetPort": 9187, "protocol": "TCP"},
        ],
    }
    assert service["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "pg-failover-hook",
        "team": "orders",
        "pg-failover-hook.adg.io/service": "read-only",  # ours wins: it marks the Service
    }
    assert service["metadata"]["annotations"] == {"example.com/lb": "internal"}
    # The slice's ports carry the Service's port names and the Pods' port numbers.
    assert children_of(outcome, "EndpointSlice")[SLICE]["ports"] == [
        {"name": "pg", "port": 5432, "protocol": "TCP"},
        {"name": "metrics", "port": 9187, "protocol": "TCP"},
    ]


def _pod_with_ports(name: str, **ports: int) -> dict[str, Any]:
    pod = make_pod(name)
    pod["spec"] = {
        "nodeName": f"node-{name[-1]}",
        "containers": [
            {
                "name": "patroni",
                "ports": [{"name": k, "containerPort": v} for k, v in ports.items()],
            }
        ],
    }
    return pod


def test_a_named_target_port_is_resolved_in_the_pods_container_ports() -> None:
    spec = rs_spec()
    spec["service"] = {"ports": [{"name": "postgresql", "port": 5432, "targetPort": "pg"}]}
    pods = [_pod_with_ports(n, pg=6432, patroni=8008) for n in (P0, P1, P2)]
    _, outcome = run(request_body(spec=spec, pods=pods), routed())

    slice_ = children_of(outcome, "EndpointSlice")[SLICE]
    assert slice_["ports"] == [{"name": "postgresql", "port": 6432, "protocol": "TCP"}]
    assert [e["nodeName"] for e in slice_["endpoints"]] == ["node-1", "node-2"]


def test_junk_container_ports_and_node_names_are_ignored() -> None:
    spec = rs_spec()
    spec["service"] = {"ports": [{"name": "postgresql", "port": 5432, "targetPort": "pg"}]}
    pods = [_pod_with_ports(n, pg=6432) for n in (P0, P1, P2)]
    for pod in pods:
        pod["spec"]["containers"][0]["ports"][:0] = [
            "junk",
            {"containerPort": 7000},
            {"name": "pg", "containerPort": True},
            {"name": "pg", "containerPort": "6000"},
        ]
        pod["spec"]["containers"][:0] = ["junk", {"name": "sidecar", "ports": "junk"}]
    pods[1]["spec"]["nodeName"] = 5
    pods[2]["spec"]["nodeName"] = ""
    _, outcome = run(request_body(spec=spec, pods=pods), routed())

    slice_ = children_of(outcome, "EndpointSlice")[SLICE]
    assert slice_["ports"] == [{"name": "postgresql", "port": 6432, "protocol": "TCP"}]
    assert [sorted(e) for e in slice_["endpoints"]] == [
        ["addresses", "conditions", "targetRef"]
    ] * 2


def test_a_listed_member_whose_named_port_now_differs_leaves_even_when_unreachable() -> None:
    spec = rs_spec()
    spec["service"] = {"ports": [{"name": "postgresql", "port": 5432, "targetPort": "pg"}]}
    pods = [_pod_with_ports(P0, pg=6432), _pod_with_ports(P1, pg=6432), _pod_with_ports(P2)]
    body = request_body(spec=spec, pods=pods, slices=[listed_slice([P1, P2])])
    _, outcome = run(body, routed(pg_orders_2=down(P2)))
    assert endpoints_of(outcome) == [P1]


def test_a_replica_whose_named_port_differs_from_the_leaders_is_left_out() -> None:
    spec = rs_spec()
    spec["service"] = {"ports": [{"name": "postgresql", "port": 5432, "targetPort": "pg"}]}
    pods = [_pod_with_ports(P0, pg=6432), _pod_with_ports(P1, pg=6432), _pod_with_ports(P2)]
    _, outcome = run(request_body(spec=spec, pods=pods), routed())

    assert endpoints_of(outcome) == [P1]
    assert (
        "pg-orders-2 (container ports differ from pg-orders-0's)"
        in (condition(outcome, "ReplicasRouted")["message"])
    )


# ======================================================= member states, one by one


@pytest.mark.parametrize(
    ("p2", "listed", "why"),
    [
        pytest.param(answer(P2), True, "", id="streaming, caught up"),
        pytest.param(answer(P2, behind=16 * MIB), True, "", id="lag exactly the limit"),
        pytest.param(
            answer(P2, behind=16 * MIB + 1),
            False,
            "replay lags more than 16 MiB",
            id="lag one byte over the limit",
        ),
        pytest.param(answer(P2, behind=-4096), True, "", id="replayed past the leader's sample"),
        pytest.param(
            answer(P2, replication_state=None),
            False,
            "not streaming (unknown)",
            id="no replication_state",
        ),
        pytest.param(
            answer(P2, replication_state="in archive recovery"),
            False,
            "not streaming (in archive recovery)",
            id="archive recovery",
        ),
        pytest.param(answer(P2, state="starting"), False, "state starting", id="postgres starting"),
        pytest.param(answer(P2, state="stopped"), False, "state stopped", id="postgres stopped"),
        pytest.param(
            answer(P2, behind=None), False, "no replayed WAL position", id="no replay location"
        ),
        pytest.param(
            answer(P2, patroni_name="pg-other-7"),
            False,
            "answers as Patroni member pg-other-7",
            id="IP answers as another member",
        ),
        pytest.param(
            answer(P2, scope="pg-billing"),
            False,
            "member of Patroni scope pg-billing",
            id="member of another cluster",
        ),
        pytest.param(
            answer(P2, "standby_leader"), False, "role standby_leader", id="not a replica"
        ),
        pytest.param(down(P2), False, "unreachable", id="unreachable, not listed before"),
        # Issue 10: Patroni's own rules for read traffic.
        pytest.param(
            tagged_member(P2, noloadbalance=True), False, "tagged noloadbalance", id="noload"
        ),
        pytest.param(
            tagged_member(P2, noloadbalance="yes"), False, "tagged noloadbalance", id="noload-str"
        ),
        pytest.param(tagged_member(P2, noloadbalance=False), True, "", id="noloadbalance false"),
        pytest.param(tagged_member(P2, nofailover=True), True, "", id="nofailover serves reads"),
        pytest.param(tagged_member(P2, nosync=True), True, "", id="nosync serves reads"),
        pytest.param(paused_member(P2), False, "replay paused", id="replay paused"),
        pytest.param(
            member_version(P2, "3.0.3", streaming=False),
            False,
            "Patroni 3.0.3 reports no replication_state (since 3.0.4)",
            id="patroni 3.0.3",
        ),
        pytest.param(member_version(P2, "3.0.4"), True, "", id="patroni 3.0.4 streaming"),
        pytest.param(
            MemberStatus.not_patroni(P2, "HTTP 302 on /primary with a non-JSON body", 302),
            False,
            "not a Patroni answer",
            id="not Patroni",
        ),
    ],
)
def test_which_member_states_are_listed(p2: MemberStatus, listed: bool, why: str) -> None:
    """One row per rule; the other replica (pg-orders-1) always qualifies."""
    _, outcome = run(request_body(), routed(pg_orders_2=p2))

    assert endpoints_of(outcome) == ([P1, P2] if listed else [P1])
    message = condition(outcome, "ReplicasRouted")["message"]
    if listed:
        assert "left out" not in message
    else:
        assert message.endswith(f"; left out: pg-orders-2 ({why})"), message


def test_the_leader_is_never_listed_even_when_the_slice_listed_it_as_a_replica() -> None:
    # pg-orders-1 was promoted: the observed slice still lists it from when it was a replica.
    body = request_body(slices=[listed_slice([P1, P2])])
    _, outcome = run(body, cluster_answers(P1, pg_orders_0=answer(P0)))

    assert endpoints_of(outcome) == [P0, P2]
    assert outcome.body["status"]["primary"] == P1


def test_a_terminating_or_ip_less_pod_is_not_listed() -> None:
    pods = [make_pod(P0), make_pod(P1, deleting=True), make_pod(P2, ip=None)]
    body = request_body(pods=pods, slices=[listed_slice([P1, P2])])
    _, outcome = run(body, routed())

    assert endpoints_of(outcome) == []
    assert condition(outcome, "ReplicasRouted")["message"].startswith(
        "No replica streams within 16 MiB of leader pg-orders-0; "
        "left out: pg-orders-1 (terminating), pg-orders-2 (no pod IP)"
    )


def test_the_lag_limit_comes_from_the_spec() -> None:
    body = request_body(spec=rs_spec(maxLagBytes=0))
    _, outcome = run(body, routed(pg_orders_2=answer(P2, behind=1)))

    assert endpoints_of(outcome) == [P1]
    assert (
        "pg-orders-2 (replay lags more than 0 bytes)"
        in (condition(outcome, "ReplicasRouted")["message"])
    )


@pytest.mark.parametrize(
    ("limit", "phrase"),
    [(16 * MIB, "16 MiB"), (1 << 30, "1 GiB"), (1536, "1536 bytes"), (4096, "4 KiB")],
)
def test_the_limit_is_stated_exactly(limit: int, phrase: str) -> None:
    assert format_bytes(limit) == phrase
