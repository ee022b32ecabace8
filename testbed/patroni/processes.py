"""Starting the run's files and processes: the base dir and its marker, the environment every
process carries, the watchdog, and each member's Patroni (as the cluster user).

Every process started here carries the run's base dir in its environment (``ENV_BASE_DIR``), so
that leftovers of a crashed run can be found through ``/proc`` and killed
(:mod:`testbed.patroni._proc`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.patroni._proc import ENV_BASE_DIR, ENV_WATCHDOG, Proc, teardown_base_dir
from testbed.patroni._runtime import Runtime
from testbed.patroni.errors import ClusterError
from testbed.patroni.layout import Member
from testbed.patroni.leftovers import MARKER


def make_base_dir(given: Path | None, scope: str, uid: int, gid: int) -> Path:
    """A fresh temp dir, or ``given`` emptied (it must be empty or an earlier run's)."""
    if given is None:
        parent = Path(tempfile.gettempdir())
        # The cluster user must traverse the parent; TMPDIR may point below /root.
        if not os.stat(parent).st_mode & 0o001:
            parent = Path("/var/tmp")
        base = Path(tempfile.mkdtemp(prefix=f"devcluster-{scope}-", dir=parent))
    else:
        base = given.resolve()
        base.mkdir(parents=True, exist_ok=True)
        contents = [p for p in base.iterdir() if p.name != "logs"]
        if contents and not (base / MARKER).exists():
            raise ClusterError(f"{base} is neither empty nor an earlier devcluster base dir")
        teardown_base_dir(base)
        for p in contents:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
    os.chown(base, uid, gid)
    base.chmod(0o700)
    return base


def write_marker(base_dir: Path, scope: str) -> None:
    """Mark ``base_dir`` as this harness's, with its owner (what :mod:`leftovers` looks for)."""
    me = Proc.of(os.getpid())
    marker = {
        "owner_pid": os.getpid(),
        "owner_start_time": me.start_time if me else None,
        "scope": scope,
        "created": time.time(),
        "argv": sys.argv,
    }
    (base_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def environment(runtime: Runtime, base_dir: Path) -> dict[str, str]:
    """The environment of etcd and every Patroni: a fixed locale and the base dir's mark."""
    return {
        "PATH": f"{runtime.pg_bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        ENV_BASE_DIR: str(base_dir),
    }


def start_watchdog(base_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start the process that cleans up if this one dies without stopping the cluster.

    It blocks reading a pipe whose write end only this process holds; the pipe reaches EOF
    when this process exits for any reason (even SIGKILL), and the watchdog then kills the
    run's processes by scanning ``/proc``. It runs in its own session so a Ctrl-C aimed at
    the terminal's foreground process group does not reach it.
    """
    env = {**os.environ, ENV_WATCHDOG: "1"}
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "testbed.patroni._watchdog", str(base_dir)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
        )


def stop_watchdog(watchdog: subprocess.Popen[bytes]) -> None:
    """Close the watchdog's pipe (it exits without killing anything) and reap it."""
    if watchdog.stdin is not None:
        with contextlib.suppress(OSError):
            watchdog.stdin.close()
    try:
        watchdog.wait(timeout=10)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait(timeout=5)


def launch_patroni(runtime: Runtime, m: Member, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start member ``m``'s Patroni (as the cluster user when the harness runs as root)."""
    argv = [str(runtime.python), "-m", "patroni", str(m.config_file)]
    env = {**env, "HOME": str(m.dir)}
    with open(m.patroni_log, "ab") as out:
        out.write(f"\n===== devcluster: starting {' '.join(argv)}\n".encode())
        out.flush()
        if runtime.user.drop:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(m.dir),
                start_new_session=True,
                user=runtime.user.uid,
                group=runtime.user.gid,
                extra_groups=[],
            )
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(m.dir),
            start_new_session=True,
        )
