"""Run the hook under real gunicorn in a subprocess (Werkzeug's DevServerClient pattern).

Used by the gunicorn tests, the failover tests, the demo and the benchmarks: an ephemeral port,
the project's own gunicorn config module, a ready-poll with a deadline, and a
terminate-then-kill teardown that never leaves a process behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class GunicornHook:
    """A running hook: its URL, process and log file."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_dir: Path

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()


@contextmanager
def gunicorn_hook(
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    workers: int = 2,
    threads: int = 8,
    ready_timeout: float = 30.0,
) -> Iterator[GunicornHook]:
    """Start ``gunicorn -c python:hooks.gunicorn_conf 'hooks.app:create_app()'``."""
    port = free_port()
    metrics_dir = workdir / "metrics"
    log_path = workdir / "gunicorn.log"
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PGFH_", "GUNICORN_"))},
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "GUNICORN_WORKERS": str(workers),
        "GUNICORN_THREADS": str(threads),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PYTHONUNBUFFERED": "1",
        # The local Patroni cluster and the fakes are on loopback, which the hook never
        # probes unless told to, explicitly: the rig tells it (production sets its Pod CIDR).
        "PGFH_ALLOWED_POD_CIDRS": "127.0.0.0/8",
        **(env or {}),
    }
    gunicorn = Path(sys.executable).with_name("gunicorn")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(gunicorn), "-c", "python:hooks.gunicorn_conf", "hooks.app:create_app()"],
            cwd=REPO,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    hook = GunicornHook(f"http://127.0.0.1:{port}", process, log_path, metrics_dir)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"gunicorn exited {process.returncode}:\n{log_path.read_text()[-3000:]}"
                )
            try:
                if requests.get(f"{hook.url}/readyz", timeout=0.5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"gunicorn not ready in {ready_timeout} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.05)
        yield hook
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], timeout: float = 25.0) -> None:
    """SIGTERM (graceful), then SIGKILL the whole process group if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(5)
