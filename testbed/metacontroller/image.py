"""Run the hook from the built image, as ``deploy/base/deployment.yaml`` runs it.

The counterpart of :func:`testbed.metacontroller.gunicorn.gunicorn_hook` (same arguments, same
context-manager shape, the same :class:`~standin.gunicorn.GunicornHook` yielded), but what
runs is the image built from the repository's Dockerfile
(:mod:`testbed.metacontroller.image_build`), not
the work tree: the rig switches between the two with one setting
(:func:`testbed.metacontroller.harness.rig_hook`, ``PGFH_TEST_HOOK_FROM=image``).

``podman run`` is refused on these machines, so the container is made by hand
(:mod:`testbed.metacontroller.image_enter`): the image's root filesystem (``buildah mount`` of a
fresh
working container) bound read-only, a mount and a PID namespace, the Deployment's emptyDirs
as directories of ``workdir`` bound where the Deployment mounts them (so the tests can see
what the hook writes there), its token Secret as a kubelet-style projection (``..data``
symlink, mode 0440, group ``fsGroup``), the Deployment's env and the image's
ENTRYPOINT/CMD/WORKDIR/USER, no capabilities, no_new_privs. The network is the host's:
gunicorn binds an ephemeral loopback port (``GUNICORN_BIND``) instead of 0.0.0.0:8080, and
reaches the local Patroni cluster on loopback like the work-tree runner.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.metacontroller.gunicorn import GunicornHook, free_port, serving

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "deploy" / "base" / "deployment.yaml"
DEFAULT_APP = "hooks.shell.app:create_app()"
#: Where ``workdir`` appears inside the container (read-only), for files that ``env`` names.
RIG_DIR = "/run/pgfh-rig"


@dataclass(frozen=True)
class Deployment:
    """What the Deployment says about how the hook's container runs."""

    env: dict[str, str]
    #: Volume name -> (mount path, read only, kind: "emptyDir" or "secret").
    mounts: dict[str, tuple[str, bool, str]]
    uid: int
    gid: int
    fs_group: int
    grace_seconds: int
    secret_mode: int
    read_only_root: bool
    drops: tuple[str, ...]


def deployment(path: Path = DEPLOYMENT) -> Deployment:
    """The hook container of ``deploy/base/deployment.yaml``."""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Deployment"]
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts: dict[str, tuple[str, bool, str]] = {}
    secret_mode = 0o644
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        kind = "secret" if "secret" in volume else "emptyDir"
        if kind == "secret":
            secret_mode = int(volume["secret"].get("defaultMode", 0o644))
        mounts[mount["name"]] = (mount["mountPath"], bool(mount.get("readOnly")), kind)
    security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    return Deployment(
        env={e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e},
        mounts=mounts,
        uid=int(security["runAsUser"]),
        gid=int(security["runAsGroup"]),
        fs_group=int(pod["securityContext"]["fsGroup"]),
        grace_seconds=int(pod["terminationGracePeriodSeconds"]),
        secret_mode=secret_mode,
        read_only_root=bool(security.get("readOnlyRootFilesystem")),
        drops=tuple(security.get("capabilities", {}).get("drop", ())),
    )


@dataclass(frozen=True)
class ImageConfig:
    """The parts of the image's OCI config a runtime uses."""

    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    user: str
    workdir: str

    @property
    def argv(self) -> list[str]:
        return [*self.entrypoint, *self.cmd]


def image_config(image: str) -> ImageConfig:
    raw = subprocess.run(
        ["buildah", "inspect", "--type", "image", image],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    config: dict[str, Any] = json.loads(raw)["OCIv1"]["config"]
    return ImageConfig(
        entrypoint=list(config.get("Entrypoint") or []),
        cmd=list(config.get("Cmd") or []),
        env=dict(e.split("=", 1) for e in config.get("Env") or []),
        user=str(config.get("User") or "0"),
        workdir=str(config.get("WorkingDir") or "/"),
    )


@dataclass
class Container:
    """A working container of ``image``: its root filesystem and the upper (writable) dir."""

    image: str
    name: str
    rootfs: Path
    upper: Path

    def upper_listing(self) -> dict[str, tuple[int, int]]:
        """Everything in the writable layer: path -> (size, mtime_ns); empty until written."""
        listing: dict[str, tuple[int, int]] = {}
        for path in sorted(self.upper.rglob("*")):
            stat = path.lstat()
            listing[str(path.relative_to(self.upper))] = (stat.st_size, stat.st_mtime_ns)
        return listing


@contextmanager
def working_container(image: str) -> Iterator[Container]:
    """``buildah from`` + ``buildah mount``; unmounted and removed afterwards."""
    name = f"pgfh-run-{secrets.token_hex(4)}"
    subprocess.run(
        ["buildah", "from", "--pull-never", "--quiet", "--name", name, image],
        capture_output=True,
        check=True,
        timeout=120,
    )
    try:
        rootfs = Path(
            subprocess.run(
                ["buildah", "mount", name], capture_output=True, text=True, check=True, timeout=60
            ).stdout.strip()
        )
        # overlay: <layer>/merged is the mount, <layer>/diff its writable upper directory.
        yield Container(image, name, rootfs, rootfs.with_name("diff"))
    finally:
        subprocess.run(["buildah", "umount", name], capture_output=True, check=False, timeout=60)
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False, timeout=60)


