"""Write the Helm chart ``charts/pg-failover-hook/`` from ``deploy/``, so the two cannot drift.

    python -m ops.chart            # rewrite the chart from deploy/ (after any change there)
    python -m ops.chart --check    # exit 1 if the chart on disk is not what deploy/ makes

The command line of :mod:`ops.chart` (why generated, and how: there).
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from ops.chart.files import chart_files, differences, write
from ops.chart.variants import CHART


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.chart", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the chart is stale")
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument("--chart", type=Path, default=CHART)
    args = parser.parse_args(argv)
    files = chart_files(args.kubectl)
    if args.check:
        found = differences(files, args.chart)
        for line in found:
            out(line)
        if found:
            out(f"{args.chart} is stale: run `python -m ops.chart` and commit the result")
            return 1
        out(f"{args.chart}: up to date with deploy/ ({len(files)} files)")
        return 0
    write(files, args.chart)  # only after every file was made: a failed run changes nothing
    out(f"wrote {args.chart} ({len(files)} files)")
    return 0
