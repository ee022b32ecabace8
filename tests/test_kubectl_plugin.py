"""``kubectl pgfh``: the real ``kubernetes`` client against a loopback API server.

Test design: the objects the fake API server (:mod:`testbed.fakes.kubeapi`) serves are not written
by
hand where the project can make them. The PostgreSQLCluster's status, its Services and the
read-only EndpointSlice are what the real hook answered for the recorded Metacontroller
requests (tests/fixtures/metacontroller), applied by the Metacontroller stand-in until
nothing changes; the CompositeController is ``metacontroller/compositecontroller.yaml``;
Metacontroller's Deployment carries the arguments of ``deploy/metacontroller-values.yaml``
as its Helm chart renders them. What kube-controller-manager writes (the primary Service's
EndpointSlice) and the token Secret are built in the API's shapes. Each failure case then
changes one object (or one permission) and asserts the exit code and the plain reason.

What the real API server can show is tested there instead (tests/test_kubectl_plugin_real.py:
a healthy check, the Service on another pod or gone, a cluster not Ready, an unknown name, no
CRD, 403, 401, an unreachable server, the real kubectl finding the plugin). What stays here is
what the real server cannot be made to show on demand (an EndpointSlice the controller has not
caught up with, a token Secret without its key, Metacontroller's CRDs absent while ours are
served, a 503 from the pod proxy, ...), the rendering (colour, a terminal) and what needs no
server (kubeconfig and context handling).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml
from flask.testing import FlaskClient

from hooks.domain.members import WalSender
from hooks.domain.model import ZONE_LABEL
from pgfh_plugin import checks, cli, style
from testbed.fakes.kubeapi import COMPOSITECONTROLLERS, FakeKubeAPI, endpoint_slice_for
from testbed.fakes.patroni_wire import patroni_body
from testbed.metacontroller.apply import World, apply_reply, check_reply
from tests.child_helpers import MIB, READ_ONLY, answer, backup_fields
from tests.helpers import P0, P1, P2, FakeProber, down, fixture

ROOT = Path(__file__).resolve().parent.parent
NS = "databases"
CLUSTER = "pg-orders"
PRIMARY = "pg-orders-primary"
IPS = {P0: "10.244.1.17", P1: "10.244.2.23", P2: "10.244.3.9"}
JOB = "pg-orders-backup-29250"
MC_NS = "metacontroller"
MC_NAME = "metacontroller-metacontroller-helm"  # the chart's fullname for release "metacontroller"
ESC = "\033["


# ------------------------------------------------------------------ the world, by the real hook


def _sync_until_steady(client: FlaskClient, world: World) -> None:
    for _ in range(6):
        response = client.post(
            "/sync", data=json.dumps(world.sync_request()), content_type="application/json"
        )
        applied = apply_reply(world, check_reply(response.status_code, response.data))
        if not (applied.changed_children or applied.status_changed or applied.writes):
            return
    raise AssertionError("the hook did not reach a steady state")


def hook_world(
    client: FlaskClient,
    prober: FakeProber,
    *,
    p0_down: bool = False,
    consistency: str = "lag",
    zones: Mapping[str, str] | None = None,
) -> World:
    """The recorded cluster with a read-only Service and backups, synced by the real hook.

    With ``consistency`` other than ``lag`` the leader lists P1 as a ``sync`` standby and P2
    as ``async``. With ``zones`` (Pod name → zone label), ``trafficDistribution:
    PreferSameZone`` and those Pods labelled."""
    body = fixture("sync-first-no-service.json")
    body["parent"]["spec"].update(
        {"replicaService": {"name": READ_ONLY}, "backup": backup_fields()}
    )
    if consistency != "lag":
        body["parent"]["spec"]["replicaService"]["consistency"] = consistency
    if zones is not None:
        body["parent"]["spec"]["replicaService"]["trafficDistribution"] = "PreferSameZone"
        for name, zone in zones.items():
            body["related"]["Pod.v1"][name]["metadata"]["labels"][ZONE_LABEL] = zone
    world = World(
        parent=body["parent"],
        services=body["children"]["Service.v1"],
        pods=body["related"]["Pod.v1"],
    )
    leader = dataclasses.replace(
        answer(P0, "primary"),
        walsenders=(WalSender(P1, "streaming", "sync"), WalSender(P2, "streaming", "async")),
    )
    prober.answers = {P0: leader, P1: answer(P1), P2: answer(P2, behind=64 * MIB)}
    world.jobs = {
        JOB: {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": JOB,
                "namespace": NS,
                "labels": {"pg-failover-hook.adg.io/backup-of": world.uid},
            },
            "status": {
                "completionTime": "2026-08-20T02:16:09Z",
                "conditions": [{"type": "Complete", "status": "True"}],
            },
        }
    }
    _sync_until_steady(client, world)
    if p0_down:
        prober.answers[P0] = down(P0, "connection refused")
        _sync_until_steady(client, world)
    return world


def metacontroller_deployment(args: list[str]) -> dict[str, Any]:
    """Metacontroller's Deployment as its Helm chart (4.17.2) renders it."""
    labels = {"app.kubernetes.io/name": "metacontroller-helm", "app.kubernetes.io/instance": MC_NS}
    return {
        "metadata": {
            "name": MC_NAME,
            "namespace": MC_NS,
            "labels": {**labels, "helm.sh/chart": "metacontroller-helm-4.17.2"},
            "uid": "2c5e8a1f-7d3b-4e9a-b6c4-1f8d2e7a9b30",
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": MC_NAME,
                    "containers": [
                        {
                            "name": "metacontroller-helm",
                            "image": "ghcr.io/metacontroller/metacontroller:v4.17.2",
                            "command": ["/usr/bin/metacontroller"],
                            "args": args,
                        }
                    ],
                },
            },
        },
        "status": {"replicas": 2, "readyReplicas": 2},
    }


