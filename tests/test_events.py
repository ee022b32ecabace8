"""Kubernetes Events: sent on transitions only, de-duplicated by name, never blocking.

Test design: the real ``kubernetes`` client talks to a loopback HTTP server that plays
the API server's events endpoint (201 on create, 409 on a name it has seen, or a hang),
so the wire format (path, JSON body) is the client's own, not a mock's.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s

from hooks.core.cluster_event import event_for
from hooks.core.outcome import SyncOutcome
from hooks.core.routing import Decision
from hooks.domain.model import ResyncTiming
from hooks.domain.observed import PreviousStatus
from hooks.domain.request import SyncRequest
from hooks.loaders.envelope import load_sync_request
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from hooks.shell.events import EventEmitter
from hooks.sync import reconcile
from tests.helpers import NO_AUTH, NOW, FakeProber, fixture, leader, replica


class FakeEventsApi(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.created: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.hang = threading.Event()
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeEventsApi

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.paths.append(self.path)
        if self.server.hang.is_set():
            self.server.release.wait(5)
        names = [e["metadata"]["name"] for e in self.server.created]
        status = 409 if body["metadata"]["name"] in names else 201
        if status == 201:
            self.server.created.append(body)
        payload = json.dumps(body if status == 201 else {"kind": "Status", "code": 409}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[FakeEventsApi]:
    server = FakeEventsApi()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


#: The emitter's connect and read timeouts where a test's bound is "less than one read
#: timeout": a sync or an emit that waited for the hung API server would take at least this
#: long (the fake hangs until released, up to 5 s), one that did not takes milliseconds.
SLOW_API_TIMEOUT = (2.0, 2.0)


def emitter_for(
    server: FakeEventsApi, timeout: tuple[float, float] = (0.5, 0.5), max_pending: int = 100
) -> EventEmitter:
    def factory() -> Any:
        configuration = k8s.Configuration(host=server.url)
        return k8s.EventsV1Api(k8s.ApiClient(configuration))

    return EventEmitter(
        factory, instance="hook-0", clock=lambda: NOW, timeout=timeout, max_pending=max_pending
    )


def failover_answers() -> dict[str, Any]:
    return {
        "pg-orders-0": replica("pg-orders-0", 2),
        "pg-orders-1": leader("pg-orders-1", 2),
        "pg-orders-2": replica("pg-orders-2", 2),
    }


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_primary_change_records_one_normal_event_on_the_cluster(
    api_server: FakeEventsApi,
) -> None:
    emitter = emitter_for(api_server)
    app = create_app(
        HookSettings(auth=NO_AUTH),
        prober=FakeProber(failover_answers()),
        clock=lambda: NOW,
        events=emitter,
    )
    response = app.test_client().post("/sync", json=fixture("sync-service-selects-old-leader.json"))
    assert response.status_code == 200
    wait_for(lambda: len(api_server.created) == 1)
    emitter.close()
    event = api_server.created[0]
    assert api_server.paths == ["/apis/events.k8s.io/v1/namespaces/databases/events"]
    assert event["reason"] == "PrimaryChanged" and event["type"] == "Normal"
    assert event["regarding"]["kind"] == "PostgreSQLCluster"
    assert event["regarding"]["uid"] == "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4"
    assert "pg-orders-0 to pg-orders-1" in event["note"]
    assert event["reportingController"] == "adg.io/pg-failover-hook"


def test_an_impostor_pod_records_a_warning_event_and_counts_a_conflict(
    api_server: FakeEventsApi,
) -> None:
    """Issue 29: a copy of the leader's Pod stops routing, with an Event and a metric."""
    body = fixture("sync-service-selects-old-leader.json")
    forged = copy.deepcopy(body["related"]["Pod.v1"]["pg-orders-1"])
    forged["metadata"]["name"] = "pg-orders-1-debug"
    body["related"]["Pod.v1"]["pg-orders-1-debug"] = forged
    emitter = emitter_for(api_server)
    app = create_app(
        HookSettings(auth=NO_AUTH),
        prober=FakeProber(failover_answers()),
        clock=lambda: NOW,
        events=emitter,
    )
    client = app.test_client()

    def conflicts() -> float:
        text = client.get("/metrics").get_data(as_text=True)
        lines = [x for x in text.splitlines() if x.startswith("pgfh_primary_selector_conflicts")]
        return sum(float(x.split()[-1]) for x in lines if x.split()[0].endswith("_total"))

    before = conflicts()
    response = client.post("/sync", json=body)
    assert response.status_code == 200
    assert conflicts() == before + 1
    wait_for(lambda: len(api_server.created) == 1)
    emitter.close()
    event = api_server.created[0]
    assert (event["type"], event["reason"]) == ("Warning", "SelectorNotUnique")
    assert (
        "Pod pg-orders-1-debug carries statefulset.kubernetes.io/pod-name=pg-orders-1"
        in (event["note"])
    )
    selector = response.get_json()["children"][0]["spec"]["selector"]
    assert selector["statefulset.kubernetes.io/pod-name"] == "pg-orders-0"


