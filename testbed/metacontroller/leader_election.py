"""Leader election on a ``coordination.k8s.io/v1`` Lease, as Metacontroller v4.17.2 runs it.

Metacontroller builds a controller-runtime manager with ``LeaderElection`` and the lock, id and
namespace of its flags, and nothing else (``pkg/server/server.go`` ``New``;
``pkg/cmd/metacontroller/main.go``): so controller-runtime v0.24.1's defaults hold
(``pkg/manager/internal.go``: ``defaultLeaseDuration`` 15 s, ``defaultRenewDeadline`` 10 s,
``defaultRetryPeriod`` 2 s) and ``LeaderElectionReleaseOnCancel`` is false: a stopped leader
does NOT give the Lease back. Its identity is ``<hostname>_<uuid>``, new for every process
(``pkg/leaderelection/leader_election.go``), and its lease client times out after
``max(RenewDeadline/2, 1 s)`` = 5 s. Losing the lease calls ``OnStoppedLeading``, which ends
``Manager.Start`` with "leader election lost"; ``main`` then ``os.Exit(1)``.

The election itself is client-go v0.36.3's ``tools/leaderelection/leaderelection.go``:

* ``acquire``: ``tryAcquireOrRenew`` at once, then every ``RetryPeriod`` x (1 + up to
  ``JitterFactor`` 1.2) after the previous attempt ended (``wait.JitterUntil``, sliding), until
  it succeeds;
* ``renew``: ``tryAcquireOrRenew`` at once and every ``RetryPeriod`` until one succeeds, for at
  most ``RenewDeadline`` (``wait.PollUntilContextTimeout``); then ``RetryPeriod`` later again
  (``wait.Until``). A poll that ends without success ends the leadership;
* ``tryAcquireOrRenew``: a leader whose observed lease is still valid first updates
  optimistically (PUT of the last Lease it holds); otherwise GET (404: create), and a record
  that differs from the last one observed becomes the observed record, **at the observer's own
  clock**; a record held by another identity is taken only once ``observedTime +
  leaseDurationSeconds`` has passed. So a new candidate waits a full lease duration after it
  FIRST OBSERVES an unchanged record, however old the record's ``renewTime`` is.

The decisions are pure functions of plain values (:func:`observe`, :func:`lease_valid`,
:func:`claim`, :func:`acquire_delay`, :func:`renew_deadline_passed`); :class:`LeaderElector`
is the thin shell that does the GET/POST/PUT against the API server and runs the two loops.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import requests

from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path

LOG = logging.getLogger("standin.leader_election")

#: controller-runtime v0.24.1 ``pkg/manager/internal.go`` (Metacontroller sets none of them).
LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
#: client-go ``tools/leaderelection/leaderelection.go`` ``JitterFactor``.
JITTER_FACTOR = 1.2
#: Metacontroller's ``--leader-election-id`` default.
LEASE_NAME = "metacontroller"


@dataclass(frozen=True)
class Timings:
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD
    jitter_factor: float = JITTER_FACTOR

    @property
    def request_timeout(self) -> float:
        """controller-runtime's lease client timeout: ``max(RenewDeadline/2, 1 s)``."""
        return max(self.renew_deadline / 2, 1.0)

    @property
    def max_acquire_interval(self) -> float:
        """The longest wait between two attempts to acquire."""
        return self.retry_period * (1 + self.jitter_factor)


DEFAULT_TIMINGS = Timings()


@dataclass(frozen=True)
class LeaseRecord:
    """client-go's ``LeaderElectionRecord`` as a Lease's spec carries it (times as the
    server's MicroTime strings; they are compared, never parsed)."""

    holder: str
    lease_duration_seconds: int
    acquire_time: str
    renew_time: str
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> LeaseRecord:
        return cls(
            str(spec.get("holderIdentity") or ""),
            int(spec.get("leaseDurationSeconds") or 0),
            str(spec.get("acquireTime") or ""),
            str(spec.get("renewTime") or ""),
            int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True)
class Observed:
    """The record an elector last saw change, and when it first saw it (its own clock)."""

    record: LeaseRecord
    at: float


def is_leader(observed: Observed | None, identity: str) -> bool:
    return observed is not None and observed.record.holder == identity