def populate(api: FakeKubeAPI, world: World) -> None:
    api.add("postgresqlclusters", world.parent)
    for pod in world.pods.values():
        api.add("pods", pod)
    for service in world.services.values():
        api.add("services", service)
    for slice_ in world.endpointslices.values():
        api.add("endpointslices", slice_)
    primary = world.parent["status"]["primary"]
    api.add("endpointslices", endpoint_slice_for(world.services[PRIMARY], [world.pods[primary]]))
    controller = yaml.safe_load((ROOT / "metacontroller/compositecontroller.yaml").read_text())
    controller["metadata"]["uid"] = "5a7c9e1b-3d5f-4a8c-9e2b-6d4f8a1c3e50"
    api.add("compositecontrollers", controller)
    api.add(
        "secrets",
        {
            "metadata": {"name": "pg-failover-hook-auth", "namespace": "pg-failover-hook"},
            "type": "Opaque",
            "data": {"token": base64.b64encode(b"3f1c" * 16).decode()},
        },
    )
    values = yaml.safe_load((ROOT / "deploy/metacontroller-values.yaml").read_text())
    api.add("deployments", metacontroller_deployment(values["commandArgs"]))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No real kubeconfig, no in-cluster account: only what a test points at."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return {}


@pytest.fixture
def world(client: FlaskClient, prober: FakeProber) -> World:
    return hook_world(client, prober)


@pytest.fixture
def api(world: World) -> Iterator[FakeKubeAPI]:
    server = FakeKubeAPI().start()
    try:
        populate(server, world)
        yield server
    finally:
        server.close()


@pytest.fixture
def kubeconfig(api: FakeKubeAPI, tmp_path: Path, env: dict[str, str]) -> Path:
    return api.kubeconfig(tmp_path)


def member_rows(out: str) -> dict[str, list[str]]:
    """The Members table's rows, split on blanks, by pod name."""
    section = out.split("\nMembers", 1)[1].split("\n\n", 1)[0]
    rows = [line.split() for line in section.splitlines() if line.startswith("  pg-orders-")]
    return {row[0]: row for row in rows}


def run(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err, environ=environ or {})
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------ status


