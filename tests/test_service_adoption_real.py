"""The Service the user names, already there: reported, refused, adopted, on the real control plane.

Real Patroni (etcd DCS), the real hook under gunicorn, the Metacontroller stand-in against the
real API server as its least-privilege ServiceAccount (or a real Metacontroller v4.17.2,
``PGFH_METACONTROLLER_BINARY``), the real endpointslice controller, and ``kubectl pgfh`` run
by the pinned kubectl. The migration from the seed's operator as it comes to exist: the
operator's Service, controlled by the operator's own object (here a ConfigMap standing for
its custom resource), its selector patched by that operator to a member that is no longer
the leader, with a key of its own (``role: master``). Then the PostgreSQLCluster that names
that Service is created, and:

1. ``Ready`` is ``False``/``ServiceNotOwned``, naming the controller; the Service is not
   touched, and Metacontroller creates nothing: no POST of Services at all (Metacontroller
   v4.17.2 posted it every sync and got 409, swallowed), counted by the API server's own
   ``apiserver_request_total``;
2. ``kubectl pgfh adopt`` refuses a Service another controller controls (exit 1), and a user
   who may read but not patch Services gets the API server's sentence (exit 2); the Service
   is unchanged both times (same resourceVersion);
3. ``kubectl pgfh adopt --force --wait`` (the operator is stopped: the migration path of
   docs/deploy.md) hands it over: Metacontroller adopts it, the selector is exactly
   ``primarySelector`` plus the leader's pod name (the operator's ``role`` key gone), the
   EndpointSlice lists the leader, ``Ready`` is ``True``; how long it took is printed.

Run under ``flock /tmp/pgfh-realcluster.lock`` (the real Patroni cluster is one per machine).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.pods import POD_NAME_LABEL
from testbed.kubernetes.rest import KubeRest, resource_path
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import CLUSTER, PRIMARY_SELECTOR, SERVICE, rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig
from testbed.patroni import PatroniCluster
from tests.kube_faults import rig_on, wait_status
from tests.test_kubectl_plugin_real import pgfh, wait_for

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
RBAC = "/apis/rbac.authorization.k8s.io/v1"
#: How long the not-owned cluster is watched for a create of its Service (several syncs:
#: the hook asks for one every healthy period, and Pod events add more).
WINDOW = 8.0
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def service_requests(rest: KubeRest) -> dict[tuple[str, str], float]:
    """``apiserver_request_total`` for Services, by (verb, code): the API server's count."""
    response = rest.session.get(f"{rest.credentials.server}/metrics", timeout=10)
    response.raise_for_status()
    counts: dict[tuple[str, str], float] = {}
    for line in response.text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("resource") == "services" and not labels.get("subresource"):
            key = (labels.get("verb", ""), labels.get("code", ""))
            counts[key] = counts.get(key, 0.0) + float(match["value"])
    return counts


