"""``kubectl pgfh status`` and ``check`` against the real API server, run by the real kubectl.

The cluster state is made the way it comes to exist, by the real programs where the project
has them:

* ``metacontroller/crd.yaml`` and Metacontroller's CRDs (``tests/data/``) applied with
  server-side apply; ``metacontroller/compositecontroller.yaml``; the hook's token Secret;
  Metacontroller's Deployment as its Helm chart renders it with the arguments of
  ``deploy/metacontroller-values.yaml`` (nothing schedules it: ``check`` reads its spec);
* three member Pods bound to Node ``pgfh-node-0``, which the kubelet stand-in
  (:class:`testbed.kubernetes.kubelet.KubeletStandIn`) reports Running with the Pod IPs of
  :mod:`testbed.kubernetes.podnet` (``198.18.0.N`` for ``127.0.0.N``) and Ready from each Pod's
  readiness probe, Patroni's ``GET /readiness``, answered by a small loopback server per member;
* the PostgreSQLCluster, synced by the real hook (``hooks.shell.app.create_app`` in process, a
  :class:`tests.helpers.FakeProber` playing the members' Patroni) on requests built from the
  real objects (``/customize`` says which Pods are related), its replies applied as
  Metacontroller v4.17 does: children created with the ``controller-uid`` label and a
  controller ownerReference, changed ones patched, the status written through the status
  subresource with ``observedGeneration``, until a sync changes nothing;
* the primary Service's EndpointSlice, written by the real endpointslice controller.

Then the pinned kubectl (``control_plane.binaries.bin_dir`` first on the PATH, the package's
``kubectl-pgfh`` from the venv's bin after it) runs ``kubectl pgfh``, and each failure case
changes what the real server can be made to show: the Service selecting a replica, the
leader's readiness probe failing (its EndpointSlice then lists it not ready), an unknown
cluster, a user without rights (403) or with exactly the rights docs/kubectl-plugin.md lists,
credentials the server refuses (401), an unreachable server, no CRD.

The module runs on a control plane of its own: ``check`` judges the whole installation
(every CompositeController, every Metacontroller workload), so what another test leaves in
the shared one must not change its verdict. The missing-CRD case starts one more, which
never gets the CRD. Faults the real server cannot be made to show on demand (an
EndpointSlice the controller has not caught up with, a Secret without its key, ...) stay on
the loopback fake API in tests/test_kubectl_plugin.py.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient

from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.kubernetes import ControlPlane, ControlPlaneError, start_control_plane
from testbed.kubernetes.binaries import pinned_version
from testbed.kubernetes.kubelet import POD_IP_ANNOTATION, KubeletStandIn
from testbed.kubernetes.podnet import pod_ip
from testbed.kubernetes.pods import NODE, READINESS_PROBE, patroni_pod
from testbed.kubernetes.rest import KubeRest, resource_path
from testbed.metacontroller.kube_setup import apply_crds
from tests.child_helpers import MIB, READ_ONLY, answer
from tests.helpers import NO_AUTH, FakeProber
from tests.test_kubectl_plugin import MC_NAME, MC_NS, metacontroller_deployment

pytestmark = [pytest.mark.kube, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
NS = "databases"
CLUSTER = "pg-orders"
PRIMARY = "pg-orders-primary"
MEMBERS = ("pg-orders-0", "pg-orders-1", "pg-orders-2")
P0, P1, P2 = MEMBERS
#: The loopback address behind each member's Pod IP (not the devcluster's 127.0.0.2-4).
LOOPBACK = {P0: "127.0.0.41", P1: "127.0.0.42", P2: "127.0.0.43"}
IPS = {name: pod_ip(address) for name, address in LOOPBACK.items()}

LABELS = {"application": "patroni", "cluster-name": CLUSTER}
HOOK_NS = "pg-failover-hook"
SECRET = "pg-failover-hook-auth"
TOKEN = b"3f1c" * 16
CC_PATH = resource_path("metacontroller.k8s.io/v1alpha1", "compositecontrollers", None)
PGC_PATH = resource_path("adg.io/v1alpha1", "postgresqlclusters", NS, CLUSTER)
#: Metacontroller's map keys of the child types the CompositeController declares.
CHILD_TYPES = {
    "Service.v1": ("v1", "services"),
    "EndpointSlice.discovery.k8s.io/v1": ("discovery.k8s.io/v1", "endpointslices"),
    "CronJob.batch/v1": ("batch/v1", "cronjobs"),
}
LAST_APPLIED = "metacontroller.k8s.io/last-applied-configuration"
VENV_BIN = Path(sys.executable).parent


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# ------------------------------------------------------------------ control planes


def _start(directory: Path) -> ControlPlane:
    try:
        return start_control_plane(directory, log=lambda line: print(f"\n{line}", flush=True))
    except ControlPlaneError as error:
        pytest.exit(f"the test control plane did not come up: {error}", returncode=3)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    started = _start(tmp_path_factory.mktemp("plugin-plane"))
    try:
        yield started
    finally:
        started.stop()


def kubectl(
    cp: ControlPlane, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl ARGS`` as a user runs it: the pinned kubectl first on the PATH, the plugin
    after it, ``KUBECONFIG`` set, nothing else of this process's environment."""
    path = f"{cp.binaries.bin_dir}:{VENV_BIN}:/usr/bin:/bin"
    found = shutil.which("kubectl", path=path)
    assert found == str(cp.binaries.path("kubectl")), found
    env = {
        "PATH": path,
        "HOME": str(cp.run_dir),
        "KUBECONFIG": str(kubeconfig or cp.admin_kubeconfig),
    }
    return subprocess.run(
        ["kubectl", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def pgfh(
    cp: ControlPlane, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return kubectl(cp, "pgfh", *args, kubeconfig=kubeconfig)


# ------------------------------------------------------------------ Patroni's /readiness


class _Readiness(BaseHTTPRequestHandler):
    """Patroni's ``GET /readiness``: 200 while the member runs, 503 otherwise."""

    healthy: threading.Event

    def do_GET(self) -> None:
        ok = self.path == "/readiness" and self.healthy.is_set()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Member:
    """A member's loopback /readiness server, reached through its Pod IP."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.healthy = threading.Event()
        self.healthy.set()
        handler = type("Handler", (_Readiness,), {"healthy": self.healthy})
        self.server = ThreadingHTTPServer((LOOPBACK[name], 0), handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def member_pod(member: Member) -> dict[str, Any]:
    """A Patroni member Pod as a StatefulSet makes it (the test bed's one member Pod, with
    the StatefulSet's index label, hostname and subdomain), bound to the stand-in's Node.
    Its probe is Patroni's /readiness at the loopback server's port (a kernel-chosen one, so
    runs never collide); one failure turns it not Ready."""
    index = member.name.rsplit("-", 1)[1]
    pod = patroni_pod(
        member.name,
        NS,
        {**LABELS, "apps.kubernetes.io/pod-index": index},
        annotations={POD_IP_ANNOTATION: IPS[member.name]},
        readiness={
            **READINESS_PROBE,
            "httpGet": {"path": "/readiness", "port": member.port},
            "failureThreshold": 1,
        },
        image="ghcr.io/zalando/spilo-17:4.0-p3",
    )
    pod["spec"] |= {"hostname": member.name, "subdomain": CLUSTER}
    return pod


# ------------------------------------------------------------------ Metacontroller's part


class Metacontroller:
    """What Metacontroller v4.17 does for one parent: ask the hook, apply its reply.

    ``/customize`` names the related Pods; each sync request carries the parent, the
    observed children of every declared type (by the ``controller-uid`` label of
    ``generateSelector``) and the related Pods, all as the API server returns them. A new
    child is created with the label, a controller ownerReference (``blockOwnerDeletion``)
    and the last-applied annotation; a child whose desired fields differ is patched (a JSON
    merge patch of the desired object: Metacontroller's three-way merge, for the fields the
    hook sets); a child left out of the reply is deleted with a UID precondition; the status
    is written through the status subresource, with ``observedGeneration``, when it changed.
    Not modelled: the finalizer and the finalize hook, resyncAfterSeconds (a test syncs
    when it wants a sync), retries.
    """

    def __init__(self, rest: KubeRest, hook: FlaskClient, controller: Mapping[str, Any]) -> None:
        self.rest = rest
        self.hook = hook
        self.controller = dict(controller)

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        response = self.hook.post(path, data=json.dumps(body), content_type="application/json")
        assert response.status_code == 200, response.data
        reply: dict[str, Any] = json.loads(response.data)
        return reply

    def related(self, parent: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """``Pod.v1`` by the label rule, ``Service.v1`` by the rule by name (in ``NS``)."""
        rules = self._post("/customize", {"controller": self.controller, "parent": parent})
        pods: dict[str, Any] = {}
        services: dict[str, Any] = {}
        for rule in rules["relatedResources"]:
            if rule["resource"] == "services":
                assert (rule["apiVersion"], rule["namespace"]) == ("v1", NS), rule
                listed = self.rest.get(f"/api/v1/namespaces/{NS}/services")
                services.update(
                    {
                        s["metadata"]["name"]: _typed(s, "v1", "Service")
                        for s in listed["items"]
                        if s["metadata"]["name"] in rule["names"]
                    }
                )
                continue
            assert (rule["apiVersion"], rule["resource"]) == ("v1", "pods"), rule
            selector = ",".join(
                f"{k}={v}" for k, v in sorted(rule["labelSelector"]["matchLabels"].items())
            )
            listed = self.rest.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=selector)
            pods.update({p["metadata"]["name"]: _typed(p, "v1", "Pod") for p in listed["items"]})
        return {"Pod.v1": pods, "Service.v1": services}

    def children(self, uid: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for key, (api_version, plural) in CHILD_TYPES.items():
            listed = self.rest.get(
                resource_path(api_version, plural, NS), labelSelector=f"controller-uid={uid}"
            )
            kind = key.split(".", 1)[0]
            found[key] = {
                c["metadata"]["name"]: _typed(c, api_version, kind) for c in listed["items"]
            }
        return found

    def sync(self) -> bool:
        """One sync; whether it changed anything."""
        parent = self.rest.get(PGC_PATH)
        uid = parent["metadata"]["uid"]
        observed = self.children(uid)
        request = {
            "controller": self.controller,
            "parent": parent,
            "children": observed,
            "related": self.related(parent),
            "finalizing": False,
        }
        reply = self._post("/sync", request)
        changed = False
        wanted: set[tuple[str, str]] = set()
        for child in reply["children"]:
            key = f"{child['kind']}.{child['apiVersion']}"
            changed |= self._apply_child(parent, key, child, observed[key])
            wanted.add((key, child["metadata"]["name"]))
        for key, group in observed.items():
            for name, child in group.items():
                if (key, name) not in wanted:
                    api_version, plural = CHILD_TYPES[key]
                    self.rest.delete(
                        resource_path(api_version, plural, NS, name),
                        {"preconditions": {"uid": child["metadata"]["uid"]}},
                    )
                    changed = True
        status = {**reply["status"], "observedGeneration": parent["metadata"]["generation"]}
        if parent.get("status") != status:
            self.rest.replace(f"{PGC_PATH}/status", {**parent, "status": status})
            changed = True
        return changed

    def _apply_child(
        self,
        parent: Mapping[str, Any],
        key: str,
        desired: Mapping[str, Any],
        observed: Mapping[str, Any],
    ) -> bool:
        api_version, plural = CHILD_TYPES[key]
        child = copy.deepcopy(dict(desired))
        meta = child.setdefault("metadata", {})
        meta.setdefault("namespace", NS)
        meta.setdefault("labels", {})["controller-uid"] = parent["metadata"]["uid"]
        meta.setdefault("annotations", {})[LAST_APPLIED] = json.dumps(desired)
        current = observed.get(meta["name"])
        if current is None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": parent["apiVersion"],
                    "kind": parent["kind"],
                    "name": parent["metadata"]["name"],
                    "uid": parent["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            self.rest.create(resource_path(api_version, plural, NS), child)
            return True
        if _contains(current, child):
            return False
        self.rest.merge_patch(resource_path(api_version, plural, NS, meta["name"]), child)
        return True

    def sync_until_steady(self) -> None:
        for _ in range(6):
            if not self.sync():
                return
        raise AssertionError("the hook and Metacontroller did not reach a steady state")


def _typed(obj: Mapping[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    """A list's item with the kind and apiVersion that Metacontroller's objects carry."""
    return {"apiVersion": api_version, "kind": kind, **obj}


def _contains(observed: Any, desired: Any) -> bool:
    """Every field of ``desired`` is in ``observed`` with the same value (lists item by item:
    the server adds defaults such as a port's ``protocol``)."""
    if isinstance(desired, dict):
        return isinstance(observed, dict) and all(
            _contains(observed.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(observed, list)
            and len(observed) == len(desired)
            and all(_contains(o, d) for o, d in zip(observed, desired, strict=True))
        )
    return bool(observed == desired)


# ------------------------------------------------------------------ the world


class World:
    """The control plane, the members, the hook's prober and Metacontroller's stand-in."""

    def __init__(
        self,
        cp: ControlPlane,
        rest: KubeRest,
        metacontroller: Metacontroller,
        members: dict[str, Member],
        prober: FakeProber,
    ) -> None:
        self.cp = cp
        self.prober = prober
        self.rest = rest
        self.metacontroller = metacontroller
        self.members = members

    def primary_slice(self) -> list[tuple[str, bool | None]]:
        """(address, ready) of every endpoint of the primary Service's EndpointSlices."""
        listed = self.rest.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices",
            labelSelector=f"kubernetes.io/service-name={PRIMARY}",
        )
        return sorted(
            (address, (e.get("conditions") or {}).get("ready"))
            for s in listed["items"]
            for e in s.get("endpoints") or []
            for address in e.get("addresses") or []
        )

    def pod_ready(self, name: str) -> bool:
        pod = self.rest.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in pod.get("status", {}).get("conditions") or []
        )

    def restore(self) -> None:
        """Every member healthy and Ready, the hook's reply applied, the slice caught up."""
        for member in self.members.values():
            member.healthy.set()
        wait_for(lambda: all(self.pod_ready(n) for n in MEMBERS), 30, "every member Ready")
        self.metacontroller.sync_until_steady()
        wait_for(
            lambda: self.primary_slice() == [(IPS[P0], True)],
            30,
            f"the primary Service's EndpointSlice to list {IPS[P0]} ready",
        )


def _apply(cp: ControlPlane, *files: Path) -> None:
    for path in files:
        cp.kubectl("apply", "--server-side", "--field-manager=pgfh-test", "-f", str(path))


@pytest.fixture(scope="module")
def world(plane: ControlPlane, pod_network: None) -> Iterator[World]:
    rest = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    # Polled through the API: `kubectl wait` fails outright on a CRD created so recently
    # that it has no status.conditions yet ("accessor error: <nil>"), seen in a full run.
    apply_crds(rest, timeout=60)
    _apply(plane, ROOT / "metacontroller/compositecontroller.yaml")
    members: dict[str, Member] = {}
    stack = contextlib.ExitStack()
    try:
        for namespace in (NS, HOOK_NS, MC_NS):
            rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        rest.create(
            f"/api/v1/namespaces/{HOOK_NS}/secrets",
            {
                "metadata": {"name": SECRET},
                "type": "Opaque",
                "data": {"token": base64.b64encode(TOKEN).decode()},
            },
        )
        values = yaml.safe_load((ROOT / "deploy/metacontroller-values.yaml").read_text())
        deployment = metacontroller_deployment(values["commandArgs"])
        del deployment["status"], deployment["metadata"]["uid"]  # the server's to write
        rest.create(f"/apis/apps/v1/namespaces/{MC_NS}/deployments", deployment)

        for name in MEMBERS:
            members[name] = Member(name)
            stack.callback(members[name].close)
        stack.enter_context(KubeletStandIn(rest, NODE))
        for member in members.values():
            rest.create(f"/api/v1/namespaces/{NS}/pods", member_pod(member))
        cluster = {
            "apiVersion": "adg.io/v1alpha1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": CLUSTER, "namespace": NS},
            "spec": {
                "primarySelector": LABELS,
                "serviceRef": {"name": PRIMARY},
                "healthCheckPath": "/primary",
                "replicaService": {"name": READ_ONLY},
            },
        }
        plane.kubectl("apply", "--server-side", "-f", "-", input_text=json.dumps(cluster))

        prober = FakeProber(
            {P0: answer(P0, "primary"), P1: answer(P1), P2: answer(P2, behind=64 * MIB)}
        )
        hook = create_app(settings=HookSettings(auth=NO_AUTH), prober=prober).test_client()
        controller = rest.get(f"{CC_PATH}/pg-failover-hook")
        built = World(plane, rest, Metacontroller(rest, hook, controller), members, prober)
        built.restore()
        yield built
    finally:
        stack.close()
        rest.close()


@pytest.fixture
def healthy(world: World) -> Iterator[World]:
    """The world as the hook and Metacontroller leave it, before and after each test."""
    world.restore()
    try:
        yield world
    finally:
        world.restore()


def lines(out: str) -> list[str]:
    return out.splitlines()


def failed(out: str) -> list[str]:
    return [line[6:] for line in out.splitlines() if line.startswith("FAIL")]


# ------------------------------------------------------------------ the healthy cluster


def test_the_real_kubectl_finds_the_plugin_and_runs_the_pinned_version(
    plane: ControlPlane,
) -> None:
    shown = json.loads(kubectl(plane, "version", "--client", "-o", "json").stdout)
    assert shown["clientVersion"]["gitVersion"] == pinned_version("kubernetes", "k8s.io/kubernetes")
    listed = kubectl(plane, "plugin", "list")
    assert str(VENV_BIN / "kubectl-pgfh") in listed.stdout, listed


def test_status_names_the_leader_from_the_real_objects(healthy: World) -> None:
    ran = pgfh(healthy.cp, "status", "-n", NS)
    assert (ran.returncode, ran.stderr) == (0, ""), ran
    out = ran.stdout
    assert f"PostgreSQLCluster {NS}/{CLUSTER}" in out
    assert f"Primary:  {P0} (timeline 1)" in out
    assert "Ready:    True (LeaderFound)" in out
    rows = {
        r.split()[0]: r.split()
        for r in out.split("\nMembers", 1)[1].split("\n\n", 1)[0].splitlines()
        if r.startswith("  pg-orders-")
    }
    assert rows[P0][:10] == [P0, "*", "primary", "running", "1", "-", "yes", "Ready", IPS[P0], NODE]
    assert rows[P1][:9] == [P1, "replica", "running", "1", "≤", "16", "MiB", "yes", "Ready"]
    assert rows[P2][:7] == [P2, "replica", "running", "1", "?", "yes", "Ready"]
    assert f"  {P1:<24} {IPS[P1]}" in out  # the read-only EndpointSlice the hook wrote

    as_json = pgfh(healthy.cp, "status", CLUSTER, "-n", NS, "-o", "json")
    assert as_json.returncode == 0, as_json
    (cluster,) = json.loads(as_json.stdout)["clusters"]
    assert (cluster["namespace"], cluster["name"], cluster["primary"]) == (NS, CLUSTER, P0)
    assert cluster["observedGeneration"] == cluster["generation"] == 1
    members = {m["name"]: m for m in cluster["members"]}
    assert members[P0]["pod"] == {
        "phase": "Running",
        "ready": True,
        "ip": IPS[P0],
        "node": NODE,
        "terminating": False,
    }
    assert cluster["readOnly"]["endpoints"] == [{"pod": P1, "ip": IPS[P1]}]

    every = pgfh(healthy.cp, "status", "-A", "-o", "json")
    assert [(c["namespace"], c["name"]) for c in json.loads(every.stdout)["clusters"]] == [
        (NS, CLUSTER)
    ]


def test_check_passes_on_the_real_installation(healthy: World) -> None:
    ran = pgfh(healthy.cp, "check", "-n", NS)
    assert (ran.returncode, ran.stderr) == (0, ""), ran.stdout
    out = lines(ran.stdout)
    assert out == [
        f"ok    {NS}/{CLUSTER}: Ready (LeaderFound)",
        f"ok    {NS}/{CLUSTER}: Service {PRIMARY}: selects exactly {P0}, the primary",
        f"ok    {NS}/{CLUSTER}: Service {PRIMARY}: its EndpointSlice holds {IPS[P0]}, {P0}'s IP",
        "ok    CompositeController pg-failover-hook: declares child v1 services (InPlace)",
        "ok    CompositeController pg-failover-hook: declares child discovery.k8s.io/v1 "
        "endpointslices (InPlace)",
        f"ok    Secret {HOOK_NS}/{SECRET}: key 'token' holds a token ({len(TOKEN)} bytes)",
        f"ok    Metacontroller Deployment {MC_NS}/{MC_NAME}: runs with --leader-election "
        "(2 replica(s))",
        "7 checks, 0 failed",
    ]
    as_json = pgfh(healthy.cp, "check", "-n", NS, "-o", "json")
    assert as_json.returncode == 0
    body = json.loads(as_json.stdout)
    assert body["ok"] is True and len(body["checks"]) == 7


def test_the_documented_permissions_are_enough(healthy: World) -> None:
    """A user with exactly the ClusterRole and Role of docs/kubectl-plugin.md runs both."""
    text = (ROOT / "docs/kubectl-plugin.md").read_text()
    block = text.split("## Permissions", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    role, token_role = list(yaml.safe_load_all(block))
    rest = healthy.rest
    rest.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    rest.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{HOOK_NS}/roles", token_role)
    subject = [{"kind": "User", "name": "olive", "apiGroup": "rbac.authorization.k8s.io"}]
    rest.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": "kubectl-pgfh-olive"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": subject,
        },
    )
    rest.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{HOOK_NS}/rolebindings",
        {
            "metadata": {"name": "kubectl-pgfh-token-olive"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": token_role["metadata"]["name"],
            },
            "subjects": subject,
        },
    )
    olive = healthy.cp.user_kubeconfig("olive")
    # RBAC caches are updated from a watch: allow the bindings a moment to take effect.
    ran = wait_for(
        lambda: (r := pgfh(healthy.cp, "check", "-n", NS, kubeconfig=olive)).returncode == 0 and r,
        30,
        "the documented rights to be enough for check",
    )
    assert failed(ran.stdout) == []
    status = pgfh(healthy.cp, "status", "-n", NS, "-o", "json", kubeconfig=olive)
    assert status.returncode == 0, status
    assert json.loads(status.stdout)["clusters"][0]["primary"] == P0
    # Without the Role, the Secret is a 403 the check names; the other checks still run.
    rest.delete(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{HOOK_NS}/rolebindings/kubectl-pgfh-token-olive"
    )
    ran = wait_for(
        lambda: (r := pgfh(healthy.cp, "check", "-n", NS, kubeconfig=olive)).returncode == 1 and r,
        30,
        "the Secret to be refused",
    )
    assert failed(ran.stdout) == [
        f'Secret {HOOK_NS}/{SECRET}: no permission: secrets "{SECRET}" is forbidden: User '
        f'"olive" cannot get resource "secrets" in API group "" in the namespace "{HOOK_NS}"'
    ]


# ------------------------------------------------------------------ what the server shows wrong


def test_check_fails_when_the_service_selects_a_replica(healthy: World) -> None:
    path = f"/api/v1/namespaces/{NS}/services/{PRIMARY}"
    healthy.rest.merge_patch(
        path, {"spec": {"selector": {"statefulset.kubernetes.io/pod-name": P1}}}
    )
    ran = pgfh(healthy.cp, "check", "-n", NS)
    assert ran.returncode == 1, ran
    assert failed(ran.stdout) == [
        f"{NS}/{CLUSTER}: Service {PRIMARY}: selects {P1}; the status names {P0} as primary"
    ]
    healthy.rest.merge_patch(
        path, {"spec": {"selector": {"statefulset.kubernetes.io/pod-name": None}}}
    )
    ran = pgfh(healthy.cp, "check", "-n", NS)
    assert failed(ran.stdout) == [
        f"{NS}/{CLUSTER}: Service {PRIMARY}: selects {P0}, {P1}, {P2}; the status names {P0} "
        "as primary"
    ]
    healthy.rest.delete(path)
    ran = pgfh(healthy.cp, "check", "-n", NS)
    assert failed(ran.stdout) == [
        f"{NS}/{CLUSTER}: Service {PRIMARY}: the primary Service does not exist"
    ]


def test_check_fails_when_the_slice_lists_the_leader_not_ready(healthy: World) -> None:
    """The leader's readiness probe fails: the kubelet marks it not Ready, the endpointslice
    controller lists it ``ready: false``, and the Service sends it nothing."""
    healthy.members[P0].healthy.clear()
    wait_for(
        lambda: healthy.primary_slice() == [(IPS[P0], False)],
        30,
        "the slice to list the leader not ready",
    )
    ran = pgfh(healthy.cp, "check", "-n", NS)
    assert ran.returncode == 1, ran
    assert failed(ran.stdout) == [
        f"{NS}/{CLUSTER}: Service {PRIMARY}: its EndpointSlice lists {P0}'s IP {IPS[P0]} as "
        "not ready: the Service sends it no traffic (its readiness probe fails)"
    ]
    status = pgfh(healthy.cp, "status", "-n", NS, "-o", "json")
    members = {m["name"]: m for m in json.loads(status.stdout)["clusters"][0]["members"]}
    assert members[P0]["pod"]["ready"] is False


def test_check_fails_when_the_hook_finds_no_leader(healthy: World) -> None:
    """The leader stops answering; the hook keeps the Service and says why in the status."""
    prober = healthy.prober
    leading = prober.answers[P0]
    prober.answers[P0] = answer(P0, "replica", state="stopped")
    try:
        healthy.metacontroller.sync_until_steady()
        ran = pgfh(healthy.cp, "check", "-n", NS)
        assert ran.returncode == 1, ran
        (reason,) = failed(ran.stdout)
        assert reason.startswith(f"{NS}/{CLUSTER}: Ready is False (NoLeader): "), reason
        status = pgfh(healthy.cp, "status", "-n", NS)
        assert "Ready:    False (NoLeader)" in status.stdout
        assert f"Primary:  {P0} (timeline 1) kept by the Service" in status.stdout
    finally:
        prober.answers[P0] = leading


def test_an_unknown_cluster_is_named(healthy: World) -> None:
    for command in ("status", "check"):
        ran = pgfh(healthy.cp, command, "pg-nope", "-n", NS)
        assert (ran.returncode, ran.stdout) == (2, ""), ran
        assert ran.stderr == f"error: PostgreSQLCluster 'pg-nope' not found in namespace {NS}\n"


def test_a_user_without_rights_gets_the_servers_sentence(healthy: World) -> None:
    jane = healthy.cp.user_kubeconfig("jane")
    ran = pgfh(healthy.cp, "status", "-n", NS, kubeconfig=jane)
    assert (ran.returncode, ran.stdout) == (2, ""), ran
    assert ran.stderr == (
        'error: no permission: postgresqlclusters.adg.io is forbidden: User "jane" cannot list '
        f'resource "postgresqlclusters" in API group "adg.io" in the namespace "{NS}"\n'
    )
    ran = pgfh(healthy.cp, "status", CLUSTER, "-n", NS, kubeconfig=jane)
    assert ran.stderr == (
        f'error: no permission: postgresqlclusters.adg.io "{CLUSTER}" is forbidden: User "jane" '
        f'cannot get resource "postgresqlclusters" in API group "adg.io" in the namespace "{NS}"\n'
    )
    ran = pgfh(healthy.cp, "status", "-A", kubeconfig=jane)
    assert ran.stderr == (
        'error: no permission: postgresqlclusters.adg.io is forbidden: User "jane" cannot list '
        'resource "postgresqlclusters" in API group "adg.io" at the cluster scope\n'
    )


def test_refused_credentials_and_an_unreachable_server(plane: ControlPlane, tmp_path: Path) -> None:
    config = yaml.safe_load(plane.admin_kubeconfig.read_text())
    config["users"][0]["user"] = {"token": "expired-0123456789"}
    stale = tmp_path / "stale.kubeconfig"
    stale.write_text(yaml.safe_dump(config))
    ran = pgfh(plane, "status", "-n", NS, kubeconfig=stale)
    assert (ran.returncode, ran.stdout) == (2, ""), ran
    assert ran.stderr == (
        "error: the API server did not accept the kubeconfig's credentials (401 Unauthorized): "
        "log in again or check the user of the current context\n"
    )

    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = yaml.safe_load(plane.admin_kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    gone = tmp_path / "gone.kubeconfig"
    gone.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    ran = pgfh(plane, "check", "-n", NS, kubeconfig=gone)
    assert (ran.returncode, ran.stdout) == (2, ""), ran
    assert ran.stderr.startswith(
        f"error: cannot reach the Kubernetes API server at https://127.0.0.1:{port}: "
    ), ran.stderr
    assert "\n" not in ran.stderr.rstrip("\n")
    assert time.monotonic() - started < 30


def test_a_missing_crd_is_said_by_name(tmp_path: Path) -> None:
    """A control plane of its own, which never gets the CRD (the module's has it)."""
    bare = _start(tmp_path / "bare")
    try:
        for argv in (("status",), ("status", CLUSTER), ("check",), ("status", "-A")):
            ran = pgfh(bare, *argv, "-n", NS) if "-A" not in argv else pgfh(bare, *argv)
            assert (ran.returncode, ran.stdout) == (2, ""), (argv, ran)
            assert ran.stderr == (
                "error: the API server does not serve postgresqlclusters.adg.io/v1alpha1: the "
                "PostgreSQLCluster CRD is not installed (kubectl apply -k deploy/ installs it)\n"
            ), argv
    finally:
        bare.stop()
