"""The fleet model's clock and client-go pieces: a virtual-time event loop, client-go's work
queue (FIFO, dedup, processing set, ``AddAfter``) and its token bucket, as :mod:`bench.fleet`'s
docstring cites them from Metacontroller's and client-go's source."""

from __future__ import annotations

import asyncio
import selectors
from collections import deque
from typing import Any

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
