"""The byte budget of request bodies (hooks/shell/budget.py): what bounds a pod's memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from hooks.shell import app as app_module
from hooks.shell.app import create_app
from hooks.shell.budget import ByteBudget
from hooks.shell.config import HookSettings
from tests.helpers import NO_AUTH, NOW, fixture


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


def test_a_call_that_finds_no_room_gets_429_with_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Busy is a 429 with ``Retry-After``: Metacontroller requeues it after that many seconds
    (``AddAfter``) without growing the parent's backoff, where a 5xx would grow it
    (``AddRateLimited``, 5 ms doubling to 1000 s). Nothing is read, nothing changes."""

    class NoRoom(ByteBudget):
        @contextmanager
        def held(self, size: int, timeout: float) -> Iterator[bool]:
            yield False

    monkeypatch.setattr(app_module, "ByteBudget", NoRoom)
    client = create_app(settings=HookSettings(auth=NO_AUTH), clock=lambda: NOW).test_client()
    response = client.post("/sync", json=fixture("sync-service-selects-old-leader.json"))
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "1"
    assert "busy" in response.get_json()["error"]
