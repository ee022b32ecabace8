"""Unit tests of the read-only Service (:mod:`hooks.parts.readonly`, through ``reconcile``).

Test design notes
-----------------
* Plain dicts only, through the app's pipeline minus HTTP (load → plan probes → a fake
  prober that plays Patroni → reconcile), like tests/test_sync.py. Observed children are
  made by applying the hook's own desired objects with the Metacontroller stand-in, so they
  carry exactly what Metacontroller and the API server add.
* Member states are built from Patroni 4.1 bodies whose only varying parts are the ones the
  rule reads (role, state, replication_state, replayed location, patroni name and scope);
  the leader is always at ``LEADER_AT`` so a replica's lag is stated directly.
* The doubt cases reuse tests/test_sync.py's table of primary doubts, plus the doubts that
  are specific to replicas; every one must keep the observed read-only objects exactly.
* Invariants over every scenario: nothing observed is dropped outside finalize, the
  primary Service and the read-only endpoints never share a Pod (except ``UseLeader``), no
  server-owned field is echoed, and the reply converges when its status is fed back (also
  when only lag values moved inside a category: the status holds no byte counts).
"""

from __future__ import annotations

import copy
import ipaddress
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus
from hooks.domain.model import ENDPOINTSLICE_KEY, LAST_APPLIED_ANNOTATION, POD_NAME_LABEL
from hooks.loaders.schemas import load_spec
from hooks.parts.primary import desired_service
from hooks.parts.readonly import classify, format_bytes
from testbed.fakes.patroni_wire import patroni_body
from tests.child_helpers import (
    LEADER_AT,
    MIB,
    READ_ONLY,
    SLICE,
    answer,
    children_of,
    cluster_answers,
    condition,
    listed_slice,
    observed,
    read_only_service,
    request_body,
    rs_spec,
    slice_names,
)
from tests.doubts import DOUBTS, Doubt
from tests.helpers import (
    CLUSTER,
    NAMESPACE,
    NOW,
    P0,
    P1,
    P2,
    P3,
    SERVICE_NAME,
    down,
    fed_back,
    loaded_pod,
    make_pod,
    make_service,
    member_ip,
    preserved,
    run,
    seed_spec,
    without_resync,
)

PRIMARY = make_service(pod=P0)


def _body(name: str, **changes: Any) -> dict[str, Any]:
    """A streaming, caught-up replica's answer (as child_helpers.answer), changed."""
    body = patroni_body("replica", name=name)
    body["patroni"]["scope"] = CLUSTER
    body["xlog"] = {"received_location": LEADER_AT, "replayed_location": LEADER_AT, "paused": False}
    body.update(changes)
    return body


def _tagged(name: str, **tags: object) -> MemberStatus:
    return MemberStatus.from_api_response(name, 503, _body(name, tags=tags))


def _paused(name: str) -> MemberStatus:
    body = _body(name)
    body["xlog"]["paused"] = True
    return MemberStatus.from_api_response(name, 503, body)


def _version(name: str, version: str, *, streaming: bool = True) -> MemberStatus:
    """An older Patroni's answer: no ``patroni.name`` (3.2.0), and without ``streaming`` no
    ``replication_state`` at all (what 3.0.0 to 3.0.3 send)."""
    body = _body(name)
    body["patroni"] = {"version": version, "scope": CLUSTER}
    if not streaming:
        del body["replication_state"]
    return MemberStatus.from_api_response(name, 503, body)


def endpoints_of(outcome: Any, name: str = SLICE) -> list[str]:
    return slice_names(children_of(outcome, "EndpointSlice")[name])


def routed(**overrides: MemberStatus) -> dict[str, MemberStatus]:
    return cluster_answers(P0, **overrides)


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
        pytest.param(_tagged(P2, noloadbalance=True), False, "tagged noloadbalance", id="noload"),
        pytest.param(
            _tagged(P2, noloadbalance="yes"), False, "tagged noloadbalance", id="noload-str"
        ),
        pytest.param(_tagged(P2, noloadbalance=False), True, "", id="noloadbalance false"),
        pytest.param(_tagged(P2, nofailover=True), True, "", id="nofailover serves reads"),
        pytest.param(_tagged(P2, nosync=True), True, "", id="nosync serves reads"),
        pytest.param(_paused(P2), False, "replay paused", id="replay paused"),
        pytest.param(
            _version(P2, "3.0.3", streaming=False),
            False,
            "Patroni 3.0.3 reports no replication_state (since 3.0.4)",
            id="patroni 3.0.3",
        ),
        pytest.param(_version(P2, "3.0.4"), True, "", id="patroni 3.0.4 streaming"),
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


# ============================================================ unreachable members


def test_an_unreachable_member_listed_now_stays_listed() -> None:
    body = request_body(slices=[listed_slice([P1, P2])])
    _, outcome = run(body, routed(pg_orders_2=down(P2, "read timeout")))

    assert endpoints_of(outcome) == [P1, P2]
    assert condition(outcome, "ReplicasRouted")["message"] == (
        "1 replica(s) within 16 MiB of leader pg-orders-0: pg-orders-1; kept while Patroni "
        "does not answer: pg-orders-2; left out: pg-orders-2 (unreachable)"
    )


