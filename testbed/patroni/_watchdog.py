"""Watchdog: tears a run down if the harness process dies without calling ``stop()``.

Started by :class:`devcluster.PatroniCluster` with a pipe on stdin whose write end only the
harness holds. Reading blocks until the pipe reaches EOF, which happens when the harness closes
it (normal stop: nothing is left to kill) or when the harness process ends in any way, including
SIGKILL or an out-of-memory kill, where no ``finally`` or ``atexit`` runs. Then every process of
the run's base dir is killed (found through ``/proc``, see :func:`processes_of_base_dir`).
Files stay: the logs of a crashed run are what someone will want to read.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from testbed.patroni._proc import processes_of_base_dir, teardown_base_dir


def main(argv: list[str]) -> int:
    """``python -m testbed.patroni._watchdog <base_dir>``."""
    if len(argv) != 2:
        print("usage: python -m testbed.patroni._watchdog BASE_DIR", file=sys.stderr)
        return 2
    base = Path(argv[1])
    # Ctrl-C in the harness's terminal must not kill the watchdog before it did its job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sys.stdin.buffer.read()
    procs = processes_of_base_dir(base)
    if procs:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{stamp} harness gone; stopping {[p.describe() for p in procs]}", flush=True)
        left = teardown_base_dir(base)
        if left:
            print(f"could not kill {[p.describe() for p in left]}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
