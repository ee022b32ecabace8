"""The operations port: ``/healthz``, ``/readyz`` and ``/metrics`` on a listener of their own.

Why a second port: gunicorn's gthread worker waits for a request's first byte without a
thread, but once it has arrived a pool thread reads the rest with no deadline. Two
half-sent requests against a 2-thread worker kept ``/healthz`` from answering (and ``/sync``
from being served); when probes and Prometheus share the sync port, any namespace allowed
to scrape could stall the hook. So the sync port is for Metacontroller alone (the
NetworkPolicy admits nobody else to it) and the kubelet and Prometheus talk to this port,
which is served by threads of its own in every worker:

* the master opens the listener once (:func:`listen`, in gunicorn's ``when_ready``), every
  worker inherits it and serves it from one daemon thread (:func:`serve`, in
  ``post_worker_init``), so the answers come from a live worker and its Flask app
  (readiness = its tokens are loaded; metrics = the multiprocess collector);
* each connection gets a thread of its own, at most :data:`MAX_CONNECTIONS` at once per
  worker (more are closed unanswered), and is shut down :data:`DEADLINE_SECONDS` after it was
  accepted however slowly its client sends: a stalled client holds one of these threads for
  that long and never a thread of the sync pool;
* only ``GET`` of the three paths is served (404 otherwise), so ``/sync`` is never reachable
  through this port.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import BaseServer, ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

log = logging.getLogger("hooks.ops")

#: The paths this port serves; everything else is 404.
PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: How long one connection may take from accept to the end of its answer.
DEADLINE_SECONDS = 5.0
#: Connections served at once per worker; more are closed without an answer.
MAX_CONNECTIONS = 64

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); raises ``ValueError`` naming it."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"not a host:port address: {bind!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def listen(bind: str, backlog: int = 64) -> socket.socket:
    """The listener for ``bind``. ``[::]`` is dual-stack (IPv4 too) where the host allows it,
    and falls back to ``0.0.0.0`` on a host without IPv6."""
    host, port = parse_bind(bind)
    if host == "::":
        if socket.has_dualstack_ipv6():
            try:
                return socket.create_server(
                    ("::", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True
                )
            except OSError as error:
                log.warning("no IPv6 listener on [::]:%d (%s): IPv4 only", port, error)
        host = "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


def only_ops_paths(app: WsgiApp) -> WsgiApp:
    """``app`` restricted to ``GET`` of :data:`PATHS`."""

    def restricted(request: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if request.get("PATH_INFO") not in PATHS or request.get("REQUEST_METHOD") != "GET":
            start_response("404 Not Found", [("Content-Type", "application/json")])
            return [b'{"error": "not found"}']
        return app(request, start_response)

    return restricted


class _Handler(WSGIRequestHandler):
    """One request per connection (wsgiref speaks HTTP/1.0); no access log line per probe."""

    def log_message(self, format: str, *args: Any) -> None:
        return


class OpsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, each connection shut down at its deadline, a cap on how
    many run at once. Serves a listener it is given (the master's, inherited)."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        listener: socket.socket,
        app: WsgiApp,
        deadline: float = DEADLINE_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(listener.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listener
        self.address_family = listener.family
        self.server_name = "pg-failover-hook"
        self.server_port = listener.getsockname()[1]
        self.setup_environ()
        self.set_app(app)
        self.deadline = deadline
        self._slots = threading.BoundedSemaphore(max_connections)

    def server_bind(self) -> None:  # the listener is bound already
        return

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer = threading.Timer(self.deadline, _cut, (request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("ops connection from %s ended early", client_address, exc_info=True)


def _cut(connection: socket.socket) -> None:
    """The deadline passed: end the connection (the handler's read or write then fails)."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


def serve(listener: socket.socket, app: WsgiApp) -> BaseServer:
    """Serve ``app`` (restricted to the ops paths) on ``listener`` from a daemon thread."""
    server = OpsServer(listener, only_ops_paths(app))
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="ops", daemon=True
    )
    thread.start()
    return server
