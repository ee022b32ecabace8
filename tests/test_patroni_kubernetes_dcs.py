"""Patroni 4.1 on its Kubernetes DCS against the real API server (``testbed.patroni`` with
``kubernetes=``), with the leader lock in Endpoints and in ConfigMaps: the election, what
Patroni writes on its members' Pods (what the hook's switchover detection reads), the objects
it creates (what the primary Service must not be named like), and a planned switchover.

Members on 127.0.0.12-14 (Pod IPs 198.18.0.12-14): not the etcd cluster's block, so a session
that also runs the shared etcd cluster (127.0.0.2-4) never has its members killed as leftovers.
Run under ``flock /tmp/pgfh-realcluster.lock`` like every real-cluster test.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from hooks.core.routing import choose_leader
from hooks.core.switchover import Detection, DetectionReason, detect
from hooks.domain.members import MemberStatus
from hooks.loaders.schemas import load_spec
from testbed.kubernetes import ControlPlane
from testbed.kubernetes.kubelet import KubeletStandIn
from testbed.kubernetes.podnet import pod_ip
from testbed.kubernetes.rest import KubeApiError, KubeRest
from testbed.metacontroller.harness import PRIMARY_SELECTOR
from testbed.metacontroller.kube_setup import OUR_CRD, apply_crds
from testbed.patroni import PatroniCluster
from testbed.patroni.kubernetes_dcs import (
    KubernetesDCS,
    create_member_pods,
    grant_patroni_rights,
)
from testbed.patroni.layout import ETCD_CLIENT_PORT
from tests.helpers import loaded_pods

SCOPE = "pg-orders"
FIRST_IP = 12
ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

pytestmark = [pytest.mark.patroni, pytest.mark.slow]


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``check`` every 0.2 s until it returns something truthy, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


class K8sCluster:
    """The running cluster and what the test reads of it from the API server."""

    def __init__(self, cluster: PatroniCluster, dcs: KubernetesDCS, admin: KubeRest) -> None:
        self.cluster, self.dcs, self.admin = cluster, dcs, admin

    @property
    def ns(self) -> str:
        return self.dcs.namespace

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return self.admin.get(f"/api/v1/namespaces/{self.ns}/{plural}/{name}")

    def items(self, plural: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.admin.get(f"/api/v1/namespaces/{self.ns}/{plural}")[
            "items"
        ]
        return items

    def pods(self) -> dict[str, dict[str, Any]]:
        return {name: self.get("pods", name) for name in self.cluster.names()}

    def role_labels(self) -> dict[str, str | None]:
        return {n: p["metadata"]["labels"].get("role") for n, p in self.pods().items()}

    def members(self) -> list[MemberStatus]:
        """Each member's ``GET /primary`` as the hook reads it."""
        out = []
        for m in self.cluster.members:
            resp = m.api_get("/primary", timeout=2)
            out.append(MemberStatus.from_api_response(m.name, resp.status, resp.json()))
        return out


@pytest.fixture(scope="module", params=[True, False], ids=["endpoints", "configmaps"])
def k8s_cluster(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    kube_rest: KubeRest,
    pod_network: None,
) -> Iterator[K8sCluster]:
    use_endpoints: bool = request.param
    ns = f"t-patroni-{'ep' if use_endpoints else 'cm'}-{int(time.time()) % 100000}"
    kube_rest.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    kubelet_api = KubeRest.from_kubeconfig(control_plane.admin_kubeconfig)
    kubelet = KubeletStandIn(kubelet_api).start()
    try:
        token = grant_patroni_rights(kube_rest, ns)
        dcs = KubernetesDCS(
            server=control_plane.server_url,
            ca_file=control_plane.ca_file,
            token=token,
            namespace=ns,
            use_endpoints=use_endpoints,
        )
        members = {f"{SCOPE}-{i}": f"127.0.0.{FIRST_IP + i}" for i in range(3)}
        create_member_pods(kube_rest, dcs, SCOPE, members)
        with PatroniCluster(first_ip=FIRST_IP, kubernetes=dcs) as cluster:
            yield K8sCluster(cluster, dcs, kube_rest)
    finally:
        kubelet.stop()
        kubelet_api.close()
        with contextlib.suppress(KubeApiError):
            kube_rest.delete(f"/api/v1/namespaces/{ns}")


