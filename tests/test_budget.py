"""The byte budget of request bodies (hooks/shell/budget.py): what bounds a pod's memory."""

from __future__ import annotations

import threading
import time

import pytest

from hooks.shell.budget import ByteBudget


def test_requests_within_the_budget_run_together() -> None:
    budget = ByteBudget(100)
    with budget.held(40, 0) as first, budget.held(60, 0) as second:
        assert (first, second, budget.used) == (True, True, 100)
    assert budget.used == 0


def test_a_request_that_does_not_fit_waits_for_one_to_end() -> None:
    budget = ByteBudget(100)
    released = threading.Event()
    waited: list[float] = []

    def second() -> None:
        started = time.monotonic()
        with budget.held(60, 5.0) as granted:
            assert granted
            assert released.is_set()
            waited.append(time.monotonic() - started)

    with budget.held(60, 0):
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.1)
        assert budget.used == 60  # the second one is waiting, holding nothing
        released.set()
    thread.join(timeout=5)
    assert waited and waited[0] >= 0.1
    assert budget.used == 0


def test_not_granted_within_the_timeout_holds_nothing() -> None:
    budget = ByteBudget(100)
    with budget.held(100, 0):
        with budget.held(1, 0.05) as granted:
            assert not granted
        assert budget.used == 100
    assert budget.used == 0


def test_a_body_larger_than_the_budget_runs_alone() -> None:
    budget = ByteBudget(100)
    with budget.held(10_000, 0) as granted:
        assert granted and budget.used == 100


def test_the_budget_is_released_when_the_request_fails() -> None:
    budget = ByteBudget(100)
    with pytest.raises(RuntimeError), budget.held(70, 0):
        raise RuntimeError("a bug in the request")
    assert budget.used == 0
    with pytest.raises(ValueError):
        ByteBudget(0)