def test_status_shows_primary_members_conditions_endpoints_and_backup(
    kubeconfig: Path, api: FakeKubeAPI
) -> None:
    code, out, err = run("status", "--kubeconfig", str(kubeconfig))
    assert (code, err) == (0, "")
    assert "PostgreSQLCluster databases/pg-orders" in out
    assert "Primary:  pg-orders-0 (timeline 1)" in out
    assert "Ready:    True (LeaderFound)" in out
    rows = member_rows(out)
    # NAME ROLE STATE TL LAG REACHABLE POD IP NODE; the primary is starred.
    assert rows[P0][:9] == [P0, "*", "primary", "running", "1", "-", "yes", "Ready", IPS[P0]]
    assert rows[P1][:9] == [P1, "replica", "running", "1", "≤", "16", "MiB", "yes", "Ready"]
    # P2 replays 64 MiB behind: not listed by the read-only Service, so its lag is unknown.
    assert rows[P2][:7] == [P2, "replica", "running", "1", "?", "yes", "Ready"]
    for kind in ("Ready", "PrimaryRouted", "SpecValid", "ReplicasRouted", "BackupScheduled"):
        assert f"  {kind} " in out
    assert "Patroni reports pg-orders-0 as leader (timeline 1)" in out
    assert "left out: pg-orders-2 (replay lags more than 16 MiB)" in out
    assert f"Service {READ_ONLY} (maxLagBytes 16 MiB, whenNoReplica KeepEndpoints)" in out
    assert f"  {P1:<24} {IPS[P1]}" in out
    assert f"Last successful: 2026-08-20T02:16:09Z (Job {JOB})" in out
    assert "Last failed:     none" in out
    assert ESC not in out
    # The client sent the kubeconfig's bearer token and selected the Pods by the spec's labels.
    assert set(api.authorizations) == {f"Bearer {api.token}"}
    assert any(
        r.startswith("/api/v1/namespaces/databases/pods?")
        and "labelSelector=application%3Dpatroni%2Ccluster-name%3Dpg-orders" in r
        for r in api.requests
    )


def test_status_json_carries_the_same_facts(kubeconfig: Path) -> None:
    code, out, _ = run("status", CLUSTER, "-o", "json", "--kubeconfig", str(kubeconfig))
    assert code == 0
    (cluster,) = json.loads(out)["clusters"]
    assert (cluster["namespace"], cluster["name"], cluster["primary"]) == (NS, CLUSTER, P0)
    assert cluster["ready"]["status"] == "True"
    members = {m["name"]: m for m in cluster["members"]}
    assert members[P0]["role"] == "primary" and members[P0]["primary"] is True
    assert members[P0]["pod"] == {
        "phase": "Running",
        "ready": True,
        "ip": IPS[P0],
        "node": "kind-worker",
        "terminating": False,
    }
    assert members[P1]["lag"] == {
        "bytes": None,
        "withinBytes": 16 * MIB,
        "source": "ReplicasRouted",
    }
    assert members[P2]["lag"] == {"bytes": None, "withinBytes": None, "source": None}
    assert all(m["reachable"] is True for m in members.values())
    assert cluster["readOnly"]["endpoints"] == [{"pod": P1, "ip": IPS[P1]}]
    assert cluster["readOnly"]["consistency"] == "lag"
    assert cluster["backup"]["lastSuccessful"] == {
        "job": JOB,
        "completionTime": "2026-08-20T02:16:09Z",
    }
    assert {c["type"] for c in cluster["conditions"]} >= {"Ready", "PrimaryRouted"}
    assert ESC not in out


def test_status_of_a_cluster_without_a_leader_shows_the_unreachable_member(
    client: FlaskClient, prober: FakeProber, env: dict[str, str], tmp_path: Path
) -> None:
    world = hook_world(client, prober, p0_down=True)
    api = FakeKubeAPI().start()
    try:
        populate(api, world)
        code, out, _ = run("status", "--kubeconfig", str(api.kubeconfig(tmp_path)))
    finally:
        api.close()
    assert code == 0
    assert "Ready:    False (NoLeader)" in out
    row = member_rows(out)[P0]
    assert row[:8] == [P0, "*", "?", "?", "?", "?", "no", "Ready"]
    # The Service is kept where it was, and the report says the leader is not confirmed.
    assert (
        "Primary:  pg-orders-0 (timeline 1) kept by the Service, not confirmed as leader now "
        "(see Ready)" in out
    )
    assert member_rows(out)[P1][4] == "?"  # no leader, no lag proof
    # The hook's members[].reason and membersAnswered, as it wrote them.
    assert "Members (2/3 answered as Patroni)" in out
    assert "Not answering as Patroni: pg-orders-0: connection refused" in out


