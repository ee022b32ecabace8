"""The pure parts of the fleet on the real control plane (testbed/bench/fleet/kube_objects.py:
layouts, the switchover plan; kube_figures.py: lags, the work queue's figures; on_kube.py: the
arguments) and the fleet model's Metacontroller cost (testbed/bench/fleet/settings.py
``MetacontrollerCost``). Light: no control plane, no process; the harness itself runs by hand
(``python -m testbed.bench.fleet.on_kube``, docs/scale.md)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from testbed.bench.fleet import kube_figures, kube_objects, model, on_kube
from testbed.bench.fleet.kube_figures import (
    Lags,
    lag_summary,
    percentile,
    queue_line,
    recovery_summary,
    syncs_asked,
    workqueue_figures,
)
from testbed.bench.fleet.kube_objects import EVENTLESS, POD_EVENT, namespace_of, namespaces, plan
from testbed.bench.fleet.on_kube import parse_args
from testbed.bench.fleet.settings import (
    SHIPPED,
    Metacontroller,
    MetacontrollerCost,
    Mix,
    Policy,
    Row,
)

LATENCIES = [0.004, 0.005, 0.006, 0.008, 0.012]
CPU = 0.004


# ------------------------------------------------------------------ layouts


@pytest.mark.parametrize(
    ("layout", "expected"), [("one-namespace", 1), ("100-namespaces", 100), ("per-namespace", 250)]
)
def test_each_layout_spreads_the_clusters_over_its_namespaces(layout: str, expected: int) -> None:
    used = namespaces(250, layout, "f")
    assert len(used) == expected
    per_ns = {ns: sum(1 for i in range(250) if namespace_of(i, layout, "f") == ns) for ns in used}
    assert max(per_ns.values()) - min(per_ns.values()) <= 1  # evenly


def test_fewer_clusters_than_100_use_one_namespace_each_in_the_100_layout() -> None:
    assert namespaces(20, "100-namespaces", "f") == [f"f-{i}" for i in range(20)]


def test_an_unknown_layout_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="one-namespace"):
        namespace_of(0, "two-namespaces")


def test_a_member_pod_is_selected_by_its_parents_primary_selector_only() -> None:
    pod = kube_objects.member_pod(7, 1, "ns", leader=0, churn=False)
    own = kube_objects.parent(7, "ns", 40000, 1.0)["spec"]["primarySelector"]
    other = kube_objects.parent(8, "ns", 40001, 1.0)["spec"]["primarySelector"]
    labels = pod["metadata"]["labels"]
    assert own.items() <= labels.items()
    assert not other.items() <= labels.items()
    assert "role" not in labels  # an etcd cluster's Pod: only polling follows it


def test_with_churn_the_pods_carry_patronis_role_label_and_status_annotation() -> None:
    leader = kube_objects.member_pod(3, 0, "ns", leader=0, churn=True)
    replica = kube_objects.member_pod(3, 2, "ns", leader=0, churn=True)
    assert leader["metadata"]["labels"]["role"] == "primary"
    assert replica["metadata"]["labels"]["role"] == "replica"
    status = json.loads(replica["metadata"]["annotations"]["status"])
    assert status["role"] == "replica" and status["state"] == "running"
    assert kube_objects.status_annotation("primary", 1) != kube_objects.status_annotation(
        "primary", 2
    )


# ------------------------------------------------------------------ the plan and the lags


def test_the_plan_alternates_kinds_inside_the_window_on_distinct_clusters() -> None:
    switches = plan(50, 10, 100.0, seed=3)
    assert [s.kind for s in switches] == [EVENTLESS, POD_EVENT] * 5
    assert len({s.cluster for s in switches}) == 10
    assert all(10.0 <= s.at < 90.0 for s in switches)
    assert [s.at for s in switches] == sorted(s.at for s in switches)
    assert plan(50, 0, 100.0) == []


def test_more_switchovers_than_clusters_reuse_clusters() -> None:
    switches = plan(3, 7, 70.0)
    assert len(switches) == 7 and {s.cluster for s in switches} <= {0, 1, 2}


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 90) == 90.0
    assert percentile(values, 99) == 99.0
    assert percentile([0.3], 99) == 0.3
    with pytest.raises(ValueError):
        percentile([], 50)


def test_lag_summary_says_how_many_never_moved() -> None:
    assert lag_summary([], 2) == "none measured (2 not moved)"
    text = lag_summary([0.1, 0.2, 0.4], 1)
    assert text.startswith("p50/p90/p99/max 0.20/0.40/0.40/0.40 s (n=3)")
    assert text.endswith("1 not moved")


def test_a_switchover_ends_when_the_selector_first_names_the_new_leader() -> None:
    lags = Lags()
    lags.expect("ns/pg-1-primary", "pg-1-1", POD_EVENT, at=100.0)
    lags.observe("ns/pg-1-primary", "pg-1-0", 100.5)  # still the old leader
    lags.observe("ns/pg-2-primary", "pg-1-1", 100.6)  # another Service
    assert lags.done[POD_EVENT] == [] and lags.missed(POD_EVENT) == 1
    lags.observe("ns/pg-1-primary", "pg-1-1", 101.25)
    lags.observe("ns/pg-1-primary", "pg-1-1", 102.0)  # later updates do not count again
    assert lags.done[POD_EVENT] == [pytest.approx(1.25)]
    assert lags.missed(POD_EVENT) == 0 and lags.done[EVENTLESS] == []
    assert lags.count_selecting({"ns/pg-1-primary": "pg-1-1", "ns/pg-2-primary": "x"}) == 1
    assert lags.finished == [101.25]


def test_recovery_is_counted_from_the_hooks_return() -> None:
    """A switchover made while every hook pod was down is routed some time after the hooks'
    return; one routed before it (a sync in flight) counts as 0."""
    finished = [99.0, 101.0, 102.0, 104.0, 110.0]
    assert recovery_summary(finished, 100.0, 0) == "p50 2.00 / p90 10.00 / max 10.00 s [5]"
    assert recovery_summary(finished, 100.0, 2).endswith(", 2 not routed")
    assert recovery_summary([], 100.0, 3) == "none routed (3 not routed)"


# ------------------------------------------------------------------ arguments and figures


def test_arguments_default_to_a_small_run_of_the_shipped_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGFH_METACONTROLLER_BINARY", raising=False)
    args = parse_args([])
    assert (args.clusters, args.layout, args.poll, args.dcs_churn) == (
        20,
        "one-namespace",
        1.0,
        False,
    )
    assert on_kube.resync_period(args) == 60  # metacontroller/compositecontroller.yaml
    assert on_kube.resync_period(parse_args(["--resync-period", "0"])) is None
    assert on_kube.resync_period(parse_args(["--resync-period", "300"])) == 300


@pytest.mark.parametrize(
    "argv",
    [["--poll", "0.1"], ["--clusters", "0"], ["--layout", "sideways"], ["--duration", "0"]],
)
def test_bad_arguments_are_refused(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGFH_METACONTROLLER_BINARY", raising=False)
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_an_outage_run_takes_its_length_and_the_runbooks_annotation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGFH_METACONTROLLER_BINARY", raising=False)
    args = parse_args(["--hooks-down", "300", "--resync-annotate"])
    assert (args.hooks_down, args.resync_annotate) == (300.0, True)
    assert parse_args([]).hooks_down == 0.0
    for argv in (
        ["--resync-annotate"],  # nothing to recover from
        ["--hooks-down", "-1"],
        ["--hooks-down", "60", "--dcs-churn"],
        ["--hooks-down", "60", "--model"],
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_pprof_needs_a_real_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGFH_METACONTROLLER_BINARY", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--pprof"])
    monkeypatch.setenv("PGFH_METACONTROLLER_BINARY", "/path/to/metacontroller")
    assert parse_args(["--pprof"]).pprof


def test_syncs_asked_count_polls_churn_and_the_tick() -> None:
    assert syncs_asked(1000, 5.0, churn=False, period=None) == 200.0
    assert syncs_asked(200, 1.0, churn=False, period=60) == pytest.approx(200 + 200 / 60)
    assert syncs_asked(1000, 5.0, churn=True, period=None) == pytest.approx(1000 / 30 + 300)


EXPOSITION = """\
# TYPE workqueue_queue_duration_seconds histogram
workqueue_queue_duration_seconds_bucket{name="CompositeController-pg-failover-hook",le="+Inf"} 10
workqueue_queue_duration_seconds_sum{name="CompositeController-pg-failover-hook"} 2.5
workqueue_queue_duration_seconds_count{name="CompositeController-pg-failover-hook"} 10
workqueue_queue_duration_seconds_sum{name="other"} 99
workqueue_queue_duration_seconds_count{name="other"} 1
# TYPE workqueue_work_duration_seconds histogram
workqueue_work_duration_seconds_sum{name="CompositeController-pg-failover-hook"} 0.5
workqueue_work_duration_seconds_count{name="CompositeController-pg-failover-hook"} 10
# TYPE workqueue_depth gauge
workqueue_depth{name="CompositeController-pg-failover-hook"} 7
"""


def test_queue_figures_are_the_hook_controllers_own_and_their_means_over_the_window() -> None:
    after = workqueue_figures(EXPOSITION)
    assert after["workqueue_queue_duration_seconds_sum"] == 2.5  # "other" left out
    before = {
        "workqueue_queue_duration_seconds_sum": 0.5,
        "workqueue_queue_duration_seconds_count": 5,
    }
    line = queue_line(before, after)
    assert "queue wait mean 400.0 ms (n=5)" in line  # (2.5 - 0.5) / (10 - 5)
    assert "work mean 50.0 ms (n=10)" in line
    assert line.endswith("depth at end 7")


MC = "metacontroller/pkg/controller/"
TOP_CUM = "\n".join(
    [
        "      flat  flat%   sum%        cum   cum%",
        f"     0.01s 0.072% 0.072%     10.47s 75.27%  {MC}composite.(*parentController).worker",
        f"  0  0% 0.072%  10.21s 73.40%  {MC}composite.(*parentController).syncParentObject",
        f"  0.03s  0.22%  0.29%  4.85s 34.87%  {MC}common/customize.(*Manager).GetRelatedObjects",
        f"  0.01s 0.072% 60.68%  190ms  1.37%  {MC}composite.(*parentController).claimChildren",
    ]
)


def test_the_profiles_functions_are_read_per_sync() -> None:
    costs = kube_figures.profiled_costs(TOP_CUM, syncs=4000)
    assert costs["sync"] == pytest.approx((10.21, 2.5525))
    assert costs["related Pods listed"] == pytest.approx((4.85, 1.2125))
    assert costs["claim children"] == pytest.approx((0.19, 0.0475))
    assert "findRelatedParents" not in costs  # no Pod event in that profile


# ------------------------------------------------------------------ the model's Metacontroller


COST = MetacontrollerCost(sync_base=0.001, per_listed=2e-6, per_parent_walked=5e-6)


def test_cost_per_sync_grows_with_the_pods_listed_and_per_event_with_the_parents() -> None:
    assert COST.sync_cpu(0) == 0.001
    assert COST.sync_cpu(3000) == pytest.approx(0.007)
    assert COST.event_cpu(1000) == pytest.approx(0.005)


BUSY = Mix(polled=0.0, busy=1.0)


def _row(
    n: int, cost: MetacontrollerCost | None, namespaces: int = 1, mix: Mix | None = None
) -> Row:
    return Row(
        "t",
        n,
        replace(SHIPPED, resync_period=None, cost=cost),
        Policy(poll=1.0, event_resync=30.0, from_reply=False, spread=True),
        mix or Mix(polled=1.0, busy=0.0),
        namespaces=namespaces,
        duration=60.0,
        warmup=10.0,
        switchovers=20,
    )


def test_without_a_cost_metacontroller_is_free_as_before() -> None:
    result = model.run_modelled(_row(100, None), LATENCIES, CPU)
    assert result.mc_cores == 0.0


def test_the_modelled_cpu_is_syncs_times_the_cost_of_the_namespaces_listing() -> None:
    one = model.run_modelled(_row(200, COST), LATENCIES, CPU)
    spread = model.run_modelled(_row(200, COST, namespaces=100), LATENCIES, CPU)
    assert one.mc_cores == pytest.approx(one.syncs_per_second * COST.sync_cpu(600), rel=0.05)
    assert spread.mc_cores == pytest.approx(spread.syncs_per_second * COST.sync_cpu(6), rel=0.05)
    assert spread.mc_cores < one.mc_cores / 2


def test_pod_events_wait_for_the_one_handler_that_walks_every_parent() -> None:
    """Busy Kubernetes-DCS clusters (every Pod patched every 10 s): with a walk that
    costs more than the events' spacing the handler falls behind, and a Pod-changing
    switchover's event waits behind the others, as measured on the real binary."""
    cheap = model.run_modelled(_row(500, COST, mix=BUSY), LATENCIES, CPU)
    slow_walk = replace(COST, per_parent_walked=40e-6)  # 20 ms a walk > 6.7 ms between events
    slow = model.run_modelled(_row(500, slow_walk, mix=BUSY), LATENCIES, CPU)
    assert cheap.lag(model.POD_CHANGING, 0.5) < 0.1
    assert slow.lag(model.POD_CHANGING, 0.5) > 1.0
    assert slow.mc_cores > cheap.mc_cores


