"""The image: the repository's Dockerfile built and run as the Deployment runs it (issue 21).

No Docker daemon and no registry here, so the Dockerfile is built by ``make image`` with
buildah on a stand-in for its base (:mod:`testbed.metacontroller.image_build`: a debootstrapped
bookworm
with Python 3.11 where the official image has it), and run by hand under the Deployment's
securityContext (:mod:`testbed.metacontroller.image`: read-only root, uid/gid 10001, the emptyDirs
and the
token Secret where the Deployment mounts them, no capabilities, no_new_privs).

Both are cached per machine: the base's root filesystem under
``${XDG_CACHE_HOME:-~/.cache}/pg-failover-hook/image-base/<recipe hash>/`` and the images in
the local containers storage, the built one tagged with a hash of every build input; a warm
run builds nothing. Needs root and Debian's debootstrap and buildah (``make test`` and
``.ci/run`` install them): without them these tests fail with what to install.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from packaging.utils import canonicalize_name

from testbed.metacontroller.gunicorn import gunicorn_hook
from testbed.metacontroller.harness import HOOK_FROM, rig_hook
from testbed.metacontroller.image import (
    DEFAULT_APP,
    ImageHook,
    deployment,
    image_config,
    image_hook,
    run_in_image,
    working_container,
)
from testbed.metacontroller.image_build import (
    IMAGE_REPOSITORY,
    KEEP_IMAGES,
    BaseRecipe,
    Built,
    build_inputs,
    ensure_base,
    ensure_image,
    image_exists,
    image_key,
    images_to_prune,
)
from tests.test_packaging import LOCK_RUNTIME, pins

pytestmark = [pytest.mark.image, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "metacontroller"
DEPLOYMENT = deployment()
#: Replies whose content does not depend on probes reaching members: the finalize request,
#: and a first sync whose Pod IPs (10.244.0.0/16) the rig's PGFH_ALLOWED_POD_CIDRS refuses.
RECORDED = ("finalize-parent-deleting.json", "sync-first-no-service.json")


@pytest.fixture(scope="session")
def built() -> Built:
    """The image, built from the Dockerfile on the stand-in base (or found in the cache)."""
    result = ensure_image()
    state = "cached" if result.cached else f"built in {result.seconds:.1f} s"
    print(f"\nimage {result.image} on {result.base}: {state}")
    return result


@pytest.fixture(scope="module")
def hook(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageHook]:
    """The hook from the image with the Deployment's env (2 workers x 16 threads)."""
    workers = int(DEPLOYMENT.env["GUNICORN_WORKERS"])
    threads = int(DEPLOYMENT.env["GUNICORN_THREADS"])
    with image_hook(
        tmp_path_factory.mktemp("image-hook"), image=built.image, workers=workers, threads=threads
    ) as running:
        yield running


def test_a_warm_run_builds_nothing(built: Built) -> None:
    """Same inputs, same tag: the second look finds the image (no make, no debootstrap)."""
    started = time.monotonic()
    again = ensure_image(ensure_base())
    assert again.cached and again.image == built.image
    assert time.monotonic() - started < 10
    assert image_key(built.base).startswith(built.image.rsplit(":", 1)[1])


def test_the_image_key_covers_every_build_input(tmp_path: Path) -> None:
    inputs = {str(p.relative_to(REPO)) for p in build_inputs()}
    assert {
        "Dockerfile",
        "requirements/runtime.txt",
        "requirements/build.txt",
        "hooks/shell/app.py",
        "LICENSE",
    } <= inputs
    assert not [p for p in inputs if "__pycache__" in p]
    assert image_key("a") != image_key("b"), "the base is part of the key"
    # A changed hooks/ file is a new image.
    copy = tmp_path / "repo"
    for path in build_inputs():
        target = copy / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    before = image_key("a", copy)
    assert before == image_key("a", REPO)
    (copy / "hooks" / "shell" / "app.py").write_text("# changed\n", encoding="utf-8")
    assert image_key("a", copy) != before


