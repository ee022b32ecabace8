"""The one model of a fake Patroni member (``testbed/fakes/patroni_model.py``) and its two players.

Test design: an answer is written once, in the model; the threaded fakes of the tests
(``testbed/fakes/patroni.py``) and the asyncio fleet of the benchmarks
(``testbed/fakes/patroni_fast.py``) only play it. So the same behaviour asked on the same path
must put the same bytes on the wire from both (a reset the same prefix, then RST), and the
model's status codes by path must be the ones real Patroni 4.1 answers: the last test asks a
real cluster (``tests/patroni_fixtures.py``, under the heavy lock) on every path the model
knows, for the leader and for a replica, and checks each status against the model's.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import pytest

from testbed.certs import TestCA
from testbed.fakes import patroni as fakes
from testbed.fakes import patroni_model as model
from testbed.fakes.patroni import FakeMember
from testbed.fakes.patroni_async import TLSFiles
from testbed.fakes.patroni_fast import FakeMembers, fake_members
from testbed.patroni import PatroniCluster

#: The behaviours both servers play, each a member of one fast process (127.0.0.40 and up).
PLAYED = {
    "leader": model.LEADER,
    "replica": model.REPLICA,
    "master-v3": model.MASTER_V3,
    "promoting": model.PROMOTING,
    "stopping": model.STOPPING,
    "garbage": model.GARBAGE,
    "not-patroni": model.NOT_PATRONI,
    "recorded": model.recorded(503, '{"state": "starting"}'),
    "raw": model.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"),
    "redirect": model.redirect("http://127.0.0.1:9/primary"),
    "redirect-body": model.redirect("http://127.0.0.1:9/primary", body_bytes=70_000),
    "huge-length": model.huge(100_000, content_length=True),
    "huge-no-length": model.huge(100_000, content_length=False),
    "slow-replica": model.slow(0.2, model.REPLICA),
}
#: Every path whose answer the model chooses (Patroni's ``do_GET`` and its own handlers).
PATHS = (
    "/", "/primary", "/master", "/read-write", "/leader", "/standby-leader", "/replica",
    "/read-only", "/health", "/async", "/sync", "/read-only-sync", "/patroni", "/readiness",
    "/liveness", "/nonsense",
)  # fmt: skip


def fetch(host: str, port: int, path: str, *, pause: float = 0.0) -> tuple[bytes, str]:
    """Everything the member sends to one GET, and how the connection ended."""
    with socket.create_connection((host, port), timeout=5.0) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        time.sleep(pause)  # a reset must come after the bytes are in our receive queue
        data = b""
        ends_at = time.monotonic() + 10.0
        while time.monotonic() < ends_at:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                return data, "reset"
            if not chunk:
                return data, "closed"
            data += chunk
    raise AssertionError(f"{host}:{port}{path} still sending after 10 s")


@pytest.fixture(scope="module")
def fast() -> Iterator[FakeMembers]:
    behaviours = [*PLAYED.values(), model.RESET_MID_BODY]
    with fake_members(behaviours, names=["pg-0"] * len(behaviours), max_hold=10.0) as members:
        yield members


@pytest.mark.parametrize("path", ["/primary", "/replica", "/patroni", "/readiness"])
@pytest.mark.parametrize("behaviour", PLAYED.values(), ids=PLAYED.keys())
def test_both_servers_put_the_same_bytes_on_the_wire(
    fast: FakeMembers, behaviour: model.Behaviour, path: str
) -> None:
    host = fast.hosts[list(PLAYED.values()).index(behaviour)]
    with FakeMember(behaviour, name="pg-0") as threaded:
        expected = fetch(threaded.host, threaded.port, path)
    assert fetch(host, fast.port, path) == expected
    assert expected[1] == "closed" and expected[0]


def test_both_servers_reset_mid_body_after_the_same_bytes(fast: FakeMembers) -> None:
    with FakeMember(fakes.RESET_MID_BODY, name="pg-0") as threaded:
        expected = fetch(threaded.host, threaded.port, "/primary", pause=0.3)
    assert fetch(fast.hosts[-1], fast.port, "/primary", pause=0.3) == expected
    head, body = expected[0].split(b"\r\n\r\n", 1)
    assert expected[1] == "reset" and head.startswith(b"HTTP/1.0 200 OK")
    assert 0 < len(body) < len(json.dumps(model.document(model.Kind.LEADER, model.Identity())))


def fetch_tls(host: str, port: int, client: ssl.SSLContext) -> bytes | str:
    """What a member sends over HTTPS to one GET, or ``"refused"`` (a TLS alert, a reset)."""
    try:
        with (
            socket.create_connection((host, port), timeout=5.0) as raw,
            client.wrap_socket(raw, server_hostname=host) as conn,
        ):
            conn.sendall(b"GET /primary HTTP/1.1\r\n\r\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            return data
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return "refused"


def test_both_servers_serve_https_alike_and_refuse_a_client_without_a_certificate(
    tmp_path: Path,
) -> None:
    ca = TestCA(tmp_path, "fakes")
    pair = ca.issue("member", ips=("127.0.0.1", "127.0.0.40"))
    mine = ca.issue("prober", client=True, server=False)
    with_cert = ssl.create_default_context(cafile=str(ca.cert_file))
    with_cert.load_cert_chain(mine.cert, mine.key)
    without = ssl.create_default_context(cafile=str(ca.cert_file))
    tls = TLSFiles(str(pair.cert), str(pair.key), str(ca.cert_file))
    threaded = FakeMember(fakes.LEADER, name="pg-0", tls=tls.server_context())
    with threaded, fake_members([model.LEADER], names=["pg-0"], tls=tls) as fast:
        expected = fetch_tls(threaded.host, threaded.port, with_cert)
        assert isinstance(expected, bytes) and expected.startswith(b"HTTP/1.0 200 OK")
        assert fetch_tls(fast.hosts[0], fast.port, with_cert) == expected
        # TLS 1.3: the refusal comes at the read, as an alert (threads, like Patroni's
        # server) or as the connection closed (asyncio): either way, no answer at all.
        for host, port in ((threaded.host, threaded.port), (fast.hosts[0], fast.port)):
            assert fetch_tls(host, port, without) in ("refused", b""), host
        assert threaded.handshakes == 1


def test_a_leader_answers_200_and_a_replica_503_on_every_leader_path_the_hook_accepts() -> None:
    from hooks.domain.model import LEADER_PATHS  # the hook's list: a path it may probe

    leader = model.document(model.Kind.LEADER, model.Identity())
    replica = model.document(model.Kind.REPLICA, model.Identity())
    for path, roles in LEADER_PATHS.items():
        expected = 200 if "primary" in roles else 503  # no standby cluster here
        assert model.status_code(path, leader, holds_lock=True) == expected, path
        assert model.status_code(path, replica, holds_lock=False) == 503, path


def test_a_status_only_path_answers_a_status_line_and_nothing_else() -> None:
    (send,) = model.reply(model.REPLICA, model.Identity(), "GET /readiness HTTP/1.1").steps
    assert send == model.Send(b"HTTP/1.0 200 OK\r\n\r\n")
    (send,) = model.reply(model.REPLICA, model.Identity(), "GET /liveness/x HTTP/1.1").steps
    assert send == model.Send(b"HTTP/1.0 200 OK\r\n\r\n")


def test_the_models_status_codes_are_real_patronis(
    healthy_patroni_cluster: PatroniCluster,
) -> None:
    cluster = healthy_patroni_cluster
    leader = cluster.wait_healthy()
    asked = 0
    for name in cluster.names():
        member = cluster.member(name)
        document = json.loads(member.api_get("/patroni", 2.0).body)
        for path in PATHS:
            wire, ending = fetch(member.ip, member.api_port, path)
            status = int(wire.split(b" ", 2)[1])
            expected = model.status_code(path, document, holds_lock=name == leader)
            assert (status, ending) == (expected, "closed"), f"{name} {path}: {wire[:200]!r}"
            if model.handler(path) in ("readiness", "liveness"):
                line = f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\n\r\n"
                assert wire == line.encode(), (name, path)
            asked += 1
    assert asked == len(PATHS) * len(cluster.names())
