"""How Metacontroller's syncs spread over hook pods, and after a scale-out from 3 to 6.

Metacontroller v4.17.2 calls a webhook with an ``http.Client`` whose transport is Go's
``http.DefaultTransport`` (``pkg/hooks/webhook.go``: ``&http.Client{Timeout: ...}``
with no transport of its own unless it has a CA bundle or a client certificate, and then a
``Clone()`` of it; ``pkg/metrics/http.go`` only wraps it). That transport keeps
connections alive, holds at most ``MaxIdleConnsPerHost`` = 2 idle ones per host
(``DefaultMaxIdleConnsPerHost``), closes any other connection when a request on it ends,
drops idle ones after ``IdleConnTimeout`` = 90 s, and reuses the most recently used idle
connection first (``queueForIdleConn`` takes ``list[len(list)-1]``). The hook's Service is
balanced by kube-proxy per *connection*: each new connection goes to a random ready pod,
and stays there.

This benchmark models exactly that, on loopback:

* ``--pods`` (6) hook pods, each its own gunicorn under the production config (one worker
  each here, to fit 2 cores; ``GUNICORN_THREADS`` as given), one fake-member process;
* a connection-level balancer: a TCP proxy that sends each new connection to a random
  backend of its current list (kube-proxy's iptables/IPVS random mode), 3 pods at first,
  all 6 after the scale-out;
* :class:`GoTransport`: ``http.client`` connections pooled the way Go's default transport
  pools them (above); a connection the server closed while idle is dropped before reuse,
  as Go's read loop does;
* Metacontroller's workers: ``--workers`` threads taking syncs at ``--rate`` per second
  (one token bucket, burst 1), each sync the recorded steady-state request.

Syncs per pod are read from each pod's own ``pgfh_sync_replies_total`` (``/metrics``,
straight to the pod), before and after each phase. Every reply is checked like the load
benchmark's (pinned on the leader, Service kept, strict parsing).

Run: ``.venv/bin/python -m testbed.bench.spread [--rate 50] [--workers 5] [--modes 0,100]``.
Loopback only; every loop is bounded by the phase durations.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import multiprocessing.connection
import random
import secrets
import select
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from testbed.bench.common import check_sync_reply, encode, recorded_body, steady_body
from testbed.fakes.patroni_fast import LEADER, REPLICA, fake_members
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook

#: Go's net/http defaults (transport.go): idle connections kept per host, and for how long.
GO_MAX_IDLE_CONNS_PER_HOST = 2
GO_IDLE_CONN_TIMEOUT = 90.0


# ----------------------------------------------------------------- the balancer


def _proxy(
    backends: list[int], lifetime: float, pipe: multiprocessing.connection.Connection
) -> None:
    """A TCP proxy on 127.0.0.1: each accepted connection to a random current backend."""
    current = list(backends)
    accepted: Counter[int] = Counter()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = random.choice(current)
        accepted[port] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        pipe.send(("ready", server.sockets[0].getsockname()[1]))
        loop = asyncio.get_running_loop()
        stop = loop.create_future()

        def command() -> None:
            try:
                tag, value = pipe.recv()
            except EOFError:
                tag, value = "stop", None
            if tag == "backends":
                current[:] = value
                pipe.send(("ok", None))
            elif tag == "accepted":
                pipe.send(("accepted", dict(accepted)))
            elif not stop.done():
                stop.set_result(None)

        loop.add_reader(pipe.fileno(), command)
        with suppress(TimeoutError):
            await asyncio.wait_for(stop, lifetime)
        server.close()

    asyncio.run(main())


@dataclass
class Balancer:
    port: int
    process: multiprocessing.process.BaseProcess
    pipe: multiprocessing.connection.Connection

    def route_to(self, backends: Sequence[int]) -> None:
        self.pipe.send(("backends", list(backends)))
        if not self.pipe.poll(10):
            raise RuntimeError("the balancer did not answer")
        self.pipe.recv()

    def accepted(self) -> dict[int, int]:
        self.pipe.send(("accepted", None))
        if not self.pipe.poll(10):
            raise RuntimeError("the balancer did not answer")
        return dict(self.pipe.recv()[1])


@contextmanager
def balancer(backends: Sequence[int], lifetime: float = 900.0) -> Iterator[Balancer]:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(
        target=_proxy, args=(list(backends), lifetime, child), name="balancer", daemon=True
    )
    process.start()
    child.close()
    try:
        if not parent.poll(30):
            raise RuntimeError("the balancer did not start")
        _, port = parent.recv()
        yield Balancer(port, process, parent)
    finally:
        if process.is_alive():
            with suppress(OSError):
                parent.send(("stop", None))
            process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
        parent.close()


# ----------------------------------------------------- Go's default transport


class GoTransport:
    """Keep-alive connections to one host, pooled like Go's ``http.DefaultTransport``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_idle: int = GO_MAX_IDLE_CONNS_PER_HOST,
        idle_timeout: float = GO_IDLE_CONN_TIMEOUT,
        timeout: float = 5.0,
    ) -> None:
        self.host, self.port = host, port
        self.max_idle, self.idle_timeout, self.timeout = max_idle, idle_timeout, timeout
        self._lock = threading.Lock()
        #: Idle connections, least recently used first; taken from the end (LIFO).
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self.dials = 0
        self.closed_by_server = 0

    def _get(self) -> http.client.HTTPConnection:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                conn, idle_at = self._idle.pop()
                if now - idle_at > self.idle_timeout or _broken(conn):
                    conn.close()
                    continue
                return conn
            self.dials += 1
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()  # "too many idle connections for host"

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        conn = self._get()
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            raise
        if response.will_close:
            self.closed_by_server += 1
            conn.close()
        else:
            self._put(conn)
        return response.status, data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


