"""Unit tests of what :mod:`hooks.domain.model` carries beyond plain fields.

The dataclasses are exercised through every other test; tested here are the
:class:`~hooks.domain.model.Condition` value (read back from a parent's untrusted status by
:mod:`hooks.loaders.observed`, written by :func:`hooks.core.conditions.stamped` with a
``lastTransitionTime`` that moves only with ``status``) and the one source of each spec
default (:func:`~hooks.domain.model.field_default`, read by the loaders).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from hooks.core.conditions import stamped
from hooks.domain.model import (
    CONDITION_STATUSES,
    BackupSpec,
    ClusterSpec,
    Condition,
    ReplicaServiceSpec,
    RoleLabelSpec,
    SwitchoverSpec,
    field_default,
)
from hooks.loaders.envelope import load_sync_request
from hooks.loaders.previous_status import load_previous_status
from hooks.loaders.schemas import load_spec
from tests.helpers import sync_body

STAMP = "2026-11-30T21:00:00Z"
EARLIER = "2026-11-29T08:15:00Z"
READY = Condition("Ready", "True", "LeaderFound", "Routed to pg-orders-0")
REQUEST = load_sync_request(sync_body())


def as_status(
    condition: Condition, stamp: str, previous: dict[str, Any] | None = None, generation: Any = None
) -> dict[str, Any]:
    """``condition`` stamped at ``stamp`` over a parent whose status holds ``previous``."""
    request = dataclasses.replace(
        REQUEST,
        generation=generation,
        previous=load_previous_status({"conditions": [previous] if previous else []}),
    )
    now = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    (entry,) = stamped(request, now, [condition])
    return entry


def from_status(observed: dict[str, Any]) -> Condition | None:
    """The condition the loader reads back from one entry of the parent's status."""
    loaded = load_previous_status({"conditions": [observed]}).conditions
    return loaded[0].condition if loaded else None


def test_a_new_condition_is_stamped_now_with_the_generation() -> None:
    assert as_status(READY, STAMP, None, 4) == {
        "type": "Ready",
        "status": "True",
        "reason": "LeaderFound",
        "message": "Routed to pg-orders-0",
        "lastTransitionTime": STAMP,
        "observedGeneration": 4,
    }


def test_without_a_generation_none_is_written() -> None:
    assert "observedGeneration" not in as_status(READY, STAMP)


def test_the_transition_time_is_kept_while_the_status_stays() -> None:
    previous = {"type": "Ready", "status": "True", "reason": "Other", "lastTransitionTime": EARLIER}
    assert as_status(READY, STAMP, previous)["lastTransitionTime"] == EARLIER


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
    assert as_status(READY, STAMP, previous)["lastTransitionTime"] == STAMP


def test_a_condition_is_read_back_from_the_status() -> None:
    written = as_status(READY, STAMP, None, 2)
    assert from_status(written) == READY


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
    assert from_status(observed) == expected


def test_a_condition_is_a_frozen_value() -> None:
    assert Condition("Ready", "True", "LeaderFound", "Routed to pg-orders-0") == READY
    assert hash(READY) == hash(Condition("Ready", "True", "LeaderFound", "Routed to pg-orders-0"))
    with pytest.raises(AttributeError):
        READY.status = "False"  # type: ignore[misc]
    assert CONDITION_STATUSES == ("True", "False", "Unknown")


# ----------------------------------------------------------------------- defaults

BACKUP_REQUIRED = {"schedule": "@daily", "image": "pg:17", "pvcName": "b", "secretName": "s"}


def test_a_spec_that_names_only_what_is_required_gets_the_dataclass_defaults() -> None:
    """The loaders take every default from the model: a minimal spec loads into exactly
    the dataclasses built with their own defaults (nothing else can differ)."""
    spec, problems = load_spec(
        {
            "primarySelector": {"cluster-name": "pg"},
            "serviceRef": {"name": "pg-rw"},
            "replicaService": {"name": "pg-ro"},
            "backup": BACKUP_REQUIRED,
            "switchover": {"roleLabel": {"key": "spilo-role"}},
        }
    )
    assert problems == ()
    assert spec == ClusterSpec(
        primary_selector={"cluster-name": "pg"},
        service_name="pg-rw",
        replica_service=ReplicaServiceSpec("pg-ro"),
        backup=BackupSpec("@daily", "pg:17", "b", "s"),
        switchover=SwitchoverSpec(role_label=RoleLabelSpec("spilo-role")),
    )
    bare, _ = load_spec({"primarySelector": {"cluster-name": "pg"}, "serviceRef": {"name": "x"}})
    assert bare == ClusterSpec(primary_selector={"cluster-name": "pg"}, service_name="x")


def test_field_default_reads_values_and_factories_and_refuses_the_rest() -> None:
    assert field_default(ClusterSpec, "health_check_path") == "/primary"
    assert field_default(ClusterSpec, "service_labels") is dict
    with pytest.raises(LookupError, match="has no default"):
        field_default(ClusterSpec, "service_name")
    with pytest.raises(LookupError, match="no field 'nope'"):
        field_default(ClusterSpec, "nope")
