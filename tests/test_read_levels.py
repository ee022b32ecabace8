"""Unit tests of reads by consistency level (:mod:`hooks.children.read_levels`, and through
``reconcile`` the read-only part with ``spec.replicaService.consistency``).

Test design notes
-----------------
* Plain values: the leader's answer is :func:`tests.child_helpers.answer` with its
  ``walsenders`` replaced (what ``replication`` in Patroni's answer parses into), so each
  case states the ``sync_state`` the leader reports for each member directly; the wire
  format itself is tested once through ``MemberStatus.from_api_response``.
* The pure functions are tested over every (level × sync_state) pair and every way the
  cluster cannot serve a level; the plan is tested for each level × each fallback
  (``KeepEndpoints``, ``UseLeader``, ``Empty``) with the level not served, and for the
  status/condition naming each member's level (and for ``lag`` not changing them at all).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from hooks.children.read_levels import (
    AMBIGUOUS,
    NOT_A_STANDBY,
    Unserved,
    describe,
    level_problem,
    levels,
    member_level,
    unserved,
)
from hooks.domain.members import MemberStatus, WalSender
from hooks.loaders.schemas import load_spec
from testbed.fakes.patroni_wire import patroni_body
from tests.child_helpers import (
    MIB,
    SLICE,
    answer,
    children_of,
    cluster_answers,
    condition,
    listed_slice,
    request_body,
    rs_spec,
    slice_names,
)
from tests.helpers import P0, P1, P2, fed_back, run

SYNC_STATES = ("sync", "potential", "quorum", "async", None)
LEVEL_STATE = {"synchronous": "sync", "quorum": "quorum"}


def leader(*states: tuple[str, str | None], version: tuple[int, ...] | None = (4, 1, 5)) -> Any:
    """The leader's answer listing walsenders (application_name, sync_state), streaming."""
    base = answer(P0, "primary")
    senders = tuple(WalSender(name, "streaming", state) for name, state in states)
    return dataclasses.replace(base, walsenders=senders, patroni_version=version)


# ================================================================ the wire format


def test_the_replication_list_of_patronis_answer_becomes_walsenders() -> None:
    body = patroni_body("primary", name=P0, members=(P0, P1, P2))
    body["replication"][0]["sync_state"] = "sync"
    body["replication"].append({"application_name": "pg_basebackup", "state": "backup"})
    body["replication"] += [{"state": "streaming"}, "junk", {"application_name": 7}]
    member = MemberStatus.from_api_response(P0, 200, body)
    assert member.walsenders == (
        WalSender(P1, "streaming", "sync"),
        WalSender(P2, "streaming", "async"),
        WalSender("pg_basebackup", "backup", None),
    )


@pytest.mark.parametrize("value", [None, {}, "x", 3, [None]])
def test_a_missing_or_malformed_replication_list_is_no_walsender(value: object) -> None:
    body = patroni_body("primary", name=P0)
    body["replication"] = value
    assert MemberStatus.from_api_response(P0, 200, body).walsenders == ()


def test_an_oversized_sync_state_is_cut_and_never_equals_a_real_one() -> None:
    body = patroni_body("primary", name=P0)
    body["replication"] = [{"application_name": P1, "sync_state": "sync" * 40}]
    (sender,) = MemberStatus.from_api_response(P0, 200, body).walsenders
    assert sender.sync_state is not None and sender.sync_state.endswith("…")
    assert level_problem("synchronous", leader((P1, sender.sync_state)), P1) is not None


# ================================================================ member_level


@pytest.mark.parametrize("state", SYNC_STATES)
def test_a_members_level_is_its_walsenders_sync_state(state: str | None) -> None:
    assert member_level(leader((P1, state)), P1) == (state or "unknown")


def test_a_member_without_a_walsender_is_not_a_standby() -> None:
    assert member_level(leader((P2, "sync")), P1) == NOT_A_STANDBY
    assert member_level(leader(), P1) == NOT_A_STANDBY


def test_names_are_compared_case_folded_like_patroni() -> None:
    assert member_level(leader((P1.upper(), "sync")), P1) == "sync"


def test_two_walsenders_of_one_name_make_the_level_ambiguous() -> None:
    assert member_level(leader((P1, "sync"), (P1, "sync")), P1) == AMBIGUOUS
    assert member_level(leader((P1, "sync"), (P1, "async")), P1) == AMBIGUOUS
    assert level_problem("synchronous", leader((P1, "sync"), (P1, "sync")), P1) == (
        f"{P0} lists several walsenders named {P1}"
    )


def test_levels_name_every_member_but_the_leader() -> None:
    found = levels(leader((P1, "sync"), (P2, "potential")), [P2, P0, P1, "pg-orders-9"])
    assert found == {P1: "sync", P2: "potential", "pg-orders-9": NOT_A_STANDBY}
    assert describe(found) == f"{P1} sync, {P2} potential, pg-orders-9 none"
    assert describe({}) == "none"