def test_one_leader_elected_through_the_api_server(k8s_cluster: K8sCluster) -> None:
    cluster = k8s_cluster.cluster
    leader = cluster.wait_healthy(timeout=30)
    assert cluster.primaries() == [leader]
    # The lock lives in the API server, and the member that answers 200 holds it.
    assert cluster.dcs_leader() == leader
    plural, name = k8s_cluster.dcs.leader_object(SCOPE)
    lock = k8s_cluster.get(plural, name)["metadata"]["annotations"]
    assert lock["leader"] == leader
    assert int(lock["ttl"]) == cluster.ttl
    assert ETCD_CLIENT_PORT not in {port for _, port in cluster.addresses}, "no etcd here"


def test_every_pod_runs_with_its_pod_ip(k8s_cluster: K8sCluster) -> None:
    for m in k8s_cluster.cluster.members:

        def running(name: str = m.name) -> dict[str, Any] | None:
            status = k8s_cluster.get("pods", name)["status"]
            return status if status.get("phase") == "Running" else None

        status = wait_for(running, 20, f"{m.name} Running")
        assert status["podIP"] == pod_ip(m.ip) == f"198.18.0.{m.ip.rsplit('.', 1)[1]}"


def test_patroni_writes_role_labels_and_status_annotations(k8s_cluster: K8sCluster) -> None:
    """The shapes the hook's switchover detection parses, as Patroni 4.1.5 writes them."""
    cluster = k8s_cluster.cluster
    leader = cluster.wait_healthy(timeout=30)
    want = {n: ("primary" if n == leader else "replica") for n in cluster.names()}
    labels = wait_for(
        lambda: (lbl := k8s_cluster.role_labels()) == want and lbl,
        15,
        f"role labels {want}",
    )
    assert labels == want
    for name, pod in k8s_cluster.pods().items():
        status = json.loads(pod["metadata"]["annotations"]["status"])
        assert status["state"] == "running", status
        assert status["role"] == want[name], status
        assert status["api_url"] == f"http://{cluster.member(name).ip}:8008/patroni"
        assert status["conn_url"].startswith(f"postgres://{cluster.member(name).ip}:5432/")
    # The hook, given these very Pods and the members' REST answers, goes event-driven.
    spec, problems = load_spec(
        {"primarySelector": dict(PRIMARY_SELECTOR), "serviceRef": {"name": "pg-orders-primary"}}
    )
    assert spec is not None, problems
    verdict = detect(loaded_pods(k8s_cluster.pods()), k8s_cluster.members(), leader, spec)
    assert verdict.detection is Detection.ROLE_LABEL, verdict.message
    assert verdict.reason is DetectionReason.ROLE_LABELS_AGREE


def _patroni_objects(k8s: K8sCluster) -> dict[str, set[str]]:
    """Every Endpoints, ConfigMap and Service in the namespace, by kind."""
    found: dict[str, set[str]] = {}
    for plural in ("endpoints", "configmaps", "services"):
        names = {o["metadata"]["name"] for o in k8s.items(plural)}
        found[plural] = names - {"kube-root-ca.crt"}  # the root-CA publisher's, if it runs
    return found


def _expected_objects(use_endpoints: bool, after_switchover: bool) -> dict[str, set[str]]:
    """What Patroni 4.1.5 created here: no ``<scope>-sync`` (written only with
    ``synchronous_mode``, off here), ``<scope>-failover`` from the first switchover on."""
    keys = {f"{SCOPE}-config"} | ({f"{SCOPE}-failover"} if after_switchover else set())
    if use_endpoints:
        return {"endpoints": keys | {SCOPE}, "configmaps": set(), "services": {f"{SCOPE}-config"}}
    return {"endpoints": set(), "configmaps": keys | {f"{SCOPE}-leader"}, "services": set()}


