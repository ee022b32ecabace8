"""Fleet benchmark: N Patroni clusters behind one Metacontroller queue.

Run ``python -m bench.fleet`` for the full table (``--help`` for single rows). What it
models is Metacontroller v4.17.2, as read in its source (paths in its repository):

* One work queue per CompositeController: client-go's rate-limiting FIFO without
  priority (``pkg/controller/composite/controller.go`` ``newParentController``). A key
  is in the queue at most once (client-go ``queue.go``: the ``dirty`` set), a key being
  synced is not handed to a second worker but re-queued when its sync ends
  (``processing``), and ``AddAfter`` keeps the earlier of two pending times
  (``delaying_queue.go`` ``insert``, client-go v0.36.3 as Metacontroller v4.17.2's go.mod
  pins it): a waiting entry fires once, whether or not the key was queued meanwhile.
* ``--workers`` goroutines drain it (``processNextWorkItem``).
* Every API request of the install goes through one client-go token bucket
  (``--client-go-qps``, ``--client-go-burst``; ``pkg/cmd/metacontroller/main.go`` sets
  them on the REST config; client-go waits for a token, FIFO, blocking the caller).
* A sync: the hook call (no API request: the parent, children and related Pods come
  from informer caches), then the children: a Service PUT only when it differs, then the
  status: one live GET always, a PUT only when the status changed
  (``updateParentStatus`` → ``AtomicStatusUpdate``).
* ``resyncAfterSeconds`` is ``AddAfter`` (``enqueueParentObjectAfter``).
* Our status PUT is a parent update event, our Service PUT a child event: each
  enqueues the parent once more (``updateParentObject``, ``onChildUpdate``), after a
  watch delay.
* A related Pod's change enqueues its parent at once (customize ``findRelatedParents``).
* ``resyncPeriodSeconds`` set: a ticker of that period (raised to 1 s when below, so
  ``0`` means every second) lists every parent from the cache and enqueues each
  (``pkg/dynamic/informer/informer.go`` ``eventHandler.start``/``resync``); the ticker
  runs only when the period is below ``--cache-flush-interval``. Absent: no ticker, but
  the shared informer's own resync at ``--cache-flush-interval`` (30 min) does the same
  (``AddEventHandler`` → ``addHandler`` with the relist period). Both are modelled.
* With shards, each install has its own queue, workers and bucket, and enqueues only
  the parents its ``parentResource.labelSelector`` matches (``enqueueParentObject``).

The hook is either REAL (gunicorn pods under ``hooks/gunicorn_conf.py``, the recorded
request bodies, the fake fleet of ``bench/fakepatroni.py``, in real time) or MODELLED
(a virtual clock; each sync holds one of the hook pods' cores for the hook CPU per sync
and lasts a sample of the sync latencies, both measured on the real hook at the start of
the same run). The API server is always modelled: a GET takes ``API_GET`` seconds, a PUT
``API_PUT``, a watch event arrives ``WATCH_DELAY`` after the write.

The lag of a switchover is measured from the moment the new leader answers 200 on the
health path to the moment Metacontroller's Service PUT selecting it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import selectors
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hooks.switchover import spread_resync

#: Modelled API server: latency of a GET and a PUT (s), and of a watch event after a write.
API_GET = 0.002
API_PUT = 0.004
WATCH_DELAY = 0.005
#: Patroni's loop_wait: a busy Kubernetes-DCS member patches its Pod about this often.
BUSY_PERIOD = 10.0
#: A graceful stop of the leader: its Pod changes at once, a new leader answers 200 after.
STOP_GAP = 3.0
CACHE_FLUSH = 1800.0
#: The hook's overall probe deadline (PGFH_PROBE_DEADLINE_SECONDS).
PROBE_DEADLINE = 2.0


# ------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Metacontroller:
    """One Metacontroller install's flags and the CompositeController's resync period."""

    workers: int = 10
    qps: float = 50.0
    burst: int = 100
    #: ``resyncPeriodSeconds``; None: absent.
    resync_period: float | None = 30.0
    cache_flush: float = CACHE_FLUSH
    #: K installs, each with these flags, the fleet split evenly between them.
    shards: int = 1


@dataclass(frozen=True)
class Policy:
    """What the hook asks for in ``resyncAfterSeconds``.

    ``poll``: healthy resync of a cluster that only polling can follow (etcd/Consul DCS,
    or event-driven detection off). ``event_resync``: healthy resync of a cluster whose
    Pods carry Patroni's role label (``spec.switchover.eventDrivenResyncSeconds``);
    ``None``: no event-driven mode (today's hook). ``from_reply``: in real mode, take the
    hook's own reply (today's hook: 1 s / 0.3 s) instead of these numbers.
    """

    poll: float = 1.0
    event_resync: float | None = None
    degraded: float = 0.3
    from_reply: bool = True
    #: Phase-spread healthy resyncs (the hook's, :func:`hooks.switchover.spread_resync`,
    #: called here): the next healthy sync of a cluster falls on its own slot of the
    #: period (a hash of its UID), between half a period and one and a half periods away,
    #: so a fleet synced all at once (after a Metacontroller restart) does not stay in one
    #: clump. ``False``: the hook before it (a fixed period): today's rows.
    spread: bool = False


@dataclass(frozen=True)
class Mix:
    """The fleet: a share on etcd (polled), the rest on the Kubernetes DCS with role
    labels, a share of those busy (their Pods change every ``BUSY_PERIOD``)."""

    polled: float = 0.5
    busy: float = 0.2
    members: int = 3
    #: Of the switchovers: the share that is a graceful stop of the leader (a Pod event
    #: on every cluster), the rest planned switchovers (a Pod event only on the
    #: Kubernetes DCS, where the role labels move).
    stops: float = 0.3
    #: Share of clusters with one member that never answers (its node lost): every sync of
    #: such a cluster lasts the hook's probe deadline (modelled rows only).
    hung: float = 0.0


@dataclass(frozen=True)
class Row:
    """One row of the table."""

    label: str
    n: int
    mc: Metacontroller
    policy: Policy
    mix: Mix = Mix()
    hook_pods: int = 3
    #: GUNICORN_THREADS of each of a pod's 2 workers (modelled rows).
    hook_threads: int = 16
    #: Modelled hook CPU per sync (s); None: as measured.
    hook_cpu: float | None = None
    duration: float = 120.0
    warmup: float = 20.0
    switchovers: int = 200
    #: Force one cache-flush burst of every shard at this time (s) and inject the
    #: switchovers within ``burst_window`` after it (the worst case of a periodic resync).
    flush_at: float | None = None
    burst_window: float = 10.0
    seed: int = 11


TODAY = Metacontroller(workers=10, qps=50, burst=100, resync_period=30)


# ------------------------------------------------------------------ virtual clock


class _NoIOSelector(selectors.BaseSelector):
    """A selector for a loop without I/O: waiting ``timeout`` moves virtual time on."""

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, fileobj, events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("virtual clock: nothing scheduled, the model would wait forever")
        self._loop.now += max(0.0, timeout)
        return []

    def close(self) -> None:
        self._map.clear()

    def get_map(self) -> Any:
        return self._map


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer: the model runs as fast as the
    CPU allows, with every ``sleep``/``call_at`` exact in virtual seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=_NoIOSelector(self))

    def time(self) -> float:
        return self.now


# --------------------------------------------------------------- client-go pieces


class WorkQueue:
    """client-go's workqueue (FIFO, dedup, processing set) with ``AddAfter``."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: deque[int] = deque()
        self.dirty: set[int] = set()
        self.processing: set[int] = set()
        self.waiting: dict[int, tuple[float, asyncio.TimerHandle]] = {}
        self.getters: deque[asyncio.Future[None]] = deque()
        self.enqueued_at: dict[int, float] = {}

    def add(self, key: int) -> None:
        if key in self.dirty:
            return
        self.dirty.add(key)
        if key in self.processing:
            return
        self._push(key)

    def _push(self, key: int) -> None:
        self.queue.append(key)
        self.enqueued_at[key] = self.loop.time()
        while self.getters:
            getter = self.getters.popleft()
            if not getter.done():
                getter.set_result(None)
                break

    def add_after(self, key: int, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        ready = self.loop.time() + delay
        pending = self.waiting.get(key)
        if pending is not None:
            if pending[0] <= ready:
                return
            pending[1].cancel()
        self.waiting[key] = (ready, self.loop.call_at(ready, self._ready, key))

    def _ready(self, key: int) -> None:
        del self.waiting[key]
        self.add(key)

    async def get(self) -> tuple[int, float]:
        while not self.queue:
            getter = self.loop.create_future()
            self.getters.append(getter)
            await getter
        key = self.queue.popleft()
        self.processing.add(key)
        self.dirty.discard(key)
        return key, self.loop.time() - self.enqueued_at.pop(key)

    def done(self, key: int) -> None:
        self.processing.discard(key)
        if key in self.dirty:
            self._push(key)


class TokenBucket:
    """golang.org/x/time/rate as client-go uses it: reserve a token, wait for it."""

    def __init__(self, qps: float, burst: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self.last = self.loop.time()

    async def take(self) -> None:
        now = self.loop.time()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.qps)
        self.last = now
        self.tokens -= 1.0
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.qps)


