"""Unit tests of :mod:`hooks.loaders.observed`: each observed object's typed value, field by field.

The pipeline tests (tests/test_sync_*.py, test_replicas_*.py, test_backup.py, test_reply_bytes.py)
read these values through the decisions; here every attribute is pinned on its own: the name
each value carries, the last-applied record every kind of child keeps, and what free input
that is not of the expected type becomes (``None``, never the junk itself).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hooks.domain.model import LAST_APPLIED_ANNOTATION
from hooks.domain.observed import CronJobChild, PreviousMember, ServiceChild, SliceChild
from hooks.loaders.observed import load_child, load_jobs, load_pod
from hooks.loaders.previous_status import load_previous_status


def _applied(kind: str, api_version: str, name: str) -> dict[str, Any]:
    """An object with a usable last-applied record of itself."""
    record = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "annotations": {LAST_APPLIED_ANNOTATION: json.dumps(record)}},
    }


@pytest.mark.parametrize(
    ("group", "kind", "api_version", "value"),
    [
        ("Service.v1", "Service", "v1", ServiceChild),
        ("EndpointSlice.discovery.k8s.io/v1", "EndpointSlice", "discovery.k8s.io/v1", SliceChild),
        ("CronJob.batch/v1", "CronJob", "batch/v1", CronJobChild),
        ("ConfigMap.v1", "ConfigMap", "v1", None),
    ],
)
def test_every_kind_of_child_keeps_its_name_group_and_last_applied_record(
    group: str, kind: str, api_version: str, value: type | None
) -> None:
    obj = _applied(kind, api_version, "x")
    child = load_child(group, "x", obj)
    assert (child.group, child.name) == (group, "x")
    assert child.last_applied == {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "x"},
    }
    assert child.raw == obj
    if value is not None:
        assert type(child) is value


def test_a_pod_is_named_by_its_key_and_keeps_only_a_text_uid() -> None:
    pod = load_pod("Pod.v1", "p", {"metadata": {"name": "p", "uid": "u-1"}})
    assert (pod.name, pod.uid) == ("p", "u-1")
    assert load_pod("Pod.v1", "p", {"metadata": {"name": "p", "uid": 7}}).uid is None


def test_a_container_port_is_an_integer_never_a_boolean_or_a_float_and_the_first_wins() -> None:
    """JSON's ``true`` is an ``int`` to Python: it must not become port 1."""
    ports = [
        {"name": "patroni", "containerPort": True},
        {"name": "postgresql", "containerPort": 5432.0},
        {"name": "api", "containerPort": 8008},
        {"name": "api", "containerPort": 9008},
        {"name": 7, "containerPort": 7},
    ]
    obj = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "ports": ports}]}}
    assert dict(load_pod("Pod.v1", "p", obj).container_ports) == {"api": 8008}


def test_a_selector_that_is_not_an_object_is_none() -> None:
    service = {"metadata": {"name": "s"}, "spec": {"selector": ["app"]}}
    loaded = load_child("Service.v1", "s", service)
    assert isinstance(loaded, ServiceChild)
    assert loaded.selector is None


def test_a_jobs_name_and_its_end() -> None:
    job = {
        "metadata": {"name": "j", "labels": {"a": "b"}},
        "status": {
            "completionTime": "2026-08-20T02:31:00Z",
            "conditions": [{"type": "Complete", "status": "True"}],
        },
    }
    (loaded,) = load_jobs("Job.batch/v1", {"j": job}).values()
    assert (loaded.name, dict(loaded.labels)) == ("j", {"a": "b"})
    assert loaded.finished is not None
    assert (loaded.finished.kind, loaded.finished.when) == ("Complete", "2026-08-20T02:31:00Z")


def test_a_cronjobs_requests_and_limits_keep_their_text_quantities_only() -> None:
    container = {
        "name": "basebackup",
        "resources": {"requests": {"cpu": "500m", "memory": 1}, "limits": {"memory": "1Gi"}},
    }
    cronjob = {
        "metadata": {"name": "c"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [container]}}}}},
    }
    loaded = load_child("CronJob.batch/v1", "c", cronjob)
    assert isinstance(loaded, CronJobChild)
    assert loaded.container_resources == {
        "basebackup": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    }


def test_a_previous_condition_without_a_text_status_is_not_kept() -> None:
    status = {"conditions": [{"type": "Ready", "status": True, "reason": "LeaderFound"}]}
    (condition,) = load_previous_status(status).conditions
    assert (condition.status, condition.reason, condition.condition) == (None, "LeaderFound", None)


