"""hooks.probe.answer with plain values: what a member's parsed answer means.

Test design: requests parses the HTTP (``tests/test_probes.py`` sends the same answers
over real sockets); here each rule of the verdict is checked at its edge without any
socket: a declared length equal to the cap and one past it, lengths that are not one plain
number, more digits than CPython converts, the target's path and roles. The statuses are
compared whole (verdict, reason, HTTP status, what Patroni said), so a wrong field fails,
not only a wrong verdict.
"""

from __future__ import annotations

import json

import pytest

from hooks.domain.members import MemberStatus, ProbeTarget, ProbeVerdict
from hooks.domain.model import LEADER_PATHS
from hooks.probe.answer import head_verdict, status_from_body, too_large
from testbed.fakes.patroni_wire import patroni_body

TARGET = ProbeTarget(
    pod="pg-0", url="http://10.0.0.5:8008/primary", connect_timeout=1, read_timeout=1
)
CAP = 1024


def not_patroni(reason: str, status: int = 200) -> MemberStatus:
    return MemberStatus.not_patroni("pg-0", reason, status)


def head(*lengths: str, transfer_coded: bool = False, cap: int = CAP) -> MemberStatus | None:
    return head_verdict(
        TARGET, 200, content_lengths=list(lengths), transfer_coded=transfer_coded, cap=cap
    )


# ------------------------------------------------------------------------ the head


def test_patronis_head_without_a_length_is_read_on() -> None:
    assert head() is None


@pytest.mark.parametrize("length", ["0", "1", "1024", "0001024", " 12 ", "\t7"])
def test_a_plain_length_within_the_cap_is_read_on(length: str) -> None:
    assert head(length) is None


@pytest.mark.parametrize("length", ["1025", "00001025", "9" * 5, "9" * 5000, "1" + "0" * 4400])
def test_a_declared_length_past_the_cap_is_refused_before_any_body(length: str) -> None:
    # 5,000 digits: more than int() converts (4,300); compared without converting.
    assert head(length) == not_patroni(f"body larger than {CAP} bytes")


def test_the_declared_length_may_equal_the_cap_not_exceed_it() -> None:
    assert head("100", cap=100) is None
    assert head("101", cap=100) == not_patroni("body larger than 100 bytes")


@pytest.mark.parametrize("length", ["12abc", "", "-1", "+5", "1.0", "2, 2", "²", "0x10", "1 2"])
def test_a_length_that_is_not_one_plain_number_means_not_patroni(length: str) -> None:
    assert head(length) == not_patroni("malformed Content-Length")


def test_two_content_lengths_mean_not_patroni_even_when_equal() -> None:
    assert head("2", "2") == not_patroni("malformed Content-Length")


def test_a_transfer_coding_means_not_patroni_whatever_the_length() -> None:
    reason = not_patroni("HTTP transfer coding (not Patroni)")
    assert head(transfer_coded=True) == reason
    assert head("2", transfer_coded=True) == reason


def test_the_status_code_is_kept_in_a_head_verdict() -> None:
    verdict = head_verdict(TARGET, 302, content_lengths=["x"], transfer_coded=False, cap=CAP)
    assert verdict == not_patroni("malformed Content-Length", 302)
    assert too_large(TARGET, 503, 7) == not_patroni("body larger than 7 bytes", 503)


# ------------------------------------------------------------------------ the verdict


def test_json_that_is_not_patronis_is_not_patroni() -> None:
    status = status_from_body(TARGET, 200, b'{"hello": 1}')
    assert status.verdict is ProbeVerdict.NOT_LEADER and not status.patroni_answer
    assert status.reason == "HTTP 200 on /primary without Patroni JSON"


def test_a_body_that_is_not_json_names_the_code_and_the_path() -> None:
    leader_path = ProbeTarget(
        pod="pg-0",
        url="http://10.0.0.5:8008/leader",
        connect_timeout=1,
        read_timeout=1,
        health_path="/leader",
        leader_roles=frozenset({"primary"}),
    )
    assert status_from_body(leader_path, 502, b"<html>502</html>") == not_patroni(
        "HTTP 502 on /leader with a non-JSON body", 502
    )
    assert status_from_body(TARGET, 200, b"\xff\xfe") == not_patroni(
        "HTTP 200 on /primary with a non-JSON body"
    )


@pytest.mark.parametrize("depth", [65, 5_000, 30_000])
def test_a_deeply_nested_body_is_not_patroni_never_a_recursion_error(depth: int) -> None:
    """A member (or whoever holds its IP) answering 64 KiB of brackets: refused by the one
    bounded parser (hooks.loaders.jsonbody), not by the interpreter's recursion limit."""
    for body in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        assert status_from_body(TARGET, 200, body) == not_patroni(
            "HTTP 200 on /primary with a non-JSON body"
        )


@pytest.mark.parametrize(
    ("path", "role", "verdict", "reason"),
    [
        (
            "/leader",
            "standby_leader",
            ProbeVerdict.LEADER,
            "HTTP 200 on /leader: standby_leader, running",
        ),
        (
            "/standby-leader",
            "primary",
            ProbeVerdict.NOT_LEADER,
            "HTTP 200 on /standby-leader but role=primary, state=running",
        ),
    ],
)
def test_the_targets_health_path_and_leader_roles_decide(
    path: str, role: str, verdict: ProbeVerdict, reason: str
) -> None:
    target = ProbeTarget(
        pod="pg-0",
        url=f"http://10.0.0.5:8008{path}",
        connect_timeout=1,
        read_timeout=1,
        health_path=path,
        leader_roles=LEADER_PATHS[path],
    )
    status = status_from_body(target, 200, json.dumps(patroni_body(role, name="pg-0")).encode())
    assert (status.verdict, status.reason) == (verdict, reason)


def test_the_verdict_is_patronis_own_reading_of_the_document() -> None:
    replica = json.dumps(patroni_body("replica", name="pg-0", timeline=4)).encode()
    status = status_from_body(TARGET, 503, replica)
    assert status == MemberStatus.from_api_response(
        "pg-0",
        503,
        json.loads(replica),
        health_path="/primary",
        leader_roles=TARGET.leader_roles,
    )
    assert (status.verdict, status.timeline, status.http_status) == (
        ProbeVerdict.NOT_LEADER,
        4,
        503,
    )
