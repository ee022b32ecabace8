"""Bounded waiting and log tails: how the harness waits for a cluster and says why it gave up."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from testbed.patroni.errors import ClusterError

T = TypeVar("T")


def poll_until(
    check: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
    details: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` until it returns something truthy; bounded by ``timeout`` and a call count.

    Raises :class:`ClusterError` naming ``what`` (plus ``details()``, e.g. log tails) on timeout.
    """
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        value = check()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval, remaining))
    extra = f"\n{details()}" if details is not None else ""
    raise ClusterError(f"timed out after {timeout:.1f}s waiting for {what}{extra}")


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file (or a note that it does not exist yet)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"<{path}: {exc.strerror}>"
    return "\n".join(text.splitlines()[-lines:])