def test_a_previous_backup_cronjob_that_is_not_text_is_none() -> None:
    assert load_previous_status({"backup": {"cronJob": 5}}).backup.cron_job is None
    assert load_previous_status({"backup": {"cronJob": "c"}}).backup.cron_job == "c"


def test_previous_members_keep_their_order_and_each_typed_field() -> None:
    status = {
        "members": [
            {"name": "pg-1", "reachable": True, "role": "primary"}
            | {"state": "running", "timeline": 4},
            {"name": "pg-0", "reachable": False, "reason": "connection refused"},
        ]
    }
    assert load_previous_status(status).members == (
        PreviousMember("pg-1", reachable=True, role="primary", state="running", timeline=4),
        PreviousMember("pg-0", reachable=False, reason="connection refused"),
    )


@pytest.mark.parametrize(
    "junk",
    [
        {"reachable": "yes"},
        {"reachable": 1},
        {"role": 7},
        {"role": ""},
        {"state": ["running"]},
        {"state": ""},
        {"timeline": True},
        {"timeline": "4"},
        {"timeline": 4.0},
        {"reason": {"why": "x"}},
        {"reason": ""},
    ],
)
def test_a_previous_member_field_of_the_wrong_type_is_none(junk: dict[str, Any]) -> None:
    (member,) = load_previous_status({"members": [{"name": "pg-0", **junk}]}).members
    assert member == PreviousMember("pg-0")


@pytest.mark.parametrize(
    "members",
    [None, "pg-0", {"name": "pg-0"}, [None, 3, "pg-0", {"name": 5}, {"role": "primary"}]],
)
def test_previous_members_without_a_text_name_are_left_out(members: object) -> None:
    assert load_previous_status({"members": members}).members == ()


def test_no_previous_status_has_no_members() -> None:
    assert load_previous_status(None).members == ()
    assert load_previous_status([{"name": "pg-0"}]).members == ()


# ------------------------------------------ JSON inside annotations: one bounded parser


def _member_json(depth: int) -> str:
    """Patroni's member JSON whose deepest value nests ``depth`` levels in all."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return '{"role":"master","state":"running","x":' + inner + "}"


def test_a_status_annotation_at_the_depth_limit_is_read_one_deeper_is_ignored() -> None:
    from hooks.loaders.jsonbody import MAX_JSON_DEPTH
    from hooks.loaders.observed import load_pod

    def role(text: str) -> str | None:
        obj = {"metadata": {"name": "p", "annotations": {"status": text}}}
        return load_pod("Pod.v1", "p", obj).status_role

    assert role(_member_json(MAX_JSON_DEPTH)) == "primary"
    assert role(_member_json(MAX_JSON_DEPTH + 1)) is None
    assert role(_member_json(50_000)) is None  # over the size cap as well
    assert role('{"role":"master","state":NaN}') is None


def test_bounded_loads_refuses_by_rule_with_a_message() -> None:
    from hooks.loaders.jsonbody import JsonRefused, bounded_loads

    assert bounded_loads('{"a":[1]}', max_bytes=9, max_depth=2) == {"a": [1]}
    for text, limit, message in [
        ('{"a":[1]}', 8, "is larger than 8 bytes"),
        ("[" * 3 + "]" * 3, 100, "nests deeper than 2 levels"),
        ("[[]", 100, "is not valid JSON: its brackets do not balance"),
        ("[NaN]", 100, "is not valid JSON: NaN is not JSON"),
        (b"\xff", 100, "is not"),
        ("\ud800", 100, "is not"),
    ]:
        with pytest.raises(JsonRefused) as refused:
            bounded_loads(text, max_bytes=limit, max_depth=2)
        assert str(refused.value) == message or (
            message == "is not" and str(refused.value).startswith(("is not UTF-8", "is not valid"))
        )


def test_bounded_loads_turns_the_parsers_own_recursion_limit_into_a_refusal() -> None:
    """With a depth limit set past Python's recursion limit (a caller's mistake), the parser's
    RecursionError still becomes the same kind of refusal, never an exception of its own."""
    from hooks.loaders.jsonbody import JsonRefused, bounded_loads

    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(JsonRefused) as refused:
        bounded_loads(deep, max_bytes=1_000_000, max_depth=1_000_000)
    assert str(refused.value) == "nests too deeply"
