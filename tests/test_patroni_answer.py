"""hooks.patroni_answer with plain bytes: every rule of reading a member's answer.

Test design: the same answers as ``tests/test_probes.py``'s raw members (which send them
over real sockets), here without any socket, so each rule is checked at its edge: a head
one byte too long, a Content-Length equal to the cap and one past it, a body one byte
short, a closed connection at every stage. The statuses are compared whole (verdict,
reason, HTTP status, what Patroni said), so a wrong field fails, not only a wrong verdict.
"""

from __future__ import annotations

import json

import pytest

from hooks.members import MemberStatus, ProbeTarget, ProbeVerdict
from hooks.model import LEADER_PATHS
from hooks.patroni_answer import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    Head,
    read_body,
    read_head,
    request_bytes,
    status_from_body,
)
from tests.patroni_wire import patroni_body

TARGET = ProbeTarget(
    pod="pg-0", url="http://10.0.0.5:8008/primary", connect_timeout=1, read_timeout=1
)
HEAD = b"HTTP/1.0 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11.2\r\n"
LEADER = json.dumps(patroni_body("primary", name="pg-0")).encode()
CAP = 1024


def unknown(reason: str) -> MemberStatus:
    return MemberStatus.unknown("pg-0", reason)


def not_patroni(reason: str, status: int = 200) -> MemberStatus:
    return MemberStatus.not_patroni("pg-0", reason, status)


# ------------------------------------------------------------------------ the request


def test_the_request_is_one_plain_get_that_asks_to_close() -> None:
    assert request_bytes("10.0.0.5", 8008, "/primary") == (
        b"GET /primary HTTP/1.1\r\nHost: 10.0.0.5:8008\r\n"
        b"Accept: application/json\r\nUser-Agent: pg-failover-hook\r\n"
        b"Connection: close\r\n\r\n"
    )


def test_an_ipv6_host_keeps_its_brackets_in_the_host_header() -> None:
    assert b"\r\nHost: [fd00::5]:8008\r\n" in request_bytes("[fd00::5]", 8008, "/leader")


# ------------------------------------------------------------------------ the head


def test_a_patroni_head_is_read() -> None:
    data = HEAD + b"Content-Type: application/json\r\n\r\n" + LEADER
    head = read_head(TARGET, data, closed=False)
    assert head == Head(status=200, length=None, body_start=data.index(LEADER))


def test_a_503_head_with_a_content_length_is_read() -> None:
    data = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length:  12 \r\n\r\n"
    assert read_head(TARGET, data, closed=False) == Head(503, 12, len(data))


def test_header_names_are_case_insensitive() -> None:
    assert read_head(TARGET, HEAD + b"CONTENT-length: 7\r\n\r\n", closed=False) == Head(
        200, 7, len(HEAD) + 21
    )


def test_a_status_line_without_a_reason_phrase_is_fine() -> None:
    assert read_head(TARGET, b"HTTP/1.1 204\r\n\r\n", closed=False) == Head(204, None, 16)


@pytest.mark.parametrize("closed", [False, True])
def test_a_head_without_its_end_waits_or_is_a_reset(closed: bool) -> None:
    partial = HEAD + b"Content-Le"
    expected = unknown("connection reset") if closed else None
    assert read_head(TARGET, partial, closed=closed) == expected
    assert read_head(TARGET, b"", closed=closed) == expected


def test_an_endless_head_is_given_up_one_byte_past_the_bound() -> None:
    at_bound = b"x" * MAX_HEAD_BYTES
    assert read_head(TARGET, at_bound, closed=False) is None
    assert read_head(TARGET, at_bound + b"x", closed=False) == unknown("connection failed")


@pytest.mark.parametrize(
    "status_line",
    [
        b"SSH-2.0-OpenSSH_9.6",
        b"HTTP/2 200",
        b"HTTP/1.2 200 OK",
        b"HTTP/1.1 099 Too Low",
        b"HTTP/1.1 20 Short",
        b"HTTP/1.1 2000 Long",
        b"HTTP/1.1 200OK",
        b"http/1.1 200 OK",
        b" HTTP/1.1 200 OK",
    ],
)
def test_a_status_line_that_is_not_http_1_fails_the_probe(status_line: bytes) -> None:
    assert read_head(TARGET, status_line + b"\r\n\r\n{}", closed=True) == unknown(
        "connection failed"
    )


def test_at_most_max_headers_header_lines() -> None:
    lines = b"".join(b"X-%d: y\r\n" % i for i in range(MAX_HEADERS))
    ok = b"HTTP/1.0 200 OK\r\n" + lines + b"\r\n"
    assert read_head(TARGET, ok, closed=False) == Head(200, None, len(ok))
    one_more = b"HTTP/1.0 200 OK\r\n" + lines + b"X-last: y\r\n\r\n"
    assert read_head(TARGET, one_more, closed=False) == unknown("connection failed")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"no colon here", "malformed HTTP header"),
        (b" folded: line", "malformed HTTP header"),
        (b"Bad Name: x", "malformed HTTP header"),
        (b": no name", "malformed HTTP header"),
        (b"Content-Length: 12abc", "malformed Content-Length"),
        (b"Content-Length: -1", "malformed Content-Length"),
        (b"Content-Length:", "malformed Content-Length"),
        (b"Transfer-Encoding: chunked", "HTTP transfer coding (not Patroni)"),
        (b"transfer-encoding: identity", "HTTP transfer coding (not Patroni)"),
    ],
)
def test_a_header_patroni_never_sends_means_not_patroni(line: bytes, reason: str) -> None:
    data = b"HTTP/1.0 503 Service Unavailable\r\n" + line + b"\r\n\r\n{}"
    assert read_head(TARGET, data, closed=True) == not_patroni(reason, 503)


