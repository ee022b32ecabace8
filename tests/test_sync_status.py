"""Unit tests of the decision core (hooks.sync): the status, transition times, outcome fields.

The test design notes are those of tests/test_sync_routing.py.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from hooks.core.routing import Decision
from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.domain.model import LEADER_PATHS
from hooks.loaders.envelope import load_sync_request
from hooks.probe.plan import probe_targets
from testbed.fakes.patroni_wire import patroni_body
from tests.doubts import DOUBT_IDS, DOUBTS, Doubt
from tests.helpers import (
    CLUSTER,
    NOW,
    P0,
    P1,
    P2,
    SELECTOR,
    SERVICE_NAME,
    down,
    fed_back,
    fixture,
    healthy,
    leader,
    make_pod,
    make_service,
    member_ip,
    replica,
    run,
    seed_spec,
    sync_body,
)
from tests.sync_cases import (
    EARLIER_STAMP,
    LATER,
    NOW_STAMP,
    ROUTED_STATUS,
    condition,
    walk_keys,
)

# ======================================================================= status


def test_members_are_listed_by_name_with_only_stable_fields() -> None:
    pods = [make_pod(P2), make_pod(P0), make_pod(P1)]
    answers = {P0: replica(P0, 2), P1: leader(P1, 2), P2: down(P2)}
    _, outcome = run(sync_body(pods=pods), answers)

    assert outcome.body["status"]["members"] == [
        {"name": P0, "reachable": True, "role": "replica", "state": "running", "timeline": 2},
        {"name": P1, "reachable": True, "role": "primary", "state": "running", "timeline": 2},
        {"name": P2, "reachable": False, "reason": "connection refused"},
    ]


@pytest.mark.parametrize("path", ["/primary", "/master", "/read-write", "/leader"])
def test_patroni_3_master_role_is_reported_as_primary(path: str) -> None:
    answers = {
        P0: MemberStatus.from_api_response(
            P0,
            200,
            patroni_body("master", name=P0),
            health_path=path,
            leader_roles=LEADER_PATHS[path],
        ),
        P1: replica(P1),
        P2: replica(P2),
    }
    _, outcome = run(sync_body(spec=seed_spec(healthCheckPath=path)), answers)

    assert outcome.decision is Decision.ROUTED
    assert [m["role"] for m in outcome.body["status"]["members"]] == [
        "primary",
        "replica",
        "replica",
    ]


def test_the_routed_status_has_exactly_the_documented_fields() -> None:
    body = sync_body(generation=7)
    _, outcome = run(body, healthy(P1, timeline=4))
    status = outcome.body["status"]

    assert set(status) == {
        "observedGeneration",
        "primary",
        "service",
        "timeline",
        "members",
        "membersAnswered",
        "switchoverDetection",
        "conditions",
    }
    assert status["switchoverDetection"] == "Polled"  # make_pod: a role label, no annotation
    assert (
        status["observedGeneration"],
        status["primary"],
        status["service"],
        status["timeline"],
    ) == (
        7,
        P1,
        SERVICE_NAME,
        4,
    )
    assert [c["type"] for c in status["conditions"]] == [
        "Ready",
        "PrimaryRouted",
        "MembersReachable",
        "MemberNameGuard",
        "SpecValid",
        "SwitchoverDetection",
    ]
    for cond in status["conditions"]:
        assert set(cond) == {
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration",
        }
        assert cond["observedGeneration"] == 7
    for member in status["members"]:
        assert set(member) <= {"name", "role", "state", "timeline", "reachable", "reason"}


_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d")


_VOLATILE = re.compile(
    r"xlog|wal|location|lsn|lag|latency|duration|elapsed|seconds|probe|dcs_last_seen|postmaster",
    re.I,
)


@pytest.mark.parametrize("doubt", [None, *DOUBTS], ids=["routed", *DOUBT_IDS])
def test_the_status_holds_no_positions_latencies_or_timestamps_but_transition_times(
    doubt: Doubt | None,
) -> None:
    pods = doubt.pods if doubt else [make_pod(n) for n in (P0, P1, P2)]
    answers = doubt.answers if doubt else healthy(P1)
    _, outcome = run(sync_body(pods=pods, services=[make_service(pod=P0)]), answers)
    status = outcome.body["status"]

    for _, key in walk_keys(status):
        assert not _VOLATILE.search(key), key

    def strings(value: object, key: str = "") -> Iterator[tuple[str, str]]:
        if isinstance(value, Mapping):
            for k, v in value.items():
                yield from strings(v, k)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v, key)
        elif isinstance(value, str):
            yield key, value

    for key, value in strings(status):
        if _TIMESTAMP.search(value):
            assert key == "lastTransitionTime", (key, value)
    assert "50332016" not in json.dumps(status)  # the WAL position in every fake answer


# ------------------------------------------------------- lastTransitionTime


def _previous(
    ready: str, routed: str | None = None, stamp: str | None = EARLIER_STAMP
) -> dict[str, Any]:
    status = copy.deepcopy(ROUTED_STATUS)
    for cond in status["conditions"]:
        if cond["type"] in ("Ready", "PrimaryRouted"):
            cond["status"] = ready if cond["type"] == "Ready" else (routed or ready)
            cond["reason"] = "NoLeader" if cond["status"] == "False" else "LeaderFound"
            cond["message"] = "something said earlier"
            if stamp is None:
                del cond["lastTransitionTime"]
    return status


@pytest.mark.parametrize(
    ("previous", "answers", "expected_status", "expected_stamp"),
    [
        pytest.param(
            _previous("False"),
            DOUBTS[2].answers,
            "False",
            EARLIER_STAMP,
            id="False→False, reason changed",
        ),
        pytest.param(
            _previous("True"), healthy(P2), "True", EARLIER_STAMP, id="True→True, message changed"
        ),
        pytest.param(_previous("True"), DOUBTS[0].answers, "False", NOW_STAMP, id="True→False"),
        pytest.param(_previous("False"), healthy(P1), "True", NOW_STAMP, id="False→True"),
        pytest.param(
            _previous("True", stamp=None), healthy(P1), "True", NOW_STAMP, id="no stamp before"
        ),
        pytest.param({}, healthy(P1), "True", NOW_STAMP, id="no condition before"),
    ],
)
def test_last_transition_time_moves_only_when_the_condition_status_does(
    previous: dict[str, Any],
    answers: Mapping[str, MemberStatus],
    expected_status: str,
    expected_stamp: str,
) -> None:
    body = sync_body(services=[make_service(pod=P0)], status=previous)
    _, outcome = run(body, answers)
    for type_ in ("Ready", "PrimaryRouted"):
        cond = condition(outcome.body, type_)
        assert (cond["status"], cond["lastTransitionTime"]) == (expected_status, expected_stamp)
        assert cond["message"] != "something said earlier"


def test_a_spec_valid_condition_turning_true_gets_a_new_stamp() -> None:
    invalid = sync_body(spec=seed_spec(healthCheckPath="/replica"), services=[make_service(pod=P0)])
    _, first = run(invalid, healthy(P0), now=NOW)
    fixed = fed_back(invalid, first)
    fixed["parent"]["spec"] = seed_spec()
    _, second = run(fixed, healthy(P0), now=LATER)
    assert condition(first.body, "SpecValid")["lastTransitionTime"] == NOW_STAMP
    spec_valid = condition(second.body, "SpecValid")
    assert (spec_valid["status"], spec_valid["lastTransitionTime"]) == (
        "True",
        "2026-08-20T10:07:13Z",
    )


@pytest.mark.parametrize(
    "now",
    [
        pytest.param(
            datetime(2026, 8, 20, 10, 0, 0, 999999, tzinfo=UTC), id="UTC with microseconds"
        ),
        pytest.param(datetime(2026, 8, 20, 10, 0, 0), id="naive, taken as UTC"),
        pytest.param(
            datetime(2026, 8, 20, 12, 0, 0, tzinfo=timezone(timedelta(hours=2))), id="UTC+2"
        ),
    ],
)
def test_transition_times_are_rfc3339_utc_seconds(now: datetime) -> None:
    _, outcome = run(sync_body(), healthy(P0), now=now)
    assert {c["lastTransitionTime"] for c in outcome.body["status"]["conditions"]} == {NOW_STAMP}


# ============================================================ SyncOutcome fields


@pytest.mark.parametrize(
    ("services", "answers", "expected"),
    [
        pytest.param([], healthy(P0), (None, P0, True), id="first Service"),
        pytest.param([make_service(pod=P0)], healthy(P0), (P0, P0, False), id="same leader"),
        pytest.param([make_service(pod=P0)], healthy(P2), (P0, P2, True), id="new leader"),
        pytest.param([make_service(pod=P0)], DOUBTS[0].answers, (P0, P0, False), id="in doubt"),
        pytest.param([], DOUBTS[0].answers, (None, None, False), id="in doubt, no Service"),
        pytest.param(
            [make_service(pod=None, selector=SELECTOR)],
            healthy(P1),
            (None, P1, True),
            id="unpinned Service",
        ),
    ],
)
def test_previous_primary_primary_and_primary_changed(
    services: list[dict[str, Any]], answers: Mapping[str, MemberStatus], expected: tuple[Any, ...]
) -> None:
    _, outcome = run(sync_body(services=services), answers)
    assert (outcome.previous_primary, outcome.primary, outcome.primary_changed) == expected


# ============================================================= probe_targets


def test_probe_targets_are_the_pod_ips_on_patronis_port_and_health_path() -> None:
    request = load_sync_request(fixture("sync-first-no-service.json"))
    assert probe_targets(request) == [
        ProbeTarget(pod, f"http://{ip}:8008/primary", 0.5, 1.0, "/primary", frozenset({"primary"}))
        for pod, ip in ((P0, "10.244.1.17"), (P1, "10.244.2.23"), (P2, "10.244.3.9"))
    ]


def test_probe_targets_are_sorted_by_pod_name() -> None:
    pods = [make_pod(f"{CLUSTER}-{i}") for i in (10, 2, 0, 1)]
    request = load_sync_request(sync_body(pods=pods))
    assert [t.pod for t in probe_targets(request)] == [P0, P1, f"{CLUSTER}-10", P2]


def test_probe_targets_follow_the_specs_scheme_port_path_and_timeouts() -> None:
    spec = seed_spec(
        healthCheckPath="/leader",
        patroni={
            "scheme": "https",
            "port": 8443,
            "connectTimeoutSeconds": 0.2,
            "readTimeoutSeconds": 0.7,
        },
    )
    request = load_sync_request(sync_body(spec=spec, pods=[make_pod(P1)]))
    assert probe_targets(request) == [
        ProbeTarget(
            pod=P1,
            url=f"https://{member_ip(P1)}:8443/leader",
            connect_timeout=0.2,
            read_timeout=0.7,
            health_path="/leader",
            leader_roles=frozenset({"primary", "standby_leader"}),
        )
    ]


def test_probe_targets_carry_the_tls_server_name() -> None:
    spec = seed_spec(patroni={"scheme": "https", "tls": {"serverName": "pg-orders.databases.svc"}})
    request = load_sync_request(sync_body(spec=spec, pods=[make_pod(P1)]))
    (target,) = probe_targets(request)
    assert target.url == f"https://{member_ip(P1)}:8008/primary"
    assert target.server_name == "pg-orders.databases.svc"
    assert probe_targets(load_sync_request(sync_body(pods=[make_pod(P1)])))[0].server_name is None


@pytest.mark.parametrize(
    ("pod_ip", "host"),
    [
        ("fd00:10:244::17", "[fd00:10:244::17]"),
        ("FD00:0010:0244:0000:0000:0000:0000:0017", "[fd00:10:244::17]"),
        ("10.244.1.17", "10.244.1.17"),
    ],
)
def test_probe_targets_write_ip_literals_and_bracket_ipv6(pod_ip: str, host: str) -> None:
    request = load_sync_request(sync_body(pods=[make_pod(P0, pod_ip)]))
    assert [t.url for t in probe_targets(request)] == [f"http://{host}:8008/primary"]


@pytest.mark.parametrize(
    "pod_ip",
    [
        pytest.param(None, id="no podIP"),
        pytest.param("", id="empty"),
        pytest.param("evil.example", id="a hostname"),
        pytest.param("localhost", id="localhost"),
        pytest.param("10.244.1.17:8008", id="with a port"),
        pytest.param("http://10.244.1.17", id="a URL"),
        pytest.param(" 10.244.1.17", id="leading space"),
        pytest.param("10.244.1.256", id="not an IPv4 address"),
        pytest.param("10.244.1.0/24", id="a network"),
        pytest.param(183_763_217, id="an integer"),
        pytest.param(["10.244.1.17"], id="a list"),
        pytest.param("fe80::1%eth0", id="IPv6 with a zone"),
        pytest.param("::1%@evil.example:80#", id="IPv6 zone smuggling a host"),
    ],
)
def test_probe_targets_skip_anything_but_an_ip_literal(pod_ip: object) -> None:
    request = load_sync_request(sync_body(pods=[make_pod(P0, pod_ip), make_pod(P1)]))
    targets = probe_targets(request)
    assert [t.pod for t in targets] == [P1]
    assert all("evil" not in t.url for t in targets)


@pytest.mark.parametrize("status", [None, "Running", [], {"podIPs": [{"ip": "10.244.1.17"}]}])
def test_probe_targets_skip_a_pod_whose_status_is_missing_or_odd(status: object) -> None:
    pod = make_pod(P0)
    if status is None:
        del pod["status"]
    else:
        pod["status"] = status
    request = load_sync_request(sync_body(pods=[pod]))
    assert probe_targets(request) == []


def test_no_probe_targets_while_finalizing_or_with_an_invalid_spec() -> None:
    assert probe_targets(load_sync_request(sync_body(finalizing=True))) == []
    assert probe_targets(load_sync_request(sync_body(spec={}))) == []
    assert len(probe_targets(load_sync_request(sync_body()))) == 3
