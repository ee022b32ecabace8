"""The client downtime figures (testbed/bench/downtime_figures.py) from hand-made timelines and
records."""

from __future__ import annotations

from typing import Any

from testbed.bench.downtime_figures import Timeline, client_figures, client_table, hop_table

OLD, NEW = "127.0.0.2", "127.0.0.3"
TIMELINE = Timeline(
    "switchover",
    OLD,
    NEW,
    trigger=100.0,
    promoted=102.5,
    slice_moved=103.2,
    rules_moved=103.3,
    window_end=110.0,
    service_moved=102.6,
)


def rec(t0: float, out: str, server: str | None = None, t1: float | None = None) -> dict[str, Any]:
    return {"t0": t0, "t1": t0 + 0.01 if t1 is None else t1, "out": out, "server": server}


def test_downtime_ends_at_the_first_commit_on_the_new_leader() -> None:
    records = [
        rec(99.0, "ok", OLD),
        rec(100.5, "ok", OLD),  # a switchover: the old leader still commits for a while
        rec(101.0, "lost", OLD),
        rec(101.5, "connect"),
        rec(102.6, "read_only", OLD),  # demoted member, Service not moved yet
        rec(103.4, "ok", NEW, t1=103.45),
        rec(104.0, "ok", NEW),
    ]
    figures = client_figures(TIMELINE, "w", records, [])
    assert figures.downtime == 103.45 - 100.0
    assert figures.after_promotion == 103.45 - 102.5
    assert figures.longest_gap == 103.45 - 100.51
    assert figures.failed == {"lost": 1, "connect": 1, "read_only": 1}
    assert figures.read_only_after_slice == 0
    assert figures.misplaced_commits == 0


def test_read_only_refusals_after_the_move_and_connections_left_behind_are_counted() -> None:
    records = [
        rec(102.6, "read_only", OLD),
        rec(103.25, "read_only", OLD),  # after the slice, before the rules
        rec(104.0, "read_only", OLD),  # a kept connection still on the demoted member
        rec(105.0, "ok", NEW),
    ]
    samples = [
        (103.0, OLD, {"w": 1}),
        (103.5, OLD, {"w": 1}),  # within the grace after the rules moved: not counted
        (104.0, OLD, {"w": 1, "other": 3}),
        (104.0, NEW, {"w": 2}),
        (109.9, OLD, {}),
    ]
    figures = client_figures(TIMELINE, "w", records, samples)
    assert figures.read_only_after_slice == 2
    assert figures.read_only_after_rules == 1
    assert figures.on_old_after_rules == 1
    assert figures.on_old_at_end == 0
    assert figures.downtime == 105.01 - 100.0


def test_a_commit_on_another_member_after_the_promotion_is_misplaced_and_none_is_never() -> None:
    records = [rec(102.0, "ok", OLD), rec(103.0, "ok", OLD), rec(104.0, "connect")]
    figures = client_figures(TIMELINE, "w", records, [])
    assert figures.misplaced_commits == 1
    assert figures.downtime is None and figures.after_promotion is None


def test_tables_have_a_row_per_kind_and_client() -> None:
    figures = client_figures(TIMELINE, "w", [rec(104.0, "ok", NEW)], [])
    hops = hop_table([TIMELINE])
    assert hops[2].startswith("| planned switchover | 1 | 2.50 / 2.50 / 2.50 | 0.10 / 0.10")
    assert "| 0.70 / 0.70 / 0.70 | 0.10 / 0.10 / 0.10 |" in hops[2]
    rows = client_table([(TIMELINE, [figures])], ["w", "absent"])
    assert len(rows) == 3 and rows[2].startswith("| planned switchover | w | 1 | 4.01")
