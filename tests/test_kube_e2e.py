"""End to end on the real control plane: real Patroni (etcd DCS), the real hook under
gunicorn, the Metacontroller stand-in against the real API server (or a real Metacontroller,
``PGFH_METACONTROLLER_BINARY``), the kubelet stand-in and the real endpointslice controller.

What clients would get is the primary Service's EndpointSlice, so that is what is asserted,
from a watch over the whole test: exactly the leader's Pod IP ready, after a SIGKILL of the
leader and after a switchover only the new one, never two at once, and the Service never
deleted until the PostgreSQLCluster is; deleting it finalizes it and its children go.
Run under ``flock /tmp/pgfh-realcluster.lock`` (the real Patroni cluster is one per machine).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.rest import resource_path
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import SERVICE, rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig
from testbed.patroni import PatroniCluster
from tests.kube_faults import rig_on, wait_gone, wait_status

FIXTURES = Path(__file__).parent / "fixtures" / "metacontroller"
pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]


@pytest.fixture(scope="module", params=["worktree", "image"])
def pod_network_hook(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GunicornHook]:
    """The hook allowed to probe the test Pod network 198.18.0.0/24 (and nothing else): once
    from the work tree, once from the image as the Deployment runs it
    (testbed/metacontroller/image.py;
    ``PGFH_TEST_HOOK_FROM`` picks the source of every other rig)."""
    workdir = tmp_path_factory.mktemp(f"hook-{request.param}")
    with rig_hook(workdir, source=str(request.param), env=HOOK_ENV) as running:
        yield running


@pytest.fixture
def rig(
    control_plane: ControlPlane,
    pod_network: None,
    kube_namespace: str,
    healthy_patroni_cluster: PatroniCluster,
    pod_network_hook: GunicornHook,
    tmp_path: Path,
) -> Iterator[KubeRig]:
    # Metacontroller as itself: the ServiceAccount bound to the values' clusterRole.rules.
    with rig_on(
        control_plane,
        healthy_patroni_cluster,
        kube_namespace,
        pod_network_hook.url,
        pod_network_hook.token,
        tmp_path,
    ) as running:
        yield running


def test_the_primary_slice_follows_the_leader_through_a_kill_and_a_switchover(
    rig: KubeRig,
) -> None:
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    rig.slices.wait_ready((rig.leader_ip(leader),), 30, f"the leader {leader}")
    # Metacontroller writes the children first and the status after them: wait for it.
    parent = wait_status(rig, lambda status: status.get("primary") == leader, 30)
    assert (
        "metacontroller.io/compositecontroller-pg-failover-hook" in parent["metadata"]["finalizers"]
    )
    assert parent["status"]["primary"] == leader
    assert parent["status"]["observedGeneration"] == parent["metadata"]["generation"]
    service = rig.rest.get(resource_path("v1", "services", rig.namespace, SERVICE))
    (owner,) = service["metadata"]["ownerReferences"]
    assert owner["uid"] == parent["metadata"]["uid"]
    assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
    assert service["metadata"]["labels"]["controller-uid"] == parent["metadata"]["uid"]
    assert "metacontroller.k8s.io/last-applied-configuration" in service["metadata"]["annotations"]
    if rig.controller is not None:  # the request in the recorded fixtures' shape
        fixture = json.loads((FIXTURES / "sync-service-selects-old-leader.json").read_text())
        request = rig.controller.last_requests[f"{rig.namespace}/pg-orders"]
        assert list(request) == list(fixture)
        assert sorted(request["children"]) == sorted(fixture["children"])
        # The recording predates the rule relating the Service spec.serviceRef names.
        assert sorted(request["related"]) == sorted([*fixture["related"], "Service.v1"])
        assert sorted(request["related"]["Pod.v1"]) == sorted(cluster.names())
        assert list(request["related"]["Service.v1"]) == [SERVICE]
        assert list(request["children"]["Service.v1"]) == [SERVICE]
        assert request["parent"]["metadata"]["managedFields"]
        assert request["controller"]["metadata"]["managedFields"]
        assert request["controller"]["status"] == {}
        assert request["finalizing"] is False

    # SIGKILL of the leader: Patroni promotes another once the lock expires.
    with cluster.watch_leader(exclude={leader}) as watch:
        cluster.kill_member(leader)
        election = watch.result(timeout=90)
    moved = rig.slices.wait_ready((rig.leader_ip(election.name),), 30, f"the new {election.name}")
    assert moved - election.first_primary < 10
    cluster.start_member(leader)
    cluster.wait_for_replicas(timeout=90)

    # A planned switchover: no Pod changes for an etcd DCS, only the hook's resync.
    result = cluster.switchover()
    moved = rig.slices.wait_ready(
        (rig.leader_ip(result.new_leader),), 30, f"the switched-to {result.new_leader}"
    )
    assert moved - result.election.first_primary < 10

    assert rig.slices.most_ready_at_once() == 1, rig.slices.history
    assert rig.slices.service_deleted == []
    errors = [r for r in rig.records if r.error]
    assert errors == [], errors[:3]

    # Deleting the PostgreSQLCluster: the finalize hook's reply deletes the Service (UID
    # precondition), then finalized: true removes the finalizer; the garbage collector
    # deletes the Service's EndpointSlices (owned by the Service).
    rig.rest.delete(rig.parent_path())
    deadline = time.monotonic() + 30
    while rig.parent() is not None:
        assert time.monotonic() < deadline, "the PostgreSQLCluster was never finalized"
        time.sleep(0.2)
    wait_gone(rig.rest, resource_path("v1", "services", rig.namespace), 30, "Services")
    wait_gone(
        rig.rest,
        resource_path("discovery.k8s.io/v1", "endpointslices", rig.namespace),
        30,
        "EndpointSlices",
    )
    finalizes = [r for r in rig.records if r.hook == "finalize"]
    if rig.controller is not None:
        assert any(r.finalized for r in finalizes), finalizes
        assert any(f"Service/{SERVICE}" in r.deleted for r in finalizes), finalizes