def test_every_member_kept_while_patroni_does_not_answer_is_named() -> None:
    body = request_body(slices=[listed_slice([P1, P2])])
    _, outcome = run(body, routed(pg_orders_1=down(P1), pg_orders_2=down(P2)))
    assert endpoints_of(outcome) == [P1, P2]
    assert condition(outcome, "ReplicasRouted")["message"] == (
        "No replica streams within 16 MiB of leader pg-orders-0; kept while Patroni does not "
        "answer: pg-orders-1, pg-orders-2; left out: pg-orders-1 (unreachable), pg-orders-2 "
        "(unreachable)"
    )


def test_junk_in_an_observed_slice_is_skipped_and_what_follows_it_still_counts() -> None:
    """The observed slices are free input: every entry that does not name a Pod with an
    address is skipped, and the entries after it (and the slices after one of another
    Service) are still read, so an unreachable member listed there stays listed."""
    ours = listed_slice([P1, P2])
    ours["endpoints"] = [
        "junk",
        {"targetRef": "junk", "addresses": ["10.0.0.9"]},
        {"targetRef": {"kind": "Node", "name": P2}, "addresses": ["10.0.0.9"]},
        {"targetRef": {"kind": "Pod", "name": 5}, "addresses": ["10.0.0.9"]},
        {"targetRef": {"kind": "Pod", "name": P2}, "addresses": "10.0.0.9"},
        {"targetRef": {"kind": "Pod", "name": P2}, "addresses": []},
        {"targetRef": {"kind": "Pod", "name": P2}, "addresses": [5]},
        *ours["endpoints"],
    ]
    other = listed_slice([P1], service="a-other-service")
    other["metadata"]["name"] = "a-other-service-ipv4"
    body = request_body(slices=[other, ours])
    answers = routed(pg_orders_1=down(P1), pg_orders_2=down(P2))
    _, outcome = run(body, answers)
    assert endpoints_of(outcome) == [P1, P2]


def test_an_unreachable_member_whose_pod_is_not_ready_leaves() -> None:
    pods = [make_pod(P0), make_pod(P1), make_pod(P2)]
    pods[2]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    body = request_body(pods=pods, slices=[listed_slice([P1, P2])])
    _, outcome = run(body, routed(pg_orders_2=down(P2)))

    assert endpoints_of(outcome) == [P1]
    assert (
        "pg-orders-2 (unreachable, Pod not ready)"
        in (condition(outcome, "ReplicasRouted")["message"])
    )


def test_an_unreachable_member_whose_pod_has_a_new_ip_leaves() -> None:
    pods = [make_pod(P0), make_pod(P1), make_pod(P2, ip="10.244.9.99")]
    body = request_body(pods=pods, slices=[listed_slice([P1, P2])])
    _, outcome = run(body, routed(pg_orders_2=down(P2)))

    assert endpoints_of(outcome) == [P1]


# ======================================================================= fallbacks


def _all_lagging() -> dict[str, MemberStatus]:
    return routed(
        pg_orders_1=answer(P1, behind=64 * MIB), pg_orders_2=answer(P2, replication_state=None)
    )


def test_keep_endpoints_keeps_the_members_listed_before_when_none_qualifies() -> None:
    body = request_body(slices=[listed_slice([P1, P2])])
    _, outcome = run(body, _all_lagging())

    assert endpoints_of(outcome) == [P1, P2]
    ready = condition(outcome, "ReplicasRouted")
    assert (ready["status"], ready["reason"]) == ("False", "NoReplicaWithinLag")
    assert ready["message"].endswith(
        "keeping the endpoints listed before: pg-orders-1, pg-orders-2 "
        "(whenNoReplica: KeepEndpoints)"
    )
    assert outcome.body["status"]["replicaEndpoints"] == [P1, P2]


def test_a_paused_replica_is_listed_when_the_spec_includes_paused_replicas() -> None:
    body = request_body(spec=rs_spec(includePausedReplicas=True))
    _, outcome = run(body, routed(pg_orders_2=_paused(P2)))
    assert endpoints_of(outcome) == [P1, P2]
    assert "left out" not in condition(outcome, "ReplicasRouted")["message"]


def test_keep_endpoints_drops_paused_and_noloadbalance_members_listed_before() -> None:
    """Neither is a "stale but serving" replica: Patroni keeps them away from clients."""
    body = request_body(slices=[listed_slice([P1, P2])])
    answers = routed(pg_orders_1=_paused(P1), pg_orders_2=_tagged(P2, noloadbalance=True))
    _, outcome = run(body, answers)
    assert endpoints_of(outcome) == []
    message = condition(outcome, "ReplicasRouted")["message"]
    assert "pg-orders-1 (replay paused), pg-orders-2 (tagged noloadbalance)" in message


