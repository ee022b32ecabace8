"""testbed/bench/fleet/: the Metacontroller queue model, and a short real fleet run (smoke).

The model's pieces are checked against the semantics read in Metacontroller v4.17.2 and
client-go (module docstring of testbed/bench/fleet/table.py); the fleet runs are on a virtual clock
(deterministic, seeded), except the smoke run, which drives real hook pods under gunicorn
against the fake fleet and checks only that every switchover was followed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import pytest

from testbed.bench.fleet.model import EVENTLESS, POD_CHANGING, Result, run_modelled
from testbed.bench.fleet.real_hook import run_real
from testbed.bench.fleet.settings import (
    LARGE_INSTALL,
    SHIPPED,
    SHIPPED_POLICY,
    TODAY,
    TODAY_MODEL_POLICY,
    TODAY_POLICY,
    Metacontroller,
    Mix,
    Policy,
    Row,
    recommended,
    steady_rate,
)
from testbed.bench.fleet.virtual_queue import TokenBucket, VirtualLoop, WorkQueue

T = TypeVar("T")
#: A hook service time for the modelled runs (the bench measures it; tests need no hook).
LATENCIES = [0.004, 0.005, 0.006, 0.008, 0.012]
CPU = 0.004


def virtual(main: Callable[[], Awaitable[T]]) -> T:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


# ------------------------------------------------------------------ virtual clock


def test_virtual_clock_jumps_to_the_next_timer() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3600)
        return start, loop.time()

    start, end = virtual(main)
    assert end - start == pytest.approx(3600)


def test_virtual_clock_refuses_to_wait_forever() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(RuntimeError, match="nothing scheduled"):
        virtual(main)


# ------------------------------------------------------------- client-go workqueue


def test_queue_is_fifo_and_holds_a_key_once() -> None:
    async def main() -> list[int]:
        queue = WorkQueue()
        for key in (1, 2, 1, 3, 2):
            queue.add(key)
        got = []
        for _ in range(3):
            key, _ = await queue.get()
            got.append(key)
            queue.done(key)
        assert not queue.queue
        return got

    assert virtual(main) == [1, 2, 3]


def test_key_added_while_processing_comes_back_after_done_not_before() -> None:
    async def main() -> None:
        queue = WorkQueue()
        queue.add(7)
        key, _ = await queue.get()
        queue.add(7)  # an event during its sync
        queue.add(7)
        assert list(queue.queue) == []  # never handed to a second worker
        queue.done(key)
        assert list(queue.queue) == [7]

    virtual(main)


def test_add_after_keeps_the_earlier_time_and_fires_once() -> None:
    """client-go v0.36.3 (Metacontroller v4.17.2): ``insert`` keeps the earlier readyAt; a
    waiting entry stays while the key is queued by an event, and fires once."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        queue = WorkQueue()
        queue.add_after(1, 5.0)
        queue.add_after(1, 2.0)  # sooner: wins
        queue.add_after(1, 9.0)  # later: ignored
        start = loop.time()
        key, _ = await queue.get()
        assert key == 1 and loop.time() - start == pytest.approx(2.0)
        queue.done(key)
        assert 1 not in queue.waiting, "it fired once"
        queue.add(2)
        queue.add_after(2, 1.0)  # already queued: still waits (no dedup against the FIFO)
        assert 2 in queue.waiting
        key, _ = await queue.get()
        queue.done(key)
        key, _ = await queue.get()  # the entry fires: a second sync
        assert key == 2 and loop.time() - start == pytest.approx(3.0)

    virtual(main)


def test_token_bucket_allows_the_burst_then_the_rate() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        bucket = TokenBucket(qps=10, burst=5)
        start = loop.time()
        times = []
        for _ in range(25):
            await bucket.take()
            times.append(loop.time() - start)
        return times

    times = virtual(main)
    assert times[:5] == [0.0] * 5
    assert times[-1] == pytest.approx(2.0)  # 20 more at 10/s


# ------------------------------------------------------------------- fleet runs


def _run(row: Row) -> Result:
    return run_modelled(row, LATENCIES, CPU)


