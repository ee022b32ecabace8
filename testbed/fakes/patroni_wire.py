"""What a Patroni member puts on the wire, and where a fake one listens: the one copy.

Two kinds of fake Patroni member exist: the fault-injecting ones of the tests
(``testbed/fakes/patroni.py``: a thread per connection, every misbehaviour on purpose) and the fast
ones of the benchmarks (``testbed/fakes/patroni_fast.py``: one asyncio loop in its own process).
Both must answer with the same document and headers as Patroni 4.1, and both bind a
cluster's members on one port number (the spec has one ``patroni.port``), so this module
builds the document, the response head and the sockets for both.

It lives in ``testbed/fakes/`` with every other fake server: the tests and the benchmarks
both use it, and the test bed never imports ``tests/``. It imports nothing but the standard
library, so the benchmarks' spawned server process stays light.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any


def patroni_body(
    role: str = "replica",
    state: str = "running",
    timeline: int = 1,
    name: str = "m",
    *,
    members: Sequence[str] = (),
) -> dict[str, Any]:
    """What Patroni 4.1 answers on a health path (``GET /patroni``'s document).

    A primary (or Patroni 3's ``master``) reports its WAL location and, when ``members``
    names the cluster, one ``replication`` row per other member (as ``pg_stat_replication``
    lists them); a replica reports received and replayed locations and that it streams.
    """
    body: dict[str, Any] = {
        "state": state,
        "postmaster_start_time": "2026-08-20 09:10:00.000000+00:00",
        "role": role,
        "server_version": 180006,
        "timeline": timeline,
        "dcs_last_seen": 1787216000,
        "database_system_identifier": "7400000000000000000",
        "patroni": {"version": "4.1.5", "scope": "pg-orders", "name": name},
    }
    if role in ("primary", "master"):
        body["xlog"] = {"location": 50332016}
        replication = [
            {
                "usename": "replicator",
                "application_name": other,
                "client_addr": "10.244.1.31",
                "state": "streaming",
                "sync_state": "async",
                "sync_priority": 0,
            }
            for other in members
            if other != name
        ]
        if replication:
            body["replication"] = replication
    else:
        body["xlog"] = {
            "received_location": 50332016,
            "replayed_location": 50332016,
            "replayed_timestamp": None,
            "paused": False,
        }
        body["replication_state"] = "streaming"
    return body


def response_head(status: int, extra: Sequence[tuple[str, str]] = ()) -> bytes:
    """A status line and headers as Patroni's ``BaseHTTPRequestHandler`` writes them.

    HTTP/1.0 with ``Server``, ``Date`` and ``Content-Type`` only (Patroni's
    ``write_response``): no ``Content-Length``, so the body ends when the connection
    closes, and no ``Connection`` header (HTTP/1.0 closes by default).
    """
    lines = [
        f"HTTP/1.0 {status} {HTTPStatus(status).phrase}",
        "Server: BaseHTTP/0.6 Python/3.11.2",
        "Date: Thu, 20 Aug 2026 09:47:03 GMT",
        "Content-Type: application/json",
        *(f"{name}: {value}" for name, value in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_request_head(conn: Any, limit: int = 16384) -> bytes | None:
    """A request's head from ``conn`` (a socket or TLS socket), up to its blank line or
    ``limit`` bytes; ``None`` when the client closed before it was complete."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < limit:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return data


def response(status: int, document: object) -> bytes:
    """A whole answer: :func:`response_head` and ``document`` as JSON."""
    return response_head(status) + json.dumps(document).encode()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound (not listening) to ``host:port``; port 0 picks a free one.

    ``host`` is an IPv4 or an IPv6 address (``::1``).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Re-binding a port right after closing it (a fake switched to "refused" and
        # back) must not trip over TIME_WAIT connections.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def bind_shared_port(hosts: Sequence[str], attempts: int = 20) -> tuple[int, list[socket.socket]]:
    """Bind every host on one port number that is free on all of them (bounded retries)."""
    for _ in range(attempts):
        first = bind(hosts[0], 0)
        port = first.getsockname()[1]
        socks = [first]
        try:
            for host in hosts[1:]:
                socks.append(bind(host, port))
        except OSError:
            for sock in socks:
                sock.close()
            continue
        return port, socks
    raise RuntimeError(f"no port number free on all of {', '.join(hosts)}")
