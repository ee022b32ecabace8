"""Clients through kube-proxy's ClusterIP on the real control plane, during a real switchover.

kube-proxy (the pinned build, nftables mode or iptables) runs in a network namespace of the
test's own and programs the primary Service's ClusterIP from the real EndpointSlice; two libpq
clients in that namespace write one row every 50 ms through it (:mod:`testbed.bench.client_rig`):
one
with a new connection per write, one with a kept connection and ``target_session_attrs=
read-write``. After Patroni's planned switchover (no Pod changes: only the hook's healthy
resync moves the Service), once kube-proxy's rules send to the new leader only, neither client
may have a write refused as read-only or a connection left on the demoted member, no write may
commit anywhere but on the new leader after its promotion, and both must write to the new
leader within a bound. Every time comes from a watch, Patroni or the clients, none from
Metacontroller's side, so it runs the same on a real Metacontroller
(``PGFH_METACONTROLLER_BINARY``). The long benchmark with kills, graceful stops and PgBouncer is
``testbed/bench/client_downtime.py``. Run under ``flock /tmp/pgfh-realcluster.lock``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.bench.client_rig import client_rig
from testbed.bench.downtime_figures import Timeline, client_figures
from testbed.bench.failover_kube_figures import first_selector
from testbed.kubernetes import ControlPlane
from testbed.kubernetes.kube_proxy import MODES
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV, kube_rig
from testbed.patroni import PatroniCluster

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]
CLIENTS = ("direct-new", "direct-kept-rw")
#: From the switchover request to each client's first write on the new leader: Patroni's
#: switchover (about 2.6 s here), the hook's 1 s healthy resync, the endpointslice controller
#: and kube-proxy, with a wide margin for a shared 2-core machine.
DOWNTIME_BOUND = 15.0


@pytest.fixture(scope="module")
def pod_network_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with rig_hook(tmp_path_factory.mktemp("hook"), source="worktree", env=HOOK_ENV) as running:
        yield running


def test_after_a_switchover_no_write_through_the_cluster_ip_reaches_the_demoted_member(
    control_plane: ControlPlane,
    pod_network: None,
    kube_namespace: str,
    healthy_patroni_cluster: PatroniCluster,
    pod_network_hook: GunicornHook,
    tmp_path: Path,
) -> None:
    cluster = healthy_patroni_cluster
    with kube_rig(
        cluster,
        control_plane.admin_kubeconfig,
        kube_namespace,
        pod_network_hook.url,
        pod_network_hook.token,
        work_dir=tmp_path,
    ) as kube:
        old = cluster.leader()
        assert old is not None
        kube.slices.wait_ready((kube.leader_ip(old),), 30, old)
        with client_rig(control_plane, kube, tmp_path, CLIENTS) as rig:
            assert rig.proxy.mode in MODES
            assert rig.rules() == (kube.leader_ip(old),)
            old_ip = cluster.member(old).ip
            assert rig.writers.wait_ok_on(old_ip, CLIENTS, time.monotonic(), 20), (
                rig.writers.records
            )

            result = cluster.switchover()
            new_ip = cluster.member(result.new_leader).ip
            pod_ip = kube.leader_ip(result.new_leader)
            slice_moved = kube.slices.wait_ready((pod_ip,), 30, result.new_leader)
            rules_moved = rig.wait_rules((pod_ip,), 30, since=result.requested_at)
            service_moved = first_selector(
                kube.slices.selectors, result.new_leader, result.requested_at
            )
            assert rig.writers.wait_ok_on(new_ip, CLIENTS, result.requested_at, DOWNTIME_BOUND)
            time.sleep(2.0)  # writes and samples after the move
            timeline = Timeline(
                "switchover",
                old_ip,
                new_ip,
                result.requested_at,
                result.election.first_primary,
                slice_moved,
                rules_moved,
                time.monotonic(),
                service_moved,
            )
            samples = rig.sampler.between(timeline.trigger, timeline.window_end)
            figures = [
                client_figures(timeline, n, rig.writers.snapshot(n), samples) for n in CLIENTS
            ]
            assert all(rig.writers.alive().values())
    # The hops in causal order, each seen by its own observer, so each with a 50 ms slack: the
    # slice's watch may lead the Service's (two watch connections), and kube-proxy's own watch
    # may deliver the slice (and its rules be read back) before the test's watch does: CI saw
    # the rules 7 ms ahead of the test's slice event.
    assert service_moved is not None, kube.slices.selectors
    assert timeline.promoted - 0.05 < service_moved <= slice_moved + 0.05, timeline
    assert slice_moved <= rules_moved + 0.05, timeline
    for figure in figures:
        assert figure.downtime is not None and figure.downtime < DOWNTIME_BOUND, figure
        assert figure.read_only_after_rules == 0, figure
        assert figure.on_old_after_rules == 0, figure
        assert figure.misplaced_commits == 0, figure
    assert kube.slices.most_ready_at_once() == 1, kube.slices.history
