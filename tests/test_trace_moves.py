"""How often one sync moves from one ``hooks`` module to another: the reading path, measured.

A reader who follows one sync request through the code goes where the code goes. So the
number of moves between modules is a measure of how readable the path is: every move is a
file to open, every return to a module already left is a file opened again. The layered
folders and the typed observed state set out to halve it (CONTRIBUTING.md, "Following one
sync", has the figures before and after and this command)::

    .venv/bin/python -m tests.test_trace_moves

traces :func:`hooks.shell.handler.handle_sync` on the recorded request
``sync-service-selects-old-leader.json`` (the leader moved: every part plans) with
``sys.setprofile``: at every call and return, the module of the innermost frame that is in
``hooks/`` is where the reader is; a *stop* is a run of events in one module, a *move* the
step from one stop to the next, a *return* a stop in a module visited before. Frames outside
``hooks/`` (the standard library, marshmallow, the test's fake prober) are not stops: the
reader stays in the hooks module that called them. Nor is a property of a hooks class
(``member.reachable``): that is reading an attribute of a value, which is what a reader
does without opening its module.

The test fails when the moves grow past the figure CONTRIBUTING.md records, so the path
cannot silently get longer again.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import hooks
from hooks.shell.config import HookSettings
from hooks.shell.handler import Deps, handle_sync
from tests.child_helpers import answer
from tests.helpers import NO_AUTH, NOW, P0, P1, P2, FakeProber, fixture

HOOKS = Path(hooks.__file__).resolve().parent
CONTRIBUTING = HOOKS.parent / "CONTRIBUTING.md"
FIXTURE = "sync-service-selects-old-leader.json"


@dataclass(frozen=True, slots=True)
class Trace:
    """The stops of one traced sync, in order (a module name each)."""

    stops: tuple[str, ...]

    @property
    def moves(self) -> int:
        return max(len(self.stops) - 1, 0)

    @property
    def modules(self) -> int:
        return len(set(self.stops))

    @property
    def returns(self) -> int:
        """Stops in a module the path had already left."""
        return sum(1 for i, m in enumerate(self.stops) if m in self.stops[:i])

    def summary(self) -> str:
        return (
            f"{len(self.stops)} stops in {self.modules} modules, {self.moves} moves, "
            f"{self.returns} returns to a module already left"
        )


def _properties() -> frozenset[CodeType]:
    """The code of every property getter of a class in a loaded hooks module."""
    codes = set()
    for name, module in list(sys.modules.items()):
        if name != "hooks" and not name.startswith("hooks."):
            continue
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == name:
                for attribute in vars(value).values():
                    if isinstance(attribute, property) and attribute.fget is not None:
                        codes.add(attribute.fget.__code__)
    return frozenset(codes)


def _module(frame: FrameType | None, skip: frozenset[CodeType] = frozenset()) -> str | None:
    """The hooks module of the innermost frame in hooks/ (not a property getter), if any."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(HOOKS) and frame.f_code not in skip:
            parts = path.resolve().relative_to(HOOKS.parent).with_suffix("").parts
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        frame = frame.f_back
    return None


@contextmanager
def _traced(stops: list[str]) -> Iterator[None]:
    skip = _properties()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            where = _module(frame, skip)
        elif event == "return":
            where = _module(frame.f_back, skip)
        else:
            return
        if where is not None and (not stops or stops[-1] != where):
            stops.append(where)

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def trace_sync() -> Trace:
    """One recorded sync through ``handle_sync``, traced (a fresh body, a fixed clock)."""
    answers = {P0: answer(P0), P1: answer(P1, "primary"), P2: answer(P2)}
    deps = Deps(HookSettings(auth=NO_AUTH), FakeProber(answers), lambda: NOW)
    body = fixture(FIXTURE)
    handle_sync(deps, fixture(FIXTURE), request_id="warm", started=time.perf_counter())
    stops: list[str] = []
    with _traced(stops):
        reply = handle_sync(deps, body, request_id="trace", started=time.perf_counter())
    assert reply.status == 200, reply.body
    return Trace(tuple(stops))


def documented_after() -> int:
    """The "after" move count CONTRIBUTING.md records."""
    match = re.search(r"after: (\d+) moves", CONTRIBUTING.read_text())
    assert match, "CONTRIBUTING.md, 'Following one sync', records no 'after: N moves'"
    return int(match[1])


def test_one_sync_makes_no_more_moves_than_documented() -> None:
    trace = trace_sync()
    assert trace.moves <= documented_after(), trace.summary() + "\n" + " -> ".join(trace.stops)


def test_the_trace_sees_the_path_through_the_core() -> None:
    stops = set(trace_sync().stops)
    assert {"hooks.shell.handler", "hooks.sync"} <= stops, stops


if __name__ == "__main__":
    result = trace_sync()
    print(result.summary())
    if sys.argv[1:] == ["-v"]:
        print(" -> ".join(result.stops))