# ================================================================ level_problem


@pytest.mark.parametrize(
    ("consistency", "state"), list(itertools.product(["lag", *LEVEL_STATE], SYNC_STATES))
)
def test_every_level_against_every_sync_state(consistency: str, state: str | None) -> None:
    problem = level_problem(consistency, leader((P1, state)), P1)
    if consistency == "lag" or LEVEL_STATE[consistency] == state:
        assert problem is None
    else:
        assert problem == f"sync_state {state or 'unknown'}, not {LEVEL_STATE[consistency]}"


@pytest.mark.parametrize("consistency", ["synchronous", "quorum"])
def test_a_member_the_leader_does_not_list_is_not_a_standby(consistency: str) -> None:
    assert level_problem(consistency, leader(), P1) == f"not a standby of {P0}"


def test_lag_never_reads_the_replication_list() -> None:
    assert level_problem("lag", leader(), P1) is None
    assert level_problem("lag", leader((P1, "sync"), (P1, "x")), P1) is None


@pytest.mark.parametrize("version", [(3, 0, 0), (3, 3, 11), (3,)])
def test_quorum_on_a_patroni_before_4_0_serves_nobody(version: tuple[int, ...]) -> None:
    old = leader((P1, "quorum"), version=version)
    text = "Patroni " + ".".join(map(str, version))
    assert level_problem("quorum", old, P1) == f"no quorum commit in the leader's {text}"
    assert level_problem("synchronous", leader((P1, "sync"), version=version), P1) is None


@pytest.mark.parametrize("version", [(4, 0, 0), (4, 1, 5), None])
def test_quorum_from_4_0_on_or_an_unknown_version_reads_the_sync_state(
    version: tuple[int, ...] | None,
) -> None:
    assert level_problem("quorum", leader((P1, "quorum"), version=version), P1) is None


# ================================================================ unserved


def test_lag_is_always_served() -> None:
    assert unserved("lag", leader()) is None
    assert unserved("lag", leader(version=(3, 0, 0))) is None


NO_SYNC = "synchronous_mode is off (or quorum), or no standby is synchronous now"
NO_QUORUM = "synchronous_mode is not quorum, or no standby is in the quorum now"


@pytest.mark.parametrize(
    ("consistency", "senders", "why"),
    [
        ("synchronous", (), NO_SYNC),
        ("synchronous", ((P1, "async"), (P2, "potential")), NO_SYNC),
        ("synchronous", ((P1, "quorum"), (P2, "quorum")), NO_SYNC),
        ("quorum", (), NO_QUORUM),
        ("quorum", ((P1, "async"), (P2, None)), NO_QUORUM),
        ("quorum", ((P1, "sync"), (P2, "potential")), "synchronous_mode is true, not quorum"),
    ],
)
def test_a_leader_without_a_standby_at_the_level_cannot_serve_it(
    consistency: str, senders: tuple[tuple[str, str | None], ...], why: str
) -> None:
    wanted = LEVEL_STATE[consistency]
    assert unserved(consistency, leader(*senders)) == (
        Unserved.NO_STANDBY,
        f"Leader {P0} lists no {wanted} standby: {why}",
    )


@pytest.mark.parametrize(("consistency", "state"), [("synchronous", "sync"), ("quorum", "quorum")])
def test_one_standby_at_the_level_is_enough_to_serve_it(consistency: str, state: str) -> None:
    assert unserved(consistency, leader((P1, "async"), (P2, state))) is None


def test_quorum_on_patroni_3_names_the_version_whatever_the_leader_lists() -> None:
    for senders in ((), ((P1, "quorum"),), ((P1, "sync"),)):
        assert unserved("quorum", leader(*senders, version=(3, 3, 2))) == (
            Unserved.VERSION,
            f"Leader {P0} runs Patroni 3.3.2: quorum commit (synchronous_mode: quorum) "
            "needs Patroni 4.0 or later",
        )


# ================================================================ the spec


@pytest.mark.parametrize("value", ["lag", "synchronous", "quorum"])
def test_every_level_loads(value: str) -> None:
    spec, problems = load_spec(rs_spec(consistency=value))
    assert problems == () and spec is not None and spec.replica_service is not None
    assert spec.replica_service.consistency == value


def test_lag_is_the_default() -> None:
    spec, _ = load_spec(rs_spec())
    assert spec is not None and spec.replica_service is not None
    assert spec.replica_service.consistency == "lag"


