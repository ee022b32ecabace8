"""The hook's probe round in process: CPU and wall time per round, one prober beside another.

``testbed.bench.load`` measures a whole pod; this measures only :meth:`PatroniProber.probe`, in this
process, with the members in processes of their own (so this process's CPU is the
prober's: its request thread, its pool threads, its cutter):

* **healthy**: 3 ``testbed.fakes.patroni_fast`` members (a leader and two replicas), plain HTTP;
  CPU per round (``time.process_time`` over 20 rounds a sample) and wall p50;
* **hung**: the same with one member that reads the request and never answers, deadline
  0.5 s and read timeout 5 s, so that only the deadline ends the wait; the hung member
  first (probed in the calling thread) and last (in a pool thread); wall per round;
* **mTLS**: 3 HTTPS members in one process of their own that require a client certificate
  (a throw-away PKI from ``testbed/certs.py``), CA file and client certificate configured as
  in production; CPU per round (5 rounds a sample) and wall p50.

``--against FILE`` loads a second prober module from a file and samples both alternately,
one sample of each per turn, so both see the same machine; each figure's ratio is the
median of the pairwise ratios. The file is another checkout's ``hooks/patroni.py``, e.g.
main's: ``git show main:hooks/patroni.py > /tmp/main_patroni.py`` (it runs with this
checkout's other modules: meant for comparing prober implementations).

Run: ``.venv/bin/python -m testbed.bench.rounds [--against /tmp/main_patroni.py] [--samples 60]``.
Loopback only (127.0.0.40-42 and 127.0.0.50-52); every loop is bounded by its sample count.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import multiprocessing
import multiprocessing.connection
import socket
import socketserver
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.probe.tls import PatroniTLS
from testbed.fakes.patroni_fast import HUNG, LEADER, REPLICA, fake_members
from testbed.fakes.patroni_wire import patroni_body, read_request_head, response_head

#: First loopback address of the TLS members (testbed.fakes.patroni_fast's start at 127.0.0.40).
TLS_FIRST_HOST = 50
HUNG_DEADLINE = 0.5


class Prober:
    """What is measured: a prober built from a module's ``PatroniProber``."""

    def __init__(self, label: str, module: ModuleType) -> None:
        self.label = label
        self.module = module

    def make(self, **kwargs: Any) -> Any:
        return self.module.PatroniProber(**kwargs)


def load_prober_module(path: Path) -> ModuleType:
    """A prober module from a file, under a name of its own (beside ``hooks.patroni``)."""
    name = f"bench_rounds_prober_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------- TLS members


def _serve_tls(
    hosts: Sequence[str],
    cert: str,
    key: str,
    client_ca: str,
    lifetime: float,
    pipe: multiprocessing.connection.Connection,
) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(client_ca)
    answer = response_head(200) + json.dumps(patroni_body("primary", name="pg-orders-0")).encode()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            raw: socket.socket = self.request
            raw.settimeout(2.0)
            with suppress(OSError), context.wrap_socket(raw, server_side=True) as conn:
                if read_request_head(conn) is not None:
                    conn.sendall(answer)

    class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128

    servers = [Server((host, 0), Handler) for host in hosts]
    threads = [
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        for s in servers
    ]
    for thread in threads:
        thread.start()
    pipe.send([s.server_address[1] for s in servers])
    pipe.poll(lifetime)  # any message, EOF or the lifetime: stop
    for server in servers:
        server.shutdown()
        server.server_close()


@dataclass
class TLSMembers:
    urls: list[str]
    tls: PatroniTLS
    directory: Path = field(repr=False)


@contextmanager
def tls_members(count: int = 3, lifetime: float = 600.0) -> Iterator[TLSMembers]:
    """``count`` HTTPS members requiring a client certificate, in a process of their own."""
    from testbed.certs import TestCA  # cryptography: a test dependency, only needed here

    hosts = [f"127.0.0.{TLS_FIRST_HOST + i}" for i in range(count)]
    with tempfile.TemporaryDirectory(prefix="pgfh-rounds-pki-") as tmp:
        ca = TestCA(Path(tmp), "rounds")
        server = ca.issue("member", ips=tuple(hosts))
        client = ca.issue("hook", client=True, server=False)
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=_serve_tls,
            args=(hosts, str(server.cert), str(server.key), str(ca.cert_file), lifetime, child),
            name="tls-members",
            daemon=True,
        )
        process.start()
        child.close()
        try:
            if not parent.poll(30):
                raise RuntimeError("TLS members did not start within 30 s")
            ports = parent.recv()
            urls = [f"https://{h}:{p}/primary" for h, p in zip(hosts, ports, strict=True)]
            tls = PatroniTLS(str(ca.cert_file), str(client.cert), str(client.key))
            yield TLSMembers(urls, tls, Path(tmp))
        finally:
            with suppress(OSError):
                parent.send("stop")
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
            parent.close()


# ---------------------------------------------------------------- measuring


@dataclass
class Series:
    cpu_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)


