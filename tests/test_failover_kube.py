"""``testbed.bench.failover_kube`` in its quick mode, on the real control plane: the invariants of
the
primary Service and its EndpointSlice through a SIGKILL, a graceful stop and a switchover
(etcd DCS), and through a planned switchover on Patroni's own Kubernetes DCS, where the hook
must follow the Pod change Patroni writes rather than wait for its 30 s healthy resync.

Figures are printed (``-s`` shows them), not asserted; what is asserted is what the benchmark
exists to prove: never two Pods ready in the primary slice, the Service never deleted and
its selector never empty, no hook call failed, every hop in causal order, and the bounds that
are the subject (the slice on the new leader within the resync settings plus a generous
margin). Every time is read from a watch on the API server or from Patroni, and the hook's
calls are counted from its own ``/metrics``, so the same tests run on the Metacontroller
stand-in and on a real binary (``PGFH_METACONTROLLER_BINARY``). Run under
``flock /tmp/pgfh-realcluster.lock`` (real Patroni).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hooks.domain.model import DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS
from hooks.shell.config import HookSettings
from testbed.bench.failover_kube import (
    KUBERNETES_FIRST_IP,
    Bench,
    benchmark_rig,
    run_on,
    settle,
    status_of,
)
from testbed.bench.failover_kube_figures import KubeFailover, RunResult, report
from testbed.bench.failover_patroni import KINDS
from testbed.kubernetes import ControlPlane
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import rig_hook
from testbed.metacontroller.kube_rig import HOOK_ENV
from testbed.patroni import PatroniCluster
from tests.test_patroni_kubernetes_dcs import FIRST_IP as KUBERNETES_DCS_BLOCK

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]
TIMING = HookSettings().resync
#: Added to every bound: a busy 2-core machine, a probe round's deadline, the watch hops.
MARGIN = HookSettings().probe_deadline + 5.0


@pytest.fixture(scope="module")
def kube_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    """The hook allowed to probe the test Pod network (and nothing else)."""
    with rig_hook(tmp_path_factory.mktemp("hook"), env=HOOK_ENV) as running:
        yield running


@pytest.fixture
def etcd_rig(
    control_plane: ControlPlane,
    pod_network: None,
    healthy_patroni_cluster: PatroniCluster,
    kube_hook: GunicornHook,
    tmp_path: Path,
) -> Iterator[Bench]:
    """The session's etcd-DCS cluster as Pods of the real API server, with the whole rig."""
    with benchmark_rig(
        control_plane, "etcd", kube_hook, tmp_path, etcd_cluster=healthy_patroni_cluster
    ) as running:
        yield running


#: How much earlier one watch may deliver an event than another delivers its cause: the
#: Service and its EndpointSlices come on two watch connections, and nothing orders their
#: arrival here (a slice written 10 ms after the Service was seen 1 ms before it, in CI).
WATCH_SKEW = 0.05


def _causal(failover: KubeFailover) -> None:
    """Each hop after the one it depends on. The promotion is seen by a 10 ms poll and the
    hook probes on its own, so the Service write may precede the poll's sighting by one
    interval; the slice's watch event may precede the Service's by :data:`WATCH_SKEW`."""
    assert failover.trigger < failover.promotion, failover
    assert failover.service > failover.promotion - 0.05, failover
    assert failover.service <= failover.slice + WATCH_SKEW, failover


def _invariants(result: RunResult) -> None:
    print("\n" + "\n".join(report([result])))
    inv = result.invariants
    assert inv.broken == [], inv.broken
    assert inv.most_ready_at_once == 1
    assert inv.hook_errors == 0
    assert inv.syncs > 0  # the hook's own count: it answered the calls that moved the slice
    assert inv.selector_changes >= len(result.failovers) + 1  # the first, then one a failover


def test_the_slice_follows_a_kill_a_graceful_stop_and_a_switchover(etcd_rig: Bench) -> None:
    result = run_on(etcd_rig, "etcd", len(KINDS), KINDS)
    _invariants(result)
    assert [f.kind for f in result.failovers] == list(KINDS)
    for failover in result.failovers:
        _causal(failover)
        assert failover.detection == "Polled"  # an etcd DCS: no role labels on the Pods
        # No Pod changes at a switchover here: only the healthy resync (phase-spread, up to
        # 1.5 periods) brings the sync; after a kill or a stop the degraded resync polls.
        bound = 1.5 * TIMING.healthy + TIMING.degraded + MARGIN
        assert failover.slice - failover.promotion < bound, failover
    assert result.writes["on_non_leader"] == 0


@pytest.mark.parametrize("dcs", ["endpoints", "configmaps"])
def test_a_switchover_on_the_kubernetes_dcs_is_followed_through_the_pod_change(
    dcs: str,
    control_plane: ControlPlane,
    pod_network: None,
    kube_hook: GunicornHook,
    tmp_path: Path,
) -> None:
    """Patroni's own labels and annotation put the hook in event-driven mode (a 30 s healthy
    resync); the switchover's Pod change brings the sync that moves the slice, well before the
    timer. A switchover whose window happens to hold the scheduled resync proves nothing
    either way, so up to three are tried until one does not (each has a chance of about
    the window over 30 s)."""
    # Not the block of tests/test_patroni_kubernetes_dcs.py, which may run beside this module.
    assert KUBERNETES_FIRST_IP != KUBERNETES_DCS_BLOCK
    with benchmark_rig(control_plane, dcs, kube_hook, tmp_path) as bench:
        for _ in range(3):
            result = run_on(bench, dcs, 1, ["switchover"], writes=False)
            _invariants(result)
            (failover,) = result.failovers
            _causal(failover)
            assert failover.detection == "RoleLabel", failover
            assert failover.resync_period == DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS, failover
            assert failover.resync_due is not None and failover.resync_due > failover.trigger
            if failover.resync_due > failover.slice:
                break
        else:
            pytest.fail("three switchovers in a row each held the scheduled resync")
        assert failover.slice - failover.trigger < DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS / 2, failover
        # Back at rest, the condition says why: Patroni's own labels and annotation agree.
        settle(bench.rig, "RoleLabel")
        conditions = status_of(bench.rig).get("conditions") or []
        (condition,) = [c for c in conditions if c["type"] == "SwitchoverDetection"]
        assert condition["status"] == "True", condition
        assert condition["reason"] == "RoleLabelsAgree", condition
