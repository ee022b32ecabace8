"""What a probe sends to a Patroni member and how its answer is read: bytes in, a status out.

:mod:`hooks.patroni` moves the bytes (non-blocking sockets, one poll loop per round); this
module decides what they mean. It is pure, so every rule is tested with plain bytes
(``tests/test_patroni_answer.py``) and mutation-tested with the rest of the core.

The answer is read by a small strict parser rather than :mod:`http.client`, whose header
parsing goes through the e-mail parser (0.1 ms per answer, a third of a whole probe round
here; bench/README.md, "CPU per sync"). Strict on purpose: an answer that is not plain
HTTP/1.x is not Patroni's. Patroni's ``write_response`` (``patroni/api.py``) sends neither a
Content-Length nor a transfer coding: its body ends when it closes the connection. A
Content-Length, when one is sent, ends the read early.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from hooks.members import MemberStatus, ProbeTarget

#: Longest status line plus headers accepted (Patroni's are ~200 bytes).
MAX_HEAD_BYTES = 16 * 1024
#: Most header lines accepted (Patroni sends 3).
MAX_HEADERS = 100
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-9][0-9][0-9])(?: [^\r\n]*)?")
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\r\n]*?)[ \t]*")


def request_bytes(host: str, port: int, path: str) -> bytes:
    """The GET of ``path`` (``host`` as in the URL: an IPv6 address in brackets).

    ``Connection: close``: one request per connection, as Patroni answers anyway.
    """
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Accept: application/json\r\nUser-Agent: pg-failover-hook\r\n"
        "Connection: close\r\n\r\n"
    ).encode()  # ASCII in fact: an IP literal, a port and one of Patroni's health paths


@dataclass(frozen=True, slots=True)
class Head:
    """The parsed status line and headers of an answer."""

    status: int
    #: The declared Content-Length, or ``None`` (the body ends at the close).
    length: int | None
    #: Where the body starts in the received bytes.
    body_start: int


def read_head(
    target: ProbeTarget, data: bytes | bytearray, *, closed: bool
) -> Head | MemberStatus | None:
    """The answer's head once it is whole; a status if it can never be; ``None``: read on.

    ``closed``: the member closed the connection (nothing more will come).
    """
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if closed:
            # Closed before the headers were whole (http.client calls it RemoteDisconnected,
            # a ConnectionResetError): the same reason as a reset.
            return MemberStatus.unknown(target.pod, "connection reset")
        if len(data) > MAX_HEAD_BYTES:
            return MemberStatus.unknown(target.pod, "connection failed")
        return None
    lines = bytes(data[:end]).split(b"\r\n")
    status = _STATUS_LINE.fullmatch(lines[0])
    if status is None or len(lines) > MAX_HEADERS + 1:
        return MemberStatus.unknown(target.pod, "connection failed")
    code = int(status.group(1))
    length: int | None = None
    for line in lines[1:]:
        header = _HEADER_LINE.fullmatch(line)
        if header is None:
            return MemberStatus.not_patroni(target.pod, "malformed HTTP header", code)
        name = header.group(1).lower()
        if name == b"content-length":
            value = header.group(2)
            if not value.isdigit() or length is not None:
                return MemberStatus.not_patroni(target.pod, "malformed Content-Length", code)
            length = int(value)
        elif name == b"transfer-encoding":
            return MemberStatus.not_patroni(target.pod, "HTTP transfer coding (not Patroni)", code)
    return Head(code, length, end + 4)


def read_body(
    target: ProbeTarget, head: Head, data: bytes | bytearray, *, closed: bool, cap: int
) -> MemberStatus | None:
    """The member's status once the body is whole (or too large); ``None``: read on."""
    too_large = f"body larger than {cap} bytes"
    received = len(data) - head.body_start
    if (head.length is not None and head.length > cap) or received > cap:
        return MemberStatus.not_patroni(target.pod, too_large, head.status)
    if head.length is not None and received >= head.length:
        body = bytes(data[head.body_start : head.body_start + head.length])
    elif closed and head.length is None:
        body = bytes(data[head.body_start :])
    elif closed:
        return MemberStatus.unknown(target.pod, "connection broken mid-body")
    else:
        return None
    return status_from_body(target, head.status, body)


def status_from_body(target: ProbeTarget, status_code: int, body: bytes) -> MemberStatus:
    """Patroni's verdict from the status code and the JSON body (not JSON: not Patroni)."""
    try:
        document = json.loads(body)
    except ValueError:
        return MemberStatus.not_patroni(
            target.pod,
            f"HTTP {status_code} on {target.health_path} with a non-JSON body",
            status_code,
        )
    return MemberStatus.from_api_response(
        target.pod,
        status_code,
        document,
        health_path=target.health_path,
        leader_roles=target.leader_roles,
    )
