"""Credential rotation that Metacontroller really picks up (ops/rotation/).

Run against the stand-in's model of Metacontroller 4.17.2 (testbed/metacontroller/credentials.py):
the
credentials are resolved when the controller is built and rebuilt only on a spec change,
the hook pods check tokens with the real ``hooks.shell.auth.Authenticator`` over a mount the
model's kubelet refreshes once a minute. The documented procedure keeps every call
authorised; the annotation-only procedure this project used to document does not.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops.rotation import Names, RotationError, Timing, rotate_tls, rotate_token
from testbed.metacontroller.credentials import ModelCluster
from tests.manifest_helpers import rendered

ROOT = Path(__file__).resolve().parent.parent
NAMES = Names()
CC = "pg-failover-hook"  # the CompositeController of the unsharded install
NS, SECRET = NAMES.hook_namespace, NAMES.token_secret
TIMING = Timing(poll=1.0)


def manifest() -> dict[str, Any]:
    cc: dict[str, Any] = yaml.safe_load(
        (ROOT / "metacontroller/compositecontroller.yaml").read_text()
    )
    return cc


def mtls_manifest(cc: dict[str, Any] | None = None) -> dict[str, Any]:
    """The CompositeController as deploy/mtls renders it (its patch replaces endpointConfigs);
    with ``cc``, the same patch on that one (a shard)."""
    cc = copy.deepcopy(cc) if cc is not None else manifest()
    patch = yaml.safe_load((ROOT / "deploy/mtls/compositecontroller-patch.yaml").read_text())
    cc["spec"]["endpointConfigs"] = copy.deepcopy(patch["spec"]["endpointConfigs"])
    for hook, value in patch["spec"]["hooks"].items():
        cc["spec"]["hooks"][hook]["webhook"].update(value["webhook"])
    return cc


def shard_manifests() -> list[dict[str, Any]]:
    """The CompositeControllers ``kubectl kustomize deploy/sharding`` renders."""
    ccs = [o for o in rendered("deploy/sharding") if o["kind"] == "CompositeController"]
    assert [c["metadata"]["name"] for c in ccs] == [f"pg-failover-hook-{k}" for k in range(5)]
    return ccs


def foreign_manifest() -> dict[str, Any]:
    """Someone else's CompositeController in the same cluster (its own hook and Secret)."""
    cc = manifest()
    cc["metadata"] = {"name": "other-operator"}
    cc["spec"]["endpointConfigs"][0]["authorization"]["secretRef"] = {
        "name": "other-auth",
        "namespace": "other",
        "key": "token",
    }
    return cc


def installed(tmp_path: Path, *ccs: dict[str, Any]) -> ModelCluster:
    """`kubectl apply -k deploy/` (or deploy/sharding/) done: the token Secret exists without
    data, the hook pods mount it, each Metacontroller install tries to build its controller
    and fails (no key "token")."""
    model = ModelCluster(tmp_path, list(ccs) or [manifest()])
    model.update_secret(NS, SECRET, {})
    model.mount_everywhere()
    model.start_metacontroller()
    return model


def refused(model: ModelCluster, since: float = 0.0) -> list[str]:
    return [f"{c.time:.1f} {c.pod} {c.reason}" for c in model.calls if c.time >= since and not c.ok]


def test_first_token_after_install_makes_metacontroller_call_at_once(tmp_path: Path) -> None:
    model = installed(tmp_path)
    assert model.controller is None, "no controller while the key 'token' is missing"
    assert [r for r, *_ in model.events(CC)] == ["CreateError"]

    report = rotate_token(model, timing=TIMING, token="a" * 64, stamp="1")

    assert report.changed and report.new_key == "token-1"
    assert model.controller is not None and model.controller.header == "Bearer " + "a" * 64
    # Once the controller runs, every call is authorised.
    model.sleep(120)
    assert model.calls and not refused(model)
    assert set(model.secret_data(NS, SECRET) or {}) == {"token", "token-1"}


