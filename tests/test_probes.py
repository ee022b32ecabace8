"""The real :class:`PatroniProber` against loopback fake Patroni members.

Design notes: every fake is a real TCP server (``testbed/fakes/patroni.py``), so timeouts,
resets, redirects and body caps are exercised through the prober's own sockets
exactly as in production. Timing assertions are correctness bounds (``deadline + 0.25 s``), not
benchmarks; deadlines are kept at 0.5-1.0 s so the module stays fast.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import replace

import pytest
import requests

from hooks.domain.members import MemberStatus, ProbeTarget, ProbeVerdict
from hooks.patroni import PatroniProber
from testbed.fakes import patroni as fakes
from testbed.fakes.patroni import Behaviour, FakeMember, FullBacklog
from testbed.fakes.patroni_wire import patroni_body, read_request_head

DEADLINE = 0.5
#: probe() may overrun its deadline by scheduling noise only, never by a member's delay.
SLACK = 0.25
CAP = 64 * 1024
LATE = f"no answer within the {DEADLINE:g} s probe deadline"

MakeMember = Callable[..., FakeMember]


@pytest.fixture
def real_prober() -> Iterator[PatroniProber]:
    prober = PatroniProber(deadline=DEADLINE, max_body_bytes=CAP)
    yield prober


@pytest.fixture
def member() -> Iterator[MakeMember]:
    """Start fake members on 127.0.0.1; all are closed at teardown."""
    started: list[FakeMember] = []

    def make(
        behaviour: Behaviour = fakes.LEADER,
        *,
        name: str = "pg-0",
        timeline: int = 1,
        host: str = "127.0.0.1",
    ) -> FakeMember:
        fake = FakeMember(behaviour, name=name, timeline=timeline, host=host)
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.close()


def target(
    fake: FakeMember | FullBacklog,
    pod: str = "pg-0",
    *,
    connect: float = 0.5,
    read: float = 1.0,
) -> ProbeTarget:
    return ProbeTarget(pod=pod, url=fake.url(), connect_timeout=connect, read_timeout=read)


def timed_probe(
    prober: PatroniProber, *targets: ProbeTarget
) -> tuple[dict[str, MemberStatus], float]:
    started = time.monotonic()
    result = prober.probe(list(targets))
    return result, time.monotonic() - started


# ---------------------------------------------------------------- one verdict each

VERDICTS = [
    # behaviour, verdict, claims leadership, reason
    (fakes.LEADER, ProbeVerdict.LEADER, True, "HTTP 200 on /primary: primary, running"),
    (fakes.REPLICA, ProbeVerdict.NOT_LEADER, False, "HTTP 503 on /primary: replica, running"),
    (fakes.REFUSED, ProbeVerdict.UNREACHABLE, False, "connection refused"),
    (fakes.HUNG, ProbeVerdict.UNREACHABLE, False, LATE),
    (fakes.slow(2.0), ProbeVerdict.UNREACHABLE, False, LATE),
    (fakes.DRIP, ProbeVerdict.UNREACHABLE, False, LATE),
    (fakes.RESET_MID_BODY, ProbeVerdict.UNREACHABLE, False, "connection reset"),
    # Answers that are not Patroni's: answered, not the leader (they block nothing).
    (fakes.GARBAGE, ProbeVerdict.NOT_LEADER, False, "HTTP 200 on /primary with a non-JSON body"),
    (
        fakes.NOT_PATRONI,
        ProbeVerdict.NOT_LEADER,
        False,
        "HTTP 200 on /primary without Patroni JSON",
    ),
    (
        fakes.huge(content_length=True),
        ProbeVerdict.NOT_LEADER,
        False,
        f"body larger than {CAP} bytes",
    ),
    (
        fakes.huge(content_length=False),
        ProbeVerdict.NOT_LEADER,
        False,
        f"body larger than {CAP} bytes",
    ),
    (
        fakes.PROMOTING,
        ProbeVerdict.NOT_LEADER,
        True,
        "HTTP 200 on /primary but role=replica, state=running",
    ),
    (
        fakes.STOPPING,
        ProbeVerdict.NOT_LEADER,
        True,
        "HTTP 200 on /primary but role=primary, state=stopping",
    ),
    (fakes.MASTER_V3, ProbeVerdict.LEADER, True, "HTTP 200 on /primary: primary, running"),
]


@pytest.mark.parametrize(
    ("behaviour", "verdict", "claims", "reason"),
    VERDICTS,
    ids=[
        f"{b.kind.value}{'-slow' if b.delay else ''}"
        f"{'-no-length' if b.kind is fakes.Kind.HUGE and not b.content_length else ''}"
        for b, *_ in VERDICTS
    ],
)
def test_each_behaviour_gives_its_verdict_and_the_same_short_reason_twice(
    real_prober: PatroniProber,
    member: MakeMember,
    behaviour: Behaviour,
    verdict: ProbeVerdict,
    claims: bool,
    reason: str,
) -> None:
    fake = member(behaviour, name="pg-0", timeline=3)
    first = real_prober.probe([target(fake)])["pg-0"]
    fake.release()
    second = real_prober.probe([target(fake)])["pg-0"]
    fake.release()

    assert first.verdict is verdict
    assert first.claims_leadership is claims
    assert first.reason == reason
    assert second == first  # the whole value, not only the reason: nothing varies
    assert len(reason) <= 80 and "0x" not in reason and " at " not in reason
    if verdict is ProbeVerdict.LEADER:
        assert (first.role, first.state, first.timeline) == ("primary", "running", 3)
        assert first.patroni_name == "pg-0"
    if behaviour.kind is not fakes.Kind.REFUSED:
        assert fake.requests == ["GET /primary HTTP/1.1"] * 2


# ----------------------------------------------------------------------- deadlines


@pytest.mark.parametrize(
    "behaviour", [fakes.HUNG, fakes.slow(2.0), fakes.DRIP], ids=["hung", "slow", "drip"]
)
def test_a_stalling_member_never_pushes_the_round_past_the_deadline(
    real_prober: PatroniProber, member: MakeMember, behaviour: Behaviour
) -> None:
    stalling = member(behaviour, name="pg-0")
    leader = member(fakes.LEADER, name="pg-1")
    replica = member(fakes.REPLICA, name="pg-2")

    result, elapsed = timed_probe(
        real_prober,
        target(stalling, "pg-0"),
        target(leader, "pg-1"),
        target(replica, "pg-2"),
    )

    assert elapsed <= DEADLINE + SLACK, f"round took {elapsed:.3f} s"
    assert result["pg-0"].reason == LATE
    assert result["pg-1"].is_leader
    assert result["pg-2"].verdict is ProbeVerdict.NOT_LEADER


def test_members_are_asked_concurrently(member: MakeMember) -> None:
    prober = PatroniProber(deadline=1.0)
    fakes_ = [member(fakes.slow(0.3, fakes.REPLICA), name=f"pg-{i}") for i in range(3)]
    result, elapsed = timed_probe(prober, *(target(f, f.name) for f in fakes_))

    assert all(s.verdict is ProbeVerdict.NOT_LEADER for s in result.values()), result
    assert 0.3 <= elapsed < 0.6, f"3 members answering after 0.3 s took {elapsed:.3f} s"


def test_the_connect_timeout_of_the_target_is_honoured() -> None:
    prober = PatroniProber(deadline=1.0)
    with FullBacklog() as blackhole:
        result, elapsed = timed_probe(prober, target(blackhole, connect=0.2))

    assert result["pg-0"].reason == "connect timeout"
    assert 0.2 <= elapsed <= 0.2 + SLACK


@pytest.mark.parametrize(
    "behaviour", [fakes.HUNG, fakes.slow(0.8)], ids=["hung", "slow-past-read-timeout"]
)
def test_the_read_timeout_of_the_target_is_honoured(
    member: MakeMember, behaviour: Behaviour
) -> None:
    prober = PatroniProber(deadline=1.0)
    fake = member(behaviour)
    result, elapsed = timed_probe(prober, target(fake, read=0.2))

    assert result["pg-0"].reason == "read timeout"
    assert 0.2 <= elapsed <= 0.2 + SLACK


def test_a_timeout_cut_short_by_the_deadline_is_reported_as_the_deadline(
    real_prober: PatroniProber, member: MakeMember
) -> None:
    # The worker clamps its read timeout to what is left of the round. When that clamp
    # fires, the worker must say what probe() says for the same member ("deadline"), or
    # the reason would flip between the two from sync to sync, depending on which
    # thread wins the race, and the status condition would be rewritten every time.
    fake = member(fakes.HUNG)
    status = real_prober.probe_one(target(fake, read=1.0), time.monotonic() + 0.3)
    assert status.reason == LATE


def test_a_dripping_member_does_not_hold_the_request_thread_past_the_deadline(
    real_prober: PatroniProber, member: MakeMember
) -> None:
    # A body read that waited for a whole chunk would hold the request's thread for
    # 8192 x 0.3 s while the member drips, and a few such members would take every
    # gunicorn thread from the other clusters' syncs (see the next test).
    fake = member(fakes.DRIP)
    started = time.monotonic()
    status = real_prober.probe_one(target(fake), started + DEADLINE)
    elapsed = time.monotonic() - started

    assert status.reason == LATE
    assert elapsed <= DEADLINE + fakes.DRIP_INTERVAL + SLACK, f"held for {elapsed:.3f} s"


def test_a_dripping_member_does_not_starve_the_next_round(member: MakeMember) -> None:
    prober = PatroniProber(deadline=DEADLINE)
    drip = member(fakes.DRIP, name="pg-0")
    leader = member(fakes.LEADER, name="pg-1")
    first, _ = timed_probe(prober, target(drip, "pg-0"))
    second, elapsed = timed_probe(prober, target(leader, "pg-1"))

    assert first["pg-0"].reason == LATE
    assert second["pg-1"].is_leader, second["pg-1"].reason
    assert elapsed <= DEADLINE + SLACK


class Trickler:
    """A member that answers every request with a head that never ends, a byte every 50 ms.

    requests' read timeout bounds each recv, not the answer, so only the round's own
    deadline can end such a probe. Each connection is served at most 10 s; every moment a
    connection was seen closed by the client is recorded.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.closed_after: list[float] = []
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/primary"

    def _accept(self) -> None:
        while not self.stop.is_set() and len(self._threads) < 200:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2.0)
            conn.recv(4096)
            started = time.monotonic()
            try:
                conn.sendall(b"HTTP/1.0 200 OK\r\nX-Slow: ")
                for _ in range(200):
                    if self.stop.wait(0.05):
                        return
                    conn.sendall(b"a")
            except OSError:
                self.closed_after.append(time.monotonic() - started)

    def close(self) -> None:
        self.stop.set()
        self._accepting.join(5.0)
        for thread in self._threads:
            thread.join(5.0)
        self.listener.close()


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    server = Trickler()
    yield server
    server.close()


