"""The fleet model's clock and client-go pieces: a virtual-time event loop, client-go's work
queue (the stand-in's own, :mod:`testbed.metacontroller.workqueue`, with client-go's rate limiter
:mod:`testbed.metacontroller.ratelimit`) and the REST client's token bucket, as
:mod:`testbed.bench.fleet.table`'s docstring cites them from Metacontroller's and client-go's
source."""

from __future__ import annotations

import asyncio
import selectors
from collections import deque
from typing import Any

from testbed.metacontroller.workqueue import QueueCore

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
    """client-go's rate-limited work queue on the virtual clock: the stand-in's own
    :class:`testbed.metacontroller.workqueue.QueueCore` (FIFO, dedup, processing set, ``AddAfter``,
    ``AddRateLimited`` with
    :func:`testbed.metacontroller.ratelimit.default_controller_rate_limiter`,
    ``Forget``), with timers for the waiting entries and futures for the idle workers."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.core: QueueCore[int] = QueueCore()
        self.getters: deque[asyncio.Future[None]] = deque()

    @property
    def queue(self) -> deque[int]:
        return self.core.queue

    @property
    def waiting(self) -> dict[int, float]:
        return self.core.waiting

    def add(self, key: int) -> None:
        if self.core.add(key, self.loop.time()):
            self._wake()

    def add_after(self, key: int, delay: float) -> None:
        now = self.loop.time()
        before = self.core.waiting.get(key)
        if self.core.add_after(key, delay, now):
            self._wake()
        ready = self.core.waiting.get(key)
        if ready is not None and ready != before:
            self.loop.call_at(ready, self._promote)

    def add_rate_limited(self, key: int) -> float:
        """``AddRateLimited``: after the limiter's delay (the longer of the key's backoff
        and the queue's bucket); the delay."""
        delay = self.core.limiter.when(key, self.loop.time())
        self.add_after(key, delay)
        return delay

    def forget(self, key: int) -> None:
        self.core.forget(key)

    def _promote(self) -> None:
        for _ in range(self.core.promote_due(self.loop.time())):
            self._wake()

    def _wake(self) -> None:
        while self.getters:
            getter = self.getters.popleft()
            if not getter.done():
                getter.set_result(None)
                break

    async def get(self) -> tuple[int, float]:
        while True:
            taken = self.core.pop(self.loop.time())
            if taken is not None:
                return taken
            getter = self.loop.create_future()
            self.getters.append(getter)
            await getter

    def done(self, key: int) -> None:
        if self.core.done(key, self.loop.time()):
            self._wake()


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
