"""Unit tests of the domain values in :mod:`hooks.model` that carry behaviour.

The dataclasses are exercised through every other test; what is tested here is the
:class:`~hooks.model.Condition` value: reading one back from a parent's (untrusted)
status and writing one with a ``lastTransitionTime`` that moves only with ``status``.
"""

from __future__ import annotations

from typing import Any

import pytest

from hooks.model import CONDITION_STATUSES, Condition

STAMP = "2026-11-30T21:00:00Z"
EARLIER = "2026-11-29T08:15:00Z"
READY = Condition("Ready", "True", "LeaderFound", "Routed to pg-orders-0")


def test_a_new_condition_is_stamped_now_with_the_generation() -> None:
    assert READY.as_status(STAMP, None, 4) == {
        "type": "Ready",
        "status": "True",
        "reason": "LeaderFound",
        "message": "Routed to pg-orders-0",
        "lastTransitionTime": STAMP,
        "observedGeneration": 4,
    }


def test_without_a_generation_none_is_written() -> None:
    assert "observedGeneration" not in READY.as_status(STAMP)


def test_the_transition_time_is_kept_while_the_status_stays() -> None:
    previous = {"type": "Ready", "status": "True", "reason": "Other", "lastTransitionTime": EARLIER}
    assert READY.as_status(STAMP, previous)["lastTransitionTime"] == EARLIER


@pytest.mark.parametrize(
    "previous",
    [
        {"type": "Ready", "status": "False", "lastTransitionTime": EARLIER},
        {"type": "Ready", "status": "True"},
        {"type": "Ready", "status": "True", "lastTransitionTime": ""},
        {"type": "Ready", "status": "True", "lastTransitionTime": 1700000000},
    ],
    ids=["status-moved", "no-time", "empty-time", "time-not-text"],
)
def test_the_transition_time_moves_with_the_status_or_when_none_is_usable(
    previous: dict[str, Any],
) -> None:
    assert READY.as_status(STAMP, previous)["lastTransitionTime"] == STAMP


def test_a_condition_is_read_back_from_the_status() -> None:
    written = READY.as_status(STAMP, None, 2)
    assert Condition.from_status(written) == READY


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ({"type": "Ready", "status": "Unknown"}, Condition("Ready", "Unknown", "", "")),
        (
            {"type": "Ready", "status": "False", "reason": 7, "message": None},
            Condition("Ready", "False", "7", "None"),
        ),
        ({"type": "Ready"}, None),
        ({"type": "Ready", "status": True}, None),
        ({"type": 3, "status": "True"}, None),
        ({}, None),
    ],
)
def test_only_a_text_type_and_status_make_a_condition(
    observed: dict[str, Any], expected: Condition | None
) -> None:
    assert Condition.from_status(observed) == expected


def test_a_condition_is_a_frozen_value() -> None:
    assert Condition("Ready", "True", "LeaderFound", "Routed to pg-orders-0") == READY
    assert hash(READY) == hash(Condition("Ready", "True", "LeaderFound", "Routed to pg-orders-0"))
    with pytest.raises(AttributeError):
        READY.status = "False"  # type: ignore[misc]
    assert CONDITION_STATUSES == ("True", "False", "Unknown")
