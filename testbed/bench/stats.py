"""The order statistics the failover and load benchmarks print (pure).

One definition, so that a p95 in one table means what it means in the next: the nearest rank
with the index rounded (``q`` in 0..1), NaN for no values. (The fleet benchmarks keep their own
nearest-rank percentiles, documented where they are defined, so that their published figures
stay comparable run to run.)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def p50_p95_max(values: Sequence[float], digits: int = 3) -> str:
    """``p50 / p95 / max`` of ``values`` (at least one), each with ``digits`` decimals."""
    figures = (statistics.median(values), percentile(values, 0.95), max(values))
    return " / ".join(f"{v:.{digits}f}" for v in figures)