def test_documented_rotation_keeps_every_call_authorised(tmp_path: Path) -> None:
    model = installed(tmp_path)
    rotate_token(model, timing=TIMING, token="a" * 64, stamp="1")
    model.sleep(200)
    before = len(model.calls)

    for n, value in enumerate(("b" * 64, "c" * 64, "d" * 64), start=2):
        rotate_token(model, timing=TIMING, token=value, stamp=str(n))
        model.sleep(150)  # the kubelets drop the removed keys from every mount
        assert model.controller is not None
        assert model.controller.header == f"Bearer {value}"
        assert set(model.secret_data(NS, SECRET) or {}) == {"token", f"token-{n}"}
        # The old token is really gone from every pod: a caller still using it is refused.
        pod = model.pods[0]
        assert not pod.authenticator.check(f"Bearer {'abc'[n - 2] * 64}", None).ok

    assert len(model.calls) - before > 1000, "the calls went on during every rotation"
    assert not refused(model)


def test_reapplying_the_manifests_after_a_rotation_keeps_calls_authorised(
    tmp_path: Path,
) -> None:
    """`kubectl apply -k deploy/` points Metacontroller back at the key "token" (a spec
    change, so a rebuild): that key always holds the current token."""
    model = installed(tmp_path)
    rotate_token(model, timing=TIMING, token="a" * 64, stamp="1")
    rotate_token(model, timing=TIMING, token="b" * 64, stamp="2")
    model.sleep(150)

    model.apply(manifest())
    assert model.controller is not None and model.controller.header == "Bearer " + "b" * 64
    model.sleep(100)
    rotate_token(model, timing=TIMING, token="c" * 64, stamp="3")
    model.start_metacontroller()  # a restart or leader change reads the same spec
    model.sleep(150)
    assert model.controller is not None and model.controller.header == "Bearer " + "c" * 64
    assert not refused(model)


def test_the_annotation_only_procedure_breaks_every_call(tmp_path: Path) -> None:
    """What README, deploy.md and security.md used to say: patch "token", keep the old one as
    "token.previous", annotate the CompositeController, check, drop "token.previous"."""
    model = ModelCluster(tmp_path, [manifest()])
    model.update_secret(NS, SECRET, {"token": b"a" * 64})  # the old install steps
    model.mount_everywhere()
    model.start_metacontroller()
    model.sleep(100)
    assert model.calls and not refused(model)

    model.update_secret(NS, SECRET, {"token": b"b" * 64, "token.previous": b"a" * 64})
    model.sleep(120)
    events_before = len(model.event_log)
    model.annotate("pg-failover-hook.adg.io/token-loaded", "20261130T000000Z")
    assert len(model.event_log) == events_before, "an annotation rebuilds nothing"
    model.sleep(30)
    check = model.clock
    assert not refused(model), "the check after the annotation passes: the old token still works"

    model.update_secret(NS, SECRET, {}, remove=["token.previous"])
    model.sleep(120)

    assert model.controller is not None and model.controller.header == "Bearer " + "a" * 64
    failures = refused(model, since=check)
    late = [c for c in model.calls if c.time >= model.clock - 30]
    assert failures and all(not c.ok and c.reason == "unknown_token" for c in late), (
        "once every kubelet dropped the old token, every call is refused"
    )
    # Only a rebuild (here: a restart) ends it.
    calls = len(model.calls)
    model.start_metacontroller()
    model.sleep(10)
    assert all(c.ok for c in model.calls[calls:])


def test_skipping_the_wait_for_the_pods_refuses_calls(tmp_path: Path) -> None:
    """Step 2 is not decorative: pointing Metacontroller at a token the kubelets have not
    yet delivered to every pod gets 401s from those pods."""
    model = installed(tmp_path)
    rotate_token(model, timing=TIMING, token="a" * 64, stamp="1")
    model.sleep(100)
    start = model.clock
    rotate_token(
        model,
        timing=Timing(kubelet_delay=0.0, poll=1.0),
        token="b" * 64,
        stamp="2",
        pod_check="sleep",
        keep_old=True,
    )
    model.sleep(120)
    assert any(c.reason == "unknown_token" for c in model.calls if c.time >= start)


