"""Security: request limits, and the probe policy (pure).

Security properties of the hook: request limits, caller authentication, probe targets.

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
import re
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.domain.members import MemberStatus
from hooks.loaders.envelope import load_sync_request
from hooks.loaders.jsonbody import bracket_skeleton, nesting_problem
from hooks.probe.plan import apply_policy, plan_probes
from hooks.probe.policy import ProbePolicy, describe_ports, parse_networks, parse_ports
from hooks.probe.targets import target_problem
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from tests.helpers import (
    CLUSTER,
    NO_AUTH,
    NOW,
    SYNC_FIXTURES,
    FakeProber,
    fixture,
    make_pod,
    seed_spec,
    sync_body,
)
from tests.security_cases import (
    LOOPBACK,
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