@pytest.mark.parametrize("kind", ["hung", "drip", "trickling-head"])
def test_a_stalling_member_probed_round_after_round_never_makes_a_round_wait(
    member: MakeMember, trickler: Trickler, kind: str
) -> None:
    # Three pool threads for three members: if a stalled probe kept its thread past its
    # round (a member that trickles its head would keep it for 10 s), the next round's
    # leader would queue for a thread and miss its deadline.
    deadline = 0.3
    prober = PatroniProber(deadline=deadline, threads=3)
    leader = member(fakes.LEADER, name="pg-1")
    replica = member(fakes.REPLICA, name="pg-2")
    stalling = (
        ProbeTarget("pg-0", trickler.url(), 0.5, 5.0)
        if kind == "trickling-head"
        else target(member(fakes.HUNG if kind == "hung" else fakes.DRIP), "pg-0", read=5.0)
    )
    targets = [stalling, target(leader, "pg-1", read=5.0), target(replica, "pg-2", read=5.0)]
    for round_ in range(12):
        result, elapsed = timed_probe(prober, *targets)
        assert elapsed <= deadline + SLACK, f"round {round_} took {elapsed:.3f} s"
        assert result["pg-0"].reason == f"no answer within the {deadline:g} s probe deadline"
        assert result["pg-1"].is_leader, (round_, result["pg-1"].reason)
        assert result["pg-2"].verdict is ProbeVerdict.NOT_LEADER, (round_, result["pg-2"])
    prober.close()


