"""client-go's work-queue rate limiter and queue (testbed.metacontroller.ratelimit,
testbed.metacontroller.workqueue), pure:
the clock is a plain number. The expected values are client-go v0.36.3's and
golang.org/x/time/rate v0.14.0's (Metacontroller v4.17.2's go.mod), worked out by hand."""

from __future__ import annotations

import pytest

from testbed.metacontroller.ratelimit import (
    BASE_DELAY,
    BUCKET_BURST,
    BUCKET_QPS,
    MAX_DELAY,
    Bucket,
    ItemExponential,
    MaxOf,
    default_controller_rate_limiter,
)
from testbed.metacontroller.workqueue import QueueCore


def test_the_defaults_are_client_gos() -> None:
    assert (BASE_DELAY, MAX_DELAY, BUCKET_QPS, BUCKET_BURST) == (0.005, 1000.0, 10.0, 100)


def test_per_item_backoff_doubles_from_5_ms_and_is_capped_at_1000_s() -> None:
    limiter = ItemExponential()
    delays = [limiter.when("a", 0.0) for _ in range(20)]
    assert delays[:5] == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert delays[17] == pytest.approx(655.36)  # 5 ms · 2^17
    assert delays[18:] == [1000.0, 1000.0]  # 5 ms · 2^18 = 1310.72 s: the cap
    assert limiter.num_requeues("a") == 20
    assert limiter.num_requeues("b") == 0
    assert limiter.when("b", 0.0) == 0.005, "per key: another key starts at 5 ms"


def test_per_item_backoff_never_overflows() -> None:
    limiter = ItemExponential(failures={"a": 5000})
    assert limiter.when("a", 0.0) == MAX_DELAY
    limiter = ItemExponential(failures={"a": 70})  # 5 ms · 2^70 s > MaxInt64 ns
    assert limiter.when("a", 0.0) == MAX_DELAY


def test_forget_resets_a_key_only() -> None:
    limiter = ItemExponential()
    for _ in range(5):
        limiter.when("a", 0.0)
        limiter.when("b", 0.0)
    limiter.forget("a")
    limiter.forget("never-seen")
    assert limiter.num_requeues("a") == 0 and limiter.num_requeues("b") == 5
    assert limiter.when("a", 0.0) == 0.005 and limiter.when("b", 0.0) == 0.16


def test_bucket_gives_a_burst_of_100_then_10_per_second() -> None:
    bucket = Bucket()
    assert [bucket.when(i, 0.0) for i in range(100)] == [0.0] * 100
    assert bucket.when("x", 0.0) == pytest.approx(0.1)
    assert bucket.when("y", 0.0) == pytest.approx(0.2)  # the debt grows: never refused
    # 0.1 s later one token is back (debt 2 - 1) and this call takes one more: 0.2 s again.
    assert bucket.when("z", 0.1) == pytest.approx(0.2)
    assert bucket.when("w", 1.1) == 0.0  # 10 more back: 8 left
    bucket.forget("z")  # nothing to forget in a bucket
    assert bucket.num_requeues("z") == 0


def test_bucket_refills_up_to_its_burst_only() -> None:
    bucket = Bucket()
    for i in range(100):
        bucket.when(i, 0.0)
    assert bucket.when("a", 1000.0) == 0.0  # full again, but never more than 100
    assert [bucket.when(i, 1000.0) for i in range(99)] == [0.0] * 99
    assert bucket.when("b", 1000.0) == pytest.approx(0.1)


def test_bucket_clock_going_back_adds_nothing() -> None:
    bucket = Bucket(qps=1.0, burst=1)
    assert bucket.when("a", 10.0) == 0.0
    assert bucket.when("b", 5.0) == pytest.approx(1.0)  # earlier than last: no refill