def test_a_failed_rebuild_stops_the_rotation_and_removes_nothing(tmp_path: Path) -> None:
    class Racing(ModelCluster):
        """Someone deletes the new key right before the patch lands."""

        def patch_compositecontroller(self, name: str, patch: list[dict[str, Any]]) -> None:
            self.update_secret(NS, SECRET, {}, remove=["token-2"])
            super().patch_compositecontroller(name, patch)

    model = Racing(tmp_path, [manifest()])
    model.update_secret(NS, SECRET, {"token": b"a" * 64})
    model.mount_everywhere()
    model.start_metacontroller()

    with pytest.raises(RotationError, match="could not rebuild"):
        rotate_token(model, timing=TIMING, token="b" * 64, stamp="2")
    assert (model.secret_data(NS, SECRET) or {}).get("token") == b"a" * 64, "nothing removed"


def test_sharded_rotation_repoints_every_shard_and_nothing_else(tmp_path: Path) -> None:
    """deploy/sharding: five CompositeControllers (five Metacontroller installs) share the
    token Secret. Every one is found and repointed; a rotation that left one behind would
    lock that shard out once the old key is removed (the last assertion)."""
    foreign = foreign_manifest()
    # (its Secret is not modelled: its install never builds, so it never calls our pods)
    model = installed(tmp_path, *shard_manifests(), foreign)
    first = rotate_token(model, timing=TIMING, token="a" * 64, stamp="1")
    assert first.changed
    model.sleep(150)

    report = rotate_token(model, timing=TIMING, token="b" * 64, stamp="2")
    model.sleep(150)  # the kubelets drop token-1 from every mount

    shards = [f"pg-failover-hook-{k}" for k in range(5)]
    assert any("pg-failover-hook-0, pg-failover-hook-1" in s for s in report.steps)
    for name in shards:
        install = model.installs[name]
        assert install.controller is not None
        assert install.controller.header == "Bearer " + "b" * 64, name
        ref = install.cc["spec"]["endpointConfigs"][0]["authorization"]["secretRef"]
        assert ref["key"] == "token-2", name
        assert [r for r, _ in install.event_log][-2:] == ["Stopped", "Started"], name
    assert model.installs["other-operator"].cc == foreign, "another Secret's user: untouched"
    assert set(model.secret_data(NS, SECRET) or {}) == {"token", "token-2"}
    late = [c for c in model.calls if c.time >= model.clock - 30]
    assert {c.controller for c in late} >= set(shards), "every shard kept calling"
    assert not refused(model)


def test_a_compositecontroller_applied_during_the_rotation_stops_it_before_removal(
    tmp_path: Path,
) -> None:
    """A new shard applied while the pods are being checked still names the key "token":
    rewriting "token" and removing the old keys would lock it out, so nothing is removed."""
    shard_0, shard_1 = shard_manifests()[:2]
    model = installed(tmp_path, shard_0)
    rotate_token(model, timing=TIMING, token="a" * 64, stamp="1")
    model.sleep(150)

    patch_once = model.patch_compositecontroller

    def patch_then_apply(name: str, patch: list[dict[str, Any]]) -> None:
        patch_once(name, patch)
        model.apply(shard_1)  # `kubectl apply` of a new shard, right after our patch

    model.patch_compositecontroller = patch_then_apply  # type: ignore[method-assign]
    with pytest.raises(RotationError, match="pg-failover-hook-1 name an older key"):
        rotate_token(model, timing=TIMING, token="b" * 64, stamp="2")
    assert (model.secret_data(NS, SECRET) or {})["token"] == b"a" * 64, "nothing rewritten"
    model.sleep(150)
    assert not refused(model)
    # Running it again picks the new shard up.
    model.patch_compositecontroller = patch_once  # type: ignore[method-assign]
    rotate_token(model, timing=TIMING, token="c" * 64, stamp="3")
    model.sleep(150)
    assert not refused(model)
    assert {i.controller.header for i in model.installs.values() if i.controller} == {
        "Bearer " + "c" * 64
    }


