"""client-go's rate-limited work queue, what Metacontroller's workers take their parents from
(``k8s.io/client-go/util/workqueue`` v0.36.3, as Metacontroller v4.17.2 builds it in
``pkg/controller/composite/controller.go`` ``newParentController``:
``NewTypedRateLimitingQueueWithConfig(DefaultTypedControllerRateLimiter())``).

:class:`QueueCore` is the queue itself, pure (the clock passed in), shared by the stand-in
(:class:`WorkQueue`, threads and the monotonic clock) and the fleet model
(:mod:`testbed.bench.fleet.virtual_queue`, a virtual clock):

* ``add`` (``queue.go`` ``Add``: a watch event, a resync) queues a key at once; a key already
  queued (``dirty``) is not queued twice, and a key being processed is queued again only
  once its worker calls ``done``, so one parent is never synced by two workers at once;
* ``add_after`` (``delaying_queue.go``): one waiting entry per key, and a later ``AddAfter``
  only ever moves it EARLIER (``insert``); when due the key is ``Add``-ed and the entry
  dropped. A plain ``add`` leaves a waiting entry alone: it still fires later;
* ``add_rate_limited`` is ``add_after(key, limiter.when(key))`` with
  :func:`testbed.metacontroller.ratelimit.default_controller_rate_limiter` (5 ms doubling per key up
  to
  1000 s, and a 10/s burst-100 bucket for the whole queue, the longer of the two);
  ``forget`` resets the key's count (Metacontroller: after every successful sync).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from testbed.metacontroller.ratelimit import RateLimiter, default_controller_rate_limiter

K = TypeVar("K", bound=Hashable)


@dataclass
class QueueCore(Generic[K]):
    """The queue's state and rules; every method that depends on time takes ``now``."""

    limiter: RateLimiter = field(default_factory=default_controller_rate_limiter)
    queue: deque[K] = field(default_factory=deque)
    dirty: set[K] = field(default_factory=set)
    processing: set[K] = field(default_factory=set)
    #: The waiting entries: key → when it is due (one per key, the earliest asked for).
    waiting: dict[K, float] = field(default_factory=dict)
    #: When each queued key was pushed (a benchmark's queue wait).
    queued_at: dict[K, float] = field(default_factory=dict)
    shut: bool = False
    _heap: list[tuple[float, int, K]] = field(default_factory=list)
    _seq: int = 0

    def add(self, key: K, now: float) -> bool:
        """``Add``; whether the key was pushed (a worker may take it now)."""
        if self.shut or key in self.dirty:
            return False
        self.dirty.add(key)
        if key in self.processing:
            return False
        self.queue.append(key)
        self.queued_at[key] = now
        return True

    def add_after(self, key: K, delay: float, now: float) -> bool:
        """``AddAfter``; whether the key was pushed at once (``delay <= 0``)."""
        if self.shut:
            return False
        if delay <= 0:
            return self.add(key, now)
        ready = now + delay
        current = self.waiting.get(key)
        if current is None or ready < current:
            self.waiting[key] = ready
            self._seq += 1
            heapq.heappush(self._heap, (ready, self._seq, key))
        return False

    def add_rate_limited(self, key: K, now: float) -> float:
        """``AddRateLimited``; the delay the limiter gave."""
        delay = self.limiter.when(key, now)
        self.add_after(key, delay, now)
        return delay

    def forget(self, key: K) -> None:
        self.limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self.limiter.num_requeues(key)

    def promote_due(self, now: float) -> int:
        """The waiting loop: every due entry ``Add``-ed; how many keys were pushed."""
        pushed = 0
        while self._heap and self._heap[0][0] <= now:
            ready, _, key = heapq.heappop(self._heap)
            if self.waiting.get(key) != ready:
                continue  # superseded by an earlier entry, already fired
            del self.waiting[key]
            pushed += self.add(key, now)
        return pushed

    def next_due(self) -> float | None:
        """When the earliest waiting entry is due (``None``: nothing waits)."""
        while self._heap and self.waiting.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def remaining(self, key: K, now: float) -> float | None:
        ready = self.waiting.get(key)
        return None if ready is None else max(0.0, ready - now)

    def pop(self, now: float) -> tuple[K, float] | None:
        """``Get`` without blocking: the next key (now being processed) and how long it was
        queued, or ``None``."""
        if self.shut or not self.queue:
            return None
        key = self.queue.popleft()
        self.dirty.discard(key)
        self.processing.add(key)
        return key, now - self.queued_at.pop(key, now)

    def done(self, key: K, now: float) -> bool:
        """``Done``; whether the key was pushed again (it was added while processed)."""
        self.processing.discard(key)
        if key in self.dirty:
            self.queue.append(key)
            self.queued_at[key] = now
            return True
        return False

    def shutdown(self) -> None:
        self.shut = True


class WorkQueue:
    """:class:`QueueCore` for threads on the monotonic clock (the stand-in's workers)."""

    def __init__(self, limiter: RateLimiter | None = None) -> None:
        self.core: QueueCore[str] = QueueCore(limiter or default_controller_rate_limiter())
        self._cond = threading.Condition()

    def add(self, key: str) -> None:
        with self._cond:
            if self.core.add(key, time.monotonic()):
                self._cond.notify_all()

    def add_after(self, key: str, delay: float) -> None:
        with self._cond:
            self.core.add_after(key, delay, time.monotonic())
            self._cond.notify_all()

    def add_rate_limited(self, key: str) -> float:
        """Queue ``key`` after its rate limiter's delay; the delay used."""
        with self._cond:
            delay = self.core.add_rate_limited(key, time.monotonic())
            self._cond.notify_all()
            return delay

    def forget(self, key: str) -> None:
        with self._cond:
            self.core.forget(key)

    def num_requeues(self, key: str) -> int:
        with self._cond:
            return self.core.num_requeues(key)

    def waiting(self, key: str) -> float | None:
        """Seconds until ``key``'s waiting entry is due (``None``: none waits)."""
        with self._cond:
            return self.core.remaining(key, time.monotonic())

    def get(self, timeout: float) -> str | None:
        """The next key to process (then :meth:`done`), or ``None`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                self.core.promote_due(now)
                if self.core.shut:
                    return None
                taken = self.core.pop(now)
                if taken is not None:
                    return taken[0]
                if now >= deadline:
                    return None
                due = self.core.next_due()
                wait = deadline - now if due is None else min(deadline - now, due - now)
                self._cond.wait(max(wait, 0.001))

    def done(self, key: str) -> None:
        with self._cond:
            if self.core.done(key, time.monotonic()):
                self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self.core.shutdown()
            self._cond.notify_all()