def test_keep_endpoints_is_the_default() -> None:
    spec, problems = load_spec(rs_spec())
    assert problems == () and spec is not None and spec.replica_service is not None
    assert spec.replica_service.when_no_replica == "KeepEndpoints"
    assert spec.replica_service.max_lag_bytes == 16 * MIB


def test_keep_endpoints_never_keeps_the_leader_nor_a_member_that_cannot_serve() -> None:
    # After a failover to pg-orders-1 nobody qualifies; the slice listed 1 (now the
    # leader), 2 (lagging: kept) and 3 (PostgreSQL stopped: dropped).
    pods = [make_pod(n) for n in (P0, P1, P2, P3)]
    body = request_body(pods=pods, slices=[listed_slice([P1, P2, P3])])
    answers = {
        P0: down(P0),
        P1: answer(P1, "primary"),
        P2: answer(P2, behind=64 * MIB),
        P3: answer(P3, state="stopped"),
    }
    _, outcome = run(body, answers)

    assert outcome.body["status"]["primary"] == P1
    assert endpoints_of(outcome) == [P2]


def test_keep_endpoints_with_nothing_listed_before_writes_an_empty_slice() -> None:
    _, outcome = run(request_body(), _all_lagging())

    slice_ = children_of(outcome, "EndpointSlice")[SLICE]
    assert slice_["endpoints"] is None  # what the API server returns for "no endpoints"
    assert outcome.body["status"]["replicaEndpoints"] == []
    assert condition(outcome, "ReplicasRouted")["message"].endswith(
        "keeping the endpoints listed before: none (whenNoReplica: KeepEndpoints)"
    )


def test_use_leader_lists_the_leader_when_no_replica_qualifies() -> None:
    body = request_body(spec=rs_spec(whenNoReplica="UseLeader"), slices=[listed_slice([P1])])
    _, outcome = run(body, _all_lagging())

    slice_ = children_of(outcome, "EndpointSlice")[SLICE]
    assert slice_names(slice_) == [P0]
    assert slice_["endpoints"][0]["addresses"] == [member_ip(P0)]
    assert outcome.body["status"]["replicaEndpoints"] == [P0]
    assert condition(outcome, "ReplicasRouted")["message"].endswith(
        "routing read-only traffic to the leader pg-orders-0 (whenNoReplica: UseLeader)"
    )


def test_use_leader_lists_only_replicas_while_one_qualifies() -> None:
    body = request_body(spec=rs_spec(whenNoReplica="UseLeader"))
    _, outcome = run(body, routed(pg_orders_2=answer(P2, behind=64 * MIB)))

    assert endpoints_of(outcome) == [P1]


def test_empty_lists_nobody_when_no_replica_qualifies() -> None:
    body = request_body(spec=rs_spec(whenNoReplica="Empty"), slices=[listed_slice([P1, P2])])
    _, outcome = run(body, _all_lagging())

    assert children_of(outcome, "EndpointSlice")[SLICE]["endpoints"] is None
    assert outcome.body["status"]["replicaEndpoints"] == []
    assert condition(outcome, "ReplicasRouted")["message"].endswith(
        "the read-only endpoints are empty (whenNoReplica: Empty)"
    )


def test_a_single_member_cluster_gets_the_fallback() -> None:
    body = request_body(spec=rs_spec(whenNoReplica="UseLeader"), pods=[make_pod(P0)])
    _, outcome = run(body, {P0: answer(P0, "primary")})

    assert endpoints_of(outcome) == [P0]


# =================================================================== doubt: keep


REPLICA_DOUBTS = [
    *DOUBTS,
    Doubt(
        "leader reports no WAL location",
        cluster_answers(P0) | {P0: answer(P0, "primary", location=None)},
        Decision.ROUTED,
        "Leader pg-orders-0 reported no WAL location",
    ),
]


def _doubt_reason(doubt: Doubt) -> str:
    return "LeaderPositionUnknown" if doubt.reason is Decision.ROUTED else "LeaderNotConfirmed"


@pytest.mark.parametrize("doubt", REPLICA_DOUBTS, ids=[d.id for d in REPLICA_DOUBTS])
def test_in_doubt_the_observed_read_only_objects_are_kept_exactly(doubt: Doubt) -> None:
    service, slice_ = read_only_service(), listed_slice([P1, P2])
    body = request_body(pods=doubt.pods, services=[PRIMARY, service], slices=[slice_])
    _, outcome = run(body, doubt.answers)

    assert children_of(outcome, "Service")[READ_ONLY] == preserved(service)
    assert children_of(outcome, "EndpointSlice") == {SLICE: preserved(slice_)}
    assert outcome.body["status"]["replicaEndpoints"] == [P1, P2]
    kept = condition(outcome, "ReplicasRouted")
    assert (kept["status"], kept["reason"]) == ("False", _doubt_reason(doubt))
    assert kept["message"].endswith(
        "; keeping the read-only endpoints as they are (pg-orders-1, pg-orders-2)"
    )