def lease_valid(observed: Observed | None, now: float) -> bool:
    """``isLeaseValid``: the observed record's duration has not passed since it was seen."""
    return observed is not None and observed.at + observed.record.lease_duration_seconds > now


def observe(observed: Observed | None, fetched: LeaseRecord, now: float) -> Observed:
    """Step 3 of ``tryAcquireOrRenew``: an unchanged record keeps its first observation time;
    any change (a renewal, a new holder) restarts the clock."""
    if observed is not None and observed.record == fetched:
        return observed
    return Observed(fetched, now)


def claim(
    observed: Observed,
    identity: str,
    now: float,
    wall: str,
    lease_duration: float,
) -> LeaseRecord | None:
    """Steps 3-4 of ``tryAcquireOrRenew`` after the GET (``observed`` already updated by
    :func:`observe`): the record to write, or ``None`` while another holder's lease is valid.
    A renewal keeps the acquire time and the transitions; a takeover counts one more."""
    current = observed.record
    leader = current.holder == identity
    if current.holder and lease_valid(observed, now) and not leader:
        return None
    return LeaseRecord(
        identity,
        int(lease_duration),
        current.acquire_time if leader else wall,
        wall,
        current.transitions if leader else current.transitions + 1,
    )


def fresh(identity: str, wall: str, lease_duration: float) -> LeaseRecord:
    """The record of a Lease that does not exist yet (created with zero transitions)."""
    return LeaseRecord(identity, int(lease_duration), wall, wall, 0)


def renewal(observed: Observed, identity: str, wall: str, lease_duration: float) -> LeaseRecord:
    """The fast path's record: the observed one renewed (same acquire time, transitions)."""
    return replace(
        observed.record,
        holder=identity,
        lease_duration_seconds=int(lease_duration),
        renew_time=wall,
    )


def acquire_delay(timings: Timings, draw: float) -> float:
    """``wait.Jitter(RetryPeriod, JitterFactor)`` for a uniform ``draw`` in [0, 1)."""
    return timings.retry_period * (1 + timings.jitter_factor * draw)


def renew_deadline_passed(poll_started: float, now: float, timings: Timings) -> bool:
    """The renew poll gives up ``RenewDeadline`` after it started."""
    return now - poll_started >= timings.renew_deadline


def micro_time(moment: datetime) -> str:
    """A MicroTime as the API server writes it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_identity() -> str:
    """controller-runtime's: ``<hostname>_<uuid>``, new for every process."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


