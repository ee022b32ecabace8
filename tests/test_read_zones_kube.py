"""Zone-aware reads on the real control plane, through the real kube-proxy, to real Patroni.

``spec.replicaService.trafficDistribution: PreferSameZone``, and everything real but the
kubelets: the pinned kube-apiserver (its default admission plugins, so ``PodTopologyLabels``
copies each Node's zone onto the Pods bound to it), the 3-member Patroni cluster on loopback
as Pods of two Nodes (``zone-a``, ``zone-b``; one kubelet stand-in each), the hook under
gunicorn and Metacontroller (the stand-in, or ``PGFH_METACONTROLLER_BINARY``), and kube-proxy
(:mod:`testbed.kubernetes.kube_proxy`) in a client network namespace as the zone-a Node's.

The Pods are created unscheduled and bound the way the scheduler binds them (the ``binding``
subresource); the test never sets a zone label itself: the API server does, and the hook
reads it from the Pods Metacontroller sends; Metacontroller runs as its own ServiceAccount
with the shipped rules (:func:`testbed.kubernetes.accounts.metacontroller_kubeconfig`), which grant
nothing on Nodes, and the hook has no Kubernetes credentials at all. Real Patroni members,
not fakes: the replica leaves the read-only endpoints for a reason only Patroni reports (its
WAL replay paused, the rule of ``GET /replica`` the hook follows), and the connections are
libpq's, answered by the member PostgreSQL that kube-proxy's rules chose
(``inet_server_addr()``).

Proven, after a control without the field (no zone, no hint: kube-proxy uses both replicas):
while the zone-a replica is listed, kube-proxy's rules for the read-only Service send
every new connection to it only (the zone-b replica is listed too, hinted for zone-b), and
12 of 12 connections land on it; once it is no longer listed, the zone-b replica is used (the
fallback to another zone), and when it is listed again, zone-a only again. Then Patroni's
own ``/readiness`` (the Pods' readiness probe): with the hook's own checks relaxed (paused
replicas included, 1 GiB of lag allowed), the zone-a replica's replay is paused behind more
than ``maximum_lag_on_failover`` of WAL, its kubelet turns the Pod not Ready from Patroni's
503, and the hook leaves it out (``Pod not ready``): zone-b again, then zone-a once it is
Ready. Run under
``flock /tmp/pgfh-heavy.lock``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hooks.children.read_members import NOT_READY
from hooks.domain.model import ZONE_LABEL
from testbed.kubernetes import ControlPlane
from testbed.kubernetes.accounts import metacontroller_kubeconfig
from testbed.kubernetes.kube_proxy import MODES, KubeProxy, running_kube_proxy
from testbed.kubernetes.kubelet import POD_IP_ANNOTATION, KubeletStandIn
from testbed.kubernetes.netns import ClientNetns, client_netns
from testbed.kubernetes.podnet import pod_ip
from testbed.kubernetes.pods import POD_NAME_LABEL, patroni_pod
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import PRIMARY_SELECTOR, rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig, kube_rig
from testbed.patroni import PatroniCluster

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.kube, pytest.mark.slow]

READ_ONLY = "pg-zoned-ro"
SLICE = f"{READ_ONLY}-ipv4"
PORT_NAME = "postgresql"
#: The two Nodes (one kubelet stand-in each) and their zones; kube-proxy plays ZONE_A's node.
NODES = {"pgfh-zone-a": "zone-a", "pgfh-zone-b": "zone-b"}
NODE_A, NODE_B = NODES
CONNECTIONS = 12
#: How long the zoned objects must stay unwritten (the rig's healthy resync is 1 s).
STEADY = 4.0
#: From a change in Patroni to kube-proxy's rules: the hook's resync (1 s healthy), the
#: apply, kube-proxy's sync; wide for a shared 2-core machine.
SETTLE = 60.0

T = TypeVar("T")


@pytest.fixture(scope="module")
def zone_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with rig_hook(tmp_path_factory.mktemp("hook"), source="worktree", env=HOOK_ENV) as running:
        yield running


def wait_for(what: str, read: Callable[[], T], ok: Callable[[T], bool], timeout: float) -> T:
    """Poll ``read`` every 0.2 s until ``ok``; a bounded loop that names the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s; last: {value!r}")
        time.sleep(0.2)


