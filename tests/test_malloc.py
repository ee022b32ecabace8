"""The malloc arena cap of each worker (hooks/shell/malloc.py); its effect is measured by
testbed/bench/memory.py (the figures are in testbed/bench/README.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hooks.shell import gunicorn_conf
from hooks.shell.malloc import limit_arenas


def test_the_cap_is_set_with_mallopt_in_a_fresh_process() -> None:
    code = "from hooks.shell.malloc import limit_arenas; print(limit_arenas())"
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "True"


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas() is False


def test_every_worker_caps_its_arenas_after_the_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[int] = []
    monkeypatch.setattr(gunicorn_conf, "limit_arenas", lambda: called.append(1) or True)
    gunicorn_conf.post_fork(None, None)
    assert called == [1]
