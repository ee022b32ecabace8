"""Machine-wide locks on the addresses a cluster listens on, held while it runs.

The harness's addresses are fixed (etcd on 127.0.0.1:2379/2380, members on 127.0.0.N:5432/8008),
so two runs on one machine (two clones' test suites, a benchmark beside the tests) would bind
the same ports: the second one's etcd fails with "address already in use" halfway through its
start, or worse, its Patroni joins the first one's etcd ("there is already a node named
pg-orders-1 running"). :func:`check_ports_free` cannot prevent that: the other run may bind
between the check and the start. So a cluster takes an ``flock`` on one file per address before
it starts and holds it until it stops; a second run on the same addresses waits for the first
(saying so once a minute) instead of failing, and clusters on other addresses (another
``first_ip`` block, the Kubernetes DCS without etcd) run side by side. The kernel drops the
locks of a process that dies, so a crash leaves nothing to clean up.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from testbed.patroni.errors import ClusterError

log = logging.getLogger("devcluster")

#: Where the lock files live: one per address, shared by every user of the machine.
LOCK_DIR = Path(os.environ.get("DEVCLUSTER_LOCK_DIR", "/tmp/pgfh-devcluster-locks"))
#: How long a start waits for another run on the same addresses (a whole test suite's real
#: cluster tests take about 15 minutes).
WAIT_SECONDS = 1800.0
#: How often a waiting start says so.
_REPORT_EVERY = 60.0
_POLL = 0.5
#: The lock files this process holds: a second cluster of the same process on the same
#: addresses fails at once (flock would make it wait for itself).
_HELD_HERE: set[Path] = set()


class AddressLocks:
    """The locks of one cluster's addresses; :meth:`acquire` and :meth:`release`."""

    def __init__(self, addresses: Iterable[tuple[str, int]], lock_dir: Path = LOCK_DIR) -> None:
        # Sorted, so that two runs that share some addresses take them in the same order.
        self.paths = [lock_dir / f"{ip}_{port}.lock" for ip, port in sorted(set(addresses))]
        self.lock_dir = lock_dir
        self._held: list[IO[bytes]] = []

    @property
    def held(self) -> bool:
        return bool(self._held)

    def acquire(self, wait_seconds: float = WAIT_SECONDS) -> float:
        """Take every lock, waiting at most ``wait_seconds`` in all; returns the seconds waited.

        Raises :class:`ClusterError` naming the address still taken when the wait runs out
        (nothing stays held then).
        """
        if self._held:
            raise ClusterError("the cluster's address locks are already held")
        mine = [path for path in self.paths if path in _HELD_HERE]
        if mine:
            raise ClusterError(
                f"this process already runs a cluster on {mine[0].stem.replace('_', ':')}"
            )
        self.lock_dir.mkdir(mode=0o1777, parents=True, exist_ok=True)
        started = time.monotonic()
        deadline = started + wait_seconds
        reported = started
        try:
            for path in self.paths:
                handle = open(path, "ab")  # noqa: SIM115 - held until release()
                self._held.append(handle)
                while True:
                    try:
                        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        _HELD_HERE.add(path)
                        break
                    except BlockingIOError:
                        now = time.monotonic()
                        if now >= deadline:
                            raise ClusterError(
                                f"another devcluster run on this machine still holds "
                                f"{path.stem.replace('_', ':')} after {wait_seconds:g} s "
                                f"(lock {path}); stop it or wait"
                            ) from None
                        if now - reported >= _REPORT_EVERY:
                            reported = now
                            log.warning(
                                "waiting for another devcluster run to free %s (%.0f s so far)",
                                path.stem.replace("_", ":"),
                                now - started,
                            )
                        time.sleep(min(_POLL, max(0.0, deadline - now)))
        except BaseException:
            self.release()
            raise
        return time.monotonic() - started

    def release(self) -> None:
        """Drop every lock held (safe to call repeatedly)."""
        held, self._held = self._held, []
        for handle in held:
            _HELD_HERE.discard(Path(handle.name))
            try:
                fcntl.flock(handle, fcntl.LOCK_UN)
            finally:
                handle.close()
