"""Security properties of the hook: request limits, caller authentication, probe targets.

Test design notes:

* Limits are checked on the real app (Flask test client): each limit gives a clear 4xx
  JSON answer, and none of them depends on the parser's recursion limit.
* The JSON depth pre-check is pure; a property test compares it with the real depth of
  random JSON documents, so it can neither refuse a legal document nor let a deeper one
  through.
"""

from __future__ import annotations

import base64
import copy
import hmac
import ipaddress
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.test import TestResponse

from hooks.core.policy import ProbePolicy, describe_ports, parse_networks, parse_ports
from hooks.core.probing import apply_policy, plan_probes
from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.domain.model import ResyncTiming
from hooks.loaders.envelope import load_sync_request
from hooks.loaders.jsonbody import bracket_skeleton, nesting_problem
from hooks.patroni import PatroniProber, target_problem
from hooks.shell import auth as auth_module
from hooks.shell.app import create_app
from hooks.shell.config import AuthSettings, HookSettings, PatroniTLS, ServerTLS
from testbed.certs import Pair, TestCA
from testbed.fakes import patroni as fakes
from testbed.fakes.patroni import FakeMember
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook
from tests.helpers import (
    CLUSTER,
    NO_AUTH,
    NOW,
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


#: The first implementation's string matcher (a regular expression), kept as the reference.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_the_bracket_skeleton_is_the_one_the_reference_regex_gives(
    value: Any, ascii_only: bool
) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    reference = bytes(b for b in _JSON_STRING.sub(b"", raw) if b in b"[]{}")
    assert bracket_skeleton(raw) == reference


@pytest.mark.parametrize("name", SYNC_FIXTURES)
def test_the_bracket_skeleton_of_real_requests_is_the_reference_regexs(name: str) -> None:
    raw = json.dumps(fixture(name)).encode()  # last-applied records: escaped quotes galore
    reference = bytes(b for b in _JSON_STRING.sub(b"", raw) if b in b"[]{}")
    assert bracket_skeleton(raw) == reference


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        pytest.param(b"[" * 65 + b"]" * 65, "nests deeper than 64 levels", id="65-levels"),
        pytest.param(b"[" * 64 + b"]" * 64, None, id="64-levels"),
        pytest.param(b'{"a": "' + b"[" * 10_000 + b'"}', None, id="brackets-in-a-string"),
        pytest.param(b'["\\"[[[[[", 1]', None, id="escaped-quote"),
        pytest.param(b'["\\\\", "[[", "\\\\\\"]"]', None, id="escaped-backslashes"),
        pytest.param(b'{"a": "\\u005c"}', None, id="unicode-escaped-backslash"),
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
    shallow = _client(HookSettings(max_json_depth=3, auth=NO_AUTH))
    body = json.dumps({"parent": {"metadata": {"labels": {}}}, "children": {}}).encode()
    response = shallow.post("/sync", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json() == {"error": "request body nests deeper than 3 levels"}
    assert HookSettings.from_env({"PGFH_MAX_JSON_DEPTH": "3"}).max_json_depth == 3


@pytest.mark.parametrize(
    ("given", "echoed"),
    [("req-123", "req-123"), ("a" * 129, None), ("x\u2028forged", None), ("a b", None), ("", None)],
)
def test_only_a_plain_request_id_is_echoed_and_logged(given: str, echoed: str | None) -> None:
    client = _client(HookSettings(auth=NO_AUTH))
    response = client.get("/healthz", headers={"X-Request-Id": given})
    returned = response.headers["X-Request-Id"]
    if echoed is not None:
        assert returned == echoed
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", returned), returned


def test_client_chosen_paths_do_not_become_metric_labels() -> None:
    client = _client(HookSettings(auth=NO_AUTH))
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


def test_a_special_range_opens_wherever_it_stands_in_the_allowed_list() -> None:
    # The Pod network first, the loopback range second: every allowed network is looked
    # at, not only the first one that does not hold the address.
    policy = ProbePolicy(allowed_networks=parse_networks("10.244.0.0/16,127.0.0.0/8"))
    assert policy.address_problem(ipaddress.ip_address("127.0.0.2")) is None
    assert policy.address_problem(ipaddress.ip_address("10.244.3.9")) is None
    assert policy.address_problem(ipaddress.ip_address("10.96.0.1")) == (
        "10.96.0.1 is outside the allowed Pod networks: not probed"
    )
    v6_first = ProbePolicy(allowed_networks=parse_networks("fd00:10:244::/56,::1/128"))
    assert v6_first.address_problem(ipaddress.ip_address("::1")) is None


def test_an_allowed_part_of_a_special_range_opens_only_that_part() -> None:
    policy = ProbePolicy(allowed_networks=parse_networks("127.0.0.0/24"))
    assert policy.address_problem(ipaddress.ip_address("127.0.0.2")) is None
    assert policy.address_problem(ipaddress.ip_address("127.0.1.2")) == (
        "127.0.1.2 is a loopback address: not probed"
    )


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
        # The bounds: 1 and 65535 are ports, alone and as the ends of a range.
        ("1", {1}, "1"),
        ("65535", {65535}, "65535"),
        ("1-2,65534-65535", {1, 2, 65534, 65535}, "1-2, 65534-65535"),
        ("8008-8008", {8008}, "8008"),
    ],
)
def test_port_lists(raw: str, ports: set[int], described: str) -> None:
    assert parse_ports(raw) == ports
    assert describe_ports(ports) == described