def test_two_replicas_seeing_the_same_transition_record_it_once(api_server: FakeEventsApi) -> None:
    emitters = [emitter_for(api_server), emitter_for(api_server)]
    for emitter in emitters:
        app = create_app(
            HookSettings(auth=NO_AUTH),
            prober=FakeProber(failover_answers()),
            clock=lambda: NOW,
            events=emitter,
        )
        app.test_client().post("/sync", json=fixture("sync-service-selects-old-leader.json"))
    wait_for(lambda: len(api_server.paths) == 2)
    for emitter in emitters:
        emitter.close()
    assert len(api_server.created) == 1, "the second create is refused with 409 by name"


def test_no_event_without_a_transition() -> None:
    request = load_sync_request(fixture("sync-no-leader-during-failover.json"))
    first = reconcile(request, {}, now=NOW, timing=ResyncTiming())
    assert event_for(request, first) is not None, "Ready went LeaderFound → NoLeader"
    body = fixture("sync-no-leader-during-failover.json")
    body["parent"]["status"] = first.body["status"]
    again = load_sync_request(body)
    assert event_for(again, reconcile(again, {}, now=NOW, timing=ResyncTiming())) is None


@pytest.mark.parametrize("status", [[], "junk", {"conditions": "junk"}, {"conditions": [1]}])
def test_a_status_that_is_not_one_still_gives_the_event(status: object) -> None:
    """The parent's status is free input: junk there is read as "no previous condition"."""
    body = fixture("sync-no-leader-during-failover.json")
    body["parent"]["status"] = status
    request = load_sync_request(body)
    event = event_for(request, reconcile(request, {}, now=NOW, timing=ResyncTiming()))
    assert event is not None and event.reason == "NoLeader"


def test_a_hung_api_server_does_not_delay_the_sync(api_server: FakeEventsApi) -> None:
    api_server.hang.set()
    emitter = emitter_for(api_server, timeout=SLOW_API_TIMEOUT)
    app = create_app(
        HookSettings(auth=NO_AUTH),
        prober=FakeProber(failover_answers()),
        clock=lambda: NOW,
        events=emitter,
    )
    started = time.monotonic()
    response = app.test_client().post("/sync", json=fixture("sync-service-selects-old-leader.json"))
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    read_timeout = SLOW_API_TIMEOUT[1]
    assert elapsed < read_timeout, f"sync waited for the API server: {elapsed:.3f} s"
    # The Event was on its way all the same: the hung server holds its request, and once
    # released it is recorded (a sync that sent nothing would pass the bound too).
    wait_for(lambda: len(api_server.paths) == 1)
    assert api_server.created == []
    api_server.release.set()
    wait_for(lambda: len(api_server.created) == 1)
    emitter.close()
    assert api_server.created[0]["reason"] == "PrimaryChanged"


def test_a_full_queue_drops_events_instead_of_blocking(api_server: FakeEventsApi) -> None:
    api_server.hang.set()
    emitter = emitter_for(api_server, timeout=SLOW_API_TIMEOUT, max_pending=2)
    request = load_sync_request(fixture("sync-service-selects-old-leader.json"))
    event = event_for(
        request, reconcile(request, failover_answers(), now=NOW, timing=ResyncTiming())
    )
    assert event is not None
    started = time.monotonic()
    for _ in range(50):
        emitter.emit(event)
    elapsed = time.monotonic() - started
    assert elapsed < SLOW_API_TIMEOUT[1], f"emit blocked on the API server: {elapsed:.3f} s"
    api_server.release.set()
    emitter.close()
    # Exactly the two the queue held were sent (the first while the server hung); the
    # other 48 were dropped. Zero would mean nothing was sent at all.
    assert len(api_server.paths) == 2
    assert len(api_server.created) == 1, "the second has the same name: 409"


def test_a_no_leader_transition_gives_this_warning_event_field_by_field() -> None:
    """Golden: the name is stable for the transition (two replicas create it once)."""
    request = load_sync_request(fixture("sync-no-leader-during-failover.json"))
    event = event_for(request, reconcile(request, {}, now=NOW, timing=ResyncTiming()))
    assert event is not None
    assert dataclasses.asdict(event) == {
        "name": "pg-orders.21aa2f11eb5fd7e8",
        "namespace": "databases",
        "type": "Warning",
        "reason": "NoLeader",
        "action": "KeepRouting",
        "note": "No member answers 200 on /primary (0 of 3 answered; unreachable: pg-orders-0: "
        "no pod IP; pg-orders-1: no pod IP; pg-orders-2: no pod IP); keeping Service "
        "pg-orders-primary on pg-orders-0",
        "regarding": {
            "apiVersion": "adg.io/v1alpha1",
            "kind": "PostgreSQLCluster",
            "name": "pg-orders",
            "namespace": "databases",
            "uid": "6f1d8c3e-2b7a-4e59-9c0d-3a5b7e91f2c4",
        },
    }


# ----------------------------------------------- event_for, field by field (pure)


def _no_leader() -> tuple[SyncRequest, SyncOutcome]:
    request = load_sync_request(fixture("sync-no-leader-during-failover.json"))
    return request, reconcile(request, {}, now=NOW, timing=ResyncTiming())


