"""A Metacontroller stand-in loop that drives the real hook over HTTP.

A DEVELOPMENT STAND-IN for tests, the demo and the benchmarks: production runs real
Metacontroller with leader election. It speaks the real contract: customize once,
then sync; replies are applied by :func:`testbed.metacontroller.apply.apply_reply`;
``resyncAfterSeconds`` schedules the next call (else ``resyncPeriodSeconds``); a
non-200 or a broken reply changes nothing and backs off with Metacontroller's workqueue rate
limiter (:func:`testbed.metacontroller.ratelimit.default_controller_rate_limiter`: 5 ms doubling up
to
1000 s; a success forgets it); a related Pod change, a change
of our own child or a status write triggers an immediate sync.

Scheduled calls follow client-go's delaying queue (:class:`DelayedAdd`), not a timer that
each reply replaces: a later ``resyncAfterSeconds`` never postpones an earlier one that is
still waiting, and an immediate sync (an event) leaves the waiting one in place.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from testbed.kubernetes.pods import patroni_pod, running_status
from testbed.metacontroller.apply import Applied, HookError, World, apply_reply, check_reply
from testbed.metacontroller.gunicorn import credentials_for
from testbed.metacontroller.ratelimit import default_controller_rate_limiter

#: The one parent's key in the rate limiter.
PARENT_KEY = "parent"


@dataclass
class DelayedAdd:
    """One parent's entry in client-go's delaying queue (v0.36.3, the version Metacontroller
    v4.17.2 builds with; ``util/workqueue/delaying_queue.go``).

    ``AddAfter(key, d)`` sends ``readyAt = now + d`` to the waiting loop, whose ``insert``
    keeps an already waiting key's **earlier** ``readyAt`` ("update the time only if it would
    cause the item to be queued sooner"). When ``readyAt`` passes, the key is ``Add``-ed and
    its entry dropped, so it fires once. A plain ``Add`` (a watch event) does not touch the
    waiting entry: it still fires later. Metacontroller's ``resyncAfterSeconds``
    (``enqueueParentObjectAfter``) and its error retries (``AddRateLimited`` is ``AddAfter``
    with the rate limiter's delay) both go through here.
    """

    ready_at: float | None = None

    def add_after(self, now: float, delay: float) -> None:
        ready = now + delay
        if self.ready_at is None or ready < self.ready_at:
            self.ready_at = ready

    def remaining(self, now: float) -> float | None:
        """Seconds until the entry is due (``0`` if it is), ``None`` if nothing waits."""
        return None if self.ready_at is None else max(0.0, self.ready_at - now)

    def fire(self, now: float) -> bool:
        """Drop the entry if it is due (the waiting loop's ``Add``); whether it was."""
        if self.ready_at is not None and now >= self.ready_at:
            self.ready_at = None
            return True
        return False


@dataclass(frozen=True)
class SyncRecord:
    """One hook call as the stand-in saw it (monotonic times)."""

    started: float
    finished: float
    http_status: int | None
    error: str | None
    reason: str | None
    #: Pods the primary Service selects after this call was applied.
    selected: tuple[str, ...]
    resync_after: float | None
    service_present: bool
    applied: Applied | None = None
    #: Pods the read-only Service routes to after this call (its EndpointSlices).
    read_only: tuple[str, ...] = ()
    #: The reply's ``Ready`` message (why, when the reason is not ``LeaderFound``).
    message: str | None = None


@dataclass
class StandInStats:
    """Everything a test or benchmark wants to check afterwards."""

    records: list[SyncRecord] = field(default_factory=list)
    customize_calls: int = 0


class MetacontrollerStandIn:
    """Drives one PostgreSQLCluster ``world`` against the hook at ``hook_url``."""

    def __init__(
        self,
        hook_url: str,
        world: World,
        *,
        service_name: str,
        resync_period: float = 30.0,
        timeout: float = 5.0,
        on_record: Callable[[SyncRecord], None] | None = None,
        read_only_service: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers`` go with every call (``Authorization``); by default, those of the rig
        hook running at ``hook_url`` (:func:`testbed.metacontroller.gunicorn.credentials_for`)."""
        self.hook_url = hook_url.rstrip("/")
        self.world = world
        self.service_name = service_name
        self.resync_period = resync_period
        self.timeout = timeout
        #: client-go's rate limiter for the one parent (``AddRateLimited``/``Forget``).
        self.limiter = default_controller_rate_limiter()
        self.on_record = on_record
        self.read_only_service = read_only_service
        self.stats = StandInStats()
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._session = requests.Session()
        self._session.trust_env = False
        self._session.headers.update(
            credentials_for(self.hook_url) if headers is None else dict(headers)
        )
        self.related_selector: dict[str, str] | None = None
        #: The parent's waiting ``AddAfter`` (read by tests; written by the loop only).
        self.scheduled = DelayedAdd()

    # ----------------------------------------------------------------- control

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="metacontroller-standin", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._session.close()

    def __enter__(self) -> MetacontrollerStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def trigger(self) -> None:
        """A watched object changed (related Pod, child, parent): sync now."""
        self._wake.set()

    def update_pods(self, pods: dict[str, dict[str, Any]]) -> None:
        """Replace the related Pods; a changed Pod triggers a sync like an informer event."""
        with self.lock:
            changed = pods != self.world.pods
            self.world.pods = copy.deepcopy(pods)
        if changed:
            self.trigger()

    # -------------------------------------------------------------------- loop

    def _run(self) -> None:
        self._customize()
        now = True  # the first sync: the parent's add event
        while not self._stop.is_set():
            timed_out = False
            if not now:
                # Wake for an event (trigger) or when the waiting entry is due.
                timed_out = not self._wake.wait(self.scheduled.remaining(time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            # The entry is due (also when an event came with it: one sync for both, the
            # queue's dedup); an event before it leaves it waiting.
            self.scheduled.fire(math.inf if timed_out else time.monotonic())
            now = False
            record = self.sync_once()
            if record.error is not None:
                failed = time.monotonic()
                self.scheduled.add_after(failed, self.limiter.when(PARENT_KEY, failed))
                continue
            self.limiter.forget(PARENT_KEY)
            applied = record.applied
            assert applied is not None
            self.scheduled.add_after(record.finished, record.resync_after or self.resync_period)
            if applied.status_changed or applied.changed_children:
                now = True  # our own writes are watch events too

    def _customize(self) -> None:
        with self.lock:
            body = self.world.customize_request()
        try:
            response = self._session.post(
                f"{self.hook_url}/customize", json=body, timeout=self.timeout
            )
            self.stats.customize_calls += 1
            rules = response.json().get("relatedResources", []) if response.ok else []
        except (requests.RequestException, ValueError):
            rules = []
        for rule in rules:
            if rule.get("resource") == "pods":
                self.related_selector = dict(rule.get("labelSelector", {}).get("matchLabels", {}))
            if rule.get("resource") == "jobs" and self.world.jobs is None:
                self.world.jobs = {}  # related from now on (the stand-in runs no Jobs)

    def sync_once(self) -> SyncRecord:
        """One sync call, applied (or not) exactly as Metacontroller would."""
        with self.lock:
            body = self.world.sync_request()
            if self.related_selector is not None:
                body["related"]["Pod.v1"] = {
                    name: pod
                    for name, pod in body["related"]["Pod.v1"].items()
                    if all(
                        pod["metadata"].get("labels", {}).get(k) == v
                        for k, v in self.related_selector.items()
                    )
                }
        started = time.monotonic()
        status: int | None = None
        error: str | None = None
        applied: Applied | None = None
        reason: str | None = None
        message: str | None = None
        try:
            response = self._session.post(f"{self.hook_url}/sync", json=body, timeout=self.timeout)
            status = response.status_code
            reply = check_reply(response.status_code, response.content)
            with self.lock:
                applied = apply_reply(self.world, reply)
            ready = _ready_condition(reply)
            reason = str(ready["reason"]) if "reason" in ready else None
            message = str(ready["message"]) if "message" in ready else None
        except (requests.RequestException, HookError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        finished = time.monotonic()
        with self.lock:
            selected = tuple(self.world.selected_pods(self.service_name))
            present = self.service_name in self.world.services
            read_only = (
                tuple(self.world.endpoint_pods(self.read_only_service))
                if self.read_only_service is not None
                else ()
            )
        record = SyncRecord(
            started=started,
            finished=finished,
            http_status=status,
            error=error,
            reason=reason,
            selected=selected,
            resync_after=applied.resync_after if applied else None,
            service_present=present,
            applied=applied,
            read_only=read_only,
            message=message,
        )
        self.stats.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record


def _ready_condition(reply: dict[str, Any]) -> dict[str, Any]:
    status = reply.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return dict(condition)
    return {}


def make_pod(
    name: str,
    ip: str,
    *,
    labels: dict[str, str],
    namespace: str = "databases",
    ready: bool = True,
    resource_version: int = 1,
) -> dict[str, Any]:
    """A StatefulSet Pod as the informer would deliver it: the test bed's one member Pod
    (:func:`testbed.kubernetes.pods.patroni_pod`, unscheduled, no probe: nothing runs it)
    with the status a kubelet would have written."""
    pod = patroni_pod(name, namespace, labels, node=None, readiness=None)
    pod["metadata"]["resourceVersion"] = str(resource_version)
    pod["status"] = running_status(ip, ready=ready)
    return pod
