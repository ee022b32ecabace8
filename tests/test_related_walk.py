"""The pure parts of ``testbed/bench/related_walk.py`` (the churn's timeline, in
``related_walk_figures.py``), without a control plane."""

from __future__ import annotations

from testbed.bench.related_walk_figures import metrics_url, timeline_lines


def _point(t: float, patches: int, mc: float) -> tuple[float, int, dict[str, float]]:
    return (
        t,
        patches,
        {
            "mc_cpu": mc,
            "bench_cpu": t * 0.2,
            "load1": 3.0,
            "go_gc_duration_seconds_count": t,
            "go_gc_duration_seconds_sum": t / 1000,
            "go_goroutines": 40,
        },
    )


def test_each_slice_has_its_rates_and_the_tail_of_its_own_probes() -> None:
    timeline = [
        _point(float(t), 100 * t, 0.5 * t if t < 10 else 5 + 0.9 * (t - 10)) for t in range(25)
    ]
    lines = timeline_lines(timeline, offsets=[1.0, 12.0, 13.0], lags=[0.1, 2.0, 0.3])
    assert len(lines) == 2  # 0-10 and 10-20; 20-24 is shorter than a slice
    first, second = lines
    assert first.startswith("  0.0- 10.0 s: patches   100/s, MC 0.50 core")
    assert "probes 1 lag max 0.100 s" in first
    assert "MC 0.90 core" in second and "probes 2 lag max 2.000 s" in second
    assert "GC 10 cycles 10.0 ms paused" in second


def test_a_slice_without_probes_says_so() -> None:
    (line,) = timeline_lines([_point(0.0, 0, 0.0), _point(10.0, 50, 1.0)], [], [])
    assert "probes 0 lag max nan s" in line and "patches     5/s" in line


def test_metrics_url_comes_from_the_binarys_own_argument() -> None:
    assert metrics_url(["--workers=64", "--metrics-address=127.0.0.1:4321"]) == (
        "http://127.0.0.1:4321/metrics"
    )
    assert metrics_url(["--workers=64"]) is None


def test_the_api_servers_share_is_shown_per_slice() -> None:
    (line,) = timeline_lines(
        [_point(0.0, 0, 0.0), _point(10.0, 50, 1.0)], [1.0, 2.0], [3.0, 0.2], [2.5, 0.01]
    )
    assert line.endswith("probes 2 lag max 3.000 s (PATCH answered within 2.500 s)")