@pytest.mark.parametrize("doubt", REPLICA_DOUBTS, ids=[d.id for d in REPLICA_DOUBTS])
def test_in_doubt_no_read_only_object_is_created(doubt: Doubt) -> None:
    body = request_body(pods=doubt.pods, services=[PRIMARY])
    _, outcome = run(body, doubt.answers)

    assert READ_ONLY not in children_of(outcome, "Service")
    assert children_of(outcome, "EndpointSlice") == {}
    assert outcome.body["status"]["replicaEndpoints"] == []
    assert outcome.body["status"]["replicaService"] == READ_ONLY
    assert condition(outcome, "ReplicasRouted")["message"].endswith(
        "; keeping the read-only endpoints as they are (none)"
    )


def test_without_a_confirmed_leader_the_read_only_condition_says_so() -> None:
    _, outcome = run(request_body(services=[PRIMARY]), DOUBTS[0].answers)
    assert condition(outcome, "ReplicasRouted")["message"] == (
        "No leader is confirmed, so replica lag cannot be computed; keeping the read-only "
        "endpoints as they are (none)"
    )


def test_a_named_port_the_leader_does_not_declare_keeps_the_observed_objects() -> None:
    spec = rs_spec()
    spec["service"] = {"ports": [{"name": "postgresql", "port": 5432, "targetPort": "pg"}]}
    slice_ = listed_slice([P1])
    _, outcome = run(request_body(spec=spec, slices=[slice_]), routed())

    assert children_of(outcome, "EndpointSlice") == {SLICE: preserved(slice_)}
    assert condition(outcome, "ReplicasRouted")["reason"] == "NamedPortNotFound"
    assert outcome.decision is Decision.ROUTED  # the primary Service is routed regardless


def test_without_a_declared_endpointslice_type_no_read_only_object_is_emitted() -> None:
    service = read_only_service()
    body = request_body(services=[PRIMARY, service], slices=None)
    assert ENDPOINTSLICE_KEY not in body["children"]
    _, outcome = run(body, routed())

    assert children_of(outcome, "Service") == {
        SERVICE_NAME: desired_service(load_spec(rs_spec())[0], NAMESPACE, P0),
        READ_ONLY: preserved(service),
    }
    assert children_of(outcome, "EndpointSlice") == {}
    not_declared = condition(outcome, "ReplicasRouted")
    assert (not_declared["status"], not_declared["reason"], not_declared["message"]) == (
        "False",
        "EndpointSlicesNotDeclared",
        "The CompositeController does not declare discovery.k8s.io/v1 endpointslices as a "
        "child resource; apply metacontroller/compositecontroller.yaml",
    )
    assert outcome.body["status"]["replicaService"] == READ_ONLY


def test_the_read_only_service_never_gets_the_primarys_selector() -> None:
    # An observed Service we own under another name follows the leader (an old serviceRef);
    # the read-only Service must not be taken for one.
    body = request_body(services=[PRIMARY, read_only_service()])
    for answers in (routed(), DOUBTS[0].answers):
        _, outcome = run(body, answers)
        assert "selector" not in children_of(outcome, "Service")[READ_ONLY]["spec"]


