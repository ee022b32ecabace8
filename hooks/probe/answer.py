"""What a Patroni member's answer means: its status code, head and body in, a status out.

:mod:`hooks.patroni` gets the answer with :mod:`requests` (which parses HTTP); this module
decides what the parsed answer says, pure, so every rule is tested with plain values
(``tests/test_patroni_answer.py``) and mutation-tested with the rest of the core.

Patroni's ``write_response`` (``patroni/api.py``) sends neither a Content-Length nor a
transfer coding: its body ends when it closes the connection. A transfer coding, or a
Content-Length that is not one plain number, is therefore not Patroni's; a declared length
past the body cap is refused before any of the body is read.
"""

from __future__ import annotations

from collections.abc import Sequence

from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.loaders.jsonbody import JsonRefused, bounded_loads


def too_large(target: ProbeTarget, status_code: int, cap: int) -> MemberStatus:
    """An answer whose body is (or says it is) larger than ``cap`` bytes."""
    return MemberStatus.not_patroni(target.pod, f"body larger than {cap} bytes", status_code)


def head_verdict(
    target: ProbeTarget,
    status_code: int,
    *,
    content_lengths: Sequence[str],
    transfer_coded: bool,
    cap: int,
) -> MemberStatus | None:
    """The member's status if the head alone settles it; ``None``: read the body.

    ``content_lengths``: every Content-Length value of the head, as sent.
    ``transfer_coded``: the head names a Transfer-Encoding.
    """
    if transfer_coded:
        return MemberStatus.not_patroni(
            target.pod, "HTTP transfer coding (not Patroni)", status_code
        )
    if not content_lengths:
        return None
    value = content_lengths[0].strip(" \t")
    if len(content_lengths) > 1 or not (value.isascii() and value.isdigit()):
        return MemberStatus.not_patroni(target.pod, "malformed Content-Length", status_code)
    # Compared as text first: int() of more than 4,300 digits raises (CPython's limit on
    # the conversion), and no such length can be within the cap anyway.
    digits = value.lstrip("0")
    if len(digits) > len(str(cap)) or int(digits or "0") > cap:
        return too_large(target, status_code, cap)
    return None


def status_from_body(target: ProbeTarget, status_code: int, body: bytes) -> MemberStatus:
    """Patroni's verdict from the status code and the JSON body (not JSON: not Patroni)."""
    try:
        document = bounded_loads(body, max_bytes=len(body))  # the read already capped it
    except JsonRefused:
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
