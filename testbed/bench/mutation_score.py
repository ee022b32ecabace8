"""Mutation testing of the pure core, module by module, and its score (``make mutation``).

mutmut 3 (configured in pyproject.toml's ``[tool.mutmut]``) copies the tree into
``mutants/``, mutates the modules named in ``only_mutate`` and runs the fast pure tests
against each mutant. ``--run`` runs it one module at a time (``mutmut run "hooks.probe.policy.*"``,
which re-tests every mutant of the module), each run's output going to
``mutants/mutmut-<module>.log``. Then, from mutmut's verdicts in ``mutants/<path>.meta``
(read with mutmut's own exit-code table), it prints how many of each module's mutants the
tests killed. A mutant counts as killed when a test failed on it, it timed out, or the type
checker refused it; one that survived, that no test reached, or that was not run counts
against the score.

    python -m testbed.bench.mutation_score --run [--max-children 2] [--fail-under 95]
    [hooks/core/...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mutmut.stats import status_by_exit_code

#: Verdicts that mean the tests (or the type checker) noticed the mutant.
KILLED = frozenset({"killed", "timeout", "caught by type check"})
MUTANTS = Path("mutants")
#: What ``mutmut run "<module>.*"`` says (and fails on) for a module with nothing to mutate
#: (only dataclasses and protocols, e.g. hooks/children/base.py): a score of 0 of 0.
NO_MUTANTS = "Filtered for specific mutants, but nothing matches"


@dataclass(frozen=True)
class ModuleScore:
    module: str
    statuses: Counter[str]

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    @property
    def killed(self) -> int:
        return sum(n for status, n in self.statuses.items() if status in KILLED)

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def configured_modules(pyproject: Path = Path("pyproject.toml")) -> list[str]:
    """The modules ``[tool.mutmut] only_mutate`` names: the one list of the pure core."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["mutmut"]
    return list(config["only_mutate"])


def mutant_filter(module: str) -> str:
    """The ``mutmut run`` filter for one source file's mutants.

    A package's ``__init__.py`` has its mutants named after the package
    (``hooks.children.x_related_rules__mutmut_1``), so ``hooks.children.__init__.*`` would match
    nothing; ``x*`` (functions ``x_``, methods ``xǁ``) keeps it off the submodules.
    """
    dotted = module.removesuffix(".py").replace("/", ".")
    if dotted.endswith(".__init__"):
        return f"{dotted.removesuffix('.__init__')}.x*"
    return f"{dotted}.*"


def run(module: str, max_children: int) -> float:
    """``mutmut run`` over one module's mutants; the seconds it took. Raises if it failed."""
    dotted = module.removesuffix(".py").replace("/", ".")
    pattern = mutant_filter(module)
    MUTANTS.mkdir(exist_ok=True)
    log = MUTANTS / f"mutmut-{dotted}.log"
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        mutmut = str(Path(sys.executable).parent / "mutmut")
        done = subprocess.run(
            [mutmut, "run", "--max-children", str(max_children), pattern],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0 and NO_MUTANTS not in log.read_text(encoding="utf-8"):
        raise RuntimeError(f"mutmut run failed for {module} (exit {done.returncode}): see {log}")
    return time.monotonic() - started


def score(module: str, mutants_dir: Path = MUTANTS) -> ModuleScore:
    """The verdicts of one module's mutants; FileNotFoundError if mutmut has not run it."""
    meta = json.loads((mutants_dir / f"{module}.meta").read_text(encoding="utf-8"))
    codes: dict[str, int | None] = meta["exit_code_by_key"]
    return ModuleScore(module, Counter(status_by_exit_code[code] for code in codes.values()))


def table(scores: Sequence[ModuleScore]) -> str:
    lines = [f"{'module':<24} {'mutants':>8} {'killed':>7} {'score':>7}  not killed"]
    for s in scores:
        left = ", ".join(
            f"{n} {status}" for status, n in sorted(s.statuses.items()) if status not in KILLED
        )
        lines.append(f"{s.module:<24} {s.total:>8} {s.killed:>7} {s.percent:>6.1f}%  {left}")
    total = sum(s.total for s in scores)
    killed = sum(s.killed for s in scores)
    overall = 100.0 * killed / total if total else 100.0
    lines.append(f"{'all':<24} {total:>8} {killed:>7} {overall:>6.1f}%")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "modules", nargs="*", help="source files (default: [tool.mutmut] only_mutate)"
    )
    parser.add_argument("--run", action="store_true", help="run mutmut first, module by module")
    parser.add_argument("--max-children", type=int, default=2, help="mutmut's parallel tests")
    parser.add_argument(
        "--fail-under", type=float, default=0.0, help="exit 1 if a module scores below this %%"
    )
    args = parser.parse_args(argv)
    modules = args.modules or configured_modules()
    if args.run:
        started = time.monotonic()
        for module in modules:
            seconds = run(module, args.max_children)
            print(f"{module}: mutmut ran in {seconds:.0f} s", flush=True)
        print(f"all modules: {time.monotonic() - started:.0f} s\n")
    try:
        scores = [score(module) for module in modules]
    except FileNotFoundError as error:
        print(f"no mutmut results: {error.filename} (run `make mutation`)", file=sys.stderr)
        return 2
    print(table(scores))
    low = [s.module for s in scores if s.percent < args.fail_under]
    if low:
        print(f"below {args.fail_under:g} %: {', '.join(low)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
