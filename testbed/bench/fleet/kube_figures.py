"""The fleet on the real control plane: its figures, from watches and scrapes (pure).

The switchover lags (:class:`Lags`), the syncs the fleet asks for, Metacontroller's work-queue
and API-request figures from its ``/metrics``, the per-sync costs of a pprof profile, and the
report's lines. Used by :mod:`testbed.bench.fleet.on_kube`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from testbed.bench.fleet.kube_objects import (
    CHURN_PERIOD,
    EVENT_DRIVEN_RESYNC,
    EVENTLESS,
    MEMBERS,
    POD_EVENT,
)

WORKQUEUE = "CompositeController-pg-failover-hook"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank (``q`` in 0..100)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def lag_summary(values: Sequence[float], missed: int = 0) -> str:
    """``p50/p90/p99/max`` in seconds, and how many never moved within the wait."""
    if not values:
        return f"none measured{f' ({missed} not moved)' if missed else ''}"
    parts = "/".join(f"{percentile(values, q):.2f}" for q in (50, 90, 99))
    text = f"p50/p90/p99/max {parts}/{max(values):.2f} s (n={len(values)})"
    return text + (f", {missed} not moved" if missed else "")


def syncs_asked(clusters: int, poll: float, churn: bool, period: int | None) -> float:
    """The syncs a second the fleet asks for: each polled cluster one a poll; with churn the
    event-driven resync plus one per Pod patch; plus the resyncPeriodSeconds tick's share."""
    base = (
        clusters / EVENT_DRIVEN_RESYNC + clusters * MEMBERS / CHURN_PERIOD
        if churn
        else (clusters / poll)
    )
    return base + (clusters / period if period else 0.0)


class Lags:
    """Switchovers in flight and their lags: a switchover is done when the cluster's Service
    selector first names the new leader's Pod after the switch (thread safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: dict[str, tuple[float, str, str]] = {}
        self.done: dict[str, list[float]] = {EVENTLESS: [], POD_EVENT: []}
        #: When each done switchover was seen routed (monotonic), both kinds.
        self.finished: list[float] = []
        self.selected: dict[str, str] = {}

    def expect(self, service: str, pod: str, kind: str, at: float) -> None:
        with self._lock:
            self.pending[service] = (at, pod, kind)

    def observe(self, service: str, selected: str | None, now: float) -> None:
        with self._lock:
            if selected is None:
                return
            self.selected[service] = selected
            pending = self.pending.get(service)
            if pending is not None and pending[1] == selected:
                del self.pending[service]
                self.done[pending[2]].append(now - pending[0])
                self.finished.append(now)

    def missed(self, kind: str) -> int:
        with self._lock:
            return sum(1 for _, _, k in self.pending.values() if k == kind)

    def count_selecting(self, wanted: dict[str, str]) -> int:
        with self._lock:
            return sum(1 for s, pod in wanted.items() if self.selected.get(s) == pod)


def workqueue_figures(exposition: str, name: str = WORKQUEUE) -> dict[str, float]:
    """Sums and counts of the controller's ``workqueue_*`` histograms, its depth and adds;
    summed over every queue whose name starts with ``name`` (``pg-failover-hook-0``, ``-1``
    ... when several CompositeControllers share the fleet)."""
    from prometheus_client.parser import text_string_to_metric_families

    figures: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "rest_client_requests_total":  # client-go's, by method
                key = f"api:{sample.labels.get('method', '?')}"
                figures[key] = figures.get(key, 0.0) + sample.value
                continue
            queue = sample.labels.get("name") or ""
            if not queue.startswith(name) or sample.name.endswith("_bucket"):
                continue
            figures[sample.name] = figures.get(sample.name, 0.0) + sample.value
    return figures


def queue_line(before: dict[str, float], after: dict[str, float]) -> str:
    def mean(metric: str) -> str:
        count = after.get(f"{metric}_count", 0.0) - before.get(f"{metric}_count", 0.0)
        total = after.get(f"{metric}_sum", 0.0) - before.get(f"{metric}_sum", 0.0)
        return f"{total / count * 1000:.1f} ms (n={count:.0f})" if count else "n/a"

    return (
        f"queue wait mean {mean('workqueue_queue_duration_seconds')}, "
        f"work mean {mean('workqueue_work_duration_seconds')}, "
        f"depth at end {after.get('workqueue_depth', 0):.0f}"
    )


#: The functions whose cumulative CPU the calibration needs (v4.17.2's names).
PROFILED = {
    "sync": "composite.(*parentController).syncParentObject",
    "related Pods listed": "customize.(*Manager).GetRelatedObjects",
    "findRelatedParents": "customize.(*Manager).findRelatedParents",
    "hook call (JSON)": "composite.(*parentController).callHook",
    "status update": "composite.(*parentController).updateParentStatus",
    "claim children": "composite.(*parentController).claimChildren",
}


def profiled_costs(top_cum: str, syncs: float) -> dict[str, tuple[float, float]]:
    """From ``go tool pprof -top -cum``: each of :data:`PROFILED`'s cumulative CPU (s) and
    per sync (ms), ``syncs`` being the syncs served while it profiled."""
    found: dict[str, tuple[float, float]] = {}
    for line in top_cum.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        for label, function in PROFILED.items():
            if label in found or not fields[-1].endswith(function):
                continue
            cum = fields[3]
            seconds = float(cum[:-2]) / 1000 if cum.endswith("ms") else float(cum.rstrip("s"))
            found[label] = (seconds, seconds / syncs * 1000 if syncs else float("nan"))
    return found


def api_per_sync(before: dict[str, float], after: dict[str, float], syncs: float) -> str:
    """Metacontroller's API requests in the window per sync served, by method."""
    methods = sorted(k for k in after if k.startswith("api:"))
    if not methods or not syncs:
        return "n/a"
    return ", ".join(
        f"{k[4:]} {(after[k] - before.get(k, 0.0)) / syncs:.2f}"
        for k in methods
        if after[k] - before.get(k, 0.0) > 0
    )