def test_a_refused_patch_of_one_shard_stops_before_anything_is_removed(tmp_path: Path) -> None:
    """Someone changed shard 2's key after the rotation listed it: its patch's ``test`` op
    fails. Shards 0 and 1 already send the new token, 2 to 4 the old one: both stay valid."""
    model = installed(tmp_path, *shard_manifests())
    rotate_token(model, timing=TIMING, token="a" * 64, stamp="1")
    model.sleep(150)
    patch = model.patch_compositecontroller

    def racing(name: str, ops: list[dict[str, Any]]) -> None:
        if name == "pg-failover-hook-2":
            model.update_secret(NS, SECRET, {"token-x": b"x" * 64})
            entry = model.installs[name].cc["spec"]["endpointConfigs"][0]
            entry["authorization"]["secretRef"]["key"] = "token-x"
        patch(name, ops)

    model.patch_compositecontroller = racing  # type: ignore[method-assign]
    with pytest.raises(RotationError, match="already pointed at the new key") as raised:
        rotate_token(model, timing=TIMING, token="b" * 64, stamp="2")
    assert "pg-failover-hook-0, pg-failover-hook-1;" in str(raised.value)
    assert set(model.secret_data(NS, SECRET) or {}) == {"token", "token-1", "token-2", "token-x"}
    model.sleep(150)
    headers = {n: i.controller.header for n, i in model.installs.items() if i.controller}
    assert headers["pg-failover-hook-0"] == headers["pg-failover-hook-1"] == "Bearer " + "b" * 64
    assert headers["pg-failover-hook-3"] == "Bearer " + "a" * 64
    assert not refused(model)


def test_rotation_refuses_a_compositecontroller_without_the_token(tmp_path: Path) -> None:
    cc = manifest()
    del cc["spec"]["endpointConfigs"]
    model = ModelCluster(tmp_path, [cc])
    with pytest.raises(
        RotationError, match=r"no CompositeController has an authorization\.secretRef"
    ):
        rotate_token(model, timing=TIMING)


# ---------------------------------------------------------------- mTLS certificates

LIFETIME = 300.0  # a 90-day certificate, scaled
RENEW_AT = LIFETIME * 2 / 3  # cert-manager's default renewBefore: a third of the lifetime


def mtls_installed(tmp_path: Path) -> ModelCluster:
    model = ModelCluster(tmp_path, [mtls_manifest()], mtls=True)
    model.update_secret(NS, SECRET, {"token": b"a" * 64})
    model.update_secret(NS, NAMES.server_secret, {"ca.crt": b"SERVER CA", "tls.crt": b"x"})
    model.issue_client_certificate(1, LIFETIME)
    model.mount_everywhere()
    model.start_metacontroller()
    assert model.controller is not None
    return model


def run_with_renewals(model: ModelCluster, until: float, every: float, action: Any) -> None:
    """cert-manager renews at 2/3 of each certificate's lifetime; ``action`` runs every
    ``every`` seconds (a CronJob)."""
    serial, renew = 1, RENEW_AT
    next_action = every
    while model.clock < until:
        step = min(renew, next_action) - model.clock
        model.sleep(max(step, model.tick))
        if model.clock >= renew:
            serial += 1
            model.issue_client_certificate(serial, LIFETIME)
            renew = model.clock + RENEW_AT
        if model.clock >= next_action:
            action(model)
            next_action = model.clock + every