def _broken(conn: http.client.HTTPConnection) -> bool:
    """An idle connection the server has closed (readable while idle means EOF)."""
    sock = conn.sock
    if sock is None:
        return True
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


# ------------------------------------------------------------ Metacontroller


@dataclass
class Phase:
    name: str
    seconds: float
    pods: int
    #: Syncs answered by each pod during the phase (from its own metrics).
    per_pod: list[int]
    sent: int
    ok: int
    problems: dict[str, int]
    dials: int
    closed_by_server: int


def _replies(url: str) -> int:
    text = requests.get(f"{url}/metrics", timeout=5).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("pgfh_sync_replies_total{")
        )
    )


def _drive(
    transport: GoTransport,
    body: bytes,
    headers: dict[str, str],
    leader: str,
    *,
    workers: int,
    rate: float,
    seconds: float,
) -> tuple[int, int, Counter[str]]:
    """``workers`` threads sending syncs at ``rate``/s in all for ``seconds``."""
    lock = threading.Lock()
    interval = 1.0 / rate
    start = time.monotonic()
    ends_at = start + seconds
    schedule = [start]
    outcomes: Counter[str] = Counter()

    def worker() -> None:
        while True:
            with lock:
                slot = schedule[0]
                schedule[0] = slot + interval
            if slot >= ends_at:
                return
            time.sleep(max(0.0, slot - time.monotonic()))
            try:
                status, data = transport.post("/sync", body, headers)
                problem = check_sync_reply(status, data, leader)
            except (OSError, http.client.HTTPException) as error:
                problem = f"transport error {type(error).__name__}"
            with lock:
                outcomes[problem or "ok"] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    sent = sum(outcomes.values())
    ok = outcomes.pop("ok", 0)
    return sent, ok, outcomes


@dataclass
class ModeResult:
    max_requests: int
    rate: float
    workers: int
    phases: list[Phase] = field(default_factory=list)