def _wait_objects(
    k8s: K8sCluster, expected: dict[str, set[str]], timeout: float
) -> dict[str, set[str]]:
    seen: list[dict[str, set[str]]] = []

    def matches() -> bool:
        seen.append(_patroni_objects(k8s))
        return seen[-1] == expected

    try:
        wait_for(matches, timeout, "Patroni's objects")
    except AssertionError:
        raise AssertionError(f"Patroni's objects: {seen[-1]}, expected {expected}") from None
    return seen[-1]


def test_the_objects_patroni_creates(k8s_cluster: K8sCluster) -> None:
    k8s_cluster.cluster.wait_healthy(timeout=30)
    expected = _expected_objects(k8s_cluster.dcs.use_endpoints, after_switchover=False)
    found = _wait_objects(k8s_cluster, expected, 15)
    selector = k8s_cluster.dcs.selector(SCOPE)
    for plural, names in found.items():
        for name in names:
            meta = k8s_cluster.get(plural, name)["metadata"]
            assert meta["labels"] == selector, (plural, name)
            assert not meta.get("ownerReferences"), (plural, name)


def test_the_hook_refuses_every_name_patroni_uses(k8s_cluster: K8sCluster) -> None:
    """Whatever Patroni really created, of any kind, is no primary or read-only Service name."""
    names = set().union(*_patroni_objects(k8s_cluster).values())
    # Patroni's names for the other mode, a switchover and synchronous_mode too.
    names |= {SCOPE, f"{SCOPE}-leader", f"{SCOPE}-failover", f"{SCOPE}-sync"}
    for name in sorted(names):
        spec, problems = load_spec(
            {"primarySelector": dict(PRIMARY_SELECTOR), "serviceRef": {"name": name}}
        )
        assert spec is None and any(p.field.endswith("serviceRef") for p in problems), name
        spec, problems = load_spec(
            {
                "primarySelector": dict(PRIMARY_SELECTOR),
                "serviceRef": {"name": "pg-orders-primary"},
                "replicaService": {"name": name},
            }
        )
        assert spec is None and any(p.field.endswith("replicaService") for p in problems), name


def test_the_api_server_refuses_a_cluster_named_like_patronis_objects(
    k8s_cluster: K8sCluster,
) -> None:
    """The CRD's rule, on the real API server, against the names Patroni really created in
    this namespace (and its other names): a PostgreSQLCluster whose primary or read-only
    Service would take one is refused with 422, before any hook sees it; one that does not
    is admitted. The rule keys on ``primarySelector['cluster-name']``, Patroni's default
    ``scope_label``, whose value is the scope Patroni names its objects after."""
    apply_crds(k8s_cluster.admin, OUR_CRD)
    created = set().union(*_patroni_objects(k8s_cluster).values())
    assert created, "Patroni created nothing to collide with"
    names = created | {SCOPE, f"{SCOPE}-leader", f"{SCOPE}-failover", f"{SCOPE}-sync"}
    path = f"/apis/adg.io/v1alpha1/namespaces/{k8s_cluster.ns}/postgresqlclusters"

    def attempt(name: str, field: str, service: str, replica: str | None = None) -> int:
        spec: dict[str, Any] = {
            "primarySelector": dict(PRIMARY_SELECTOR),
            "serviceRef": {"name": service},
        }
        if replica is not None:
            spec["replicaService"] = {"name": replica}
        body = {
            "apiVersion": "adg.io/v1alpha1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": name},
            "spec": spec,
        }
        try:
            k8s_cluster.admin.create(path, body)
        except KubeApiError as error:
            assert field in error.message, (name, error.message)
            return error.status
        k8s_cluster.admin.delete(f"{path}/{name}")
        return 201

    for index, taken in enumerate(sorted(names)):
        assert attempt(f"clash-{index}", "serviceRef", taken) == 422, taken
        assert attempt(f"clash-r{index}", "replicaService", "pg-orders-primary", taken) == 422
    assert attempt("no-clash", "", "pg-orders-primary", "pg-orders-replicas") == 201
    # Nothing of Patroni's was touched by the refused objects.
    assert set().union(*_patroni_objects(k8s_cluster).values()) == created


