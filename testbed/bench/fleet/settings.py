"""The fleet benchmark's inputs: Metacontroller's flags, the hook's resync policy, the fleet's
mix, one table row, the modelled API server's latencies, and the presets (today's settings, the
shipped ones, what docs/scale.md recommends for N clusters, the table's rows).

Pure: no clock, no I/O (``python -m testbed.bench.fleet.table`` runs them;
:mod:`testbed.bench.fleet.table` has the model's sources in Metacontroller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

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


@dataclass(frozen=True)
class MetacontrollerCost:
    """Metacontroller's own CPU, calibrated on the real binary (v4.17.2,
    ``testbed.bench.fleet.on_kube``
    on the real control plane, with its CPU profile). Per sync it lists the parent's related
    Pods from its informer cache by namespace and label selector
    (``pkg/controller/common/customize/manager.go`` ``GetRelatedObjects``:
    ``Lister().Namespace(ns).List(selector)``, which visits every Pod of the namespace), plus a
    fixed part (the live GET, the claim, the JSON of the hook call, the status update). Per
    Pod event its Pod informer's one handler goroutine runs ``findRelatedParents``
    (``manager.go`` ~343-397), which walks every parent of the install before it enqueues
    the related ones: the events of one install are served one at a time."""

    #: CPU per sync beyond the listing (s).
    sync_base: float
    #: CPU per object of the parent's namespace visited by the related-Pods listing (s).
    per_listed: float
    #: CPU per parent walked by one Pod event (s).
    per_parent_walked: float
    #: Cores one install may use (its CPU limit).
    cores: int = 2

    def sync_cpu(self, listed: int) -> float:
        return self.sync_base + self.per_listed * listed

    def event_cpu(self, parents: int) -> float:
        return self.per_parent_walked * parents


#: Metacontroller v4.17.2 on this project's 2-core machine, fitted to
#: ``testbed.bench.fleet.on_kube`` runs of the real binary and their CPU profiles (docs/scale.md,
#: "Metacontroller's own CPU"): CPU per sync 3.06 ms with 600 Pods in the namespace (200 clusters)
#: and 6.89 - 1.54 ms (the Pod handler's share taken out) with 3,000 (1,000 clusters): ~0.95 us per
#: Pod of the namespace visited by the related-Pods listing, ~2.5 ms for the rest of a sync; and
#: with Patroni's Kubernetes-DCS churn over 1,000 parents in 100 namespaces, ``findRelatedParents``
#: took 11.4 s of CPU for ~2,100 Pod events in the 30 s profile: ~5.4 ms an event, 5.4 us per
#: parent walked.
V4_17_2_COST = MetacontrollerCost(sync_base=0.0025, per_listed=0.95e-6, per_parent_walked=5.4e-6)


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
    #: Its own CPU; None: free (the rows modelled before the calibration).
    cost: MetacontrollerCost | None = None


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
    #: Phase-spread healthy resyncs (the hook's, :func:`hooks.core.switchover.spread_resync`,
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
    #: Namespaces the clusters are spread over evenly (Metacontroller lists the related Pods
    #: of a parent's namespace on every sync: ``MetacontrollerCost.per_listed``).
    namespaces: int = 1
    #: Metacontroller and the hook pods on the same ``shared_cores`` cores (a benchmark
    #: machine, where the real binary and gunicorn share 2 cores); None: each its own.
    shared_cores: int | None = None
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
    #: Every hook pod down (each call refused at once) from this time (s) for
    #: ``hooks_down_for`` s, the switchovers injected inside the outage (a failover nobody
    #: can route until the hook is back); None: no outage.
    hooks_down_at: float | None = None
    hooks_down_for: float = 0.0


TODAY = Metacontroller(workers=10, qps=50, burst=100, resync_period=30)


# -------------------------------------------------------------------------- presets

#: The shipped settings (deploy/metacontroller-values.yaml,
#: metacontroller/compositecontroller.yaml) and the hook's defaults (hooks/core/switchover.py:
#: polled clusters 1 s, event-driven ones 30 s).
SHIPPED = Metacontroller(workers=64, qps=300, burst=100, resync_period=60.0)
SHIPPED_POLICY = Policy(poll=1.0, event_resync=30.0, from_reply=False, spread=True)
TODAY_POLICY = Policy(poll=1.0, event_resync=None)
TODAY_MODEL_POLICY = Policy(poll=1.0, event_resync=None, from_reply=False)
#: The most clusters one install serves with the shipped ``resyncPeriodSeconds``: at 200 the
#: tick's burst (200 syncs) held the Pod-event p99 at 0.16 s on the real binary, at 1,000 it
#: took it to 4.1 s (docs/scale.md, "What to set").
LARGE_INSTALL = 200
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
    300/s, burst 100) and the shipped 3 hook pods. The shipped ``resyncPeriodSeconds``
    (60 s, the bound on recovery after every hook pod was down) up to
    :data:`LARGE_INSTALL` clusters an install; above, none (deploy/large-install/, and every
    shard of deploy/sharding/): its tick would queue them all ahead of every Pod event, and
    the queue's 10/s retries bring such a fleet back in about N / 10 s anyway. Above 1,000:
    ceil(n / 1000) shards whose limits add up to 0.2 requests/s per cluster
    (95 % as rate, 5 % as burst, so no second exceeds it), each with 64 workers. The poll
    of the polled clusters: the shortest of ``POLLS`` that keeps the steady rate at or
    below 60 % of the rate limit, the rest being headroom for events, failovers and
    bursts. The hook pods' request threads
    (pods x 2 x GUNICORN_THREADS) at least the workers of all installs: a sync of a cluster
    with a member that never answers holds a thread for the 2 s probe deadline without
    using CPU, so the HPA (on CPU) would not add pods for it. The healthy resyncs are
    phase-spread: the hook always spreads them (``hooks.core.switchover.spread_resync``).
    """
    if n <= 1000:
        mc, pods, threads = SHIPPED, 3, 16
        if n > LARGE_INSTALL:
            mc = replace(mc, resync_period=None)
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