# ------------------------------------------------------------------------ the fleet


PLANNED = "planned"
STOP = "stop"
POD_CHANGING = "Pod-changing"
EVENTLESS = "event-less"


@dataclass
class Switchover:
    cluster: int
    kind: str
    klass: str
    new_leader: int
    first_200: float = math.inf
    lag: float | None = None


@dataclass
class Cluster:
    index: int
    shard: int
    polled: bool
    busy: bool
    hung: bool = False
    leader: int | None = 0
    #: What Kubernetes holds: the Service's selected member, the status we wrote.
    selected: int = 0
    status: tuple[int, str] = (0, "LeaderFound")
    pending: Switchover | None = None
    #: Real mode: the stand-in's view of the objects and the encoded request.
    world: Any = None
    body: bytes | None = None


@dataclass
class Reply:
    selected: int
    status: tuple[int, str]
    degraded: bool
    resync: float | None
    service_changed: bool
    status_changed: bool


@dataclass
class Counters:
    gets: int = 0
    puts: int = 0
    syncs: int = 0
    hook_errors: int = 0
    queue_waits: list[float] = field(default_factory=list)
    per_second: dict[int, int] = field(default_factory=dict)


class Install:
    """One Metacontroller install: queue, workers, bucket, for the parents of one shard."""

    def __init__(self, fleet: Fleet, shard: int) -> None:
        self.fleet = fleet
        self.shard = shard
        self.queue = WorkQueue()
        self.bucket = TokenBucket(fleet.row.mc.qps, fleet.row.mc.burst)
        self.keys = [c.index for c in fleet.clusters if c.shard == shard]

    def enqueue_all(self) -> None:
        for key in self.keys:
            self.queue.add(key)

    async def api(self, put: bool) -> None:
        await self.bucket.take()
        fleet = self.fleet
        now = fleet.loop.time()
        if now >= fleet.measure_from:
            if put:
                fleet.counters.puts += 1
            else:
                fleet.counters.gets += 1
            second = int(now)
            fleet.counters.per_second[second] = fleet.counters.per_second.get(second, 0) + 1
        await asyncio.sleep(API_PUT if put else API_GET)

    async def worker(self) -> None:
        fleet = self.fleet
        while True:
            key, waited = await self.queue.get()
            try:
                await self.sync(fleet.clusters[key], waited)
            finally:
                self.queue.done(key)

    async def sync(self, cluster: Cluster, waited: float) -> None:
        fleet = self.fleet
        measuring = fleet.loop.time() >= fleet.measure_from
        reply = await fleet.hook.call(cluster)
        if measuring:
            fleet.counters.syncs += 1
            fleet.counters.queue_waits.append(waited)
        if reply is None:  # hook error: nothing written, retried with backoff (~5 ms first)
            fleet.counters.hook_errors += 1
            self.queue.add_after(cluster.index, 0.005)
            return
        if reply.resync:
            self.queue.add_after(cluster.index, reply.resync)
        if reply.service_changed:
            await self.api(put=True)
            cluster.selected = reply.selected
            fleet.service_applied(cluster)
            fleet.loop.call_later(WATCH_DELAY, self.queue.add, cluster.index)
        await self.api(put=False)
        if reply.status_changed:
            await self.api(put=True)
            cluster.status = reply.status
            fleet.loop.call_later(WATCH_DELAY, self.queue.add, cluster.index)


