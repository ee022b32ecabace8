"""The README's test figures, written from a pytest run's junit file (``make readme-figures``).

A count or a duration typed into the README goes stale with the next test anyone adds; so the
figures between the README's ``<!-- suite:figures -->`` markers are only ever written by this
script, from the junit XML that ``make test`` leaves in ``.run/junit.xml``, and
``tests/test_suite_figures.py`` fails once the suite's size has moved more than
:data:`TOLERANCE` away from the figure (a tolerance, so that two branches that each add a
test do not both have to rerun the whole suite to merge).

Run: ``python -m tests.suite_figures .run/junit.xml README.md``.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

BEGIN, END = "<!-- suite:figures -->", "<!-- /suite:figures -->"
#: How far (as a fraction of the figure) the suite may grow or shrink before the README's
#: figures count as stale.
TOLERANCE = 0.05
LINE = re.compile(
    r"pytest in `make test` on (?P<date>\d{4}-\d\d-\d\d): \*\*(?P<tests>[\d,]+) tests\*\* "
    r"\((?P<detail>[^)]*)\) in \*\*(?P<minutes>\d+) min (?P<seconds>\d+) s\*\*\."
)


@dataclass(frozen=True)
class Figures:
    """One pytest run, as the README states it."""

    date: str
    tests: int
    passed: int
    skipped: int
    failed: int
    seconds: int

    def line(self) -> str:
        detail = f"{self.passed:,} passed, {self.skipped:,} skipped"
        if self.failed:
            detail += f", {self.failed:,} failed"
        minutes, seconds = divmod(self.seconds, 60)
        return (
            f"pytest in `make test` on {self.date}: **{self.tests:,} tests** ({detail}) "
            f"in **{minutes} min {seconds} s**."
        )


def from_junit(xml: str) -> Figures:
    """The figures of the run a junit file records (pytest writes one ``testsuite``)."""
    root = ET.fromstring(xml)
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError("no <testsuite> in the junit file")
    tests = int(suite.get("tests", "0"))
    skipped = int(suite.get("skipped", "0"))
    failed = int(suite.get("failures", "0")) + int(suite.get("errors", "0"))
    stamp = suite.get("timestamp") or ""
    return Figures(
        date=datetime.fromisoformat(stamp).date().isoformat(),
        tests=tests,
        passed=tests - skipped - failed,
        skipped=skipped,
        failed=failed,
        seconds=round(float(suite.get("time", "0"))),
    )


def stated(readme: str) -> int:
    """The test count the README states between the markers."""
    block = _block(readme)
    match = LINE.search(block)
    if match is None:
        raise ValueError(f"the suite figures are not the line this script writes: {block!r}")
    return int(match.group("tests").replace(",", ""))


def rewrite(readme: str, figures: Figures) -> str:
    """``readme`` with the block between the markers replaced by ``figures``."""
    _block(readme)
    before, rest = readme.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n{figures.line()}\n{END}{after}"


def _block(readme: str) -> str:
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError(f"the README needs exactly one {BEGIN} … {END} block")
    return readme.split(BEGIN, 1)[1].split(END, 1)[0]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.suite_figures JUNIT_XML README", file=sys.stderr)
        return 2
    junit, readme = Path(argv[0]), Path(argv[1])
    if not junit.is_file():
        print(f"no {junit}: run `make test` first (it writes the junit file)", file=sys.stderr)
        return 2
    figures = from_junit(junit.read_text(encoding="utf-8"))
    readme.write_text(rewrite(readme.read_text(encoding="utf-8"), figures), encoding="utf-8")
    print(figures.line())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