def _sample(
    probe: Callable[[], dict[str, MemberStatus]], per_sample: int, check: Callable[..., None]
) -> tuple[float, float]:
    cpu = time.process_time()
    walls = []
    for _ in range(per_sample):
        started = time.perf_counter()
        check(probe())
        walls.append(time.perf_counter() - started)
    return 1000 * (time.process_time() - cpu) / per_sample, 1000 * statistics.median(walls)


def alternate(
    probers: Sequence[Prober],
    build: Callable[[Prober], Any],
    targets: Sequence[ProbeTarget],
    *,
    samples: int,
    per_sample: int,
    warmup: int,
    check: Callable[..., None],
) -> dict[str, Series]:
    """Each prober's series, one sample of each in turn."""
    built = [(p.label, build(p)) for p in probers]
    series = {label: Series() for label, _ in built}
    try:
        for _, prober in built:
            for _ in range(warmup):
                prober.probe(targets)
        for _ in range(samples):
            for label, prober in built:
                cpu, wall = _sample(functools.partial(prober.probe, targets), per_sample, check)
                series[label].cpu_ms.append(cpu)
                series[label].wall_ms.append(wall)
    finally:
        for _, prober in built:
            prober.close()
    return series


def _leader_found(result: dict[str, MemberStatus]) -> None:
    leaders = [pod for pod, status in result.items() if status.is_leader]
    if len(leaders) != 1:
        raise RuntimeError(f"expected one leader, got {result}")


def _all_lead(result: dict[str, MemberStatus]) -> None:
    if not all(status.is_leader for status in result.values()):
        raise RuntimeError(f"expected every TLS member to answer: {result}")


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _row(name: str, series: dict[str, Series], figure: str, labels: Sequence[str]) -> str:
    values = [getattr(series[label], figure) for label in labels]
    cells = [f"{_median(v):.2f}" for v in values]
    ratio = ""
    if len(values) == 2:
        pairs = [b / a for a, b in zip(values[0], values[1], strict=True) if a > 0]
        ratio = f"{_median(pairs):.2f}"
    return f"| {name} | " + " | ".join(cells) + f" | {ratio} |"


def measure(probers: Sequence[Prober], samples: int) -> str:
    labels = [p.label for p in probers]
    lines = [
        "| round (in process) | "
        + " | ".join(labels)
        + " | ratio "
        + (f"{labels[1]} / {labels[0]}, pairwise p50 |" if len(labels) == 2 else "|"),
        "|---|" + "---|" * len(labels) + "---|",
    ]
    with fake_members([REPLICA, LEADER, REPLICA]) as fakes:
        targets = [
            ProbeTarget(name, f"http://{host}:{fakes.port}/primary", 1.0, 1.0)
            for name, host in zip(fakes.names, fakes.hosts, strict=True)
        ]
        healthy = alternate(
            probers,
            lambda p: p.make(),
            targets,
            samples=samples,
            per_sample=20,
            warmup=50,
            check=_leader_found,
        )
    lines.append(_row("3 healthy members: CPU ms per round, p50", healthy, "cpu_ms", labels))
    lines.append(_row("… wall ms per round, p50", healthy, "wall_ms", labels))
    for where, behaviours in (
        ("first", [HUNG, LEADER, REPLICA]),
        ("last", [REPLICA, LEADER, HUNG]),
    ):
        with fake_members(behaviours) as fakes:
            targets = [
                ProbeTarget(name, f"http://{host}:{fakes.port}/primary", 1.0, 5.0)
                for name, host in zip(fakes.names, fakes.hosts, strict=True)
            ]
            hung = alternate(
                probers,
                lambda p: p.make(deadline=HUNG_DEADLINE),
                targets,
                samples=5,
                per_sample=1,
                warmup=1,
                check=_leader_found,
            )
        name = f"a hung member ({where}), deadline {HUNG_DEADLINE:g} s: wall ms, p50 of 5"
        lines.append(_row(name, hung, "wall_ms", labels))
        worst = " / ".join(f"{max(hung[label].wall_ms):.1f}" for label in labels)
        lines.append(f"| … max of 5 | {worst.replace(' / ', ' | ')} | |")
    with tls_members() as members:
        targets = [
            ProbeTarget(f"pg-orders-{i}", url, 1.0, 1.0) for i, url in enumerate(members.urls)
        ]
        mtls = alternate(
            probers,
            lambda p: p.make(tls=members.tls),
            targets,
            samples=max(10, samples // 3),
            per_sample=5,
            warmup=5,
            check=_all_lead,
        )
    lines.append(_row("3 mTLS members: CPU ms per round, p50", mtls, "cpu_ms", labels))
    lines.append(_row("… wall ms per round, p50", mtls, "wall_ms", labels))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="another prober module, sampled first")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--against-label", default="--against")
    parser.add_argument("--samples", type=int, default=60)
    args = parser.parse_args(argv)
    if not 5 <= args.samples <= 1000:
        parser.error("--samples must be between 5 and 1000")
    from hooks import patroni

    probers = [Prober(args.label, patroni)]
    if args.against is not None:
        probers.insert(0, Prober(args.against_label, load_prober_module(args.against)))
    print(measure(probers, args.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
