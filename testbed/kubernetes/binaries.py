"""The control plane's programs, built once per machine from the Go modules pinned here.

kube-apiserver, kube-controller-manager, kube-proxy, kubectl (Go module ``k8s.io/kubernetes``),
etcd (``go.etcd.io/etcd/server/v3``) and kube-state-metrics (``k8s.io/kube-state-metrics/v2``,
for the monitoring kit's per-cluster series) are test infrastructure only: the product stays pure
Python. Their versions are pinned by the consumer modules in ``testbed/kubernetes/go/`` (go.mod
and go.sum committed; ``k8s.io/kubernetes`` cannot be ``go install``-ed, so its module replaces
every staging module with the published one of the same minor, as sigs.k8s.io/scheduler-plugins
does for kube-scheduler).

The binaries go into a cache outside the work tree, keyed by what decides their bytes (both
go.mod and go.sum, the Go version, the platform and the build flags), so a fresh clone on the
same machine reuses them and a changed pin builds anew. A lock file serialises builds, so two
test runs that start at once build once. A failed build raises :class:`BuildError` naming the
module and the log file; nothing half-built is ever used (the binaries are moved into place
only after every one of them built).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from testbed.kubernetes.errors import ControlPlaneError

GO_DIR = Path(__file__).resolve().parent / "go"

#: program name → (consumer module folder under go/, Go package to build).
PROGRAMS: Mapping[str, tuple[str, str]] = {
    "etcd": ("etcd", "go.etcd.io/etcd/server/v3"),
    "etcdctl": ("etcd", "go.etcd.io/etcd/etcdctl/v3"),
    "kube-apiserver": ("kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver"),
    "kube-controller-manager": ("kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    "kube-proxy": ("kubernetes", "k8s.io/kubernetes/cmd/kube-proxy"),
    "kubectl": ("kubernetes", "k8s.io/kubernetes/cmd/kubectl"),
    "kube-state-metrics": ("kube-state-metrics", "k8s.io/kube-state-metrics/v2"),
}
#: Helm (``helm.sh/helm/v4``), for the chart's tests (``charts/pg-failover-hook/``): built the
#: same way into a cache folder of its own, so adding it did not change the control plane's key.
HELM_PROGRAMS: Mapping[str, tuple[str, str]] = {"helm": ("helm", "helm.sh/helm/v4/cmd/helm")}
#: Static, stripped, reproducible: the flags are part of the cache key.
BUILD_FLAGS = ("-trimpath", "-mod=readonly")
#: Where Kubernetes' programs read their own version (hack/lib/version.sh sets the same at
#: release): without it they say ``v0.0.0-master`` and kubectl refuses to parse the server's.
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
#: The oldest etcd kube-apiserver ≥ 1.31 works with (watch progress requests).
MIN_ETCD = (3, 5, 13)
#: An override for machines that have the programs already (all of PROGRAMS in one folder).
ENV_BIN_DIR = "PGFH_CONTROLPLANE_BIN_DIR"
#: The same for helm (a folder holding ``helm``).
ENV_HELM_BIN_DIR = "PGFH_HELM_BIN_DIR"
ENV_CACHE_DIR = "PGFH_CACHE_DIR"
COMPLETE_MARKER = ".complete"


class BuildError(ControlPlaneError):
    """The Go build of a control-plane program failed (the message names the log)."""


@dataclass(frozen=True)
class Binaries:
    """Where each program is, and whether this call had to build them."""

    bin_dir: Path
    built_now: bool
    build_seconds: float

    def path(self, program: str) -> Path:
        return self.bin_dir / program


def cache_root() -> Path:
    """``$PGFH_CACHE_DIR``, else ``$XDG_CACHE_HOME/pg-failover-hook``, else ``~/.cache/…``."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "pg-failover-hook"


def find_go() -> Path:
    """The ``go`` command: on the PATH, else where the official tarball puts it."""
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if not found:
        raise BuildError(
            "Go is needed to build the test control plane (kube-apiserver, etcd) and was not "
            "found on the PATH or in /usr/local/go: install Go 1.26 or newer"
        )
    return Path(found)


def go_version(go: Path) -> str:
    result = subprocess.run(
        [str(go), "env", "GOVERSION"], capture_output=True, text=True, timeout=60, check=False
    )
    return result.stdout.strip() or "unknown"


def cache_key(go_ver: str, programs: Mapping[str, tuple[str, str]] = PROGRAMS) -> str:
    """A digest of everything that decides the binaries' bytes."""
    digest = hashlib.sha256()
    for module in sorted({folder for folder, _ in programs.values()}):
        for name in ("go.mod", "go.sum"):
            digest.update(f"{module}/{name}\0".encode())
            digest.update((GO_DIR / module / name).read_bytes())
    digest.update(f"{go_ver}\0{platform.system()}\0{platform.machine()}\0".encode())
    for module in sorted({folder for folder, _ in programs.values()}):
        digest.update(_ldflags(module).encode())
    digest.update("\0".join((*BUILD_FLAGS, *sorted(programs))).encode())
    return digest.hexdigest()[:16]


def ensure_binaries(log: Callable[[str], None] = print) -> Binaries:
    """The programs of :data:`PROGRAMS`, from the override folder, the cache, or a build."""
    return _ensure(PROGRAMS, "controlplane", ENV_BIN_DIR, "the test control plane", log)