def test_a_parent_selector_would_adopt_patronis_config_service(k8s_cluster: K8sCluster) -> None:
    """Patroni's ``<scope>-config`` Service carries the member labels and no owner, so a
    CompositeController selecting children by the parent's labels would adopt (and then
    delete) it: ours generates its selector."""
    if not k8s_cluster.dcs.use_endpoints:
        assert f"{SCOPE}-config" not in _patroni_objects(k8s_cluster)["services"]
        return
    service = k8s_cluster.get("services", f"{SCOPE}-config")
    labels = service["metadata"]["labels"]
    assert PRIMARY_SELECTOR.items() <= labels.items()
    assert not service["metadata"].get("ownerReferences")
    assert service["spec"]["clusterIP"] == "None" and not service["spec"].get("selector")
    controller = yaml.safe_load((ROOT / "metacontroller/compositecontroller.yaml").read_text())
    assert controller["spec"]["generateSelector"] is True


def _leader_endpoint_ips(k8s: K8sCluster) -> list[tuple[str, str | None]]:
    subsets = k8s.get("endpoints", SCOPE).get("subsets") or []
    return [
        (a["ip"], (a.get("targetRef") or {}).get("name"))
        for s in subsets
        for a in s.get("addresses") or []
    ]


def test_the_leader_endpoints_list_the_pod_ip(k8s_cluster: K8sCluster) -> None:
    cluster = k8s_cluster.cluster
    if not k8s_cluster.dcs.use_endpoints:
        # With ConfigMaps Patroni writes no address anywhere: nothing lists the Pod IP.
        cluster.wait_healthy(timeout=30)
        assert k8s_cluster.items("endpoints") == []
        lock = k8s_cluster.get("configmaps", f"{SCOPE}-leader")
        assert pod_ip(cluster.member(cluster.leader() or "").ip) not in json.dumps(lock)
        return
    leader = cluster.wait_healthy(timeout=30)
    want = [(pod_ip(cluster.member(leader).ip), leader)]
    assert wait_for(lambda: _leader_endpoint_ips(k8s_cluster) == want, 15, f"endpoints {want}")
    ports = k8s_cluster.get("endpoints", SCOPE)["subsets"][0]["ports"]
    assert ports == [{"name": "postgresql", "port": 5432, "protocol": "TCP"}]


def test_a_planned_switchover_moves_the_labels(k8s_cluster: K8sCluster) -> None:
    cluster = k8s_cluster.cluster
    old = cluster.wait_healthy(timeout=30)
    result = cluster.switchover(timeout=60)
    new = result.new_leader
    want = {n: ("primary" if n == new else "replica") for n in cluster.names()}
    wait_for(lambda: k8s_cluster.role_labels() == want, 20, f"role labels {want}")
    moved_after = time.monotonic() - result.requested_at
    assert k8s_cluster.role_labels()[old] == "replica"
    assert cluster.dcs_leader() == new
    print(f"\nswitchover {old} -> {new}: labels moved {moved_after:.1f} s after the request")
    expected = _expected_objects(k8s_cluster.dcs.use_endpoints, after_switchover=True)
    _wait_objects(k8s_cluster, expected, 10)
    if k8s_cluster.dcs.use_endpoints:
        want_ip = [(pod_ip(cluster.member(new).ip), new)]
        assert wait_for(
            lambda: _leader_endpoint_ips(k8s_cluster) == want_ip, 15, f"endpoints {want_ip}"
        )
    spec, _ = load_spec(
        {"primarySelector": dict(PRIMARY_SELECTOR), "serviceRef": {"name": "pg-orders-primary"}}
    )
    assert spec is not None
    cluster.wait_healthy(timeout=60)
    verdict = wait_for(
        lambda: (
            (
                v := detect(loaded_pods(k8s_cluster.pods()), k8s_cluster.members(), new, spec)
            ).event_driven
            and v
        ),
        20,
        "the hook's detection to agree again after the switchover",
    )
    assert verdict.reason is DetectionReason.ROLE_LABELS_AGREE


