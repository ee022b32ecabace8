"""The real :class:`PatroniProber` against loopback HTTPS members (no Patroni needed).

Design notes: each member is a small threaded TLS server in this process (``TLSMember``)
with a certificate made for the test (``testbed/certs.py``) that answers one GET with
Patroni's leader document and closes, as Patroni does. What a real Patroni does with TLS
(``verify_client: required``, serverName) is ``tests/test_patroni_tls.py``'s, under the
cluster lock; this module covers what needs many members, IPv6, or files that change:
descriptors after TLS rounds, a 64-member round within the deadline, an IP SAN that is not
the member's, a missing CA file, a rotated CA bundle, and the one SSLContext per set of files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hooks.domain.members import ProbeTarget, ProbeVerdict
from hooks.patroni import PatroniProber
from hooks.probe.policy import ProbePolicy, parse_networks, parse_ports
from hooks.probe.tls import PatroniTLS
from hooks.shell.config import HookSettings
from testbed.certs import Pair, TestCA
from testbed.fakes.patroni_wire import patroni_body, read_request_head, response_head

LEADER_REASON = "HTTP 200 on /primary: primary, running"
UNTRUSTED = "TLS: certificate not signed by a trusted CA (PGFH_PATRONI_CA_FILE)"
HANDSHAKE_ENDED = "TLS: the member ended the handshake (client certificate refused or missing?)"
#: Upper bound on how long a test's server lives (a broken test must not hang the suite).
MAX_LIFETIME = 60.0


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # a 64-member round connects all at once
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A refused handshake is what some tests want: not an error to print."""


class TLSMember:
    """An HTTPS member on ``host`` answering Patroni's leader document."""

    def __init__(
        self,
        host: str,
        pair: Pair,
        *,
        client_ca: Path | None = None,
        name: str = "pg-0",
    ) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pair.cert, pair.key)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(client_ca)
        body = json.dumps(patroni_body("primary", name=name)).encode()
        answer = response_head(200) + body
        self.handshakes = 0
        lock = threading.Lock()
        member = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                raw: socket.socket = self.request
                raw.settimeout(2.0)
                with context.wrap_socket(raw, server_side=True) as conn:
                    with lock:
                        member.handshakes += 1
                    if read_request_head(conn) is not None:
                        conn.sendall(answer)

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (_Server,), {"address_family": family})
        self.server = server_class((host, 0), Handler)
        self.host = host
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        timer = threading.Timer(MAX_LIFETIME, self.server.shutdown)
        timer.daemon = True
        timer.start()
        try:
            self.server.serve_forever(poll_interval=0.05)
        finally:
            timer.cancel()

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}/primary"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5.0)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("probe-pki"), "probe")


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("other-pki"), "other")


@pytest.fixture
def tls_member() -> Iterator[Callable[..., TLSMember]]:
    started: list[TLSMember] = []

    def make(host: str, pair: Pair, **kwargs: Any) -> TLSMember:
        member = TLSMember(host, pair, **kwargs)
        started.append(member)
        return member

    yield make
    for member in started:
        member.close()


def https_target(
    member: TLSMember, pod: str = "pg-0", *, server_name: str | None = None
) -> ProbeTarget:
    return ProbeTarget(pod, member.url(), 0.5, 1.0, server_name=server_name)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_tls_rounds_leave_no_descriptor_behind(
    ca: TestCA, other_ca: TestCA, tls_member: Callable[..., TLSMember]
) -> None:
    good = tls_member("127.0.0.1", ca.issue("fd-good", ips=("127.0.0.1",)))
    foreign = tls_member("127.0.0.1", other_ca.issue("fd-foreign", ips=("127.0.0.1",)))
    prober = PatroniProber(deadline=1.0, tls=PatroniTLS(str(ca.cert_file)))
    targets = [https_target(good, "pg-0"), https_target(foreign, "pg-1")]

    def round_() -> None:
        result = prober.probe(targets)
        assert result["pg-0"].reason == LEADER_REASON
        assert result["pg-1"].reason == UNTRUSTED

    round_()  # the first round may open lazily created descriptors (threads, pools)
    time.sleep(0.1)  # the servers' handler threads close their side
    before = open_descriptors()
    for _ in range(10):
        round_()
    time.sleep(0.1)
    assert open_descriptors() == before
    prober.close()


def test_an_ipv6_member_is_probed_over_tls(
    ca: TestCA, tls_member: Callable[..., TLSMember]
) -> None:
    member = tls_member("::1", ca.issue("v6", ips=("::1",)))
    prober = PatroniProber(deadline=1.0, tls=PatroniTLS(str(ca.cert_file)))
    status = prober.probe([https_target(member)])["pg-0"]
    assert (status.verdict, status.reason) == (ProbeVerdict.LEADER, LEADER_REASON)


def test_a_certificate_for_another_ip_does_not_name_the_pod_ip(
    ca: TestCA, tls_member: Callable[..., TLSMember]
) -> None:
    member = tls_member("127.0.0.1", ca.issue("wrong-ip", ips=("127.0.0.9",), dns=("pg-0",)))
    prober = PatroniProber(deadline=1.0, tls=PatroniTLS(str(ca.cert_file)))
    first = prober.probe([https_target(member)])["pg-0"]
    second = prober.probe([https_target(member)])["pg-0"]
    assert first == second
    assert (first.verdict, first.reason) == (
        ProbeVerdict.UNREACHABLE,
        "TLS: certificate does not name the pod IP",
    )
    # The same certificate is right when the spec names what it does (serverName).
    named = prober.probe([https_target(member, server_name="pg-0")])["pg-0"]
    assert named.reason == LEADER_REASON


