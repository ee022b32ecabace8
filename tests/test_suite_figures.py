"""The README's test figures come from a run (``tests/suite_figures.py``) and cannot go stale
silently: the count it states is checked against what pytest collects now."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import suite_figures
from tests.suite_figures import BEGIN, END, TOLERANCE, Figures

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="1" failures="2" skipped="7" tests="2127" time="362.480"
 timestamp="2026-12-01T21:04:05.123456+00:00" hostname="h"><testcase classname="a" name="b"/>
</testsuite></testsuites>"""


def test_the_figures_are_read_from_the_junit_file() -> None:
    figures = suite_figures.from_junit(JUNIT)
    assert figures == Figures("2026-12-01", 2127, 2117, 7, 3, 362)
    assert figures.line() == (
        "pytest in `make test` on 2026-12-01: **2,127 tests** (2,117 passed, 7 skipped, "
        "3 failed) in **6 min 2 s**."
    )


def test_rewrite_replaces_only_the_block_and_reads_back() -> None:
    text = f"before\n{BEGIN}\nold words\n{END}\nafter\n"
    figures = Figures("2026-12-02", 1500, 1500, 0, 0, 59)
    new = suite_figures.rewrite(text, figures)
    assert new == f"before\n{BEGIN}\n{figures.line()}\n{END}\nafter\n"
    assert suite_figures.stated(new) == 1500
    with pytest.raises(ValueError, match="not the line this script writes"):
        suite_figures.stated(text)
    with pytest.raises(ValueError, match="exactly one"):
        suite_figures.rewrite("no markers", figures)


def test_the_command_writes_the_readme(tmp_path: Path) -> None:
    junit, readme = tmp_path / "junit.xml", tmp_path / "README.md"
    junit.write_text(JUNIT, encoding="utf-8")
    readme.write_text(f"x\n{BEGIN}\n{END}\n", encoding="utf-8")
    assert suite_figures.main([str(junit), str(readme)]) == 0
    assert suite_figures.stated(readme.read_text(encoding="utf-8")) == 2127
    assert suite_figures.main([str(tmp_path / "missing.xml"), str(readme)]) == 2


def test_the_readme_states_no_test_figure_outside_the_written_block() -> None:
    text = README.read_text(encoding="utf-8")
    before, rest = text.split(BEGIN, 1)
    outside = before + rest.split(END, 1)[1]
    typed = re.findall(r"\b\d[\d,]* tests\b", outside)
    assert typed == [], f"test counts typed by hand go stale; state them in the block: {typed}"


@pytest.mark.slow
def test_the_readme_count_is_within_tolerance_of_the_suite_as_it_is() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    ).stdout
    match = re.search(r"^(\d+) tests collected", out, re.MULTILINE)
    assert match, out[-2000:]
    collected = int(match.group(1))
    stated = suite_figures.stated(README.read_text(encoding="utf-8"))
    assert abs(collected - stated) <= TOLERANCE * stated, (
        f"the README states {stated} tests, the suite has {collected}: run `make test` and "
        "`make readme-figures`"
    )
