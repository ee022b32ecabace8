"""Turning a failed probe into a short reason that is the same every time.

A reason can end up in a status condition: a message that changed on every sync (an
exception's text can embed addresses, ports or object ids) would make Metacontroller
write the status again and again. So the cause chain is walked and mapped to a fixed
phrase that also says which side to fix (for TLS: our CA bundle, our client certificate,
the member's certificate or port).
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator

import requests
import urllib3

from hooks.domain.members import ProbeTarget

#: OpenSSL verification codes (X509_V_ERR_*) that mean "not signed by a CA we trust".
_UNTRUSTED = frozenset({2, 18, 19, 20, 21})
#: OpenSSL alerts and errors that mean the member refused our client certificate.
_CLIENT_CERT_REFUSED = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


def _tls_reason(error: ssl.SSLError, server_name: str | None) -> str:
    """A stable reason for a TLS failure, saying which side to fix."""
    if isinstance(error, ssl.SSLCertVerificationError):
        code = getattr(error, "verify_code", None)
        if code in _UNTRUSTED:
            return "TLS: certificate not signed by a trusted CA (PGFH_PATRONI_CA_FILE)"
        if code == 10:
            return "TLS: certificate expired"
        if code in (62, 64):
            return _name_mismatch(server_name)
        return f"TLS: certificate rejected (code {code})"
    reason = getattr(error, "reason", None) or type(error).__name__
    # A member that refuses our certificate (or wants one) either sends an alert or just
    # closes the connection, whichever its TLS stack gets to first: one reason for both,
    # or the status would flip between two messages from sync to sync.
    if reason in _CLIENT_CERT_REFUSED or isinstance(error, ssl.SSLEOFError):
        return "TLS: the member ended the handshake (client certificate refused or missing?)"
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return "TLS: the member does not speak TLS on this port"
    return f"TLS handshake failed ({reason})"


def _name_mismatch(server_name: str | None) -> str:
    names = f"serverName {server_name}" if server_name else "the pod IP"
    return f"TLS: certificate does not name {names}"


def describe_failure(error: BaseException, target: ProbeTarget, *, in_body: bool = False) -> str:
    """A short reason that is the same every time the same failure happens.

    ``in_body``: the answer's headers had arrived (a broken connection is then "mid-body").
    requests and urllib3 wrap the cause in their own exceptions, as an argument
    (``ProtocolError("Connection aborted.", BadStatusLine(...))``) or as the cause: both
    are followed, nearest first.
    """
    for current in _chain(error):
        reason = _reason_of(current, target)
        if reason is not None:
            return reason
    if isinstance(error, OSError):
        return "connection broken mid-body" if in_body else "connection failed"
    return f"probe failed ({type(error).__name__})"


#: Most exceptions looked at in one failure's chain.
_MAX_CHAIN = 32


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps, nearest first, each once, at most ``_MAX_CHAIN``:
    requests and urllib3 keep the cause as an argument (``ProtocolError("Connection
    aborted.", BadStatusLine(...))``), as ``reason``, or as ``__cause__``/``__context__``."""
    seen: set[int] = set()
    queue: list[BaseException] = [error]
    while queue and len(seen) < _MAX_CHAIN:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        queue.extend(arg for arg in current.args if isinstance(arg, BaseException))
        for linked in (getattr(current, "reason", None), current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                queue.append(linked)


def _reason_of(error: BaseException, target: ProbeTarget) -> str | None:
    """The reason this one exception stands for, or ``None`` (look at its causes)."""
    if isinstance(error, ssl.SSLError):
        return _tls_reason(error, target.server_name)
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, ConnectionResetError):  # http.client's RemoteDisconnected too
        return "connection reset"
    if isinstance(error, http.client.IncompleteRead):
        return "connection broken mid-body"
    # What http.client refuses to read as an HTTP/1.x head: something else answers there.
    if isinstance(error, http.client.LineTooLong):
        return "HTTP head line too long (not Patroni)"
    if isinstance(error, http.client.BadStatusLine | http.client.UnknownProtocol):
        return "not an HTTP/1.x answer (not Patroni)"
    if isinstance(error, http.client.HTTPException):  # e.g. more than 100 header lines
        return "malformed HTTP head (not Patroni)"
    if isinstance(error, TimeoutError):
        return "read timeout"
    return None


def timed_out(error: BaseException) -> bool:
    """Whether a timeout (requests', urllib3's or the socket's) is in ``error``'s chain."""
    return any(
        isinstance(current, requests.Timeout | TimeoutError)
        # urllib3's NewConnectionError is a ConnectTimeoutError: a refusal is not one.
        or (
            isinstance(current, urllib3.exceptions.TimeoutError)
            and not isinstance(current, urllib3.exceptions.NewConnectionError)
        )
        for current in _chain(error)
    )