def test_status_names_the_consistency_level_and_each_listed_replicas_sync_state(
    client: FlaskClient, prober: FakeProber, env: dict[str, str], tmp_path: Path
) -> None:
    world = hook_world(client, prober, consistency="synchronous")
    api = FakeKubeAPI().start()
    try:
        populate(api, world)
        code, out, _ = run("status", "--kubeconfig", str(api.kubeconfig(tmp_path)))
        _, as_json, _ = run("status", "-o", "json", "--kubeconfig", str(api.kubeconfig(tmp_path)))
    finally:
        api.close()
    assert code == 0
    assert (
        f"Service {READ_ONLY} (maxLagBytes 16 MiB, whenNoReplica KeepEndpoints, "
        "consistency synchronous)" in out
    )
    assert f"  {P1:<24} {IPS[P1]}  sync_state sync" in out
    (cluster,) = json.loads(as_json)["clusters"]
    assert cluster["readOnly"]["endpoints"] == [{"pod": P1, "ip": IPS[P1], "level": "sync"}]
    assert cluster["readOnly"]["reason"] == "SynchronousReplicasRouted"


@pytest.mark.parametrize("zoned", [True, False])
def test_status_names_the_traffic_distribution_and_each_listed_replicas_zone(
    client: FlaskClient, prober: FakeProber, env: dict[str, str], tmp_path: Path, zoned: bool
) -> None:
    zones = {P0: "zone-a", P1: "zone-b", P2: "zone-a"} if zoned else {P0: "zone-a"}
    world = hook_world(client, prober, zones=zones)
    api = FakeKubeAPI().start()
    try:
        populate(api, world)
        code, out, _ = run("status", "--kubeconfig", str(api.kubeconfig(tmp_path)))
        _, as_json, _ = run("status", "-o", "json", "--kubeconfig", str(api.kubeconfig(tmp_path)))
    finally:
        api.close()
    assert code == 0
    assert (
        f"Service {READ_ONLY} (maxLagBytes 16 MiB, whenNoReplica KeepEndpoints, "
        "trafficDistribution PreferSameZone)" in out
    )
    zone = "zone-b" if zoned else "- (no zone label: no hints)"
    assert f"  {P1:<24} {IPS[P1]}  zone {zone}" in out
    (cluster,) = json.loads(as_json)["clusters"]
    assert cluster["readOnly"]["trafficDistribution"] == "PreferSameZone"
    assert cluster["readOnly"]["endpoints"] == [
        {"pod": P1, "ip": IPS[P1], "zone": "zone-b" if zoned else None}
    ]


def test_status_says_when_the_status_has_no_member_data(kubeconfig: Path, api: FakeKubeAPI) -> None:
    cluster = api.get("postgresqlclusters", NS, CLUSTER)
    del cluster["status"]
    code, out, _ = run("status", "--kubeconfig", str(kubeconfig))
    assert code == 0
    assert "Note: the status is empty: the hook has not answered a sync" in out
    assert "Primary:  none" in out
    rows = member_rows(out).values()
    assert [r[:7] for r in rows] == [[p, "?", "?", "?", "?", "?", "Ready"] for p in (P0, P1, P2)]

    cluster["status"] = {
        "conditions": [{"type": "Ready", "status": "False", "reason": "InvalidSpec"}]
    }
    code, out, _ = run("status", "--kubeconfig", str(kubeconfig))
    assert "the status carries no per-member data (Ready: InvalidSpec)" in out


def test_status_all_namespaces_and_an_empty_namespace(kubeconfig: Path, api: FakeKubeAPI) -> None:
    other = copy.deepcopy(api.get("postgresqlclusters", NS, CLUSTER))
    other["metadata"].update(namespace="analytics", name="pg-events")
    api.add("postgresqlclusters", other)
    code, out, _ = run("status", "-A", "-o", "json", "--kubeconfig", str(kubeconfig))
    assert code == 0
    names = [(c["namespace"], c["name"]) for c in json.loads(out)["clusters"]]
    assert names == [("analytics", "pg-events"), (NS, CLUSTER)]
    assert "/apis/adg.io/v1alpha1/postgresqlclusters" in api.requests

    code, out, err = run("status", "-n", "empty", "--kubeconfig", str(kubeconfig))
    assert (code, out, err) == (0, "", "No PostgreSQLClusters found in namespace empty.\n")


