"""Find and kill what earlier, crashed harness runs left behind; refuse to start over strangers.

A run that died without teardown (and whose watchdog died too, e.g. the whole process group was
SIGKILLed) leaves etcd, Patroni and detached postmasters holding 127.0.0.1:2379 and
127.0.0.2-4:5432/8008, and the next run would fail to bind, or worse, talk to the old cluster.
Such processes are recognised by the run's base dir, which every harness process carries in its
environment (``DEVCLUSTER_BASE_DIR``, inherited by PostgreSQL) and usually on its command line;
the base dir holds a marker file naming the harness process that owns it. A run whose owner is
gone is fair game; a run whose owner is alive (someone else's session) is left alone unless
forced, and a listener that is no harness process at all is never killed: the error names it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from testbed.patroni._proc import (
    ENV_BASE_DIR,
    Proc,
    harness_base_dirs,
    listeners,
    processes_of_base_dir,
    read_cmdline,
    read_environ,
    shutdown,
)
from testbed.patroni.errors import ClusterError

#: File in every base dir: owner PID and start time, creation time.
MARKER = "devcluster-run.json"


def owner_alive(base_dir: Path) -> bool:
    """Whether the harness process that created ``base_dir`` still runs (PID + start time)."""
    try:
        marker = json.loads((base_dir / MARKER).read_text())
        return Proc(int(marker["owner_pid"]), int(marker["owner_start_time"])).alive()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def base_dir_of(proc: Proc) -> Path | None:
    """The harness base dir a process belongs to (environment marker, else command line)."""
    env_base = read_environ(proc.pid).get(ENV_BASE_DIR)
    if env_base:
        return Path(env_base)
    for arg in read_cmdline(proc.pid):
        path = arg.partition("=")[2] if arg.startswith("--") else arg
        if path.startswith("/"):
            for parent in list(Path(path).parents)[:-1][:6]:
                if (parent / MARKER).is_file():
                    return parent
    return None


def kill_leftovers(addresses: Iterable[tuple[str, int]] = (), force: bool = False) -> list[str]:
    """Stop processes of earlier harness runs whose owner is gone; return what was killed.

    Candidates: every process with a harness base dir in its environment, plus whatever listens
    on ``addresses`` and can be traced to a base dir. ``force`` also stops live owners' runs.
    """
    runs = harness_base_dirs()
    for procs in listeners(addresses).values():
        for proc in procs:
            base = base_dir_of(proc)
            if base is not None:
                runs.setdefault(str(base), []).append(proc)
    killed: list[str] = []
    for run_dir, procs in runs.items():
        if not force and owner_alive(Path(run_dir)):
            continue
        everything = list(dict.fromkeys(procs + processes_of_base_dir(Path(run_dir))))
        killed += [f"{p.describe()} of {run_dir}" for p in everything if p.alive()]
        shutdown(everything)
        prune_data(Path(run_dir))
    return killed


def prune_data(run_dir: Path) -> None:
    """Delete the data (PGDATA, etcd) of a dead run but keep its logs for a post-mortem."""
    if not (run_dir / MARKER).is_file():
        return  # not provably a harness base dir: touch nothing
    shutil.rmtree(run_dir / "etcd", ignore_errors=True)
    for config in run_dir.glob("*/patroni.yml"):
        shutil.rmtree(config.parent / "data", ignore_errors=True)


def check_ports_free(addresses: Iterable[tuple[str, int]]) -> None:
    """Raise a :class:`ClusterError` naming whoever listens on one of the cluster's addresses."""
    busy = listeners(addresses)
    if not busy:
        return
    lines = []
    for (ip, port), procs in sorted(busy.items()):
        who = ", ".join(p.describe() for p in procs) or "a process this user cannot see"
        base = next((b for p in procs if (b := base_dir_of(p)) is not None), None)
        owner = f" (devcluster run {base}, its owner is alive)" if base else ""
        lines.append(f"{ip}:{port} is in use by {who}{owner}")
    raise ClusterError(
        "cannot start the cluster:\n"
        + "\n".join(lines)
        + "\nstop it (`python -m testbed.patroni cleanup --force` stops devcluster runs)"
    )
