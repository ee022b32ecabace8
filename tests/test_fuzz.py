"""Fuzzing the hook's HTTP surface with hypothesis, through the real Flask app.

Test design notes
-----------------
* Inputs: the recorded Metacontroller requests (``tests/fixtures/metacontroller/``)
  mutated at random paths (a key removed, a value replaced by another JSON type, null,
  a number where an object belongs, a huge string, deep nesting, unicode keys, the
  Service's apiVersion/kind or last-applied record rewritten, ...); bodies built
  from scratch; customize requests; raw bytes. Mutations are drawn with ``st.data()``
  so hypothesis shrinks a failure to the one mutation that matters.
* The app is ``create_app`` with a :class:`tests.helpers.FakeProber` (no I/O): the
  recorded members answer as Patroni would (pg-orders-1 leads), any other pod name is
  unreachable. Caller authentication is off here (what is fuzzed is everything behind
  it; tests/test_security_*.py covers the authentication itself).
* Properties, for every request (:func:`check`):

  1. never a 500, and the app's internal-error path was not taken (its metric did not
     move);
  2. a rejected request is a 4xx with a JSON ``{"error": "<message>"}``;
  3. a 200 passes Metacontroller's strict parsing (``testbed.metacontroller.apply.check_reply``),
     and
     unless the request is a finalize, keeps every observed Service: by name, as
     ``apiVersion: v1``, ``kind: Service``, in the parent's namespace or none, and no
     Service in it carries ``clusterIP``/``clusterIPs``.

* Budget: each test has a fixed ``max_examples``, ``derandomize=True`` and no example
  database, so CI runs the same examples every time in a few seconds; set
  ``PGFH_FUZZ_SCALE=20`` (examples × 20, random seeds) for a deeper local run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from testbed.metacontroller.apply import HookError, check_reply
from tests.helpers import (
    NO_AUTH,
    NOW,
    SYNC_FIXTURES,
    FakeProber,
    fixture,
    leader,
    many_pods,
    replica,
)

SCALE = int(os.environ.get("PGFH_FUZZ_SCALE", "1"))
MAX_REQUEST = HookSettings().max_request_bytes  # the production default


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        derandomize=SCALE == 1,
        database=None,
        deadline=None,  # no I/O, but some bodies are large: no per-example timing
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------ the app


PROBER = FakeProber(
    {
        "pg-orders-0": replica("pg-orders-0", 2),
        "pg-orders-1": leader("pg-orders-1", 2),
        "pg-orders-2": replica("pg-orders-2", 2),
    }
)


class _NoRecord(FakeProber):
    """FakeProber without the call log (thousands of examples share one app)."""

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        result = super().probe(targets)
        self.calls.clear()
        return result


@pytest.fixture(scope="module")
def client() -> FlaskClient:
    prober = _NoRecord(PROBER.answers)
    app: Flask = create_app(
        settings=HookSettings(max_request_bytes=MAX_REQUEST, auth=NO_AUTH),
        prober=prober,
        clock=lambda: NOW,
    )
    app.config["TESTING"] = True
    return app.test_client()


def internal_errors() -> float:
    return sum(
        REGISTRY.get_sample_value("pgfh_internal_errors_total", {"endpoint": endpoint}) or 0.0
        for endpoint in ("sync", "customize", "other")
    )


def test_the_checks_see_a_bug() -> None:
    """Negative control: a crash inside the app is seen by the internal-error check."""

    class Broken(FakeProber):
        def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
            raise RuntimeError("a bug")

    app = create_app(settings=HookSettings(auth=NO_AUTH), prober=Broken(), clock=lambda: NOW)
    before = internal_errors()
    body = fixture("sync-service-selects-old-leader.json")
    assert post(app.test_client(), "/sync", encode(body))[0] == 500
    assert internal_errors() == before + 1


def post(client: FlaskClient, path: str, data: bytes) -> tuple[int, bytes, str]:
    response = client.post(path, data=data, content_type="application/json")
    return response.status_code, response.get_data(), response.content_type


def encode(body: object) -> bytes:
    # allow_nan: the fuzzer may put NaN somewhere; the hook must refuse it with a 400.
    return json.dumps(body, separators=(",", ":"), allow_nan=True).encode()


# --------------------------------------------------------------- properties


def check(client: FlaskClient, path: str, body: object, data: bytes | None = None) -> int:
    """Post ``body`` (or raw ``data``) and assert the properties; return the status."""
    before = internal_errors()
    status, reply, content_type = post(client, path, encode(body) if data is None else data)
    assert status != 500, reply[:500]
    assert internal_errors() == before, "the internal-error path was taken"
    assert content_type == "application/json", content_type
    document = json.loads(reply)
    if status != 200:
        assert 400 <= status < 500, status
        assert isinstance(document, dict) and set(document) == {"error"}, document
        assert isinstance(document["error"], str) and document["error"].strip(), document
        return status
    if path == "/customize":
        assert set(document) == {"relatedResources"}, document
        for rule in document["relatedResources"]:
            # Never a rule that relates every object of a type: a label selector, or
            # non-empty names in one namespace (Metacontroller's selectByNamespaceAndNames).
            if "names" in rule:
                assert "labelSelector" not in rule, "names cannot be combined with a selector"
                assert all(isinstance(n, str) and n for n in rule["names"]), rule
                assert rule["names"] and rule["namespace"], "a names rule without a scope"
            else:
                assert rule["labelSelector"]["matchLabels"], "a rule without a selector"
        return status
    try:
        check_reply(status, reply)
    except HookError as error:
        pytest.fail(f"Metacontroller would refuse the reply: {error}")
    assert isinstance(body, dict)
    children = document.get("children") or []
    for child in children:
        if isinstance(child, dict) and child.get("kind") == "Service":
            spec = child.get("spec") or {}
            assert "clusterIP" not in spec and "clusterIPs" not in spec, child
    if body.get("finalizing") is True:
        return status
    namespace = body["parent"]["metadata"]["namespace"]
    kept = {
        (c.get("apiVersion"), c.get("kind"), (c.get("metadata") or {}).get("name"))
        for c in children
        if isinstance(c, dict)
        and (c.get("metadata") or {}).get("namespace", namespace) == namespace
    }
    for name in body["children"]["Service.v1"]:
        assert ("v1", "Service", name) in kept, f"observed Service {name!r} dropped: {children}"
    return status


# ------------------------------------------------------------- strategies

KEYS = st.one_of(
    st.sampled_from(["spec", "status", "metadata", "name", "selector", "Service.v1", ""]),
    st.text(max_size=12),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=40),  # any code point, surrogates out
    st.sampled_from(["", "pg-orders-1", "10.244.2.23", "::1", "ünïcødé-☃", "a" * 300]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)


def deep(depth: int, leaf: object = 1) -> object:
    value = leaf
    for index in range(depth):
        value = [value] if index % 2 else {"x": value}
    return value


SPECIAL = st.one_of(
    st.sampled_from(
        [
            None,
            0,
            -1,
            2**64,
            1.5,
            "x" * 200_000,
            [],
            {},
            [None],
            {"": None},
            "pg-orders-primary",
            True,
        ]
    ),
    st.integers(min_value=1, max_value=400).map(deep),
)

Path = tuple[str | int, ...]


def paths(value: object, prefix: Path = ()) -> list[Path]:
    """Every path into a JSON document (managedFields left out: bulk nobody reads)."""
    found: list[Path] = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "managedFields":
                found.extend(paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(paths(item, (*prefix, index)))
    return found


def get(document: Any, path: Path) -> Any:
    for part in path:
        document = document[part]
    return document


Mutation = Callable[[Any, Path, Any], Any]


def _replace(document: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    get(document, path[:-1])[path[-1]] = value
    return document


def _delete(document: Any, path: Path, _: Any) -> Any:
    if not path:
        return document
    parent = get(document, path[:-1])
    del parent[path[-1]]
    return document


def _wrap(document: Any, path: Path, _: Any) -> Any:
    return _replace(document, path, [get(document, path)])


def _rename(document: Any, path: Path, key: Any) -> Any:
    if not path or not isinstance(path[-1], str):
        return document
    parent = get(document, path[:-1])
    parent[str(key)] = parent.pop(path[-1])
    return document


def _stringify(document: Any, path: Path, _: Any) -> Any:
    return _replace(document, path, json.dumps(get(document, path)))


MUTATIONS: dict[str, Mutation] = {
    "replace": _replace,
    "delete": _delete,
    "wrap in a list": _wrap,
    "rename key": _rename,
    "stringify": _stringify,
}


def mutate(data: st.DataObject, body: dict[str, Any], rounds: int) -> dict[str, Any]:
    for _ in range(rounds):
        candidates = paths(body)
        path = data.draw(st.sampled_from(candidates), label="path")
        name = data.draw(st.sampled_from(sorted(MUTATIONS)), label="mutation")
        # A copy: SPECIAL's lists and dicts are shared constants, and a later round
        # may mutate inside what this one inserted.
        value = copy.deepcopy(data.draw(st.one_of(JSON, SPECIAL, KEYS), label="value"))
        body = MUTATIONS[name](body, path, value)
        if not isinstance(body, dict):
            break
    return body


FIXTURES = {name: fixture(name) for name in SYNC_FIXTURES}
PARTS = [
    ("parent", "spec"),
    ("parent", "metadata"),
    ("parent", "status"),
    ("children", "Service.v1"),
    ("related", "Pod.v1"),
    (),
]


@fuzz_settings(250)
@given(name=st.sampled_from(sorted(FIXTURES)), data=st.data(), rounds=st.integers(1, 4))
def test_mutated_recorded_sync_requests(
    client: FlaskClient, name: str, data: st.DataObject, rounds: int
) -> None:
    body = copy.deepcopy(FIXTURES[name])
    # Aim most mutations at what the hook reads; the rest anywhere in the envelope.
    part = data.draw(st.sampled_from(PARTS), label="part")
    target = get(body, part) if part and part[-1] in get(body, part[:-1]) else None
    if isinstance(target, dict):
        get(body, part[:-1])[part[-1]] = mutate(data, target, rounds)
        check(client, "/sync", body)
    else:
        check(client, "/sync", mutate(data, body, rounds))


SERVICE_EDITS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("kind Pod", lambda s: s.__setitem__("kind", "Pod")),
    ("no kind", lambda s: s.pop("kind")),
    ("apiVersion v2", lambda s: s.__setitem__("apiVersion", "v2")),
    ("no apiVersion", lambda s: s.pop("apiVersion")),
    ("namespace elsewhere", lambda s: s["metadata"].__setitem__("namespace", "elsewhere")),
    ("no namespace", lambda s: s["metadata"].pop("namespace")),
    ("no spec", lambda s: s.pop("spec")),
    ("spec null", lambda s: s.__setitem__("spec", None)),
    ("selector null", lambda s: s["spec"].__setitem__("selector", None)),
    ("no annotations", lambda s: s["metadata"].pop("annotations", None)),
    ("last-applied garbage", lambda s: _set_last_applied(s, "{not json")),
    ("last-applied a list", lambda s: _set_last_applied(s, "[]")),
    ("last-applied with clusterIP", lambda s: _edit_last_applied(s, clusterIP=True)),
    ("last-applied kind Pod", lambda s: _edit_last_applied(s, kind="Pod")),
    ("last-applied other ns", lambda s: _edit_last_applied(s, namespace="elsewhere")),
    ("last-applied spec null", lambda s: _edit_last_applied(s, spec=None)),
]


def _set_last_applied(service: dict[str, Any], text: str) -> None:
    annotations = service["metadata"].setdefault("annotations", {})
    annotations["metacontroller.k8s.io/last-applied-configuration"] = text


def _edit_last_applied(service: dict[str, Any], **change: Any) -> None:
    annotations = service["metadata"].get("annotations") or {}
    raw = annotations.get("metacontroller.k8s.io/last-applied-configuration", "{}")
    applied = json.loads(raw)
    if change.pop("clusterIP", False):
        applied.setdefault("spec", {}).update(clusterIP="10.96.0.1", clusterIPs=["10.96.0.1"])
    if "namespace" in change:
        applied.setdefault("metadata", {})["namespace"] = change.pop("namespace")
    if "spec" in change:
        applied["spec"] = change.pop("spec")
    applied.update(change)
    _set_last_applied(service, json.dumps(applied))


@fuzz_settings(120)
@given(
    name=st.sampled_from(sorted(FIXTURES)),
    edits=st.lists(st.sampled_from(SERVICE_EDITS), min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_an_observed_service_in_any_shape_is_never_dropped(
    client: FlaskClient,
    name: str,
    edits: list[tuple[str, Callable[[dict[str, Any]], None]]],
    data: st.DataObject,
) -> None:
    body = copy.deepcopy(FIXTURES[name])
    services = body["children"]["Service.v1"]
    if not services:  # the first sync has none: give it one to keep
        services["pg-orders-primary"] = copy.deepcopy(
            FIXTURES["sync-service-selects-old-leader.json"]["children"]["Service.v1"][
                "pg-orders-primary"
            ]
        )
    service = next(iter(services.values()))
    for _, edit in edits:
        # An edit may not apply after another (no spec left to edit): skip it then.
        with contextlib.suppress(KeyError, TypeError, AttributeError, ValueError):
            edit(service)
    if data.draw(st.booleans(), label="spec invalid"):
        body["parent"]["spec"] = copy.deepcopy(data.draw(st.one_of(JSON, SPECIAL), label="spec"))
    check(client, "/sync", body)


@fuzz_settings(150)
@given(body=st.one_of(JSON, SPECIAL, st.dictionaries(KEYS, st.one_of(JSON, SPECIAL))))
def test_bodies_from_scratch(client: FlaskClient, body: object) -> None:
    status = check(client, "/sync", body)
    assert status != 200 or isinstance(body, dict)
    check(client, "/customize", body)


@fuzz_settings(100)
@given(data=st.data(), rounds=st.integers(1, 3))
def test_mutated_customize_requests(client: FlaskClient, data: st.DataObject, rounds: int) -> None:
    body = fixture("customize-request.json")
    check(client, "/customize", mutate(data, body, rounds))


@fuzz_settings(100)
@given(data=st.binary(max_size=2000))
def test_raw_bytes(client: FlaskClient, data: bytes) -> None:
    for path in ("/sync", "/customize"):
        check(client, path, None, data=data)


# ------------------------------------------------------------- request size


def test_a_request_of_the_largest_probed_cluster_fits_the_cap_with_room(
    client: FlaskClient,
) -> None:
    """The body cap follows the members cap (hooks.shell.config.request_cap): 64 realistic
    Pods take a third of it, so larger Pod specs fit too."""
    body = many_pods(HookSettings().probe_policy.max_members)
    data = encode(body)
    assert len(data) < MAX_REQUEST / 3, len(data)  # ~6.6 KB per recorded Pod
    assert check(client, "/sync", body, data=data) == 200


def test_a_cluster_over_the_members_cap_within_the_body_cap_gets_a_condition(
    client: FlaskClient,
) -> None:
    body = many_pods(150)
    data = encode(body)
    assert len(data) < MAX_REQUEST, len(data)
    assert check(client, "/sync", body, data=data) == 200
    reply = json.loads(post(client, "/sync", data)[1])
    assert reply["resyncAfterSeconds"] == 60.0
    spec_valid = [c for c in reply["status"]["conditions"] if c["type"] == "SpecValid"]
    assert "matches 150 Pods, more than the 64 members" in spec_valid[0]["message"]


def test_a_request_over_the_limit_is_a_413_json_error(client: FlaskClient) -> None:
    data = encode(many_pods(150))
    data += b" " * (MAX_REQUEST + 1 - len(data))  # still valid JSON, one byte too many
    status, reply, content_type = post(client, "/sync", data)
    assert status == 413
    assert content_type == "application/json"
    assert set(json.loads(reply)) == {"error"}
    exact = data[: MAX_REQUEST - len(data)]  # the same body at the limit passes
    assert post(client, "/sync", exact)[0] == 200


# ------------------------------------------------- nested JSON inside annotations
# The hook parses JSON found *inside* strings of the request: a Pod's Patroni ``status``
# annotation and each child's last-applied record. Anyone who may patch a Pod or a Service
# in the namespace writes them (Patroni's own ServiceAccount included). 5,000 nested
# brackets made ``json.loads`` raise RecursionError: HTTP 500 on every sync of the cluster,
# so its failover froze. Each must be ignored instead, the Service kept, never a 500.

LAST_APPLIED = "metacontroller.k8s.io/last-applied-configuration"


def nested_text(depth: int, kind: str) -> str:
    """JSON text nesting ``depth`` levels: arrays, objects, or an object holding arrays."""
    if kind == "arrays":
        return "[" * depth + "]" * depth
    if kind == "objects":
        return '{"a":' * depth + "1" + "}" * depth
    return '{"role":"primary","state":"running","x":' + "[" * depth + "]" * depth + "}"


def _annotate(body: dict[str, Any], where: str, text: str) -> dict[str, Any]:
    if where == "pod status":
        for pod in body["related"]["Pod.v1"].values():
            pod["metadata"].setdefault("annotations", {})["status"] = text
    else:
        for service in body["children"]["Service.v1"].values():
            service["metadata"].setdefault("annotations", {})[LAST_APPLIED] = text
    return body


NESTED = [
    pytest.param(where, depth, kind, id=f"{where}-{kind}-{depth}")
    for where in ("pod status", "service last-applied")
    for depth in (65, 5_000, 50_000)
    for kind in ("arrays", "objects", "inside a member document")
]


@pytest.mark.parametrize(("where", "depth", "kind"), NESTED)
def test_deeply_nested_json_in_an_annotation_is_ignored_never_a_500(
    client: FlaskClient, where: str, depth: int, kind: str
) -> None:
    body = _annotate(
        fixture("sync-service-selects-old-leader.json"), where, nested_text(depth, kind)
    )
    assert check(client, "/sync", body) == 200
    reply = json.loads(post(client, "/sync", encode(body))[1])
    # Nothing routes on an ignored annotation, and nothing is lost: the leader Patroni
    # confirms is routed, as without the annotation.
    (service,) = [c for c in reply["children"] if c["kind"] == "Service"]
    assert service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == "pg-orders-1"


@fuzz_settings(60)
@given(
    name=st.sampled_from(sorted(FIXTURES)),
    where=st.sampled_from(["pod status", "service last-applied"]),
    depth=st.integers(min_value=1, max_value=20_000),
    kind=st.sampled_from(["arrays", "objects", "inside a member document"]),
)
def test_nested_annotations_of_any_depth(
    client: FlaskClient, name: str, where: str, depth: int, kind: str
) -> None:
    body = _annotate(copy.deepcopy(FIXTURES[name]), where, nested_text(depth, kind))
    check(client, "/sync", body)
