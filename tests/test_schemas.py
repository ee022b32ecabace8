"""Unit tests of request and spec validation (:mod:`hooks.loaders.schemas`).

Test design notes
-----------------
* Two levels of bad input are kept apart, and so are their tests: a *broken request*
  must raise :class:`RequestError` with a message that says what is wrong (the app
  answers 400, Metacontroller changes nothing and retries); an *invalid spec* must load
  into a :class:`SyncRequest` with ``spec=None`` and a :class:`SpecProblem` naming the
  exact dotted field, never raise.
* The invalid-spec table (``tests.helpers.INVALID_SPECS``) is shared with
  ``tests/test_sync_*.py``, which checks what the *reply* does with the same inputs.
* Messages are matched on the part a human needs (the field path, the offending key),
  not on marshmallow's exact wording, so a library upgrade that rewords a message does
  not break the tests while a wrong field path does.
* All five recorded Metacontroller requests must load, and the seed spec (the three
  fields the fixtures use) must come back with every default filled in, compared as a
  whole dataclass so a changed default is noticed.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from hooks.domain.model import LEADER_PATHS, ClusterSpec, ServicePort, SpecProblem
from hooks.loaders.envelope import (
    RequestError,
    SyncEnvelopeSchema,
    check_sync_envelope,
    load_customize_request,
    load_sync_request,
)
from hooks.loaders.schemas import load_spec
from tests.helpers import (
    CLUSTER,
    INVALID_SPECS,
    NAMESPACE,
    OMIT,
    SELECTOR,
    SERVICE_NAME,
    SYNC_FIXTURES,
    fixture,
    make_pod,
    make_service,
    seed_spec,
    sync_body,
)

SEED_DEFAULTS = ClusterSpec(
    primary_selector={"application": "patroni", "cluster-name": "pg-orders"},
    service_name="pg-orders-primary",
    health_check_path="/primary",
    patroni_port=8008,
    patroni_scheme="http",
    connect_timeout=0.5,
    read_timeout=1.0,
    service_type="ClusterIP",
    service_ports=(ServicePort(name="postgresql", port=5432, target_port=5432, protocol="TCP"),),
    service_labels={},
    service_annotations={},
)


# ===================================================================== fixtures


@pytest.mark.parametrize("name", SYNC_FIXTURES)
def test_every_recorded_sync_request_loads_with_a_valid_spec(name: str) -> None:
    body = fixture(name)
    request = load_sync_request(body)

    assert (request.namespace, request.name, request.cluster) == (
        NAMESPACE,
        CLUSTER,
        "databases/pg-orders",
    )
    assert request.generation == body["parent"]["metadata"]["generation"]
    assert request.spec == SEED_DEFAULTS
    assert request.spec_problems == ()
    assert request.finalizing is body["finalizing"]
    assert {n: s.raw for n, s in request.services.items()} == body["children"]["Service.v1"]
    assert sorted(request.pods) == ["pg-orders-0", "pg-orders-1", "pg-orders-2"]
    # The read-only and backup child types are declared, so their (empty) groups arrive.
    assert request.other_children == {
        "CronJob.batch/v1": {},
        "EndpointSlice.discovery.k8s.io/v1": {},
    }
    assert (request.slices, request.cronjobs) == ({}, {})
    assert request.uid == body["parent"]["metadata"]["uid"]
    assert request.jobs is None
    assert request.previous.raw == body["parent"].get("status", {})
    assert (request.api_version, request.kind) == ("adg.io/v1alpha1", "PostgreSQLCluster")


def test_the_recorded_finalize_request_is_a_finalize() -> None:
    request = load_sync_request(fixture("finalize-parent-deleting.json"))
    assert (request.finalizing, request.generation, sorted(request.services)) == (
        True,
        2,
        [SERVICE_NAME],
    )


def test_the_recorded_customize_request_loads() -> None:
    assert load_customize_request(fixture("customize-request.json")) == (
        "databases/pg-orders",
        SEED_DEFAULTS,
    )


def test_the_five_fixture_files_are_all_covered() -> None:
    assert len(SYNC_FIXTURES) == 4  # plus customize-request.json above


# ==================================================================== the spec


def test_a_seed_only_spec_gets_every_default() -> None:
    assert load_spec(seed_spec()) == (SEED_DEFAULTS, ())


def test_health_check_path_defaults_to_primary_when_left_out() -> None:
    spec = seed_spec()
    del spec["healthCheckPath"]
    loaded, problems = load_spec(spec)
    assert (loaded, problems) == (SEED_DEFAULTS, ())


def test_a_full_spec_loads_every_field() -> None:
    spec = seed_spec(
        healthCheckPath="/leader",
        patroni={
            "port": 8443,
            "scheme": "https",
            "connectTimeoutSeconds": 0.05,
            "readTimeoutSeconds": 5,
        },
        service={
            "type": "NodePort",
            "ports": [
                {"name": "pg", "port": 5433, "targetPort": "postgresql", "protocol": "TCP"},
                {"name": "metrics", "port": 9187, "targetPort": 9187},
                {"name": "api", "port": 8008},
            ],
            "labels": {"team": "db", "example.com/tier": ""},
            "annotations": {"example.com/free-text": "anything: at all"},
        },
    )
    assert load_spec(spec) == (
        ClusterSpec(
            primary_selector=dict(SELECTOR),
            service_name=SERVICE_NAME,
            health_check_path="/leader",
            patroni_port=8443,
            patroni_scheme="https",
            connect_timeout=0.05,
            read_timeout=5.0,
            service_type="NodePort",
            service_ports=(
                ServicePort("pg", 5433, "postgresql"),
                ServicePort("metrics", 9187, 9187),
                ServicePort("api", 8008, 8008),
            ),
            service_labels={"team": "db", "example.com/tier": ""},
            service_annotations={"example.com/free-text": "anything: at all"},
        ),
        (),
    )


def test_unknown_spec_fields_are_ignored() -> None:
    spec = seed_spec(futureField={"x": 1}, patroni={"futureKnob": True})
    assert load_spec(spec) == (SEED_DEFAULTS, ())


@pytest.mark.parametrize(
    "key",
    ["app", "app.kubernetes.io/name", "example.com/x_y.z-1", "a" * 63, f"{'p' * 253}/n"],
)
def test_valid_label_keys_are_accepted(key: str) -> None:
    spec, problems = load_spec(seed_spec(primarySelector={key: "v"}))
    assert problems == ()
    assert spec is not None and dict(spec.primary_selector) == {key: "v"}


@pytest.mark.parametrize("value", ["", "v", "A.b_c-9", "x" * 63])
def test_valid_label_values_are_accepted(value: str) -> None:
    assert load_spec(seed_spec(primarySelector={"app": value}))[1] == ()


@pytest.mark.parametrize(
    "name", ["p", "pg-orders-rw", "a" * 63, "pg-orders-primary", "pg-orders-x"]
)
def test_valid_service_names_are_accepted(name: str) -> None:
    spec, problems = load_spec(seed_spec(serviceRef={"name": name}))
    assert problems == ()
    assert spec is not None and spec.service_name == name


@pytest.mark.parametrize("target", [1, 65535, "pg", "postgresql", "a" * 15, "p-g", "pg5432"])
def test_valid_target_ports_are_accepted(target: int | str) -> None:
    spec, problems = load_spec(
        seed_spec(service={"ports": [{"name": "pg", "port": 5432, "targetPort": target}]})
    )
    assert problems == ()
    assert spec is not None and spec.service_ports[0].target_port == target


@pytest.mark.parametrize("path", sorted(LEADER_PATHS))
def test_every_leader_path_is_accepted_with_its_leader_roles(path: str) -> None:
    spec, problems = load_spec(seed_spec(healthCheckPath=path))
    assert problems == ()
    assert spec is not None and spec.leader_roles == LEADER_PATHS[path]


def test_leader_paths_never_include_a_path_that_is_200_on_replicas() -> None:
    assert {"/replica", "/read-only", "/health", "/readiness", "/liveness", "/"}.isdisjoint(
        LEADER_PATHS
    )
    assert LEADER_PATHS["/leader"] == {"primary", "standby_leader"}
    assert LEADER_PATHS["/standby-leader"] == {"standby_leader"}
    assert LEADER_PATHS["/primary"] == {"primary"}


def test_the_reserved_name_check_uses_the_cluster_name_label_as_patronis_scope() -> None:
    spec = seed_spec(primarySelector={"application": "patroni", "cluster-name": "orders"})
    spec["serviceRef"] = {"name": "orders-config"}
    assert load_spec(spec)[1][0].field == "spec.serviceRef"
    spec["serviceRef"] = {"name": "pg-orders-config"}  # another cluster's name is not reserved
    assert load_spec(spec)[1] == ()


@pytest.mark.parametrize(
    ("spec", "field_path"),
    [c[1:] for c in INVALID_SPECS],
    ids=[c[0] for c in INVALID_SPECS],
)
def test_an_invalid_spec_is_a_problem_that_names_the_field_never_an_exception(
    spec: object, field_path: str
) -> None:
    if spec is OMIT:  # no spec key at all: the envelope hands load_spec a None
        spec = None
    loaded, problems = load_spec(copy.deepcopy(spec))

    assert loaded is None
    assert problems, "an invalid spec must say why"
    assert all(isinstance(p, SpecProblem) and p.message for p in problems)
    assert all(p.field == "spec" or p.field.startswith("spec.") for p in problems)
    assert field_path in [p.field for p in problems], problems


@pytest.mark.parametrize(
    ("spec", "field_path"),
    [c[1:] for c in INVALID_SPECS],
    ids=[c[0] for c in INVALID_SPECS],
)
def test_a_request_with_an_invalid_spec_still_loads(spec: object, field_path: str) -> None:
    request = load_sync_request(sync_body(spec=spec, services=[make_service()]))
    assert request.spec is None
    assert field_path in [p.field for p in request.spec_problems]
    assert list(request.services) == [SERVICE_NAME]


def test_every_problem_of_a_spec_is_reported_not_only_the_first() -> None:
    _, problems = load_spec({"healthCheckPath": "/replica", "patroni": {"port": 0}})
    assert [p.field for p in problems] == [
        "spec.healthCheckPath",
        "spec.patroni.port",
        "spec.primarySelector",
        "spec.serviceRef",
    ]


def test_a_reserved_name_message_names_the_name_and_the_scope() -> None:
    (problem,) = load_spec(seed_spec(serviceRef={"name": "pg-orders-leader"}))[1]
    assert "'pg-orders-leader'" in problem.message and "'pg-orders'" in problem.message


@pytest.mark.parametrize(
    "junk",
    [
        None,
        0,
        1.5,
        math.nan,
        "",
        "spec",
        [],
        [{}],
        (),
        {"primarySelector": None},
        {"serviceRef": []},
        {1: 2},
    ],
)
def test_load_spec_never_raises(junk: object) -> None:
    loaded, problems = load_spec(junk)
    assert loaded is None and problems


# ==================================================================== envelope


def _without(path: str) -> Any:
    def mutate(body: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target = body
        for key in parents:
            target = target[key]
        del target[last]

    return mutate


def _set(path: str, value: object) -> Any:
    def mutate(body: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target = body
        for key in parents:
            target = target[key]
        target[last] = copy.deepcopy(value)

    return mutate


def _rename_service(body: dict[str, Any]) -> None:
    body["children"]["Service.v1"][SERVICE_NAME]["metadata"]["name"] = "other"


def _rename_pod(body: dict[str, Any]) -> None:
    body["related"]["Pod.v1"]["pg-orders-0"]["metadata"]["name"] = "pg-orders-9"


def _service_without_metadata(body: dict[str, Any]) -> None:
    del body["children"]["Service.v1"][SERVICE_NAME]["metadata"]


def _pod_with_list_metadata(body: dict[str, Any]) -> None:
    body["related"]["Pod.v1"]["pg-orders-0"]["metadata"] = ["pg-orders-0"]


BROKEN_REQUESTS = [
    ("parent missing", _without("parent"), "invalid sync request: parent: Missing data"),
    ("parent a list", _set("parent", []), "invalid sync request: parent: "),
    ("parent null", _set("parent", None), "invalid sync request: parent: "),
    ("parent without metadata", _without("parent/metadata"), "invalid parent: metadata: Missing"),
    ("metadata a string", _set("parent/metadata", "x"), "invalid parent: metadata: "),
    (
        "no metadata.name",
        _without("parent/metadata/name"),
        "invalid parent: metadata.name: Missing",
    ),
    ("empty metadata.name", _set("parent/metadata/name", ""), "invalid parent: metadata.name: "),
    ("metadata.name a number", _set("parent/metadata/name", 5), "invalid parent: metadata.name: "),
    (
        "no metadata.namespace",
        _without("parent/metadata/namespace"),
        "invalid parent: metadata.namespace: Missing",
    ),
    (
        "empty namespace",
        _set("parent/metadata/namespace", ""),
        "invalid parent: metadata.namespace: ",
    ),
    ("generation a string", _set("parent/metadata/generation", "1"), "metadata.generation: "),
    ("generation a float", _set("parent/metadata/generation", 1.5), "metadata.generation: "),
    ("generation true", _set("parent/metadata/generation", True), "metadata.generation: "),
    ("children missing", _without("children"), "invalid sync request: children: Missing data"),
    ("children null", _set("children", None), "invalid sync request: children: "),
    ("children a list", _set("children", [{}]), "invalid sync request: children: "),
    ("children without Service.v1", _set("children", {}), "children has no 'Service.v1' entry"),
    (
        "children with only other types",
        _set("children", {"ConfigMap.v1": {}}),
        "children has no 'Service.v1' entry",
    ),
    ("Service.v1 a list", _set("children/Service.v1", []), "invalid sync request: children."),
    ("Service.v1 null", _set("children/Service.v1", None), "invalid sync request: children."),
    (
        "a Service that is not an object",
        _set("children/Service.v1", {SERVICE_NAME: "pg-orders-primary"}),
        "invalid sync request: children.",
    ),
    (
        "a Service keyed by another name",
        _rename_service,
        "Service.v1['pg-orders-primary'] has metadata.name 'other'",
    ),
    (
        "a Service without metadata",
        _service_without_metadata,
        "Service.v1['pg-orders-primary'] has metadata.name None",
    ),
    (
        "other children not objects",
        _set("children/ConfigMap.v1", {"x": 5}),
        "invalid sync request: children.",
    ),
    ("finalizing a string", _set("finalizing", "true"), "invalid sync request: finalizing: "),
    ("finalizing 1", _set("finalizing", 1), "invalid sync request: finalizing: "),
    ("finalizing 0", _set("finalizing", 0), "invalid sync request: finalizing: "),
    ("finalizing 1.0", _set("finalizing", 1.0), "invalid sync request: finalizing: "),
    ("finalizing null", _set("finalizing", None), "invalid sync request: finalizing: "),
    ("related a list", _set("related", []), "invalid sync request: related: "),
    ("related Pod.v1 a list", _set("related/Pod.v1", []), "invalid sync request: related."),
    (
        "a Pod that is not an object",
        _set("related/Pod.v1", {"pg-orders-0": ["pod"]}),
        "invalid sync request: related.",
    ),
    (
        "a Pod keyed by another name",
        _rename_pod,
        "Pod.v1['pg-orders-0'] has metadata.name 'pg-orders-9'",
    ),
    (
        "a Pod with list metadata",
        _pod_with_list_metadata,
        "Pod.v1['pg-orders-0'] has metadata.name None",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [c[1:] for c in BROKEN_REQUESTS],
    ids=[c[0] for c in BROKEN_REQUESTS],
)
def test_a_broken_request_raises_request_error_saying_what_is_wrong(
    mutate: Any, message: str
) -> None:
    body = sync_body(services=[make_service()])
    mutate(body)
    with pytest.raises(RequestError, match=re.escape(message)):
        load_sync_request(body)


@pytest.mark.parametrize(
    ("body", "type_name"),
    [
        ([], "list"),
        (None, "NoneType"),
        ("{}", "str"),
        (b"{}", "bytes"),
        (42, "int"),
        (True, "bool"),
    ],
)
def test_a_body_that_is_not_an_object_is_rejected_naming_its_type(
    body: object, type_name: str
) -> None:
    expected = f"request body must be a JSON object, not {type_name}"
    with pytest.raises(RequestError, match=re.escape(expected)):
        load_sync_request(body)
    with pytest.raises(RequestError, match=re.escape(expected)):
        load_customize_request(body)


def test_request_error_is_a_value_error() -> None:
    assert issubclass(RequestError, ValueError)


def test_optional_envelope_parts_get_their_defaults() -> None:
    body = sync_body(services=[make_service()])
    del body["related"], body["finalizing"], body["controller"]
    del body["parent"]["metadata"]["generation"]
    request = load_sync_request(body)
    assert (request.pods, request.finalizing, request.generation) == ({}, False, None)


@pytest.mark.parametrize("finalizing", [True, False])
def test_finalizing_accepts_only_json_booleans(finalizing: bool) -> None:
    assert load_sync_request(sync_body(finalizing=finalizing)).finalizing is finalizing


def test_children_of_other_types_are_kept_verbatim() -> None:
    extra = {
        "ConfigMap.v1": {"x": {"metadata": {"name": "x"}, "data": {"k": "v"}}},
        "Secret.v1": {},
    }
    body = sync_body(extra_children=extra)
    loaded = load_sync_request(body).other_children
    assert {k: {n: c.raw for n, c in g.items()} for k, g in loaded.items()} == extra


def test_unknown_envelope_keys_are_ignored() -> None:
    body = sync_body()
    body["somethingNew"] = {"from": "a newer Metacontroller"}
    assert load_sync_request(body).spec == SEED_DEFAULTS


def test_related_objects_of_other_types_are_not_taken_as_pods() -> None:
    body = sync_body(pods=[make_pod("pg-orders-0")])
    body["related"]["ConfigMap.v1"] = {"pg-orders-1": {"metadata": {"name": "pg-orders-1"}}}
    assert list(load_sync_request(body).pods) == ["pg-orders-0"]


# =================================================================== customize


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "invalid customize request: parent: Missing data"),
        ({"parent": []}, "invalid customize request: parent: "),
        ({"parent": {"spec": {}}}, "invalid parent: metadata: Missing"),
        ({"parent": {"metadata": {"name": "x"}}}, "invalid parent: metadata.namespace: Missing"),
    ],
)
def test_a_broken_customize_request_raises_request_error(body: object, message: str) -> None:
    with pytest.raises(RequestError, match=re.escape(message)):
        load_customize_request(body)


def test_a_customize_request_with_an_invalid_spec_loads_without_a_spec() -> None:
    body = fixture("customize-request.json")
    body["parent"]["spec"]["healthCheckPath"] = "/replica"
    assert load_customize_request(body) == ("databases/pg-orders", None)


# ------------------------------------------------- the envelope, checked by hand

_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=6,
)
_OBJECTS = st.dictionaries(
    st.text(max_size=3) | st.integers(),
    st.dictionaries(st.text(max_size=3), _ANY_JSON, max_size=2) | _ANY_JSON,
    max_size=3,
)
_GROUPS = st.dictionaries(
    st.sampled_from(["Service.v1", "Pod.v1", "x"]) | st.integers(), _OBJECTS | _ANY_JSON, max_size=3
)
_ENVELOPES = st.fixed_dictionaries(
    {},
    optional={
        "parent": _ANY_JSON,
        "children": _GROUPS | _ANY_JSON,
        "related": _GROUPS | _ANY_JSON,
        "finalizing": _ANY_JSON,
        "controller": _ANY_JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(_ENVELOPES)
def test_the_hand_checked_envelope_is_marshmallows_envelope(body: dict[str, Any]) -> None:
    """Same result, same error messages as :class:`SyncEnvelopeSchema` (the reference)."""
    try:
        expected: object = SyncEnvelopeSchema().load(body)
    except ValidationError as error:
        expected = ("invalid", error.messages)
    try:
        got: object = check_sync_envelope(body)
    except ValidationError as error:
        got = ("invalid", error.messages)
    assert got == expected


def test_the_envelope_is_not_copied() -> None:
    body = fixture("sync-service-selects-old-leader.json")
    loaded = load_sync_request(body)
    # The typed values hold the request's own objects (read-only views), not copies.
    for name, service in loaded.services.items():
        assert service.raw["spec"] is body["children"]["Service.v1"][name]["spec"]


# ============================================= messages and bounds, spelled out


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"bad key!": "v"}, "'bad key!' is not a valid label key"),
        ({"app": "bad value!"}, "'bad value!' (for 'app') is not a valid label value"),
        ({"a" * 254 + "/x": "v"}, f"'{'a' * 254}/x' is not a valid label key"),
    ],
)
def test_a_bad_label_is_named_in_the_problem(selector: dict[str, str], message: str) -> None:
    assert load_spec(seed_spec(primarySelector=selector)) == (
        None,
        (SpecProblem("spec.primarySelector", message),),
    )


def test_a_label_key_prefix_may_have_253_characters() -> None:
    spec, problems = load_spec(seed_spec(primarySelector={"a" * 253 + "/x": "v"}))
    assert problems == () and spec is not None


def test_a_server_name_that_is_an_address_is_refused_saying_what_to_do() -> None:
    spec = seed_spec(patroni={"scheme": "https", "tls": {"serverName": "10.0.0.1"}})
    assert load_spec(spec)[1] == (
        SpecProblem(
            "spec.patroni.tls.serverName",
            "must be a DNS name; to verify against the pod IP, leave serverName unset",
        ),
    )


def test_a_zero_quantity_is_a_quantity() -> None:
    fields = {"schedule": "15 2 * * *", "image": "x", "pvcName": "p", "secretName": "s"}
    spec, _ = load_spec(seed_spec(backup={**fields, "resources": {"requests": {"memory": 0}}}))
    assert spec is not None and spec.backup is not None
    assert spec.backup.resources == {"requests": {"memory": "0"}}


def test_every_problem_of_a_broken_parent_is_named() -> None:
    body = sync_body(services=[make_service()])
    body["parent"]["metadata"]["namespace"] = 5
    body["parent"]["metadata"]["name"] = None
    with pytest.raises(RequestError) as raised:
        load_sync_request(body)
    assert str(raised.value) == (
        "invalid parent: metadata.name: Field may not be null.; "
        "metadata.namespace: Not a valid string."
    )


def test_a_related_job_under_another_name_is_a_broken_request() -> None:
    body = sync_body(services=[make_service()])
    body["related"]["Job.batch/v1"] = {"a": {"metadata": {"name": "b"}}}
    with pytest.raises(RequestError) as raised:
        load_sync_request(body)
    assert str(raised.value) == "invalid sync request: Job.batch/v1['a'] has metadata.name 'b'"


def _junk_body(where: str, edit: Any) -> dict[str, Any]:
    """A valid request whose one object ``where`` (``group:name``) has ``edit`` applied."""
    body = sync_body(services=[make_service()], extra_children={"ConfigMap.v1": {}})
    body["children"]["ConfigMap.v1"]["cm"] = {"metadata": {"name": "cm"}}
    body["children"]["EndpointSlice.discovery.k8s.io/v1"] = {"s": {"metadata": {"name": "s"}}}
    body["children"]["CronJob.batch/v1"] = {"c": {"metadata": {"name": "c"}}}
    body["related"]["Job.batch/v1"] = {"j": {"metadata": {"name": "j"}}}
    group, name = where.rsplit(":", 1)
    groups = body["children"] if group in body["children"] else body["related"]
    edit(groups[group][name])
    return body


JUNK_PLACES = [
    f"Service.v1:{SERVICE_NAME}",
    "Pod.v1:pg-orders-0",
    "EndpointSlice.discovery.k8s.io/v1:s",
    "CronJob.batch/v1:c",
    "Job.batch/v1:j",
    "ConfigMap.v1:cm",
]


def _set(path: str, value: object) -> Any:
    def edit(obj: dict[str, Any]) -> None:
        if path == "metadata":
            obj["metadata"] = value
        else:
            obj["metadata"][path] = value

    return edit


@pytest.mark.parametrize("where", JUNK_PLACES)
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_set("metadata", "junk"), "has metadata.name None"),
        (_set("metadata", None), "has metadata.name None"),
        (_set("name", 7), "has metadata.name 7"),
        (_set("labels", ["a"]), "has metadata.labels that is not a map of strings to strings"),
        (_set("labels", {"a": 1}), "has metadata.labels that is not a map of strings to strings"),
        (_set("labels", "a=b"), "has metadata.labels that is not a map of strings to strings"),
        (
            _set("annotations", {"status": {"role": "primary"}}),
            "has metadata.annotations that is not a map of strings to strings",
        ),
    ],
    ids=[
        "metadata-text",
        "metadata-null",
        "name-number",
        "labels-list",
        "label-number",
        "labels-text",
        "annotation-object",
    ],
)
def test_junk_metadata_in_any_group_is_a_broken_request_that_names_the_object(
    where: str, edit: Any, problem: str
) -> None:
    group, name = where.rsplit(":", 1)
    with pytest.raises(RequestError) as raised:
        load_sync_request(_junk_body(where, edit))
    assert str(raised.value) == f"invalid sync request: {group}[{name!r}] {problem}"


@pytest.mark.parametrize("where", JUNK_PLACES)
def test_null_labels_and_annotations_are_empty_ones(where: str) -> None:
    """Kubernetes omits empty maps; ``null`` is read the same way, not refused."""

    def edit(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"] = None
        obj["metadata"]["annotations"] = None

    request = load_sync_request(_junk_body(where, edit))
    group, name = where.rsplit(":", 1)
    loaded = {
        "Service.v1": request.services,
        "Pod.v1": request.pods,
        "Job.batch/v1": request.jobs or {},
        **request.other_children,
    }[group][name]
    assert loaded.labels == {}


def test_junk_metadata_is_answered_400_with_the_reason(client: FlaskClient) -> None:
    body = _junk_body("Pod.v1:pg-orders-1", _set("labels", {"role": None}))
    response = client.post("/sync", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert response.get_json() == {
        "error": "invalid sync request: Pod.v1['pg-orders-1'] has metadata.labels that is not "
        "a map of strings to strings"
    }


@pytest.mark.parametrize("spec", ["x", [], None, 5])
def test_a_spec_that_is_not_an_object_is_one_problem(spec: object) -> None:
    assert load_spec(spec) == (None, (SpecProblem("spec", "must be an object"),))