def test_a_member_that_trickles_its_headers_is_cut_off_at_the_deadline(
    trickler: Trickler,
) -> None:
    # A byte every 50 ms under a 1 s read timeout would never time out. The round ends it
    # at its deadline, and the member sees the connection closed then, not in 10 s.
    prober = PatroniProber(deadline=DEADLINE)
    started = time.monotonic()
    status = prober.probe([ProbeTarget("pg-0", trickler.url(), 0.5, 1.0)])["pg-0"]
    elapsed = time.monotonic() - started
    assert status.reason == LATE
    assert elapsed <= DEADLINE + SLACK
    waited = 0.0
    while not trickler.closed_after and waited < 2.0:
        time.sleep(0.05)
        waited += 0.05
    assert trickler.closed_after and trickler.closed_after[0] <= DEADLINE + 0.3


# ------------------------------------------------------------ redirects, body cap


def test_a_redirect_is_never_followed(real_prober: PatroniProber, member: MakeMember) -> None:
    elsewhere = member(fakes.LEADER, name="pg-9")
    redirecting = member(fakes.redirect(elsewhere.url()), name="pg-0")

    status = real_prober.probe([target(redirecting)])["pg-0"]

    assert status.verdict is ProbeVerdict.NOT_LEADER and not status.patroni_answer
    assert not status.claims_leadership
    assert status.reason == "HTTP 302 on /primary with a non-JSON body"
    assert redirecting.requests == ["GET /primary HTTP/1.1"]
    assert elsewhere.connections == 0


