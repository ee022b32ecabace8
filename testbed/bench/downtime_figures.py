"""Client downtime figures from a failover's timeline and the writers' records (pure).

One failover gives a :class:`Timeline` (every time on the machine's monotonic clock): the
trigger, Patroni's promotion (the new leader's first ``role: primary``), the watch event of
the primary Service's selector on the new leader (the hook's reply as Metacontroller wrote
it), the moment the Service's EndpointSlice listed only the new leader as ready, and the
moment kube-proxy's rules sent new connections of the ClusterIP only to it. Each writer's
attempts (the JSON records of :mod:`testbed.bench.client_writer`) and the members' connection counts
(:class:`testbed.bench.writers.ConnectionSampler`) then give that client's :class:`ClientFigures`:

* **downtime**: from the trigger to the end of its first write committed on the new leader
  (the definition the seed's "15–30 s" figure used), and the part of it after the promotion;
* **longest gap**: the longest time between two committed writes around the failover (a
  switchover lets writes commit on the old leader for a while after the trigger);
* the failed attempts by outcome, and those that are the routing's fault: writes refused as
  read-only once the Service had moved (EndpointSlice) and once kube-proxy had (rules);
* **on the old member**: the most connections the writer still had on the old leader once the
  rules had moved (plus a grace of one sample), and how many were left when the window closed;
* **misplaced commits**: writes committed on another member than the new leader after the
  promotion (a split brain through the Service; must be 0).
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.bench.stats import p50_p95_max

Record = Mapping[str, Any]
Sample = tuple[float, str, Mapping[str, int]]
#: After the rules moved, connections still being closed count only after this much.
SAMPLE_GRACE = 0.5


@dataclass(frozen=True)
class Timeline:
    kind: str
    old: str  # the old leader's member address (what inet_server_addr() says)
    new: str
    trigger: float
    promoted: float
    slice_moved: float | None
    rules_moved: float | None
    window_end: float
    #: The Service's selector on the new leader, from a watch (``None``: not seen).
    service_moved: float | None = None


@dataclass(frozen=True)
class ClientFigures:
    writer: str
    downtime: float | None
    after_promotion: float | None
    longest_gap: float | None
    failed: Mapping[str, int] = field(default_factory=dict)
    read_only_after_slice: int = 0
    read_only_after_rules: int = 0
    on_old_after_rules: int = 0
    on_old_at_end: int = 0
    misplaced_commits: int = 0


def client_figures(
    timeline: Timeline, writer: str, records: Sequence[Record], samples: Iterable[Sample]
) -> ClientFigures:
    """One writer's figures for one failover (records of the whole run may be passed)."""
    window = [r for r in records if timeline.trigger - 5 <= r["t0"] <= timeline.window_end]
    after = [r for r in window if r["t0"] >= timeline.trigger]
    first_new = next(
        (r for r in after if r["out"] == "ok" and r.get("server") == timeline.new), None
    )
    downtime = first_new["t1"] - timeline.trigger if first_new else None
    after_promotion = first_new["t1"] - timeline.promoted if first_new else None
    commits = sorted(r["t1"] for r in window if r["out"] == "ok")
    gaps = [b - a for a, b in itertools.pairwise(commits) if b >= timeline.trigger]
    until = first_new["t0"] if first_new else timeline.window_end
    failed = Counter(r["out"] for r in after if r["out"] != "ok" and r["t0"] < until)

    def read_only_since(moment: float | None) -> int:
        if moment is None:
            return 0
        return sum(1 for r in after if r["out"] == "read_only" and r["t0"] >= moment)

    on_old: list[tuple[float, int]] = [
        (at, counts.get(writer, 0))
        for at, member, counts in samples
        if member == timeline.old and timeline.trigger <= at <= timeline.window_end
    ]
    rules = timeline.rules_moved
    after_rules = [n for at, n in on_old if rules is not None and at >= rules + SAMPLE_GRACE]
    misplaced = sum(
        1
        for r in after
        if r["out"] == "ok" and r.get("server") != timeline.new and r["t0"] > timeline.promoted
    )
    return ClientFigures(
        writer=writer,
        downtime=downtime,
        after_promotion=after_promotion,
        longest_gap=max(gaps) if gaps else None,
        failed=dict(failed),
        read_only_after_slice=read_only_since(timeline.slice_moved),
        read_only_after_rules=read_only_since(timeline.rules_moved),
        on_old_after_rules=max(after_rules, default=0),
        on_old_at_end=on_old[-1][1] if on_old else 0,
        misplaced_commits=misplaced,
    )