class ModelHook:
    """The hook as a service: a sync holds a request thread of a hook pod for its whole
    length (a sample of the measured sync latencies, plus the probe deadline for a cluster
    with a member that never answers) and one of the pods' cores for ``cpu`` s of it; it
    decides what the real hook decides on these members."""

    def __init__(self, fleet: Fleet, latencies: Sequence[float], cpu: float) -> None:
        self.fleet = fleet
        self.latencies = list(latencies)
        self.cpu = cpu
        self.cores = asyncio.Semaphore(2 * fleet.row.hook_pods)
        #: gunicorn's request threads: 2 workers x GUNICORN_THREADS per pod.
        self.threads = asyncio.Semaphore(2 * fleet.row.hook_threads * fleet.row.hook_pods)
        self.rng = random.Random(fleet.row.seed + 1)

    async def call(self, cluster: Cluster) -> Reply | None:
        wall = self.rng.choice(self.latencies)
        if cluster.hung:  # the round waits for the member that never answers
            wall = PROBE_DEADLINE + wall
        async with self.threads:
            async with self.cores:
                await asyncio.sleep(min(self.cpu, wall) / 2)
                leader = cluster.leader  # the probe round, half-way through the hook's work
                await asyncio.sleep(min(self.cpu, wall) / 2)
            await asyncio.sleep(max(0.0, wall - self.cpu))
        policy = self.fleet.row.policy
        if leader is None:
            status = (cluster.selected, "NoLeader")
            return Reply(
                cluster.selected, status, True, policy.degraded, False, status != cluster.status
            )
        status = (leader, "LeaderFound")
        return Reply(
            leader,
            status,
            False,
            self.fleet.healthy_resync(cluster),
            leader != cluster.selected,
            status != cluster.status,
        )


