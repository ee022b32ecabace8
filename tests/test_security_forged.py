"""Security: forged requests against a real listener.

The test design notes are those of tests/test_security_requests.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from flask.testing import FlaskClient

from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.domain.model import ResyncTiming
from hooks.loaders.envelope import load_sync_request
from hooks.patroni import PatroniProber
from hooks.probe.policy import ProbePolicy, parse_networks
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.fakes import patroni as fakes
from testbed.fakes.patroni import FakeMember
from tests.helpers import (
    CLUSTER,
    NO_AUTH,
    NOW,
    FakeProber,
    make_pod,
    make_service,
    seed_spec,
    service_selector,
    sync_body,
)
from tests.security_cases import (
    LOOPBACK,
)

# ------------------------------------------- forged requests against a real listener
# Each forged request tries to aim a probe at a loopback listener (a fake Patroni leader
# that records every connection). The hook must refuse, say why, keep the Service, and
# the listener must see no connection at all. A positive control proves the listener
# would have been reached if the policy allowed it.

SERVICE = "pg-orders-primary"


@pytest.fixture
def listener() -> Iterator[FakeMember]:
    fake = FakeMember(fakes.LEADER, host="127.0.0.1", name=f"{CLUSTER}-0")
    yield fake
    fake.close()


def real_hook(policy: ProbePolicy) -> FlaskClient:
    prober = PatroniProber(deadline=1.0, policy=policy)
    app = create_app(
        settings=HookSettings(probe_deadline=1.0, probe_policy=policy, auth=NO_AUTH),
        prober=prober,
        clock=lambda: NOW,
    )
    app.config["TESTING"] = True
    return app.test_client()


def forged(pod_ip: object, port: int, **spec: Any) -> dict[str, Any]:
    """One member whose podIP (and the spec's port) is what the attacker chose."""
    return sync_body(
        spec=seed_spec(patroni={"port": port}, **spec),
        pods=[make_pod(f"{CLUSTER}-0", pod_ip)],
        services=[make_service(pod=f"{CLUSTER}-0")],
    )


def post(client: FlaskClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/sync", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.get_data(as_text=True)
    reply: dict[str, Any] = response.get_json()
    services = [c for c in reply["children"] if c["kind"] == "Service"]
    assert [s["metadata"]["name"] for s in services] == [SERVICE], "the Service is kept"
    return reply


def conditions(reply: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in reply["status"]["conditions"]}


def ports_and_loopback(port: int) -> ProbePolicy:
    return ProbePolicy(allowed_ports=frozenset({port}), allowed_networks=LOOPBACK)


def test_positive_control_an_allowed_listener_is_probed(listener: FakeMember) -> None:
    reply = post(real_hook(ports_and_loopback(listener.port)), forged("127.0.0.1", listener.port))
    assert conditions(reply)["Ready"]["reason"] == "LeaderFound"
    assert listener.requests == ["GET /primary HTTP/1.1"]


@pytest.mark.parametrize(
    ("pod_ip", "policy_of", "says"),
    [
        pytest.param(
            "127.0.0.1",
            lambda port: ProbePolicy(allowed_ports=frozenset({port})),
            "127.0.0.1 is a loopback address: not probed",
            id="loopback-not-allowed",
        ),
        pytest.param(
            "::ffff:127.0.0.1",
            lambda port: ProbePolicy(allowed_ports=frozenset({port})),
            "::ffff:7f00:1 is a loopback address: not probed",
            id="ipv4-mapped-loopback",
        ),
        pytest.param(
            "127.0.0.1",
            lambda port: ProbePolicy(
                allowed_ports=frozenset({port}), allowed_networks=parse_networks("127.0.0.128/25")
            ),
            "127.0.0.1 is a loopback address: not probed",
            id="loopback-outside-the-opened-part",
        ),
        pytest.param(
            "0.0.0.0",
            lambda port: ProbePolicy(
                allowed_ports=frozenset({port}), allowed_networks=parse_networks("0.0.0.0/0")
            ),
            "0.0.0.0 is an unspecified address: not probed",
            id="unspecified-reaches-localhost",
        ),
    ],
)
def test_a_refused_address_is_never_connected_to(
    listener: FakeMember,
    pod_ip: str,
    policy_of: Callable[[int], ProbePolicy],
    says: str,
) -> None:
    reply = post(real_hook(policy_of(listener.port)), forged(pod_ip, listener.port))
    routed = conditions(reply)["PrimaryRouted"]
    assert routed["reason"] == "NoLeader"
    assert says in routed["message"]
    (member,) = reply["status"]["members"]
    assert (member["name"], member["reachable"]) == (f"{CLUSTER}-0", False)
    assert set(member) == {"name", "reachable", "reason"} and says in member["reason"]
    assert listener.connections == 0


@pytest.mark.parametrize(
    "pod_ip",
    [
        "localhost",
        "localhost.",
        "127.1",
        "0177.0.0.1",
        "0x7f000001",
        "2130706433",
        "127.0.0.1:8008",
        "127.0.0.1%2f",
        "http://127.0.0.1",
        "[127.0.0.1]",
        "::1%lo",
    ],
)
def test_a_pod_ip_that_is_not_an_ip_literal_is_never_resolved_or_probed(
    listener: FakeMember, pod_ip: str
) -> None:
    reply = post(real_hook(ports_and_loopback(listener.port)), forged(pod_ip, listener.port))
    assert "no pod IP" in conditions(reply)["PrimaryRouted"]["message"]
    assert listener.connections == 0


def test_another_port_is_refused_in_the_spec_and_nothing_is_probed(listener: FakeMember) -> None:
    reply = post(
        real_hook(ProbePolicy(allowed_networks=LOOPBACK)), forged("127.0.0.1", listener.port)
    )
    spec_valid = conditions(reply)["SpecValid"]
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "InvalidSpec")
    assert spec_valid["message"] == (
        f"spec.patroni.port: port {listener.port} is not an allowed Patroni port on this hook "
        "(allowed: 8008; the hook's PGFH_ALLOWED_PATRONI_PORTS)"
    )
    assert listener.connections == 0


@pytest.mark.parametrize(
    "path",
    [
        "http://127.0.0.1/primary",
        "//127.0.0.1/primary",
        "/../primary",
        "/primary/../../x",
        "/%2e%2e/primary",
        "/%70rimary",
        "/primary?x=1",
        "/primary#x",
        "/primary/",
        "/PRIMARY",
        "@127.0.0.1/primary",
    ],
)
def test_a_path_with_a_scheme_a_host_or_dot_segments_is_refused_and_nothing_is_probed(
    listener: FakeMember, path: str
) -> None:
    body = forged("127.0.0.1", listener.port, healthCheckPath=path)
    reply = post(real_hook(ports_and_loopback(listener.port)), body)
    spec_valid = conditions(reply)["SpecValid"]
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "InvalidSpec")
    assert spec_valid["message"].startswith("spec.healthCheckPath: must be one of")
    assert listener.connections == 0


