"""Build the repository's Dockerfile without a Docker daemon, on a local stand-in base.

The tests, and the rig when it runs the hook from the image (:mod:`testbed.metacontroller.image`),
need the
image this repository ships, built from its own Dockerfile. Two things stand in the way on a
machine without Docker: no daemon, and no registry to pull ``python:3.11-slim-bookworm`` from.
So:

* :func:`ensure_base` makes a stand-in for the base from Debian's packages only: a
  ``debootstrap --variant=minbase --include=python3,python3-venv bookworm`` root filesystem
  from the mirror this machine's apt uses, with ``python`` on the PATH where the official image
  has it (``/usr/local/bin/python``), imported into the local containers storage with buildah.
  The root filesystem is kept as a tar under ``$XDG_CACHE_HOME/pg-failover-hook/image-base/<key>/``
  (``<key>``: a hash of the recipe), so a fresh clone on the same machine imports it in
  seconds instead of bootstrapping it again; the imported image is reused while it exists.
* :func:`ensure_image` builds the Dockerfile on that base through ``make image`` (the path a
  user takes: buildah when no Docker daemon answers), tagged with a hash of everything the
  build reads; an image with that tag already in the local storage is reused.

Both need root (debootstrap, the containers storage) and Debian's ``debootstrap`` and
``buildah``: ``make test`` and ``.ci/run`` install them when missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The tools the stand-in base and the daemon-less build need (Debian package names).
TOOLS = {"debootstrap": "debootstrap", "buildah": "buildah"}
BASE_REPOSITORY = "localhost/pgfh-standin-base"
IMAGE_REPOSITORY = "localhost/pg-failover-hook-test"
#: What the image build reads: the Dockerfile and what .dockerignore lets into the context.
BUILD_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "LICENSE")
BUILD_INPUT_DIRS = ("requirements/runtime.txt", "requirements/build.txt", "hooks")
#: How long the slow steps may take at most (a cold debootstrap takes ~1.5 min here).
DEBOOTSTRAP_TIMEOUT = 900.0
BUILD_TIMEOUT = 900.0
#: Test images kept in the local storage after a build (each is ~370 MB; a few, not one,
#: because clones or worktrees with other hooks/ contents may be testing theirs meanwhile).
KEEP_IMAGES = 3


class ImageToolsMissing(RuntimeError):
    """What to install (or how to run) to build the image here."""


def cache_root() -> Path:
    """Per machine, shared by every clone: ``${XDG_CACHE_HOME:-$HOME/.cache}/pg-failover-hook``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pg-failover-hook"


def require_tools() -> None:
    """Fail with one line saying what is missing, before any slow step."""
    missing = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if missing:
        raise ImageToolsMissing(
            f"building the image here needs {', '.join(missing)}: "
            f"apt-get install -y {' '.join(missing)} (make test and .ci/run do, as root)"
        )
    if os.geteuid() != 0:
        raise ImageToolsMissing(
            "building and running the image here needs root (debootstrap, chroot, the "
            "containers storage): run the image tests as root, as .ci/run does"
        )


def apt_mirror(sources: Path = Path("/etc/apt"), suite: str = "bookworm") -> str:
    """The Debian mirror this machine's apt uses for ``suite`` (deb822 or one-line format).

    debootstrap must reach the same place apt does: a machine behind a proxy or with a local
    mirror has it in its sources, and deb.debian.org may not be reachable from there.
    """
    candidates: list[Path] = []
    if (sources / "sources.list").is_file():
        candidates.append(sources / "sources.list")
    candidates += sorted((sources / "sources.list.d").glob("*.sources"))
    candidates += sorted((sources / "sources.list.d").glob("*.list"))
    for path in candidates:
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = _deb822(stanza)
                if (
                    "deb" in fields.get("types", "").split()
                    and suite in fields.get("suites", "").split()
                    and fields.get("enabled", "yes") != "no"
                ):
                    return fields["uris"].split()[0].rstrip("/")
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                    return words[1].rstrip("/")
    return "http://deb.debian.org/debian"


def _deb822(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields


@dataclass(frozen=True)
class BaseRecipe:
    """Everything that decides the stand-in base's contents: its hash is the cache key."""

    suite: str = "bookworm"
    variant: str = "minbase"
    include: tuple[str, ...] = ("python3", "python3-venv")
    mirror: str = field(default_factory=apt_mirror)
    arch: str = field(
        default_factory=lambda: subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    #: Where the official python image has its interpreter (and so ``python`` on the PATH).
    python_link: str = "/usr/local/bin/python"
    #: The official image's environment (``docker inspect python:3.11-slim-bookworm``).
    env: tuple[str, ...] = (
        "PATH=/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG=C.UTF-8",
    )
    #: Bumped when the steps below change in a way the fields above do not show.
    steps_version: int = 1

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def image(self) -> str:
        return f"{BASE_REPOSITORY}:{self.key}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per cache entry at a time, across processes (other clones, other users)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def image_exists(name: str) -> bool:
    """Whether the local containers storage holds ``name`` (no pull, ever)."""
    return (
        subprocess.run(
            ["buildah", "inspect", "--type", "image", name],
            capture_output=True,
            timeout=60,
            check=False,
        ).returncode
        == 0
    )


def _run(command: list[str], *, timeout: float, log: Path | None = None) -> None:
    """Run a slow step; on failure, raise with the tail of its output."""
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
    )
    if log is not None:
        log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:3])} ... exited {result.returncode}:\n"
            f"{(result.stdout + result.stderr)[-4000:]}"
        )


