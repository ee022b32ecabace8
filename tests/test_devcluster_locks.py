"""testbed.patroni.address_locks: two runs on one machine's same addresses wait for each other
(a CI run beside a benchmark once failed with etcd's "address already in use"), runs on other
addresses do not, a crashed holder frees its addresses, and a process never waits for itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.patroni.address_locks import AddressLocks
from testbed.patroni.errors import ClusterError

ETCD = [("127.0.0.1", 2379), ("127.0.0.1", 2380)]
MEMBERS = [("127.0.0.2", 5432), ("127.0.0.2", 8008)]

HOLDER = """
import sys, time
from pathlib import Path
from testbed.patroni.address_locks import AddressLocks
locks = AddressLocks([("127.0.0.1", 2379)], Path(sys.argv[1]))
locks.acquire(wait_seconds=5)
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def other_run(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding 127.0.0.1:2379 until killed (at most 60 s)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_second_run_on_the_same_addresses_waits_and_names_the_address(
    tmp_path: Path, other_run: subprocess.Popen[str]
) -> None:
    locks = AddressLocks(ETCD + MEMBERS, tmp_path)
    with pytest.raises(ClusterError, match=r"another devcluster run .* holds 127\.0\.0\.1:2379"):
        locks.acquire(wait_seconds=0.3)
    assert not locks.held  # nothing stays held after a wait that ran out


def test_the_wait_ends_when_the_other_run_stops_even_by_sigkill(
    tmp_path: Path, other_run: subprocess.Popen[str]
) -> None:
    locks = AddressLocks(ETCD, tmp_path)
    started = time.monotonic()
    subprocess.Popen(  # SIGKILL the holder in 0.5 s: the kernel drops its lock
        [
            sys.executable,
            "-c",
            f"import os,time; time.sleep(0.5); os.kill({other_run.pid}, {signal.SIGKILL})",
        ]
    ).wait(timeout=10)
    waited = locks.acquire(wait_seconds=20)
    try:
        assert locks.held and waited < 20
        assert time.monotonic() - started < 20
    finally:
        locks.release()


def test_runs_on_other_addresses_do_not_wait(
    tmp_path: Path, other_run: subprocess.Popen[str]
) -> None:
    locks = AddressLocks([("127.0.0.12", 5432), ("127.0.0.12", 8008)], tmp_path)
    assert locks.acquire(wait_seconds=0.0) < 0.5
    locks.release()


def test_a_process_never_waits_for_itself(tmp_path: Path) -> None:
    first = AddressLocks(MEMBERS, tmp_path)
    first.acquire(wait_seconds=0)
    try:
        with pytest.raises(
            ClusterError, match=r"this process already runs a cluster on 127\.0\.0\.2"
        ):
            AddressLocks(MEMBERS + ETCD, tmp_path).acquire(wait_seconds=30)
        with pytest.raises(ClusterError, match="already held"):
            first.acquire()
    finally:
        first.release()
    again = AddressLocks(MEMBERS, tmp_path)
    again.acquire(wait_seconds=0)  # released: free again
    again.release()
    again.release()  # twice is harmless