def test_older_test_images_are_pruned_and_nothing_else() -> None:
    """Every change of hooks/ builds an image of ~370 MB: all but the newest few go."""
    listing = json.dumps(
        [{"names": [f"{IMAGE_REPOSITORY}:old{n}"], "created": 1000 + n} for n in range(5)]
        + [
            {"names": ["localhost/pgfh-standin-base:k"], "created": 1},
            {"names": [f"{IMAGE_REPOSITORY}-other:x"], "created": 2},
            {"names": [], "created": 3},
        ]
    )
    pruned = images_to_prune(listing, keep=f"{IMAGE_REPOSITORY}:old0", count=3)
    assert pruned == [f"{IMAGE_REPOSITORY}:old1"]
    assert images_to_prune(listing, keep="x", count=5) == []
    assert images_to_prune("", keep="x") == []


def test_the_storage_holds_a_few_test_images_at_most(built: Built) -> None:
    listed = subprocess.run(
        ["buildah", "images", "--json"], capture_output=True, text=True, timeout=60, check=True
    )
    names = [
        name
        for image in json.loads(listed.stdout or "[]")
        for name in image.get("names") or ()
        if name.rpartition(":")[0] == IMAGE_REPOSITORY
    ]
    assert built.image in names
    assert len(names) <= KEEP_IMAGES + 1, names  # + 1: a build of another clone meanwhile


def test_the_base_recipe_uses_apts_mirror_and_is_keyed_by_it() -> None:
    recipe = BaseRecipe()
    assert recipe.include == ("python3", "python3-venv") and recipe.variant == "minbase"
    assert BaseRecipe(mirror="http://mirror.example/debian").key != recipe.key
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.is_file():
        assert recipe.mirror in sources.read_text(encoding="utf-8")


def test_the_image_runs_its_entrypoint_as_the_deployment_runs_it(hook: ImageHook) -> None:
    assert hook.container is not None
    pid1 = hook.container.pid1()
    cmdline = Path(f"/proc/{pid1}/cmdline").read_bytes().split(b"\0")
    assert b"/opt/venv/bin/gunicorn" in cmdline[1] or b"gunicorn" in cmdline[0], cmdline
    assert cmdline[-2] == DEFAULT_APP.encode()
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid1}/status").read_text().splitlines()
    )
    assert status["Uid"].split() == ["10001"] * 4 and status["Gid"].split() == ["10001"] * 4
    assert status["Groups"].split() == [str(DEPLOYMENT.fs_group)]
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[capabilities], 16) == 0, (capabilities, status[capabilities])
    assert status["NoNewPrivs"].strip() == "1"
    assert status["NSpid"].split()[-1] == "1", "gunicorn is PID 1 of its namespace"
    assert DEPLOYMENT.drops == ("ALL",) and DEPLOYMENT.read_only_root
    # The root filesystem is read-only inside; the volumes are where the Deployment has them.
    mounts = Path(f"/proc/{pid1}/mounts").read_text().splitlines()
    root = [m.split() for m in mounts if m.split()[1] == "/"]
    assert root and "ro" in root[-1][3].split(","), root
    for target, read_only, _ in DEPLOYMENT.mounts.values():
        (entry,) = [m.split() for m in mounts if m.split()[1] == target]
        assert ("ro" in entry[3].split(",")) == read_only, entry
    assert requests.get(f"{hook.url}/healthz", timeout=5).status_code == 200
    assert requests.get(f"{hook.url}/readyz", timeout=5).status_code == 200


def test_the_token_comes_from_the_mounted_secret(hook: ImageHook) -> None:
    assert hook.tokens_dir is not None and (hook.tokens_dir / "..data").is_symlink()
    body = (FIXTURES / RECORDED[0]).read_bytes()
    url = f"{hook.url}/sync"
    wrong = {"Authorization": "Bearer not-the-token", "Content-Type": "application/json"}
    assert requests.post(url, data=body, headers=wrong, timeout=10).status_code == 401
    headers = {**hook.headers, "Content-Type": "application/json"}
    assert requests.post(url, data=body, headers=headers, timeout=10).status_code == 200


_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def _comparable(reply: Any) -> Any:
    """The reply without the clock's readings (the two hooks answer seconds apart)."""
    if isinstance(reply, dict):
        return {k: _comparable(v) for k, v in reply.items()}
    if isinstance(reply, list):
        return [_comparable(v) for v in reply]
    if isinstance(reply, str) and _TIMESTAMP.match(reply):
        return "<time>"
    return reply