def test_max_of_asks_every_limiter_and_returns_the_longest() -> None:
    limiter = default_controller_rate_limiter()
    # 100 different keys at once: each 5 ms by backoff, the bucket's burst covers them.
    assert [limiter.when(i, 0.0) for i in range(100)] == [0.005] * 100
    # The 101st reservation: the bucket says 0.1 s, longer than the key's 5 ms.
    assert limiter.when("k", 0.0) == pytest.approx(0.1)
    # The same key again at t = 100 s: the bucket is full, the key's backoff (10 ms) wins.
    assert limiter.when("k", 100.0) == 0.01
    assert limiter.num_requeues("k") == 2
    limiter.forget("k")
    assert limiter.num_requeues("k") == 0
    assert limiter.when("k", 200.0) == 0.005


def test_max_of_nothing_is_no_delay() -> None:
    assert MaxOf(()).when("a", 0.0) == 0.0 and MaxOf(()).num_requeues("a") == 0


def test_a_failing_fleet_is_paced_by_the_bucket() -> None:
    """1,000 parents failing at once: the first 100 retry after 5 ms, the rest 10 a second,
    so the last one waits 90 s however short its own backoff."""
    limiter = default_controller_rate_limiter()
    delays = [limiter.when(i, 0.0) for i in range(1000)]
    assert delays[99] == 0.005 and delays[-1] == pytest.approx(90.0)


# ------------------------------------------------------------------------ the queue


def test_queue_is_fifo_dedups_and_never_hands_a_key_to_two_workers() -> None:
    queue: QueueCore[str] = QueueCore()
    assert queue.add("a", 0.0) and queue.add("b", 0.0)
    assert not queue.add("a", 0.0)
    assert queue.pop(1.0) == ("a", 1.0)
    assert not queue.add("a", 1.0), "processed: queued again only once done"
    assert queue.pop(1.0) == ("b", 1.0)
    assert queue.pop(1.0) is None
    assert queue.done("a", 2.0)
    assert not queue.done("b", 2.0)
    assert queue.pop(3.0) == ("a", 1.0)


def test_add_after_keeps_the_earliest_entry_and_fires_once() -> None:
    queue: QueueCore[str] = QueueCore()
    queue.add_after("a", 5.0, 0.0)
    queue.add_after("a", 2.0, 0.0)
    queue.add_after("a", 9.0, 0.0)
    assert queue.next_due() == 2.0 and queue.remaining("a", 1.0) == 1.0
    assert queue.promote_due(1.9) == 0
    assert queue.promote_due(2.0) == 1
    assert queue.next_due() is None and queue.remaining("a", 2.0) is None
    assert queue.pop(2.0) == ("a", 0.0)
    assert queue.add_after("b", 0.0, 3.0), "no delay: Add"
    assert queue.pop(3.0) == ("b", 0.0)


def test_an_add_leaves_a_waiting_entry_waiting() -> None:
    queue: QueueCore[str] = QueueCore()
    queue.add_after("a", 10.0, 0.0)
    queue.add("a", 1.0)  # an event (or a resync) in between
    assert queue.pop(1.0) == ("a", 0.0)
    queue.done("a", 1.5)
    assert queue.promote_due(10.0) == 1, "the entry still fires: a second sync"


def test_add_rate_limited_follows_the_limiter_and_forget_resets() -> None:
    queue: QueueCore[str] = QueueCore()
    delays = [queue.add_rate_limited("a", 0.0) for _ in range(4)]
    assert delays == [0.005, 0.01, 0.02, 0.04]
    assert queue.waiting["a"] == 0.005, "the earliest waiting entry stays"
    assert queue.num_requeues("a") == 4
    queue.add("a", 0.0)  # Add never consults the limiter
    assert queue.num_requeues("a") == 4
    queue.forget("a")
    assert queue.num_requeues("a") == 0 and queue.add_rate_limited("a", 1.0) == 0.005


def test_a_shut_queue_takes_nothing() -> None:
    queue: QueueCore[str] = QueueCore()
    queue.add("a", 0.0)
    queue.shutdown()
    assert not queue.add("b", 0.0) and not queue.add_after("b", 1.0, 0.0)
    assert queue.pop(0.0) is None
