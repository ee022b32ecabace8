"""Fault injection through the real app: Flask test client → create_app → real prober.

Design notes: the request body is the recorded ``sync-service-selects-old-leader.json``
(the Service selects ``pg-orders-0``; Patroni has promoted ``pg-orders-1``), with only
each Pod's ``status.podIP``/``podIPs`` pointed at a fake member (127.0.0.10-12) and the
spec's ``patroni.port`` set to the fakes' shared port. Each case checks what
Metacontroller relies on: HTTP 200, only known top-level keys, the observed Service
always present, routing kept unless another member is the confirmed leader (however
many others answered: the DCS lock is the quorum), and a sync that ends within the probe
deadline plus a small margin.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from hooks.domain.model import ResyncTiming
from hooks.patroni import PatroniProber
from hooks.probe.policy import ProbePolicy, parse_networks, parse_ports
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.fakes import patroni as fakes
from testbed.fakes.patroni import Behaviour, FakeCluster, FakeMember
from tests.helpers import NO_AUTH, NOW, fixture, polled, spread

DEADLINE = 1.0
#: When the slow fake member answers: twice the probe deadline. The bound every case checks
#: is real time on purpose (rule 3: a hung member costs a sync at most the deadline), and
#: it is this: a sync that ended before the slow member would have answered was ended by
#: the deadline, not by the member. That leaves a whole deadline of margin for a loaded
#: machine instead of a guessed slack (a 0.3 s one failed at 1.313 s with ten busy loops on
#: two cores), and stays well inside Metacontroller's 5 s webhook timeout.
SLOW_ANSWER = 2 * DEADLINE
TIMING = ResyncTiming(healthy=1.0, degraded=0.3)
MAX_REQUEST = 256 * 1024
CAP = 64 * 1024

BASE = "sync-service-selects-old-leader.json"
PODS = ("pg-orders-0", "pg-orders-1", "pg-orders-2")
SERVICE = "pg-orders-primary"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
REPLY_KEYS = {"status", "children", "resyncAfterSeconds", "finalized"}


#: The fakes listen on 127.0.0.10-12 on an ephemeral port: allow exactly that, explicitly
#: (the default policy refuses loopback and every port but 8008).
LOOPBACK_FAKES = ProbePolicy(
    allowed_ports=parse_ports("1024-65535"), allowed_networks=parse_networks("127.0.0.0/8")
)


@pytest.fixture
def real_prober() -> Iterator[PatroniProber]:
    prober = PatroniProber(deadline=DEADLINE, max_body_bytes=CAP, policy=LOOPBACK_FAKES)
    yield prober


@pytest.fixture
def hook(real_prober: PatroniProber) -> FlaskClient:
    settings = HookSettings(
        probe_deadline=DEADLINE,
        max_probe_body_bytes=CAP,
        max_request_bytes=MAX_REQUEST,
        resync=TIMING,
        probe_policy=LOOPBACK_FAKES,
        auth=NO_AUTH,
    )
    app: Flask = create_app(settings=settings, prober=real_prober, clock=lambda: NOW)
    app.config["TESTING"] = True
    return app.test_client()


@pytest.fixture
def members() -> Iterator[Callable[[Sequence[Behaviour]], FakeCluster]]:
    """Start pg-orders-0..2 on 127.0.0.10..12, one port; closed at teardown."""
    clusters: list[FakeCluster] = []

    def start(behaviours: Sequence[Behaviour]) -> FakeCluster:
        cluster = FakeCluster(len(behaviours))
        clusters.append(cluster)
        for fake in cluster.start(behaviours, PODS):
            fake.timeline = 2
        return cluster

    yield start
    for cluster in clusters:
        cluster.close()


def sync_body(cluster: FakeCluster) -> dict[str, Any]:
    """The recorded request, with the Pods' IPs and the Patroni port pointed at the fakes.

    Polled (no role label, no status annotation): the fakes play an etcd-DCS cluster, so a
    confirmed leader gets the operator's healthy resync.
    """
    body = polled(fixture(BASE))
    pods = body["related"]["Pod.v1"]
    assert sorted(pods) == list(PODS)
    for name, host in zip(PODS, cluster.hosts, strict=True):
        pods[name]["status"]["podIP"] = host
        pods[name]["status"]["podIPs"] = [{"ip": host}]
    body["parent"]["spec"]["patroni"] = {"port": cluster.port}
    return body


def post_sync(hook: FlaskClient, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    response = hook.post("/sync", data=json.dumps(body), content_type="application/json")
    elapsed = time.monotonic() - started
    assert response.content_type == "application/json"
    return response.status_code, response.get_json(), elapsed


def condition(reply: dict[str, Any], type_: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in reply["status"]["conditions"] if c["type"] == type_]
    assert len(found) == 1, found
    return found[0]


@dataclass(frozen=True)
class Case:
    """Behaviours of pg-orders-0, -1, -2 and the reply they must produce."""

    behaviours: tuple[Behaviour, Behaviour, Behaviour]
    reason: str
    #: The pod the Service must select afterwards.
    selects: str
    #: Extra changes to the request (on top of the IP/port rewrite).
    tweak: Callable[[dict[str, Any]], None] | None = None
    #: Phrases the routing condition's message must contain.
    says: tuple[str, ...] = field(default=())


R, L = fakes.REPLICA, fakes.LEADER
KEPT = "pg-orders-0"  # what the observed Service selects
MOVED = "pg-orders-1"


def leader_is(fault: Behaviour, *, says: str = "") -> Case:
    """The would-be new leader pg-orders-1 misbehaves; the others are replicas."""
    return Case((R, fault, R), "NoLeader", KEPT, says=(f"pg-orders-1: {says}",) if says else ())


def replica_is(fault: Behaviour) -> Case:
    """A replica misbehaves; the leader is routed to all the same."""
    return Case((R, L, fault), "LeaderFound", MOVED)


def _terminating(body: dict[str, Any]) -> None:
    metadata = body["related"]["Pod.v1"]["pg-orders-1"]["metadata"]
    metadata["deletionTimestamp"] = "2026-08-20T09:47:02Z"
    metadata["deletionGracePeriodSeconds"] = 30


def _impostor(body: dict[str, Any]) -> None:
    """A forged Pod: a copy of the leader's (labels included) under another name, as
    ``kubectl debug --copy-to pg-orders-1-debug --keep-labels`` makes. It needs no fake
    Patroni: its IP answers nothing."""
    pods = body["related"]["Pod.v1"]
    forged = copy.deepcopy(pods["pg-orders-1"])
    forged["metadata"]["name"] = "pg-orders-1-debug"
    forged["metadata"]["uid"] = "0d9b3c1e-0000-4000-8000-00000000dead"
    forged["status"]["podIP"] = "127.0.0.99"
    forged["status"]["podIPs"] = [{"ip": "127.0.0.99"}]
    pods["pg-orders-1-debug"] = forged


LATE = f"no answer within the {DEADLINE:g} s probe deadline"
ELSEWHERE = "redirect target, filled in by the test"

CASES: dict[str, Case] = {
    "all-healthy": Case((R, L, R), "LeaderFound", MOVED, says=("Patroni reports pg-orders-1",)),
    "patroni3-master": Case((R, fakes.MASTER_V3, R), "LeaderFound", MOVED),
    "leader-refused": leader_is(fakes.REFUSED, says="connection refused"),
    "leader-hung": leader_is(fakes.HUNG, says=LATE),
    "leader-slow-past-read-timeout": leader_is(fakes.slow(SLOW_ANSWER), says=LATE),
    "leader-drip": leader_is(fakes.DRIP, says=LATE),
    "leader-reset-mid-body": leader_is(fakes.RESET_MID_BODY, says="connection reset"),
    "leader-garbage": leader_is(fakes.GARBAGE, says="HTTP 200 on /primary with a non-JSON body"),
    "leader-not-patroni": leader_is(
        fakes.NOT_PATRONI, says="HTTP 200 on /primary without Patroni JSON"
    ),
    "leader-redirect": leader_is(
        fakes.redirect(ELSEWHERE), says="HTTP 302 on /primary with a non-JSON body"
    ),
    "leader-huge-body": leader_is(fakes.huge(content_length=True), says="body larger than"),
    "leader-huge-body-no-length": leader_is(
        fakes.huge(content_length=False), says="body larger than"
    ),
    "leader-promoting": Case((R, fakes.PROMOTING, R), "LeaderNotReady", KEPT),
    "leader-stopping": Case((R, fakes.STOPPING, R), "LeaderNotReady", KEPT),
    "replica-refused": replica_is(fakes.REFUSED),
    "replica-hung": replica_is(fakes.HUNG),
    "replica-reset-mid-body": replica_is(fakes.RESET_MID_BODY),
    "replica-huge-body": replica_is(fakes.huge(content_length=False)),
    # Issue 10: the DCS lock is the quorum; the lock holder is routed to whoever else is
    # silent or answers something that is not Patroni's JSON.
    "leader-alone-others-refused-and-hung": Case(
        (fakes.REFUSED, L, fakes.HUNG), "LeaderFound", MOVED, says=("Patroni reports pg-orders-1",)
    ),
    "leader-alone-others-garbage-and-huge": Case(
        (fakes.GARBAGE, L, fakes.huge(content_length=True)), "LeaderFound", MOVED
    ),
    "leader-alone-others-redirect-and-not-patroni": Case(
        (fakes.redirect(ELSEWHERE), L, fakes.NOT_PATRONI), "LeaderFound", MOVED
    ),
    "two-claimants": Case((L, L, R), "MultipleLeaders", KEPT, says=("pg-orders-0, pg-orders-1",)),
    "all-refused": Case((fakes.REFUSED,) * 3, "NoLeader", KEPT, says=("0 of 3 answered",)),
    "all-hung": Case((fakes.HUNG,) * 3, "NoLeader", KEPT, says=("0 of 3 answered",)),
    # Issue 29: exactly one Pod behind the primary Service.
    "impostor-with-the-leaders-labels": Case(
        (R, L, R),
        "SelectorNotUnique",
        KEPT,
        tweak=_impostor,
        says=("Pod pg-orders-1-debug carries statefulset.kubernetes.io/pod-name=pg-orders-1",),
    ),
    "leader-terminating": Case(
        (R, L, R), "LeaderTerminating", KEPT, tweak=_terminating, says=("pg-orders-1",)
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_a_fault_keeps_the_service_unless_another_leader_is_confirmed(
    hook: FlaskClient,
    members: Callable[[Sequence[Behaviour]], FakeCluster],
    case: Case,
) -> None:
    elsewhere: FakeMember | None = None
    behaviours = list(case.behaviours)
    if any(b.location == ELSEWHERE for b in behaviours):
        # The redirect goes to a real leader: following it would route to pg-orders-1.
        elsewhere = FakeMember(fakes.LEADER, name="pg-orders-1")
        behaviours = [
            replace(b, location=elsewhere.url()) if b.location == ELSEWHERE else b
            for b in behaviours
        ]
    try:
        cluster = members(behaviours)
        body = sync_body(cluster)
        if case.tweak is not None:
            case.tweak(body)
        observed = body["children"]["Service.v1"][SERVICE]

        status, reply, elapsed = post_sync(hook, body)

        assert status == 200, reply
        assert set(reply) <= REPLY_KEYS
        assert elapsed < SLOW_ANSWER, f"sync took {elapsed:.3f} s: not bounded by the deadline"
        services = [c for c in reply["children"] if c.get("kind") == "Service"]
        assert [(s["apiVersion"], s["kind"], s["metadata"]["name"]) for s in services] == [
            ("v1", "Service", SERVICE)
        ]
        (service,) = services
        assert service["spec"]["selector"][POD_NAME_LABEL] == case.selects
        routed = condition(reply, "PrimaryRouted")
        assert routed["reason"] == case.reason
        assert condition(reply, "Ready")["reason"] == case.reason
        for phrase in case.says:
            assert phrase in routed["message"]
        assert reply["status"]["primary"] == case.selects
        if case.reason == "LeaderFound":
            assert routed["status"] == "True"
            assert reply["resyncAfterSeconds"] == spread(TIMING.healthy, NOW, body)
        else:
            # Kept exactly as observed, and asked again soon.
            assert service["spec"]["selector"] == observed["spec"]["selector"]
            assert routed["status"] == "False"
            assert reply["resyncAfterSeconds"] == TIMING.degraded
        if elsewhere is not None:
            assert elsewhere.connections == 0
            assert cluster.members[1].requests == ["GET /primary HTTP/1.1"]
    finally:
        if elsewhere is not None:
            elsewhere.close()


def test_every_member_is_asked_once_per_sync_on_the_spec_port(
    hook: FlaskClient, members: Callable[[Sequence[Behaviour]], FakeCluster]
) -> None:
    cluster = members([R, L, R])
    status, reply, _ = post_sync(hook, sync_body(cluster))
    assert status == 200
    assert [m.requests for m in cluster.members] == [["GET /primary HTTP/1.1"]] * 3
    assert [m["name"] for m in reply["status"]["members"]] == list(PODS)


def test_the_reason_is_the_same_on_the_next_sync(
    hook: FlaskClient, members: Callable[[Sequence[Behaviour]], FakeCluster]
) -> None:
    # A condition message that changed on every sync would make Metacontroller
    # write the status again and again.
    cluster = members([R, fakes.HUNG, fakes.RESET_MID_BODY])
    body = sync_body(cluster)
    _, first, _ = post_sync(hook, body)
    cluster.members[1].release()
    _, second, _ = post_sync(hook, body)
    assert condition(first, "PrimaryRouted") == condition(second, "PrimaryRouted")
    assert first["status"] == second["status"]


# ----------------------------------------------------------------- broken requests

TOO_LARGE = "The data value transmitted exceeds the capacity limit."
BAD_REQUESTS = [
    ("not-json", "POST", "/sync", b"{not json", 400, "request body is not valid JSON: "),
    (
        "json-array",
        "POST",
        "/sync",
        b"[]",
        400,
        "request body must be a JSON object, not list",
    ),
    (
        "nan-literal",
        "POST",
        "/sync",
        b'{"parent": NaN, "children": {}}',
        400,
        "request body is not valid JSON: NaN is not JSON",
    ),
    ("empty-body", "POST", "/sync", b"", 400, "empty request body: expected a JSON object"),
    (
        "deep-nesting",
        "POST",
        "/sync",
        b"[" * 100_000 + b"]" * 100_000,
        400,
        "request body nests deeper than 64 levels",
    ),
    (
        "deep-unbalanced",
        "POST",
        "/sync",
        b"[" * 100_000,
        400,
        "request body is not valid JSON: its brackets do not balance",
    ),
    ("not-utf8", "POST", "/sync", b'{"a": "\xff"}', 400, "request body is not UTF-8"),
    ("too-large", "POST", "/sync", b" " * (MAX_REQUEST + 1), 413, TOO_LARGE),
    (
        "wrong-method",
        "GET",
        "/sync",
        b"",
        405,
        "The method is not allowed for the requested URL.",
    ),
    (
        "unknown-path",
        "POST",
        "/nope",
        b"{}",
        404,
        "The requested URL was not found on the server.",
    ),
    (
        "no-children",
        "POST",
        "/sync",
        b'{"parent": {"metadata": {"name": "a", "namespace": "b"}}}',
        400,
        "invalid sync request: children: Missing data for required field.",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "data", "code", "message"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_a_broken_request_is_a_4xx_json_error_never_a_500(
    hook: FlaskClient, method: str, path: str, data: bytes, code: int, message: str
) -> None:
    response = hook.open(path, method=method, data=data, content_type="application/json")

    assert response.status_code == code
    assert response.content_type == "application/json"
    reply = response.get_json()
    assert set(reply) == {"error"}
    assert reply["error"].startswith(message), reply["error"]