@pytest.mark.parametrize("value", ["sync", "Synchronous", "", 1, None, ["quorum"], "remote_apply"])
def test_an_invalid_level_is_a_spec_problem_naming_the_field_and_the_choices(value: object) -> None:
    spec, problems = load_spec(rs_spec(consistency=value))
    assert spec is None
    text = " ".join(f"{p.field}: {p.message}" for p in problems)
    assert "spec.replicaService.consistency" in text, problems
    if isinstance(value, str):
        assert "must be one of: lag, synchronous, quorum" in text, problems


def test_an_invalid_level_keeps_everything_and_says_so_in_spec_valid() -> None:
    body = request_body(spec=rs_spec(consistency="sync"), slices=[listed_slice([P1, P2])])
    _, outcome = run(body, cluster_answers(P0))
    valid = condition(outcome, "SpecValid")
    assert valid["status"] == "False"
    assert "spec.replicaService.consistency" in valid["message"]
    assert slice_names(children_of(outcome, "EndpointSlice")[SLICE]) == [P1, P2]


# ================================================================ the plan


def answers_with(lead: MemberStatus, **replicas: MemberStatus) -> dict[str, MemberStatus]:
    return cluster_answers(P0, **replicas) | {P0: lead}


def endpoints(outcome: Any) -> list[str]:
    return slice_names(children_of(outcome, "EndpointSlice")[SLICE])


def test_synchronous_lists_only_the_sync_standby_and_names_every_level() -> None:
    body = request_body(spec=rs_spec(consistency="synchronous"))
    _, outcome = run(body, answers_with(leader((P1, "potential"), (P2, "sync"))))
    assert endpoints(outcome) == [P2]
    assert outcome.body["status"]["replicaEndpoints"] == [P2]
    assert outcome.body["status"]["replicaLevels"] == {P1: "potential", P2: "sync"}
    routed = condition(outcome, "ReplicasRouted")
    assert (routed["status"], routed["reason"]) == ("True", "SynchronousReplicasRouted")
    assert routed["message"] == (
        f"1 synchronous replica(s) within 16 MiB of leader {P0}: {P2}; "
        f"levels (sync_state on {P0}): {P1} potential, {P2} sync; "
        f"left out: {P1} (sync_state potential, not sync)"
    )


def test_quorum_lists_every_quorum_standby() -> None:
    body = request_body(spec=rs_spec(consistency="quorum"))
    _, outcome = run(body, answers_with(leader((P1, "quorum"), (P2, "quorum"))))
    assert endpoints(outcome) == [P1, P2]
    routed = condition(outcome, "ReplicasRouted")
    assert (routed["status"], routed["reason"]) == ("True", "QuorumReplicasRouted")
    assert routed["message"] == (
        f"2 quorum replica(s) within 16 MiB of leader {P0}: {P1}, {P2}; "
        f"levels (sync_state on {P0}): {P1} quorum, {P2} quorum"
    )


def test_a_sync_standby_must_still_meet_the_lag_limit() -> None:
    body = request_body(spec=rs_spec(consistency="synchronous"))
    answers = answers_with(
        leader((P1, "sync"), (P2, "sync")), pg_orders_1=answer(P1, behind=64 * MIB)
    )
    _, outcome = run(body, answers)
    assert endpoints(outcome) == [P2]
    assert f"{P1} (replay lags more than 16 MiB)" in condition(outcome, "ReplicasRouted")["message"]


def test_a_sync_standby_that_is_not_streaming_is_left_out() -> None:
    body = request_body(spec=rs_spec(consistency="synchronous"))
    answers = answers_with(
        leader((P1, "sync"), (P2, "sync")), pg_orders_2=answer(P2, replication_state="stopped")
    )
    _, outcome = run(body, answers)
    assert endpoints(outcome) == [P1]


FALLBACK_CASES = [
    # (consistency, leader, reason, the condition's first sentence)
    (
        "synchronous",
        leader((P1, "async"), (P2, "async")),
        "NoSynchronousStandby",
        f"Leader {P0} lists no sync standby: synchronous_mode is off (or quorum), or no "
        "standby is synchronous now",
    ),
    (
        "quorum",
        leader((P1, "sync"), (P2, "potential")),
        "NoQuorumStandby",
        f"Leader {P0} lists no quorum standby: synchronous_mode is true, not quorum",
    ),
    (
        "quorum",
        leader((P1, "quorum"), (P2, "quorum"), version=(3, 3, 11)),
        "QuorumNotSupported",
        f"Leader {P0} runs Patroni 3.3.11: quorum commit (synchronous_mode: quorum) needs "
        "Patroni 4.0 or later",
    ),
]


