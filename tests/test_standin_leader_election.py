"""The stand-in elects a leader and is restarted the way Metacontroller is.

Pure parts with plain values: client-go v0.36.3's ``tryAcquireOrRenew`` decisions
(:mod:`testbed.metacontroller.leader_election`) and the kubelet v1.36.3 CrashLoopBackOff
(:mod:`testbed.metacontroller.supervisor`); then the elector's I/O against the real API server (a
Lease in
a namespace of the session's control plane): one leader, a stopped leader does not release
its Lease, and the standby takes it only a lease duration after it first saw it unchanged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.leader_election import (
    JITTER_FACTOR,
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    LeaderElector,
    LeaseRecord,
    Observed,
    Timings,
    acquire_delay,
    claim,
    fresh,
    is_leader,
    lease_valid,
    observe,
    renew_deadline_passed,
    renewal,
)
from testbed.metacontroller.supervisor import (
    INITIAL_BACKOFF,
    MAX_BACKOFF,
    BackOffEntry,
    Supervisor,
    jittered,
    restart_delay,
)

A, B = "host_a", "host_b"
T0 = "2026-12-04T21:00:00.000000Z"
T1 = "2026-12-04T21:00:02.000000Z"


def held(holder: str = A, renew: str = T0, transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(holder, 15, T0, renew, transitions)


# -- the election's decisions ----------------------------------------------------------------
def test_metacontrollers_timings_are_controller_runtimes_defaults() -> None:
    timings = Timings()
    assert (LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, JITTER_FACTOR) == (15.0, 10.0, 2.0, 1.2)
    assert timings.request_timeout == 5.0  # max(RenewDeadline/2, 1 s)
    assert Timings(renew_deadline=1.0).request_timeout == 1.0
    assert timings.max_acquire_interval == pytest.approx(4.4)


def test_a_lease_is_valid_for_its_duration_after_it_was_observed() -> None:
    assert not lease_valid(None, 0.0)
    seen = Observed(held(), 100.0)
    assert lease_valid(seen, 100.0) and lease_valid(seen, 114.99)
    assert not lease_valid(seen, 115.0), "observedTime + duration is not After(now): expired"
    assert not lease_valid(seen, 200.0)


def test_an_unchanged_record_keeps_its_first_observation_time() -> None:
    first = observe(None, held(), 10.0)
    assert first == Observed(held(), 10.0)
    assert observe(first, held(), 24.0) is first, "the same record seen again: clock not reset"
    renewed = observe(first, held(renew=T1), 12.0)
    assert renewed == Observed(held(renew=T1), 12.0), "a renewal restarts the clock"
    taken = observe(renewed, held(B), 13.0)
    assert taken.at == 13.0 and taken.record.holder == B


def test_another_holders_valid_lease_is_not_taken() -> None:
    assert claim(Observed(held(A), 10.0), B, 24.9, T1, 15) is None


def test_an_expired_lease_is_taken_over_with_one_more_transition() -> None:
    record = claim(Observed(held(A, transitions=3), 10.0), B, 25.0, T1, 15)
    assert record == LeaseRecord(B, 15, T1, T1, 4)


def test_the_holder_renews_keeping_its_acquire_time_and_transitions() -> None:
    record = claim(Observed(held(A, transitions=3), 10.0), A, 11.0, T1, 15)
    assert record == LeaseRecord(A, 15, T0, T1, 3)
    # the holder renews even when its own observation has run out (the slow path)
    assert claim(Observed(held(A, transitions=3), 10.0), A, 99.0, T1, 15) == record
    fast = renewal(Observed(held(A, transitions=3), 10.0), A, T1, 15)
    assert fast == record


def test_a_released_lease_has_no_holder_and_is_taken_at_once() -> None:
    released = LeaseRecord("", 1, T0, T0, 2)
    assert claim(Observed(released, 10.0), B, 10.0, T1, 15) == LeaseRecord(B, 15, T1, T1, 3)


def test_a_missing_lease_is_created_with_no_transition() -> None:
    assert fresh(A, T0, 15) == LeaseRecord(A, 15, T0, T0, 0)


def test_a_new_candidate_waits_a_full_lease_after_first_seeing_an_old_record() -> None:
    """The record was last renewed long ago (its holder died): the new candidate still
    waits 15 s from ITS first observation, attempt after attempt (every 2-4.4 s)."""
    stale = held(A, renew="2026-12-04T20:00:00.000000Z")
    observed: Observed | None = None
    taken_at = None
    now = 1000.0
    for draw in [0.0, 0.5, 0.99, 0.2, 0.7, 0.1, 0.0, 0.3]:
        observed = observe(observed, stale, now)
        if claim(observed, B, now, T1, 15) is not None:
            taken_at = now
            break
        now += acquire_delay(Timings(), draw)
    assert taken_at is not None
    assert 1015.0 <= taken_at <= 1015.0 + Timings().max_acquire_interval


def test_is_leader_compares_the_observed_holder() -> None:
    assert not is_leader(None, A)
    assert is_leader(Observed(held(A), 0.0), A) and not is_leader(Observed(held(A), 0.0), B)


def test_the_acquire_period_is_jittered_up_to_2_2_times() -> None:
    assert acquire_delay(Timings(), 0.0) == 2.0
    assert acquire_delay(Timings(), 0.5) == pytest.approx(3.2)
    assert acquire_delay(Timings(), 0.999) < 4.4


def test_the_renew_poll_gives_up_at_the_renew_deadline() -> None:
    assert not renew_deadline_passed(100.0, 109.99, Timings())
    assert renew_deadline_passed(100.0, 110.0, Timings())


def test_lease_records_round_trip_through_a_lease_spec() -> None:
    record = LeaseRecord(A, 15, T0, T1, 7)
    assert LeaseRecord.from_spec(record.to_spec()) == record
    assert LeaseRecord.from_spec({}) == LeaseRecord("", 0, "", "", 0)


class FlakyServer:
    """A Lease API that answers until ``down`` is set, then refuses every call."""

    def __init__(self) -> None:
        self.lease: dict[str, object] | None = None
        self.down = False
        self.calls: list[tuple[float, str]] = []

    def request(self, method: str, path: str, **kwargs: object) -> dict[str, object]:
        self.calls.append((time.monotonic(), method))
        if self.down:
            raise requests.ConnectionError("refused")
        if method == "GET":
            if self.lease is None:
                raise KubeApiError(404, "NotFound", "no lease")
            return dict(self.lease)
        body = kwargs["body"]
        assert isinstance(body, dict)
        self.lease = dict(body)
        return dict(body)


def test_a_leader_exits_when_renewals_fail_until_the_renew_deadline() -> None:
    """Renewals tried at once and every retry period from the poll's start; none at the
    deadline; then ``run`` returns True (Metacontroller's process exits) and the Lease was
    never released (no write after the cut)."""
    timings = Timings(lease_duration=3.0, renew_deadline=1.0, retry_period=0.25)
    server = FlakyServer()
    elector = LeaderElector(server, "ns", identity=A, timings=timings)  # type: ignore[arg-type]
    stop = threading.Event()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(elector.run(stop)), daemon=True)
    thread.start()
    assert elector.leading.wait(2)
    time.sleep(0.6)  # a few renewals
    assert server.lease is not None and server.calls[-1][1] == "PUT"
    server.down = True
    cut = time.monotonic()
    thread.join(3)
    stop.set()
    assert result == [True]
    failed = [at for at, _ in server.calls if at >= cut]
    poll = failed[0]
    # each attempt: the optimistic PUT (the observed lease is still valid), then the GET;
    # at 0, 0.25, 0.5 and 0.75 s of the poll, none at the deadline
    puts = [at - poll for at, method in server.calls if at >= cut and method == "PUT"]
    gets = [at - poll for at, method in server.calls if at >= cut and method == "GET"]
    assert len(puts) == len(gets) == 4, server.calls
    assert [round(at * 4) for at in puts] == [0, 1, 2, 3], puts
    lost = next(at for at, event in elector.events if event == "renew-failed")
    assert 0.95 <= lost - poll <= 1.2
    assert not elector.leading.is_set()
    assert server.lease["spec"]["holderIdentity"] == A  # type: ignore[index]


# -- the kubelet's CrashLoopBackOff ----------------------------------------------------------
def test_crash_loop_delays_are_0_then_10_s_doubling_to_300_s() -> None:
    assert (INITIAL_BACKOFF, MAX_BACKOFF) == (10.0, 300.0)
    entry = None
    now, delays = 0.0, []
    for _ in range(9):
        now += 5.0  # it runs 5 s, then exits
        delay, entry = restart_delay(entry, now)
        delays.append(delay)
        now += delay
    assert delays == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0]


def test_the_backoff_starts_over_after_ten_minutes_without_an_exit() -> None:
    delay, entry = restart_delay(BackOffEntry(80.0, 1000.0), 1000.0 + 600.0)
    assert delay == 80.0, "600 s is not more than 2 x max"
    delay, entry = restart_delay(BackOffEntry(80.0, 1000.0), 1000.0 + 600.1)
    assert delay == 0.0 and entry == BackOffEntry(10.0, 1600.1)


def test_the_pod_workers_jitter_adds_up_to_half_the_delay() -> None:
    assert jittered(10.0, 0.0) == 10.0
    assert jittered(10.0, 0.999) < 15.0


@dataclass
class FakeContainer:
    name: str
    code: int | None = None
    started: list[float] = field(default_factory=list)

    def start(self) -> None:
        self.started.append(time.monotonic())

    def exit_code(self) -> int | None:
        return self.code

    def stop(self) -> None:
        if self.code is None:
            self.code = 0

    def kill(self) -> None:
        self.code = 137

    def leading(self) -> bool:
        return self.code is None

    def ready(self) -> bool:
        return self.code is None

    def describe(self) -> str:
        return f"{self.name}: {'running' if self.code is None else f'exited {self.code}'}"


def test_the_supervisor_restarts_at_once_then_after_the_backoff_and_says_so() -> None:
    made: list[FakeContainer] = []

    def make(replica: int) -> FakeContainer:
        made.append(FakeContainer(f"c{replica}-{len(made)}"))
        return made[-1]

    supervisor = Supervisor(make, 1, initial=0.6, maximum=5.0, draw=lambda: 0.0).start()
    try:
        made[0].code = 1
        _wait(lambda: len(made) == 2, 2.0)
        first = made[1].started[0]
        made[1].code = 1
        _wait(lambda: "waiting in back-off" in supervisor.describe(), 1.0)
        assert "exited with 1; back-off 1 s" in supervisor.describe()
        _wait(lambda: len(made) == 3, 3.0)
        assert made[2].started[0] - first >= 0.6
        supervisor.replace(0)  # a new pod: a new key, nothing inherited
        assert made[2].code == 0 and len(made) == 4
        made[3].code = 1
        _wait(lambda: len(made) == 5, 0.5)  # restarted at once: no back-off
    finally:
        supervisor.stop()
    assert [m.code for m in made] == [1, 1, 0, 1, 0]


def test_the_supervisor_names_the_leader_and_a_missing_one() -> None:
    containers = [FakeContainer("a"), FakeContainer("b")]
    supervisor = Supervisor(lambda i: containers[i], 2)
    containers[0].code = 1  # exited: not the leader even if it says so
    assert supervisor.leader() == 1
    containers[1].code = 0
    with pytest.raises(TimeoutError, match="no Metacontroller replica leads"):
        supervisor.wait_leader(0.3)


def _wait(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


# -- the elector against the real API server ------------------------------------------------
FAST = Timings(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)


@pytest.fixture
def lease_rest(control_plane: ControlPlane, kube_namespace: str) -> Iterator[KubeRest]:
    rest = KubeRest.from_kubeconfig(control_plane.admin_kubeconfig)
    try:
        yield rest
    finally:
        rest.close()


@pytest.mark.kube
@pytest.mark.slow
def test_one_leader_no_release_on_stop_and_a_full_lease_before_takeover(
    lease_rest: KubeRest, kube_namespace: str
) -> None:
    stops = {name: threading.Event() for name in (A, B)}
    electors = {
        name: LeaderElector(lease_rest, kube_namespace, identity=name, timings=FAST)
        for name in (A, B)
    }
    threads = {
        name: threading.Thread(target=electors[name].run, args=(stops[name],), daemon=True)
        for name in (A, B)
    }
    threads[A].start()
    assert electors[A].leading.wait(5), "the first candidate did not create and take the Lease"
    threads[B].start()
    path = resource_path("coordination.k8s.io/v1", "leases", kube_namespace, "metacontroller")
    try:
        time.sleep(2 * FAST.lease_duration)  # A renews; B must stay a standby throughout
        assert not electors[B].leading.is_set()
        assert lease_rest.get(path)["spec"]["holderIdentity"] == A
        stops[A].set()
        threads[A].join(5)
        stopped = time.monotonic()
        spec = lease_rest.get(path)["spec"]
        assert spec["holderIdentity"] == A, "a stopped leader released its Lease"
        assert spec["leaseDurationSeconds"] == 3
        assert electors[B].leading.wait(FAST.lease_duration + 2 * FAST.max_acquire_interval)
        took = time.monotonic() - stopped
        spec = lease_rest.get(path)["spec"]
        assert spec["holderIdentity"] == B and spec["leaseTransitions"] == 1
        # B last saw A's record change at most one attempt after A's last renewal
        assert took >= FAST.lease_duration - FAST.max_acquire_interval - FAST.retry_period
    finally:
        for stop in stops.values():
            stop.set()
        for thread in threads.values():
            thread.join(5)


@pytest.mark.kube
@pytest.mark.slow
def test_a_leader_that_cannot_renew_stops_leading_at_the_renew_deadline(
    lease_rest: KubeRest, kube_namespace: str
) -> None:
    """Renewals refused (the Lease changed under it by another writer, as an API server it
    cannot reach would refuse them all): ``run`` returns True (the process must exit)
    within the renew deadline plus one retry period."""
    stop = threading.Event()
    elector = LeaderElector(lease_rest, kube_namespace, identity=A, timings=FAST)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(elector.run(stop)), daemon=True)
    thread.start()
    assert elector.leading.wait(5)
    elector.path = elector.path + "-gone"  # every renewal now meets a 404 on GET and PUT
    elector.collection = "/apis/coordination.k8s.io/v1/namespaces/no-such-namespace/leases"
    cut = time.monotonic()
    thread.join(FAST.renew_deadline + 2 * FAST.retry_period + 5)
    assert result == [True], "the leader kept leading without renewing"
    assert time.monotonic() - cut <= FAST.renew_deadline + 2 * FAST.retry_period + 1
    assert [event for _, event in elector.events] == ["acquired", "renew-failed", "lost"]
    stop.set()


# -- the bounds the fault tests hold routing to ---------------------------------------------
def test_the_lease_bounds_follow_from_the_timings() -> None:
    from tests import control_path_bounds as bounds

    assert round(bounds.TAKEOVER, 6) == 23.8
    assert round(bounds.FRESH_TAKEOVER, 6) == 19.4
    assert bounds.EXIT_AFTER == 12.0
    assert bounds.leader_killed(5.0, 4.5) == pytest.approx(33.3)
    assert bounds.rolling_update(5.0, 4.5) == pytest.approx(33.3)
    assert bounds.all_restarted(5.0, 4.5) == pytest.approx(28.9)
    # under the renew deadline the leader stays: only the reconnect and one sync
    assert bounds.apiserver_down(8.9, 12.0, 5.0, 4.5) == 12.0
    # longer: the standby may see the leader's last renewal only after the outage
    assert bounds.apiserver_down(38.0, 12.0, 5.0, 4.5) == pytest.approx(33.3)
    assert bounds.apiserver_down(38.0, 34.5, 5.0, 4.5) == 34.5
    assert bounds.paused_for(5.0, 5.0, 4.5) == 4.5
    assert bounds.paused_for(10.0, 5.0, 4.5) == pytest.approx(33.3)