def grown(
    before: Mapping[tuple[str, str], float], after: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def hook_replies(hook: GunicornHook, decision: str) -> float:
    """The hook's own count of sync replies with that decision (its /metrics)."""
    text = requests.get(f"{hook.url}/metrics", timeout=5).text
    wanted = f'pgfh_sync_replies_total{{decision="{decision}"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


def ready(status: Mapping[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with rig_hook(tmp_path_factory.mktemp("hook"), source="worktree", env=HOOK_ENV) as running:
        yield running


@pytest.fixture
def seeded(
    control_plane: ControlPlane, pod_network: None, kube_namespace: str
) -> Iterator[tuple[KubeRest, dict[str, Any]]]:
    """The seed operator's leftovers: its object and the Service it controls and patched."""
    rest = KubeRest.from_kubeconfig(control_plane.admin_kubeconfig)
    operator = rest.create(
        resource_path("v1", "configmaps", kube_namespace),
        {"metadata": {"name": "seed-operator"}, "data": {"watches": SERVICE}},
    )
    yield rest, operator
    rest.close()


def test_an_existing_service_is_reported_refused_then_adopted_and_pinned(
    control_plane: ControlPlane,
    seeded: tuple[KubeRest, dict[str, Any]],
    kube_namespace: str,
    healthy_patroni_cluster: PatroniCluster,
    hook: GunicornHook,
    tmp_path: Path,
) -> None:
    rest, operator = seeded
    ns = kube_namespace
    cluster = healthy_patroni_cluster
    leader = cluster.leader()
    assert leader is not None
    stale = next(n for n in cluster.names() if n != leader)
    service_path = resource_path("v1", "services", ns, SERVICE)
    seed_selector = {**PRIMARY_SELECTOR, "role": "master", POD_NAME_LABEL: stale}
    created = rest.create(
        resource_path("v1", "services", ns),
        {
            "metadata": {
                "name": SERVICE,
                "labels": {"app": "pg-orders"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "seed-operator",
                        "uid": operator["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "selector": seed_selector,
                "ports": [{"name": "postgresql", "port": 5432, "targetPort": 5432}],
            },
        },
    )
    version = created["metadata"]["resourceVersion"]

    with rig_on(control_plane, cluster, ns, hook.url, hook.token, tmp_path) as rig:
        # 1. Reported, never Ready, never created.
        parent = wait_status(rig, lambda s: ready(s).get("reason") == "ServiceNotOwned", 60)
        message = ready(parent["status"])["message"]
        assert ready(parent["status"])["status"] == "False"
        assert "ConfigMap seed-operator (v1, controller)" in message, message
        assert "--force" in message, message
        assert "primary" not in parent["status"]
        requests_before = service_requests(rest)
        replies_before = hook_replies(hook, "ServiceNotOwned")
        time.sleep(WINDOW)
        syncs = hook_replies(hook, "ServiceNotOwned") - replies_before
        during = grown(requests_before, service_requests(rest))
        print(f"\nnot owned: {syncs:g} syncs in {WINDOW:g} s, Service requests {during}")
        assert syncs >= 2, "Metacontroller kept syncing the cluster"
        assert not any(verb == "POST" for verb, _ in during), during
        assert rest.get(service_path)["metadata"]["resourceVersion"] == version
        _no_create_recorded(rig)

        # 2. Refused: another controller's Service; a user who may not patch it.
        ran = pgfh(control_plane, "adopt", CLUSTER, "-n", ns)
        assert ran.returncode == 1, ran
        assert ran.stdout.startswith(
            f"refused: Service {SERVICE} is controlled by ConfigMap seed-operator (v1)"
        ), ran.stdout
        reader = _reader(control_plane, rest, ns)
        ran = wait_for(
            lambda: (
                (
                    r := pgfh(
                        control_plane, "adopt", CLUSTER, "-n", ns, "--force", kubeconfig=reader
                    )
                ).returncode
                == 2
                and "patch" in r.stderr
                and r
            ),
            30,
            "the reader's patch to be refused",
        )
        assert ran.stderr == (
            f'error: no permission: services "{SERVICE}" is forbidden: User "reader" cannot '
            f'patch resource "services" in API group "" in the namespace "{ns}"\n'
        ), ran.stderr
        assert rest.get(service_path)["metadata"]["resourceVersion"] == version

        # 3. The operator is stopped (it never ran here); the hand-over, forced, by the same
        # user with exactly the Role docs/kubectl-plugin.md documents for adopt.
        _bind_documented_role(rest, ns)
        ran = wait_for(
            lambda: (
                r := pgfh(
                    control_plane, "adopt", CLUSTER, "-n", ns, "--force", "--wait", "30",
                    kubeconfig=reader,
                )
            ).returncode
            != 2
            and r,
            30,
            "the documented Role to take effect",
        )  # fmt: skip
        assert ran.returncode == 0, ran
        assert "note: removed the controller reference to ConfigMap seed-operator (v1)" in (
            ran.stdout
        )
        pinned = re.search(r"pinned: Service \S+ selects (\S+), ([\d.]+) s after", ran.stdout)
        assert pinned is not None, ran.stdout
        print(f"adopt -> pinned: {pinned[2]} s")
        assert pinned[1] == leader
        service = rest.get(service_path)
        parent_uid = rig.parent()["metadata"]["uid"]  # type: ignore[index]
        (owner,) = service["metadata"]["ownerReferences"]
        assert (owner["uid"], owner["controller"]) == (parent_uid, True)
        assert service["spec"]["selector"] == {**PRIMARY_SELECTOR, POD_NAME_LABEL: leader}
        assert service["metadata"]["labels"]["app"] == "pg-orders", "their labels are kept"
        rig.slices.wait_ready((rig.leader_ip(leader),), 30, f"the leader {leader}")
        parent = wait_status(rig, lambda s: ready(s).get("reason") == "LeaderFound", 30)
        assert parent["status"]["primary"] == leader
        assert rig.slices.service_deleted == []
        after = service_requests(rest)
        time.sleep(WINDOW / 2)
        assert not any(verb == "POST" for verb, _ in grown(after, service_requests(rest)))


def _no_create_recorded(rig: KubeRig) -> None:
    """The stand-in's own records (a binary writes none): nothing created, no error."""
    if rig.controller is None:
        return
    assert [r for r in rig.records if r.created] == []
    assert [r for r in rig.records if r.error] == []


def _bind_documented_role(rest: KubeRest, ns: str) -> None:
    """docs/kubectl-plugin.md's Role for ``adopt``, in ``ns``, bound to the reader."""
    text = (ROOT / "docs/kubectl-plugin.md").read_text()
    section = text.split("## `kubectl pgfh adopt`", 1)[1]
    role = yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])
    assert role["kind"] == "Role"
    assert role["rules"][1]["resourceNames"] == [SERVICE]
    role["metadata"]["namespace"] = ns
    rest.create(f"{RBAC}/namespaces/{ns}/roles", role)
    rest.create(
        f"{RBAC}/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "pgfh-adopter"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": role["metadata"]["name"],
            },
            "subjects": [
                {"kind": "User", "name": "reader", "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    )


def _reader(cp: ControlPlane, rest: KubeRest, ns: str) -> Path:
    """A user who may read the cluster and the Service, and patch nothing."""
    rest.create(
        f"{RBAC}/namespaces/{ns}/roles",
        {
            "metadata": {"name": "pgfh-reader"},
            "rules": [
                {"apiGroups": ["adg.io"], "resources": ["postgresqlclusters"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]},
            ],
        },
    )
    rest.create(
        f"{RBAC}/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "pgfh-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pgfh-reader",
            },
            "subjects": [
                {"kind": "User", "name": "reader", "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    )
    return cp.user_kubeconfig("reader")
