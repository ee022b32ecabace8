"""PID 1 of a container made by hand: mounts, chroot, credentials, then the image's command.

``podman run`` is refused on these machines (crun's setrlimit is not permitted), so
:mod:`testbed.metacontroller.image` does what a container runtime does for the Deployment's
securityContext,
with the kernel's own tools: ``unshare --mount --pid --fork`` gives a private mount namespace
and a PID namespace, and this module, started there as PID 1, then

1. binds the image's root filesystem (``buildah mount``) read-only onto a fresh directory
   (``readOnlyRootFilesystem: true``), with ``/proc``, a minimal ``/dev`` and ``/dev/shm``;
2. binds the volumes (the Deployment's emptyDirs and its token Secret) where the Deployment
   mounts them, read-only where it says so;
3. chroots there, changes to the image's working directory, drops every capability from the
   bounding set (``capabilities.drop: [ALL]``), sets no_new_privs
   (``allowPrivilegeEscalation: false``), takes the supplementary group, group and user
   (``fsGroup``, ``runAsGroup``, ``runAsUser``: setuid clears the permitted, effective and
   ambient sets) and
4. replaces itself with the image's ENTRYPOINT + CMD, so gunicorn is PID 1 as in a Pod.

The plan comes as JSON in ``argv[1]`` (:class:`testbed.metacontroller.image.Plan` writes it); the
environment
of this process is the container's environment, passed on unchanged.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
#: The device nodes every container gets (the OCI runtime spec's default devices).
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def mount(*args: str) -> None:
    subprocess.run(["/usr/bin/mount", *args], check=True)


def inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def build_root(plan: dict[str, Any]) -> Path:
    root = Path(plan["root"])
    mount("--bind", plan["rootfs"], str(root))
    mount("-o", "remount,bind,ro", str(root))
    mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", str(inside(root, "/proc")))
    dev = inside(root, "/dev")
    mount("-t", "tmpfs", "-o", "nosuid,mode=0755,size=65536k", "tmpfs", str(dev))
    for name in DEVICES:
        (dev / name).touch()
        mount("--bind", f"/dev/{name}", str(dev / name))
    (dev / "shm").mkdir()
    mount("-t", "tmpfs", "-o", "nosuid,nodev,noexec,mode=1777,size=65536k", "shm", str(dev / "shm"))
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        (dev / name).symlink_to(target)
    (dev / "stdout").symlink_to("/proc/self/fd/1")
    (dev / "stderr").symlink_to("/proc/self/fd/2")
    mount("-o", "remount,ro,bind", str(dev))
    for volume in plan["binds"]:
        target = str(inside(root, volume["target"]))
        mount("--bind", volume["source"], target)
        if volume["read_only"]:
            mount("-o", "remount,bind,ro", target)
    return root


def drop_privileges(plan: dict[str, Any]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for capability in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {capability}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    os.setgroups(plan["groups"])
    os.setgid(plan["gid"])
    os.setuid(plan["uid"])


def resolve(command: str, path: str) -> str:
    """The command as the runtime finds it: on the container's PATH, inside the chroot."""
    if "/" in command:
        return command
    for directory in path.split(":"):
        candidate = Path(directory or ".") / command
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError(f"{command} not on the image's PATH {path}")


def main() -> None:
    plan: dict[str, Any] = json.loads(sys.argv[1])
    root = build_root(plan)
    os.chroot(root)
    os.chdir(plan["cwd"])
    drop_privileges(plan)
    # Python ignores SIGPIPE and SIGXFSZ for itself; a runtime starts the command without.
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)
    argv: list[str] = plan["argv"]
    os.execv(resolve(argv[0], os.environ.get("PATH", "")), argv)


if __name__ == "__main__":
    main()