def run_mode(
    max_requests: int,
    *,
    pods: int,
    initial: int,
    rate: float,
    workers: int,
    before: float,
    after: float,
    threads: int,
    workdir: Path,
) -> ModeResult:
    token = secrets.token_urlsafe(32)
    tokens = workdir / "auth"
    tokens.mkdir(mode=0o700)
    (tokens / "token").write_text(token + "\n")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Go-http-client/1.1",
        "Authorization": f"Bearer {token}",
    }
    result = ModeResult(max_requests, rate, workers)
    with ExitStack() as stack:
        fakes = stack.enter_context(fake_members([REPLICA, LEADER, REPLICA]))
        env = {
            "PGFH_ALLOWED_PATRONI_PORTS": str(fakes.port),
            "PGFH_AUTH": "token",
            "PGFH_AUTH_TOKENS_PATH": str(tokens),
            "PGFH_CONNECTION_MAX_REQUESTS": str(max_requests),
            "GUNICORN_ACCESS_LOG": "0",
        }
        hooks: list[GunicornHook] = []
        for index in range(pods):
            directory = workdir / f"pod-{index}"
            directory.mkdir()
            hooks.append(
                stack.enter_context(gunicorn_hook(directory, env=env, workers=1, threads=threads))
            )
        ports = [int(h.url.rsplit(":", 1)[1]) for h in hooks]
        body = encode(
            steady_body(hooks[0].url, recorded_body(fakes.hosts, fakes.port, fakes.names), headers)
        )
        proxy = stack.enter_context(balancer(ports[:initial]))
        transport = GoTransport("127.0.0.1", proxy.port)
        stack.callback(transport.close)
        for name, seconds, serving in (
            (f"{initial} pods", before, initial),
            (f"after scale-out to {pods}", after, pods),
        ):
            proxy.route_to(ports[:serving])
            counts = [_replies(h.url) for h in hooks]
            dials, closed = transport.dials, transport.closed_by_server
            sent, ok, problems = _drive(
                transport,
                body,
                headers,
                fakes.names[1],
                workers=workers,
                rate=rate,
                seconds=seconds,
            )
            per_pod = [_replies(h.url) - c for h, c in zip(hooks, counts, strict=True)]
            result.phases.append(
                Phase(
                    name,
                    seconds,
                    serving,
                    per_pod,
                    sent,
                    ok,
                    dict(problems),
                    transport.dials - dials,
                    transport.closed_by_server - closed,
                )
            )
    return result


def report(results: Sequence[ModeResult]) -> str:
    pods = len(results[0].phases[0].per_pod)
    lines = [
        "| `PGFH_CONNECTION_MAX_REQUESTS` | load | phase | syncs per pod "
        + " / ".join(f"p{i}" for i in range(pods))
        + " | busiest pod's share | pods with ≥ 5 % | new pods' share | new connections"
        " (closed by the hook) | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for phase in result.phases:
            total = max(1, sum(phase.per_pod))
            busiest = max(phase.per_pod) / total
            used = sum(1 for n in phase.per_pod if n >= 0.05 * total)
            new = sum(phase.per_pod[3:]) / total if phase.pods > 3 else None
            mode = "0 (never)" if result.max_requests == 0 else str(result.max_requests)
            lines.append(
                f"| {mode} | {result.rate:g}/s, {result.workers} workers | {phase.name} | "
                + " / ".join(str(n) for n in phase.per_pod)
                + f" | {100 * busiest:.0f} % | {used} of {phase.pods} | "
                + (f"{100 * new:.0f} % (fair: 50 %)" if new is not None else "")
                + f" | {phase.dials} ({phase.closed_by_server}) | "
                + f"{phase.sent - phase.ok}{' ' + str(phase.problems) if phase.problems else ''} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="0,100", help="PGFH_CONNECTION_MAX_REQUESTS values")
    parser.add_argument("--rates", default="50", help="syncs/s, comma-separated")
    parser.add_argument("--workers", type=int, default=5, help="Metacontroller --workers")
    parser.add_argument("--pods", type=int, default=6)
    parser.add_argument("--initial", type=int, default=3)
    parser.add_argument("--before", type=float, default=10.0, help="seconds before scale-out")
    parser.add_argument("--after", type=float, default=20.0, help="seconds after scale-out")
    parser.add_argument("--threads", type=int, default=4, help="GUNICORN_THREADS per pod")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 1 <= args.initial < args.pods <= 12:
        parser.error("need 1 <= --initial < --pods <= 12")
    if not (1 <= args.before <= 300 and 1 <= args.after <= 300):
        parser.error("phase durations must be between 1 and 300 s")
    rates = [float(r) for r in args.rates.split(",")]
    modes = [int(m) for m in args.modes.split(",")]
    if not all(0 < r <= 2000 for r in rates) or not all(m >= 0 for m in modes):
        parser.error("rates must be in (0, 2000], modes >= 0")
    results = []
    for rate in rates:
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="pgfh-spread-") as tmp:
                results.append(
                    run_mode(
                        mode,
                        pods=args.pods,
                        initial=args.initial,
                        rate=rate,
                        workers=args.workers,
                        before=args.before,
                        after=args.after,
                        threads=args.threads,
                        workdir=Path(tmp),
                    )
                )
            print(report(results[-1:]).splitlines()[-2:], flush=True, file=sys.stderr)
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps([_plain(r) for r in results], indent=2))
    failed = sum(p.sent - p.ok for r in results for p in r.phases)
    return 1 if failed else 0


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