def project_secret(directory: Path, files: Mapping[str, str], *, mode: int, gid: int) -> None:
    """A Secret volume as the kubelet writes it: ``..<stamp>/`` + ``..data`` + symlinks."""
    stamp = directory / time.strftime("..%Y_%m_%d_%H_%M_%S.0000")
    stamp.mkdir(parents=True)
    for name, content in files.items():
        path = stamp / name
        path.write_text(content)
        os.chown(path, 0, gid)
        path.chmod(mode)
        (directory / name).symlink_to(f"..data/{name}")
    (directory / "..data").symlink_to(stamp.name)
    for path in (directory, stamp):
        os.chown(path, 0, gid)
        path.chmod(0o755)


@dataclass
class Plan:
    """What :mod:`testbed.metacontroller.image_enter` sets up, as JSON."""

    rootfs: str
    root: str
    binds: list[dict[str, Any]]
    cwd: str
    uid: int
    gid: int
    groups: list[int]
    argv: list[str]

    def argument(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class Started:
    """A container's process (``unshare``, whose child is the container's PID 1)."""

    process: subprocess.Popen[bytes]
    container: Container
    volumes: dict[str, Path]
    grace_seconds: int
    #: The writable layer just before the start (the mount points made): compare after.
    upper_before: dict[str, tuple[int, int]] = field(default_factory=dict)
    stop_seconds: float | None = field(default=None)

    def pid1(self, timeout: float = 10.0) -> int:
        """The host PID of the container's PID 1 (gunicorn once it started)."""
        deadline = time.monotonic() + timeout
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        while True:
            with suppress(OSError):
                pids = children.read_text().split()
                if pids:
                    return int(pids[0])
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the container's PID 1 is gone")
            time.sleep(0.01)

    def terminate(self) -> float:
        """SIGTERM to PID 1, as the kubelet sends it; the seconds until the container ended.

        Bounded by the Deployment's terminationGracePeriodSeconds, after which everything
        left is killed (SIGKILL to the process group, as the kubelet does at the deadline).
        """
        started = time.monotonic()
        if self.process.poll() is None:
            with suppress(RuntimeError, ProcessLookupError):
                os.kill(self.pid1(), signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(self.grace_seconds)
        seconds = time.monotonic() - started
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(5)
        if self.stop_seconds is None:
            self.stop_seconds = seconds
        return seconds


@contextmanager
def run_container(
    image: str,
    workdir: Path,
    argv: list[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    secret_files: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    spec: Deployment | None = None,
    container: Container | None = None,
) -> Iterator[Started]:
    """Start ``argv`` (default: the image's ENTRYPOINT + CMD) in ``image`` as the Deployment
    runs its container; the volumes are directories of ``workdir`` (``Started.volumes``).

    ``env`` comes on top of the image's and the Deployment's environment; values that name
    a path under ``workdir`` are rewritten to where ``workdir`` is inside (``RIG_DIR``).
    ``secret_files`` are the contents of the Secret volume. ``container`` reuses a working
    container (to compare its writable layer before and after); by default a fresh one.
    """
    spec = spec or deployment()
    config = image_config(image)
    workdir.mkdir(parents=True, exist_ok=True)
    with _container(image, container) as box:
        volumes: dict[str, Path] = {}
        binds: list[dict[str, Any]] = []
        for name, (target, read_only, kind) in spec.mounts.items():
            source = workdir / "volumes" / name
            if source.exists():
                raise FileExistsError(f"{source}: one container per workdir")
            if kind == "secret":
                project_secret(source, secret_files or {}, mode=spec.secret_mode, gid=spec.fs_group)
            else:
                # emptyDir with fsGroup: group-owned by it, setgid, writable by all (kubelet).
                source.mkdir(parents=True)
                os.chown(source, 0, spec.fs_group)
                source.chmod(0o2777)
            volumes[name] = source
            binds.append({"source": str(source), "target": target, "read_only": read_only})
        binds.append({"source": str(workdir), "target": RIG_DIR, "read_only": True})
        # The mount points a runtime creates in the container's writable layer.
        for bind in binds:
            (box.rootfs / bind["target"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        root = workdir / "rootfs"
        root.mkdir(exist_ok=True)
        plan = Plan(
            rootfs=str(box.rootfs),
            root=str(root),
            binds=binds,
            cwd=config.workdir,
            uid=spec.uid,
            gid=spec.gid,
            groups=[spec.fs_group],
            argv=argv or config.argv,
        )
        environment = {
            **config.env,
            "HOSTNAME": "pg-failover-hook-image",
            "HOME": _home(box.rootfs, spec.uid),
            **spec.env,
            **{k: v.replace(str(workdir), RIG_DIR) for k, v in (env or {}).items()},
        }
        upper_before = box.upper_listing()
        log = open(log_path or workdir / "container.log", "wb")  # noqa: SIM115
        with log:
            process = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--pid",
                    "--fork",
                    "--propagation",
                    "private",
                    sys.executable,
                    "-m",
                    "testbed.metacontroller.image_enter",
                    plan.argument(),
                ],
                cwd=REPO,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = Started(process, box, volumes, spec.grace_seconds, upper_before)
        try:
            yield started
        finally:
            started.terminate()


@contextmanager
def _container(image: str, container: Container | None) -> Iterator[Container]:
    if container is not None:
        yield container
    else:
        with working_container(image) as fresh:
            yield fresh


def _home(rootfs: Path, uid: int) -> str:
    """HOME as runc sets it: the user's home in the image's /etc/passwd, else /."""
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) > 5 and fields[2] == str(uid):
            return fields[5]
    return "/"


def run_in_image(
    image: str, workdir: Path, argv: list[str], *, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run a one-off command in ``image`` under the Deployment's securityContext."""
    log = workdir / "run.log"
    with run_container(image, workdir, argv, log_path=log) as started:
        try:
            started.process.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{argv} did not end in {timeout} s") from exc
        returncode = started.process.returncode
    return subprocess.CompletedProcess(argv, returncode, log.read_text(errors="replace"), "")


@dataclass
class ImageHook(GunicornHook):
    """A :class:`GunicornHook` whose process is a container (what the image tests inspect)."""

    container: Started | None = None


@contextmanager
def image_hook(
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    workers: int = 2,
    threads: int = 8,
    ready_timeout: float = 30.0,
    ca_file: Path | None = None,
    app: str = DEFAULT_APP,
    image: str | None = None,
    container: Container | None = None,
) -> Iterator[ImageHook]:
    """The hook from the image, with :func:`testbed.metacontroller.gunicorn.gunicorn_hook`'s
    interface.

    Caller authentication is on, as in production: unless ``env`` sets ``PGFH_AUTH``
    itself, a random token is the content of the Secret volume, which the Deployment mounts
    at ``PGFH_AUTH_TOKENS_PATH``; it is returned in :attr:`GunicornHook.token`, and
    :attr:`GunicornHook.tokens_dir` is the volume's directory on the host. ``image``: the
    image to run (default: :func:`testbed.metacontroller.image_build.ensure_image`, built when
    missing).
    """
    if app != DEFAULT_APP:
        raise ValueError(f"the image runs its ENTRYPOINT ({DEFAULT_APP}), not {app}")
    if image is None:
        from testbed.metacontroller.image_build import ensure_image

        image = ensure_image().image
    port = free_port()
    env = dict(env or {})
    token: str | None = None
    if "PGFH_AUTH" not in env:
        token = secrets.token_urlsafe(32)
    rig_env = {
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "GUNICORN_OPS_BIND": f"127.0.0.1:{free_port()}",
        "GUNICORN_WORKERS": str(workers),
        "GUNICORN_THREADS": str(threads),
        # The local Patroni cluster and the fakes are on loopback (as gunicorn_hook says).
        "PGFH_ALLOWED_POD_CIDRS": "127.0.0.0/8",
        **env,
    }
    log_path = workdir / "gunicorn.log"
    with run_container(
        image,
        workdir,
        env=rig_env,
        secret_files={"token": token + "\n"} if token else {},
        log_path=log_path,
        container=container,
    ) as started:
        scheme = "https" if env.get("PGFH_TLS_CERT_FILE") else "http"
        volumes = started.volumes
        hook = ImageHook(
            f"{scheme}://127.0.0.1:{port}",
            started.process,
            log_path,
            volumes["metrics"],
            token=token,
            tokens_dir=volumes["auth"] if token else None,
            verify=str(ca_file) if ca_file is not None else True,
            container=started,
        )
        with serving(hook, ready_timeout):
            yield hook