# ------------------------------------------------------------------ colour


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_follows_the_terminal_no_color_and_the_flag() -> None:
    tty, pipe = _Terminal(), io.StringIO()
    assert style.use_colour("auto", tty, {}) is True
    assert style.use_colour("auto", pipe, {}) is False
    assert style.use_colour("auto", tty, {"NO_COLOR": "1"}) is False
    assert style.use_colour("auto", tty, {"NO_COLOR": ""}) is True  # no-color.org: non-empty only
    assert style.use_colour("auto", tty, {"TERM": "dumb"}) is False
    assert style.use_colour("always", pipe, {"NO_COLOR": "1"}) is True
    assert style.use_colour("never", tty, {}) is False


def test_status_in_colour_on_a_terminal(kubeconfig: Path) -> None:
    tty, err = _Terminal(), _Terminal()
    assert cli.main(["status", "--kubeconfig", str(kubeconfig)], tty, err, {}) == 0
    coloured = tty.getvalue()
    assert f"{ESC}32mTrue (LeaderFound){ESC}0m" in coloured
    assert f"{ESC}1m{ESC}32mpg-orders-0{ESC}0m{ESC}0m" in coloured
    # The same report without the codes, columns still aligned.
    plain = run("status", "--kubeconfig", str(kubeconfig))[1]
    assert _strip(coloured) == plain
    quiet = _Terminal()
    assert cli.main(["status", "--kubeconfig", str(kubeconfig)], quiet, err, {"NO_COLOR": "1"}) == 0
    assert quiet.getvalue() == plain


def _strip(text: str) -> str:
    import re

    return re.sub(r"\033\[[0-9;]*m", "", text)


@pytest.mark.slow
def test_the_installed_kubectl_pgfh_colours_a_pty_and_not_a_pipe(kubeconfig: Path) -> None:
    """The console script the package installs, on a real pseudo-terminal and on a pipe."""
    exe = Path(sys.executable).with_name("kubectl-pgfh")
    assert exe.exists(), "pip install puts kubectl-pgfh next to the interpreter"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(kubeconfig.parent), "TERM": "xterm"}
    argv = [str(exe), "status", "--kubeconfig", str(kubeconfig)]
    piped = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert piped.returncode == 0, piped.stderr
    assert "pg-orders-0" in piped.stdout and ESC not in piped.stdout

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(argv, env=env, stdout=follower, stderr=subprocess.PIPE)
        os.close(follower)
        follower = -1
        chunks, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        proc.stderr.close()
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    on_tty = b"".join(chunks).decode().replace("\r\n", "\n")
    assert ESC in on_tty
    assert _strip(on_tty) == piped.stdout


# ------------------------------------------------------------------ clear errors (no server)