def test_no_ports_are_described_as_none() -> None:
    assert describe_ports(()) == "none"
    assert ProbePolicy(allowed_ports=frozenset()).port_problem(8008) == (
        "port 8008 is not an allowed Patroni port on this hook (allowed: none; "
        "the hook's PGFH_ALLOWED_PATRONI_PORTS)"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("0", "'0': ports are 1-65535, a range is low-high"),
        ("65536", "'65536': ports are 1-65535, a range is low-high"),
        ("0-8008", "'0-8008': ports are 1-65535, a range is low-high"),
        ("8008-65536", "'8008-65536': ports are 1-65535, a range is low-high"),
        ("8010-8000", "'8010-8000': ports are 1-65535, a range is low-high"),
        ("x", "'x' is not a port or a range of ports"),
        ("8000-x", "'8000-x' is not a port or a range of ports"),
        ("x-8000", "'x-8000' is not a port or a range of ports"),
        ("-", "'-' is not a port or a range of ports"),
        ("1-", "'1-' is not a port or a range of ports"),
        ("80 80", "'80 80' is not a port or a range of ports"),
        # An empty item is refused, not skipped: "8008,,8443" most often means a templated
        # value came out empty, and the operator meant a port there.
        ("8008,,8443", "item 2 of 3 is empty (two commas in a row, or one at an end)"),
        ("8008,", "item 2 of 2 is empty (two commas in a row, or one at an end)"),
        (",8008", "item 1 of 2 is empty (two commas in a row, or one at an end)"),
        ("8008, ,8443", "item 2 of 3 is empty (two commas in a row, or one at an end)"),
        (",", "item 1 of 2 is empty (two commas in a row, or one at an end)"),
    ],
)
def test_bad_port_lists_name_the_variable_and_the_problem(raw: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        HookSettings.from_env({"PGFH_ALLOWED_PATRONI_PORTS": raw})
    assert str(refused.value) == f"PGFH_ALLOWED_PATRONI_PORTS={raw.strip()!r}: {message}"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            "10.244.0.1/16",
            "'10.244.0.1/16' is not a network in CIDR notation (10.244.0.1/16 has host bits set)",
        ),
        (
            "10.244.0.0/33",
            "'10.244.0.0/33' is not a network in CIDR notation "
            "('10.244.0.0/33' does not appear to be an IPv4 or IPv6 network)",
        ),
        (
            "pods",
            "'pods' is not a network in CIDR notation "
            "('pods' does not appear to be an IPv4 or IPv6 network)",
        ),
        (
            "10.244.0.0/16;x",
            "'10.244.0.0/16;x' is not a network in CIDR notation "
            "('10.244.0.0/16;x' does not appear to be an IPv4 or IPv6 network)",
        ),
        # Skipping the empty item of a lone "," would lift the Pod-network limit altogether.
        (",", "item 1 of 2 is empty (two commas in a row, or one at an end)"),
        (
            "10.244.0.0/16,,fd00:10:244::/56",
            "item 2 of 3 is empty (two commas in a row, or one at an end)",
        ),
        ("10.244.0.0/16,", "item 2 of 2 is empty (two commas in a row, or one at an end)"),
    ],
)
def test_bad_pod_cidrs_name_the_variable_and_the_problem(raw: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        HookSettings.from_env({"PGFH_ALLOWED_POD_CIDRS": raw})
    assert str(refused.value) == f"PGFH_ALLOWED_POD_CIDRS={raw!r}: {message}"


def test_unset_or_blank_policy_settings_keep_the_defaults() -> None:
    for blank in ("", "  "):
        policy = HookSettings.from_env(
            {"PGFH_ALLOWED_PATRONI_PORTS": blank, "PGFH_ALLOWED_POD_CIDRS": blank}
        ).probe_policy
        assert policy == ProbePolicy()


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


# ------------------------------------------------------------ caller authentication

GOOD = "rotation-token-current-0123456789abcdef"
OLD = "rotation-token-previous-0123456789abcdef"


def quiet_body() -> dict[str, Any]:
    """A valid sync request whose members have no IP yet: answered without any probe."""
    pods = [make_pod(f"{CLUSTER}-{i}", None) for i in range(3)]
    return sync_body(pods=pods, services=[make_service(pod=f"{CLUSTER}-0")])


def customize_body() -> dict[str, Any]:
    body = quiet_body()
    return {"controller": body["controller"], "parent": body["parent"]}


class AuthHook:
    """The real app with a token directory the test can rotate."""

    def __init__(self, tokens: Path, auth: AuthSettings) -> None:
        self.tokens = tokens
        self.prober = FakeProber()
        app = create_app(settings=HookSettings(auth=auth), prober=self.prober, clock=lambda: NOW)
        app.config["TESTING"] = True
        self.client = app.test_client()

    def call(
        self,
        authorization: str | None,
        path: str = "/sync",
        certificate: dict[str, Any] | None = None,
        body: bytes | None = None,
    ) -> TestResponse:
        headers = {} if authorization is None else {"Authorization": authorization}
        data = (
            body
            if body is not None
            else json.dumps(quiet_body() if path == "/sync" else customize_body()).encode()
        )
        environ = {"gunicorn.socket": FakeTLSSocket(certificate)} if certificate else {}
        return self.client.post(
            path,
            data=data,
            headers=headers,
            content_type="application/json",
            environ_overrides=environ,
        )


class FakeTLSSocket:
    """What gunicorn puts in the WSGI environ for an HTTPS connection: ``getpeercert()``."""

    def __init__(self, certificate: dict[str, Any] | None) -> None:
        self.certificate = certificate

    def getpeercert(self) -> dict[str, Any] | None:
        return self.certificate


def certificate(cn: str, *dns: str) -> dict[str, Any]:
    """A verified peer certificate as :meth:`ssl.SSLSocket.getpeercert` returns it."""
    return {
        "subject": ((("commonName", cn),),),
        "subjectAltName": tuple(("DNS", d) for d in dns),
    }


@pytest.fixture
def tokens_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "auth"
    directory.mkdir()
    (directory / "token").write_text(GOOD + "\n")
    return directory


@pytest.fixture
def hook(tokens_dir: Path) -> AuthHook:
    return AuthHook(tokens_dir, AuthSettings(mode="token", tokens_path=str(tokens_dir)))


def assert_refused(response: TestResponse, status: int = 401) -> None:
    assert response.status_code == status
    assert response.get_json() == {"error": "unauthorized" if status == 401 else "forbidden"}


def test_the_container_default_requires_a_token() -> None:
    settings = HookSettings.from_env({})
    assert settings.auth == AuthSettings(mode="token", tokens_path="/etc/pg-failover-hook/auth")
    assert HookSettings().auth == settings.auth


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_health_and_metrics_need_no_credentials(hook: AuthHook, path: str) -> None:
    assert hook.client.get(path).status_code == 200


def test_readiness_needs_no_credentials_but_fails_without_a_usable_token(
    hook: AuthHook, tokens_dir: Path
) -> None:
    assert hook.client.get("/readyz").status_code == 200
    (tokens_dir / "token").write_text("short\n")
    response = hook.client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json() == {"status": "not ready", "reason": "no caller token loaded"}
    assert_refused(hook.call(f"Bearer {GOOD}"))
    (tokens_dir / "token").write_text(GOOD)
    assert hook.client.get("/readyz").status_code == 200


@pytest.mark.parametrize("path", ["/sync", "/customize"])
@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="no-header"),
        pytest.param("", id="empty"),
        pytest.param("Bearer", id="no-token"),
        pytest.param("Bearer ", id="blank-token"),
        pytest.param(GOOD, id="no-scheme"),
        pytest.param(f"Token {GOOD}", id="other-scheme"),
        pytest.param("Basic " + base64.b64encode(f"x:{GOOD}".encode()).decode(), id="basic"),
        pytest.param(f"Bearer {GOOD}x", id="longer"),
        pytest.param(f"Bearer {GOOD[:-1]}", id="prefix"),
        pytest.param(f"Bearer {GOOD.upper()}", id="other-case"),
        pytest.param(f"Bearer {OLD}", id="not-configured"),
        pytest.param(f"Bearer {GOOD} {GOOD}", id="twice"),
        pytest.param(
            "Bearer " + "\u00e9" * 20,
            id="non-ascii",
        ),
    ],
)
def test_a_call_without_the_right_token_is_refused_without_detail(
    hook: AuthHook, path: str, authorization: str | None
) -> None:
    response = hook.call(authorization, path)
    assert_refused(response)
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="pg-failover-hook"'
    assert hook.prober.calls == []