@pytest.mark.parametrize("content_length", [True, False], ids=["with-length", "without-length"])
def test_a_redirect_with_a_huge_body_is_neither_followed_nor_read_past_the_cap(
    real_prober: PatroniProber, member: MakeMember, content_length: bool
) -> None:
    # A client that works out where a redirect goes may read its whole body first
    # (requests' Response.next does, even with allow_redirects=False): the cap must
    # hold for a 3xx too.
    elsewhere = member(fakes.LEADER, name="pg-9")
    behaviour = fakes.redirect(elsewhere.url(), body_bytes=fakes.HUGE_BODY)
    redirecting = member(replace(behaviour, content_length=content_length))

    status, elapsed = timed_probe(real_prober, target(redirecting))

    assert status["pg-0"].verdict is ProbeVerdict.NOT_LEADER
    assert not status["pg-0"].patroni_answer
    assert status["pg-0"].reason == f"body larger than {CAP} bytes"
    assert elapsed < DEADLINE
    assert redirecting.wait_done(5.0)
    (exchange,) = redirecting.exchanges
    assert exchange.bytes_sent <= CAP + 256 * 1024, exchange.bytes_sent
    assert elsewhere.connections == 0


@pytest.mark.parametrize("content_length", [True, False], ids=["with-length", "without-length"])
def test_a_huge_body_is_not_read_past_the_cap(
    real_prober: PatroniProber, member: MakeMember, content_length: bool
) -> None:
    fake = member(fakes.huge(content_length=content_length))

    status, elapsed = timed_probe(real_prober, target(fake))

    assert status["pg-0"].reason == f"body larger than {CAP} bytes"
    assert elapsed < DEADLINE
    assert fake.wait_done(5.0)
    (exchange,) = fake.exchanges
    assert exchange.outcome.startswith("client closed")
    # What the fake got rid of before the prober closed the connection: what the prober
    # read (at most the cap plus one chunk) plus what sat in the kernel's socket
    # buffers (~128 KiB receive, 2 x 32 KiB send on Linux loopback); 50 MB were offered.
    assert exchange.bytes_sent <= CAP + 256 * 1024, exchange.bytes_sent