class Fleet:
    """The fleet, its installs, its event sources and what was measured."""

    def __init__(self, row: Row) -> None:
        self.row = row
        self.loop = asyncio.get_running_loop()
        self.rng = random.Random(row.seed)
        self.counters = Counters()
        self.measure_from = row.warmup
        self.switchovers: list[Switchover] = []
        n_polled = round(row.n * row.mix.polled)
        n_busy = round((row.n - n_polled) * row.mix.busy)
        self.clusters = [
            Cluster(
                index=i,
                shard=i % row.mc.shards,
                polled=i < n_polled,
                busy=n_polled <= i < n_polled + n_busy,
            )
            for i in range(row.n)
        ]
        for cluster in self.rng.sample(self.clusters, round(row.n * row.mix.hung)):
            cluster.hung = True
        self.installs = [Install(self, k) for k in range(row.mc.shards)]
        self.hook: Any = None
        self.members: Any = None  # real mode: FleetMembers
        self.tasks: list[asyncio.Future[None]] = []
        self.measured = 0.0

    def healthy_resync(self, cluster: Cluster) -> float:
        policy = self.row.policy
        if cluster.polled or policy.event_resync is None:
            period = policy.poll
        else:
            period = policy.event_resync
        if not policy.spread:
            return period
        # The hook's own function, with a UID per modelled cluster and the model's clock.
        return spread_resync(period, f"fleet-uid-{cluster.index}", self.loop.time())

    def pod_event(self, cluster: Cluster, delay: float = 0.0) -> None:
        install = self.installs[cluster.shard]
        self.loop.call_later(delay + WATCH_DELAY, install.queue.add, cluster.index)

    def service_applied(self, cluster: Cluster) -> None:
        pending = cluster.pending
        if pending is None or cluster.selected != pending.new_leader:
            return
        now = self.loop.time()
        if now >= pending.first_200:
            pending.lag = now - pending.first_200
            cluster.pending = None

    def set_leader(self, cluster: Cluster, member: int | None) -> None:
        cluster.leader = member
        if self.members is not None:
            self.members.set_leader(cluster.index, member)

    # ---------------------------------------------------------------- event sources

    async def periodic(self, install: Install, period: float) -> None:
        await asyncio.sleep(self.rng.uniform(0, period))
        while True:
            install.enqueue_all()
            await asyncio.sleep(period)

    async def busy_pods(self, cluster: Cluster) -> None:
        await asyncio.sleep(self.rng.uniform(0, BUSY_PERIOD / self.row.mix.members))
        while True:
            self.pod_event(cluster)
            await asyncio.sleep(BUSY_PERIOD / self.row.mix.members)

    async def switchover(self, cluster: Cluster, kind: str) -> None:
        old = cluster.leader if cluster.leader is not None else 0
        new = (old + 1 + self.rng.randrange(self.row.mix.members - 1)) % self.row.mix.members
        pod_changing = kind == STOP or not cluster.polled
        record = Switchover(cluster.index, kind, POD_CHANGING if pod_changing else EVENTLESS, new)
        cluster.pending = record
        self.switchovers.append(record)
        if kind == STOP:
            self.set_leader(cluster, None)
            self.pod_event(cluster)  # the old leader's Pod: terminating, NotReady
            await asyncio.sleep(STOP_GAP)
        self.set_leader(cluster, new)
        record.first_200 = self.loop.time()
        if not cluster.polled:
            self.pod_event(cluster)  # Patroni moves the role labels (touch_member)

    async def inject(self) -> None:
        row = self.row
        if row.flush_at is not None:
            start, window = row.flush_at, row.burst_window
        else:
            start, window = row.warmup, row.duration - row.warmup - STOP_GAP - 15.0
        times = sorted(start + self.rng.uniform(0, window) for _ in range(row.switchovers))
        tasks = self.tasks
        for at in times:
            await asyncio.sleep(max(0.0, at - self.loop.time()))
            cluster = self.rng.choice(self.clusters)
            if cluster.pending is not None:
                continue
            kind = STOP if self.rng.random() < row.mix.stops else PLANNED
            tasks.append(asyncio.ensure_future(self.switchover(cluster, kind)))
        await asyncio.gather(*tasks)

    async def run(self) -> None:
        row = self.row
        background: list[asyncio.Future[None]] = []
        for install in self.installs:
            install.enqueue_all()  # the initial resync of addHandler
            background += [asyncio.ensure_future(install.worker()) for _ in range(row.mc.workers)]
            period = row.mc.resync_period
            if period is not None and max(period, 1.0) < row.mc.cache_flush:
                background.append(asyncio.ensure_future(self.periodic(install, max(period, 1.0))))
            if row.flush_at is None:
                background.append(asyncio.ensure_future(self.periodic(install, row.mc.cache_flush)))
            else:
                self.loop.call_at(self.loop.time() + row.flush_at, install.enqueue_all)
        background += [asyncio.ensure_future(self.busy_pods(c)) for c in self.clusters if c.busy]
        start = self.loop.time()
        self.measure_from = start + row.warmup
        injector = asyncio.ensure_future(self.inject())
        await asyncio.sleep(row.duration)
        self.measured = self.loop.time() - self.measure_from
        for task in (injector, *background, *self.tasks):
            task.cancel()
        await asyncio.gather(injector, *background, *self.tasks, return_exceptions=True)


# ------------------------------------------------------------------------ real hook


