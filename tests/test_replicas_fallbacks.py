"""The read-only Service part: unreachable members, fallbacks, doubts, spec changes.

The test design notes are those of tests/test_replicas_objects.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from hooks.children.primary import desired_service
from hooks.children.read_members import NOT_READY
from hooks.core.routing import Decision
from hooks.domain.model import ENDPOINTSLICE_KEY, LAST_APPLIED_ANNOTATION
from hooks.loaders.schemas import load_spec
from tests.child_helpers import (
    MIB,
    READ_ONLY,
    SLICE,
    answer,
    children_of,
    cluster_answers,
    condition,
    listed_slice,
    read_only_service,
    request_body,
    rs_spec,
    slice_names,
)
from tests.doubts import DOUBTS, Doubt
from tests.helpers import (
    NAMESPACE,
    P0,
    P1,
    P2,
    P3,
    SERVICE_NAME,
    down,
    fed_back,
    make_pod,
    make_service,
    member_ip,
    preserved,
    run,
    seed_spec,
)
from tests.replicas_cases import (
    PRIMARY,
    all_lagging,
    endpoints_of,
    paused_member,
    routed,
    tagged_member,
)

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


def test_keep_endpoints_keeps_the_members_listed_before_when_none_qualifies() -> None:
    body = request_body(slices=[listed_slice([P1, P2])])
    _, outcome = run(body, all_lagging())

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
    _, outcome = run(body, routed(pg_orders_2=paused_member(P2)))
    assert endpoints_of(outcome) == [P1, P2]
    assert "left out" not in condition(outcome, "ReplicasRouted")["message"]


def test_keep_endpoints_drops_paused_and_noloadbalance_members_listed_before() -> None:
    """Neither is a "stale but serving" replica: Patroni keeps them away from clients."""
    body = request_body(slices=[listed_slice([P1, P2])])
    answers = routed(
        pg_orders_1=paused_member(P1), pg_orders_2=tagged_member(P2, noloadbalance=True)
    )
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
    _, outcome = run(request_body(), all_lagging())

    slice_ = children_of(outcome, "EndpointSlice")[SLICE]
    assert slice_["endpoints"] is None  # what the API server returns for "no endpoints"
    assert outcome.body["status"]["replicaEndpoints"] == []
    assert condition(outcome, "ReplicasRouted")["message"].endswith(
        "keeping the endpoints listed before: none (whenNoReplica: KeepEndpoints)"
    )


def test_use_leader_lists_the_leader_when_no_replica_qualifies() -> None:
    body = request_body(spec=rs_spec(whenNoReplica="UseLeader"), slices=[listed_slice([P1])])
    _, outcome = run(body, all_lagging())

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
    _, outcome = run(body, all_lagging())

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


# ================================================= the Pod's readiness (Patroni's /readiness)


def _not_ready_pod(name: str) -> dict[str, Any]:
    """A member Pod the kubelet reports not Ready (its readiness probe: Patroni's /readiness,
    which since 4.1 answers 503 for a replica not streaming within maximum_lag_on_failover)."""
    pod = make_pod(name)
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return pod


def test_a_replica_whose_pod_is_not_ready_is_left_out_though_it_answers_well() -> None:
    body = request_body(pods=[make_pod(P0), make_pod(P1), _not_ready_pod(P2)])
    _, outcome = run(body, routed())

    assert endpoints_of(outcome) == [P1]
    message = condition(outcome, "ReplicasRouted")["message"]
    assert message.endswith(f"; left out: pg-orders-2 ({NOT_READY})"), message


def test_keep_endpoints_never_keeps_a_replica_whose_pod_is_not_ready() -> None:
    """Kubernetes' own slices would list it not ready: it is no "stale but serving" one."""
    pods = [make_pod(P0), _not_ready_pod(P1), _not_ready_pod(P2)]
    body = request_body(pods=pods, slices=[listed_slice([P1, P2])])
    _, outcome = run(body, routed())

    assert endpoints_of(outcome) == []
    ready = condition(outcome, "ReplicasRouted")
    assert ready["status"] == "False", ready
    assert f"pg-orders-1 ({NOT_READY}), pg-orders-2 ({NOT_READY})" in ready["message"]


def test_use_leader_serves_reads_when_every_replica_pod_is_not_ready() -> None:
    pods = [make_pod(P0), _not_ready_pod(P1), _not_ready_pod(P2)]
    body = request_body(spec=rs_spec(whenNoReplica="UseLeader"), pods=pods)
    _, outcome = run(body, routed())

    assert endpoints_of(outcome) == [P0]


def test_a_pod_that_turns_ready_again_is_listed_again() -> None:
    body = request_body(
        slices=[listed_slice([P1])], pods=[make_pod(P0), make_pod(P1), make_pod(P2)]
    )
    _, outcome = run(body, routed())

    assert endpoints_of(outcome) == [P1, P2]