@pytest.mark.parametrize(("consistency", "lead", "reason", "first"), FALLBACK_CASES)
@pytest.mark.parametrize(
    ("when", "expected", "tail"),
    [
        (
            "KeepEndpoints",
            [P1, P2],
            f"keeping the endpoints listed before: {P1}, {P2} (whenNoReplica: KeepEndpoints)",
        ),
        (
            "UseLeader",
            [P0],
            f"routing read-only traffic to the leader {P0} (whenNoReplica: UseLeader)",
        ),
        ("Empty", [], "the read-only endpoints are empty (whenNoReplica: Empty)"),
    ],
)
def test_a_level_the_cluster_cannot_serve_gives_its_reason_and_the_fallback(
    consistency: str,
    lead: MemberStatus,
    reason: str,
    first: str,
    when: str,
    expected: list[str],
    tail: str,
) -> None:
    body = request_body(
        spec=rs_spec(consistency=consistency, whenNoReplica=when),
        slices=[listed_slice([P1, P2])],
    )
    _, outcome = run(body, answers_with(lead))
    assert endpoints(outcome) == expected
    routed = condition(outcome, "ReplicasRouted")
    assert (routed["status"], routed["reason"]) == ("False", reason)
    assert routed["message"].startswith(first + "; levels (sync_state on "), routed
    assert routed["message"].endswith(tail), routed
    # The primary Service is untouched by the level.
    assert outcome.body["status"]["primary"] == P0
    assert condition(outcome, "Ready")["status"] == "True"
    assert "replicaLevels" in outcome.body["status"]


@pytest.mark.parametrize("consistency", ["synchronous", "quorum"])
def test_standbys_at_the_level_that_do_not_qualify_give_no_replica_at_level(
    consistency: str,
) -> None:
    state = LEVEL_STATE[consistency]
    body = request_body(spec=rs_spec(consistency=consistency), slices=[listed_slice([P1])])
    answers = answers_with(
        leader((P1, state), (P2, "async")), pg_orders_1=answer(P1, behind=64 * MIB)
    )
    _, outcome = run(body, answers)
    routed = condition(outcome, "ReplicasRouted")
    reason = {"synchronous": "NoSynchronousReplica", "quorum": "NoQuorumReplica"}[consistency]
    assert (routed["status"], routed["reason"]) == ("False", reason)
    assert routed["message"].startswith(
        f"No {consistency} replica streams within 16 MiB of leader {P0}"
    )
    # A member below the level is kept like a lagging one under KeepEndpoints.
    assert endpoints(outcome) == [P1]


def test_keep_endpoints_keeps_a_member_that_left_sync() -> None:
    body = request_body(spec=rs_spec(consistency="synchronous"), slices=[listed_slice([P1])])
    _, outcome = run(body, answers_with(leader((P1, "potential"), (P2, "async"))))
    assert endpoints(outcome) == [P1]
    assert outcome.body["status"]["replicaLevels"] == {P1: "potential", P2: "async"}


def test_a_member_leaving_sync_leaves_the_endpoints_while_another_is_sync() -> None:
    body = request_body(spec=rs_spec(consistency="synchronous"), slices=[listed_slice([P1, P2])])
    _, outcome = run(body, answers_with(leader((P1, "async"), (P2, "sync"))))
    assert endpoints(outcome) == [P2]


@pytest.mark.parametrize("consistency", [None, "lag"])
def test_lag_changes_neither_the_status_nor_the_condition(consistency: str | None) -> None:
    """The same reply bytes as before the field existed, whatever the leader lists."""
    extra = {} if consistency is None else {"consistency": consistency}
    lead = leader((P1, "sync"), (P2, "async"))
    _, plain = run(request_body(), answers_with(answer(P0, "primary")))
    _, with_level = run(request_body(spec=rs_spec(**extra)), answers_with(lead))
    assert "replicaLevels" not in with_level.body["status"]
    assert with_level.body["status"] == plain.body["status"] | {
        "observedGeneration": with_level.body["status"]["observedGeneration"]
    }
    assert condition(with_level, "ReplicasRouted") == condition(plain, "ReplicasRouted")


@pytest.mark.parametrize("consistency", ["synchronous", "quorum"])
def test_a_level_reply_converges_when_its_status_is_fed_back(consistency: str) -> None:
    body = request_body(spec=rs_spec(consistency=consistency))
    answers = answers_with(leader((P1, LEVEL_STATE[consistency]), (P2, "async")))
    _, first = run(body, answers)
    _, second = run(fed_back(body, first), answers)
    assert second.body["status"] == first.body["status"]


@pytest.mark.parametrize("consistency", ["synchronous", "quorum"])
def test_without_a_confirmed_leader_the_endpoints_are_kept_and_no_level_is_named(
    consistency: str,
) -> None:
    body = request_body(spec=rs_spec(consistency=consistency), slices=[listed_slice([P1, P2])])
    no_leader = cluster_answers(P0) | {P0: answer(P0, "replica")}
    _, outcome = run(body, no_leader)
    assert endpoints(outcome) == [P1, P2]
    assert "replicaLevels" not in outcome.body["status"]
    assert condition(outcome, "ReplicasRouted")["reason"] == "LeaderNotConfirmed"