@pytest.mark.gunicorn
def test_sync_answers_recorded_requests_as_the_work_tree_does(
    hook: ImageHook, tmp_path: Path
) -> None:
    env = {k: DEPLOYMENT.env[k] for k in ("PGFH_ALLOWED_PATRONI_PORTS",)}
    with gunicorn_hook(tmp_path, env=env, workers=1, threads=4) as tree:
        for name in RECORDED:
            body = (FIXTURES / name).read_bytes()
            replies = []
            for running in (hook, tree):
                response = requests.post(
                    f"{running.url}/sync",
                    data=body,
                    headers={**running.headers, "Content-Type": "application/json"},
                    timeout=10,
                )
                assert response.status_code == 200, (name, response.text)
                replies.append(_comparable(response.json()))
            assert replies[0] == replies[1], name
            if name.startswith("finalize"):
                assert replies[0]["finalized"] is False, "the Service is still observed"
            else:
                assert "status" in replies[0]


def test_metrics_come_from_the_multiprocess_directory(hook: ImageHook) -> None:
    body = (FIXTURES / RECORDED[1]).read_bytes()
    headers = {**hook.headers, "Content-Type": "application/json"}
    for _ in range(4):  # both workers, most likely
        assert requests.post(f"{hook.url}/sync", data=body, headers=headers, timeout=10).ok
    text = requests.get(f"{hook.url}/metrics", timeout=5).text
    series = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    assert any(s.startswith("pgfh_") for s in series), sorted(series)[:20]
    assert re.search(r"^pgfh_\w+_total\{[^}]*\} [1-9]", text, re.M), "a counted sync"
    # The series are the worker files in the emptyDir mounted at PROMETHEUS_MULTIPROC_DIR.
    assert DEPLOYMENT.mounts["metrics"][0] == DEPLOYMENT.env["PROMETHEUS_MULTIPROC_DIR"]
    files = sorted(p.name for p in hook.metrics_dir.iterdir())
    assert [f for f in files if f.startswith("counter_") and f.endswith(".db")], files


def test_sigterm_stops_it_within_the_grace_period_and_nothing_is_written_outside_the_volumes(
    built: Built, tmp_path: Path
) -> None:
    """Own container: stopping the module's hook would end the other tests' hook."""
    with (
        working_container(built.image) as box,
        image_hook(tmp_path, image=built.image, container=box, workers=2, threads=16) as running,
    ):
        assert running.container is not None
        before = running.container.upper_before
        body = (FIXTURES / RECORDED[1]).read_bytes()
        headers = {**running.headers, "Content-Type": "application/json"}
        assert requests.post(f"{running.url}/sync", data=body, headers=headers, timeout=10).ok
        seconds = running.container.terminate()
        log = running.log_path.read_text()
        assert running.process.returncode == 0, log[-2000:]
        after = box.upper_listing()
    # preStop's sleep (5 s) comes out of the same grace period.
    assert seconds < DEPLOYMENT.grace_seconds - 5, seconds
    assert "Handling signal: term" in log and "Shutting down: Master" in log
    assert after == before, "written outside the mounted volumes"
    assert before, "the mount points the runtime made are there"
    print(f"\nSIGTERM to exit: {seconds:.2f} s")


def test_the_root_filesystem_refuses_writes_and_the_volumes_take_them(
    built: Built, tmp_path: Path
) -> None:
    probe = (
        "import errno, pathlib\n"
        "for path in ('/probe', '/opt/venv/probe', '/etc/probe', '/tmp/probe',"
        " '/run/metrics/probe', '/etc/pg-failover-hook/auth/probe'):\n"
        "    try:\n"
        "        pathlib.Path(path).write_text('x')\n"
        "        print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print(path, errno.errorcode[exc.errno])\n"
    )
    result = run_in_image(built.image, tmp_path, ["python", "-c", probe])
    assert result.returncode == 0, result.stdout
    outcome = dict(line.split() for line in result.stdout.splitlines())
    assert outcome == {
        "/probe": "EROFS",
        "/opt/venv/probe": "EROFS",
        "/etc/probe": "EROFS",
        "/tmp/probe": "written",
        "/run/metrics/probe": "written",
        "/etc/pg-failover-hook/auth/probe": "EROFS",
    }
    assert (tmp_path / "volumes" / "tmp" / "probe").read_text() == "x"


def _pip(built: Built, tmp_path: Path, *args: str) -> str:
    """``python -m pip`` in the image as the Deployment runs it (no cache: HOME is not ours)."""
    argv = ["python", "-m", "pip", "--no-cache-dir", "--disable-pip-version-check", *args]
    result = run_in_image(built.image, tmp_path, argv)
    assert result.returncode == 0, result.stdout
    return result.stdout