class RecordingProber(PatroniProber):
    """The real prober, recording the targets it is asked to probe."""

    def __init__(self, policy: ProbePolicy) -> None:
        super().__init__(deadline=1.0, policy=policy)
        self.asked: list[str] = []

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        self.asked += [t.url for t in targets]
        return super().probe(targets)


@pytest.mark.parametrize(
    "address",
    ["169.254.169.254", "fd00:ec2::254", "100.100.100.200", "::ffff:169.254.169.254"],
)
def test_a_metadata_address_is_never_probed(address: str) -> None:
    # No loopback listener can stand in for 169.254.169.254: prove that no target is
    # ever planned for it, with every network allowed.
    policy = ProbePolicy(allowed_networks=parse_networks("0.0.0.0/0,::/0"))
    prober = RecordingProber(policy)
    app = create_app(
        settings=HookSettings(probe_policy=policy, auth=NO_AUTH), prober=prober, clock=lambda: NOW
    )
    response = app.test_client().post(
        "/sync", data=json.dumps(forged(address, 8008)), content_type="application/json"
    )
    reply = response.get_json()
    assert prober.asked == []
    assert "a cloud metadata address: not probed" in conditions(reply)["PrimaryRouted"]["message"]
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert "pgfh_refused_addresses_total" in metrics


def test_too_many_members_is_a_condition_and_nothing_is_probed() -> None:
    prober = FakeProber()
    app = create_app(
        settings=HookSettings(probe_policy=ProbePolicy(max_members=2), auth=NO_AUTH),
        prober=prober,
        clock=lambda: NOW,
    )
    body = sync_body(services=[make_service(pod=f"{CLUSTER}-0")])  # three members
    response = app.test_client().post(
        "/sync", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 200
    reply = response.get_json()
    assert prober.calls == []
    assert [c["metadata"]["name"] for c in reply["children"]] == [SERVICE]
    assert reply["children"][0]["spec"]["selector"] == service_selector(f"{CLUSTER}-0")
    spec_valid = conditions(reply)["SpecValid"]
    assert spec_valid["status"] == "False"
    assert spec_valid["message"] == (
        "spec.primarySelector: matches 3 Pods, more than the 2 members this hook probes per "
        "cluster (the hook's PGFH_MAX_MEMBERS); nothing was probed"
    )
    assert "members" not in reply["status"]


def test_a_cluster_over_the_members_cap_is_refused_cheaply_and_asked_again_slowly() -> None:
    """Memory and fairness: a cluster over PGFH_MAX_MEMBERS is not probed, its Pods are
    not loaded, and it is asked again after the slow ``refused`` resync, not every
    second (a Pod or spec change brings it back at once anyway)."""
    timing = ResyncTiming(healthy=1.0, degraded=0.3)
    settings = HookSettings(probe_policy=ProbePolicy(max_members=2), auth=NO_AUTH, resync=timing)
    body = sync_body(services=[make_service(pod=f"{CLUSTER}-0")])  # three members
    request = load_sync_request(copy.deepcopy(body), max_pods=2)
    assert request.pods == {} and request.pod_count == 3  # not loaded, only counted
    prober = FakeProber()
    app = create_app(settings=settings, prober=prober, clock=lambda: NOW)
    reply = app.test_client().post("/sync", json=body).get_json()
    assert prober.calls == []
    assert reply["resyncAfterSeconds"] == timing.refused == 60.0
    assert conditions(reply)["SpecValid"]["message"].startswith(
        "spec.primarySelector: matches 3 Pods, more than the 2 members"
    )
    assert reply["children"][0]["spec"]["selector"] == service_selector(f"{CLUSTER}-0")
    # A spec invalid for any other reason is still asked again at the healthy period.
    broken = copy.deepcopy(body)
    broken["parent"]["spec"]["healthCheckPath"] = "no-slash"
    assert app.test_client().post("/sync", json=broken).get_json()["resyncAfterSeconds"] == 1.0


def test_a_forged_target_that_reaches_the_prober_directly_is_refused(listener: FakeMember) -> None:
    prober = PatroniProber(deadline=1.0)
    for url in (
        f"http://localhost:{listener.port}/primary",
        f"http://127.0.0.1:{listener.port}/../primary",
        f"http://127.0.0.1:{listener.port}/replica",
    ):
        target = ProbeTarget(f"{CLUSTER}-0", url, 0.5, 0.5)
        status = prober.probe([target])[f"{CLUSTER}-0"]
        assert status.reason.startswith("refused: "), status
    assert listener.connections == 0