class RealHook:
    """Syncs through real hook pods over HTTP, in threads (as Metacontroller's workers
    block on their call), with the stand-in applying each reply to the cluster's world."""

    def __init__(
        self, fleet: Fleet, urls: Sequence[str], headers: Sequence[dict[str, str]]
    ) -> None:
        import requests

        self.fleet = fleet
        self.urls = list(urls)
        self.headers = [{**h, "Content-Type": "application/json"} for h in headers]
        self.pool = ThreadPoolExecutor(max_workers=fleet.row.mc.workers * fleet.row.mc.shards)
        self.local = threading.local()
        self.latencies: list[float] = []
        self.requests = requests
        self.counter = 0
        self.errors: dict[str, int] = {}

    def _post(self, pod: int, body: bytes) -> tuple[int, bytes, float]:
        session = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = self.requests.Session()
        started = time.monotonic()
        response = session.post(
            self.urls[pod] + "/sync", data=body, headers=self.headers[pod], timeout=5
        )
        return response.status_code, response.content, time.monotonic() - started

    async def settle(self, cluster: Cluster) -> None:
        """Sync ``cluster`` until a reply changes nothing (before the clock starts)."""
        from bench.common import encode
        from standin.apply import apply_reply, check_reply

        for _ in range(4):
            status, data, _ = await self.fleet.loop.run_in_executor(
                self.pool,
                self._post,
                cluster.index % len(self.urls),
                encode(cluster.world.sync_request()),
            )
            applied = apply_reply(cluster.world, check_reply(status, data))
            if not (applied.status_changed or applied.changed_children):
                return
        raise RuntimeError(f"cluster {cluster.index}: the hook's replies did not converge")

    async def call(self, cluster: Cluster) -> Reply | None:
        from bench.common import POD_NAME_LABEL, SERVICE, encode
        from standin.apply import HookError, apply_reply, check_reply

        if cluster.body is None:
            cluster.body = encode(cluster.world.sync_request())
        self.counter += 1
        pod = self.counter % len(self.urls)
        try:
            status, data, took = await self.fleet.loop.run_in_executor(
                self.pool, self._post, pod, cluster.body
            )
            reply = check_reply(status, data)
        except (HookError, self.requests.RequestException) as error:
            self.errors[type(error).__name__ + ": " + str(error)[:160]] = (
                self.errors.get(type(error).__name__ + ": " + str(error)[:160], 0) + 1
            )
            return None
        self.latencies.append(took)
        applied = apply_reply(cluster.world, reply)
        if applied.status_changed or applied.changed_children:
            cluster.body = None
        selector = cluster.world.services[SERVICE]["spec"]["selector"]
        selected = int(selector[POD_NAME_LABEL].rsplit("-", 1)[1])
        reason = "LeaderFound" if reply["status"].get("primary") else "NoLeader"
        degraded = float(reply.get("resyncAfterSeconds") or 0) < 1.0
        policy = self.fleet.row.policy
        if policy.from_reply:
            resync = float(reply.get("resyncAfterSeconds") or 0) or None
        else:
            resync = policy.degraded if degraded else self.fleet.healthy_resync(cluster)
        return Reply(
            selected,
            (selected, reason),
            degraded,
            resync,
            bool(applied.updated),
            applied.status_changed,
        )


def _cluster_world(index: int, port: int, members: int, polled: bool) -> Any:
    """The stand-in's objects for one fleet cluster: the recorded request with this
    cluster's member addresses, already steady (Service on member 0, status written)."""
    from bench.common import recorded_body
    from bench.fakepatroni import fleet_host
    from standin.apply import World

    names = [f"pg-orders-{m}" for m in range(members)]
    body = recorded_body([fleet_host(index, m) for m in range(members)], port, names)
    body["parent"]["metadata"]["name"] = f"pg-{index:05d}"
    if polled:  # an etcd cluster: no role label, no status annotation on its Pods
        for pod in body["related"]["Pod.v1"].values():
            pod["metadata"].get("labels", {}).pop("role", None)
            pod["metadata"].get("annotations", {}).pop("status", None)
    return World(
        parent=body["parent"],
        services=body["children"]["Service.v1"],
        pods=body["related"]["Pod.v1"],
    )


@contextmanager
def real_hook_pods(pods: int) -> Iterator[tuple[list[str], list[dict[str, str]], list[int]]]:
    """``pods`` hook pods under the production gunicorn config: URLs, auth, master PIDs."""
    from standin.gunicorn import gunicorn_hook

    env = {"PGFH_ALLOWED_PATRONI_PORTS": "1024-65535", "PGFH_LOG_LEVEL": "WARNING"}
    with ExitStack() as stack:
        hooks = []
        for _ in range(pods):
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-")))
            hooks.append(stack.enter_context(gunicorn_hook(workdir, env=env, threads=16)))
        yield [h.url for h in hooks], [h.headers for h in hooks], [h.process.pid for h in hooks]


