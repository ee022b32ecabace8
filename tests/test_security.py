"""Security properties of the hook: request limits, caller authentication, probe targets.

Test design notes:

* Limits are checked on the real app (Flask test client): each limit gives a clear 4xx
  JSON answer, and none of them depends on the parser's recursion limit.
* The JSON depth pre-check is pure; a property test compares it with the real depth of
  random JSON documents, so it can neither refuse a legal document nor let a deeper one
  through.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.app import create_app
from hooks.config import HookSettings
from hooks.members import MemberStatus, ProbeTarget
from hooks.patroni import PatroniProber, target_problem
from hooks.policy import ProbePolicy, describe_ports, parse_networks, parse_ports
from hooks.schemas import load_sync_request, nesting_problem
from hooks.sync import apply_policy, plan_probes
from tests import fakes
from tests.conftest import NOW
from tests.fakes import FakeMember
from tests.helpers import (
    CLUSTER,
    SYNC_FIXTURES,
    FakeProber,
    fixture,
    make_pod,
    make_service,
    seed_spec,
    service_selector,
    sync_body,
)

# ------------------------------------------------------------------ request limits


def depth(value: object) -> int:
    """Bracket nesting depth of a decoded JSON value (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n,:'),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(alphabet='[]{}"\\k'), children, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_the_depth_check_agrees_with_the_real_depth(value: Any) -> None:
    raw = json.dumps(value).encode()
    real = depth(value)
    assert nesting_problem(raw, max(real, 1)) is None
    if real > 1:
        assert nesting_problem(raw, real - 1) == f"nests deeper than {real - 1} levels"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        pytest.param(b"[" * 65 + b"]" * 65, "nests deeper than 64 levels", id="65-levels"),
        pytest.param(b"[" * 64 + b"]" * 64, None, id="64-levels"),
        pytest.param(b'{"a": "' + b"[" * 10_000 + b'"}', None, id="brackets-in-a-string"),
        pytest.param(b'["\\"[[[[[", 1]', None, id="escaped-quote"),
        pytest.param(b'{"a":[{"b":[{"c":{}}]}]}', None, id="mixed"),
        pytest.param(b"[" * 100_000, "is not valid JSON: its brackets do not balance", id="open"),
        pytest.param(b"[}", "is not valid JSON: its brackets do not balance", id="mismatched"),
        pytest.param(b"", None, id="empty"),
    ],
)
def test_the_depth_check_on_edge_cases(raw: bytes, problem: str | None) -> None:
    assert nesting_problem(raw, 64) == problem


@pytest.mark.parametrize("name", SYNC_FIXTURES)
def test_real_requests_stay_far_below_the_depth_limit(name: str) -> None:
    body = fixture(name)
    assert depth(body) <= 20, "the default limit (64) must leave a wide margin"
    assert nesting_problem(json.dumps(body).encode(), HookSettings().max_json_depth) is None


def _client(settings_: HookSettings) -> FlaskClient:
    app = create_app(settings=settings_, prober=FakeProber(), clock=lambda: NOW)
    app.config["TESTING"] = True
    return app.test_client()


def test_the_depth_limit_is_a_400_before_any_parsing_and_is_configurable() -> None:
    shallow = _client(HookSettings(max_json_depth=3))
    body = json.dumps({"parent": {"metadata": {"labels": {}}}, "children": {}}).encode()
    response = shallow.post("/sync", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json() == {"error": "request body nests deeper than 3 levels"}
    assert HookSettings.from_env({"PGFH_MAX_JSON_DEPTH": "3"}).max_json_depth == 3


def test_client_chosen_paths_do_not_become_metric_labels() -> None:
    client = _client(HookSettings())
    for index in range(20):
        assert client.post(f"/no-such-path-{index}", data=b"{}").status_code == 404
    text = client.get("/metrics").get_data(as_text=True)
    assert "no-such-path" not in text
    assert 'pgfh_bad_requests_total{endpoint="other"}' in text


# ---------------------------------------------------------------- probe policy (pure)

LOOPBACK = parse_networks("127.0.0.0/8")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.244.1.17", None),
        ("fd00:10:244::17", None),
        ("127.0.0.1", "127.0.0.1 is a loopback address: not probed"),
        ("127.0.0.2", "127.0.0.2 is a loopback address: not probed"),
        ("::1", "::1 is a loopback address: not probed"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1 is a loopback address: not probed"),
        ("0.0.0.0", "0.0.0.0 is an unspecified address: not probed"),
        ("::", ":: is an unspecified address: not probed"),
        ("169.254.169.254", "169.254.169.254 is a cloud metadata address: not probed"),
        ("::ffff:169.254.169.254", "::ffff:a9fe:a9fe is a cloud metadata address: not probed"),
        ("fd00:ec2::254", "fd00:ec2::254 is a cloud metadata address: not probed"),
        ("100.100.100.200", "100.100.100.200 is a cloud metadata address: not probed"),
        ("169.254.1.1", "169.254.1.1 is a link-local address: not probed"),
        ("fe80::1", "fe80::1 is a link-local address: not probed"),
        ("224.0.0.1", "224.0.0.1 is a multicast address: not probed"),
        ("255.255.255.255", "255.255.255.255 is a reserved address: not probed"),
        ("64:ff9b::a9fe:a9fe", "64:ff9b::a9fe:a9fe is a NAT64 address: not probed"),
    ],
)
def test_the_default_policy_refuses_every_special_address(address: str, reason: str) -> None:
    assert ProbePolicy().address_problem(ipaddress.ip_address(address)) == reason