@pytest.mark.parametrize(
    "authorization", [f"Bearer {GOOD}", f"bearer {GOOD}", f"BEARER   {GOOD}  "]
)
@pytest.mark.parametrize("path", ["/sync", "/customize"])
def test_the_right_token_is_accepted(hook: AuthHook, path: str, authorization: str) -> None:
    assert hook.call(authorization, path).status_code == 200


def test_an_unauthenticated_call_is_refused_before_its_body_is_read(hook: AuthHook) -> None:
    huge = b"[" * (HookSettings().max_request_bytes + 1)
    assert_refused(hook.call(None, body=huge))
    assert hook.call(f"Bearer {GOOD}", body=huge).status_code == 413


def test_rotation_two_tokens_then_the_old_one_removed_without_a_restart(
    hook: AuthHook, tokens_dir: Path
) -> None:
    (tokens_dir / "token.previous").write_text(OLD)
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert hook.call(f"Bearer {OLD}").status_code == 200
    (tokens_dir / "token.previous").unlink()
    assert_refused(hook.call(f"Bearer {OLD}"))
    assert hook.call(f"Bearer {GOOD}").status_code == 200


def test_rotation_of_a_mounted_secret_swapping_the_data_symlink(tmp_path: Path) -> None:
    # The kubelet's layout: <dir>/token -> ..data/token, ..data -> ..<timestamp>; an update
    # writes a new timestamped directory and renames a new ..data link over the old one.
    mount = tmp_path / "secret"
    mount.mkdir()

    def publish(version: str, tokens: dict[str, str]) -> None:
        data = mount / f"..{version}"
        data.mkdir()
        for key, value in tokens.items():
            (data / key).write_text(value)
            link = mount / key
            if not link.is_symlink():
                link.symlink_to(Path("..data") / key)
        (mount / "..data_tmp").symlink_to(data.name)
        (mount / "..data_tmp").replace(mount / "..data")

    publish("2026_08_20_10_00_00.1", {"token": OLD})
    hook = AuthHook(mount, AuthSettings(mode="token", tokens_path=str(mount)))
    assert hook.call(f"Bearer {OLD}").status_code == 200
    publish("2026_08_20_10_05_00.2", {"token": GOOD})
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert_refused(hook.call(f"Bearer {OLD}"))