def _pods_cpu(masters: Sequence[int]) -> float:
    from bench.common import children, cpu_seconds

    return sum(cpu_seconds(p) for m in masters for p in (m, *children(m)))


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    row: Row
    mode: str
    lags: dict[str, list[float]]
    unfinished: dict[str, int]
    api_per_second: float
    api_peak: int
    syncs_per_second: float
    hook_cpu_per_sync: float
    hook_cores: float
    queue_wait_p99: float
    hook_errors: int
    measured: float

    def lag(self, klass: str, q: float) -> float:
        values = sorted(self.lags[klass])
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _result(fleet: Fleet, mode: str, cpu_per_sync: float) -> Result:
    lags: dict[str, list[float]] = {POD_CHANGING: [], EVENTLESS: []}
    unfinished = {POD_CHANGING: 0, EVENTLESS: 0}
    for s in fleet.switchovers:
        if s.lag is None:
            unfinished[s.klass] += 1
        else:
            lags[s.klass].append(s.lag)
    c = fleet.counters
    seconds = max(fleet.measured, 1e-9)
    per_second = sorted(c.per_second.values())
    syncs = c.syncs / seconds
    waits = sorted(c.queue_waits) or [0.0]
    return Result(
        row=fleet.row,
        mode=mode,
        lags=lags,
        unfinished=unfinished,
        api_per_second=(c.gets + c.puts) / seconds,
        api_peak=per_second[-1] if per_second else 0,
        syncs_per_second=syncs,
        hook_cpu_per_sync=cpu_per_sync,
        hook_cores=syncs * cpu_per_sync,
        queue_wait_p99=waits[min(len(waits) - 1, int(0.99 * len(waits)))],
        hook_errors=c.hook_errors,
        measured=fleet.measured,
    )


def run_modelled(row: Row, latencies: Sequence[float], cpu: float) -> Result:
    """One row on the virtual clock, the hook a service of the given latency and CPU."""
    cpu = row.hook_cpu if row.hook_cpu is not None else cpu
    loop = VirtualLoop()
    try:

        async def main() -> Result:
            fleet = Fleet(row)
            fleet.hook = ModelHook(fleet, latencies, cpu)
            await fleet.run()
            return _result(fleet, "modelled", cpu)

        return loop.run_until_complete(main())
    finally:
        loop.close()


def run_real(row: Row) -> tuple[Result, list[float]]:
    """One row in real time through real hook pods and a fake fleet; also returns the
    sync latencies seen (the service time the modelled rows use)."""
    from bench.fakepatroni import fleet_members

    with (
        fleet_members(row.n, row.mix.members, lifetime=row.duration + 120) as members,
        real_hook_pods(row.hook_pods) as (urls, headers, masters),
    ):

        async def main() -> tuple[Result, list[float]]:
            fleet = Fleet(row)
            fleet.members = members
            for cluster in fleet.clusters:
                cluster.world = _cluster_world(
                    cluster.index, members.ports[cluster.index], row.mix.members, cluster.polled
                )
            hook = RealHook(fleet, urls, headers)
            fleet.hook = hook
            # Start steady, as the model does: the Service on member 0 and the hook's own
            # status written (each cluster synced until its reply changes nothing).
            await asyncio.gather(*(hook.settle(c) for c in fleet.clusters))
            cpu_start = driver_start = 0.0

            def start_cpu() -> None:
                nonlocal cpu_start, driver_start
                cpu_start = _pods_cpu(masters)
                driver_start = time.process_time()

            fleet.loop.call_later(row.warmup, start_cpu)
            try:
                await fleet.run()
            finally:
                hook.pool.shutdown(wait=True)
            cpu = (_pods_cpu(masters) - cpu_start) / max(1, fleet.counters.syncs)
            driver = (time.process_time() - driver_start) / max(1, fleet.counters.syncs)
            print(
                f"  CPU per sync: hook pods {cpu * 1000:.1f} ms, this driver (queue model, "
                f"requests, stand-in) {driver * 1000:.1f} ms",
                flush=True,
            )
            if hook.errors:
                print(f"  hook errors: {hook.errors}", file=sys.stderr)
            return _result(fleet, "real", cpu), hook.latencies

        return asyncio.run(main())