def test_two_content_lengths_mean_not_patroni_even_when_equal() -> None:
    data = HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}"
    assert read_head(TARGET, data, closed=True) == not_patroni("malformed Content-Length")


def test_a_header_value_keeps_inner_spaces_and_drops_outer_ones() -> None:
    data = HEAD + b"Content-Length: \t 5\t \r\nX-Note: a  b\r\n\r\n"
    assert read_head(TARGET, data, closed=False) == Head(200, 5, len(data))


def test_the_head_ends_at_the_first_blank_line_even_if_the_body_has_one() -> None:
    pretty = json.dumps(patroni_body("primary", name="pg-0"), indent=1).encode()
    body = pretty.replace(b"{\n", b"{\r\n\r\n", 1)  # still JSON: blank lines are whitespace
    data = HEAD + b"\r\n" + body
    assert read_head(TARGET, data, closed=True) == Head(200, None, len(HEAD) + 2)
    assert body_of(data, closed=True) == status_from_body(TARGET, 200, body)


def test_an_answer_that_starts_with_a_blank_line_has_no_status_line() -> None:
    assert read_head(TARGET, b"\r\n\r\n{}", closed=False) == unknown("connection failed")


def test_a_bytearray_is_read_like_bytes() -> None:
    data = HEAD + b"\r\n" + LEADER
    assert read_head(TARGET, bytearray(data), closed=False) == read_head(TARGET, data, closed=False)


# ------------------------------------------------------------------------ the body


def body_of(data: bytes, *, closed: bool, cap: int = CAP) -> MemberStatus | None:
    head = read_head(TARGET, data, closed=closed)
    assert isinstance(head, Head), head
    return read_body(TARGET, head, data, closed=closed, cap=cap)


def test_a_body_without_length_ends_at_the_close() -> None:
    data = HEAD + b"\r\n" + LEADER
    assert body_of(data, closed=False) is None
    status = body_of(data, closed=True)
    assert status is not None and status.verdict is ProbeVerdict.LEADER
    assert status == status_from_body(TARGET, 200, LEADER)


def test_a_content_length_ends_the_body_without_the_close_and_ignores_the_rest() -> None:
    data = HEAD + b"Content-Length: %d\r\n\r\n" % len(LEADER) + LEADER
    assert body_of(data, closed=False) == status_from_body(TARGET, 200, LEADER)
    assert body_of(data + b"trailing junk", closed=False) == status_from_body(TARGET, 200, LEADER)


def test_a_body_one_byte_short_of_its_length_waits_or_is_broken() -> None:
    data = HEAD + b"Content-Length: %d\r\n\r\n" % len(LEADER) + LEADER[:-1]
    assert body_of(data, closed=False) is None
    assert body_of(data, closed=True) == unknown("connection broken mid-body")


def test_an_empty_body_with_length_zero_is_an_answer() -> None:
    data = b"HTTP/1.0 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n"
    assert body_of(data, closed=False) == not_patroni(
        "HTTP 302 on /primary with a non-JSON body", 302
    )


def test_the_declared_length_may_equal_the_cap_not_exceed_it() -> None:
    document = b'{"state": "running", "role": "replica"' + b" " * 100 + b"}"
    at_cap = HEAD + b"Content-Length: %d\r\n\r\n" % len(document) + document
    assert body_of(at_cap, closed=False, cap=len(document)) == status_from_body(
        TARGET, 200, document
    )
    assert body_of(at_cap, closed=False, cap=len(document) - 1) == not_patroni(
        f"body larger than {len(document) - 1} bytes"
    )


def test_a_declared_length_past_the_cap_is_refused_before_any_body() -> None:
    data = HEAD + b"Content-Length: %d\r\n\r\n" % (CAP + 1)
    assert body_of(data, closed=False) == not_patroni(f"body larger than {CAP} bytes")


def test_received_bytes_past_the_cap_are_refused_without_a_length() -> None:
    at_cap = HEAD + b"\r\n" + b"x" * CAP
    assert body_of(at_cap, closed=False) is None
    assert body_of(at_cap + b"x", closed=False) == not_patroni(f"body larger than {CAP} bytes")


def test_received_bytes_past_the_cap_are_refused_with_a_larger_length_too() -> None:
    # A head that declares less than it sends: what arrived counts, not what was declared.
    data = HEAD + b"Content-Length: 10\r\n\r\n" + b"x" * (CAP + 1)
    assert body_of(data, closed=False) == not_patroni(f"body larger than {CAP} bytes")


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