def test_no_kubeconfig(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Said plainly: none found, where it looked (expanded) and how to point at one; no
    parser message about a file that does not exist."""
    home = tmp_path / "home"
    how = "point at one with --kubeconfig FILE or KUBECONFIG=FILE, or run where kubectl works"
    code, out, err = run("status")
    assert (code, out) == (2, "")
    assert err == (
        f"error: no kubeconfig found: looked at {home}/.kube/config (the default, as "
        f"$KUBECONFIG is not set) and it does not exist; {how}\n"
    )
    missing = tmp_path / "missing"
    code, _, err = run("status", "--kubeconfig", str(missing))
    assert code == 2
    said = f"looked at {missing} (--kubeconfig) and it does not exist"
    assert err == f"error: no kubeconfig found: {said}; {how}\n"
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/a:{tmp_path}/b")
    code, _, err = run("status")
    assert code == 2 and "Invalid kube-config" not in err
    assert f"looked at {tmp_path}/a, {tmp_path}/b ($KUBECONFIG) and none of them exists" in err


def test_a_kubeconfig_that_exists_but_is_empty_says_so(env: dict[str, str], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("", encoding="utf-8")
    code, _, err = run("status", "--kubeconfig", str(empty))
    assert code == 2 and err.startswith(f"error: the kubeconfig at {empty} cannot be used: ")


def test_context_and_namespace_selection(kubeconfig: Path, api: FakeKubeAPI) -> None:
    # The context "other" has no namespace: "default", as kubectl does.
    code, _, err = run("status", "--context", "other", "--kubeconfig", str(kubeconfig))
    assert (code, err) == (0, "No PostgreSQLClusters found in namespace default.\n")
    code, _, err = run("status", "--context", "nope", "--kubeconfig", str(kubeconfig))
    assert code == 2 and "no context 'nope' in the kubeconfig (contexts: fake, other)" in err
    code, _, err = run("status", CLUSTER, "-A", "--kubeconfig", str(kubeconfig))
    assert (code, err) == (2, "error: a NAME cannot be combined with -A\n")


# ------------------------------------------------------------------ check


def failed(out: str) -> list[str]:
    return [line[6:] for line in out.splitlines() if line.startswith("FAIL")]


def test_check_endpoint_slice_without_the_primary_ip(kubeconfig: Path, api: FakeKubeAPI) -> None:
    (key,) = [k for k in api.objects if k[0] == "endpointslices" and k[2].startswith(PRIMARY)]
    api.objects[key]["endpoints"][0]["addresses"] = [IPS[P1]]
    code, out, _ = run("check", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert failed(out) == [
        f"databases/pg-orders: Service {PRIMARY}: its EndpointSlices hold {IPS[P1]}, not "
        f"{P0}'s IP {IPS[P0]}"
    ]
    api.objects[key]["endpoints"] = []
    assert failed(run("check", "--kubeconfig", str(kubeconfig))[1]) == [
        f"databases/pg-orders: Service {PRIMARY}: its EndpointSlices hold no address, not "
        f"{P0}'s IP {IPS[P0]}"
    ]


def test_check_compositecontroller_missing_child_types(kubeconfig: Path, api: FakeKubeAPI) -> None:
    controller = api.get("compositecontrollers", "", "pg-failover-hook")
    children = controller["spec"]["childResources"]
    controller["spec"]["childResources"] = [c for c in children if c["resource"] == "services"]
    controller["spec"]["childResources"][0]["updateStrategy"] = {"method": "OnDelete"}
    code, out, _ = run("check", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert failed(out) == [
        "CompositeController pg-failover-hook: child v1 services has updateStrategy OnDelete, "
        "not InPlace: Metacontroller would not update it in place",
        "CompositeController pg-failover-hook: does not declare child discovery.k8s.io/v1 "
        "endpointslices (needed by spec.replicaService of databases/pg-orders)",
        "CompositeController pg-failover-hook: does not declare child batch/v1 cronjobs "
        "(needed by spec.backup of databases/pg-orders)",
    ]
    api.remove("compositecontrollers", "", "pg-failover-hook")
    assert failed(run("check", "--kubeconfig", str(kubeconfig))[1]) == [
        "CompositeController: no CompositeController has parentResource adg.io "
        "postgresqlclusters: Metacontroller never calls the hook (kubectl apply -k deploy/ "
        "installs it)"
    ]
    api.unserve(COMPOSITECONTROLLERS.plural)
    code, out, _ = run("check", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert failed(out)[0].startswith(
        "CompositeController: the API server does not serve "
        "compositecontrollers.metacontroller.k8s.io/v1alpha1: Metacontroller's CRDs"
    )


def test_check_token_secret(kubeconfig: Path, api: FakeKubeAPI) -> None:
    secret = api.get("secrets", "pg-failover-hook", "pg-failover-hook-auth")
    secret["data"]["token"] = base64.b64encode(b" \n").decode()
    code, out, _ = run("check", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert failed(out) == [
        "Secret pg-failover-hook/pg-failover-hook-auth: key 'token' is empty: the hook refuses "
        "every call (set a token, docs/security.md)"
    ]
    del secret["data"]
    assert failed(run("check", "--kubeconfig", str(kubeconfig))[1]) == [
        "Secret pg-failover-hook/pg-failover-hook-auth: has no key 'token': Metacontroller has "
        "no token to send"
    ]
    api.forbidden.add(("get", "secrets"))
    assert failed(run("check", "--kubeconfig", str(kubeconfig))[1]) == [
        "Secret pg-failover-hook/pg-failover-hook-auth: no permission: secrets "
        '"pg-failover-hook-auth" is forbidden: User "jane@example.com" cannot get resource '
        '"secrets" in API group "" in the namespace "pg-failover-hook"'
    ]
    api.remove("secrets", "pg-failover-hook", "pg-failover-hook-auth")
    api.forbidden.clear()
    assert failed(run("check", "--kubeconfig", str(kubeconfig))[1]) == [
        "Secret pg-failover-hook/pg-failover-hook-auth: does not exist: Metacontroller has no "
        "token to send"
    ]
    controller = api.get("compositecontrollers", "", "pg-failover-hook")
    del controller["spec"]["endpointConfigs"]
    assert failed(run("check", "--kubeconfig", str(kubeconfig))[1]) == [
        "CompositeController pg-failover-hook: has no endpointConfigs authorization secretRef: "
        "Metacontroller sends no token and the hook refuses every call (see docs/security.md)"
    ]


@pytest.mark.parametrize(
    ("args", "on"),
    [
        (["--leader-election"], True),
        (["-leader-election"], True),
        (["--leader-election=true"], True),
        (["--leader-election=1"], True),
        (["--leader-election=false"], False),
        (["--leader-election", "--leader-election=false"], False),
        (["--leader-election-id=metacontroller"], False),
        ([], False),
    ],
)
def test_leader_election_flag_parsing(args: list[str], on: bool) -> None:
    deployment = {"kind": "Deployment", **metacontroller_deployment(args)}
    (result,) = checks.leader_election([deployment], MC_NS)
    assert result.ok is on


def test_check_metacontroller_without_leader_election(kubeconfig: Path, api: FakeKubeAPI) -> None:
    api.remove("deployments", MC_NS, MC_NAME)
    # The chart's older StatefulSet form, or the upstream production manifest: no flag.
    sts = metacontroller_deployment(["--zap-log-level=4", "--discovery-interval=20s"])
    sts["metadata"]["name"] = "metacontroller"
    api.add("statefulsets", sts)
    code, out, _ = run("check", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert failed(out) == [
        f"Metacontroller StatefulSet {MC_NS}/metacontroller: runs without --leader-election: "
        "with more than one replica every replica runs every controller "
        "(deploy/metacontroller-values.yaml turns it on)"
    ]
    code, out, _ = run(
        "check", "--metacontroller-namespace", "kube-system", "--kubeconfig", str(kubeconfig)
    )
    assert failed(out) == [
        "Metacontroller: no Deployment or StatefulSet running a metacontroller image in "
        "namespace kube-system (pass --metacontroller-namespace)"
    ]


def test_check_json_and_colour(kubeconfig: Path, api: FakeKubeAPI) -> None:
    api.get("secrets", "pg-failover-hook", "pg-failover-hook-auth")["data"]["token"] = ""
    code, out, _ = run("check", "-o", "json", "--kubeconfig", str(kubeconfig))
    assert code == 1
    body = json.loads(out)
    assert body["ok"] is False
    assert [c["subject"] for c in body["checks"] if not c["ok"]] == [
        "Secret pg-failover-hook/pg-failover-hook-auth"
    ]
    tty = _Terminal()
    assert cli.main(["check", "--kubeconfig", str(kubeconfig)], tty, io.StringIO(), {}) == 1
    assert f"{ESC}31mFAIL{ESC}0m  Secret pg-failover-hook" in tty.getvalue()
    assert f"{ESC}32mok  {ESC}0m" in tty.getvalue()


# ------------------------------------------------------------------ status --lag


def serve_patroni(api: FakeKubeAPI, behind: dict[str, int]) -> None:
    """Each member's GET /patroni: P0 leads at 200 MiB, the others replay ``behind`` it."""
    leader_at = 200 * MIB
    for name in (P0, P1, P2):
        if name == P0:
            body = patroni_body("primary", name=name)
            body["xlog"] = {"location": leader_at}
        else:
            body = patroni_body("replica", name=name)
            body["xlog"].update(
                received_location=leader_at, replayed_location=leader_at - behind[name]
            )
        api.patroni[(NS, name)] = body


def test_status_lag_asks_each_patroni_through_the_pod_proxy(
    kubeconfig: Path, api: FakeKubeAPI
) -> None:
    serve_patroni(api, {P1: 0, P2: 64 * MIB + 512 * 1024})
    code, out, err = run("status", "--lag", "--kubeconfig", str(kubeconfig))
    assert (code, err) == (0, "")
    rows = member_rows(out)
    assert rows[P0][5] == "-"  # after the primary's star
    assert rows[P1][4:6] == ["0", "B"]
    assert rows[P2][4:6] == ["64.5", "MiB"]
    assert "Lag not measured" not in out
    proxied = sorted(unquote(r) for r in api.requests if "/proxy/" in r)
    assert proxied == [f"/api/v1/namespaces/{NS}/pods/{p}:8008/proxy/patroni" for p in (P0, P1, P2)]

    code, out, _ = run("status", "--lag", "-o", "json", "--kubeconfig", str(kubeconfig))
    members = {m["name"]: m for m in json.loads(out)["clusters"][0]["members"]}
    assert members[P2]["lag"] == {
        "bytes": 64 * MIB + 512 * 1024,
        "withinBytes": None,
        "source": "patroni",
    }
    assert members[P0]["lag"]["source"] == "leader"


def test_status_lag_says_why_a_member_was_not_measured(kubeconfig: Path, api: FakeKubeAPI) -> None:
    serve_patroni(api, {P1: 0, P2: 0})
    del api.patroni[(NS, P2)]
    code, out, _ = run("status", "--lag", "--kubeconfig", str(kubeconfig))
    assert code == 0
    assert member_rows(out)[P2][4] == "?"
    assert (
        "Lag not measured for pg-orders-2: error trying to reach service: dial tcp "
        f"{IPS[P2]}:8008: connect: connection refused (HTTP 503)" in out
    )
    del api.patroni[(NS, P0)]
    out = run("status", "--lag", "--kubeconfig", str(kubeconfig))[1]
    assert "pg-orders-1: no running leader answered" in out

    api.forbidden.add(("get", "pods/proxy"))
    code, out, _ = run("status", "--lag", "--kubeconfig", str(kubeconfig))
    assert code == 0
    rows = member_rows(out)
    assert (rows[P0][5], rows[P1][4], rows[P2][4]) == ("?", "?", "?")
    assert (
        'pg-orders-0: no permission: pods "pg-orders-0" is forbidden: User "jane@example.com" '
        'cannot get resource "pods/proxy" in API group "" in the namespace "databases"' in out
    )


def test_status_shows_why_a_member_did_not_answer_when_the_status_says(
    kubeconfig: Path, api: FakeKubeAPI
) -> None:
    """``members[].reason`` and ``membersAnswered`` (issue 10's status fields), when present."""
    status = api.get("postgresqlclusters", NS, CLUSTER)["status"]
    status["membersAnswered"] = "2/3"
    status["members"][2] = {"name": P2, "reachable": False, "reason": "read timeout"}
    code, out, _ = run("status", "--kubeconfig", str(kubeconfig))
    assert code == 0
    assert "Members (2/3 answered as Patroni)" in out
    assert "Not answering as Patroni: pg-orders-2: read timeout" in out
    assert member_rows(out)[P2][:6] == [P2, "?", "?", "?", "?", "no"]
    (cluster,) = json.loads(run("status", "-o", "json", "--kubeconfig", str(kubeconfig))[1])[
        "clusters"
    ]
    assert cluster["membersAnswered"] == "2/3"
    assert [m["reason"] for m in cluster["members"]] == [None, None, "read timeout"]


def test_pods_that_cannot_be_listed_are_said_not_guessed(
    kubeconfig: Path, api: FakeKubeAPI
) -> None:
    api.forbidden.add(("list", "pods"))
    code, out, _ = run("status", "--kubeconfig", str(kubeconfig))
    assert code == 0
    assert (
        "Note: the Pods could not be read (no permission: pods is forbidden: User "
        '"jane@example.com" cannot list resource "pods" in API group "" in the namespace '
        '"databases")' in out
    )
    # POD "?", IP "-", NODE "-": nothing from the Pods; the rest from the status.
    assert [r[-4:] for r in member_rows(out).values()] == [["yes", "?", "-", "-"]] * 3
    code, out, _ = run("check", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert failed(out) == [
        f"databases/pg-orders: Service {PRIMARY}: cannot list the Pods it selects: no "
        'permission: pods is forbidden: User "jane@example.com" cannot list resource "pods" in '
        'API group "" in the namespace "databases"'
    ]
