"""The pure parts of the stand-in against the real API server: Metacontroller's dynamic-apply
merge (pkg/dynamic/apply/apply.go, manage_children.go ApplyUpdate), label selectors, the work
queue, the webhook timeout and Retry-After, the loopback CompositeController and the real
binary's arguments."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from testbed.metacontroller.apply import LAST_APPLIED
from testbed.metacontroller.dynamic_apply import (
    apply_update,
    detect_list_map_key,
    for_create,
    merge,
)
from testbed.metacontroller.kube import resync_periods
from testbed.metacontroller.kube_claim import rule_matches
from testbed.metacontroller.kube_hooks import parse_duration, retry_after
from testbed.metacontroller.kube_setup import local_controller
from testbed.metacontroller.metacontroller_binary import command_args
from testbed.metacontroller.selectors import matches
from testbed.metacontroller.workqueue import WorkQueue

PARENT = {
    "apiVersion": "adg.io/v1alpha1",
    "kind": "PostgreSQLCluster",
    "metadata": {"name": "pg-orders", "uid": "u-1", "namespace": "db"},
}


def test_keys_others_added_survive_and_keys_we_dropped_go() -> None:
    observed = {"spec": {"selector": {"a": "1", "b": "2"}, "clusterIP": "10.0.0.1"}}
    last = {"spec": {"selector": {"a": "1", "b": "2"}}}
    desired = {"spec": {"selector": {"a": "9"}}}
    assert merge(observed, last, desired) == {
        "spec": {"selector": {"a": "9"}, "clusterIP": "10.0.0.1"}
    }


def test_lists_keyed_by_a_conventional_key_merge_as_maps_in_observed_order() -> None:
    observed = {
        "ports": [
            {"name": "b", "port": 2, "protocol": "TCP"},
            {"name": "a", "port": 1, "protocol": "TCP"},
        ]
    }
    desired = {"ports": [{"name": "a", "port": 1}, {"name": "c", "port": 3}]}
    last = {"ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}]}
    # "port" comes before "name" in knownMergeKeys; b was ours and is dropped; the server's
    # protocol default on a survives; c is appended.
    assert merge(observed, last, desired)["ports"] == [
        {"name": "a", "port": 1, "protocol": "TCP"},
        {"name": "c", "port": 3},
    ]
    assert detect_list_map_key([{"ip": "x", "name": "n"}], [{"name": "m", "ip": "y"}]) == "name"
    assert detect_list_map_key(["a"], []) == ""
    assert merge({"args": ["a", "b"]}, None, {"args": ["c"]}) == {"args": ["c"]}


def test_an_update_reverts_status_and_system_fields_and_records_what_was_sent() -> None:
    observed = {
        "metadata": {
            "name": "s",
            "uid": "x",
            "resourceVersion": "7",
            "annotations": {LAST_APPLIED: json.dumps({"spec": {"selector": {"a": "1"}}})},
        },
        "spec": {"selector": {"a": "1"}, "ports": [{"port": 5432, "protocol": "TCP"}]},
        "status": {"loadBalancer": {}},
    }
    desired = {
        "metadata": {"name": "s", "uid": "forged"},
        "spec": {"selector": {"a": "2"}, "ports": [{"port": 5432}]},
        "status": {"x": 1},
    }
    new = apply_update(observed, desired)
    assert new["metadata"]["uid"] == "x" and new["metadata"]["resourceVersion"] == "7"
    assert new["status"] == {"loadBalancer": {}}
    assert new["spec"] == {"selector": {"a": "2"}, "ports": [{"port": 5432, "protocol": "TCP"}]}
    assert json.loads(new["metadata"]["annotations"][LAST_APPLIED]) == desired
    # Sending the same again is no write at all (DeepEqual against the observed object).
    assert apply_update(new, desired) == new


def test_a_create_carries_last_applied_of_itself_and_the_controller_reference() -> None:
    desired = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    created = for_create(desired, PARENT)
    assert json.loads(created["metadata"]["annotations"][LAST_APPLIED]) == desired
    assert created["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "adg.io/v1alpha1",
            "kind": "PostgreSQLCluster",
            "name": "pg-orders",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_label_selectors() -> None:
    labels = {"app": "p", "tier": "db"}
    assert matches(None, labels) and matches({}, labels)
    assert matches({"matchLabels": {"app": "p"}}, labels)
    assert not matches({"matchLabels": {"app": "q"}}, labels)
    expression = {"key": "tier", "operator": "In", "values": ["db"]}
    assert matches({"matchExpressions": [expression]}, labels)
    assert not matches({"matchExpressions": [{**expression, "operator": "NotIn"}]}, labels)
    assert not matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)
    assert matches({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels)
    with pytest.raises(ValueError):
        matches({"matchExpressions": [{"key": "x", "operator": "Gt"}]}, labels)


def test_the_queue_never_hands_one_key_to_two_workers_and_keeps_the_earlier_resync() -> None:
    queue = WorkQueue()
    queue.add("a")
    queue.add("a")
    assert queue.get(0.1) == "a"
    queue.add("a")  # an event while "a" is processed: queued again only once it is done
    assert queue.get(0.05) is None
    queue.done("a")
    assert queue.get(0.1) == "a"
    queue.done("a")
    queue.add_after("b", 0.05)
    queue.add_after("b", 5.0)  # a later resync never postpones the earlier one
    started = time.monotonic()
    assert queue.get(1.0) == "b"
    assert time.monotonic() - started < 0.5
    queue.done("b")
    delays = [queue.add_rate_limited("c") for _ in range(6)]
    assert delays == [0.005, 0.01, 0.02, 0.04, 0.08, 0.16]  # client-go's: no kinder cap
    queue.forget("c")
    assert queue.add_rate_limited("c") == 0.005


def test_webhook_timeouts_and_retry_after() -> None:
    assert parse_duration("5s") == 5.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration(None) == 10.0
    assert parse_duration("0s") == 10.0
    with pytest.raises(ValueError):
        parse_duration("soon")
    assert retry_after("3") == 3.0
    assert retry_after(None) == 0.0
    assert retry_after("garbage") == 0.0


def test_the_loopback_composite_controller_changes_only_the_hook_addresses() -> None:
    controller = local_controller("http://127.0.0.1:4321")
    hooks = controller["spec"]["hooks"]
    assert hooks["sync"]["webhook"]["url"] == "http://127.0.0.1:4321/sync"
    assert hooks["customize"]["webhook"]["url"] == "http://127.0.0.1:4321/customize"
    assert controller["spec"]["endpointConfigs"][0]["host"] == "127.0.0.1:4321"
    assert controller["spec"]["generateSelector"] is True


def test_the_real_binary_gets_the_values_flags_with_loopback_ports(tmp_path: Path) -> None:
    args = command_args("ns-1")
    assert "--workers=64" in args and "--leader-election" in args
    assert "--leader-election-namespace=ns-1" in args
    probes = [a for a in args if a.startswith("--health-probe-bind-address=")]
    assert len(probes) == 1 and probes[0].startswith("--health-probe-bind-address=127.0.0.1:")


def test_a_related_rule_by_names_matches_that_name_in_the_parents_namespace_only() -> None:
    """``matchesRelatedRule``'s ``selectByNamespaceAndNames`` for a v1 hook and a namespaced
    parent (customize/manager.go): the name must be listed, the namespace the parent's."""
    rule = {"apiVersion": "v1", "resource": "services", "names": ["pg"], "namespace": "db"}

    def service(namespace: str, name: str) -> dict[str, object]:
        return {"metadata": {"namespace": namespace, "name": name, "labels": {}}}

    assert rule_matches(rule, PARENT, service("db", "pg"))
    assert not rule_matches(rule, PARENT, service("other", "pg"))
    assert not rule_matches(rule, PARENT, service("db", "pg2"))


def test_resync_periods_are_metacontrollers() -> None:
    """The cache flush always; resyncPeriodSeconds as a ticker of its own, raised to 1 s
    (0 is every second, not off), only when shorter than the cache flush."""
    assert resync_periods(None, 1800.0) == [1800.0]
    assert resync_periods(60, 1800.0) == [1800.0, 60.0]
    assert resync_periods(0, 1800.0) == [1800.0, 1.0]
    assert resync_periods(3600, 1800.0) == [1800.0]
    assert resync_periods(1800, 1800.0) == [1800.0]
    with pytest.raises(ValueError, match="not an integer"):
        resync_periods("60", 1800.0)
