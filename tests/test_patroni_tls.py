"""Probing a REAL Patroni whose REST API requires TLS and a client certificate.

Test design notes:

* One single-member Patroni cluster (PostgreSQL + etcd from wheels) with
  ``restapi.certfile/keyfile/cafile`` and ``verify_client: required``, on its own
  addresses (member 127.0.0.6, etcd 127.0.0.5) so it can run next to the session's
  3-member cluster on 127.0.0.2-4. Certificates are made for the test with
  ``cryptography``: the member's names its IP and a DNS name, and the members and the
  harness present a client certificate of the same CA, as Patroni requires.
* The real :class:`PatroniProber` then asks it with each wrong piece of TLS material in
  turn: every failure must be an unreachable member with a short reason that says which
  setting to fix, the *same* reason on the next probe (it ends up in a status condition),
  and the right material must find the leader.
* Finally the whole app (real prober, spec ``scheme: https``) routes to it.

Like every test that starts a real cluster, run it under the machine-wide lock:
``flock -w 1200 /tmp/pgfh-cluster.lock .venv/bin/python -m pytest tests/test_patroni_tls.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from hooks.domain.members import MemberStatus, ProbeTarget, ProbeVerdict
from hooks.patroni import PatroniProber
from hooks.probe.policy import ProbePolicy, parse_networks
from hooks.probe.tls import PatroniTLS
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.certs import Pair, TestCA
from testbed.patroni import PatroniCluster, RestApiTLS
from tests.helpers import NO_AUTH, NOW, make_pod, make_service, seed_spec, sync_body

pytestmark = [pytest.mark.patroni, pytest.mark.slow]

MEMBER_IP = "127.0.0.6"
MEMBER = "pg-tls-0"
SERVER_NAME = "pg-tls.databases.svc"
UNTRUSTED = "TLS: certificate not signed by a trusted CA (PGFH_PATRONI_CA_FILE)"
HANDSHAKE_ENDED = "TLS: the member ended the handshake (client certificate refused or missing?)"


@dataclass(frozen=True)
class PKI:
    ca: TestCA
    other_ca: TestCA
    member: Pair
    patroni_client: Pair
    hook: Pair
    rogue_hook: Pair


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("patroni-pki")
    ca = TestCA(directory, "patroni")
    other = TestCA(directory, "other")
    return PKI(
        ca=ca,
        other_ca=other,
        member=ca.issue("pg-tls-member", ips=(MEMBER_IP,), dns=(SERVER_NAME,)),
        patroni_client=ca.issue("patroni-ctl", client=True, server=False),
        hook=ca.issue("pg-failover-hook", client=True, server=False),
        rogue_hook=other.issue("pg-failover-hook-rogue", client=True, server=False),
    )


@pytest.fixture(scope="module")
def tls_cluster(pki: PKI, request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    cluster = PatroniCluster(
        members=1,
        scope="pg-tls",
        first_ip=6,
        etcd_host="127.0.0.5",
        restapi_tls=RestApiTLS(
            certfile=pki.member.cert,
            keyfile=pki.member.key,
            cafile=pki.ca.cert_file,
            client_certfile=pki.patroni_client.cert,
            client_keyfile=pki.patroni_client.key,
            verify_client="required",
        ),
    )
    cluster.start(timeout=90)
    try:
        assert cluster.members[0].ip == MEMBER_IP
        yield cluster
    finally:
        cluster.stop(keep_logs=request.session.testsfailed > 0)


def probe_twice(
    tls: PatroniTLS, *, scheme: str = "https", server_name: str | None = None
) -> MemberStatus:
    """Probe the member twice with ``tls``; the answers must be identical."""
    prober = PatroniProber(deadline=2.0, tls=tls)
    target = ProbeTarget(
        MEMBER, f"{scheme}://{MEMBER_IP}:8008/primary", 0.5, 1.0, server_name=server_name
    )
    first = prober.probe([target])[MEMBER]
    second = prober.probe([target])[MEMBER]
    assert first == second, "the reason must not change from probe to probe"
    return first


def right(pki: PKI) -> PatroniTLS:
    return PatroniTLS(str(pki.ca.cert_file), str(pki.hook.cert), str(pki.hook.key))


def test_the_member_really_requires_tls_and_a_client_certificate(
    tls_cluster: PatroniCluster, pki: PKI
) -> None:
    config = tls_cluster.patroni_config(tls_cluster.members[0])
    assert config["restapi"]["verify_client"] == "required"
    assert tls_cluster.leader() == MEMBER  # the harness itself got in, over HTTPS


def test_the_right_ca_and_client_certificate_find_the_leader(
    tls_cluster: PatroniCluster, pki: PKI
) -> None:
    status = probe_twice(right(pki))
    assert status.verdict is ProbeVerdict.LEADER, status.reason
    assert (status.role, status.patroni_name) == ("primary", MEMBER)


def test_the_right_server_name_finds_the_leader(tls_cluster: PatroniCluster, pki: PKI) -> None:
    status = probe_twice(right(pki), server_name=SERVER_NAME)
    assert status.verdict is ProbeVerdict.LEADER, status.reason


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("wrong server name", "TLS: certificate does not name serverName pg-other.databases.svc"),
        ("wrong CA", UNTRUSTED),
        ("no CA (system roots)", UNTRUSTED),
        ("no client certificate", HANDSHAKE_ENDED),
        ("client certificate of another CA", HANDSHAKE_ENDED),
    ],
)
def test_wrong_tls_material_is_an_unreachable_member_with_a_clear_stable_reason(
    tls_cluster: PatroniCluster, pki: PKI, case: str, reason: str
) -> None:
    good = right(pki)
    server_name = None
    if case == "wrong server name":
        tls, server_name = good, "pg-other.databases.svc"
    elif case == "wrong CA":
        tls = PatroniTLS(str(pki.other_ca.cert_file), good.client_cert_file, good.client_key_file)
    elif case == "no CA (system roots)":
        tls = PatroniTLS(None, good.client_cert_file, good.client_key_file)
    elif case == "no client certificate":
        tls = PatroniTLS(good.ca_file)
    else:
        tls = PatroniTLS(good.ca_file, str(pki.rogue_hook.cert), str(pki.rogue_hook.key))
    status = probe_twice(tls, server_name=server_name)
    assert status.verdict is ProbeVerdict.UNREACHABLE
    assert status.reason == reason
    assert not status.claims_leadership


def test_plain_http_on_the_tls_port_is_unreachable(tls_cluster: PatroniCluster, pki: PKI) -> None:
    status = probe_twice(right(pki), scheme="http")
    assert status.verdict is ProbeVerdict.UNREACHABLE
    assert status.reason in ("connection reset", "connection broken mid-body", "connection failed")


def _sync(settings: HookSettings, spec_patroni: dict[str, Any]) -> dict[str, Any]:
    app = create_app(settings=settings, clock=lambda: NOW)
    body = sync_body(
        spec=seed_spec(patroni=spec_patroni, primarySelector={"application": "patroni"}),
        pods=[make_pod(MEMBER, MEMBER_IP, labels={"application": "patroni"})],
        services=[make_service(pod=None)],
    )
    body["related"]["Pod.v1"][MEMBER]["metadata"]["labels"][
        "statefulset.kubernetes.io/pod-name"
    ] = MEMBER
    response = app.test_client().post(
        "/sync", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    reply: dict[str, Any] = response.get_json()
    return reply


def _ready(reply: dict[str, Any]) -> dict[str, Any]:
    (ready,) = [c for c in reply["status"]["conditions"] if c["type"] == "Ready"]
    return ready


def test_the_hook_routes_to_an_https_member_with_its_configured_tls(
    tls_cluster: PatroniCluster, pki: PKI
) -> None:
    settings = HookSettings(
        auth=NO_AUTH,
        probe_policy=ProbePolicy(allowed_networks=parse_networks("127.0.0.0/8")),
        patroni_tls=right(pki),
    )
    reply = _sync(settings, {"scheme": "https", "tls": {"serverName": SERVER_NAME}})
    assert _ready(reply)["reason"] == "LeaderFound", _ready(reply)["message"]
    (service,) = reply["children"]
    assert service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == MEMBER
    assert reply["status"]["primary"] == MEMBER

    # Without the client certificate: no leader, the Service as it was, and why.
    settings = HookSettings(
        auth=NO_AUTH,
        probe_policy=settings.probe_policy,
        patroni_tls=PatroniTLS(str(pki.ca.cert_file)),
    )
    reply = _sync(settings, {"scheme": "https"})
    ready = _ready(reply)
    assert ready["reason"] == "NoLeader"
    assert HANDSHAKE_ENDED in ready["message"]
    (service,) = reply["children"]
    assert "statefulset.kubernetes.io/pod-name" not in service["spec"]["selector"]