def recommended_row(label: str, n: int, duration: float, switchovers: int, **changes: Any) -> Row:
    """A row of ``n`` clusters at :func:`recommended`'s settings (Metacontroller's flags, the
    policy, the hook pods and threads); ``changes``: any other field of :class:`Row`."""
    mc, policy, pods, threads = recommended(n)
    row = Row(label, n, mc, policy, hook_pods=pods, hook_threads=threads)
    return replace(row, duration=duration, switchovers=switchovers, **changes)


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
        # At 5,000 the tail depends on where the random 30-min cache flushes and the clump
        # fall: three seeds.
        for seed in (11, 12, 13) if n == 5000 else (11,):
            label = "recommended" + (f" (seed {seed})" if n == 5000 else "")
            rows.append(recommended_row(label, n, duration, switchovers, seed=seed))
    for n in (100, 1000):  # the sizes docs/scale.md gives settings for
        rows.append(recommended_row("recommended", n, duration, switchovers))
    policy = recommended(5000)[1]
    for seed in (11, 12, 13):
        label = f"recommended, fixed healthy resync (the hook before phase-spread) (seed {seed})"
        spread = replace(policy, spread=False)
        rows.append(recommended_row(label, 5000, duration, switchovers, policy=spread, seed=seed))
    worst = "worst: switchovers within 10 s after the 30-min cache-flush burst"
    rows.append(recommended_row(worst, 5000, 75.0, switchovers, flush_at=30.0, burst_window=10.0))
    worst = "worst: all 5,000 on etcd (polled), recommended flags and poll"
    rows.append(recommended_row(worst, 5000, duration, switchovers, mix=Mix(polled=1.0)))
    worst = "worst: a node lost, 10 % of clusters with a member that never answers"
    rows.append(recommended_row(worst, 5000, duration, switchovers, mix=Mix(hung=0.1)))
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
