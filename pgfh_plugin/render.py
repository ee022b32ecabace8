"""``kubectl pgfh status`` as text: the report of :mod:`pgfh_plugin.report`, rendered (pure).

One section per part of the cluster (the primary, members, conditions, read-only endpoints,
backups), each a list of lines. Colour comes from a :class:`~pgfh_plugin.style.Style`, which
is a no-op when the output is not a terminal, so tables are padded on the plain text and stay
aligned either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pgfh_plugin.report import LEADER_ROLES
from pgfh_plugin.style import Style, plain

Paint = Callable[[str], str]


def render(reports: Iterable[Mapping[str, Any]], style: Style) -> str:
    """The human-readable report of each cluster, separated by a blank line."""
    return "\n\n".join(_render_one(r, style) for r in reports) + "\n"


def _render_one(report: Mapping[str, Any], style: Style) -> str:
    lines = [style.bold(f"PostgreSQLCluster {report['namespace']}/{report['name']}")]
    lines += _summary(report, style)
    lines += ["", *_members(report, style)]
    lines += ["", *_conditions(report.get("conditions") or [], style)]
    lines += ["", *_read_only(report.get("readOnly"), style)]
    lines += ["", *_backups(report.get("backup"), style)]
    return "\n".join(lines)


def _summary(report: Mapping[str, Any], style: Style) -> list[str]:
    """Primary, Service, Ready, and a note when the status is for an older spec."""
    s = style
    ready = report.get("ready")
    primary = report.get("primary")
    timeline = report.get("timeline")
    confirmed = bool(ready and ready.get("status") == "True")
    if not primary:
        primary_text = s.bad("none")
    elif confirmed:
        primary_text = s.bold(s.good(primary))
    else:
        primary_text = s.bold(s.warn(primary))
    if primary and timeline is not None:
        primary_text += f" (timeline {timeline})"
    if primary and not confirmed:
        primary_text += s.warn(" kept by the Service, not confirmed as leader now (see Ready)")
    fields = [
        ("Primary", primary_text),
        ("Service", str(report.get("service") or "?")),
    ]
    if ready:
        fields.append(
            (
                "Ready",
                s.condition(ready["status"], f"{ready['status']} ({ready['reason'] or '-'})"),
            )
        )
        if ready.get("message"):
            fields.append(("", str(ready["message"])))
    else:
        fields.append(("Ready", s.warn("unknown (no Ready condition in the status)")))
    generation, observed = report.get("generation"), report.get("observedGeneration")
    if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
        fields.append(
            ("Note", s.warn(f"the status is for generation {observed}, the spec is {generation}"))
        )
    return [f"{label + ':' if label else '':<10}{value}" for label, value in fields]


def _members(report: Mapping[str, Any], style: Style) -> list[str]:
    """The member table, then what is not known about the members and why."""
    s = style
    answered = report.get("membersAnswered")
    lines = [s.bold("Members") + (f" ({answered} answered as Patroni)" if answered else "")]
    rows = [["NAME", "ROLE", "STATE", "TL", "LAG", "REACHABLE", "POD", "IP", "NODE"]]
    styles: list[list[Paint]] = [[s.dim] * 9]
    for m in report["members"]:
        pod = m.get("pod")
        reach = {True: "yes", False: "no", None: "?"}[m.get("reachable")]
        rows.append(
            [
                m["name"] + (" *" if m.get("primary") else ""),
                m.get("role") or "?",
                m.get("state") or "?",
                "?" if m.get("timeline") is None else str(m["timeline"]),
                _lag_text(m["lag"]),
                reach,
                _pod_text(pod) if report.get("podsRead", True) else "?",
                (pod or {}).get("ip") or "-",
                (pod or {}).get("node") or "-",
            ]
        )
        styles.append(
            [
                s.bold if m.get("primary") else plain,
                s.good if m.get("role") in LEADER_ROLES else plain,
                plain,
                plain,
                plain,
                {True: s.good, False: s.bad, None: s.warn}[m.get("reachable")],
                s.good if pod and pod["ready"] and not pod["terminating"] else s.warn,
                plain,
                plain,
            ]
        )
    if len(rows) == 1:
        lines.append(s.warn("  no member in the status and no Pod matches spec.primarySelector"))
    else:
        lines += _table(rows, styles)
        lines.append(
            s.dim(
                "  * the pod the primary Service selects. LAG: measured now with --lag; "
                "≤ N: listed by the read-only Service within maxLagBytes."
            )
        )
    if report.get("membersNote"):
        lines.append(s.warn(f"  Note: {report['membersNote']}"))
    reasons = [f"{m['name']}: {m['reason']}" for m in report["members"] if m.get("reason")]
    if reasons:
        lines.append(s.warn(f"  Not answering as Patroni: {'; '.join(reasons)}"))
    lag_errors = [
        f"{m['name']}: {m['lag']['error']}" for m in report["members"] if m["lag"].get("error")
    ]
    if lag_errors:
        lines.append(s.warn(f"  Lag not measured for {'; '.join(lag_errors)}"))
    return lines


def _conditions(conditions: list[Mapping[str, Any]], style: Style) -> list[str]:
    s = style
    lines = [s.bold("Conditions")]
    if not conditions:
        lines.append(s.warn("  none: the hook has not answered a sync for this cluster yet"))
        return lines
    rows = [["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"]]
    styles: list[list[Paint]] = [[s.dim] * 5]
    for c in conditions:
        rows.append(
            [
                c["type"],
                c["status"],
                c.get("reason") or "-",
                c.get("lastTransitionTime") or "-",
                c.get("message") or "",
            ]
        )
        styles.append([plain, _condition_paint(s, c["status"]), plain, plain, plain])
    return lines + _table(rows, styles)


def _condition_paint(style: Style, status: str) -> Paint:
    """The STATUS cell's colour, bound to that row's status."""
    return lambda text: style.condition(status, text)


def _read_only(read_only: Mapping[str, Any] | None, style: Style) -> list[str]:
    s = style
    lines = [s.bold("Read-only endpoints")]
    if read_only is None:
        lines.append(s.dim("  no read-only Service (spec.replicaService is not set)"))
        return lines
    limit = read_only.get("maxLagBytes")
    notes = [f"maxLagBytes {format_bytes(limit)}"] if isinstance(limit, int) else []
    notes.append(f"whenNoReplica {read_only['whenNoReplica']}")
    if read_only.get("consistency") not in (None, "lag"):
        notes.append(f"consistency {read_only['consistency']}")
    if read_only.get("trafficDistribution"):
        notes.append(f"trafficDistribution {read_only['trafficDistribution']}")
    lines.append(f"  Service {read_only['service']} ({', '.join(notes)})")
    if read_only["endpoints"]:
        for e in read_only["endpoints"]:
            level = f"  sync_state {e['level']}" if e.get("level") else ""
            if "zone" in e:
                level += f"  zone {e['zone'] or '- (no zone label: no hints)'}"
            lines.append(f"  {e['pod']:<24} {e.get('ip') or '- (no Pod IP)'}{level}")
    else:
        lines.append(s.warn("  no endpoints: the read-only Service routes nowhere"))
    return lines


def _backups(backup: Mapping[str, Any] | None, style: Style) -> list[str]:
    s = style
    lines = [s.bold("Backups")]
    if backup is None:
        lines.append(s.dim("  no scheduled backups (spec.backup is not set)"))
        return lines
    cron = backup.get("cronJob") or "?"
    schedule = backup.get("schedule")
    lines.append(f"  CronJob {cron}" + (f" ({schedule})" if schedule else ""))
    ok, failed = backup.get("lastSuccessful"), backup.get("lastFailed")
    lines.append(
        "  Last successful: "
        + (s.good(f"{ok['completionTime']} (Job {ok['job']})") if ok else s.warn("none yet"))
    )
    if failed:
        lines.append(
            "  Last failed:     "
            + s.bad(f"{failed['failureTime']} (Job {failed['job']}, {failed['reason']})")
        )
    else:
        lines.append("  Last failed:     none")
    return lines


# ------------------------------------------------------------------ cells and columns


def format_bytes(value: int) -> str:
    """``16 MiB``, ``512 KiB``, ``100 B``: a configured limit, in the units the hook's own
    messages use (exact, so ``16 MiB`` in the spec reads back as ``16 MiB``)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} B"


def human_bytes(value: int) -> str:
    """A measured lag: ``0 B``, ``512 B``, ``12.0 KiB``, ``64.0 MiB``."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{value} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _lag_text(lag: Mapping[str, Any]) -> str:
    if lag.get("source") == "leader":
        return "-"
    if isinstance(lag.get("bytes"), int):
        return human_bytes(lag["bytes"])
    within = lag.get("withinBytes")
    return f"≤ {format_bytes(within)}" if isinstance(within, int) else "?"


def _pod_text(pod: Mapping[str, Any] | None) -> str:
    if pod is None:
        return "no Pod"
    if pod["terminating"]:
        return "Terminating"
    if pod["ready"]:
        return "Ready"
    return f"{pod.get('phase') or '?'}, not Ready"


def _table(rows: list[list[str]], styles: list[list[Paint]]) -> list[str]:
    """Left-aligned columns, padded on the plain text so colour codes do not skew them."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row, row_styles in zip(rows, styles, strict=True):
        cells = []
        for i, (cell, paint) in enumerate(zip(row, row_styles, strict=True)):
            pad = "" if i == len(row) - 1 else " " * (widths[i] - len(cell))
            cells.append(paint(cell) + pad)
        out.append("  " + "  ".join(cells).rstrip())
    return out
