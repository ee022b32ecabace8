"""Process bookkeeping through ``/proc``: identify, find, signal and wait for processes by PID.

Why not ``psutil`` (it is installed as a Patroni dependency)? It ships no type information, so
``mypy --strict`` would need ``types-psutil``; the few things the harness needs (a process's
parent, start time, command line, environment, and which process listens on a TCP port) are a
page of ``/proc`` parsing. The harness is Linux-only anyway: it relies on all of 127.0.0.0/8
being routed to ``lo``.

Every process is handled as a :class:`Proc` (PID + kernel start time), never as a bare PID:
teardown runs late (after failed tests, from ``atexit``, from the watchdog after the harness died)
and by then a PID may have been reused by an unrelated process. Signalling re-checks the start
time first, so the harness never kills a stranger that inherited a recycled PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

#: Environment variable set on every process the harness starts (Patroni passes its environment
#: on to the postmaster, so PostgreSQL processes carry it too). Its value is the run's base dir.
ENV_BASE_DIR = "DEVCLUSTER_BASE_DIR"
#: Set on the watchdog process so that scans for leftovers never pick it up.
ENV_WATCHDOG = "DEVCLUSTER_WATCHDOG"


@dataclass(frozen=True)
class Proc:
    """A process identity that survives PID reuse: the PID plus the kernel's start time (ticks)."""

    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        """Identify the process running as ``pid`` now; ``None`` if there is none (or a zombie)."""
        stat = _read_stat(pid)
        if stat is None or stat.state in ("Z", "X"):
            return None
        return cls(pid, stat.start_time)

    def alive(self) -> bool:
        """True while this very process (not a later one with the same PID) runs (no zombie)."""
        stat = _read_stat(self.pid)
        return stat is not None and stat.start_time == self.start_time and stat.state not in "ZX"

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` if the process is still the one identified; return whether it was sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def cmdline(self) -> list[str]:
        """The argument vector (empty for kernel threads or vanished processes)."""
        return read_cmdline(self.pid)

    def describe(self) -> str:
        """``pid 123 (postgres -D ...)``, for error messages."""
        args = " ".join(self.cmdline())
        return f"pid {self.pid} ({args[:160] or '?'})"


@dataclass(frozen=True)
class _Stat:
    state: str
    ppid: int
    start_time: int


def _read_stat(pid: int) -> _Stat | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces and ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return _Stat(state=fields[0], ppid=int(fields[1]), start_time=int(fields[19]))


def read_cmdline(pid: int) -> list[str]:
    """``/proc/<pid>/cmdline`` split into arguments; empty if unreadable."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def read_environ(pid: int) -> dict[str, str]:
    """``/proc/<pid>/environ`` (readable for own processes, or all processes as root)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def all_pids() -> Iterator[int]:
    """Every PID currently listed in ``/proc``."""
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def descendants(roots: Iterable[Proc]) -> list[Proc]:
    """All living descendants of ``roots`` (children, grandchildren, ...), found by parent PID.

    One snapshot of ``/proc`` is taken, so a process forked while this runs can be missed: callers
    that must not leave anything behind repeat kill + scan until a scan finds nothing.
    """
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        stat = _read_stat(pid)
        if stat is not None and stat.state not in "ZX":
            children.setdefault(stat.ppid, []).append(pid)
    found: list[Proc] = []
    todo = [p.pid for p in roots if p.alive()]
    seen: set[int] = set(todo)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                proc = Proc.of(child)
                if proc is not None:
                    found.append(proc)
                    todo.append(child)
    return found


def wait_gone(procs: Iterable[Proc], timeout: float) -> list[Proc]:
    """Wait up to ``timeout`` seconds for all ``procs`` to exit; return those still alive."""
    pending = list(procs)
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.02) + 2):
        pending = [p for p in pending if p.alive()]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return pending


def kill_all(procs: Iterable[Proc], timeout: float = 10.0) -> list[Proc]:
    """SIGKILL ``procs`` and all their descendants, repeat until none is left; return survivors.

    Survivors can only be processes stuck in uninterruptible sleep (``D``), or ones owned by
    another user when not running as root; the caller reports them instead of hanging.
    """
    targets = list(procs)
    deadline = time.monotonic() + timeout
    for _ in range(20):
        # Stop the tree first so nobody forks a new child between our scan and the SIGKILL.
        tree = targets + descendants(targets)
        for proc in tree:
            proc.signal(signal.SIGSTOP)
        tree = targets + descendants(targets)
        if not any(p.alive() for p in tree):
            return []
        for proc in tree:
            proc.signal(signal.SIGKILL)
        left = wait_gone(tree, max(0.1, min(2.0, deadline - time.monotonic())))
        if not left or time.monotonic() >= deadline:
            return left
        targets = left
    return [p for p in targets if p.alive()]


def postmaster_pid(data_dir: Path) -> Proc | None:
    """The running postmaster of ``data_dir``, from ``postmaster.pid`` (first line).

    The file survives a SIGKILL, so the PID is accepted only while the process's command line
    still names this data directory (Patroni starts it as ``postgres -D <data_dir> ...``).
    """
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        proc = Proc.of(pid)
        if proc is not None and str(data_dir) in proc.cmdline():
            return proc
    return None


def listeners(addresses: Iterable[tuple[str, int]]) -> dict[tuple[str, int], list[Proc]]:
    """Which processes hold a listening TCP socket on each (IPv4 address, port).

    A wildcard listener (0.0.0.0:port) is reported for every requested address with that port,
    because it blocks the harness's bind just the same. Sockets whose owner cannot be seen (other
    users' processes when not root) map to an empty list.
    """
    wanted = set(addresses)
    by_inode: dict[str, list[tuple[str, int]]] = {}
    with contextlib.suppress(OSError):
        for line in (PROC / "net" / "tcp").read_text().splitlines()[1:]:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            ip = ".".join(str(b) for b in reversed(bytes.fromhex(hex_ip)))
            port = int(hex_port, 16)
            for addr in wanted:
                if addr[1] == port and ip in (addr[0], "0.0.0.0"):
                    by_inode.setdefault(inode, []).append(addr)
    result: dict[tuple[str, int], list[Proc]] = {a: [] for a in wanted if _any(a, by_inode)}
    if not by_inode:
        return result
    sockets = {f"socket:[{inode}]": addrs for inode, addrs in by_inode.items()}
    for pid in all_pids():
        with contextlib.suppress(OSError):
            for fd in (PROC / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    addrs = sockets.get(os.readlink(fd))
                    proc = Proc.of(pid) if addrs else None
                    if addrs and proc is not None:
                        for addr in addrs:
                            if proc not in result[addr]:
                                result[addr].append(proc)
    return result


def _any(addr: tuple[str, int], by_inode: dict[str, list[tuple[str, int]]]) -> bool:
    return any(addr in addrs for addrs in by_inode.values())


def processes_of_base_dir(base_dir: Path) -> list[Proc]:
    """Processes started by the harness run that uses ``base_dir`` (watchdogs excluded).

    A process belongs to the run if its environment says so (``DEVCLUSTER_BASE_DIR``, set on
    etcd and Patroni, inherited by PostgreSQL) or, when the environment is unreadable, if an
    argument of its command line lies inside the base dir.
    """
    base = str(base_dir)
    me = os.getpid()
    found: list[Proc] = []
    for pid in all_pids():
        if pid == me:
            continue
        env = read_environ(pid)
        if ENV_WATCHDOG in env:
            continue
        if env.get(ENV_BASE_DIR) == base or any(
            a == base or a.startswith(base + os.sep) or f"={base}{os.sep}" in a
            for a in read_cmdline(pid)
        ):
            proc = Proc.of(pid)
            if proc is not None:
                found.append(proc)
    return found


def harness_base_dirs() -> dict[str, list[Proc]]:
    """All processes that carry a harness marker in their environment, grouped by base dir."""
    me = os.getpid()
    runs: dict[str, list[Proc]] = {}
    for pid in all_pids():
        if pid == me:
            continue
        env = read_environ(pid)
        base = env.get(ENV_BASE_DIR)
        if base and ENV_WATCHDOG not in env:
            proc = Proc.of(pid)
            if proc is not None:
                runs.setdefault(base, []).append(proc)
    return runs


def is_postmaster(proc: Proc) -> bool:
    """A postmaster is started as ``.../postgres -D <data_dir> ...`` (its children retitle)."""
    argv = proc.cmdline()
    return bool(argv) and os.path.basename(argv[0]) == "postgres" and "-D" in argv


def shutdown(procs: Iterable[Proc], grace: float = 5.0) -> list[Proc]:
    """Stop a run's processes for good; return the ones that could not be killed.

    Everything but postmasters is SIGKILLed first (with descendants, e.g. a running pg_rewind):
    a Patroni that is still alive would restart a postmaster we just stopped. Postmasters then
    get SIGQUIT (immediate shutdown: no checkpoint, but the postmaster still removes its shared
    memory, which a SIGKILL would leak), and SIGKILL with their children after ``grace``.
    """
    procs = list(procs)
    postmasters = [p for p in procs if is_postmaster(p)]
    left = kill_all([p for p in procs if p not in postmasters], timeout=5.0)
    for pm in postmasters:
        pm.signal(signal.SIGQUIT)
    return left + kill_all(wait_gone(postmasters, grace), timeout=5.0)


def teardown_base_dir(base_dir: Path, grace: float = 5.0) -> list[Proc]:
    """:func:`shutdown` every process of a run, re-scanning until none is left (bounded)."""
    left: list[Proc] = []
    for _ in range(5):
        procs = processes_of_base_dir(base_dir)
        if not procs:
            return []
        left = shutdown(procs, grace)
    return left or processes_of_base_dir(base_dir)