def report(figures: dict[str, Any]) -> list[str]:
    """The run's figures, one per line (the lags' raw values stay in the JSON)."""
    lines = [
        f"{figures['metacontroller']}, {figures['clusters']} clusters, {figures['layout']}, "
        f"poll {figures['poll']:g} s, resyncPeriodSeconds {figures['resync_period'] or 'absent'}"
        f"{', DCS churn' if figures['dcs_churn'] else ''}; window {figures['window_s']} s",
        f"  syncs/s asked {figures['syncs_asked_per_s']}, served {figures['syncs_served_per_s']}",
        f"  Metacontroller {figures['mc_cores']} cores, {figures['mc_ms_per_sync']} ms CPU a sync, "
        f"RSS {figures['mc_rss_mib']} MiB",
        f"  hook {figures['hook_cores']} cores, {figures['hook_ms_per_sync']} ms a sync; "
        f"this harness {figures['harness_cores']} cores",
        f"  event-less switchover lag {figures['eventless_lag']}",
        f"  Pod-event lag {figures['pod_event_lag']}",
        f"  Metacontroller {figures['queue']}",
        f"  Metacontroller's API requests a sync: {figures.get('api_per_sync', 'n/a')}",
    ]
    if "pprof_ms_per_sync" in figures:
        costs = ", ".join(f"{k} {v} ms" for k, v in figures["pprof_ms_per_sync"].items())
        lines.append(f"  profile, CPU per sync served: {costs}")
    if "hooks_down_s" in figures:
        annotate = figures.get("annotate_s")
        lines.append(
            f"  every hook pod down {figures['hooks_down_s']:g} s, the switchovers inside it "
            f"routed after the hooks returned: {figures['recovery']}"
            + (f" (every parent annotated in {annotate} s)" if annotate is not None else "")
        )
    if "churn_patches_per_s" in figures:
        lines.append(
            f"  churn {figures['churn_patches_per_s']} Pod patches/s ({figures['churn_late']} late)"
        )
    return lines


def recovery_summary(finished: list[float], back_at: float, missed: int) -> str:
    """How long after the hooks' return the switchovers made during an outage were routed
    (one routed before it, by a sync in flight, counts as 0)."""
    after = [max(0.0, at - back_at) for at in finished]
    if not after:
        return f"none routed ({missed} not routed)"
    p50, p90 = percentile(after, 50), percentile(after, 90)
    line = f"p50 {p50:.2f} / p90 {p90:.2f} / max {max(after):.2f} s [{len(after)}]"
    return line + (f", {missed} not routed" if missed else "")
