"""The bytes of request bodies one worker process holds at once: its memory bound.

A sync request is decoded into Python objects that take many times its size. With 16
request threads in each of 2 workers, 32 requests of the largest accepted size at once
needed 446 MiB (993 MiB at the former 4 MiB cap) on a pod limited to 256 MiB
(testbed/bench/memory.py): the kernel would kill the pod and every
sync in flight on it. Fewer threads would bound the memory, but also the number of syncs
waiting on slow members at once, which cost almost no memory. So the threads stay, and the
*bytes* are bounded instead: a request waits (holding only its thread and its socket) until
the bodies being read and loaded leave room for its own ``Content-Length``, at most
``timeout`` seconds, and is then answered 429 unread (``Retry-After: 1``): Metacontroller
calls again a second later without growing the parent's backoff (a 5xx would grow it), with
nothing changed. The budget is held only while the body is read, decoded and loaded (tens
of milliseconds); the probe round runs with the loaded request, which keeps the children
and small typed Pods, not the body's bulk. Decoding is CPU work under the GIL, so a worker
gains nothing from decoding several large bodies at once anyway.

Typical requests (20 to 400 KB) never wait: the default budget
(``PGFH_MAX_BODY_BYTES_IN_FLIGHT``, 2 × ``PGFH_MAX_REQUEST_BYTES``) holds several of them
beside the largest one.
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
