"""gunicorn settings for the hook.

Run: ``gunicorn -c python:hooks.shell.gunicorn_conf 'hooks.shell.app:create_app()'``.

The hook spends its time waiting on Patroni, so workers are threaded (gthread): each
request thread runs a probe round (its probes in the prober's thread pool; a member that
never answers holds the request thread, and one pool thread, for the probe deadline).
gunicorn's ``timeout`` is only a heartbeat for gthread workers; the real bound of a request
is the probe deadline (``PGFH_PROBE_DEADLINE_SECONDS``, 2 s), well inside Metacontroller's
5 s webhook timeout.

Shutdown budget (Kubernetes counts the grace period from before preStop):
preStop sleep 5 s + ``graceful_timeout`` 20 s + margin < terminationGracePeriodSeconds 30 s.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
from pathlib import Path
from typing import Any

from hooks.shell import ops
from hooks.shell.config import HookSettings, closes_connection
from hooks.shell.logs import logging_config
from hooks.shell.malloc import limit_arenas

# Read (and check) every PGFH_* setting in the master, before any worker forks: a
# misconfiguration stops the start-up with a message naming the variable.
_settings = HookSettings.from_env()


def wildcard(port: int) -> str:
    """``[::]:port`` (dual-stack: IPv6 and IPv4, Linux's default bindv6only=0) where the host
    has IPv6, else ``0.0.0.0:port``: IPv6-only clusters reach the hook, IPv4-only hosts
    (IPv6 disabled in the kernel) still start."""
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                probe.bind(("::", 0))
            return f"[::]:{port}"
        except OSError:
            pass
    return f"0.0.0.0:{port}"


# The sync port (/sync, /customize): Metacontroller only (deploy/base/networkpolicy.yaml).
bind = os.environ.get("GUNICORN_BIND") or wildcard(8080)
# The operations port (/healthz, /readyz, /metrics for the kubelet and Prometheus), served by
# threads of its own in every worker (hooks/shell/ops.py): slow clients on one port cannot
# starve the other. "off" turns it off (the three paths stay on the sync port as well).
ops_bind = os.environ.get("GUNICORN_OPS_BIND") or wildcard(9090)
_ops_listener: socket.socket | None = None
# cpu_count() would see the node's CPUs, not the container's limit: be explicit.
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
threads = _settings.request_threads  # GUNICORN_THREADS; the probe pool is sized from it
worker_class = "gthread"
timeout = 30
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
keepalive = 5
# Metacontroller is the only client; bound what a stuck or hostile peer can hold.
backlog = 256
limit_request_line = 8190
# The heartbeat file needs a writable dir; /tmp is an emptyDir under a read-only root.
worker_tmp_dir = os.environ.get("GUNICORN_WORKER_TMP_DIR") or (
    "/dev/shm" if Path("/dev/shm").is_dir() else None
)
control_socket_disable = True
accesslog = "-" if os.environ.get("GUNICORN_ACCESS_LOG", "1") == "1" else None
# The settings as HookSettings read them (one parser, one default for each).
logconfig_dict = logging_config(_settings.log_format, _settings.log_level)
# HTTPS (PGFH_TLS_CERT_FILE/PGFH_TLS_KEY_FILE). gunicorn loads the files for every new
# connection (gthread wraps each accepted socket with a fresh context), so a renewed
# certificate in the mounted Secret is picked up without a restart.
if _settings.server_tls is not None:
    certfile = _settings.server_tls.cert_file
    keyfile = _settings.server_tls.key_file
    if _settings.server_tls.client_ca_file:
        # Ask every client for a certificate and refuse the handshake if one is presented
        # that the CA did not sign, but let clients without one in: kubelet probes and
        # Prometheus have none. The app requires one on /sync and /customize
        # (PGFH_AUTH=mtls or token+mtls).
        ca_certs = _settings.server_tls.client_ca_file
        cert_reqs = ssl.CERT_OPTIONAL

access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms rid=%({x-request-id}o)s'


def pre_request(worker: Any, req: Any) -> None:
    """End the caller's connection after ``PGFH_CONNECTION_MAX_REQUESTS`` requests.

    gunicorn drops a ``Connection`` header that the app sets (hop-by-hop), so the
    decision is made here, on gunicorn's own request: ``req_number`` counts the requests
    of this connection, and a request marked ``must_close`` is answered with
    ``Connection: close`` and the connection closed after the reply. See
    :func:`hooks.shell.config.closes_connection`.
    """
    worker.log.debug("%s %s", req.method, req.path)
    if closes_connection(req.req_number, _settings.connection_max_requests):
        req.must_close = True


def post_fork(server: Any, worker: Any) -> None:
    """Two malloc arenas per worker, before its request threads exist (hooks/shell/malloc.py)."""
    limit_arenas()


def when_ready(server: Any) -> None:
    """Open the operations listener in the master, once: every worker inherits it."""
    global _ops_listener
    if ops_bind != "off" and _ops_listener is None:
        _ops_listener = ops.listen(ops_bind)
        server.log.info("operations port (healthz, readyz, metrics) at %s", ops_bind)


def post_worker_init(worker: Any) -> None:
    """Serve the operations port from this worker's own threads, with its app."""
    if _ops_listener is not None:
        ops.serve(_ops_listener, worker.wsgi)


def on_starting(server: Any) -> None:
    """Start each pod with an empty metrics dir: stale worker files would skew counters."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        path = Path(directory)
        if path.is_dir():
            for entry in path.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        else:
            path.mkdir(parents=True)


def child_exit(server: Any, worker: Any) -> None:
    """Tell prometheus-client a worker is gone, so its live gauges stop counting."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