def test_the_cap_is_the_configured_one(member: MakeMember) -> None:
    prober = PatroniProber(deadline=DEADLINE, max_body_bytes=1024)
    small = member(fakes.LEADER, name="pg-0")  # ~470 bytes
    large = member(fakes.huge(2048, content_length=False), name="pg-1")
    result = prober.probe([target(small, "pg-0"), target(large, "pg-1")])

    assert result["pg-0"].is_leader
    assert result["pg-1"].reason == "body larger than 1024 bytes"


# -------------------------------------------------------- threads, reuse, environment


def test_many_threads_can_probe_at_once(real_prober: PatroniProber, member: MakeMember) -> None:
    members = [
        member(fakes.REPLICA, name="pg-0"),
        member(fakes.LEADER, name="pg-1"),
        member(fakes.REPLICA, name="pg-2"),
    ]
    targets = [target(f, f.name) for f in members]
    barrier = threading.Barrier(8, timeout=5.0)
    results: list[dict[str, MemberStatus]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(real_prober.probe(targets))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5.0)

    assert not errors
    assert len(results) == 8
    for result in results:
        assert [result[f"pg-{i}"].verdict for i in range(3)] == [
            ProbeVerdict.NOT_LEADER,
            ProbeVerdict.LEADER,
            ProbeVerdict.NOT_LEADER,
        ]
    assert sum(f.connections for f in members) == 24


