"""A shard install on the real control plane: it routes its own cluster and relates nothing
for another shard's.

Real Patroni (etcd DCS), the real hook under gunicorn, the Metacontroller stand-in against the
real API server as its least-privilege ServiceAccount (or a real Metacontroller v4.17.2,
``PGFH_METACONTROLLER_BINARY``), the shard's CompositeController selecting
``pg-failover-hook.adg.io/shard: "0"`` as ``deploy/sharding/`` renders it. Beside the shard's
own PostgreSQLCluster stands another shard's, over the same member Pods. Every member Pod's
annotation is then changed (what Patroni's Kubernetes DCS does every ``loop_wait``):

* the shard's cluster is routed to the leader (its sync saw the member Pods) and stays so;
* the other shard's cluster is never synced: no finalizer, no status, no Service;
* the hook answered the full rules (the shard's cluster, generation 1: at least once); a real
  Metacontroller walks the other cluster on each Pod event (``findRelatedParents``) and asks
  customize for it, and the hook answers it no rules (``other-shard``), so that walk costs a
  cache lookup. (The stand-in walks only parents it has synced, so it never asks.)

Run under ``flock /tmp/pgfh-realcluster.lock`` (the real Patroni cluster is one per machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.pods import POD_NAME_LABEL
from testbed.kubernetes.rest import KubeApiError, resource_path
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import CLUSTER, PRIMARY_SELECTOR, SERVICE, rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, PARENT_API, PARENTS
from testbed.metacontroller.metacontroller_binary import ENV_BINARY
from testbed.patroni import PatroniCluster
from tests.kube_faults import rig_on, wait_status

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

SHARD = "pg-failover-hook.adg.io/shard"
OTHER = "pg-elsewhere"


def customize_replies(hook: GunicornHook) -> dict[str, float]:
    """The hook's own count of customize replies, by ``rules``."""
    text = requests.get(f"{hook.url}/metrics", timeout=5).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("pgfh_customize_replies_total{"):
            rules = line.split('rules="', 1)[1].split('"', 1)[0]
            counts[rules] = counts.get(rules, 0.0) + float(line.split()[-1])
    return counts


def ready(status: Mapping[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []
    )


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with rig_hook(tmp_path_factory.mktemp("hook"), source="worktree", env=HOOK_ENV) as running:
        yield running


def test_a_shard_routes_its_cluster_and_relates_nothing_for_another_shards(
    control_plane: ControlPlane,
    pod_network: None,
    kube_namespace: str,
    healthy_patroni_cluster: PatroniCluster,
    hook: GunicornHook,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    cluster = healthy_patroni_cluster
    shard0 = {
        "parentResource": {
            "apiVersion": PARENT_API,
            "resource": PARENTS,
            "labelSelector": {"matchLabels": {SHARD: "0"}},
        }
    }
    before = customize_replies(hook)
    with rig_on(
        control_plane,
        cluster,
        ns,
        hook.url,
        hook.token,
        tmp_path,
        controller_spec=shard0,
        parent_labels={SHARD: "0"},
    ) as rig:
        rest = rig.rest
        other_path = resource_path(PARENT_API, PARENTS, ns, OTHER)
        rest.create(
            resource_path(PARENT_API, PARENTS, ns),
            {
                "apiVersion": PARENT_API,
                "kind": "PostgreSQLCluster",
                "metadata": {"name": OTHER, "labels": {SHARD: "1"}},
                "spec": {
                    "primarySelector": dict(PRIMARY_SELECTOR),
                    "serviceRef": {"name": f"{OTHER}-primary"},
                    "healthCheckPath": "/primary",
                },
            },
        )
        leader = cluster.leader()
        assert leader is not None
        rig.slices.wait_ready((rig.leader_ip(leader),), 60, f"the leader {leader}")
        wait_status(rig, ready, 30)
        # Patroni's Kubernetes DCS churn: every member Pod's annotation, a few rounds.
        for round_ in range(5):
            for name in cluster.names():
                rest.merge_patch(
                    resource_path("v1", "pods", ns, name),
                    {"metadata": {"annotations": {"status": f'{{"round": {round_}}}'}}},
                )
            time.sleep(0.5)
        time.sleep(3.0)
        parent = wait_status(rig, ready, 30)
        assert parent["metadata"]["name"] == CLUSTER
        service = rest.get(resource_path("v1", "services", ns, SERVICE))
        assert service["spec"]["selector"] == {**PRIMARY_SELECTOR, POD_NAME_LABEL: leader}
        other = rest.get(other_path)
        assert not other["metadata"].get("finalizers"), other["metadata"]
        assert not other.get("status"), other.get("status")
        with pytest.raises(KubeApiError) as missing:
            rest.get(resource_path("v1", "services", ns, f"{OTHER}-primary"))
        assert missing.value.status == 404
        grown = {k: v - before.get(k, 0.0) for k, v in customize_replies(hook).items()}
        # At least once, not exactly once: a sync and a related-object event can both miss
        # the cache for the same parent and generation and both call customize (Metacontroller's
        # getCustomizeHookResponse, customize/manager.go 190-229: look up, call, Set, with no
        # single flight; the stand-in's _rules likewise), which a loaded machine shows (3 in a
        # full `make test`, 1 alone).
        assert grown.get("all", 0.0) >= 1, grown
        if os.environ.get(ENV_BINARY):
            assert grown.get("other-shard", 0.0) >= 1, grown
        rest.delete(other_path)