def calibrate(
    pods: int = 1, clusters: int = 20, seconds: float = 12.0
) -> tuple[list[float], float]:
    """The real hook's sync latencies and CPU per sync, on a small real fleet, steady,
    at a moderate rate (40 syncs/s): the service time, without queueing in the pod (the
    model adds that itself, from the pods' cores)."""
    row = Row(
        "calibration",
        clusters,
        Metacontroller(workers=4, qps=1000, burst=1000, resync_period=None),
        Policy(poll=0.5, from_reply=False),
        hook_pods=pods,
        duration=seconds,
        warmup=2.0,
        switchovers=0,
    )
    result, latencies = run_real(row)
    return latencies[len(latencies) // 10 :], result.hook_cpu_per_sync


# ----------------------------------------------------------------------------- table


def settings_text(row: Row) -> str:
    mc = row.mc
    period = "absent" if mc.resync_period is None else f"{mc.resync_period:g}"
    shards = f"{mc.shards}×" if mc.shards > 1 else ""
    pol = row.policy
    event = "—" if pol.event_resync is None else f"{pol.event_resync:g}"
    return (
        f"{shards}W{mc.workers} Q{mc.qps:g}/B{mc.burst} period {period}; "
        f"poll {pol.poll:g} s, event-driven {event}; {row.hook_pods} hook pods"
        + (f" × {row.hook_threads} threads" if row.hook_threads != 16 else "")
    )


def fmt(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"


def table(results: Sequence[Result]) -> str:
    head = (
        "| row | N | settings | mode | Pod-changing lag p50 / p99 / max (s) [n] "
        "| event-less lag p50 / p90 / p99 / max (s) [n] | API req/s (peak 1 s) "
        "| hook syncs/s | hook CPU (cores) | queue wait p99 (s) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in results:
        pc, el = POD_CHANGING, EVENTLESS
        pod = (
            f"{fmt(r.lag(pc, 0.5))} / {fmt(r.lag(pc, 0.99))} / {fmt(r.lag(pc, 1.0))} "
            f"[{len(r.lags[pc])}"
            + (f", {r.unfinished[pc]} unfinished" if r.unfinished[pc] else "")
            + "]"
        )
        less = (
            f"{fmt(r.lag(el, 0.5))} / {fmt(r.lag(el, 0.9))} / {fmt(r.lag(el, 0.99))} / "
            f"{fmt(r.lag(el, 1.0))} [{len(r.lags[el])}"
            + (f", {r.unfinished[el]} unfinished" if r.unfinished[el] else "")
            + "]"
        )
        lines.append(
            f"| {r.row.label} | {r.row.n:,} | {settings_text(r.row)} | {r.mode} | {pod} | {less} "
            f"| {r.api_per_second:.0f} ({r.api_peak}) | {r.syncs_per_second:.0f} "
            f"| {r.hook_cores:.2f} ({r.hook_cpu_per_sync * 1000:.1f} ms/sync) "
            f"| {r.queue_wait_p99:.2f} |"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------- presets

#: The shipped settings (deploy/metacontroller-values.yaml,
#: metacontroller/compositecontroller.yaml) and the hook's defaults (hooks/switchover.py:
#: polled clusters 1 s, event-driven ones 30 s).
SHIPPED = Metacontroller(workers=64, qps=300, burst=100, resync_period=None)
SHIPPED_POLICY = Policy(poll=1.0, event_resync=30.0, from_reply=False, spread=True)
TODAY_POLICY = Policy(poll=1.0, event_resync=None)
TODAY_MODEL_POLICY = Policy(poll=1.0, event_resync=None, from_reply=False)
#: Poll settings tried, shortest first, by ``recommended``.
POLLS = (1.0, 2.0, 5.0, 10.0, 30.0)


def steady_rate(n: int, mix: Mix, poll: float, event_resync: float = 30.0) -> float:
    """API requests/s of a steady fleet: one GET per sync; a polled cluster syncs every
    ``poll`` s, an event-driven one every ``event_resync`` s, a busy one on each of its
    Pods' changes (every ``BUSY_PERIOD`` s each)."""
    polled = round(n * mix.polled)
    busy = round((n - polled) * mix.busy)
    quiet = n - polled - busy
    return polled / poll + quiet / event_resync + busy * mix.members / BUSY_PERIOD


def recommended(n: int, mix: Mix = Mix()) -> tuple[Metacontroller, Policy, int, int]:
    """What docs/scale.md recommends for ``n`` clusters of ``mix``: the install flags, the
    poll policy, hook pods and GUNICORN_THREADS.

    Up to 1,000 clusters: one install with the shipped flags (64 workers, rate limit
    300/s, burst 100) and the shipped 3 hook pods. Above: ceil(n / 1000) shards whose
    limits add up to 0.2 requests/s per cluster (95 % as rate, 5 % as burst, so no second
    exceeds it), each with 64 workers. The poll of the polled clusters: the shortest of
    ``POLLS`` that keeps the steady rate at or below 60 % of the rate limit, the rest being
    headroom for events, failovers and bursts. The hook pods' request threads
    (pods x 2 x GUNICORN_THREADS) at least the workers of all installs: a sync of a cluster
    with a member that never answers holds a thread for the 2 s probe deadline without
    using CPU, so the HPA (on CPU) would not add pods for it. The healthy resyncs are
    phase-spread: the hook always spreads them (``hooks.switchover.spread_resync``).
    """
    if n <= 1000:
        mc, pods, threads = SHIPPED, 3, 16
    else:
        shards = math.ceil(n / 1000)
        budget = 0.2 * n
        mc = Metacontroller(
            workers=64,
            qps=round(0.95 * budget / shards),
            burst=round(0.05 * budget / shards),
            resync_period=None,
            shards=shards,
        )
        threads = 32
        pods = math.ceil(shards * mc.workers / (2 * threads)) + 1
    limit = 0.6 * mc.qps * mc.shards
    poll = next((p for p in POLLS if steady_rate(n, mix, p) <= limit), POLLS[-1])
    policy = Policy(poll=poll, event_resync=30.0, from_reply=False, spread=True)
    return mc, policy, pods, threads


def full_rows(duration: float, switchovers: int) -> list[Row]:
    """The table's modelled rows: today's settings (and hook) and the recommended settings
    (with today's hook, whose healthy resyncs are phase-spread) for 50, 500 and 5,000 clusters
    of the stated mix, 100 and 1,000, the 5,000 row without the spread for comparison, and the
    worst cases found."""
    rows = []
    for n in (50, 500, 5000):
        rows.append(
            Row("today", n, TODAY, TODAY_MODEL_POLICY, duration=duration, switchovers=switchovers)
        )
        mc, policy, pods, threads = recommended(n)
        # At 5,000 the tail depends on where the random 30-min cache flushes and the clump
        # fall: three seeds.
        for seed in (11, 12, 13) if n == 5000 else (11,):
            rows.append(
                Row(
                    "recommended" + (f" (seed {seed})" if n == 5000 else ""),
                    n,
                    mc,
                    policy,
                    hook_pods=pods,
                    hook_threads=threads,
                    duration=duration,
                    switchovers=switchovers,
                    seed=seed,
                )
            )
    for n in (100, 1000):  # the sizes docs/scale.md gives settings for
        mc, policy, pods, threads = recommended(n)
        rows.append(
            Row(
                "recommended",
                n,
                mc,
                policy,
                hook_pods=pods,
                hook_threads=threads,
                duration=duration,
                switchovers=switchovers,
            )
        )
    mc, policy, pods, threads = recommended(5000)
    for seed in (11, 12, 13):
        rows.append(
            Row(
                f"recommended, fixed healthy resync (the hook before phase-spread) (seed {seed})",
                5000,
                mc,
                replace(policy, spread=False),
                hook_pods=pods,
                hook_threads=threads,
                duration=duration,
                switchovers=switchovers,
                seed=seed,
            )
        )
    rows.append(
        Row(
            "worst: switchovers within 10 s after the 30-min cache-flush burst",
            5000,
            mc,
            policy,
            hook_pods=pods,
            hook_threads=threads,
            duration=75.0,
            flush_at=30.0,
            burst_window=10.0,
            switchovers=switchovers,
        )
    )
    rows.append(
        Row(
            "worst: all 5,000 on etcd (polled), recommended flags and poll",
            5000,
            mc,
            policy,
            mix=Mix(polled=1.0),
            hook_pods=pods,
            hook_threads=threads,
            duration=duration,
            switchovers=switchovers,
        )
    )
    rows.append(
        Row(
            "worst: a node lost, 10 % of clusters with a member that never answers",
            5000,
            mc,
            policy,
            mix=Mix(hung=0.1),
            hook_pods=pods,
            hook_threads=threads,
            duration=duration,
            switchovers=switchovers,
        )
    )
    rows.append(
        Row(
            "worst: all 5,000 on etcd, polled every 1 s, today's flags",
            5000,
            TODAY,
            TODAY_MODEL_POLICY,
            mix=Mix(polled=1.0),
            duration=duration,
            switchovers=switchovers,
        )
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=180.0, help="seconds per modelled row")
    parser.add_argument("--switchovers", type=int, default=600, help="per modelled row")
    parser.add_argument("--real-n", type=int, default=200, help="N of the real-vs-model check")
    parser.add_argument("--real-duration", type=float, default=60.0)
    parser.add_argument("--skip-real", action="store_true", help="no real rows; calibration only")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)

    print("calibrating: one real hook pod, 20 steady clusters, 12 s ...", flush=True)
    latencies, cpu = calibrate()
    print(
        f"  sync latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {sorted(latencies)[int(0.99 * len(latencies))] * 1000:.1f} ms; "
        f"hook CPU {cpu * 1000:.2f} ms/sync ({len(latencies)} syncs)",
        flush=True,
    )
    results: list[Result] = []
    if not args.skip_real:
        for label, mc, policy in (
            ("today, real", TODAY, TODAY_POLICY),
            ("shipped, real", SHIPPED, SHIPPED_POLICY),
        ):
            row = Row(
                label,
                args.real_n,
                mc,
                policy,
                mix=Mix(polled=1.0),
                duration=args.real_duration,
                switchovers=args.real_n // 2,
            )
            print(f"real: {label} N={row.n} ...", flush=True)
            real, _ = run_real(row)
            print(f"  load average after it: {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
            results.append(real)
            model = replace(
                row,
                label=label.replace("real", "model of it"),
                policy=replace(policy, from_reply=False),
            )
            results.append(run_modelled(model, latencies, cpu))
            print(table(results[-2:]), flush=True)
    for row in full_rows(args.duration, args.switchovers):
        print(f"modelled: {row.label} N={row.n} ...", flush=True)
        started = time.process_time()
        results.append(run_modelled(row, latencies, cpu))
        print(f"  ({time.process_time() - started:.0f} s CPU)", flush=True)
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "label": r.row.label,
                        "n": r.row.n,
                        "settings": settings_text(r.row),
                        "mode": r.mode,
                        "lags": r.lags,
                        "unfinished": r.unfinished,
                        "api_per_second": r.api_per_second,
                        "api_peak": r.api_peak,
                        "syncs_per_second": r.syncs_per_second,
                        "hook_cpu_per_sync": r.hook_cpu_per_sync,
                        "queue_wait_p99": r.queue_wait_p99,
                        "hook_errors": r.hook_errors,
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