def ensure_base(recipe: BaseRecipe | None = None) -> str:
    """The stand-in base image's name, made (or imported from the cache) if missing."""
    recipe = recipe or BaseRecipe()
    require_tools()
    if image_exists(recipe.image):
        return recipe.image
    entry = cache_root() / "image-base" / recipe.key
    with _locked(entry.with_suffix(".lock")):
        if image_exists(recipe.image):
            return recipe.image
        tarball = entry / "rootfs.tar"
        if not tarball.is_file():
            _bootstrap(recipe, entry)
        _import(recipe, tarball)
    return recipe.image


def _bootstrap(recipe: BaseRecipe, entry: Path) -> None:
    """debootstrap the recipe into ``entry/rootfs.tar`` (written whole, then renamed)."""
    entry.mkdir(parents=True, exist_ok=True)
    rootfs = entry / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    started = time.monotonic()
    _run(
        [
            "debootstrap",
            f"--variant={recipe.variant}",
            f"--arch={recipe.arch}",
            f"--include={','.join(recipe.include)}",
            recipe.suite,
            str(rootfs),
            recipe.mirror,
        ],
        timeout=DEBOOTSTRAP_TIMEOUT,
        log=entry / "debootstrap.log",
    )
    link = rootfs / recipe.python_link.lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to("/usr/bin/python3")
    # What the official slim image leaves out too: downloaded packages and apt's lists.
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / junk).glob("*"):
            if path.is_file():
                path.unlink()
    partial = entry / "rootfs.tar.partial"
    _run(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(partial), "."],
        timeout=DEBOOTSTRAP_TIMEOUT,
    )
    partial.rename(entry / "rootfs.tar")
    shutil.rmtree(rootfs)
    (entry / "recipe.json").write_text(
        json.dumps({**asdict(recipe), "seconds": round(time.monotonic() - started, 1)}, indent=2)
        + "\n"
    )


def _import(recipe: BaseRecipe, tarball: Path) -> None:
    """The tar as a one-layer image (``buildah from scratch`` + ``add`` + ``commit``)."""
    container = subprocess.run(
        ["buildah", "from", "scratch"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    try:
        _run(["buildah", "add", "--quiet", container, str(tarball), "/"], timeout=300)
        config = ["buildah", "config", "--cmd", "python3"]
        for setting in recipe.env:
            config += ["--env", setting]
        _run([*config, container], timeout=60)
        _run(["buildah", "commit", "--quiet", container, recipe.image], timeout=300)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False, timeout=60)


def build_inputs(repo: Path = REPO) -> Iterable[Path]:
    """Every file the image build reads (what .dockerignore lets in, and the Dockerfile)."""
    for name in BUILD_INPUTS:
        yield repo / name
    for name in BUILD_INPUT_DIRS:
        path = repo / name
        if path.is_file():
            yield path
            continue
        for file in sorted(path.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                yield file


def image_key(base: str, repo: Path = REPO) -> str:
    """A hash of the build inputs (names and contents) and the base."""
    digest = hashlib.sha256(base.encode())
    for path in build_inputs(repo):
        digest.update(str(path.relative_to(repo)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass
class Built:
    """The image the tests run, and what building it cost (0 when it was already there)."""

    image: str
    base: str
    seconds: float
    cached: bool


def ensure_image(base: str | None = None) -> Built:
    """The repository's image on ``base`` (the stand-in by default), built by ``make image``."""
    base = base or ensure_base()
    name = f"{IMAGE_REPOSITORY}:{image_key(base)}"
    if image_exists(name):
        return Built(name, base, 0.0, cached=True)
    with _locked(cache_root() / "image-build.lock"):
        if image_exists(name):
            return Built(name, base, 0.0, cached=True)
        started = time.monotonic()
        _run(
            ["make", "--no-print-directory", "image", f"IMAGE={name}", f"BASE={base}"],
            timeout=BUILD_TIMEOUT,
        )
        built = Built(name, base, time.monotonic() - started, cached=False)
        prune_images(keep=name)
        return built


def images_to_prune(listing: str, keep: str, count: int = KEEP_IMAGES) -> list[str]:
    """The test images to remove, from ``buildah images --json`` (buildah's ``jsonImage``:
    ``names`` and ``created``, Unix seconds): all but the ``count`` newest of
    :data:`IMAGE_REPOSITORY`, never ``keep`` (the one just built), nothing of another name."""
    ours: list[tuple[int, str]] = []
    for image in json.loads(listing or "[]"):
        for name in image.get("names") or ():
            if name.rpartition(":")[0] == IMAGE_REPOSITORY:
                ours.append((int(image.get("created") or 0), name))
    ours.sort(reverse=True)
    newest = {name for _, name in ours[:count]} | {keep}
    return [name for _, name in ours if name not in newest]


def prune_images(keep: str) -> list[str]:
    """Remove the older test images (every change of hooks/ builds one); an image still in
    use by a running test is refused by buildah and stays. Returns what was removed."""
    listed = subprocess.run(
        ["buildah", "images", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    if listed.returncode != 0:
        return []
    removed = []
    for name in images_to_prune(listed.stdout, keep):
        result = subprocess.run(
            ["buildah", "rmi", name], capture_output=True, timeout=120, check=False
        )
        if result.returncode == 0:
            removed.append(name)
    # The layers of the removed images' builds that nothing names any more.
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True, timeout=300, check=False)
    return removed
