"""The model's replies played on asyncio connections: the benchmarks' fake members' protocol.

:mod:`testbed.fakes.patroni_fast` serves fake Patroni members and fleets from a process of
their own with one asyncio loop; this is what each connection runs there: read the request
head, take the :mod:`testbed.fakes.patroni_model` reply for its path (made once per member and
path, then reused) and play its steps. The common reply, one write and a close, is written
straight from the protocol's callback; the others (slow, drip, reset, huge, hung) by a task
per connection, bounded by ``max_hold``. Also the TLS files a member serves HTTPS with.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from dataclasses import dataclass, field

from testbed.fakes.patroni_model import (
    Behaviour,
    Drip,
    Hold,
    Identity,
    Reply,
    Send,
    Stream,
    Wait,
    reply,
    request_path,
)

MAX_REQUEST_BYTES = 16384
SEND_CHUNK = 64 * 1024


class Answers:
    """One member's replies by request path, made by the model once and then reused."""

    def __init__(self, behaviour: Behaviour, identity: Identity) -> None:
        self.behaviour, self.identity = behaviour, identity
        self.by_path: dict[str, Reply] = {}

    def to(self, request: bytes) -> Reply:
        """The reply to ``request`` (its head), by the path of its request line."""
        line = request.split(b"\r\n", 1)[0].decode("latin-1")
        path = request_path(line)
        answer = self.by_path.get(path)
        if answer is None:
            answer = self.by_path[path] = reply(self.behaviour, self.identity, line)
        return answer


class Connection(asyncio.Protocol):
    """One accepted connection: reads the request head, then plays the model's reply."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        #: While the transport's buffer is full (flow control): resolved when it drains.
        self.drained: asyncio.Future[None] | None = None

    def answers(self) -> Answers:
        """The answers of the member this connection reached (the subclass knows which)."""
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.state.connections += 1
        if self.state.connections >= self.state.max_connections:
            self.state.done.set()

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        if transport is None:
            return
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer and len(self.buffer) <= MAX_REQUEST_BYTES:
            return
        self.transport = None  # one request per connection: later bytes are ignored
        answer = self.answers().to(self.buffer)
        first = answer.steps[0]
        if len(answer.steps) == 1 and isinstance(first, Send) and not answer.reset:
            transport.write(first.data)  # the hot path: one write, then close
            transport.close()
            return
        self.state.held.add(transport)
        task = asyncio.get_running_loop().create_task(self._play(transport, answer))
        self.state.tasks.add(task)
        task.add_done_callback(self.state.tasks.discard)

    async def _play(self, transport: asyncio.Transport, answer: Reply) -> None:
        try:
            async with asyncio.timeout(self.state.max_hold):
                await self._steps(transport, answer)
        except TimeoutError:
            pass  # held (or streamed) too long: drop it
        if answer.reset and not transport.is_closing():
            sock = transport.get_extra_info("socket")
            if sock is not None:  # SO_LINGER on, timeout 0: the close sends RST
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        else:
            transport.close()
        self.state.held.discard(transport)

    async def _steps(self, transport: asyncio.Transport, answer: Reply) -> None:
        for step in answer.steps:
            if transport.is_closing():
                return
            if isinstance(step, Send):
                transport.write(step.data)
            elif isinstance(step, Wait):
                await asyncio.sleep(step.seconds)
            elif isinstance(step, Drip):
                for index in range(len(step.data)):
                    await asyncio.sleep(step.interval)
                    transport.write(step.data[index : index + 1])
            elif isinstance(step, Stream):
                for start in range(0, step.size, SEND_CHUNK):
                    if self.drained is not None:
                        await self.drained
                    transport.write(b"x" * min(SEND_CHUNK, step.size - start))
            elif isinstance(step, Hold):
                await asyncio.sleep(self.state.max_hold)
        while answer.reset and transport.get_write_buffer_size() and not transport.is_closing():
            await asyncio.sleep(0.005)  # the bytes before the reset go out first

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()
        self.transport = None


@dataclass
class ServerState:
    max_connections: int
    max_hold: float
    done: asyncio.Event
    held: set[asyncio.Transport] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    connections: int = 0


@dataclass(frozen=True)
class TLSFiles:
    """The members' certificate and key, and the CA their clients' certificates must have
    (``None``: no client certificate asked for)."""

    cert: str
    key: str
    client_ca: str | None = None

    def server_context(self) -> ssl.SSLContext:
        """A server context with these files (made in the serving process)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.client_ca)
        return context