def test_a_shard_walks_only_its_own_parents() -> None:
    slow_walk = replace(COST, per_parent_walked=40e-6)
    one = _row(500, slow_walk, mix=BUSY)
    sharded = replace(one, mc=replace(one.mc, shards=5))
    result = model.run_modelled(sharded, LATENCIES, CPU)
    assert result.lag(model.POD_CHANGING, 0.5) < 0.1


def test_metacontroller_flags_default_to_no_cost() -> None:
    assert Metacontroller().cost is None and Row("t", 1, SHIPPED, Policy()).namespaces == 1


def test_the_model_row_has_the_runs_settings_and_the_calibrated_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGFH_METACONTROLLER_BINARY", raising=False)
    args = parse_args(["--clusters", "1000", "--poll", "5", "--layout", "100-namespaces"])
    row = on_kube.model_row(args, 60)
    assert (row.n, row.namespaces, row.policy.poll, row.mc.resync_period) == (1000, 100, 5.0, 60)
    assert row.mc.cost is not None and row.mc.cost.per_listed > 0
    assert row.mix.polled == 1.0
    churn = on_kube.model_row(parse_args(["--dcs-churn"]), None)
    assert (churn.mix.polled, churn.mix.busy, churn.mc.resync_period) == (0.0, 1.0, None)
    assert parse_args(["--pprof", "--model-only"]).model_only  # no binary needed


