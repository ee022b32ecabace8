"""client-go's work-queue rate limiter, as Metacontroller v4.17.2 builds its queue with it:
``workqueue.DefaultTypedControllerRateLimiter`` (client-go v0.36.3, the version its go.mod
pins; ``util/workqueue/default_rate_limiters.go``).

Pure: the clock is passed in (``now``, seconds on any monotonic scale), so the stand-in's
threads (:mod:`testbed.metacontroller.workqueue`) and the fleet model's virtual clock
(:mod:`testbed.bench.fleet.virtual_queue`) run the same code, and the tests drive it with
plain values.

* :class:`ItemExponential` is ``TypedItemExponentialFailureRateLimiter(5ms, 1000s)``:
  ``When`` returns ``base · 2^failures`` (then counts one more failure), capped at 1000 s;
  ``Forget`` drops the count; ``NumRequeues`` is the count.
* :class:`Bucket` is ``TypedBucketRateLimiter{rate.NewLimiter(10, 100)}``: ``When`` is
  ``Reserve().Delay()`` of ``golang.org/x/time/rate`` v0.14.0: the bucket starts full (100
  tokens), refills at 10/s up to 100, and a reservation takes a token even when none is
  left, so the debt grows and each further reservation waits ``debt / 10`` s. One bucket
  for the whole queue (every key); ``Forget`` does nothing.
* :class:`MaxOf` is ``TypedMaxOfRateLimiter``: ``When`` asks EVERY limiter (each counts or
  reserves) and returns the longest delay; ``Forget`` forgets in all of them.

Metacontroller (``pkg/controller/composite/controller.go`` ``processNextWorkItem``) calls
``AddRateLimited`` (``AddAfter(key, When(key))``) after a failed sync and ``Forget`` after a
successful one; a 429 with ``Retry-After`` is ``AddAfter`` without ``When`` and without
``Forget`` (the count stays). Events and ``resyncPeriodSeconds`` enqueue with ``Add``, which
never consults the limiter.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

#: ``DefaultTypedControllerRateLimiter``'s per-item base delay and cap (s).
BASE_DELAY = 0.005
MAX_DELAY = 1000.0
#: Its overall bucket: 10 retries/s, 100 at once.
BUCKET_QPS = 10.0
BUCKET_BURST = 100
#: Go's ``math.MaxInt64`` nanoseconds: past it ``When`` returns the cap (no overflow).
_MAX_INT64_NS = float(2**63 - 1)


class RateLimiter(Protocol):
    """client-go's ``TypedRateLimiter`` with the clock passed in (any hashable key)."""

    def when(self, key: Hashable, now: float) -> float: ...

    def forget(self, key: Hashable) -> None: ...

    def num_requeues(self, key: Hashable) -> int: ...


@dataclass
class ItemExponential:
    """Per key: ``base · 2^n`` for its n-th failure since ``forget`` (from 0), capped."""

    base: float = BASE_DELAY
    cap: float = MAX_DELAY
    failures: dict[Hashable, int] = field(default_factory=dict)

    def when(self, key: Hashable, now: float) -> float:
        exp = self.failures.get(key, 0)
        self.failures[key] = exp + 1
        if exp > 1023:  # 2.0**exp would overflow a float; Go's math.Pow gives +Inf: the cap
            return self.cap
        backoff = self.base * 2.0**exp
        if backoff * 1e9 > _MAX_INT64_NS:
            return self.cap
        return min(backoff, self.cap)

    def forget(self, key: Hashable) -> None:
        self.failures.pop(key, None)

    def num_requeues(self, key: Hashable) -> int:
        return self.failures.get(key, 0)


@dataclass
class Bucket:
    """``rate.Limiter`` with ``Reserve()``: one token per call, never refused."""

    qps: float = BUCKET_QPS
    burst: int = BUCKET_BURST
    tokens: float = float(BUCKET_BURST)
    #: When the tokens were last computed (``None``: never, the bucket is full).
    last: float | None = None

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def when(self, key: Hashable, now: float) -> float:
        last = now if self.last is None or now < self.last else self.last
        tokens = min(float(self.burst), self.tokens + (now - last) * self.qps)
        tokens -= 1.0
        self.tokens = tokens
        self.last = now
        return -tokens / self.qps if tokens < 0 else 0.0

    def forget(self, key: Hashable) -> None:
        return None

    def num_requeues(self, key: Hashable) -> int:
        return 0


@dataclass
class MaxOf:
    """The longest delay of all limiters, every one of them asked."""

    limiters: tuple[RateLimiter, ...]

    def when(self, key: Hashable, now: float) -> float:
        return max((limiter.when(key, now) for limiter in self.limiters), default=0.0)

    def forget(self, key: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(key)

    def num_requeues(self, key: Hashable) -> int:
        return max((limiter.num_requeues(key) for limiter in self.limiters), default=0)


def default_controller_rate_limiter() -> MaxOf:
    """``DefaultTypedControllerRateLimiter``: exponential 5 ms → 1000 s per key, and 10/s
    burst 100 for the queue."""
    return MaxOf((ItemExponential(), Bucket()))