#: Seconds the API server (the DCS here) answers nothing: more than twice the TTL (20 s).
FAILSAFE_OUTAGE = 45.0


def test_failsafe_keeps_the_leader_routed_while_the_api_server_is_down(
    k8s_cluster: K8sCluster, control_plane: ControlPlane
) -> None:
    """Issue 32: Patroni's ``failsafe_mode`` on its Kubernetes DCS, the DCS (kube-apiserver)
    SIGSTOPped for ``FAILSAFE_OUTAGE`` s. Every 0.5 s the members' real answers go through
    the hook's routing decision with the member Pods as read before the outage. Whatever
    Patroni does, the decision follows its answers (routed exactly while the leader answers
    200 as a running primary) and never routes anywhere else (the Service cannot flap); the
    timeline of Patroni's answers and the leader's log are printed (the measurement)."""
    cluster = k8s_cluster.cluster
    leader = cluster.wait_healthy(timeout=60)
    spec, problems = load_spec(
        {"primarySelector": k8s_cluster.dcs.selector(SCOPE), "serviceRef": {"name": "pg-w"}}
    )
    assert spec is not None, problems
    pods = loaded_pods(k8s_cluster.pods())
    server = control_plane.apiserver
    log = cluster.member(leader).patroni_log
    log_from = log.stat().st_size
    samples: list[tuple[float, int | None, str | None, str | None, bool, str, str | None]] = []
    whys: set[str] = set()
    with cluster.failsafe_mode():
        timer = threading.Timer(FAILSAFE_OUTAGE + 30, server.resume)
        timer.daemon = True
        started = time.monotonic()
        server.pause()
        timer.start()
        try:
            while time.monotonic() - started < FAILSAFE_OUTAGE:
                members = k8s_cluster.members()
                route = choose_leader(pods, members, spec)
                (answer,) = [m for m in members if m.name == leader]
                if answer.failsafe_active and not route.routed:
                    _, mark, rest = route.why.partition("; Patroni failsafe")
                    whys.add(mark + rest)  # "" if the status would not say it
                samples.append(
                    (
                        round(time.monotonic() - started, 1),
                        answer.http_status,
                        answer.role,
                        answer.state,
                        answer.failsafe_active,
                        route.decision.value,
                        route.leader,
                    )
                )
                time.sleep(0.5)
        finally:
            timer.cancel()
            server.resume()
        wait_for(lambda: control_plane_ready(k8s_cluster), 60, "the API server back")
    with log.open(encoding="utf-8", errors="replace") as handle:
        handle.seek(log_from)
        lines = [ln.rstrip() for ln in handle if "no action" not in ln][:60]
    timeline = [row for i, row in enumerate(samples) if i == 0 or row[1:] != samples[i - 1][1:]]
    print(
        f"\nfailsafe (Kubernetes DCS): API server paused {FAILSAFE_OUTAGE:.0f} s, "
        f"{len(samples)} samples; (s, leader's HTTP, role, state, failsafe, decision, routed "
        "to) at each change:\n  "
        + "\n  ".join(map(str, timeline))
        + f"\n{leader}'s Patroni log meanwhile:\n  "
        + "\n  ".join(lines)
    )
    assert any(row[4] for row in samples), "Patroni never reported failsafe_mode_is_active"
    # Measured with Patroni 4.1.5: the failsafe leader answers 503 once its cached leader
    # object is older than the TTL; the status then says that failsafe keeps it primary.
    assert whys <= {
        f"; Patroni failsafe mode is active and {leader} runs as primary (the DCS is unreachable)"
    }, whys
    for at, status, role, state, _, decision, routed in samples:
        if status == 200 and role == "primary" and state == "running":
            assert (decision, routed) == ("LeaderFound", leader), at
        else:
            assert routed is None, at  # never routed elsewhere: the Service stays put


def control_plane_ready(k8s: K8sCluster) -> bool:
    try:
        k8s.admin.get("/readyz")
    except (KubeApiError, OSError):
        return False
    return True
