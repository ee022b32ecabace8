"""client-go's rate-limited work queue, for many parents: what Metacontroller's workers take
their parents from (``k8s.io/client-go/util/workqueue``, v0.36).

* ``add`` (a watch event) queues a key at once; a key already queued is not queued twice,
  and a key being processed is queued again only once its worker is done with it, so the
  same parent is never synced by two workers at once;
* ``add_after`` goes through each key's :class:`standin.loop.DelayedAdd` (an earlier
  waiting entry is never postponed by a later one);
* ``add_rate_limited`` is ``add_after`` with the per-key exponential delay of
  ``DefaultTypedControllerRateLimiter`` (5 ms doubling, capped at ``max_backoff``; client-go
  caps it at 1000 s and adds a 10 qps overall token bucket, left out here); ``forget``
  resets it after a success.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from standin.loop import DelayedAdd

BASE_DELAY = 0.005


class WorkQueue:
    def __init__(self, max_backoff: float = 1000.0) -> None:
        self.max_backoff = max_backoff
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._waiting: dict[str, DelayedAdd] = {}
        self._failures: dict[str, int] = {}
        self._cond = threading.Condition()
        self._shutdown = False

    def add(self, key: str) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
        self._cond.notify_all()

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            self._waiting.setdefault(key, DelayedAdd()).add_after(time.monotonic(), delay)
            self._cond.notify_all()

    def add_rate_limited(self, key: str) -> float:
        """Queue ``key`` after its backoff; the delay used."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(BASE_DELAY * 2.0**failures, self.max_backoff)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def waiting(self, key: str) -> float | None:
        """Seconds until ``key``'s waiting entry is due (``None``: none waits)."""
        with self._cond:
            entry = self._waiting.get(key)
            return entry.remaining(time.monotonic()) if entry else None

    def get(self, timeout: float) -> str | None:
        """The next key to process (then :meth:`done`), or ``None`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._promote_due()
                if self._shutdown:
                    return None
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                now = time.monotonic()
                if now >= deadline:
                    return None
                due = [e.remaining(now) for e in self._waiting.values()]
                wait = min([deadline - now, *(d for d in due if d is not None)])
                self._cond.wait(max(wait, 0.001))

    def _promote_due(self) -> None:
        now = time.monotonic()
        for key, entry in list(self._waiting.items()):
            if entry.fire(now):
                del self._waiting[key]
                self._add_locked(key)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
