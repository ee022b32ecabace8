"""The bytes of request bodies one worker process holds at once: its memory bound.

A sync request is parsed into Python objects that take about eight times its size (a
1.25 MB request of 64 Pods peaked at 10 MiB in bench/memory.py), and they live until the
reply is written, through the probe round (up to the 2 s deadline). With 16 request
threads in each of 2 workers, 32 such requests at once needed 437 MiB on a pod limited to
256 MiB: the kernel would kill the pod and every sync in flight on it. Fewer threads would
bound the memory, but also the number of syncs waiting on slow members at once, which cost
almost no memory. So the threads stay, and the *bytes* are bounded instead: a request
waits (holding only its thread and its socket) until the bodies in progress leave room for
its own ``Content-Length``, at most ``timeout`` seconds, and is then answered 503 without
being read: Metacontroller retries it later, with nothing changed.

Typical requests (20 to 400 KB) never wait: the default budget
(``PGFH_MAX_BODY_BYTES_IN_FLIGHT``, 4 × ``PGFH_MAX_REQUEST_BYTES``) holds a dozen of them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ByteBudget:
    """A counting bound on bytes held at once by the request threads of one process."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("the byte budget must be positive")
        self.limit = limit
        self._used = 0
        self._changed = threading.Condition()

    @property
    def used(self) -> int:
        with self._changed:
            return self._used

    @contextmanager
    def held(self, size: int, timeout: float) -> Iterator[bool]:
        """Hold ``size`` bytes of the budget for the block; yield whether it was granted.

        A size over the whole budget is held as the whole budget (it runs alone rather
        than never). Not granted within ``timeout`` seconds: ``False``, nothing held.
        """
        size = min(max(size, 0), self.limit)
        with self._changed:
            granted = self._changed.wait_for(lambda: self._used + size <= self.limit, timeout)
            if granted:
                self._used += size
        try:
            yield granted
        finally:
            if granted:
                with self._changed:
                    self._used -= size
                    self._changed.notify_all()
