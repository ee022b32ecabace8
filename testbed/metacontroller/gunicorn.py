"""Run the hook under real gunicorn in a subprocess (Werkzeug's DevServerClient pattern).

Used by the gunicorn tests, the failover tests, the demo and the benchmarks: an ephemeral port,
the project's own gunicorn config module, a ready-poll with a deadline, and a
terminate-then-kill teardown that never leaves a process behind.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class GunicornHook:
    """A running hook: its URL, process and log file, and how to authenticate to it."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_dir: Path
    #: The bearer token the hook accepts (``None`` if the caller set PGFH_AUTH itself).
    token: str | None = None
    #: Where the hook reads its tokens (a directory: add or remove files to rotate).
    tokens_dir: Path | None = None
    #: For https: the CA file that verifies the hook's certificate.
    verify: str | bool = field(default=True)
    #: The operations port (/healthz, /readyz, /metrics; plain HTTP), ``""`` when off.
    ops_url: str = ""

    @property
    def headers(self) -> dict[str, str]:
        """What Metacontroller would send, configured with the hook's token Secret."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()


# The stand-in presents a rig hook's token without being told (as Metacontroller presents
# the Secret named in the CompositeController), so callers that only know the URL work.
_CREDENTIALS: dict[str, dict[str, str]] = {}
_CREDENTIALS_LOCK = threading.Lock()


def credentials_for(url: str) -> dict[str, str]:
    """The headers that authenticate to the running rig hook at ``url`` (``{}`` if unknown)."""
    with _CREDENTIALS_LOCK:
        for base, headers in _CREDENTIALS.items():
            if url == base or url.startswith(base + "/"):
                return dict(headers)
    return {}


@contextmanager
def gunicorn_hook(
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    workers: int = 2,
    threads: int = 8,
    ready_timeout: float = 30.0,
    ca_file: Path | None = None,
    app: str = "hooks.shell.app:create_app()",
    port: int | None = None,
    token: str | None = None,
) -> Iterator[GunicornHook]:
    """Start ``gunicorn -c python:hooks.shell.gunicorn_conf 'hooks.shell.app:create_app()'``.

    Caller authentication is on, as in production: unless ``env`` sets ``PGFH_AUTH``
    itself, a random token is written to ``<workdir>/auth/token`` and returned in
    :attr:`GunicornHook.token`. With ``PGFH_TLS_CERT_FILE`` in ``env`` the hook serves
    HTTPS; ``ca_file`` verifies it. ``app`` names another WSGI app factory (the
    benchmarks' instrumented one, :mod:`testbed.bench.stages`). ``port`` and ``token``: those of
    a hook stopped before, so that it comes back at the same URL accepting the same
    token, as the pods of a Deployment come back behind its Service (the fault tests'
    "every hook pod down, then back").
    """
    port = port or free_port()
    ops_port = free_port()
    metrics_dir = workdir / "metrics"
    log_path = workdir / "gunicorn.log"
    env = dict(env or {})
    tokens_dir: Path | None = None
    if "PGFH_AUTH" not in env:
        tokens_dir = workdir / "auth"
        tokens_dir.mkdir(mode=0o700, exist_ok=True)
        token = token or secrets.token_urlsafe(32)
        (tokens_dir / "token").write_text(token + "\n")
        env.setdefault("PGFH_AUTH_TOKENS_PATH", str(tokens_dir))
    scheme = "https" if env.get("PGFH_TLS_CERT_FILE") else "http"
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PGFH_", "GUNICORN_"))},
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "GUNICORN_OPS_BIND": f"127.0.0.1:{ops_port}",
        "GUNICORN_WORKERS": str(workers),
        "GUNICORN_THREADS": str(threads),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PYTHONUNBUFFERED": "1",
        # The local Patroni cluster and the fakes are on loopback, which the hook never
        # probes unless told to, explicitly: the rig tells it (production sets its Pod CIDR).
        "PGFH_ALLOWED_POD_CIDRS": "127.0.0.0/8",
        **env,
    }
    gunicorn = Path(sys.executable).with_name("gunicorn")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(gunicorn), "-c", "python:hooks.shell.gunicorn_conf", app],
            cwd=REPO,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    verify: str | bool = str(ca_file) if ca_file is not None else True
    hook = GunicornHook(
        f"{scheme}://127.0.0.1:{port}",
        process,
        log_path,
        metrics_dir,
        token=token,
        tokens_dir=tokens_dir,
        verify=verify,
        ops_url=(
            ""
            if environment["GUNICORN_OPS_BIND"] == "off"
            else f"http://{environment['GUNICORN_OPS_BIND']}"
        ),
    )
    try:
        with serving(hook, ready_timeout):
            yield hook
    finally:
        stop(process)


@contextmanager
def serving(hook: GunicornHook, ready_timeout: float) -> Iterator[None]:
    """Wait until ``hook`` answers ``/readyz``, and present its token while in the block.

    Shared with the runner of the image (:mod:`testbed.metacontroller.image`): whatever started
    gunicorn,
    the rig sees a hook the same way.
    """
    deadline = time.monotonic() + ready_timeout
    while True:
        if hook.process.poll() is not None:
            raise RuntimeError(
                f"gunicorn exited {hook.process.returncode}:\n{hook.log_path.read_text()[-3000:]}"
            )
        try:
            if (
                requests.get(f"{hook.url}/readyz", timeout=0.5, verify=hook.verify).status_code
                == 200
            ):
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"gunicorn not ready in {ready_timeout} s:\n{hook.log_path.read_text()[-3000:]}"
            )
        time.sleep(0.05)
    with _CREDENTIALS_LOCK:
        _CREDENTIALS[hook.url] = hook.headers
    try:
        yield
    finally:
        with _CREDENTIALS_LOCK:
            _CREDENTIALS.pop(hook.url, None)


def stop(process: subprocess.Popen[bytes], timeout: float = 25.0) -> None:
    """SIGTERM (graceful), then SIGKILL the whole process group if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(5)