def test_a_64_member_tls_round_ends_within_the_deadline_with_every_answer(
    ca: TestCA, tls_member: Callable[..., TLSMember]
) -> None:
    member = tls_member("127.0.0.1", ca.issue("many", ips=("127.0.0.1",)))
    deadline = 2.0
    prober = PatroniProber(deadline=deadline, tls=PatroniTLS(str(ca.cert_file)))
    targets = [https_target(member, f"pg-{i}") for i in range(64)]
    started = time.monotonic()
    result = prober.probe(targets)
    elapsed = time.monotonic() - started
    reasons = {status.reason for status in result.values()}
    assert reasons == {LEADER_REASON}, reasons
    assert elapsed < deadline, f"64 TLS members took {elapsed:.3f} s"
    assert member.handshakes == 64


def test_mutual_tls_with_the_client_certificate_and_without(
    ca: TestCA, tls_member: Callable[..., TLSMember]
) -> None:
    member = tls_member("127.0.0.1", ca.issue("mtls", ips=("127.0.0.1",)), client_ca=ca.cert_file)
    hook = ca.issue("mtls-hook", client=True, server=False)
    with_cert = PatroniProber(
        deadline=1.0, tls=PatroniTLS(str(ca.cert_file), str(hook.cert), str(hook.key))
    )
    without = PatroniProber(deadline=1.0, tls=PatroniTLS(str(ca.cert_file)))
    assert with_cert.probe([https_target(member)])["pg-0"].reason == LEADER_REASON
    assert without.probe([https_target(member)])["pg-0"].reason == HANDSHAKE_ENDED


def test_one_context_per_set_of_files_until_a_file_changes(
    ca: TestCA, other_ca: TestCA, tls_member: Callable[..., TLSMember], tmp_path: Path
) -> None:
    member = tls_member("127.0.0.1", ca.issue("rotated", ips=("127.0.0.1",)))
    bundle = tmp_path / "ca.crt"
    shutil.copy(other_ca.cert_file, bundle)  # the old CA: the member is not trusted
    prober = PatroniProber(deadline=1.0, tls=PatroniTLS(str(bundle)))

    assert prober.probe([https_target(member)])["pg-0"].reason == UNTRUSTED
    context = prober.contexts.context()
    assert prober.contexts.context() is context  # nothing changed: the same context

    # A Secret volume's update: new files in a new directory, the symlink swapped.
    fresh = tmp_path / "fresh.crt"
    shutil.copy(ca.cert_file, fresh)
    os.replace(fresh, bundle)
    status = prober.probe([https_target(member)])["pg-0"]
    assert status.reason == LEADER_REASON  # no restart, no new prober
    assert prober.contexts.context() is not context


def test_a_missing_ca_file_is_named_in_the_reason_and_logged_once(
    ca: TestCA,
    tls_member: Callable[..., TLSMember],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    member = tls_member("127.0.0.1", ca.issue("no-ca", ips=("127.0.0.1",)))
    missing = str(tmp_path / "not-mounted" / "ca.crt")
    settings = HookSettings(
        patroni_tls=PatroniTLS(missing),
        probe_policy=ProbePolicy(
            allowed_ports=parse_ports("1024-65535"),
            allowed_networks=parse_networks("127.0.0.0/8"),
        ),
    )
    with caplog.at_level(logging.INFO, logger="hooks.patroni"):
        prober = PatroniProber.from_settings(settings)
        statuses = [prober.probe([https_target(member)])["pg-0"] for _ in range(3)]
    reason = f"TLS: cannot read PGFH_PATRONI_CA_FILE {missing} (No such file or directory)"
    assert {(s.verdict, s.reason) for s in statuses} == {(ProbeVerdict.UNREACHABLE, reason)}
    logged = [r.getMessage() for r in caplog.records if r.name == "hooks.patroni"]
    assert logged == [f"https members cannot be probed: {reason}"]
    assert member.handshakes == 0  # nothing was sent without the CA


def test_tls_files_that_are_fine_are_not_logged(
    ca: TestCA, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="hooks.patroni"):
        PatroniProber.from_settings(HookSettings(patroni_tls=PatroniTLS(str(ca.cert_file))))
    assert [r for r in caplog.records if r.name == "hooks.patroni"] == []


def test_a_ca_file_that_holds_no_certificate_is_named(
    tmp_path: Path, ca: TestCA, tls_member: Callable[..., TLSMember]
) -> None:
    member = tls_member("127.0.0.1", ca.issue("junk-ca", ips=("127.0.0.1",)))
    junk = tmp_path / "ca.crt"
    junk.write_text("not a certificate\n")
    prober = PatroniProber(deadline=1.0, tls=PatroniTLS(str(junk)))
    status = prober.probe([https_target(member)])["pg-0"]
    assert (
        status.reason == f"TLS: no CA certificate could be loaded from PGFH_PATRONI_CA_FILE {junk}"
    )