def _failover() -> tuple[SyncRequest, SyncOutcome]:
    request = load_sync_request(fixture("sync-service-selects-old-leader.json"))
    return request, reconcile(request, failover_answers(), now=NOW, timing=ResyncTiming())


def test_a_primary_change_gives_this_normal_event_field_by_field() -> None:
    request, outcome = _failover()
    event = event_for(request, outcome)
    assert event is not None
    fields = dataclasses.asdict(event)
    assert fields["type"] == "Normal"
    assert fields["reason"] == "PrimaryChanged"
    assert fields["action"] == "RoutePrimary"
    assert fields["note"] == (
        f"Service pg-orders-primary moved from pg-orders-0 to pg-orders-1: {outcome.message}"
    )
    assert fields["name"].startswith("pg-orders.") and len(fields["name"]) == len("pg-orders.") + 16


def test_a_first_primary_is_said_to_move_from_none() -> None:
    request, outcome = _failover()
    event = event_for(request, dataclasses.replace(outcome, previous_primary=None))
    assert event is not None
    assert event.note.startswith("Service pg-orders-primary moved from (none) to pg-orders-1: ")


def test_a_primary_change_without_a_valid_spec_names_no_service() -> None:
    """The pure function's contract: no spec, no Service name to quote (a '?' instead)."""
    request, outcome = _failover()
    event = event_for(dataclasses.replace(request, spec=None), outcome)
    assert event is not None
    assert event.note.startswith("Service ? moved from pg-orders-0 to pg-orders-1: ")


def test_a_transition_back_to_routing_on_the_same_primary_gives_no_event() -> None:
    """NoLeader → LeaderFound on the pod the Service already selects: nothing moved."""
    _, outcome = _failover()
    request, _ = _no_leader()
    same = dataclasses.replace(
        outcome, previous_primary="pg-orders-1", primary="pg-orders-1", previous_reason="NoLeader"
    )
    assert same.transition and not same.primary_changed
    assert event_for(request, same) is None


def test_an_invalid_spec_transition_gives_a_warning_event() -> None:
    request, outcome = _no_leader()
    invalid = dataclasses.replace(outcome, decision=Decision.INVALID_SPEC, message="bad spec")
    event = event_for(request, invalid)
    assert event is not None
    assert (event.type, event.reason, event.action, event.note) == (
        "Warning",
        "InvalidSpec",
        "KeepRouting",
        "bad spec",
    )


def test_a_parent_without_metadata_kind_or_api_version_gets_the_defaults() -> None:
    request, outcome = _no_leader()
    bare = dataclasses.replace(
        request,
        uid=None,
        api_version="adg.io/v1alpha1",
        kind="PostgreSQLCluster",
        previous=PreviousStatus(),
    )
    event = event_for(bare, outcome)
    assert event is not None
    assert event.regarding == {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "name": "pg-orders",
        "namespace": "databases",
        "uid": "",
    }
    # No status either: the name's digest is of an empty uid and an empty previous time.
    key = "|".join(["", "NoLeader", str(outcome.primary), ""])
    assert event.name == f"pg-orders.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def test_a_parent_without_a_uid_is_named_from_an_empty_uid() -> None:
    request, outcome = _no_leader()
    event = event_for(dataclasses.replace(request, uid=None, previous=PreviousStatus()), outcome)
    assert event is not None
    assert event.regarding["uid"] == ""
    key = "|".join(["", "NoLeader", str(outcome.primary), ""])
    assert event.name == f"pg-orders.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _identity(body: dict[str, Any]) -> dict[str, str]:
    loaded = load_sync_request(body)
    return {"api_version": loaded.api_version, "kind": loaded.kind}


def test_the_regarding_reference_is_the_parents_own_kind_and_api_version() -> None:
    request, outcome = _no_leader()
    body = fixture("sync-no-leader-during-failover.json")
    body["parent"]["apiVersion"] = "adg.io/v1beta1"
    body["parent"]["kind"] = "OtherCluster"
    event = event_for(dataclasses.replace(request, **_identity(body)), outcome)
    assert event is not None
    assert event.regarding["apiVersion"] == "adg.io/v1beta1"
    assert event.regarding["kind"] == "OtherCluster"


def test_the_name_depends_on_the_previous_ready_transition_time() -> None:
    """Two failovers at different times are two Events, not one refused with 409."""
    body = fixture("sync-no-leader-during-failover.json")
    names = set()
    for stamp in ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"):
        body["parent"]["status"]["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "LeaderFound",
                "lastTransitionTime": stamp,
            }
        ]
        request = load_sync_request(body)
        event = event_for(request, reconcile(request, {}, now=NOW, timing=ResyncTiming()))
        assert event is not None
        names.add(event.name)
    assert len(names) == 2


def test_a_long_name_and_note_are_cut_to_the_api_servers_limits() -> None:
    request, outcome = _no_leader()
    long_request = dataclasses.replace(request, name="n" * 300)
    event = event_for(long_request, dataclasses.replace(outcome, message="m" * 2000))
    assert event is not None
    assert event.name == "n" * 200 + "." + event.name.rsplit(".", 1)[1]
    assert len(event.note) == 1000
