"""Turning a failed probe into a short reason that is the same every time.

A reason can end up in a status condition: a message that changed on every sync (an
exception's text can embed addresses, ports or object ids) would make Metacontroller
write the status again and again. So the cause chain is walked and mapped to a fixed
phrase that also says which side to fix (for TLS: our CA bundle, our client certificate,
the member's certificate or port).
"""

from __future__ import annotations

import ssl

from hooks.members import ProbeTarget

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
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return _tls_reason(current, target.server_name)
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, ConnectionResetError):
            return "connection reset"
        if isinstance(current, TimeoutError):
            return "read timeout"
        current = current.__cause__ or current.__context__
    if isinstance(error, OSError):
        return "connection broken mid-body" if in_body else "connection failed"
    return f"probe failed ({type(error).__name__})"