def test_a_tokens_file_holds_one_token_per_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# rotated 2026-08-20\n{GOOD}\n\n  {OLD}  \nshort\n")
    hook = AuthHook(path, AuthSettings(mode="token", tokens_path=str(path)))
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert hook.call(f"Bearer {OLD}").status_code == 200
    assert_refused(hook.call("Bearer short"))
    assert_refused(hook.call("Bearer # rotated 2026-08-20"))


def test_unusable_tokens_are_ignored_and_logged_without_their_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "auth"
    directory.mkdir()
    (directory / "short").write_text("0123456789")
    (directory / "spaced").write_text("0123456789 0123456789")
    (directory / "huge").write_text("x" * 5000)
    (directory / "good").write_text(GOOD)
    with caplog.at_level(logging.INFO, logger="hooks.auth"):
        hook = AuthHook(directory, AuthSettings(mode="token", tokens_path=str(directory)))
        assert hook.call(f"Bearer {GOOD}").status_code == 200
        assert_refused(hook.call("Bearer 0123456789"))
    text = caplog.text
    assert "caller tokens loaded from" in text and ": 1" in text
    assert "shorter than 16 characters" in text and "larger than 4096 bytes" in text
    assert GOOD not in text and "0123456789" not in text


def test_a_refused_call_is_logged_and_counted_but_the_token_is_not_logged(
    hook: AuthHook, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Bearer wrong-but-long-enough-token-value"
    with caplog.at_level(logging.WARNING, logger="hooks.app"):
        assert_refused(hook.call(wrong))
    assert "refused a sync call: unknown_token" in caplog.text
    assert "wrong-but-long-enough" not in caplog.text
    metrics = hook.client.get("/metrics").get_data(as_text=True)
    assert 'pgfh_auth_failures_total{reason="unknown_token"}' in metrics
    assert "pgfh_auth_tokens 1.0" in metrics


def test_every_token_is_compared_in_constant_time_without_stopping_at_a_match(
    hook: AuthHook, tokens_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tokens_dir / "token.next").write_text(OLD)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert len(compared) == 2, "both tokens compared, the match did not stop the loop"
    assert all(len(a) == len(b) == 32 for a, b in compared), "digests: equal lengths"


def test_no_tokens_at_all_refuses_everything(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    hook = AuthHook(missing, AuthSettings(mode="token", tokens_path=str(missing)))
    assert_refused(hook.call(f"Bearer {GOOD}"))
    assert hook.client.get("/readyz").status_code == 503


def test_mtls_requires_a_verified_client_certificate(tmp_path: Path) -> None:
    hook = AuthHook(tmp_path, AuthSettings(mode="mtls"))
    response = hook.call(None)
    assert_refused(response)
    assert "WWW-Authenticate" not in response.headers
    assert hook.call(None, certificate=certificate("metacontroller")).status_code == 200
    assert hook.call(None, path="/customize", certificate=certificate("x")).status_code == 200
    assert hook.client.get("/readyz").status_code == 200


def test_mtls_client_names_limit_which_certificates_are_accepted(tmp_path: Path) -> None:
    names = frozenset({"metacontroller", "metacontroller.metacontroller.svc"})
    hook = AuthHook(tmp_path, AuthSettings(mode="mtls", client_names=names))
    assert hook.call(None, certificate=certificate("metacontroller")).status_code == 200
    by_san = certificate("mc-7f9c", "metacontroller.metacontroller.svc")
    assert hook.call(None, certificate=by_san).status_code == 200
    assert_refused(hook.call(None, certificate=certificate("intruder", "evil.example")), 403)


def test_token_and_mtls_require_both(tokens_dir: Path) -> None:
    hook = AuthHook(tokens_dir, AuthSettings(mode="token+mtls", tokens_path=str(tokens_dir)))
    cert = certificate("metacontroller")
    assert_refused(hook.call(f"Bearer {GOOD}"))
    assert_refused(hook.call(None, certificate=cert))
    assert_refused(hook.call("Bearer wrong-but-long-enough-token-value", certificate=cert))
    assert hook.call(f"Bearer {GOOD}", certificate=cert).status_code == 200


def test_auth_none_is_an_explicit_switch_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hooks.app"):
        app = create_app(settings=HookSettings.from_env({"PGFH_AUTH": "none"}), prober=FakeProber())
    assert "caller authentication is OFF (PGFH_AUTH=none)" in caplog.text
    response = app.test_client().post(
        "/sync", data=json.dumps(quiet_body()), content_type="application/json"
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PGFH_AUTH": "off"}, "PGFH_AUTH='off' must be one of token, mtls, token+mtls, none"),
        ({"PGFH_AUTH": "mtls"}, "PGFH_AUTH=mtls needs HTTPS with client certificates"),
        (
            {"PGFH_AUTH": "token+mtls", "PGFH_TLS_CERT_FILE": "c", "PGFH_TLS_KEY_FILE": "k"},
            "PGFH_AUTH=token+mtls needs HTTPS with client certificates",
        ),
        ({"PGFH_TLS_CERT_FILE": "c"}, "PGFH_TLS_CERT_FILE and PGFH_TLS_KEY_FILE must be set"),
        ({"PGFH_TLS_CLIENT_CA_FILE": "ca"}, "PGFH_TLS_CLIENT_CA_FILE needs PGFH_TLS_CERT_FILE"),
        ({"PGFH_AUTH_CLIENT_NAMES": "mc"}, "PGFH_AUTH_CLIENT_NAMES is only used with"),
    ],
)
def test_inconsistent_auth_settings_stop_the_start_up(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        HookSettings.from_env(env)


def test_auth_settings_are_read_from_the_environment() -> None:
    settings = HookSettings.from_env(
        {
            "PGFH_AUTH": "Token+MTLS",
            "PGFH_AUTH_TOKENS_PATH": "/run/tokens",
            "PGFH_AUTH_CLIENT_NAMES": "metacontroller, mc.example",
            "PGFH_TLS_CERT_FILE": "/tls/tls.crt",
            "PGFH_TLS_KEY_FILE": "/tls/tls.key",
            "PGFH_TLS_CLIENT_CA_FILE": "/tls/ca.crt",
        }
    )
    assert settings.auth == AuthSettings(
        "token+mtls", "/run/tokens", frozenset({"metacontroller", "mc.example"})
    )
    assert settings.server_tls == ServerTLS("/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt")


# ------------------------------------------------ authentication under real gunicorn


@pytest.fixture(scope="module")
def gunicorn_token_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with gunicorn_hook(tmp_path_factory.mktemp("token-hook"), workers=2) as running:
        yield running


def real_sync(hook: GunicornHook, headers: dict[str, str], **kwargs: Any) -> requests.Response:
    return requests.post(
        f"{hook.url}/sync",
        data=json.dumps(quiet_body()),
        headers={"Content-Type": "application/json", **headers},
        timeout=5,
        verify=hook.verify,
        **kwargs,
    )


@pytest.mark.gunicorn
def test_bearer_token_under_gunicorn(gunicorn_token_hook: GunicornHook) -> None:
    hook = gunicorn_token_hook
    assert hook.token is not None
    refused = real_sync(hook, {})
    assert (refused.status_code, refused.json()) == (401, {"error": "unauthorized"})
    assert real_sync(hook, {"Authorization": "Bearer not-the-token-0123456789"}).status_code == 401
    assert real_sync(hook, hook.headers).status_code == 200
    for path in ("/healthz", "/readyz", "/metrics"):
        assert requests.get(f"{hook.url}{path}", timeout=5).status_code == 200


@pytest.mark.gunicorn
def test_token_rotation_under_gunicorn_reaches_every_worker_without_a_restart(
    gunicorn_token_hook: GunicornHook,
) -> None:
    hook = gunicorn_token_hook
    assert hook.tokens_dir is not None and hook.token is not None
    pid = hook.process.pid
    new = "rotated-token-for-the-gunicorn-test-0123"
    # 1. The Secret gets the new token as a second key: both are accepted.
    (hook.tokens_dir / "token.next").write_text(new)
    for _ in range(10):  # the kernel spreads these over both workers
        assert real_sync(hook, {"Authorization": f"Bearer {new}"}).status_code == 200
        assert real_sync(hook, hook.headers).status_code == 200
    # 2. The old key is removed: refused at once, by every worker.
    old = hook.headers
    (hook.tokens_dir / "token").unlink()
    (hook.tokens_dir / "token.next").replace(hook.tokens_dir / "token")
    for _ in range(10):
        assert real_sync(hook, old).status_code == 401
        assert real_sync(hook, {"Authorization": f"Bearer {new}"}).status_code == 200
    assert hook.process.pid == pid and hook.process.poll() is None
    # The gauge is the lowest count over live workers (a worker still booting shows 0).
    deadline = time.monotonic() + 10
    while "pgfh_auth_tokens 1.0" not in requests.get(f"{hook.url}/metrics", timeout=5).text:
        assert time.monotonic() < deadline, "every worker should report one token"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("pki")
    ca = TestCA(directory, "hook")
    rogue = TestCA(directory, "rogue")
    return {
        "ca": ca,
        "server": ca.issue("pg-failover-hook", ips=("127.0.0.1",), dns=("localhost",)),
        "client": ca.issue("metacontroller", client=True, server=False),
        "intruder": ca.issue("intruder", client=True, server=False),
        "rogue": rogue.issue("metacontroller-rogue", client=True, server=False),
    }


def tls_env(pki: dict[str, Any], mode: str, **extra: str) -> dict[str, str]:
    return {
        "PGFH_AUTH": mode,
        "PGFH_TLS_CERT_FILE": str(pki["server"].cert),
        "PGFH_TLS_KEY_FILE": str(pki["server"].key),
        "PGFH_TLS_CLIENT_CA_FILE": str(pki["ca"].cert_file),
        **extra,
    }


def client_cert(pair: Pair) -> tuple[str, str]:
    return (str(pair.cert), str(pair.key))


@pytest.mark.gunicorn
def test_mtls_under_gunicorn(tmp_path: Path, pki: dict[str, Any]) -> None:
    env = tls_env(pki, "mtls", PGFH_AUTH_CLIENT_NAMES="metacontroller")
    with gunicorn_hook(tmp_path, env=env, ca_file=pki["ca"].cert_file, workers=1) as hook:
        assert hook.url.startswith("https://")
        # Probes and scrapes present no certificate and still get in.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert requests.get(f"{hook.url}{path}", timeout=5, verify=hook.verify).ok
        # No certificate: TLS is fine, the app refuses.
        assert real_sync(hook, {}).status_code == 401
        # The right certificate.
        assert real_sync(hook, {}, cert=client_cert(pki["client"])).status_code == 200
        # Signed by the same CA, but not a name on PGFH_AUTH_CLIENT_NAMES.
        assert real_sync(hook, {}, cert=client_cert(pki["intruder"])).status_code == 403
        # Signed by another CA: the handshake itself fails.
        with pytest.raises(requests.exceptions.SSLError):
            real_sync(hook, {}, cert=client_cert(pki["rogue"]))
        # Plain HTTP on the HTTPS port gets no answer from the app.
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.post(hook.url.replace("https://", "http://") + "/sync", json={}, timeout=5)
        # A client that does not trust the hook's CA does not talk to it.
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{hook.url}/healthz", timeout=5, verify=True)


@pytest.mark.gunicorn
def test_token_and_mtls_under_gunicorn(tmp_path: Path, pki: dict[str, Any]) -> None:
    tokens = tmp_path / "auth"
    tokens.mkdir()
    (tokens / "token").write_text(GOOD)
    env = tls_env(pki, "token+mtls", PGFH_AUTH_TOKENS_PATH=str(tokens))
    with gunicorn_hook(tmp_path, env=env, ca_file=pki["ca"].cert_file, workers=1) as hook:
        bearer = {"Authorization": f"Bearer {GOOD}"}
        mc = client_cert(pki["client"])
        assert real_sync(hook, bearer).status_code == 401
        assert real_sync(hook, {}, cert=mc).status_code == 401
        assert real_sync(hook, bearer, cert=mc).status_code == 200


# ------------------------------------------------------------------ TLS to Patroni


def test_tls_settings_are_read_from_the_environment() -> None:
    settings = HookSettings.from_env(
        {
            "PGFH_PATRONI_CA_FILE": "/etc/patroni-tls/ca.crt",
            "PGFH_PATRONI_CLIENT_CERT_FILE": "/etc/patroni-tls/tls.crt",
            "PGFH_PATRONI_CLIENT_KEY_FILE": "/etc/patroni-tls/tls.key",
        }
    )
    assert settings.patroni_tls == PatroniTLS(
        "/etc/patroni-tls/ca.crt", "/etc/patroni-tls/tls.crt", "/etc/patroni-tls/tls.key"
    )
    with pytest.raises(ValueError, match=r"^PGFH_PATRONI_CLIENT_CERT_FILE and"):
        HookSettings.from_env({"PGFH_PATRONI_CLIENT_CERT_FILE": "/x.crt"})