def test_only_an_allowed_network_inside_a_special_range_opens_it() -> None:
    loopback = ipaddress.ip_address("127.0.0.2")
    assert ProbePolicy(allowed_networks=LOOPBACK).address_problem(loopback) is None
    assert (
        ProbePolicy(allowed_networks=parse_networks("127.0.0.2/32")).address_problem(loopback)
        is None
    )
    everything = ProbePolicy(allowed_networks=parse_networks("0.0.0.0/0,::/0"))
    assert everything.address_problem(loopback) == "127.0.0.2 is a loopback address: not probed"
    # Opening all of link-local does not open the metadata address inside it.
    link_local = ProbePolicy(allowed_networks=parse_networks("169.254.0.0/16"))
    assert link_local.address_problem(ipaddress.ip_address("169.254.1.1")) is None
    assert link_local.address_problem(ipaddress.ip_address("169.254.169.254")) == (
        "169.254.169.254 is a cloud metadata address: not probed"
    )
    # 0.0.0.0 reaches the local host: allowing loopback does not allow it.
    assert ProbePolicy(allowed_networks=LOOPBACK).address_problem(
        ipaddress.ip_address("0.0.0.0")
    ) == ("0.0.0.0 is an unspecified address: not probed")


def test_pod_cidrs_limit_addresses_per_family() -> None:
    policy = ProbePolicy(allowed_networks=parse_networks("10.244.0.0/16,fd00:10:244::/56"))
    assert policy.address_problem(ipaddress.ip_address("10.244.3.9")) is None
    assert policy.address_problem(ipaddress.ip_address("fd00:10:244::17")) is None
    assert policy.address_problem(ipaddress.ip_address("10.96.0.1")) == (
        "10.96.0.1 is outside the allowed Pod networks: not probed"
    )
    assert policy.address_problem(ipaddress.ip_address("::ffff:10.244.3.9")) is None


@pytest.mark.parametrize(
    ("raw", "ports", "described"),
    [
        ("8008", {8008}, "8008"),
        ("8008, 8443", {8008, 8443}, "8008, 8443"),
        ("9000,8000-8002", {8000, 8001, 8002, 9000}, "8000-8002, 9000"),
    ],
)
def test_port_lists(raw: str, ports: set[int], described: str) -> None:
    assert parse_ports(raw) == ports
    assert describe_ports(ports) == described


@pytest.mark.parametrize("raw", ["0", "65536", "x", "8010-8000", "-", "1-", ",", "80 80"])
def test_bad_port_lists_name_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^PGFH_ALLOWED_PATRONI_PORTS="):
        HookSettings.from_env({"PGFH_ALLOWED_PATRONI_PORTS": raw})


@pytest.mark.parametrize("raw", ["10.244.0.1/16", "10.244.0.0/33", "pods", "10.244.0.0/16;x"])
def test_bad_pod_cidrs_name_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^PGFH_ALLOWED_POD_CIDRS="):
        HookSettings.from_env({"PGFH_ALLOWED_POD_CIDRS": raw})


def test_policy_settings_are_read_from_the_environment() -> None:
    policy = HookSettings.from_env(
        {
            "PGFH_ALLOWED_PATRONI_PORTS": "8008,8443",
            "PGFH_ALLOWED_POD_CIDRS": "10.244.0.0/16, fd00:10:244::/56",
            "PGFH_MAX_MEMBERS": "9",
        }
    ).probe_policy
    assert policy == ProbePolicy(
        allowed_ports=frozenset({8008, 8443}),
        allowed_networks=parse_networks("10.244.0.0/16,fd00:10:244::/56"),
        max_members=9,
    )
    assert HookSettings().probe_policy == ProbePolicy(frozenset({8008}), (), 64)


