"""Unit tests of :mod:`hooks.domain.members`: what one Patroni answer means.

Test design notes
-----------------
* ``MemberStatus.from_api_response`` is the only place an HTTP status and a JSON body
  become a verdict, so it is tested as a truth table: status code × body shape ×
  role × state × health path, each row with the full expected verdict
  (``verdict``, ``claims_leadership``, ``reachable``, ``is_leader``).
* The decisive distinction is between *claiming* (any 200 on the health path, which
  Patroni gives only to the lock holder) and *being* the leader (200 + ``running`` +
  a leader role for that path). ``hooks.core.routing`` counts claimants to detect two leaders
  and refuses to route to a claimant that is not yet a leader, so both flags are
  asserted in every row.
* Bodies come from ``tests.helpers.patroni_body`` (Patroni 4.1's shape) and are then
  bent into the older or odder shapes: Patroni 3's ``master``, missing keys, wrong types,
  a ``wal`` key (which no Patroni sends, so it is not read). Whole answers of Patroni
  3.0.3, 3.2.2 and 4.1.4 go through the app in ``test_patroni_versions.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hooks.domain.members import LEADER_ROLES, MemberStatus, ProbeTarget, ProbeVerdict
from hooks.domain.model import LEADER_PATHS
from testbed.fakes.patroni_wire import patroni_body

LEADER, NOT_LEADER, UNREACHABLE = (
    ProbeVerdict.LEADER,
    ProbeVerdict.NOT_LEADER,
    ProbeVerdict.UNREACHABLE,
)


#: An answer, but not Patroni's: answered, not the leader (issue 10).
FOREIGN = (NOT_LEADER, False, True, False)


def answer(status: int, body: object, path: str = "/primary") -> MemberStatus:
    return MemberStatus.from_api_response(
        "pg-orders-1", status, body, health_path=path, leader_roles=LEADER_PATHS[path]
    )


def flags(member: MemberStatus) -> tuple[ProbeVerdict, bool, bool, bool]:
    return member.verdict, member.claims_leadership, member.reachable, member.is_leader


# ================================================================ status codes


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, (LEADER, True, True, True)),
        (503, (NOT_LEADER, False, True, False)),
        (500, (NOT_LEADER, False, True, False)),
        (502, (NOT_LEADER, False, True, False)),
        (404, (NOT_LEADER, False, True, False)),
        (400, (NOT_LEADER, False, True, False)),
        (429, (NOT_LEADER, False, True, False)),
        (599, (NOT_LEADER, False, True, False)),
        (301, FOREIGN),
        (302, FOREIGN),
        (304, FOREIGN),
        (307, FOREIGN),
        (308, FOREIGN),
        (100, FOREIGN),
        (201, FOREIGN),
        (204, FOREIGN),
        (600, FOREIGN),
        (0, FOREIGN),
    ],
)
def test_a_primary_body_means_what_the_status_code_says(
    status: int, expected: tuple[ProbeVerdict, bool, bool, bool]
) -> None:
    member = answer(status, patroni_body("primary", name="pg-orders-1"))
    assert flags(member) == expected
    foreign = not (status == 200 or 400 <= status < 600)
    assert member.patroni_answer is not foreign
    assert member.name == "pg-orders-1"
    if foreign:
        assert f"unexpected HTTP {status} on /primary" == member.reason
        assert member.role is None and member.http_status == status


def test_a_leader_answer_keeps_every_useful_field() -> None:
    member = answer(200, patroni_body("primary", timeline=3, name="pg-orders-1"))
    assert member == MemberStatus(
        name="pg-orders-1",
        verdict=LEADER,
        reason="HTTP 200 on /primary: primary, running",
        http_status=200,
        claims_leadership=True,
        role="primary",
        state="running",
        timeline=3,
        wal_position=50332016,
        received_position=None,
        replication_state=None,
        patroni_name="pg-orders-1",
        patroni_scope="pg-orders",
        patroni_version=(4, 1, 5),
    )


def test_a_replica_answer_keeps_its_received_and_replayed_positions() -> None:
    body = patroni_body("replica", timeline=2, name="pg-orders-2")
    body["xlog"].update(received_location=900, replayed_location=700)
    member = answer(503, body)
    assert member == MemberStatus(
        name="pg-orders-1",
        verdict=NOT_LEADER,
        reason="HTTP 503 on /primary: replica, running",
        http_status=503,
        claims_leadership=False,
        role="replica",
        state="running",
        timeline=2,
        wal_position=700,
        received_position=900,
        replication_state="streaming",
        patroni_name="pg-orders-2",
        patroni_scope="pg-orders",
        patroni_version=(4, 1, 5),
    )


# ======================================================== claiming vs leading


@pytest.mark.parametrize(
    ("role", "state"),
    [
        ("replica", "running"),  # Patroni's first 200 after a promotion
        ("primary", "stopping"),  # a leader that lost the DCS, on its way out
        ("primary", "starting"),
        ("primary", "restarting"),
        ("primary", "crashed"),
        ("primary", "Running"),
        ("Primary", "running"),
        ("standby_leader", "running"),  # not a leader role on /primary
        ("sync_standby", "running"),
    ],
)
def test_a_200_that_is_not_a_running_leader_claims_but_does_not_lead(role: str, state: str) -> None:
    member = answer(200, patroni_body(role, state))
    assert flags(member) == (NOT_LEADER, True, True, False)
    assert member.reason == f"HTTP 200 on /primary but role={role}, state={state}"


@pytest.mark.parametrize("body", [{"role": "primary"}, {"state": "running"}])
def test_a_200_with_only_role_or_only_state_claims_but_does_not_lead(body: dict[str, Any]) -> None:
    assert flags(answer(200, body)) == (NOT_LEADER, True, True, False)


# ======================================================================= paths


@pytest.mark.parametrize(
    ("path", "role", "leads"),
    [
        ("/primary", "primary", True),
        ("/primary", "standby_leader", False),
        ("/master", "primary", True),
        ("/master", "master", True),
        ("/read-write", "primary", True),
        ("/leader", "primary", True),
        ("/leader", "standby_leader", True),
        ("/leader", "replica", False),
        ("/standby-leader", "standby_leader", True),
        ("/standby-leader", "primary", False),
        ("/standby_leader", "standby_leader", True),
        ("/standby_leader", "master", False),
    ],
)
def test_the_leader_role_depends_on_the_health_path(path: str, role: str, leads: bool) -> None:
    member = answer(200, patroni_body(role), path)
    assert member.claims_leadership is True
    assert member.is_leader is leads
    assert path in member.reason


def test_without_explicit_roles_both_leader_roles_count() -> None:
    assert {"primary", "standby_leader"} == LEADER_ROLES
    for role in ("primary", "master", "standby_leader"):
        assert MemberStatus.from_api_response("m", 200, patroni_body(role)).is_leader


# ============================================================ Patroni versions


def test_patroni_3_master_and_xlog_are_understood() -> None:
    body = patroni_body("master", timeline=5)
    assert body["xlog"] == {"location": 50332016}
    member = answer(200, body)
    assert (member.verdict, member.role, member.wal_position, member.timeline) == (
        LEADER,
        "primary",
        50332016,
        5,
    )


@pytest.mark.parametrize(
    ("section", "wal", "received"),
    [
        ({"location": 123}, 123, None),
        ({"received_location": 9, "replayed_location": 8}, 8, 9),
        ({"replayed_location": 8}, 8, None),
        ({"received_location": 9}, None, 9),
        ({"location": 7, "replayed_location": 8, "received_location": 9}, 7, None),
        ({}, None, None),
    ],
)
def test_wal_positions_are_read_from_xlog(
    section: dict[str, int], wal: int | None, received: int | None
) -> None:
    body = patroni_body("replica")
    body["xlog"] = section
    member = answer(503, body)
    assert (member.wal_position, member.received_position) == (wal, received)


def test_a_wal_key_is_not_read_patroni_never_sends_one() -> None:
    """Patroni 3.0 to 4.1 put positions in ``xlog`` only (``get_postgresql_status``)."""
    body = patroni_body("replica")
    body["wal"] = body.pop("xlog")
    member = answer(503, body)
    assert (member.wal_position, member.received_position) == (None, None)


@pytest.mark.parametrize(
    "bad",
    [-1, True, False, "123", 1.5, None, [1], {"lsn": 1}],
    ids=lambda v: repr(v),
)
def test_positions_that_are_not_non_negative_integers_are_ignored(bad: object) -> None:
    body = patroni_body("replica")
    body["xlog"] = {"received_location": bad, "replayed_location": bad}
    member = answer(503, body)
    assert (member.wal_position, member.received_position) == (None, None)
    primary = patroni_body("primary")
    primary["xlog"] = {"location": bad}
    assert answer(200, primary).wal_position is None


@pytest.mark.parametrize("section", [None, "0/3000060", 50332016, [1, 2]])
def test_a_position_section_that_is_not_an_object_is_ignored(section: object) -> None:
    body = patroni_body("primary")
    body["xlog"] = section
    member = answer(200, body)
    assert (member.wal_position, member.received_position) == (None, None)
    assert member.replay_paused is False
    assert member.is_leader


@pytest.mark.parametrize(
    ("timeline", "expected"),
    [
        (0, 0),
        (1, 1),
        (2**40, 2**40),
        (-1, None),
        (True, None),
        (False, None),
        ("2", None),
        (2.0, None),
        (None, None),
    ],
    ids=lambda v: repr(v),
)
def test_only_a_non_negative_integer_timeline_is_kept(
    timeline: object, expected: int | None
) -> None:
    body = patroni_body("primary")
    body["timeline"] = timeline
    assert answer(200, body).timeline == expected


@pytest.mark.parametrize("value", ["", 0, None, ["primary"], {"x": 1}])
def test_empty_or_non_string_role_state_and_names_become_none(value: object) -> None:
    body = patroni_body("replica")
    body.update(
        role=value, state=value, replication_state=value, patroni={"name": value, "scope": value}
    )
    member = answer(503, body)
    assert (
        member.role,
        member.state,
        member.replication_state,
        member.patroni_name,
        member.patroni_scope,
    ) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert member.verdict is NOT_LEADER  # the keys are there: it is Patroni, saying little


@pytest.mark.parametrize("patroni", [None, "4.1.5", [], 5])
def test_a_patroni_section_that_is_not_an_object_gives_no_names(patroni: object) -> None:
    body = patroni_body("primary")
    body["patroni"] = patroni
    member = answer(200, body)
    assert (member.patroni_name, member.patroni_scope, member.is_leader) == (None, None, True)


# ================================================================= not Patroni


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"status": "ok"},
        {"patroni": {"version": "4.1.5", "scope": "pg-orders", "name": "pg-orders-1"}},
        {"timeline": 3, "xlog": {"location": 1}},
        {"Role": "primary", "State": "running"},
    ],
    ids=[
        "empty",
        "someone else's JSON",
        "only the patroni section",
        "no role or state",
        "wrong case",
    ],
)
@pytest.mark.parametrize("status", [200, 503, 404])
def test_an_object_without_patroni_keys_is_an_answer_but_not_the_leader_even_with_200(
    body: object, status: int
) -> None:
    member = answer(status, body)
    assert flags(member) == FOREIGN
    assert member.patroni_answer is False and member.answered_as_patroni is False
    assert member.reason == f"HTTP {status} on /primary without Patroni JSON"
    assert member.http_status == status


@pytest.mark.parametrize(
    "body",
    [None, "primary", "", b'{"role": "primary"}', ["role", "state"], 200, 1.5, True],
    ids=lambda v: type(v).__name__,
)
@pytest.mark.parametrize("status", [200, 503])
def test_a_body_that_is_not_an_object_is_an_answer_but_not_the_leader(
    body: object, status: int
) -> None:
    member = answer(status, body)
    assert flags(member) == FOREIGN
    assert member.patroni_answer is False


# ===================================================================== values


def test_unknown_is_unreachable_with_its_reason_and_nothing_else() -> None:
    member = MemberStatus.unknown("pg-orders-0", "connection refused")
    assert member == MemberStatus(
        name="pg-orders-0", verdict=UNREACHABLE, reason="connection refused", patroni_answer=False
    )
    assert flags(member) == (UNREACHABLE, False, False, False)
    assert member.answered_as_patroni is False
    flags_ = (
        "claims_leadership",
        "replay_paused",
        "noloadbalance",
        "patroni_answer",
        "failsafe_active",
    )
    assert all(
        getattr(member, f.name) is None
        for f in dataclasses.fields(member)
        if f.name not in ("name", "verdict", "reason", "walsenders", *flags_)
    )
    assert not any(getattr(member, f) for f in flags_)
    assert member.walsenders == ()


def test_member_status_and_probe_target_are_immutable_values() -> None:
    member = answer(200, patroni_body("primary"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        member.verdict = NOT_LEADER  # type: ignore[misc]
    assert member == answer(200, patroni_body("primary"))
    assert hash(member) == hash(answer(200, patroni_body("primary")))
    target = ProbeTarget("pg-orders-0", "http://10.0.0.1:8008/primary", 0.5, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.url = "http://evil.example/"  # type: ignore[misc]
    assert (target.health_path, target.leader_roles) == ("/primary", frozenset({"primary"}))


def test_the_verdict_values_are_stable_metric_labels() -> None:
    assert [v.value for v in ProbeVerdict] == ["leader", "not_leader", "unreachable"]


# ================================================== issue 10: what older releases lack


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("4.1.5", (4, 1, 5)),
        ("3.0.3", (3, 0, 3)),
        ("4.2.0.dev1", (4, 2, 0)),
        ("4.2.0rc1", (4, 2, 0)),
        ("4.2rc1", (4, 2)),
        ("4.dev1", (4,)),
        ("4.1.5.2", (4, 1, 5)),
        ("4", (4,)),
        ("", None),
        ("x.y", None),
        (None, None),
        (4.1, None),
    ],
    ids=repr,
)
def test_the_patroni_version_is_read_as_numbers(
    version: object, expected: tuple[int, ...] | None
) -> None:
    body = patroni_body("replica")
    body["patroni"]["version"] = version
    member = answer(503, body)
    assert member.patroni_version == expected
    assert member.older_than((3, 0, 4)) is (expected is not None and expected < (3, 0, 4))


def test_a_release_is_not_older_than_itself() -> None:
    body = patroni_body("replica")
    body["patroni"]["version"] = "3.2.0"
    member = answer(503, body)
    assert not member.older_than((3, 2, 0))
    assert member.older_than((3, 2, 1))
    assert not member.older_than((3, 1, 9))


def test_the_health_path_defaults_to_primary() -> None:
    """Without a health path the answer is read as one to ``/primary``, in every reason."""
    body = patroni_body("replica")
    assert MemberStatus.from_api_response("m", 503, body).reason == (
        "HTTP 503 on /primary: replica, running"
    )
    assert MemberStatus.from_api_response("m", 302, body).reason == (
        "unexpected HTTP 302 on /primary"
    )


@pytest.mark.parametrize(
    ("tags", "noloadbalance"),
    [
        (None, False),
        ({}, False),
        ({"noloadbalance": True}, True),
        ({"noloadbalance": False}, False),
        # Patroni reads the configured value with bool() (Tags.noloadbalance): so do we.
        ({"noloadbalance": "true"}, True),
        ({"noloadbalance": 1}, True),
        ({"noloadbalance": ""}, False),
        ({"nofailover": True, "clonefrom": True}, False),
        (["noloadbalance"], False),
    ],
    ids=repr,
)
def test_noloadbalance_is_read_from_tags_as_patroni_reads_it(
    tags: object, noloadbalance: bool
) -> None:
    body = patroni_body("replica")
    if tags is not None:
        body["tags"] = tags
    assert answer(503, body).noloadbalance is noloadbalance


@pytest.mark.parametrize(("paused", "expected"), [(True, True), (False, False), ("t", False)])
def test_paused_replay_is_read_from_xlog(paused: object, expected: bool) -> None:
    body = patroni_body("replica")
    body["xlog"]["paused"] = paused
    assert answer(503, body).replay_paused is expected