class LeaderElector:
    """One candidate's loops against the API server (``rest``), for the Lease ``name`` in
    ``namespace``. :meth:`run` blocks: it acquires, calls ``on_started_leading`` (in a thread
    of its own, as client-go does), renews until a renew poll fails or ``stop`` is set, then
    calls ``on_stopped_leading`` (whatever the reason, as ``Run``'s defer). It never releases
    the Lease (Metacontroller's ``ReleaseOnCancel`` is false)."""

    def __init__(
        self,
        rest: KubeRest,
        namespace: str,
        *,
        name: str = LEASE_NAME,
        identity: str | None = None,
        timings: Timings = DEFAULT_TIMINGS,
        on_started_leading: Callable[[], None] = lambda: None,
        on_stopped_leading: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.rest = rest
        self.path = resource_path("coordination.k8s.io/v1", "leases", namespace, name)
        self.collection = resource_path("coordination.k8s.io/v1", "leases", namespace)
        self.namespace, self.name = namespace, name
        self.identity = identity or new_identity()
        self.timings = timings
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.clock, self.draw = clock, draw
        self.observed: Observed | None = None
        #: The last Lease object read or written (its resourceVersion makes a PUT conditional).
        self._lease: dict[str, Any] | None = None
        self._deadline: float | None = None
        #: ``(monotonic time, event)``: ``acquired``, ``renew-failed``, ``lost``, ``stopped``.
        self.events: list[tuple[float, str]] = []
        self.leading = threading.Event()

    # -- the loops -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> bool:
        """Acquire, lead, renew. True if the lease was lost (the process must exit)."""
        try:
            if not self._acquire(stop):
                return False
            self.leading.set()
            self.events.append((self.clock(), "acquired"))
            threading.Thread(
                target=self.on_started_leading, name=f"leading-{self.identity}", daemon=True
            ).start()
            lost = self._renew(stop)
            self.leading.clear()
            self.events.append((self.clock(), "lost" if lost else "stopped"))
            return lost
        finally:
            self.on_stopped_leading()

    def _acquire(self, stop: threading.Event) -> bool:
        LOG.info(
            "%s: attempting to acquire leader lease %s/%s...",
            self.identity,
            self.namespace,
            self.name,
        )
        while not stop.is_set():
            if self.try_acquire_or_renew():
                LOG.info(
                    "%s: successfully acquired lease %s/%s",
                    self.identity,
                    self.namespace,
                    self.name,
                )
                return True
            if stop.wait(acquire_delay(self.timings, self.draw())):
                break
        return False

    def _renew(self, stop: threading.Event) -> bool:
        """``wait.Until(poll, RetryPeriod)``: each poll tries at once, then on every tick of
        ``RetryPeriod`` from its start, until one attempt succeeds; a tick at or after
        ``RenewDeadline`` finds the poll's context done (no attempt): the lease is lost."""
        while True:
            started = self.clock()
            deadline = started + self.timings.renew_deadline
            tick = started
            while not self.try_acquire_or_renew(deadline):
                tick += self.timings.retry_period
                now = self.clock()
                if tick >= deadline or renew_deadline_passed(started, now, self.timings):
                    if stop.wait(max(0.0, deadline - now)):
                        return False
                    LOG.warning(
                        "%s: failed to renew lease %s/%s: timed out; stopped leading",
                        self.identity,
                        self.namespace,
                        self.name,
                    )
                    self.events.append((self.clock(), "renew-failed"))
                    return True
                if stop.wait(max(0.0, tick - now)):
                    return False
            if stop.wait(self.timings.retry_period):
                return False

    # -- one attempt -----------------------------------------------------------------------
    def try_acquire_or_renew(self, deadline: float | None = None) -> bool:
        """One ``tryAcquireOrRenew``; inside a renew poll every request is also cut at the
        poll's ``deadline`` (client-go passes the poll's context down to the lock)."""
        self._deadline = deadline
        now = self.clock()
        wall = micro_time(datetime.now(UTC))
        duration = self.timings.lease_duration
        if is_leader(self.observed, self.identity) and lease_valid(self.observed, now):
            assert self.observed is not None and self._lease is not None
            if self._put(renewal(self.observed, self.identity, wall, duration), now):
                return True
        try:
            lease = self.rest.request("GET", self.path, timeout=self._timeout())
        except KubeApiError as error:
            if error.status != 404:
                return False
            return self._create(fresh(self.identity, wall, duration), now)
        except requests.RequestException:
            return False
        self._lease = lease
        self.observed = observe(self.observed, LeaseRecord.from_spec(lease.get("spec") or {}), now)
        record = claim(self.observed, self.identity, now, wall, duration)
        return record is not None and self._put(record, now)

    def _timeout(self) -> float:
        """The lease client's timeout, cut at the renew poll's deadline (at least 10 ms)."""
        timeout = self.timings.request_timeout
        if self._deadline is not None:
            timeout = min(timeout, self._deadline - self.clock())
        return max(timeout, 0.01)

    def _put(self, record: LeaseRecord, now: float) -> bool:
        assert self._lease is not None
        body = {**self._lease, "spec": {**(self._lease.get("spec") or {}), **record.to_spec()}}
        try:
            self._lease = self.rest.request("PUT", self.path, body=body, timeout=self._timeout())
        except (KubeApiError, requests.RequestException) as error:
            LOG.info("%s: failed to update lease: %s", self.identity, error)
            return False
        self.observed = Observed(record, now)
        return True

    def _create(self, record: LeaseRecord, now: float) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        try:
            self._lease = self.rest.request(
                "POST", self.collection, body=body, timeout=self._timeout()
            )
        except (KubeApiError, requests.RequestException) as error:
            LOG.info("%s: failed to create lease: %s", self.identity, error)
            return False
        self.observed = Observed(record, now)
        return True
