"""The client side of a downtime run: writer processes in the client namespace, their records,
and what every member says about the namespace's connections.

* :class:`Writers` starts one :mod:`testbed.bench.client_writer` process per client path inside the
  namespace and collects each attempt's JSON line in a reader thread (a writer that dies is
  reported, not restarted: its records end there).
* :class:`ConnectionSampler` asks every member, over a kept connection of its own from the
  host, how many client backends each writer (by ``application_name``) has on it, from
  :data:`testbed.kubernetes.netns.SNAT_SOURCE`, every ``interval`` seconds: the direct view of
  "connections still on the demoted member", whatever the client or pooler believes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.kubernetes.netns import SNAT_SOURCE, ClientNetns
from testbed.patroni import PatroniCluster

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class WriterSpec:
    """One client path: a name (also its ``application_name``), a DSN and a policy."""

    name: str
    dsn: str
    policy: str


@dataclass
class Writers:
    netns: ClientNetns
    specs: list[WriterSpec]
    interval: float = 0.05
    duration: float = 7200.0
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _processes: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Writers:
        for spec in self.specs:
            argv = self.netns.command(
                sys.executable, "-m", "testbed.bench.client_writer",
                "--name", spec.name, "--dsn", spec.dsn, "--policy", spec.policy,
                "--interval", str(self.interval), "--duration", str(self.duration),
            )  # fmt: skip
            process = subprocess.Popen(
                argv,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            self._processes[spec.name] = process
            self.records[spec.name] = []
            thread = threading.Thread(
                target=self._read,
                args=(spec.name, process),
                name=f"writer-{spec.name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _read(self, name: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.records[name].append(record)

    def snapshot(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records[name])

    def alive(self) -> dict[str, bool]:
        return {name: process.poll() is None for name, process in self._processes.items()}

    def wait_ok_on(self, server: str, names: Iterable[str], since: float, timeout: float) -> bool:
        """Wait until every writer of ``names`` committed on ``server`` after ``since``."""
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                if any(
                    r["out"] == "ok" and r.get("server") == server and r["t0"] >= since
                    for r in self.snapshot(name)[-400:]
                ):
                    pending.discard(name)
            time.sleep(0.05)
        return not pending

    def stop(self) -> None:
        for process in self._processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self._processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for thread in self._threads:
            thread.join(timeout=5)
        for process in self._processes.values():
            if process.stdout is not None:
                process.stdout.close()


_COUNT = (
    "SELECT application_name, count(*) FROM pg_stat_activity "
    "WHERE client_addr = %s AND backend_type = 'client backend' GROUP BY 1"
)


@dataclass
class ConnectionSampler:
    """Every member's client backends from the namespace, per writer, over time."""

    cluster: PatroniCluster
    interval: float = 0.2
    #: ``(monotonic time, member ip, {application_name: count})`` for every answer.
    samples: list[tuple[float, str, dict[str, int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> ConnectionSampler:
        for member in self.cluster.members:
            thread = threading.Thread(
                target=self._run, args=(member.ip,), name=f"conns-{member.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, ip: str) -> None:
        psycopg2: Any = importlib.import_module("psycopg2")
        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(
                        self.cluster.dsn(ip).replace(
                            "application_name=devcluster", "application_name=pgfh-sampler"
                        )
                    )
                    conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute(_COUNT, (SNAT_SOURCE,))
                    counts = {str(name): int(n) for name, n in cur.fetchall()}
                with self._lock:
                    self.samples.append((time.monotonic(), ip, counts))
            except Exception:  # psycopg2.Error, untyped: the member is down or restarting
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
            self._stop.wait(self.interval)
        if conn is not None:
            conn.close()

    def between(self, start: float, end: float) -> list[tuple[float, str, dict[str, int]]]:
        with self._lock:
            return [s for s in self.samples if start <= s[0] <= end]

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)


def terminate_namespace_backends(cluster: PatroniCluster, ip: str) -> int:
    """End every client backend of the namespace on member ``ip`` (how many there were)."""
    rows = cluster.execute(
        ip,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE client_addr = %s AND backend_type = 'client backend'",
        (SNAT_SOURCE,),
        timeout=5,
    )
    return int(rows[0][0]) if rows else 0