def test_one_install_serves_about_q_times_r_clusters() -> None:
    """The issue's arithmetic: past Q·R clusters the cycle, and so the lag, is N/Q."""
    mc = Metacontroller(workers=10, qps=50, burst=100, resync_period=None)
    polled = Mix(polled=1.0)
    small = _run(Row("small", 25, mc, TODAY_MODEL_POLICY, polled, duration=60, switchovers=20))
    big = _run(Row("big", 200, mc, TODAY_MODEL_POLICY, polled, duration=60, switchovers=60))
    assert small.api_per_second < 40 and big.api_per_second == pytest.approx(50, abs=1)
    assert small.lag(EVENTLESS, 0.9) < 1.5
    assert 3.0 < big.lag(EVENTLESS, 0.9) < 5.0  # 200 / 50 = a 4 s cycle


def test_shipped_settings_serve_200_polled_clusters_within_2_s_at_p90() -> None:
    polled = Mix(polled=1.0)
    today = _run(Row("today", 200, TODAY, TODAY_MODEL_POLICY, polled, duration=60))
    shipped = _run(Row("shipped", 200, SHIPPED, SHIPPED_POLICY, polled, duration=60))
    assert today.lag(EVENTLESS, 0.9) > 2.0
    assert shipped.lag(EVENTLESS, 0.9) <= 2.0
    assert shipped.api_per_second <= SHIPPED.qps


def test_a_resync_period_is_a_burst_that_delays_pod_events() -> None:
    mc, policy, pods, threads = recommended(1000)
    row = Row(
        "r", 1000, mc, policy, hook_pods=pods, hook_threads=threads, duration=200, switchovers=150
    )
    without = _run(replace(row, mc=replace(mc, resync_period=None)))
    every_minute = _run(replace(row, mc=replace(mc, resync_period=60.0)))
    assert without.lag(POD_CHANGING, 0.99) < every_minute.lag(POD_CHANGING, 0.99)


def test_after_every_hook_pod_was_down_only_the_resync_period_bounds_recovery() -> None:
    """Every hook pod down for 120 s with switchovers inside: without a period the parents
    wait out client-go's backoff (doubling per parent, 10 retries/s for the queue), far past
    the outage; with one, every parent is routed within a period of the hook's return."""
    mc = replace(SHIPPED, resync_period=None)
    row = Row(
        "down",
        300,
        mc,
        SHIPPED_POLICY,
        duration=30 + 120 + 400,
        switchovers=30,
        hooks_down_at=30.0,
        hooks_down_for=120.0,
    )
    without = _run(row)
    with_period = _run(replace(row, mc=replace(mc, resync_period=20.0)))
    assert without.hook_errors > 0 and with_period.hook_errors > 0
    assert len(without.recovery) == len(with_period.recovery) == 30
    assert max(with_period.recovery) <= 20.0 + 1.0
    assert max(without.recovery) > 40.0


def test_resync_period_zero_means_every_second() -> None:
    """resyncPeriodSeconds below 1 s is raised to 1 s (controller.go Start): 0 is not off."""
    mc = Metacontroller(workers=10, qps=1000, burst=1000, resync_period=0)
    quiet = Policy(poll=1000.0, event_resync=1000.0, from_reply=False)
    row = Row("zero", 20, mc, quiet, Mix(polled=1.0), duration=30, warmup=5, switchovers=0)
    result = _run(row)
    assert result.syncs_per_second == pytest.approx(20, rel=0.1)
    absent = _run(replace(row, mc=replace(mc, resync_period=None)))
    assert absent.syncs_per_second == 0


def test_recommended_5000_meets_the_api_targets_and_the_lag_targets_with_phase_spread() -> None:
    """At 5,000 clusters the API budget and the event-less lag hold with the recommended
    settings; the Pod-changing p99 <= 1 s holds only with phase-spread resyncs (the hook's,
    hooks.core.switchover.spread_resync): without them the fleet stays in one clump after a
    restart and p99 sits around 1 s (0.75-1.16 s over three seeds; docs/scale.md). Both
    without the recommended ``resyncPeriodSeconds``, whose bursts cost this p99 on their
    own (the next test)."""
    mc, policy, pods, threads = recommended(5000)
    assert mc.resync_period is None, "every shard is a large install (deploy/sharding/)"
    assert policy.spread, "the hook always spreads its healthy resyncs"
    row = Row(
        "rec", 5000, mc, policy, hook_pods=pods, hook_threads=threads, duration=90, switchovers=200
    )
    plain = _run(replace(row, policy=replace(policy, spread=False)))
    assert plain.lag(EVENTLESS, 0.99) <= policy.poll + 1.0
    assert plain.api_per_second <= 1000 and plain.api_peak <= mc.shards * (mc.qps + mc.burst)
    assert mc.shards * (mc.qps + mc.burst) <= 1000
    assert not any(plain.unfinished.values())
    spread = _run(row)
    assert spread.lag(POD_CHANGING, 0.99) <= 1.0
    assert spread.lag(EVENTLESS, 0.99) <= policy.poll + 1.0
    assert spread.lag(POD_CHANGING, 0.99) < plain.lag(POD_CHANGING, 0.99)
    assert spread.api_peak < plain.api_peak


