"""The fleet on Metacontroller's queue: clusters, switchovers and Pod events, one install per
shard (queue, workers, token bucket), the modelled hook, what was measured, and one modelled
row run on the virtual clock."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hooks.core.switchover import spread_resync
from testbed.bench.fleet.settings import (
    API_GET,
    API_PUT,
    BUSY_PERIOD,
    PROBE_DEADLINE,
    STOP_GAP,
    WATCH_DELAY,
    Row,
)
from testbed.bench.fleet.virtual_queue import TokenBucket, VirtualLoop, WorkQueue

#: A hook call while every hook pod is down: the connection is refused (no endpoints).
REFUSED = 0.001
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
    #: When the Service PUT selecting the new leader returned.
    applied: float | None = None


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
    #: Metacontroller's own CPU (s) and the Pod events its handlers worked off.
    mc_cpu: float = 0.0
    pod_events: int = 0


class Install:
    """One Metacontroller install: queue, workers, bucket, for the parents of one shard."""

    def __init__(self, fleet: Fleet, shard: int) -> None:
        self.fleet = fleet
        self.shard = shard
        self.queue = WorkQueue()
        self.bucket = TokenBucket(fleet.row.mc.qps, fleet.row.mc.burst)
        self.keys = [c.index for c in fleet.clusters if c.shard == shard]
        self.cost = fleet.row.mc.cost
        #: Its cores, and its Pod informer's one handler goroutine (events one at a time).
        self.cores = asyncio.Semaphore(self.cost.cores if self.cost else 1)
        self.handler = asyncio.Lock()
        members, namespaces = fleet.row.mix.members, max(1, fleet.row.namespaces)
        #: Pods in a parent's namespace: what listing its related Pods visits.
        self.listed = math.ceil(fleet.row.n / namespaces) * members

    async def own_cpu(self, seconds: float) -> None:
        """Metacontroller's own work: ``seconds`` on one of its cores."""
        async with self.cores:
            await asyncio.sleep(seconds)
        if self.fleet.loop.time() >= self.fleet.measure_from:
            self.fleet.counters.mc_cpu += seconds

    async def pod_event(self, key: int) -> None:
        """One Pod event through ``findRelatedParents``: it waits for the handler, walks every
        parent of the install, then enqueues the related one."""
        assert self.cost is not None
        async with self.handler:
            await self.own_cpu(self.cost.event_cpu(len(self.keys)))
        if self.fleet.loop.time() >= self.fleet.measure_from:
            self.fleet.counters.pod_events += 1
        self.queue.add(key)

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
        if self.cost is not None:
            await self.own_cpu(self.cost.sync_cpu(self.listed))
        reply = await fleet.hook.call(cluster)
        if measuring:
            fleet.counters.syncs += 1
            fleet.counters.queue_waits.append(waited)
        if reply is None:  # hook error: nothing written; processNextWorkItem's AddRateLimited
            fleet.counters.hook_errors += 1
            self.queue.add_rate_limited(cluster.index)
            return
        self.queue.forget(cluster.index)  # the sync succeeded: Forget
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
        if self.fleet.hooks_down():
            await asyncio.sleep(REFUSED)  # no endpoint behind the Service: refused at once
            return None
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
        self.started = 0.0

    def hooks_down(self) -> bool:
        row = self.row
        if row.hooks_down_at is None:
            return False
        since = self.loop.time() - self.started - row.hooks_down_at
        return 0.0 <= since < row.hooks_down_for

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
        if install.cost is None:
            self.loop.call_later(delay + WATCH_DELAY, install.queue.add, cluster.index)
            return

        def handle() -> None:
            self.tasks.append(asyncio.ensure_future(install.pod_event(cluster.index)))

        self.loop.call_later(delay + WATCH_DELAY, handle)

    def service_applied(self, cluster: Cluster) -> None:
        pending = cluster.pending
        if pending is None or cluster.selected != pending.new_leader:
            return
        now = self.loop.time()
        if now >= pending.first_200:
            pending.lag = now - pending.first_200
            pending.applied = now
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
        if row.hooks_down_at is not None:  # Patroni elects within the outage
            start = self.started + row.hooks_down_at
            window = max(0.0, row.hooks_down_for - STOP_GAP - 1.0)
        elif row.flush_at is not None:
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
        self.started = start
        self.measure_from = start + row.warmup
        injector = asyncio.ensure_future(self.inject())
        await asyncio.sleep(row.duration)
        self.measured = self.loop.time() - self.measure_from
        for task in (injector, *background, *self.tasks):
            task.cancel()
        await asyncio.gather(injector, *background, *self.tasks, return_exceptions=True)


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
    #: Switchovers inside a hooks-down outage: seconds from the outage's end to the Service
    #: on the new leader, and how many were not routed by the end of the run.
    recovery: list[float] = field(default_factory=list)
    unrecovered: int = 0
    #: Metacontroller's own CPU (cores, all installs) when its cost is modelled.
    mc_cores: float = 0.0

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
    recovery: list[float] = []
    unrecovered = 0
    row = fleet.row
    if row.hooks_down_at is not None:
        back = fleet.started + row.hooks_down_at + row.hooks_down_for
        for s in fleet.switchovers:
            if s.applied is None:
                unrecovered += 1
            else:
                recovery.append(max(0.0, s.applied - max(back, s.first_200)))
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
        recovery=sorted(recovery),
        unrecovered=unrecovered,
        mc_cores=c.mc_cpu / seconds,
    )


def run_modelled(row: Row, latencies: Sequence[float], cpu: float) -> Result:
    """One row on the virtual clock, the hook a service of the given latency and CPU."""
    cpu = row.hook_cpu if row.hook_cpu is not None else cpu
    loop = VirtualLoop()
    try:

        async def main() -> Result:
            fleet = Fleet(row)
            fleet.hook = ModelHook(fleet, latencies, cpu)
            if row.shared_cores is not None:
                shared = asyncio.Semaphore(row.shared_cores)
                fleet.hook.cores = shared
                for install in fleet.installs:
                    install.cores = shared
            await fleet.run()
            return _result(fleet, "modelled", cpu)

        return loop.run_until_complete(main())
    finally:
        loop.close()