def test_probes_of_one_member_from_many_threads_at_once_log_nothing(
    real_prober: PatroniProber, member: MakeMember, caplog: pytest.LogCaptureFixture
) -> None:
    # 16 request threads of a worker syncing clusters that share a member (or one cluster,
    # in a benchmark): urllib3 would log "Connection pool is full" for every probe past
    # the pool's size, a line per probe at WARNING.
    leader = member(fakes.LEADER)
    barrier = threading.Barrier(16, timeout=5.0)
    results: list[MemberStatus] = []

    def run() -> None:
        barrier.wait()
        for _ in range(3):
            results.append(real_prober.probe([target(leader)])["pg-0"])

    threads = [threading.Thread(target=run, daemon=True) for _ in range(16)]
    with caplog.at_level(logging.DEBUG, logger="urllib3"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10.0)
    assert len(results) == 48 and all(status.is_leader for status in results)
    assert leader.connections == 48
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_probes_with_the_parents_prober(
    real_prober: PatroniProber, member: MakeMember
) -> None:
    # gunicorn forks workers after the app (and its prober) may have been used: nothing
    # the parent's rounds left behind (sockets, threads) may be needed in the child.
    leader = member(fakes.LEADER)
    assert real_prober.probe([target(leader)])["pg-0"].is_leader  # used before the fork
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # the child: report one line, never return into pytest
        code = 1
        try:
            os.close(read_end)
            status = real_prober.probe([target(leader)])["pg-0"]
            os.write(write_end, f"{status.verdict.value}|{status.reason}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 5.0)
        answer = os.read(read_end, 1024).decode() if ready else "(no answer)"
    finally:
        os.close(read_end)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert answer == "leader|HTTP 200 on /primary: primary, running"
    assert leader.connections == 2


def _record_requests(
    listener: socket.socket, answer: bytes, heads: list[bytes], count: int
) -> None:
    """Serve ``count`` connections: keep each request head, send ``answer``, close (bounded)."""
    listener.settimeout(5.0)
    for _ in range(count):
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn, suppress(OSError):
            conn.settimeout(5.0)
            heads.append(read_request_head(conn, limit=65536) or b"")
            conn.sendall(answer)


def test_a_members_cookie_never_travels_to_another_member(
    real_prober: PatroniProber, member: MakeMember
) -> None:
    # The member that sets it and the next one share an address (cookies ignore the port).
    cookie = HEAD + b"Set-Cookie: session=pg-0-secret; Path=/\r\n\r\n" + LEADER_JSON
    setter = member(fakes.raw(cookie), name="pg-0")
    listener = socket.create_server(("127.0.0.1", 0))
    heads: list[bytes] = []
    answer = HEAD + b"\r\n" + LEADER_JSON
    server = threading.Thread(target=_record_requests, args=(listener, answer, heads, 2))
    server.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/primary"
    try:
        # Negative control: a Session's cookie jar takes it along to the other member.
        with requests.Session() as session:
            session.trust_env = False
            session.get(setter.url(), timeout=1.0)
            session.get(url, timeout=1.0)
        first = real_prober.probe([target(setter)])["pg-0"]
        second = real_prober.probe([ProbeTarget("pg-1", url, 0.5, 1.0)])["pg-1"]
    finally:
        server.join(6.0)
        listener.close()
    assert first.is_leader and second.is_leader, (first.reason, second.reason)
    assert len(heads) == 2
    assert b"cookie: session=pg-0-secret" in heads[0].lower()
    assert b"GET /primary" in heads[1] and b"cookie" not in heads[1].lower()


def test_no_targets_no_round(real_prober: PatroniProber) -> None:
    assert real_prober.probe([]) == {}


def test_proxy_settings_in_the_environment_are_ignored(
    real_prober: PatroniProber, member: MakeMember, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = member(fakes.LEADER)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    # Negative control: a client that trusts the environment goes to the dead proxy.
    with pytest.raises(requests.exceptions.ProxyError):
        requests.get(leader.url(), timeout=1.0)
    assert leader.connections == 0

    status = real_prober.probe([target(leader)])["pg-0"]
    assert status.is_leader, status.reason
    assert leader.connections == 1


# ------------------------------------------------- answers that are not Patroni's HTTP


HEAD = b"HTTP/1.0 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11.2\r\n"
LEADER_JSON = json.dumps(patroni_body("primary", name="pg-0")).encode()
NOT_HTTP = "not an HTTP/1.x answer (not Patroni)"

RAW_ANSWERS = [
    # answer, verdict, reason (the reason names what the member sent)
    (HEAD + b"\r\n" + LEADER_JSON, ProbeVerdict.LEADER, "HTTP 200 on /primary: primary, running"),
    (
        HEAD + b"Content-Length: %d\r\n\r\n" % len(LEADER_JSON) + LEADER_JSON + b"trailing junk",
        ProbeVerdict.LEADER,
        "HTTP 200 on /primary: primary, running",
    ),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", ProbeVerdict.UNREACHABLE, NOT_HTTP),
    (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" * 8, ProbeVerdict.UNREACHABLE, NOT_HTTP),
    (b"HTTP/2 200\r\n\r\n{}", ProbeVerdict.UNREACHABLE, NOT_HTTP),
    (
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        ProbeVerdict.NOT_LEADER,
        "HTTP transfer coding (not Patroni)",
    ),
    (
        HEAD + b"Content-Length: 12abc\r\n\r\n{}",
        ProbeVerdict.NOT_LEADER,
        "malformed Content-Length",
    ),
    (
        HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        ProbeVerdict.NOT_LEADER,
        "malformed Content-Length",
    ),
    # http.client reads a line without a colon (and what follows) as the body's start,
    # and an obsolete folded line as part of the header before: either way the body
    # here is not Patroni's.
    (
        HEAD + b"no colon here\r\n\r\n{}",
        ProbeVerdict.NOT_LEADER,
        "HTTP 200 on /primary without Patroni JSON",
    ),
    (
        HEAD + b" folded: line\r\n\r\n{}",
        ProbeVerdict.NOT_LEADER,
        "HTTP 200 on /primary without Patroni JSON",
    ),
    (
        HEAD + b"Content-Le",
        ProbeVerdict.NOT_LEADER,
        "HTTP 200 on /primary with a non-JSON body",
    ),
    (b"", ProbeVerdict.UNREACHABLE, "connection reset"),
    (
        HEAD + b"Content-Length: 100\r\n\r\n" + b'{"state": ',
        ProbeVerdict.UNREACHABLE,
        "connection broken mid-body",
    ),
    (
        HEAD + b"Content-Length: %d\r\n\r\n" % (CAP + 1),
        ProbeVerdict.NOT_LEADER,
        f"body larger than {CAP} bytes",
    ),
    # More digits than CPython converts to an int (4,300): no exception, the same reason.
    (
        HEAD + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}",
        ProbeVerdict.NOT_LEADER,
        f"body larger than {CAP} bytes",
    ),
]


@pytest.mark.parametrize(
    ("answer", "verdict", "reason"),
    RAW_ANSWERS,
    ids=[
        "no-length",
        "length-then-junk",
        "ssh",
        "tls-hello",
        "http2",
        "chunked",
        "bad-length",
        "two-lengths",
        "header-without-colon",
        "folded-header",
        "closed-in-head",
        "closed-at-once",
        "closed-mid-body",
        "declared-too-large",
        "content-length-of-5000-digits",
    ],
)
def test_an_answer_that_is_not_patronis_gets_a_reason_naming_what_it_sent(
    real_prober: PatroniProber,
    member: MakeMember,
    answer: bytes,
    verdict: ProbeVerdict,
    reason: str,
) -> None:
    status = real_prober.probe([target(member(fakes.raw(answer)))])["pg-0"]
    assert (status.verdict, status.reason) == (verdict, reason)
    assert status.patroni_answer is (verdict is ProbeVerdict.LEADER)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (HEAD + b"X-Pad: " + b"x" * 200_000, "HTTP head line too long (not Patroni)"),
        (
            HEAD + b"".join(b"X-%d: y\r\n" % i for i in range(5000)),
            "malformed HTTP head (not Patroni)",
        ),
    ],
    ids=["one-endless-line", "endless-header-lines"],
)
def test_a_huge_header_block_costs_at_most_a_bounded_read(
    real_prober: PatroniProber, member: MakeMember, answer: bytes, reason: str
) -> None:
    # The member keeps the connection open after its endless head: the probe must give up
    # on the head's size (http.client: 64 KiB a line, 100 header lines), not the deadline.
    fake = member(fakes.raw(answer, hold=True))
    result, elapsed = timed_probe(real_prober, target(fake))
    assert (result["pg-0"].verdict, result["pg-0"].reason) == (ProbeVerdict.UNREACHABLE, reason)
    assert elapsed < DEADLINE