def test_a_refused_port_or_too_many_members_make_the_spec_invalid_for_this_hook() -> None:
    request = load_sync_request(sync_body(spec=seed_spec(patroni={"port": 8443})))
    refused = apply_policy(request, ProbePolicy())
    assert refused.spec is None
    assert [(p.field, p.message) for p in refused.spec_problems] == [
        (
            "spec.patroni.port",
            "port 8443 is not an allowed Patroni port on this hook (allowed: 8008; "
            "the hook's PGFH_ALLOWED_PATRONI_PORTS)",
        )
    ]
    assert apply_policy(request, ProbePolicy(allowed_ports=frozenset({8443}))) is request
    crowd = load_sync_request(sync_body(pods=[make_pod(f"{CLUSTER}-{i}") for i in range(4)]))
    assert [p.field for p in apply_policy(crowd, ProbePolicy(max_members=3)).spec_problems] == [
        "spec.primarySelector"
    ]
    assert apply_policy(crowd, ProbePolicy(max_members=4)) is crowd
    finalizing = load_sync_request(sync_body(finalizing=True, spec=seed_spec(patroni={"port": 1})))
    assert apply_policy(finalizing, ProbePolicy()) is finalizing


def test_a_refused_address_is_an_unreachable_member_with_the_reason() -> None:
    pods = [make_pod(f"{CLUSTER}-0", "169.254.169.254"), make_pod(f"{CLUSTER}-1")]
    plan = plan_probes(load_sync_request(sync_body(pods=pods)), ProbePolicy())
    assert [t.pod for t in plan.targets] == [f"{CLUSTER}-1"]
    assert plan.refused == {
        f"{CLUSTER}-0": MemberStatus.unknown(
            f"{CLUSTER}-0", "169.254.169.254 is a cloud metadata address: not probed"
        )
    }


def test_an_ipv4_mapped_pod_ip_is_probed_on_its_ipv4_address() -> None:
    pods = [make_pod(f"{CLUSTER}-0", "::ffff:10.244.0.10")]
    (target,) = plan_probes(load_sync_request(sync_body(pods=pods)), ProbePolicy()).targets
    assert target.url == "http://10.244.0.10:8008/primary"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://10.244.1.17:8008/primary", None),
        ("https://[fd00:10:244::17]:8008/leader", None),
        ("http://localhost:8008/primary", "refused: host is not an IP address"),
        ("http://pg.example:8008/primary", "refused: host is not an IP address"),
        ("http://2130706433:8008/primary", "refused: host is not an IP address"),
        ("http://0x7f.0.0.1:8008/primary", "refused: host is not an IP address"),
        ("http://[fe80::1%25eth0]:8008/primary", "refused: host is not an IP address"),
        ("http://10.244.1.17:8008/replica", "refused: path is not one of Patroni's leader paths"),
        ("http://10.244.1.17:8008/%70rimary", "refused: path is not one of Patroni's leader paths"),
        ("http://10.244.1.17:8008/../primary", "refused: URL is not in canonical form"),
        ("http://10.244.1.17:8008/x/../primary", "refused: URL is not in canonical form"),
        ("http://10.244.1.17:8008//primary", "refused: path is not one of Patroni's leader paths"),
        (
            "http://10.244.1.17:8008/primary?lag=1",
            "refused: URL carries credentials, a query or a fragment",
        ),
        (
            "http://a:b@10.244.1.17:8008/primary",
            "refused: URL carries credentials, a query or a fragment",
        ),
        ("file://10.244.1.17:8008/primary", "refused: scheme is not http or https"),
        ("http://10.244.1.17/primary", "refused: no port"),
        (
            "http://10.244.1.17:8443/primary",
            "refused: port 8443 is not an allowed Patroni port "
            "on this hook (allowed: 8008; the hook's PGFH_ALLOWED_PATRONI_PORTS)",
        ),
        (
            "http://169.254.169.254:8008/primary",
            "169.254.169.254 is a cloud metadata address: not probed",
        ),
    ],
)
def test_the_prober_refuses_any_other_url_before_connecting(url: str, reason: str | None) -> None:
    assert target_problem(url, ProbePolicy()) == reason


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
    prober = PatroniProber(deadline=1.0, threads=4, policy=policy)
    app = create_app(
        settings=HookSettings(probe_deadline=1.0, probe_policy=policy),
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
    assert reply["status"]["members"] == [{"name": f"{CLUSTER}-0", "reachable": False}]
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
        super().__init__(deadline=1.0, threads=4, policy=policy)
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
    app = create_app(settings=HookSettings(probe_policy=policy), prober=prober, clock=lambda: NOW)
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
        settings=HookSettings(probe_policy=ProbePolicy(max_members=2)),
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


def test_a_forged_target_that_reaches_the_prober_directly_is_refused(listener: FakeMember) -> None:
    prober = PatroniProber(deadline=1.0, threads=2)
    try:
        for url in (
            f"http://localhost:{listener.port}/primary",
            f"http://127.0.0.1:{listener.port}/../primary",
            f"http://127.0.0.1:{listener.port}/replica",
        ):
            target = ProbeTarget(f"{CLUSTER}-0", url, 0.5, 0.5)
            status = prober.probe([target])[f"{CLUSTER}-0"]
            assert status.reason.startswith("refused: "), status
    finally:
        prober.close()
    assert listener.connections == 0