def _spread(values: Sequence[float | None]) -> str:
    present = [v for v in values if v is not None]
    missing = len(values) - len(present)
    if not present:
        return f"never ({missing})"
    return p50_p95_max(present, 2) + (f" (+{missing} never)" if missing else "")


KIND_LABELS = {
    "kill": "SIGKILL of the leader",
    "graceful": "graceful stop of the leader",
    "switchover": "planned switchover",
}


def hop_table(timelines: Sequence[Timeline]) -> list[str]:
    """Per kind of failover: promotion, the Service write after it (the hook and
    Metacontroller), the EndpointSlice after promotion, the rules after the slice."""
    lines = [
        "| failover | n | promotion after trigger p50 / p95 / max (s) | Service written after "
        "promotion (hook + Metacontroller) | EndpointSlice moved after promotion | kube-proxy "
        "rules moved after the EndpointSlice |",
        "|---|---|---|---|---|---|",
    ]
    for kind, label in KIND_LABELS.items():
        chosen = [t for t in timelines if t.kind == kind]
        if not chosen:
            continue
        promo = [t.promoted - t.trigger for t in chosen]
        service = [
            None if t.service_moved is None else t.service_moved - t.promoted for t in chosen
        ]
        slices = [None if t.slice_moved is None else t.slice_moved - t.promoted for t in chosen]
        rules = [
            None
            if t.rules_moved is None or t.slice_moved is None
            else t.rules_moved - t.slice_moved
            for t in chosen
        ]
        lines.append(
            f"| {label} | {len(chosen)} | {_spread(promo)} | {_spread(service)} | "
            f"{_spread(slices)} | {_spread(rules)} |"
        )
    return lines


def client_table(
    runs: Sequence[tuple[Timeline, Sequence[ClientFigures]]], writers: Sequence[str]
) -> list[str]:
    """Per kind and client path: downtime, its part after promotion, and the routing's faults."""
    lines = [
        "| failover | client path | n | downtime p50 / p95 / max (s) | after promotion p50 / "
        "p95 / max (s) | longest write gap p50 / max (s) | failed writes (by outcome) | "
        "read-only after the slice / the rules moved | most conns on the old leader after the "
        "rules moved (at window end) | commits on a non-leader |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, label in KIND_LABELS.items():
        chosen = [(t, figures) for t, figures in runs if t.kind == kind]
        if not chosen:
            continue
        for writer in writers:
            mine = [f for _, figures in chosen for f in figures if f.writer == writer]
            if not mine:
                continue
            failed: Counter[str] = Counter()
            for figure in mine:
                failed.update(figure.failed)
            gaps = [f.longest_gap for f in mine if f.longest_gap is not None]
            gap = f"{statistics.median(gaps):.2f} / {max(gaps):.2f}" if gaps else "–"
            lines.append(
                f"| {label} | {writer} | {len(mine)} | {_spread([f.downtime for f in mine])} | "
                f"{_spread([f.after_promotion for f in mine])} | {gap} | "
                f"{', '.join(f'{k} {v}' for k, v in sorted(failed.items())) or '0'} | "
                f"{sum(f.read_only_after_slice for f in mine)} / "
                f"{sum(f.read_only_after_rules for f in mine)} | "
                f"{max(f.on_old_after_rules for f in mine)} "
                f"({sum(f.on_old_at_end for f in mine)}) | "
                f"{sum(f.misplaced_commits for f in mine)} |"
            )
    return lines
