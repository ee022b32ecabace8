"""Failovers on the real control plane: what one failover and one run record, and the tables.

:class:`KubeFailover` (one failover's times on one monotonic clock), :class:`Invariants` and
:class:`RunResult`; the hops of the main and the readiness tables, the hook's healthy resync
period and phase-spread slot, the first watch event on the new leader, the hook's call counts
from its exposition; the tables and the report :mod:`testbed.bench.failover_kube` prints (pure,
but for the machine's load and the environment's Metacontroller in the report's header).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hooks.core.switchover import spread_resync
from hooks.domain.model import DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS, ResyncTiming
from hooks.shell.config import HookSettings
from testbed.bench.failover_patroni import KINDS
from testbed.bench.stats import p50_p95_max
from testbed.kubernetes.pods import POD_NAME_LABEL
from testbed.metacontroller.metacontroller_binary import ENV_BINARY

DCS_MODES = ("etcd", "endpoints", "configmaps")


#: The hops of the main table: ``(label, seconds of a failover)``.
HOPS: Sequence[tuple[str, Callable[[KubeFailover], float]]] = (
    ("trigger→promotion (Patroni)", lambda f: f.promotion - f.trigger),
    ("promotion→Service write (hook + Metacontroller)", lambda f: f.service - f.promotion),
    ("Service write→slice", lambda f: f.slice - f.service),
    ("promotion→slice", lambda f: f.slice - f.promotion),
    ("trigger→slice", lambda f: f.slice - f.trigger),
)
#: The readiness table: what the endpointslice hop waits for, and the same hop for a Service
#: with ``publishNotReadyAddresses: true`` (:class:`NotReadyMirror`), side by side.
READINESS_HOPS: Sequence[tuple[str, Callable[[KubeFailover], float]]] = (
    ("Service write→slice", lambda f: f.slice - f.service),
    ("of it, waiting for the new leader's Pod Ready", lambda f: f.readiness_wait),
    ("Service write→slice, publishNotReadyAddresses", lambda f: f.pnr_hop),
    ("promotion→slice, publishNotReadyAddresses", lambda f: f.service - f.promotion + f.pnr_hop),
    ("Service write→slice, no selector, slice written directly", lambda f: f.direct_hop),
    (
        "promotion→slice, no selector, slice written",
        lambda f: f.service - f.promotion + f.direct_hop,
    ),
)


@dataclass
class KubeFailover:
    """One failover: its times (``time.monotonic()``) and what the hook said before it."""

    dcs: str
    kind: str
    old: str
    new: str
    trigger: float
    promotion: float
    service: float
    slice: float
    #: ``status.switchoverDetection`` when it was triggered, and the healthy resync period
    #: that goes with it (the hook's settings: :func:`resync_period`).
    detection: str | None = None
    resync_period: float | None = None
    #: When the cluster's next scheduled resync was due after the trigger (the hook's
    #: phase-spread slot, :func:`next_slot`): a slice moved before it came from an event.
    resync_due: float | None = None
    #: Ground truth in [trigger, slice moved]: no leader at all; a leader, the slice elsewhere.
    no_leader: float = 0.0
    misrouted: float = 0.0
    #: When the new leader's Pod turned Ready after the trigger (``None``: it stayed Ready).
    #: A replica that stops streaming turns NotReady (Patroni's /readiness), and the kubelet
    #: probes once a period: the slice waits for it.
    new_ready: float | None = None
    #: The mirror with ``publishNotReadyAddresses``: its selector written, its slice moved.
    pnr_started: float = 0.0
    pnr_slice: float = 0.0
    #: The selector-less Service whose EndpointSlice is written directly: likewise.
    direct_started: float = 0.0
    direct_slice: float = 0.0

    @property
    def readiness_wait(self) -> float:
        """How long the slice waited after the Service write for the new Pod to be Ready."""
        if self.new_ready is None or self.new_ready < self.trigger:
            return 0.0
        return max(0.0, min(self.new_ready, self.slice) - self.service)

    @property
    def pnr_hop(self) -> float:
        return self.pnr_slice - self.pnr_started

    @property
    def direct_hop(self) -> float:
        return self.direct_slice - self.direct_started


@dataclass
class Invariants:
    """What must hold over a whole run, from the watches (not from the hook's own word)."""

    most_ready_at_once: int = 0
    service_deleted: int = 0
    empty_selectors: int = 0
    selector_changes: int = 0
    hook_errors: int = 0
    syncs: int = 0
    writes_on_non_leader: int = 0
    #: The same for the publishNotReadyAddresses mirror's slice and the direct one.
    mirror_most_ready_at_once: int = 0
    direct_most_ready_at_once: int = 0

    @property
    def broken(self) -> list[str]:
        problems = []
        if self.mirror_most_ready_at_once > 1:
            problems.append(f"{self.mirror_most_ready_at_once} Pods ready at once in the mirror")
        if self.direct_most_ready_at_once > 1:
            problems.append(f"{self.direct_most_ready_at_once} Pods ready in the direct slice")
        if self.most_ready_at_once > 1:
            problems.append(f"{self.most_ready_at_once} Pods ready at once in the primary slice")
        if self.service_deleted:
            problems.append(f"the primary Service was deleted {self.service_deleted} time(s)")
        if self.empty_selectors:
            problems.append(f"the Service's selector was empty {self.empty_selectors} time(s)")
        if self.writes_on_non_leader:
            problems.append(f"{self.writes_on_non_leader} writes landed on a non-leader")
        return problems


@dataclass
class RunResult:
    """One DCS mode's failovers, invariants and client writes."""

    dcs: str
    failovers: list[KubeFailover] = field(default_factory=list)
    invariants: Invariants = field(default_factory=Invariants)
    writes: dict[str, Any] = field(default_factory=dict)
    #: The ``SwitchoverDetection`` condition of the last status (Kubernetes DCS: why).
    detection_condition: dict[str, Any] | None = None
    #: How long the failovers took, and the syncs in that time (Pod events bring syncs).
    seconds: float = 0.0
    syncs: int = 0
    #: What the watches saw (for the JSON output, to read a hop after the fact).
    trace: dict[str, list[Any]] = field(default_factory=dict)


def resync_period(detection: str | None, timing: ResyncTiming | None = None) -> float:
    """The healthy resync period the hook asks for under ``detection`` (no ``pollSeconds``
    in the benchmark's spec): the healthy setting, at least 30 s when event-driven
    (:func:`hooks.core.switchover.healthy_resync`)."""
    timing = timing or HookSettings().resync
    period = max(timing.healthy, timing.degraded)
    if detection == "RoleLabel":
        period = max(DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS, period)
    return period


def next_slot(period: float, key: str, wall: float) -> float:
    """Seconds from the wall-clock time ``wall`` to the next resync slot of the parent
    ``key`` (its ``metadata.uid``). The hook phase-spreads every healthy resync onto the
    slots ``slot + k·period`` (:func:`hooks.core.switchover.spread_resync`, which adds a
    period when the slot is less than half a period away): a resync of a routed cluster
    lands on one of them, so none falls between ``wall`` and ``wall`` plus this."""
    return spread_resync(period, key, wall) % period


def first_selector(
    selectors: Sequence[tuple[float, Mapping[str, str]]], pod: str, after: float
) -> float | None:
    """When the Service's watch first showed a selector on ``pod``, from ``after`` on."""
    for at, selector in selectors:
        if at >= after and selector.get(POD_NAME_LABEL) == pod:
            return at
    return None


def first_ready(
    history: Sequence[tuple[float, tuple[str, ...]]], addresses: tuple[str, ...], after: float
) -> float | None:
    """When the slices first listed exactly ``addresses`` ready, from ``after`` on."""
    for at, ready in history:
        if at >= after and ready == addresses:
            return at
    return None


def call_counts(exposition: str) -> tuple[float, float]:
    """Answered calls (``pgfh_sync_duration_seconds_count``, every hook) and failed ones
    (``pgfh_internal_errors_total`` and ``pgfh_bad_requests_total`` of the Metacontroller
    endpoints) in the hook's text exposition."""
    calls = failed = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "pgfh_sync_duration_seconds_count":
                calls += sample.value
            elif sample.name in ("pgfh_internal_errors_total", "pgfh_bad_requests_total") and (
                sample.labels.get("endpoint") in ("sync", "customize")
            ):
                failed += sample.value
    return calls, failed


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "–"
    return p50_p95_max(values)


def summarize(
    failovers: Sequence[KubeFailover],
    hops: Sequence[tuple[str, Callable[[KubeFailover], float]]] = HOPS,
) -> list[str]:
    """A markdown table: p50 / p95 / max of every hop, per DCS mode and kind."""
    header = "| DCS | failover | n | " + " | ".join(label for label, _ in hops) + " |"
    lines = [header, "|" + "---|" * (3 + len(hops))]
    for dcs in DCS_MODES:
        for kind in KINDS:
            chosen = [f for f in failovers if f.dcs == dcs and f.kind == kind]
            if not chosen:
                continue
            cells = [_stats([hop(f) for f in chosen]) for _, hop in hops]
            lines.append(f"| {dcs} | {kind} | {len(chosen)} | " + " | ".join(cells) + " |")
    return lines


def load_line() -> str:
    """The machine's load while it ran: what a reader needs to weigh the figures."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


def controller_line() -> str:
    """Which Metacontroller applied the replies: the figures differ by it."""
    binary = os.environ.get(ENV_BINARY)
    return f"Metacontroller: the binary {binary}" if binary else "Metacontroller: the stand-in"


def report(results: Sequence[RunResult]) -> list[str]:
    failovers = [f for r in results for f in r.failovers]
    lines = [controller_line(), "", *summarize(failovers)]
    lines += [
        "",
        "Where the endpointslice hop goes, and the same Service with "
        "publishNotReadyAddresses (a mirror, one write later, timed from that write):",
        "",
    ]
    lines += summarize(failovers, READINESS_HOPS)
    waited = sum(1 for f in failovers if f.readiness_wait > 0)
    lines.append(
        f"\nEach cell: p50 / p95 / max in seconds, on one monotonic clock. The slice waited for "
        f"the new leader's Pod to turn Ready in {waited} of {len(failovers)} failovers."
    )
    for r in results:
        inv = r.invariants
        w = r.writes
        lines.append(
            f"\n{r.dcs}: {len(r.failovers)} failovers, {inv.syncs} hook calls answered "
            f"({inv.hook_errors} failed; the hook's /metrics, every parent on the server), "
            f"{inv.selector_changes} selector changes; at most {inv.most_ready_at_once} "
            f"Pod ready at once in the primary slice; Service deleted {inv.service_deleted} "
            f"times; empty selectors {inv.empty_selectors}."
        )
        lines.append(
            f"  {r.syncs} hook calls in the {r.seconds:.0f} s of failovers: "
            f"{60 * r.syncs / max(r.seconds, 1e-9):.0f} a minute."
        )
        when = w.get("failed_when") or {}
        lines.append(
            "  no writer in this run"
            if not w
            else (
                f"  writes through the slice (one every 50 ms): {w.get('ok')} ok, "
                f"{w.get('failed')} failed ({when.get('no_leader')} with no leader, "
                f"{when.get('service_elsewhere')} with a leader but the slice not on it yet, "
                f"{when.get('service_on_leader')} with the slice on the leader), "
                f"{w.get('on_non_leader')} on a non-leader."
            )
        )
        no_leader = sum(f.no_leader for f in r.failovers)
        misrouted = sum(f.misrouted for f in r.failovers)
        lines.append(
            f"  ground truth (20 ms sampler): no leader {no_leader:.2f} s in total; a leader "
            f"but the slice elsewhere {misrouted:.3f} s in total."
        )
        detections = sorted({str(f.detection) for f in r.failovers})
        resyncs = [f.resync_period for f in r.failovers if f.resync_period is not None]
        lines.append(
            f"  switchoverDetection at the triggers: {', '.join(detections)}; healthy resync "
            f"period {min(resyncs, default=0):.1f}–{max(resyncs, default=0):.1f} s"
        )
        if r.detection_condition is not None:
            c = r.detection_condition
            lines.append(
                f"  SwitchoverDetection: {c.get('status')} {c.get('reason')}: {c.get('message')}"
            )
    return lines