def test_a_60_s_period_would_cost_5000_clusters_a_burst_per_period() -> None:
    """Why the shards drop the period (docs/scale.md): each tick would queue every parent of
    a shard at once, so a Pod event that lands in the burst waits for it to drain: about
    N_shard / (qps - steady rate) s; the steady API rate grows by N / period."""
    mc, policy, pods, threads = recommended(5000)
    row = Row(
        "rec", 5000, mc, policy, hook_pods=pods, hook_threads=threads, duration=150, switchovers=200
    )
    without = _run(row)
    with_net = _run(replace(row, mc=replace(mc, resync_period=60.0)))
    drain = 1000 / (mc.qps - steady_rate(1000, Mix(), policy.poll))
    assert without.lag(POD_CHANGING, 0.99) < with_net.lag(POD_CHANGING, 0.99)
    assert with_net.lag(POD_CHANGING, 1.0) <= drain + 2.0
    extra = with_net.api_per_second - without.api_per_second
    assert 0 < extra <= 1.5 * 5000 / 60.0
    assert not any(with_net.unfinished.values())


def test_the_period_is_recommended_up_to_a_large_install() -> None:
    """60 s (the shipped CompositeController) up to LARGE_INSTALL clusters an install; none
    above, as deploy/large-install/ and every shard of deploy/sharding/ ship it."""
    assert LARGE_INSTALL == 200
    assert recommended(1)[0].resync_period == 60.0 == SHIPPED.resync_period
    assert recommended(LARGE_INSTALL)[0].resync_period == 60.0
    assert recommended(LARGE_INSTALL + 1)[0].resync_period is None
    assert recommended(1000)[0].resync_period is None
    assert recommended(5000)[0].resync_period is None
    assert recommended(1000)[0] == replace(SHIPPED, resync_period=None)


def test_a_large_install_comes_back_at_the_queues_pace_without_the_period() -> None:
    """What the period would buy a large install (docs/scale.md, "After every hook pod was
    down"): after 120 s of every hook pod down, 1,000 polled clusters without it are routed
    again within about N / 10 s (the queue's retry pace: each parent failed only a few
    times, so its own backoff stayed short), not the outage's length as a small fleet."""
    mix = Mix(polled=1.0)
    mc, policy, pods, threads = recommended(1000, mix)
    row = Row(
        "down",
        1000,
        mc,
        policy,
        mix,
        hook_pods=pods,
        hook_threads=threads,
        duration=30 + 120 + 200,
        switchovers=50,
        hooks_down_at=30.0,
        hooks_down_for=120.0,
    )
    result = _run(row)
    assert result.hook_errors > 0 and result.unrecovered == 0 and len(result.recovery) >= 40
    assert max(result.recovery) <= 1000 / 10 + 10.0


def test_recommended_poll_fits_the_budget() -> None:
    for n in (100, 1000, 5000):
        mc, policy, pods, threads = recommended(n)
        assert steady_rate(n, Mix(), policy.poll) <= 0.6 * mc.qps * mc.shards
        # Every worker of every install finds a hook thread, even when all wait 2 s.
        assert pods * 2 * threads >= mc.shards * mc.workers
    assert recommended(100)[1].poll == 1.0


# ------------------------------------------------------------ the real smoke run


@pytest.mark.gunicorn
def test_real_fleet_smoke_run_follows_every_switchover() -> None:
    row = Row(
        "smoke",
        12,
        replace(TODAY, workers=4, qps=100, burst=100),
        TODAY_POLICY,
        Mix(polled=0.5, busy=0.5),
        hook_pods=1,
        duration=14.0,
        warmup=2.0,
        switchovers=10,
        seed=3,
    )
    result, latencies = run_real(row)
    assert result.hook_errors == 0
    assert latencies, "no sync reached the hook"
    lags = result.lags[POD_CHANGING] + result.lags[EVENTLESS]
    assert len(lags) >= 5 and not any(result.unfinished.values())
    assert all(lag >= 0 and math.isfinite(lag) for lag in lags)
    assert result.hook_cpu_per_sync > 0