def test_tls_rotation_from_a_cronjob_follows_cert_manager_renewals(tmp_path: Path) -> None:
    model = mtls_installed(tmp_path)
    run_with_renewals(
        model,
        until=5 * LIFETIME,
        every=LIFETIME / 6,
        action=lambda m: rotate_tls(m, timing=TIMING, stamp=f"{m.clock:.0f}"),
    )
    assert model.controller is not None and model.controller.client_cert is not None
    assert model.controller.client_cert.serial >= 6, "renewals were picked up"
    assert len(model.calls) > 2000 and not refused(model)
    pinned = model.secret_data(NAMES.client_namespace, NAMES.client_pinned_secret) or {}
    assert len(pinned) == 2, "older stamped copies are pruned"


def test_tls_rotation_repoints_every_shard(tmp_path: Path) -> None:
    shards = [mtls_manifest(cc) for cc in shard_manifests()]
    foreign = mtls_manifest(foreign_manifest())
    entry = foreign["spec"]["endpointConfigs"][0]
    entry["clientTLS"]["secretRef"]["name"] = "other-client"
    entry["authorization"] = foreign_manifest()["spec"]["endpointConfigs"][0]["authorization"]
    model = ModelCluster(tmp_path, [*shards, foreign], mtls=True)
    model.update_secret(NS, SECRET, {"token": b"a" * 64})
    model.update_secret(NS, NAMES.server_secret, {"ca.crt": b"SERVER CA", "tls.crt": b"x"})
    model.issue_client_certificate(1, LIFETIME)
    model.mount_everywhere()
    model.start_metacontroller()
    run_with_renewals(
        model,
        until=2 * LIFETIME,
        every=LIFETIME / 6,
        action=lambda m: rotate_tls(m, timing=TIMING, stamp=f"{m.clock:.0f}"),
    )
    for cc in shards:
        install = model.installs[cc["metadata"]["name"]]
        assert install.controller is not None and install.controller.client_cert is not None
        assert install.controller.client_cert.serial >= 3, "renewals were picked up"
    assert model.installs["other-operator"].cc == foreign
    assert not refused(model)


def test_tls_rotation_changes_nothing_when_already_current(tmp_path: Path) -> None:
    model = mtls_installed(tmp_path)
    assert rotate_tls(model, timing=TIMING, stamp="1").changed
    events = len(model.event_log)
    assert not rotate_tls(model, timing=TIMING, stamp="2").changed
    assert len(model.event_log) == events, "no rebuild when nothing changed"


def test_annotating_after_renewals_lets_the_old_certificate_expire(tmp_path: Path) -> None:
    model = mtls_installed(tmp_path)
    run_with_renewals(
        model,
        until=2 * LIFETIME,
        every=LIFETIME / 6,
        action=lambda m: m.annotate("pg-failover-hook.adg.io/renewed", str(m.clock)),
    )
    failures = refused(model)
    assert failures and all("client_certificate_expired" in f for f in failures)
    assert float(failures[0].split()[0]) >= LIFETIME, "fails exactly when the first one expires"


# ------------------------------------------------- the kubectl side, against a fake kubectl