@pytest.mark.parametrize("where", ["live label only", "last-applied record only"])
def test_a_read_only_service_is_recognised_by_its_label_or_its_last_applied_record(
    where: str,
) -> None:
    service = read_only_service()
    if where == "live label only":
        del service["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]
    else:
        del service["metadata"]["labels"]["pg-failover-hook.adg.io/service"]
    body = request_body(spec=seed_spec(), services=[PRIMARY, service])
    for answers in (routed(), DOUBTS[0].answers):
        _, outcome = run(body, answers)
        assert "selector" not in children_of(outcome, "Service")[READ_ONLY]["spec"]
        assert condition(outcome, "ReplicasRouted")["reason"] == "ReplicaServiceRemoved"


# ======================================================== spec changes, finalize


def test_after_replica_service_is_removed_its_objects_are_kept_as_they_are() -> None:
    service, slice_ = read_only_service(), listed_slice([P1, P2])
    body = request_body(spec=seed_spec(), services=[PRIMARY, service], slices=[slice_])
    _, outcome = run(body, routed(pg_orders_1=answer(P1, behind=64 * MIB)))

    assert children_of(outcome, "Service")[READ_ONLY] == preserved(service)
    assert children_of(outcome, "EndpointSlice") == {SLICE: preserved(slice_)}
    removed = condition(outcome, "ReplicasRouted")
    assert (removed["status"], removed["reason"]) == ("False", "ReplicaServiceRemoved")
    assert removed["message"] == (
        "spec.replicaService is not set; keeping Service pg-orders-replicas, EndpointSlice "
        "pg-orders-replicas-ipv4 as they are until they are deleted by hand or with the "
        "PostgreSQLCluster"
    )
    assert "replicaEndpoints" not in outcome.body["status"]


def test_without_replica_service_and_objects_there_is_no_condition() -> None:
    _, outcome = run(request_body(spec=seed_spec()), routed())
    assert [c["type"] for c in outcome.body["status"]["conditions"]] == [
        "Ready",
        "PrimaryRouted",
        "MembersReachable",
        "MemberNameGuard",
        "SpecValid",
        "SwitchoverDetection",  # always there in a routed reply (hooks/core/switchover.py)
    ]
    assert "replicaService" not in outcome.body["status"]


def test_after_a_rename_the_old_read_only_objects_keep_following_the_replicas() -> None:
    old_service = read_only_service("orders-ro")
    old_slice = listed_slice([P1], service="orders-ro")
    body = request_body(services=[PRIMARY, old_service], slices=[old_slice])
    _, outcome = run(body, routed())

    assert set(children_of(outcome, "Service")) == {SERVICE_NAME, "orders-ro", READ_ONLY}
    slices = children_of(outcome, "EndpointSlice")
    assert {n: slice_names(s) for n, s in slices.items()} == {
        "orders-ro-ipv4": [P1, P2],
        SLICE: [P1, P2],
    }
    assert outcome.body["status"]["replicaService"] == READ_ONLY


def test_a_slice_of_ours_labelled_for_the_primary_service_is_emptied_not_dropped() -> None:
    # The names were swapped in the spec: the old read-only Service is now the primary one.
    stray = listed_slice([P1], service=SERVICE_NAME)
    body = request_body(services=[PRIMARY], slices=[stray])
    _, outcome = run(body, routed())

    emptied = children_of(outcome, "EndpointSlice")[stray["metadata"]["name"]]
    assert emptied["endpoints"] is None
    assert emptied["metadata"]["labels"]["kubernetes.io/service-name"] == SERVICE_NAME


def test_swapping_the_two_service_names_keeps_one_object_per_name() -> None:
    primary = make_service("orders-rw", pod=P0)
    old_read_only = read_only_service("orders-ro")
    old_slice = listed_slice([P1, P2], service="orders-ro")
    spec = rs_spec(name="orders-rw")
    spec["serviceRef"] = {"name": "orders-ro"}
    body = request_body(spec=spec, services=[primary, old_read_only], slices=[old_slice])
    _, outcome = run(body, routed())

    services = children_of(outcome, "Service")  # raises if a name is listed twice
    assert services["orders-ro"]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == P0
    assert "pg-failover-hook.adg.io/service" not in services["orders-ro"]["metadata"]["labels"]
    assert "selector" not in services["orders-rw"]["spec"]
    slices = children_of(outcome, "EndpointSlice")
    # The old slice now belongs to the primary's name: emptied, so it adds nobody to it.
    assert slices["orders-ro-ipv4"]["endpoints"] is None
    assert slice_names(slices["orders-rw-ipv4"]) == [P1, P2]


def test_a_foreign_slice_child_is_passed_through() -> None:
    foreign = listed_slice([P1], service="someone-else")
    foreign["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = "other"
    _, outcome = run(request_body(slices=[foreign]), routed())

    assert children_of(outcome, "EndpointSlice")[foreign["metadata"]["name"]] == preserved(foreign)


def test_finalize_drops_the_read_only_objects_and_waits_for_them() -> None:
    body = request_body(
        services=[PRIMARY, read_only_service()], slices=[listed_slice([P1])], finalizing=True
    )
    _, outcome = run(body, routed())
    assert outcome.body["children"] == []
    assert outcome.body["finalized"] is False
    assert "3 child object(s) still exist" in condition(outcome, "Ready")["message"]

    body["children"]["Service.v1"] = {}
    _, outcome = run(body, routed())
    assert outcome.body["finalized"] is False  # the slice is still there

    body["children"][ENDPOINTSLICE_KEY] = {}
    _, outcome = run(body, routed())
    assert outcome.body["finalized"] is True


def test_finalize_and_an_invalid_spec_keep_the_replicas_routed_condition() -> None:
    body = request_body(services=[PRIMARY, read_only_service()], slices=[listed_slice([P1])])
    _, first = run(body, routed())
    previous = condition(first, "ReplicasRouted")

    invalid = fed_back(body, first)
    invalid["parent"]["spec"]["replicaService"]["whenNoReplica"] = "Sometimes"
    _, outcome = run(invalid, routed())
    assert outcome.decision is Decision.INVALID_SPEC
    assert condition(outcome, "ReplicasRouted") == previous
    assert {c["metadata"]["name"] for c in outcome.body["children"]} == {
        SERVICE_NAME,
        READ_ONLY,
        SLICE,
    }
    assert "spec.replicaService.whenNoReplica" in condition(outcome, "SpecValid")["message"]

    finalize = fed_back(body, first)
    finalize["finalizing"] = True
    _, outcome = run(finalize, routed())
    assert condition(outcome, "ReplicasRouted") == previous


# ================================================================ address families


def test_ipv6_pods_get_an_ipv6_slice() -> None:
    pods = [make_pod(n, ip=f"fd00::{i + 1}") for i, n in enumerate((P0, P1, P2))]
    _, outcome = run(request_body(pods=pods), routed())

    slices = children_of(outcome, "EndpointSlice")
    assert list(slices) == [f"{READ_ONLY}-ipv6"]
    assert slices[f"{READ_ONLY}-ipv6"]["addressType"] == "IPv6"
    assert [e["addresses"] for e in slices[f"{READ_ONLY}-ipv6"]["endpoints"]] == [
        ["fd00::2"],
        ["fd00::3"],
    ]


def test_each_address_family_has_its_own_slice_and_a_slice_is_never_dropped() -> None:
    pods = [make_pod(P0), make_pod(P1), make_pod(P2, ip="fd00::3")]
    _, outcome = run(request_body(pods=pods), routed())
    slices = children_of(outcome, "EndpointSlice")
    assert {n: slice_names(s) for n, s in slices.items()} == {
        SLICE: [P1],
        f"{READ_ONLY}-ipv6": [P2],
    }

    # pg-orders-2 comes back with an IPv4 address: the IPv6 slice stays, empty.
    observed_slices = observed(*slices.values())
    body = request_body(slices=observed_slices)
    _, outcome = run(body, routed())
    slices = children_of(outcome, "EndpointSlice")
    assert slice_names(slices[SLICE]) == [P1, P2]
    assert slices[f"{READ_ONLY}-ipv6"]["endpoints"] is None


def test_with_nobody_listed_the_observed_slice_s_family_is_kept_and_no_other_is_made() -> None:
    """The pods moved to IPv6 and no replica is listable: the IPv4 slice stays (emptied);
    the leader's family does not add an IPv6 slice, as it would for a Service with none."""
    pods = [make_pod(n, ip=f"fd00::{i + 1}") for i, n in enumerate((P0, P1, P2))]
    body = request_body(pods=pods, slices=[listed_slice([P1])])
    _, outcome = run(body, routed(pg_orders_1=down(P1), pg_orders_2=down(P2)))
    slices = children_of(outcome, "EndpointSlice")
    assert list(slices) == [SLICE]
    assert slices[SLICE]["endpoints"] is None


def test_with_nobody_listed_an_observed_ipv6_slice_is_kept_and_no_ipv4_one_is_made() -> None:
    pods = [make_pod(n, ip=f"fd00::{i + 1}") for i, n in enumerate((P0, P1, P2))]
    _, first = run(request_body(pods=pods), routed())
    observed_slices = observed(*children_of(first, "EndpointSlice").values())
    body = request_body(slices=observed_slices)  # the pods are back on IPv4
    _, outcome = run(body, routed(pg_orders_1=down(P1), pg_orders_2=down(P2)))
    slices = children_of(outcome, "EndpointSlice")
    assert list(slices) == [f"{READ_ONLY}-ipv6"]
    assert slices[f"{READ_ONLY}-ipv6"]["endpoints"] is None


def test_another_slice_of_the_read_only_service_is_emptied_not_dropped() -> None:
    extra = listed_slice([P1])
    extra["metadata"]["name"] = f"{READ_ONLY}-old"
    body = request_body(slices=[listed_slice([P1, P2]), extra])
    _, outcome = run(body, routed())
    slices = children_of(outcome, "EndpointSlice")
    assert slices[f"{READ_ONLY}-old"] == {**preserved(extra), "endpoints": None}
    assert slice_names(slices[SLICE]) == [P1, P2]


def test_a_slice_of_ours_for_a_service_we_do_not_plan_is_kept_as_it_is() -> None:
    stray = listed_slice([P1], service="pg-orders-elsewhere")
    body = request_body(slices=[listed_slice([P1, P2]), stray])
    _, outcome = run(body, routed())
    assert children_of(outcome, "EndpointSlice")[stray["metadata"]["name"]] == preserved(stray)


# ========================================================== rules over scenarios


def _scenarios() -> dict[str, tuple[dict[str, Any], Mapping[str, MemberStatus]]]:
    service, slice_ = read_only_service(), listed_slice([P1, P2])
    existing = {"services": [PRIMARY, service], "slices": [slice_]}
    return {
        "first sync": (request_body(), routed()),
        "steady": (request_body(**existing), routed()),
        "one lagging": (
            request_body(**existing),
            routed(pg_orders_2=answer(P2, behind=40 * MIB)),
        ),
        "all lagging, keep": (request_body(**existing), _all_lagging()),
        "all lagging, use leader": (
            request_body(spec=rs_spec(whenNoReplica="UseLeader"), **existing),
            _all_lagging(),
        ),
        "all lagging, empty": (
            request_body(spec=rs_spec(whenNoReplica="Empty"), **existing),
            _all_lagging(),
        ),
        "failover": (request_body(**existing), cluster_answers(P1, pg_orders_0=down(P0))),
        "no leader": (request_body(**existing), DOUBTS[0].answers),
        "unreachable replica": (
            request_body(**existing),
            routed(pg_orders_1=down(P1)),
        ),
        "removed from spec": (
            request_body(spec=seed_spec(), **existing),
            routed(),
        ),
        "finalize": (request_body(finalizing=True, **existing), {}),
    }


SCENARIOS = _scenarios()
LIVE = [n for n, (b, _) in SCENARIOS.items() if not b["finalizing"]]


@pytest.mark.parametrize("name", LIVE)
def test_nothing_observed_is_ever_dropped(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    observed_ids = {(o["kind"], n) for group in body["children"].values() for n, o in group.items()}
    replied = {(c["kind"], c["metadata"]["name"]) for c in outcome.body["children"]}
    assert observed_ids <= replied


@pytest.mark.parametrize("name", LIVE)
def test_the_primary_and_the_read_only_endpoints_never_share_a_pod(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    services = children_of(outcome, "Service")
    selected = services[SERVICE_NAME]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"]
    listed = {n for s in children_of(outcome, "EndpointSlice").values() for n in slice_names(s)}
    if "use leader" in name:
        assert listed == {selected}
    else:
        assert selected not in listed


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_no_child_carries_server_owned_fields(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, outcome = run(body, answers)
    for child in outcome.body["children"]:
        metadata = child["metadata"]
        assert set(metadata) <= {"name", "namespace", "labels", "annotations"}, metadata
        assert LAST_APPLIED_ANNOTATION not in metadata.get("annotations", {})
        assert "status" not in child
        if child["kind"] == "Service":
            assert not {"clusterIP", "clusterIPs", "ipFamilies"} & set(child["spec"])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_status_converges_when_it_is_fed_back(name: str) -> None:
    body, answers = SCENARIOS[name]
    _, first = run(body, answers, now=NOW)
    following = fed_back(body, first)
    _, second = run(following, answers, now=NOW + timedelta(minutes=5))
    # All but the phase-spread resync, which moves with the clock (the status never does).
    assert without_resync(second.body) == without_resync(first.body)


def test_moving_lag_values_inside_a_category_change_nothing_in_the_reply() -> None:
    body = request_body(services=[PRIMARY, read_only_service()], slices=[listed_slice([P1, P2])])
    a = routed(pg_orders_1=answer(P1, behind=3), pg_orders_2=answer(P2, behind=40 * MIB))
    b = routed(pg_orders_1=answer(P1, behind=9 * MIB), pg_orders_2=answer(P2, behind=99 * MIB))
    _, first = run(body, a)
    _, second = run(fed_back(body, first), b, now=NOW + timedelta(seconds=1))
    # All but the phase-spread resync, which moves with the clock (the status never does).
    assert json.dumps(without_resync(first.body), sort_keys=True) == json.dumps(
        without_resync(second.body), sort_keys=True
    )
    assert str(LEADER_AT) not in json.dumps(first.body["status"])


def test_the_observed_slice_is_reproduced_exactly_in_a_steady_state() -> None:
    body, answers = SCENARIOS["steady"]
    _, outcome = run(body, answers)
    (slice_,) = body["children"][ENDPOINTSLICE_KEY].values()
    applied = json.loads(slice_["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    replied = copy.deepcopy(children_of(outcome, "EndpointSlice")[SLICE])
    replied["metadata"]["labels"]["controller-uid"] = applied["metadata"]["labels"][
        "controller-uid"
    ]
    assert replied == applied


# ============================================ classify: every verdict spelled out
# One row per rule of replicas.classify, with the whole verdict: listed (True), left out
# (False) or in doubt (None: unreachable, kept as it was), the phrase, and whether
# KeepEndpoints may keep the member listed when nobody qualifies.

_LEADER = answer(P0, "primary")
_READY_POD = make_pod(P1)


def _not_ready(name: str) -> dict[str, Any]:
    pod = make_pod(name)
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return pod


def _terminating(name: str) -> dict[str, Any]:
    return make_pod(name, deleting=True)


def _v3(**changes: Any) -> MemberStatus:
    body = _body(P1, **changes)
    body["patroni"] = {"version": "3.0.2", "scope": CLUSTER}
    body.pop("replication_state", None)
    return MemberStatus.from_api_response(P1, 503, body)


@pytest.mark.parametrize(
    ("member", "pod", "ip", "options", "verdict"),
    [
        (answer(P1), _READY_POD, "auto", {}, (True, "", False)),
        (_LEADER, make_pod(P0), "auto", {}, (False, "leader", False)),
        (answer(P1), _terminating(P1), "auto", {}, (False, "terminating", False)),
        (answer(P1), _READY_POD, None, {}, (False, "no pod IP", False)),
        (down(P1), _not_ready(P1), "auto", {}, (False, "unreachable, Pod not ready", False)),
        (down(P1), _READY_POD, "auto", {}, (None, "unreachable", False)),
        (down(P1), {**_READY_POD, "status": "junk"}, "auto", {}, (None, "unreachable", False)),
        (
            down(P1),
            {
                **_READY_POD,
                "status": {"conditions": ["junk", {"type": "Ready", "status": "False"}]},
            },
            "auto",
            {},
            (False, "unreachable, Pod not ready", False),
        ),
        (
            down(P1),
            {**_READY_POD, "status": {"conditions": "junk"}},
            "auto",
            {},
            (None, "unreachable", False),
        ),
        (
            MemberStatus.not_patroni(P1, "HTTP 302 on /primary without Patroni JSON", 302),
            _READY_POD,
            "auto",
            {},
            (False, "not a Patroni answer", False),
        ),
        (
            answer(P1, patroni_name="pg-other-3"),
            _READY_POD,
            "auto",
            {},
            (False, "answers as Patroni member pg-other-3", False),
        ),
        (
            answer(P1, patroni_name="pg-other-3"),
            _READY_POD,
            "auto",
            {"verify": False},
            (True, "", False),
        ),
        (
            answer(P1, scope="pg-billing"),
            _READY_POD,
            "auto",
            {},
            (False, "member of Patroni scope pg-billing", False),
        ),
        (
            answer(P1, "standby_leader"),
            _READY_POD,
            "auto",
            {},
            (False, "role standby_leader", False),
        ),
        (
            MemberStatus.from_api_response(P1, 503, {**_body(P1), "role": None}),
            _READY_POD,
            "auto",
            {},
            (False, "role unknown", False),
        ),
        (answer(P1, state="starting"), _READY_POD, "auto", {}, (False, "state starting", False)),
        (
            MemberStatus.from_api_response(P1, 503, {**_body(P1), "state": None}),
            _READY_POD,
            "auto",
            {},
            (False, "state unknown", False),
        ),
        (
            _tagged(P1, noloadbalance=True),
            _READY_POD,
            "auto",
            {},
            (False, "tagged noloadbalance", False),
        ),
        (
            _v3(),
            _READY_POD,
            "auto",
            {},
            (False, "Patroni 3.0.2 reports no replication_state (since 3.0.4)", True),
        ),
        (
            answer(P1, replication_state="in archive recovery"),
            _READY_POD,
            "auto",
            {},
            (False, "not streaming (in archive recovery)", True),
        ),
        (
            answer(P1, replication_state=None),
            _READY_POD,
            "auto",
            {},
            (False, "not streaming (unknown)", True),
        ),
        (
            answer(P1, behind=None),
            _READY_POD,
            "auto",
            {},
            (False, "no replayed WAL position", True),
        ),
        (_paused(P1), _READY_POD, "auto", {}, (False, "replay paused", False)),
        (_paused(P1), _READY_POD, "auto", {"include_paused": True}, (True, "", False)),
        (answer(P1, behind=MIB), _READY_POD, "auto", {}, (True, "", False)),
        (
            answer(P1, behind=MIB + 1),
            _READY_POD,
            "auto",
            {},
            (False, "replay lags more than 1 MiB", True),
        ),
    ],
)
def test_classify_gives_the_whole_verdict(
    member: MemberStatus,
    pod: dict[str, Any],
    ip: str | None,
    options: dict[str, bool],
    verdict: tuple[bool | None, str, bool],
) -> None:
    address = ipaddress.ip_address(member_ip(member.name)) if ip == "auto" else None
    spec_body = rs_spec(maxLagBytes=MIB, includePausedReplicas=options.get("include_paused", False))
    spec_body["patroni"] = {"memberNameMustMatchPod": options.get("verify", True)}
    spec, problems = load_spec(spec_body)
    assert spec is not None, problems
    got = classify(member, loaded_pod(pod), address, _LEADER, LEADER_AT, spec)
    assert (got.listed, got.reason, got.keepable) == verdict


# ====================================================== impostor Pods (issue 29)


@pytest.mark.parametrize(
    "labels",
    [
        {"application": "patroni", "cluster-name": CLUSTER, POD_NAME_LABEL: P2},
        {"application": "patroni", "cluster-name": CLUSTER},
        {"application": "patroni", "cluster-name": CLUSTER, POD_NAME_LABEL: P0},
    ],
    ids=["a copy of a replica", "no pod-name label", "the leader's pod-name label"],
)
def test_a_pod_that_is_not_its_statefulset_member_is_never_listed(labels: dict[str, str]) -> None:
    """A Pod with the members' labels whose pod-name label is not its own name is no member:
    even answering as a perfect Patroni replica under its own name, it is never listed."""
    impostor = "pg-orders-copy"
    pods = [
        make_pod(P0),
        make_pod(P1),
        make_pod(P2),
        make_pod(impostor, "10.244.9.10", labels=labels),
    ]
    answers = {**routed(), impostor: answer(impostor)}

    _, outcome = run(request_body(pods=pods), answers)

    if labels.get(POD_NAME_LABEL) == P0:
        # The primary is not routed (SelectorNotUnique), so no slice is written at all.
        assert outcome.decision is Decision.SELECTOR_NOT_UNIQUE
        assert children_of(outcome, "EndpointSlice") == {}
    else:
        assert endpoints_of(outcome) == [P1, P2]
        assert (
            "pg-orders-copy (statefulset.kubernetes.io/pod-name label is not its name)"
            in (condition(outcome, "ReplicasRouted")["message"])
        )
