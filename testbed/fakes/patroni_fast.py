"""Fast loopback fake Patroni members for the benchmarks, served from their own process.

``testbed/fakes/patroni.py`` has the faithful fault-injecting fakes (a thread per connection, a
connection cap of 500), made for correctness tests. A load run needs thousands of probes
a second, and their CPU must not be confused with the hook's or the load generator's, so
this module serves members from a separate process with one asyncio event loop and a
bare :class:`asyncio.Protocol` per connection.

Each member answers like Patroni 4.1's REST API (``docs/rest_api.rst``, ``api.py``):
HTTP/1.0, no ``Content-Length``, the connection closed after the one response, the
same JSON document on every health path (the leader's lists its replicas: 0.8 KiB with
the headers), 200 on ``/primary`` for the leader and 503 for a replica. A ``hung``
member reads the request and never answers (what Patroni does for ~2 s while it shuts
down). The document, the headers and the shared-port binding are the tests' own
(:mod:`testbed.fakes.patroni_wire`), so a benchmark probes exactly what the correctness tests do.

Bounded: the server process stops by itself after ``lifetime`` seconds or
``max_connections`` connections, whichever comes first, and a held connection is
dropped after ``max_hold`` seconds.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from testbed.fakes.patroni_wire import bind_shared_port, patroni_body, response

LEADER = "leader"
REPLICA = "replica"
HUNG = "hung"
BEHAVIOURS = (LEADER, REPLICA, HUNG)

#: First loopback address of the benchmark members (tests use 127.0.0.10 and up).
FIRST_HOST = 40


class _Member(asyncio.Protocol):
    def __init__(self, answer: bytes | None, state: _State) -> None:
        self.answer = answer  # None: hung
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.state.connections += 1
        if self.answer is None:
            self.state.held.add(transport)
            asyncio.get_running_loop().call_later(self.state.max_hold, transport.close)
        if self.state.connections >= self.state.max_connections:
            self.state.done.set()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.answer is None:
            return
        self.buffer += data
        if b"\r\n\r\n" in self.buffer or len(self.buffer) > 16384:
            self.transport.write(self.answer)
            self.transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.state.held.discard(self.transport)


@dataclass
class _State:
    max_connections: int
    max_hold: float
    done: asyncio.Event
    held: set[asyncio.Transport]
    connections: int = 0


def _serve(
    hosts: Sequence[str],
    names: Sequence[str],
    behaviours: Sequence[str],
    lifetime: float,
    max_connections: int,
    max_hold: float,
    pipe: multiprocessing.connection.Connection,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us through the pipe

    async def main() -> int:
        loop = asyncio.get_running_loop()
        state = _State(max_connections, max_hold, asyncio.Event(), set())
        port, socks = bind_shared_port(hosts)
        servers = []
        for sock, name, behaviour in zip(socks, names, behaviours, strict=True):
            answer: bytes | None = None
            if behaviour == LEADER:
                answer = response(200, patroni_body("primary", name=name, members=names))
            elif behaviour == REPLICA:
                answer = response(503, patroni_body("replica", name=name, members=names))
            sock.listen(1024)
            servers.append(
                await loop.create_server(
                    lambda answer=answer: _Member(answer, state),  # type: ignore[misc]
                    sock=sock,
                )
            )
        loop.add_reader(pipe.fileno(), state.done.set)  # any message (or EOF): stop
        pipe.send(("ready", port, os.getpid()))
        with suppress(TimeoutError):
            await asyncio.wait_for(state.done.wait(), lifetime)
        for server in servers:
            server.close()
        for transport in list(state.held):
            transport.close()
        return state.connections

    connections = asyncio.run(main())
    with suppress(OSError):
        pipe.send(("stopped", connections, os.times()))


class _ServingProcess:
    """What both fake-member processes share: a pipe to ask them to stop, and their figures."""

    process: multiprocessing.process.BaseProcess
    _pipe: multiprocessing.connection.Connection
    #: After stop(): connections served, and the process's CPU seconds (user + system).
    connections: int
    cpu_seconds: float

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.is_alive():
            with suppress(OSError):
                self._pipe.send("stop")
            if self._pipe.poll(timeout):
                with suppress(EOFError, OSError):
                    tag, connections, times = self._pipe.recv()
                    if tag == "stopped":
                        self.connections = connections
                        self.cpu_seconds = times.user + times.system
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self._pipe.close()


@dataclass
class FakeMembers(_ServingProcess):
    """A running fake-member process: where the members are and how to stop it."""

    hosts: list[str]
    names: list[str]
    port: int
    pid: int
    process: multiprocessing.process.BaseProcess
    _pipe: multiprocessing.connection.Connection
    connections: int = 0
    cpu_seconds: float = 0.0


@contextmanager
def fake_members(
    behaviours: Sequence[str],
    *,
    names: Sequence[str] | None = None,
    first_host: int = FIRST_HOST,
    lifetime: float = 900.0,
    max_connections: int = 5_000_000,
    max_hold: float = 30.0,
) -> Iterator[FakeMembers]:
    """Serve one member per behaviour on 127.0.0.<first_host>, <first_host+1>, ..."""
    assert all(b in BEHAVIOURS for b in behaviours), behaviours
    hosts = [f"127.0.0.{first_host + i}" for i in range(len(behaviours))]
    names = list(names or [f"pg-orders-{i}" for i in range(len(behaviours))])
    context = multiprocessing.get_context("spawn")  # no inherited threads or sockets
    parent, child = context.Pipe()
    process = context.Process(
        target=_serve,
        args=(hosts, names, list(behaviours), lifetime, max_connections, max_hold, child),
        name="fake-patroni",
        daemon=True,
    )
    process.start()
    child.close()
    members: FakeMembers | None = None
    try:
        if not parent.poll(30):
            raise RuntimeError("fake Patroni members did not start within 30 s")
        tag, port, pid = parent.recv()
        assert tag == "ready", tag
        members = FakeMembers(hosts, names, port, pid, process, parent)
        yield members
    finally:
        if members is not None:
            members.stop()
        else:
            process.kill()
            process.join(5)
            parent.close()


# ---------------------------------------------------------------- a fleet of clusters

#: Second octet of member ``m``'s address in a fleet: cluster ``c``, member ``m`` is
#: 127.(FLEET_OCTET + m).(c // 250).(c % 250 + 1): distinct from the fixed members above.
FLEET_OCTET = 20


def fleet_host(cluster: int, member: int) -> str:
    """Loopback address of one member of one cluster of a fleet."""
    return f"127.{FLEET_OCTET + member}.{cluster // 250}.{cluster % 250 + 1}"


class _FleetMember(asyncio.Protocol):
    """One connection to member ``member`` of cluster ``cluster``: answers by the role it
    holds when the request arrives (the leader 200, everyone else 503), then closes."""

    def __init__(self, fleet: _Fleet, cluster: int, member: int) -> None:
        self.fleet = fleet
        self.cluster = cluster
        self.member = member
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.fleet.connections += 1

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        self.buffer += data
        if b"\r\n\r\n" in self.buffer or len(self.buffer) > 16384:
            leader = self.fleet.leaders[self.cluster] == self.member
            answers = self.fleet.cluster_answers or [self.fleet.answers]
            self.transport.write(answers[self.cluster % len(answers)][leader][self.member])
            self.transport.close()
            self.transport = None


@dataclass
class _Fleet:
    leaders: list[int]
    answers: dict[bool, list[bytes]]
    connections: int = 0
    #: Per cluster, when its members carry names of their own (``member_names``).
    cluster_answers: list[dict[bool, list[bytes]]] | None = None


def _answers(names: Sequence[str]) -> dict[bool, list[bytes]]:
    return {
        True: [response(200, patroni_body("primary", name=n, members=names)) for n in names],
        False: [response(503, patroni_body("replica", name=n, members=names)) for n in names],
    }


def _serve_fleet(
    clusters: int,
    members: int,
    lifetime: float,
    pipe: multiprocessing.connection.Connection,
    hosts: Sequence[str] | None = None,
    member_names: Sequence[Sequence[str]] | None = None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    names = [f"pg-orders-{i}" for i in range(members)]
    fleet = _Fleet(
        leaders=[0] * clusters,
        answers=_answers(names),
        cluster_answers=[_answers(n) for n in member_names] if member_names else None,
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        ports = []
        servers = []
        for c in range(clusters):
            port, socks = bind_shared_port(
                list(hosts) if hosts else [fleet_host(c, m) for m in range(members)]
            )
            ports.append(port)
            for m, sock in enumerate(socks):
                sock.listen(1024)
                servers.append(
                    await loop.create_server(
                        lambda c=c, m=m: _FleetMember(fleet, c, m),  # type: ignore[misc]
                        sock=sock,
                    )
                )

        def command() -> None:
            try:
                message = pipe.recv()
            except (EOFError, OSError):
                done.set()
                return
            if message == "stop":
                done.set()
            else:  # ("leader", cluster, member or -1)
                _, cluster, member = message
                fleet.leaders[cluster] = member

        loop.add_reader(pipe.fileno(), command)
        pipe.send(("ready", ports, os.getpid()))
        with suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), lifetime)
        for server in servers:
            server.close()

    asyncio.run(main())
    with suppress(OSError):
        pipe.send(("stopped", fleet.connections, os.times()))


@dataclass
class FleetMembers(_ServingProcess):
    """A running fleet of fake clusters: cluster ``c``'s members are on
    ``fleet_host(c, m)`` at ``ports[c]``; member 0 of every cluster starts as leader."""

    ports: list[int]
    pid: int
    process: multiprocessing.process.BaseProcess
    _pipe: multiprocessing.connection.Connection
    connections: int = 0
    cpu_seconds: float = 0.0

    def set_leader(self, cluster: int, member: int | None) -> None:
        """Make ``member`` the leader of ``cluster`` (None: nobody answers 200)."""
        self._pipe.send(("leader", cluster, -1 if member is None else member))


@contextmanager
def fleet_members(
    clusters: int,
    members: int = 3,
    lifetime: float = 900.0,
    *,
    hosts: Sequence[str] | None = None,
    member_names: Sequence[Sequence[str]] | None = None,
) -> Iterator[FleetMembers]:
    """Serve ``clusters`` fake Patroni clusters of ``members`` members from one process.

    ``hosts``: the ``members`` addresses every cluster's members listen on (each cluster
    then on a port of its own), e.g. the 3 loopback addresses behind the test Pod network's
    Pod IPs (:mod:`testbed.kubernetes.podnet` maps only 254 of them: a port per cluster scales
    where an address per member would not). ``member_names``: each cluster's member names
    (Patroni's ``name``, the Pod's name), else ``pg-orders-<m>``."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(
        target=_serve_fleet,
        args=(clusters, members, lifetime, child, hosts, member_names),
        name="fake-patroni-fleet",
        daemon=True,
    )
    process.start()
    child.close()
    fleet: FleetMembers | None = None
    try:
        if not parent.poll(60):
            raise RuntimeError("fake Patroni fleet did not start within 60 s")
        tag, ports, pid = parent.recv()
        assert tag == "ready", tag
        fleet = FleetMembers(ports, pid, process, parent)
        yield fleet
    finally:
        if fleet is not None:
            fleet.stop()
        else:
            process.kill()
            process.join(5)
            parent.close()