FAKE_KUBECTL = r'''#!/usr/bin/env python3
"""A fake kubectl over a JSON state file: just the calls ops.rotation.KubectlCluster makes.
A CompositeController patch records its Metacontroller's Started Event, as it would."""
import base64, json, os, sys
STATE = os.environ["FAKE_KUBECTL_STATE"]
state = json.load(open(STATE))
args = sys.argv[1:]
state["calls"].append(args)
ns = args[args.index("-n") + 1] if "-n" in args else None
rest = [a for i, a in enumerate(args) if a != "-n" and (i == 0 or args[i - 1] != "-n")]
def save():
    json.dump(state, open(STATE, "w"))
def out(obj):
    save(); print(json.dumps(obj)); sys.exit(0)
verb = rest[0]
if verb == "get" and rest[1] == "secret":
    data = state["secrets"].get(f"{ns}/{rest[2]}")
    if data is None:
        save(); print("NotFound", file=sys.stderr); sys.exit(1)
    out({"data": data})
if verb == "create" and rest[1] == "secret":
    state["secrets"][f"{ns}/{rest[3]}"] = {}
    save(); sys.exit(0)
if verb == "patch" and rest[1] == "secret":
    assert rest[rest.index("--type") + 1] == "merge"
    if "--patch-file" in rest:
        assert rest[rest.index("--patch-file") + 1] == "/dev/stdin"
        patch = json.loads(sys.stdin.read())
    else:
        patch = json.loads(rest[rest.index("-p") + 1])
    data = state["secrets"][f"{ns}/{rest[2]}"]
    for key, value in patch["data"].items():
        if value is None:
            data.pop(key, None)
        else:
            base64.b64decode(value, validate=True)
            data[key] = value
    save(); sys.exit(0)
if verb == "get" and rest[1] == "compositecontrollers":
    out({"items": list(state["ccs"].values())})
if verb == "patch" and rest[1] == "compositecontroller":
    assert rest[rest.index("--type") + 1] == "json"
    name = rest[2]
    for op in json.loads(rest[rest.index("-p") + 1]):
        node = state["ccs"][name]
        parts = op["path"].split("/")[1:]
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = int(parts[-1]) if isinstance(node, list) else parts[-1]
        if op["op"] == "test":
            if node[last] != op["value"]:
                print("test failed", file=sys.stderr); save(); sys.exit(1)
        else:
            node[last] = op["value"]
    state["started"][name] += 1
    out({})
if verb == "get" and rest[1] == "events":
    selector = dict(
        kv.split("=", 1) for kv in rest[rest.index("--field-selector") + 1].split(",")
    )
    assert selector["involvedObject.kind"] == "CompositeController"
    count = state["started"][selector["involvedObject.name"]]
    out({"items": [{"reason": "Started", "message": "Started controller", "count": count}]})
if verb == "get" and rest[1] == "pods":
    out({"items": [{"metadata": {"name": p}, "status": {"phase": "Running"}} for p in ("a", "b")]})
if verb == "exec":
    path = rest[-1]
    key = path.rsplit("/", 1)[1]
    secret = state["secrets"]["pg-failover-hook/pg-failover-hook-auth"]
    save(); sys.exit(0 if key in secret else 1)
print("unexpected: " + " ".join(args), file=sys.stderr); save(); sys.exit(2)
'''