def test_the_image_holds_the_runtime_lock_and_nothing_else(built: Built, tmp_path: Path) -> None:
    (listing,) = _pip(built, tmp_path, "list", "--format", "json").splitlines()
    installed = {canonicalize_name(i["name"]): i["version"] for i in json.loads(listing)}
    locked = {name: version for name, (version, _, _) in pins(LOCK_RUNTIME).items()}
    assert installed.pop("pg-failover-hook") == "0.1.0"
    # python -m venv bootstraps pip and setuptools (as in the official image's venvs).
    bootstrap = {name for name in installed if name in {"pip", "setuptools"}}
    assert {n: v for n, v in installed.items() if n not in bootstrap} == locked
    for tool in ("pytest", "mypy", "ruff", "hypothesis", "patroni", "wheel", "uv"):
        assert tool not in installed, tool


def test_pip_check_is_clean_in_the_image(built: Built, tmp_path: Path) -> None:
    assert _pip(built, tmp_path, "check").strip() == "No broken requirements found."


def test_no_compiler_and_the_license_in_the_image(built: Built) -> None:
    with working_container(built.image) as box:
        root = box.rootfs
        compilers = [
            str(p.relative_to(root))
            for directory in ("usr/bin", "usr/local/bin", "opt/venv/bin")
            for pattern in ("gcc*", "cc", "c++", "g++*", "clang*", "*-linux-gnu-gcc*")
            for p in (root / directory).glob(pattern)
        ]
        assert compilers == []
        (license_file,) = (root / "opt/venv/lib").glob(
            "python3*/site-packages/pg_failover_hook-*.dist-info/licenses/LICENSE"
        )
        assert license_file.read_bytes() == (REPO / "LICENSE").read_bytes()
        assert not (root / "src").exists(), "the build context stayed in the builder stage"
    config = image_config(built.image)
    assert config.user == "10001:10001" and config.workdir == "/tmp"
    assert config.env["PROMETHEUS_MULTIPROC_DIR"] == "/run/metrics"
    size = subprocess.run(
        ["buildah", "images", "--format", "{{.Size}}", built.image],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    print(f"\nimage size: {size}")


@pytest.fixture(scope="session")
def base_without_python(built: Built) -> str:
    """The stand-in base with its Python removed (cached like the base)."""
    name = built.base.replace("pgfh-standin-base", "pgfh-standin-nopython")
    if not image_exists(name):
        with working_container(built.base) as box:
            for pattern in ("usr/bin/python3*", "usr/local/bin/python*"):
                for path in box.rootfs.glob(pattern):
                    path.unlink()
            subprocess.run(
                ["buildah", "commit", "--quiet", box.name, name],
                capture_output=True,
                check=True,
                timeout=300,
            )
    return name


def test_a_base_without_python_fails_at_the_first_step_naming_it(
    base_without_python: str,
) -> None:
    result = subprocess.run(
        [
            *("make", "--no-print-directory", "-C", str(REPO), "image", "BUILDER=buildah"),
            *(f"BASE={base_without_python}", "IMAGE=localhost/pgfh-must-not-exist:1"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"the base image {base_without_python} has no python" in output, output[-3000:]
    steps = re.findall(r"STEP \d+/\d+: (\w+)", output)
    assert steps[-1] == "RUN" and "RUN" not in steps[:-1], f"not at its first RUN: {steps}"
    assert not image_exists("localhost/pgfh-must-not-exist:1")


def test_the_rig_switches_to_the_image_with_one_setting(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOOK_FROM, "image")
    with rig_hook(tmp_path / "image", image=built.image, workers=1, threads=2) as running:
        assert isinstance(running, ImageHook)
        assert requests.get(f"{running.url}/healthz", timeout=5).status_code == 200
    monkeypatch.setenv(HOOK_FROM, "worktree")
    (tmp_path / "tree").mkdir()
    with rig_hook(tmp_path / "tree", workers=1, threads=2) as running:
        assert not isinstance(running, ImageHook)
    monkeypatch.setenv(HOOK_FROM, "registry")
    with pytest.raises(ValueError, match="PGFH_TEST_HOOK_FROM='registry'"):
        rig_hook(tmp_path / "bad")