def test_a_content_length_ends_the_read_without_waiting_for_the_close(
    real_prober: PatroniProber, member: MakeMember
) -> None:
    answer = HEAD + b"Content-Length: %d\r\n\r\n" % len(LEADER_JSON) + LEADER_JSON
    holding = member(fakes.raw(answer, hold=True))
    result, elapsed = timed_probe(real_prober, target(holding, read=1.0))
    assert result["pg-0"].is_leader
    assert elapsed < 0.5, f"waited {elapsed:.3f} s for a close the answer did not need"


def test_an_ipv6_member_is_probed_over_ipv6(real_prober: PatroniProber, member: MakeMember) -> None:
    status = real_prober.probe([target(member(fakes.LEADER, host="::1"))])["pg-0"]
    assert status.is_leader, status.reason


def test_a_round_that_fails_inside_says_so_for_every_member(
    real_prober: PatroniProber, member: MakeMember, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing in a round may raise into the sync (the reply would be a 500 with no
    # reason): the whole round's failure becomes each member's short, stable reason.
    leader = member(fakes.LEADER)

    def out_of_files(*args: object, **kwargs: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr("hooks.patroni.ThreadPoolExecutor", out_of_files)
    status = real_prober.probe([target(leader)])["pg-0"]
    assert (status.verdict, status.reason) == (ProbeVerdict.UNREACHABLE, "connection failed")


def test_no_socket_outlives_its_round(member: MakeMember) -> None:
    # Every way a probe can end (answer, refusal, reset, cap, timeout, deadline) must
    # close its socket: a leak of one descriptor per failed probe would exhaust a worker's
    # limit within hours at one resync per second.
    prober = PatroniProber(deadline=0.3, max_body_bytes=CAP)
    behaviours = [
        fakes.LEADER,
        fakes.REPLICA,
        fakes.REFUSED,
        fakes.HUNG,
        fakes.DRIP,
        fakes.RESET_MID_BODY,
        fakes.GARBAGE,
        fakes.huge(content_length=False),
    ]
    started = [member(b, name=f"pg-{i}") for i, b in enumerate(behaviours)]
    targets = [target(f, f.name, read=0.2) for f in started]

    def settle() -> int:
        # The fakes serve from this process: count once each has closed its side.
        for fake in started:
            fake.release()
            assert fake.wait_done(5.0)
        return len(os.listdir("/proc/self/fd"))

    prober.probe(targets)  # the first round may open lazily created descriptors
    before = settle()
    for _ in range(3):
        result = prober.probe(targets)
        assert result["pg-0"].is_leader
    assert settle() == before


def test_a_member_that_never_completes_the_tls_handshake_costs_the_connect_timeout(
    real_prober: PatroniProber, member: MakeMember
) -> None:
    # TCP is accepted, the ClientHello is never answered: the handshake is part of the
    # connect, so the target's connect timeout ends it, not the (longer) read timeout.
    silent = member(fakes.HUNG)
    https = ProbeTarget(
        pod="pg-0",
        url=silent.url().replace("http://", "https://"),
        connect_timeout=0.2,
        read_timeout=1.0,
    )
    result, elapsed = timed_probe(real_prober, https)
    assert result["pg-0"].reason == "connect timeout"
    assert 0.2 <= elapsed <= 0.2 + SLACK, f"round took {elapsed:.3f} s"


def test_a_round_of_many_hung_members_cannot_starve_another_rounds_probes(
    member: MakeMember,
) -> None:
    """Fairness between tenants: rounds of 20 members that accept and never answer (a
    noisy namespace, three syncs in flight at all times) run beside a quiet three-member
    cluster whose leader is not its first member. Each round may hold ``round_threads``
    pool threads at most, so the pool (four rounds' worth) always has threads for the
    quiet round: its members are asked at once and answer. Without the bound the noisy
    rounds queued their probes ahead of the quiet one's, which waited for a noisy
    deadline or were cut at their own and reported unreachable."""
    prober = PatroniProber(deadline=DEADLINE, threads=16, round_threads=4)
    hung = member(fakes.HUNG)
    noisy = [target(hung, f"noisy-{i:02}", read=5.0) for i in range(20)]
    quiet = [
        target(member(fakes.REPLICA, name="q-0"), "q-0"),
        target(member(fakes.LEADER, name="q-1"), "q-1"),
        target(member(fakes.REPLICA, name="q-2"), "q-2"),
    ]
    stop = threading.Event()
    noisy_results: list[dict[str, MemberStatus]] = []

    def noise(delay: float) -> None:
        time.sleep(delay)
        for _ in range(8):  # bounded: 8 deadlines at most
            if stop.is_set():
                return
            noisy_results.append(prober.probe(noisy))

    rounds = [threading.Thread(target=noise, args=(i * DEADLINE / 3,)) for i in range(3)]
    for thread in rounds:
        thread.start()
    time.sleep(DEADLINE)  # the noisy rounds hold their threads now, staggered
    quiet_rounds = []
    for _ in range(3):
        quiet_rounds.append(timed_probe(prober, *quiet))
        time.sleep(DEADLINE / 4)
    stop.set()
    for thread in rounds:
        thread.join(timeout=10 * DEADLINE)
    prober.close()
    for result, elapsed in quiet_rounds:
        assert result["q-1"].is_leader, result["q-1"].reason
        assert result["q-2"].verdict is ProbeVerdict.NOT_LEADER, result["q-2"].reason
        assert elapsed < DEADLINE / 2, f"the quiet round waited {elapsed:.3f} s"
    assert noisy_results
    for answers in noisy_results:
        assert {s.reason for s in answers.values()} == {LATE}