@contextlib.contextmanager
def zoned_nodes(rest: KubeRest) -> Iterator[dict[str, KubeletStandIn]]:
    """The two Nodes, labelled with their zones, each with its kubelet stand-in; the Nodes
    are deleted again on the way out (they are cluster-scoped, the namespace is not)."""
    kubelets: dict[str, KubeletStandIn] = {}
    try:
        for node, zone in NODES.items():
            kubelets[node] = KubeletStandIn(rest, node).start()
            rest.strategic_patch(
                f"/api/v1/nodes/{node}", {"metadata": {"labels": {ZONE_LABEL: zone}}}
            )
        yield kubelets
    finally:
        for kubelet in kubelets.values():
            kubelet.stop()
        for node in kubelets:
            with contextlib.suppress(KubeApiError):
                rest.delete(f"/api/v1/nodes/{node}")


def create_and_bind(rest: KubeRest, namespace: str, name: str, loopback: str, node: str) -> None:
    """An unscheduled member Pod, then bound to ``node`` through ``pods/binding``, as the
    scheduler binds (the path ``PodTopologyLabels`` copies the Node's zone on)."""
    pod = patroni_pod(
        name,
        namespace,
        {**PRIMARY_SELECTOR, POD_NAME_LABEL: name},
        annotations={POD_IP_ANNOTATION: pod_ip(loopback)},
        node=None,
    )
    pods = resource_path("v1", "pods", namespace)
    deadline = time.monotonic() + 30
    while True:  # the namespace's default ServiceAccount may not exist yet
        try:
            rest.create(pods, pod)
            break
        except KubeApiError as error:
            if error.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    rest.create(
        f"{pods}/{name}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )


def server_addresses(netns: ClientNetns, cluster_ip: str, password: str) -> list[str]:
    """``inet_server_addr()`` of :data:`CONNECTIONS` new libpq connections from the client
    namespace to the read-only ClusterIP: which member's PostgreSQL answered each."""
    script = (
        "import json, psycopg2\n"
        "found = []\n"
        f"for _ in range({CONNECTIONS}):\n"
        f"    conn = psycopg2.connect(host={cluster_ip!r}, port=5432, dbname='postgres', "
        f"user='postgres', password={password!r}, connect_timeout=5)\n"
        "    with conn.cursor() as cur:\n"
        "        cur.execute('SELECT host(inet_server_addr())')\n"
        "        found.append(cur.fetchone()[0])\n"
        "    conn.close()\n"
        "print(json.dumps(found))\n"
    )
    done = netns.run(sys.executable, "-c", script, timeout=60)
    assert done.returncode == 0, done.stderr
    addresses: list[str] = json.loads(done.stdout)
    return addresses


def versions(rest: KubeRest, namespace: str) -> tuple[str, str]:
    """The resourceVersions of the read-only Service and its slice."""
    service = rest.get(resource_path("v1", "services", namespace, READ_ONLY))
    slice_ = rest.get(resource_path("discovery.k8s.io/v1", "endpointslices", namespace, SLICE))
    return service["metadata"]["resourceVersion"], slice_["metadata"]["resourceVersion"]


def pod_ready(rest: KubeRest, namespace: str, name: str) -> bool | None:
    """The Pod's ``Ready`` condition as its kubelet last wrote it (``None``: not yet)."""
    pod = rest.get(resource_path("v1", "pods", namespace, name))
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return None


def slice_endpoints(rest: KubeRest, namespace: str) -> dict[str, dict[str, Any]]:
    """Pod name → endpoint of the read-only Service's IPv4 slice, as the API server stores it."""
    try:
        found = rest.get(resource_path("discovery.k8s.io/v1", "endpointslices", namespace, SLICE))
    except KubeApiError as error:
        if error.status == 404:
            return {}
        raise
    return {e["targetRef"]["name"]: e for e in found.get("endpoints") or []}


@pytest.mark.parametrize("mode", MODES)
def test_a_zone_a_client_reaches_the_zone_a_replica_while_it_is_listed_else_zone_b(
    mode: str,
    control_plane: ControlPlane,
    pod_network: None,
    kube_namespace: str,
    healthy_patroni_cluster: PatroniCluster,
    zone_hook: GunicornHook,
    tmp_path: Path,
) -> None:
    cluster = healthy_patroni_cluster
    leader = cluster.leader()
    assert leader is not None
    replica_a, replica_b = sorted(n for n in cluster.names() if n != leader)
    node_of = {leader: NODE_B, replica_a: NODE_A, replica_b: NODE_B}
    ip_of = {n: cluster.member(n).ip for n in cluster.names()}
    rest = KubeRest.from_kubeconfig(control_plane.admin_kubeconfig)
    with contextlib.ExitStack() as stack:
        stack.callback(rest.close)
        stack.enter_context(zoned_nodes(rest))
        netns = stack.enter_context(client_netns())
        proxy: KubeProxy = stack.enter_context(
            running_kube_proxy(control_plane, netns, tmp_path, NODE_A, mode=mode)
        )
        assert proxy.mode == mode
        for name, node in node_of.items():
            create_and_bind(rest, kube_namespace, name, ip_of[name], node)
        # The API server put each Node's zone on its Pods; the test set none.
        for name, node in node_of.items():
            pod = rest.get(resource_path("v1", "pods", kube_namespace, name))
            assert pod["metadata"]["labels"].get(ZONE_LABEL) == NODES[node], pod["metadata"]
        kube: KubeRig = stack.enter_context(
            kube_rig(
                cluster,
                control_plane.admin_kubeconfig,
                kube_namespace,
                zone_hook.url,
                zone_hook.token,
                work_dir=tmp_path,
                create_pods=False,
                # Metacontroller with the shipped rules only: no read of Nodes anywhere.
                controller_kubeconfig=metacontroller_kubeconfig(control_plane),
            )
        )
        pods = {n: pod_ip(ip_of[n]) for n in cluster.names()}

        def rules() -> tuple[str, ...]:
            return proxy.endpoints(kube_namespace, READ_ONLY, PORT_NAME)

        def replica_service(**fields: str) -> float:
            patch = {"spec": {"replicaService": {"name": READ_ONLY, **fields}}}
            rest.merge_patch(kube.parent_path(), patch)
            return time.monotonic()

        # The control: without the field, no zone and no hint; kube-proxy uses both replicas.
        started = replica_service()
        both = tuple(sorted((pods[replica_a], pods[replica_b])))
        wait_for("rules to both replicas", rules, lambda r: r == both, SETTLE)
        figures = {"unzoned: rules to both replicas": time.monotonic() - started}
        plain = slice_endpoints(rest, kube_namespace)
        assert sorted(plain) == [replica_a, replica_b]
        assert all("hints" not in e and "zone" not in e for e in plain.values()), plain
        cluster_ip = rest.get(resource_path("v1", "services", kube_namespace, READ_ONLY))["spec"][
            "clusterIP"
        ]
        password = cluster.superuser_password
        assert set(server_addresses(netns, cluster_ip, password)) <= {
            ip_of[replica_a],
            ip_of[replica_b],
        }

        # PreferSameZone: each replica hinted for its own zone, as the hook wrote them.
        started = replica_service(trafficDistribution="PreferSameZone")
        listed = wait_for(
            "both replicas hinted in the read-only slice",
            lambda: slice_endpoints(rest, kube_namespace),
            lambda found: (
                sorted(found) == [replica_a, replica_b]
                and all("hints" in e for e in found.values())
            ),
            SETTLE,
        )
        for name, endpoint in listed.items():
            zone = NODES[node_of[name]]
            assert endpoint["zone"] == zone, endpoint
            assert endpoint["hints"] == {"forZones": [{"name": zone}]}, endpoint
        service = rest.get(resource_path("v1", "services", kube_namespace, READ_ONLY))
        assert service["spec"]["trafficDistribution"] == "PreferSameZone"

        # A zone-a client: only the zone-a replica, in the rules and on the wire.
        wait_for(
            "rules to the zone-a replica only", rules, lambda r: r == (pods[replica_a],), SETTLE
        )
        figures["PreferSameZone: rules to the zone-a replica only"] = time.monotonic() - started
        assert server_addresses(netns, cluster_ip, password) == [ip_of[replica_a]] * CONNECTIONS
        # Steady: the zones and hints survive the API server's round trip unchanged, so no sync
        # writes the slice or the Service again (the healthy resync is 1 s: several syncs).
        before = versions(rest, kube_namespace)
        time.sleep(STEADY)
        assert versions(rest, kube_namespace) == before

        # The zone-a replica stops qualifying (replay paused): zone-b's replica is used.
        with cluster.maintenance_mode():
            cluster.execute(replica_a, "SELECT pg_wal_replay_pause()")
            started = time.monotonic()
            try:
                wait_for(
                    "the paused zone-a replica out of the slice",
                    lambda: sorted(slice_endpoints(rest, kube_namespace)),
                    lambda names: names == [replica_b],
                    SETTLE,
                )
                wait_for("rules to zone-b", rules, lambda r: r == (pods[replica_b],), SETTLE)
                figures["zone-a replica paused: rules to the zone-b replica"] = (
                    time.monotonic() - started
                )
                assert server_addresses(netns, cluster_ip, password) == (
                    [ip_of[replica_b]] * CONNECTIONS
                )
                parent = kube.parent()
                assert parent is not None
                routed = next(
                    c for c in parent["status"]["conditions"] if c["type"] == "ReplicasRouted"
                )
                assert routed["message"].endswith(
                    f"; zone hints (PreferSameZone): {replica_b} zone-b"
                ), routed
            finally:
                cluster.execute(replica_a, "SELECT pg_wal_replay_resume()")
                started = time.monotonic()

        # Listed again: zone-a only again.
        wait_for(
            "the zone-a replica back in the rules, alone",
            rules,
            lambda r: r == (pods[replica_a],),
            SETTLE,
        )
        figures["replay resumed: rules to the zone-a replica only"] = time.monotonic() - started
        assert server_addresses(netns, cluster_ip, password) == [ip_of[replica_a]] * CONNECTIONS

        # Patroni's own /readiness says no: the hook's own checks pass (paused replicas
        # included, 1 GiB of lag allowed), but the zone-a replica's replay lags more than
        # Patroni's maximum_lag_on_failover (16 MiB here), so /readiness answers 503, the
        # zone-a kubelet turns its Pod not Ready, and the hook leaves it out.
        rest.merge_patch(
            kube.parent_path(),
            {"spec": {"replicaService": {"includePausedReplicas": True, "maxLagBytes": 1 << 30}}},
        )
        with cluster.maintenance_mode():
            cluster.execute(replica_a, "SELECT pg_wal_replay_pause()")
            try:
                cluster.execute(
                    leader,
                    "CREATE TABLE pgfh_readiness AS "
                    "SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 120000) g",
                )
                started = time.monotonic()
                wait_for(
                    "the zone-a Pod not Ready (Patroni's /readiness)",
                    lambda: pod_ready(rest, kube_namespace, replica_a),
                    lambda ready: ready is False,
                    SETTLE,
                )
                wait_for("rules to zone-b", rules, lambda r: r == (pods[replica_b],), SETTLE)
                figures["zone-a Pod not Ready (Patroni's /readiness): rules to zone-b"] = (
                    time.monotonic() - started
                )
                parent = kube.parent()
                assert parent is not None
                routed = next(
                    c for c in parent["status"]["conditions"] if c["type"] == "ReplicasRouted"
                )
                assert f"{replica_a} ({NOT_READY})" in routed["message"], routed
            finally:
                cluster.execute(replica_a, "SELECT pg_wal_replay_resume()")
                cluster.execute(leader, "DROP TABLE IF EXISTS pgfh_readiness")
                started = time.monotonic()
        wait_for(
            "the zone-a replica Ready and back in the rules, alone",
            rules,
            lambda r: r == (pods[replica_a],),
            SETTLE,
        )
        figures["zone-a Pod Ready again: rules to the zone-a replica only"] = (
            time.monotonic() - started
        )
        rest.merge_patch(
            kube.parent_path(),
            {"spec": {"replicaService": {"includePausedReplicas": None, "maxLagBytes": None}}},
        )

        # The field removed: Metacontroller's merge drops the zones, hints and the Service's
        # trafficDistribution, and kube-proxy uses both replicas again.
        rest.merge_patch(
            kube.parent_path(), {"spec": {"replicaService": {"trafficDistribution": None}}}
        )
        started = time.monotonic()
        wait_for("rules to both replicas again", rules, lambda r: r == both, SETTLE)
        figures["field removed: rules to both replicas"] = time.monotonic() - started
        plain = slice_endpoints(rest, kube_namespace)
        assert all("hints" not in e and "zone" not in e for e in plain.values()), plain
        service = rest.get(resource_path("v1", "services", kube_namespace, READ_ONLY))
        assert "trafficDistribution" not in service["spec"], service["spec"]
        flavour = f"binary {kube.binary.binary}" if kube.binary is not None else "stand-in"
    print(
        f"\nkube-proxy {proxy.mode} mode, Metacontroller {flavour}, "
        f"{CONNECTIONS} libpq connections per check"
    )
    for what, seconds in figures.items():
        print(f"  {what}: {seconds:.2f} s")
