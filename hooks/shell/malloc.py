"""glibc's malloc arenas in each gunicorn worker: two, not eight per core.

glibc gives threads that allocate at once arenas of their own (up to 8 × cores), and memory
freed in one arena serves only that arena again. A worker's 16 request threads decoding
large request bodies each grew an arena of their own, so a worker's RSS kept the sum of
their peaks: testbed/bench/memory.py measured 125 MiB per worker (275 MiB per pod, over the
256 MiB limit) with the byte budget alone, and 72 MiB (170 MiB per pod) with two arenas,
with more syncs answered in the same time (716 against 545). The request threads share
one GIL, so more arenas buy no parallelism here. ``MALLOC_ARENA_MAX`` in the environment
wins (glibc reads it itself at start); otherwise :func:`limit_arenas` sets the same limit
with ``mallopt`` in each worker, before its threads exist.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("hooks.app")

#: ``M_ARENA_MAX`` in glibc's ``malloc.h``.
_M_ARENA_MAX = -8
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap this process's malloc arenas (glibc only); whether the cap was set here."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False  # glibc read it at start: the operator's choice
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_ARENA_MAX, arenas) != 1:
        log.warning("mallopt(M_ARENA_MAX, %d) failed: malloc arenas not capped", arenas)
        return False
    return True