def test_on_shared_cores_metacontroller_and_the_hook_serve_fewer_syncs() -> None:
    """A 2-core benchmark machine: Metacontroller's listing at 1,000 clusters in one
    namespace takes cores the hook then lacks, so fewer syncs are served than asked."""
    row = replace(_row(1000, COST), policy=Policy(poll=4.0, from_reply=False, spread=True))
    own = model.run_modelled(row, LATENCIES, CPU)  # 1.75 cores Metacontroller, 1 the hook
    shared = model.run_modelled(replace(row, shared_cores=2), LATENCIES, CPU)
    assert own.syncs_per_second > 0.95 * 250  # 250 asked
    assert shared.syncs_per_second < 0.8 * own.syncs_per_second


def test_api_requests_are_counted_per_sync_by_method() -> None:
    text = EXPOSITION + "\n".join(
        [
            "# TYPE rest_client_requests_total counter",
            'rest_client_requests_total{code="200",host="h",method="GET"} 300',
            'rest_client_requests_total{code="404",host="h",method="GET"} 10',
            'rest_client_requests_total{code="200",host="h",method="PUT"} 50',
            "",
        ]
    )
    after = workqueue_figures(text)
    assert after["api:GET"] == 310
    assert kube_figures.api_per_sync({"api:GET": 110.0}, after, 100) == "GET 2.00, PUT 0.50"
    assert kube_figures.api_per_sync({}, {}, 100) == "n/a"
