"""The pure parts of ``testbed.bench.failover_kube`` (``testbed.bench.failover_kube_figures``)
that replace what the Metacontroller stand-in used to record: when the cluster's next scheduled
resync was due, and the hook's own count of its calls. Both must be right on a real
Metacontroller, which records nothing for the benchmark."""

from __future__ import annotations

import pytest

from hooks.core.switchover import spread_resync
from hooks.domain.model import DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS, ResyncTiming
from testbed.bench.failover_kube_figures import call_counts, next_slot, resync_period

KEY = "0b7f3c9e-6a55-4a8e-9a55-0d1c2b3a4f5e"


@pytest.mark.parametrize("period", [1.0, 30.0])
@pytest.mark.parametrize("now", [0.0, 12.34, 1_764_880_000.25, 1_764_880_017.9])
def test_every_resync_the_hook_schedules_lands_on_a_slot_next_slot_names(
    period: float, now: float
) -> None:
    due = next_slot(period, KEY, now)
    assert 0.0 <= due < period
    landed = now + spread_resync(period, KEY, now)
    # On the next slot, or (the half-period floor) the one after it: never between.
    assert landed - (now + due) == pytest.approx(0.0, abs=1e-6) or landed - (
        now + due
    ) == pytest.approx(period, abs=1e-6)
    # From the slot on, the next one is a whole period away.
    assert next_slot(period, KEY, now + due + 1e-6) == pytest.approx(period, abs=1e-5)


def test_the_period_follows_the_detection() -> None:
    timing = ResyncTiming(healthy=1.0, degraded=0.3)
    assert resync_period("Polled", timing) == 1.0
    assert resync_period("RoleLabel", timing) == DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS
    assert resync_period(None, ResyncTiming(healthy=0.2, degraded=0.3)) == 0.3


EXPOSITION = """\
# HELP pgfh_sync_duration_seconds Time to answer a sync or finalize call, probes included.
# TYPE pgfh_sync_duration_seconds histogram
pgfh_sync_duration_seconds_bucket{hook="sync",le="0.005"} 3.0
pgfh_sync_duration_seconds_bucket{hook="sync",le="+Inf"} 40.0
pgfh_sync_duration_seconds_count{hook="sync"} 40.0
pgfh_sync_duration_seconds_sum{hook="sync"} 1.5
pgfh_sync_duration_seconds_count{hook="finalize"} 2.0
pgfh_sync_duration_seconds_sum{hook="finalize"} 0.1
# HELP pgfh_bad_requests_total Requests answered 4xx, by endpoint.
# TYPE pgfh_bad_requests_total counter
pgfh_bad_requests_total{endpoint="sync"} 1.0
pgfh_bad_requests_total{endpoint="other"} 7.0
# HELP pgfh_internal_errors_total Requests answered 500 because of a bug.
# TYPE pgfh_internal_errors_total counter
pgfh_internal_errors_total{endpoint="customize"} 2.0
"""


def test_calls_and_failed_calls_come_from_the_hooks_metrics() -> None:
    assert call_counts(EXPOSITION) == (42.0, 3.0)  # a stray path's 404 is no failed call
    assert call_counts("") == (0.0, 0.0)