def fake_kubectl(directory: Path) -> tuple[Path, Path]:
    """``directory/kubectl`` (the fake above) and its state: two shards of deploy/sharding,
    someone else's CompositeController, the token Secret with one old token."""
    import json
    import sys

    fake = directory / "kubectl"
    fake.write_text(FAKE_KUBECTL.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    fake.chmod(0o755)
    state_file = directory / "state.json"
    ccs = {c["metadata"]["name"]: c for c in [*shard_manifests()[:2], foreign_manifest()]}
    state_file.write_text(
        json.dumps(
            {
                "calls": [],
                "started": dict.fromkeys(ccs, 1),
                "ccs": ccs,
                "secrets": {f"{NS}/{SECRET}": {"token": "b2xkLXRva2VuLTAxMjM0NTY3ODk="}},
            }
        )
    )
    return fake, state_file


def test_the_kubectl_commands_of_a_token_rotation(tmp_path: Path, monkeypatch: Any) -> None:
    import json

    from ops.rotation import cli

    fake, state_file = fake_kubectl(tmp_path)
    monkeypatch.setenv("FAKE_KUBECTL_STATE", str(state_file))
    real = cli.KubectlCluster
    monkeypatch.setattr(cli, "KubectlCluster", lambda kubectl: real([str(fake)]))
    monkeypatch.setattr(cli, "stamp_now", lambda: "20261130T120000Z")

    assert cli.main(["token"]) == 0

    state = json.loads(state_file.read_text())
    for name in ("pg-failover-hook-0", "pg-failover-hook-1"):
        entry = state["ccs"][name]["spec"]["endpointConfigs"][0]
        assert entry["authorization"]["secretRef"]["key"] == "token-20261130T120000Z"
        assert state["started"][name] == 2, "waited for the Started Event of each shard"
    assert state["ccs"]["other-operator"] == foreign_manifest()
    assert state["started"]["other-operator"] == 1
    data = state["secrets"][f"{NS}/{SECRET}"]
    assert set(data) == {"token", "token-20261130T120000Z"}
    assert data["token"] == data["token-20261130T120000Z"], "'token' holds the current token"
    # The new token never appears on a command line (readable by anyone in /proc/*/cmdline).
    new_token = data["token-20261130T120000Z"]
    assert not [c for c in state["calls"] if any(new_token in a for a in c)]
    verbs = [
        " ".join([a for i, a in enumerate(c) if "-n" not in (a, c[i - 1] if i else "")][:2])
        for c in state["calls"]
    ]
    assert verbs.index("exec a") < verbs.index("patch compositecontroller"), "pods first"
    patched = [c[2] for c in state["calls"] if c[:2] == ["patch", "compositecontroller"]]
    assert patched == ["pg-failover-hook-0", "pg-failover-hook-1"]
    # A second rotation with the same stamp is refused before anything changes.
    calls = len(state["calls"])
    assert cli.main(["token"]) == 1
    state = json.loads(state_file.read_text())
    assert not any(c[0] == "patch" for c in state["calls"][calls:])


def test_the_operators_script_rotates_with_python3_alone(tmp_path: Path) -> None:
    """``deploy/rotate-credentials.sh token`` as an operator runs it from a checkout: a
    ``python3`` that sees the standard library alone (the system one with ``-S``: no site or
    dist-packages, so not even a distribution's PyYAML; the rotation promises the standard
    library only), the kubectl it finds on PATH (the fake above), ``python3 -m ops.rotation``
    found from the script's own directory whatever the working directory."""
    import json
    import shutil
    import subprocess

    python3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    assert python3 is not None, "the operator's machine has a python3"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _, state_file = fake_kubectl(bin_dir)
    wrapper = bin_dir / "python3"  # first on PATH: not the venv's python3
    wrapper.write_text(f'#!/bin/sh\nexec {python3} -S "$@"\n')
    wrapper.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_KUBECTL_STATE": str(state_file),
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        ["sh", str(ROOT / "deploy/rotate-credentials.sh"), "token"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Metacontroller rebuilt 2 controller(s)" in result.stdout, result.stdout
    state = json.loads(state_file.read_text())
    data = state["secrets"][f"{NS}/{SECRET}"]
    (new_key,) = set(data) - {"token"}
    assert new_key.startswith("token-") and data["token"] == data[new_key]
    for name in ("pg-failover-hook-0", "pg-failover-hook-1"):
        entry = state["ccs"][name]["spec"]["endpointConfigs"][0]
        assert entry["authorization"]["secretRef"]["key"] == new_key


def test_the_secret_patch_goes_through_stdin_with_the_real_kubectl(
    control_plane: Any, kube_namespace: str
) -> None:
    """The real kubectl reads the patch from --patch-file /dev/stdin (nothing on its argv)."""
    from ops.rotation.kubectl import KubectlCluster

    kubectl = [
        str(control_plane.binaries.path("kubectl")),
        f"--kubeconfig={control_plane.admin_kubeconfig}",
    ]
    cluster = KubectlCluster(kubectl)
    cluster.update_secret(kube_namespace, "auth", {"token": b"first"})
    cluster.update_secret(kube_namespace, "auth", {"token-2": b"second"}, remove=["token"])
    assert cluster.secret_data(kube_namespace, "auth") == {"token-2": b"second"}