def ensure_helm(log: Callable[[str], None] = print) -> Path:
    """The pinned ``helm`` (go/helm), from ``$PGFH_HELM_BIN_DIR``, the cache, or a build."""
    return _ensure(HELM_PROGRAMS, "helm", ENV_HELM_BIN_DIR, "helm", log).path("helm")


def _ensure(
    programs: Mapping[str, tuple[str, str]],
    folder: str,
    env_bin_dir: str,
    what: str,
    log: Callable[[str], None],
) -> Binaries:
    override = os.environ.get(env_bin_dir)
    if override:
        bin_dir = Path(override)
        missing = [name for name in programs if not (bin_dir / name).is_file()]
        if missing:
            raise BuildError(f"{env_bin_dir}={bin_dir} lacks {', '.join(missing)}")
        return Binaries(bin_dir, built_now=False, build_seconds=0.0)
    go = find_go()
    key = cache_key(go_version(go), programs)
    root = cache_root() / folder
    target = root / key
    root.mkdir(parents=True, exist_ok=True)
    if (target / COMPLETE_MARKER).exists():  # built: no need to wait behind another key's build
        return Binaries(target / "bin", built_now=False, build_seconds=0.0)
    with (root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same key: wait for it
        if (target / COMPLETE_MARKER).exists():
            return Binaries(target / "bin", built_now=False, build_seconds=0.0)
        started = time.monotonic()
        _build(go, target, programs, what, log)
        return Binaries(target / "bin", built_now=True, build_seconds=time.monotonic() - started)


def _build(
    go: Path,
    target: Path,
    programs: Mapping[str, tuple[str, str]],
    what: str,
    log: Callable[[str], None],
) -> None:
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    log_file = target.with_name(target.name + ".build.log")
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOFLAGS": "",
    }
    modules: dict[str, list[str]] = {}
    for module, package in programs.values():
        modules.setdefault(module, []).append(package)
    log(
        f"building {what} ({', '.join(programs)}) into {target}; "
        f"the first build takes minutes on 2 cores (about 10 for the control plane; "
        f"log: {log_file})"
    )
    with log_file.open("w") as out:
        for module, packages in sorted(modules.items()):
            flags = [*BUILD_FLAGS, _ldflags(module)]
            out.write(f"$ go build {' '.join(flags)} -o bin/ {' '.join(packages)}\n")
            out.flush()
            result = subprocess.run(
                [str(go), "build", *flags, "-o", str(staging / "bin") + "/", *packages],
                cwd=GO_DIR / module,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=3600,
                check=False,
            )
            if result.returncode != 0:
                raise BuildError(
                    f"building {module} ({', '.join(packages)}) failed with exit code "
                    f"{result.returncode}: see {log_file}"
                )
    # go build names a binary after the package path's last element, or the one before a
    # major-version suffix (go.etcd.io/etcd/server/v3 makes "server"): rename where it differs.
    for name, (_, package) in programs.items():
        built = staging / "bin" / _binary_name(package)
        if name != built.name and built.exists():
            built.rename(staging / "bin" / name)
    missing = [name for name in programs if not (staging / "bin" / name).is_file()]
    if missing:
        raise BuildError(f"the build made no {', '.join(missing)}: see {log_file}")
    (staging / COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def pinned_version(module_folder: str, module: str) -> str:
    """The version ``go.mod`` in ``go/<module_folder>`` requires of ``module``."""
    for line in (GO_DIR / module_folder / "go.mod").read_text().splitlines():
        words = line.replace("require", "").split()
        if len(words) >= 2 and words[0] == module:
            return words[1]
    raise BuildError(f"go/{module_folder}/go.mod requires no {module}")


def _ldflags(module_folder: str) -> str:
    flags = ["-s", "-w"]
    if module_folder == "kubernetes":
        version = pinned_version("kubernetes", "k8s.io/kubernetes")
        major, minor = version.lstrip("v").split(".")[:2]
        for package in VERSION_PACKAGES:
            flags += [
                f"-X {package}.gitVersion={version}",
                f"-X {package}.gitMajor={major}",
                f"-X {package}.gitMinor={minor}",
                f"-X {package}.gitTreeState=clean",
                f"-X {package}.buildDate=1970-01-01T00:00:00Z",
            ]
    elif module_folder == "helm":  # as helm's own Makefile sets them (`helm version`)
        version = pinned_version("helm", "helm.sh/helm/v4")
        flags += [
            f"-X helm.sh/helm/v4/internal/version.version={version}",
            "-X helm.sh/helm/v4/internal/version.gitTreeState=clean",
        ]
    return "-ldflags=" + " ".join(flags)


def _binary_name(package: str) -> str:
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]


def etcd_version(etcd: Path) -> tuple[int, int, int] | None:
    """``etcd --version``'s server version, or None if it prints none."""
    try:
        result = subprocess.run(
            [str(etcd), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    for line in result.stdout.splitlines():
        if line.startswith("etcd Version:"):
            parts = line.split(":", 1)[1].strip().split(".")
            try:
                return (int(parts[0]), int(parts[1]), int(parts[2].split("-")[0]))
            except (IndexError, ValueError):
                return None
    return None
