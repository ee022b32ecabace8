"""The lock, the image recipe and the licence: what makes an install reproducible.

* ``requirements/test.txt`` (``.venv``: tests, demo, CI) and ``requirements/runtime.txt``
  (the image) pin every package with hashes; they agree with each other and with
  pyproject.toml's ranges, and this very ``.venv`` holds exactly the locked versions
  (``make venv`` installs from the lock with ``--require-hashes``).
* ``make image`` builds with a tag that is a variable, and its default is the image the
  Deployment names (so ``kustomize``'s ``images:`` has one name to replace).
* LICENSE is the Apache-2.0 text pyproject.toml announces.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
LOCK_TEST = REPO / "requirements" / "test.txt"
LOCK_RUNTIME = REPO / "requirements" / "runtime.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def pins(lock: Path) -> dict[str, tuple[str, str | None, int]]:
    """``name -> (version, marker, number of hashes)`` of a uv/pip-tools hashed lock."""
    result: dict[str, tuple[str, str | None, int]] = {}
    entry: str | None = None
    for line in lock.read_text(encoding="utf-8").splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            requirement = Requirement(line.rstrip(" \\"))
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            entry = canonicalize_name(requirement.name)
            marker = str(requirement.marker) if requirement.marker else None
            result[entry] = (spec.version, marker, 0)
        elif line.strip().startswith("--hash=sha256:") and entry is not None:
            version, marker, hashes = result[entry]
            result[entry] = (version, marker, hashes + 1)
    return result


def test_every_locked_package_is_pinned_with_hashes() -> None:
    for lock in (LOCK_TEST, LOCK_RUNTIME):
        locked = pins(lock)
        assert locked, lock
        unhashed = sorted(name for name, (_, _, hashes) in locked.items() if hashes == 0)
        assert unhashed == [], f"{lock.name}: no hash for {unhashed}"
        assert "make lock" in lock.read_text(encoding="utf-8").splitlines()[1], "refresh command"


def test_locks_agree_with_each_other_and_with_pyproject() -> None:
    test, runtime = pins(LOCK_TEST), pins(LOCK_RUNTIME)
    differing = sorted(n for n in runtime if n in test and test[n][0] != runtime[n][0])
    assert differing == [], f"the image and the tests would run different versions: {differing}"
    assert set(runtime) <= set(test)
    project = PYPROJECT["project"]
    wanted = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        wanted += [r for r in extra if not r.startswith(project["name"])]
    for raw in wanted:
        requirement = Requirement(raw)
        name = canonicalize_name(requirement.name)
        assert name in test, f"{raw} is not in {LOCK_TEST.name}: run make lock"
        assert requirement.specifier.contains(test[name][0], prereleases=True), (
            f"{raw} does not allow the locked {test[name][0]}: run make lock"
        )
        if raw in project["dependencies"]:
            assert name in runtime, f"{raw} is not in {LOCK_RUNTIME.name}: run make lock"


def test_this_venv_holds_exactly_the_locked_versions() -> None:
    """`make venv` installs from the lock: what the tests run with is what is locked."""
    mismatched = []
    for name, (version, marker, _) in pins(LOCK_TEST).items():
        if marker is not None and not Requirement(f"x; {marker}").marker.evaluate():  # type: ignore[union-attr]
            continue
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            mismatched.append(f"{name}: locked {version}, not installed")
            continue
        if canonicalize_name(installed) != canonicalize_name(version):
            mismatched.append(f"{name}: locked {version}, installed {installed}")
    assert mismatched == [], mismatched


def test_makefile_installs_from_the_lock_and_can_refresh_it() -> None:
    dry = subprocess.run(
        ["make", "-n", "-B", "-C", str(REPO), ".venv/.installed", "lock"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--require-hashes --no-deps -r requirements/test.txt" in dry
    assert "--no-deps -e ." in dry
    assert "pip compile pyproject.toml" in dry and "-o requirements/test.txt" in dry
    assert "-o requirements/runtime.txt" in dry


def deployment_image() -> str:
    for doc in yaml.safe_load_all((REPO / "deploy/base/deployment.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            image: str = doc["spec"]["template"]["spec"]["containers"][0]["image"]
            return image
    raise AssertionError("no Deployment")


def test_make_image_tags_with_a_variable_defaulting_to_the_deployments_image() -> None:
    def dry(*args: str) -> str:
        return subprocess.run(
            ["make", "-n", "-C", str(REPO), "image", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    for builder, command in (
        ("docker", "docker build"),
        ("buildah", "buildah bud --isolation chroot --layers"),
        ("podman", "podman build --isolation chroot --layers"),
    ):
        ca = "BUILD_CA=/etc/ssl/certs/ca-certificates.crt"
        assert f"{command} -t {deployment_image()} ." in dry(f"BUILDER={builder}", "BUILD_CA=")
        assert f"{command} -t registry.example.com/t/pgfh:9.9 ." in dry(
            f"BUILDER={builder}", "BUILD_CA=", "IMAGE=registry.example.com/t/pgfh:9.9"
        )
        # The base, the CA bundle (a build secret, never a layer) and an index mirror.
        assert (
            f"{command} --build-arg BASE=localhost/b:1 --build-arg PIP_INDEX_URL=https://m/simple"
            f" --secret id=pipcert,src=/etc/ssl/certs/ca-certificates.crt -t {deployment_image()} ."
        ) in dry(f"BUILDER={builder}", "BASE=localhost/b:1", "PIP_INDEX_URL=https://m/simple", ca)


def test_make_image_picks_docker_only_when_a_daemon_answers() -> None:
    def dry(*args: str) -> str:
        return subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(REPO), "image", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    assert dry("DOCKER=true", "BUILDAH=true").startswith("true build ")
    assert dry("DOCKER=false", "BUILDAH=true").startswith("true bud ")
    assert dry("DOCKER=false", "BUILDAH=no-buildah", "PODMAN=true").startswith("true build ")


def test_make_image_without_any_builder_says_what_to_install_in_one_line() -> None:
    result = subprocess.run(
        [
            *("make", "--no-print-directory", "-C", str(REPO), "image"),
            *("DOCKER=false", "BUILDAH=no-such-buildah", "PODMAN=no-such-podman"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    (line,) = result.stdout.splitlines()
    assert "no Docker daemon answers" in line and "apt-get install -y buildah" in line
    version = PYPROJECT["project"]["version"]
    assert deployment_image().endswith(f":{version}"), "the manifests name this version"


def test_kustomize_images_points_the_deployment_at_your_registry(tmp_path: Path) -> None:
    """What docs/deploy.md tells users to write: an overlay with an `images:` entry."""
    from tests.manifest_helpers import kubectl

    name = deployment_image().rsplit(":", 1)[0]
    digest = "sha256:" + "ab" * 32
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(REPO / "deploy", tmp_path)],
                "images": [
                    {
                        "name": name,
                        "newName": "registry.example.com/team/pg-failover-hook",
                        "digest": digest,
                    }
                ],
            }
        )
    )
    result = subprocess.run(
        [kubectl(), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    images = [
        c["image"]
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert images == [f"registry.example.com/team/pg-failover-hook@{digest}"]
    deploy = (REPO / "docs/deploy.md").read_text(encoding="utf-8")
    assert f"- name: {name}" in deploy and "newName:" in deploy and "make image" in deploy


def test_license_is_the_apache_2_text_pyproject_announces() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) > 190, "the full text, not a stub"


def test_the_base_install_never_loads_the_events_client() -> None:
    """kubernetes (with aiohttp, pydantic) ships in the one image for deploy/events only: the
    base install (PGFH_EMIT_EVENTS off) never imports it (docs/security.md, "Lows")."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "import hooks.shell.gunicorn_conf\n"
        "from hooks.shell.app import create_app\n"
        "client = create_app().test_client()\n"
        "assert client.get('/healthz').status_code == 200\n"
        "assert client.get('/metrics').status_code == 200\n"
        "print(sorted(m for m in ('kubernetes', 'aiohttp', 'pydantic') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PGFH_AUTH": "none", "PGFH_LOG_LEVEL": "ERROR"},
        timeout=60,
        check=True,
    )
    assert result.stdout.strip().splitlines()[-1] == "[]"
