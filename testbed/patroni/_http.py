"""A tiny HTTP client for the loopback REST APIs of Patroni and etcd.

Why not ``requests``? Patroni answers HTTP/1.0 and closes the connection after each response, so
a session pool gains nothing, and the harness wants one hard per-request timeout (a stopping
Patroni keeps its port open without answering for ~2 s; a hung probe must not stall a poll loop
that measures failover times in tens of milliseconds). ``http.client`` gives exactly that, and
refuses anything that is not an address on 127.0.0.0/8 so a typo can never send test traffic
off the machine.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import ssl
from dataclasses import dataclass
from typing import Any

_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclass(frozen=True)
class Response:
    """Status and body of one answer. ``status == 0`` means no answer (refused, timeout)."""

    status: int
    body: bytes
    error: str = ""

    def json(self) -> dict[str, Any]:
        """The body parsed as a JSON object; ``{}`` if it is not one."""
        try:
            value = json.loads(self.body or b"null")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def request(
    method: str,
    host: str,
    port: int,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = 1.0,
    tls: ssl.SSLContext | None = None,
) -> Response:
    """One request; never raises for network errors (they come back as ``status == 0``).

    With ``tls`` the request goes over HTTPS with that context (CA, client certificate).
    """
    if ipaddress.ip_address(host) not in _LOOPBACK:
        raise ValueError(f"refusing non-loopback address {host}")
    conn: http.client.HTTPConnection
    if tls is not None:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=tls)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        return Response(resp.status, resp.read())
    except (OSError, http.client.HTTPException) as exc:  # ssl.SSLError is an OSError
        return Response(0, b"", error=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def get(
    host: str, port: int, path: str, timeout: float = 1.0, tls: ssl.SSLContext | None = None
) -> Response:
    """``GET`` shorthand."""
    return request("GET", host, port, path, timeout=timeout, tls=tls)
