"""The filter of ``testbed.bench.metacontroller_metrics``: what it keeps of a scrape is what
tests/data/metacontroller-metrics/ records and the alerts are checked against."""

from __future__ import annotations

from testbed.bench.metacontroller_metrics import hook_deployment, interesting

SCRAPE = """\
# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 212
# HELP leader_election_master_status Gauge of if the reporting system is master.
# TYPE leader_election_master_status gauge
leader_election_master_status{name="metacontroller"} 1
# HELP workqueue_retries_total Total number of retries handled by workqueue
# TYPE workqueue_retries_total counter
workqueue_retries_total{controller="CompositeController-pgfh",name="CompositeController-pgfh"} 83
workqueue_retries_total{controller="compositecontroller",name="compositecontroller"} 2
# HELP metacontroller_sync_request_duration_histogram_seconds A histogram.
# TYPE metacontroller_sync_request_duration_histogram_seconds histogram
metacontroller_sync_request_duration_histogram_seconds_bucket{method="post",le="0.005"} 3
metacontroller_sync_request_duration_histogram_seconds_bucket{method="post",le="+Inf"} 81
metacontroller_sync_request_duration_histogram_seconds_sum{method="post"} 0.45
metacontroller_sync_request_duration_histogram_seconds_count{method="post"} 81
"""


def test_keeps_the_families_alerts_select_of_the_parents_queue_only() -> None:
    assert interesting(SCRAPE) == [
        'leader_election_master_status{name="metacontroller"} 1',
        'workqueue_retries_total{controller="CompositeController-pgfh",'
        'name="CompositeController-pgfh"} 83',
        'metacontroller_sync_request_duration_histogram_seconds_sum{method="post"} 0.45',
        'metacontroller_sync_request_duration_histogram_seconds_count{method="post"} 81',
    ]


def test_the_hook_deployment_is_named_as_deploy_base_names_it() -> None:
    deployment = hook_deployment("pg-failover-hook")
    assert deployment["metadata"] == {"name": "pg-failover-hook", "namespace": "pg-failover-hook"}
