"""The ValidatingAdmissionPolicies in deploy/base/admission-policy.yaml, evaluated.

Test design notes:

* Every CEL expression of the rendered policies (match conditions, variables, validations,
  message expressions) is compiled and evaluated with cel-python, a CEL implementation from
  PyPI, the way the API server runs a ValidatingAdmissionPolicy: match constraints, then match
  conditions (all true, or the policy does not apply), then the validations (all true, or the
  request is refused with the message expression); an expression that fails to evaluate
  follows ``failurePolicy``; variables are evaluated in order and read as ``variables.<name>``.
* ``authorizer`` is a stub with the API server's answers for the requesting user: the test
  gives each user a set of grants ``(verb, group, resource, namespace, name)`` (``name``
  ``None``: any name), the way RBAC would answer a SubjectAccessReview, and records every
  question, so the tests also prove what is asked (and that nothing is asked when nothing
  needs checking).
* cel-python evaluates without Kubernetes' type checker; the manifests are also validated
  against the Kubernetes OpenAPI schemas (tests/test_manifests_*.py), and a negative control
  proves a broken expression fails the compile step here.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import pytest
from celpy import celtypes
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission_cases import (
    ANNOTATIONS,
    BACKUP_CASES,
    LISTS,
    SERVICE_CASES,
    SERVICE_TYPE,
    Case,
)
from tests.manifest_helpers import find, rendered

NAMESPACE = "databases"
AUTHORITY = "pg-failover-hook-backup-authority"
IMAGES = "pg-failover-hook-backup-images"

Grant = tuple[str, str, str, str, "str | None"]
#: The PostgreSQLCluster policies of deploy/ (every namespace).
POLICIES = (AUTHORITY, IMAGES, SERVICE_TYPE, ANNOTATIONS)


# --------------------------------------------------------------------- the authorizer stub


@dataclass
class Authorizer:
    """``authorizer`` of Kubernetes' CEL library, answering from a fixed set of grants."""

    grants: frozenset[Grant]
    asked: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Check:
    """One ``authorizer.group(..)...`` chain; ``check(verb)`` makes it a decision."""

    authorizer: Authorizer
    attributes: tuple[tuple[str, str], ...] = ()


def _chain(step: str) -> Callable[..., _Check]:
    def method(target: Any, value: Any) -> _Check:
        base = target if isinstance(target, _Check) else _Check(target)
        return _Check(base.authorizer, (*base.attributes, (step, str(value))))

    return method


def _check(target: _Check, verb: Any) -> celtypes.BoolType:
    asked = dict(target.attributes)
    asked["verb"] = str(verb)
    target.authorizer.asked.append(asked)
    for g_verb, group, resource, namespace, name in target.authorizer.grants:
        if (g_verb, group, resource, namespace) != (
            asked["verb"],
            asked.get("group"),
            asked.get("resource"),
            asked.get("namespace"),
        ):
            continue
        if name is None or name == asked.get("name"):
            return celtypes.BoolType(True)
    return celtypes.BoolType(False)


def _allowed(decision: celtypes.BoolType) -> celtypes.BoolType:
    return decision


#: The authorizer library's functions used by the policies. Anything else fails the test.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "group": _chain("group"),
    "resource": _chain("resource"),
    "namespace": _chain("namespace"),
    "name": _chain("name"),
    "check": _check,
    "allowed": _allowed,
}


# --------------------------------------------------------------- the admission emulation


@dataclass(frozen=True)
class Request:
    operation: str
    user: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None = None
    resource: str = "postgresqlclusters"
    group: str = "adg.io"
    version: str = "v1alpha1"


@dataclass
class Verdict:
    allowed: bool
    messages: list[str]
    asked: list[dict[str, str]]
    applied: bool


ENV = celpy.Environment()


@functools.cache
def compile_expression(text: str) -> celpy.Runner:
    """Parse once per text (lark parsing dominates the run time); programs hold no state."""
    return ENV.program(ENV.compile(text), functions=FUNCTIONS)


def expressions(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    found = [c["expression"] for c in spec.get("matchConditions", [])]
    found += [v["expression"] for v in spec.get("variables", [])]
    for validation in spec["validations"]:
        found.append(validation["expression"])
        if "messageExpression" in validation:
            found.append(validation["messageExpression"])
    return found


@functools.cache
def _rendered_base() -> list[dict[str, Any]]:
    return rendered("deploy")


def policies() -> dict[str, dict[str, Any]]:
    objects = copy.deepcopy(_rendered_base())
    return {name: find(objects, "ValidatingAdmissionPolicy", name) for name in POLICIES}


def bindings() -> dict[str, dict[str, Any]]:
    objects = copy.deepcopy(_rendered_base())
    return {name: find(objects, "ValidatingAdmissionPolicyBinding", name) for name in POLICIES}


def _matches(policy: Mapping[str, Any], request: Request) -> bool:
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        if (
            request.group in rule["apiGroups"]
            and request.version in rule["apiVersions"]
            and request.operation in rule["operations"]
            and request.resource in rule["resources"]  # "x" never matches "x/status"
        ):
            return True
    return False


def admit(
    policy: Mapping[str, Any],
    request: Request,
    grants: Iterable[Grant] = (),
    params: Mapping[str, Any] | None = None,
) -> Verdict:
    """What the API server decides for ``request`` under ``policy`` (and its binding)."""
    authorizer = Authorizer(frozenset(grants))
    if not _matches(policy, request):
        return Verdict(True, [], authorizer.asked, applied=False)
    binding = bindings()[policy["metadata"]["name"]]
    spec = policy["spec"]
    if "paramKind" in spec and params is None:
        action = binding["spec"]["paramRef"]["parameterNotFoundAction"]
        return Verdict(action == "Allow", [], authorizer.asked, applied=False)
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(copy.deepcopy(request.object)),
        "oldObject": celpy.json_to_cel(copy.deepcopy(request.old_object)),
        "request": celpy.json_to_cel(
            {
                "operation": request.operation,
                "userInfo": {"username": request.user},
                "namespace": NAMESPACE,
            }
        ),
        "params": celpy.json_to_cel(copy.deepcopy(params)),
        "authorizer": authorizer,
    }
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"

    def run(text: str) -> Any:
        return compile_expression(text).evaluate(activation)

    try:
        for condition in spec.get("matchConditions", []):
            if not bool(run(condition["expression"])):
                return Verdict(True, [], authorizer.asked, applied=False)
        variables: dict[str, Any] = {}
        for variable in spec.get("variables", []):
            activation["variables"] = celtypes.MapType(
                {celtypes.StringType(k): v for k, v in variables.items()}
            )
            variables[variable["name"]] = run(variable["expression"])
        activation["variables"] = celtypes.MapType(
            {celtypes.StringType(k): v for k, v in variables.items()}
        )
        messages = []
        for validation in spec["validations"]:
            result = run(validation["expression"])
            if isinstance(result, celpy.CELEvalError):
                raise result
            if not bool(result):
                messages.append(str(run(validation["messageExpression"])))
        # The real API server (tests/test_admission_real.py) reports the first failed
        # validation only, even when later ones fail too.
        messages = messages[:1]
    except celpy.CELEvalError as error:
        return Verdict(not fail_closed, [f"error: {error}"], authorizer.asked, applied=True)
    verdict = Verdict(not messages, messages, authorizer.asked, applied=True)
    assert binding["spec"]["validationActions"] == ["Deny"]
    return verdict


# -------------------------------------------------------------------------- requests


def cluster(backup: Mapping[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "primarySelector": {"application": "patroni", "cluster-name": "pg-orders"},
        "serviceRef": {"name": "pg-orders-primary"},
        "healthCheckPath": "/primary",
        "service": {"type": "ClusterIP", "ports": [{"name": "postgresql", "port": 5432}]},
    }
    body.update(spec)
    if backup is not None:
        body["backup"] = dict(backup)
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": "pg-orders", "namespace": NAMESPACE, "labels": {"team": "a"}},
        "spec": body,
    }


BACKUP = {
    "schedule": "15 2 * * *",
    "image": "docker.io/library/postgres:17.6",
    "pvcName": "pg-orders-backups",
    "secretName": "pg-orders-replication",
    "keep": 3,
}
CRONJOBS: Grant = ("create", "batch", "cronjobs", NAMESPACE, None)
SECRET: Grant = ("get", "", "secrets", NAMESPACE, "pg-orders-replication")
ALL_SECRETS: Grant = ("get", "", "secrets", NAMESPACE, None)
BOTH = (CRONJOBS, SECRET)
ASKED_CRONJOBS = {
    "group": "batch",
    "resource": "cronjobs",
    "namespace": NAMESPACE,
    "verb": "create",
}
ASKED_SECRET = {
    "group": "",
    "resource": "secrets",
    "namespace": NAMESPACE,
    "name": "pg-orders-replication",
    "verb": "get",
}


def create(obj: Mapping[str, Any], user: str = "alice") -> Request:
    return Request("CREATE", user, obj)


def update(old: Mapping[str, Any], new: Mapping[str, Any], user: str = "alice") -> Request:
    return Request("UPDATE", user, new, old)


def authority(request: Request, grants: Iterable[Grant] = ()) -> Verdict:
    return admit(policies()[AUTHORITY], request, grants)


# ----------------------------------------------------------------------------- tests


def test_every_expression_compiles() -> None:
    for policy in policies().values():
        texts = expressions(policy)
        assert texts
        for text in texts:
            compile_expression(text)


def test_negative_control_a_broken_expression_does_not_compile() -> None:
    with pytest.raises(celpy.CELParseError):
        compile_expression("authorizer.group('batch'.check(")


def test_the_policies_are_bound_to_deny_in_every_namespace() -> None:
    for name, binding in bindings().items():
        assert binding["spec"]["policyName"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "matchResources" not in binding["spec"], "every namespace"
    for policy in policies().values():
        assert policy["spec"]["failurePolicy"] == "Fail"


def test_create_with_backup_by_a_user_who_may_do_both_is_allowed() -> None:
    verdict = authority(create(cluster(BACKUP)), BOTH)
    assert verdict.allowed and verdict.applied
    assert verdict.asked == [ASKED_CRONJOBS, ASKED_SECRET]


def test_create_with_backup_without_cronjob_create_is_refused() -> None:
    verdict = authority(create(cluster(BACKUP)), [SECRET])
    assert not verdict.allowed
    assert verdict.messages == [
        "spec.backup makes Metacontroller create a CronJob in namespace databases, and alice "
        "may not create CronJobs there"
    ]


def test_create_with_backup_without_get_on_the_secret_is_refused() -> None:
    other_secret: Grant = ("get", "", "secrets", NAMESPACE, "another-secret")
    elsewhere: Grant = ("get", "", "secrets", "other-namespace", None)
    list_only: Grant = ("list", "", "secrets", NAMESPACE, None)
    cronjobs_elsewhere: Grant = ("create", "batch", "cronjobs", "other-namespace", None)
    for grants in (
        [CRONJOBS],
        [CRONJOBS, other_secret],
        [CRONJOBS, elsewhere],
        [CRONJOBS, list_only],
    ):
        verdict = authority(create(cluster(BACKUP)), grants)
        assert not verdict.allowed, grants
        assert verdict.messages == [
            "spec.backup hands the Secret pg-orders-replication to the backup Job, and alice "
            "may not get that Secret in namespace databases"
        ]
    assert not authority(create(cluster(BACKUP)), [cronjobs_elsewhere, SECRET]).allowed
    # Both validations fail; the API server reports the first one only.
    assert authority(create(cluster(BACKUP))).messages == [
        "spec.backup makes Metacontroller create a CronJob in namespace databases, and alice "
        "may not create CronJobs there"
    ]
    assert authority(create(cluster(BACKUP)), [CRONJOBS, ALL_SECRETS]).allowed


def test_create_without_backup_asks_nothing() -> None:
    verdict = authority(create(cluster()))
    assert verdict.allowed and not verdict.applied and verdict.asked == []


def test_adding_a_backup_is_checked() -> None:
    request = update(cluster(), cluster(BACKUP))
    assert not authority(request, [SECRET]).allowed
    assert not authority(request, [CRONJOBS]).allowed
    assert authority(request, BOTH).allowed


@pytest.mark.parametrize(
    "change",
    [
        {"image": "attacker.example/tool:1"},
        {"secretName": "pg-orders-superuser"},
        {"pvcName": "someone-elses-pvc"},
        {"schedule": "* * * * *"},
        {"keep": 100},
    ],
)
def test_changing_the_backup_is_checked(change: dict[str, Any]) -> None:
    request = update(cluster(BACKUP), cluster({**BACKUP, **change}))
    secret = {**BACKUP, **change}["secretName"]
    grants: list[Grant] = [CRONJOBS, ("get", "", "secrets", NAMESPACE, secret)]
    assert authority(request, grants).allowed
    assert not authority(request, grants[:1]).allowed
    assert not authority(request, grants[1:]).allowed
    assert not authority(request).allowed


def test_the_secret_checked_is_the_new_one() -> None:
    request = update(cluster(BACKUP), cluster({**BACKUP, "secretName": "pg-orders-superuser"}))
    verdict = authority(request, BOTH)  # may read the OLD Secret only
    assert not verdict.allowed
    assert verdict.asked[1]["name"] == "pg-orders-superuser"


@pytest.mark.parametrize(
    "spec",
    [
        {"serviceRef": {"name": "attacker-service"}},
        {"service": {"type": "ClusterIP", "ports": [{"name": "postgresql", "port": 6432}]}},
    ],
)
def test_changing_where_the_backup_connects_is_checked(spec: dict[str, Any]) -> None:
    """PGHOST/PGPORT of the Job come from these: the password goes there."""
    request = update(cluster(BACKUP), cluster(BACKUP, **spec))
    assert not authority(request, [CRONJOBS]).allowed
    assert authority(request, BOTH).allowed
    # Without a backup the same change needs nothing.
    assert authority(update(cluster(), cluster(None, **spec))).allowed


def test_an_update_that_leaves_the_backup_alone_asks_nothing() -> None:
    """Metacontroller's finalizer update, another owner's edit of other fields."""
    old = cluster(BACKUP)
    for edit in (
        lambda o: o["metadata"].update(finalizers=["metacontroller.io/x"]),
        lambda o: o["metadata"]["labels"].update(team="b"),
        lambda o: o["spec"].update(healthCheckPath="/master"),
        lambda o: o["spec"]["primarySelector"].update(extra="label"),
        lambda o: o["spec"]["service"].update(type="LoadBalancer"),
    ):
        new = copy.deepcopy(old)
        edit(new)
        verdict = authority(update(old, new, user="system:serviceaccount:metacontroller:mc"))
        assert verdict.allowed and verdict.asked == [], new


def test_removing_the_backup_asks_nothing() -> None:
    verdict = authority(update(cluster(BACKUP), cluster()))
    assert verdict.allowed and verdict.asked == []


def test_status_writes_and_deletes_are_not_matched() -> None:
    status = Request(
        "UPDATE", "mc", cluster(BACKUP), cluster(), resource="postgresqlclusters/status"
    )
    assert not authority(status).applied and authority(status).allowed
    delete = Request("DELETE", "bob", None, cluster(BACKUP))
    assert not authority(delete).applied


def _grants_strategy() -> st.SearchStrategy[frozenset[Grant]]:
    return st.frozensets(
        st.sampled_from(
            [
                CRONJOBS,
                SECRET,
                ALL_SECRETS,
                ("get", "", "secrets", NAMESPACE, "pg-orders-superuser"),
                ("create", "batch", "jobs", NAMESPACE, None),
                ("create", "batch", "cronjobs", "elsewhere", None),
                ("update", "batch", "cronjobs", NAMESPACE, None),
            ]
        )
    )


BACKUPS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "schedule": st.sampled_from(["15 2 * * *", "@hourly"]),
            "image": st.sampled_from(["postgres:17", "evil:1"]),
            "pvcName": st.sampled_from(["a", "b"]),
            "secretName": st.sampled_from(["pg-orders-replication", "pg-orders-superuser"]),
        }
    ),
)


def _may(grants: frozenset[Grant], verb: str, group: str, resource: str, name: str) -> bool:
    return any(
        (v, g, r, n) == (verb, group, resource, NAMESPACE) and (x is None or x == name)
        for v, g, r, n, x in grants
    )


@settings(max_examples=150, deadline=None)
@given(
    old=BACKUPS,
    new=BACKUPS,
    port=st.sampled_from([5432, 6432]),
    create_it=st.booleans(),
    grants=_grants_strategy(),
)
def test_property_allowed_iff_unchanged_or_the_user_could_do_it_alone(
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    port: int,
    create_it: bool,
    grants: frozenset[Grant],
) -> None:
    new_obj = cluster(new)
    new_obj["spec"]["service"]["ports"][0]["port"] = port
    request = create(new_obj) if create_it else update(cluster(old), new_obj)
    verdict = authority(request, grants)
    gives_something = new is not None and (create_it or old != new or port != 5432)
    could = new is not None and (
        _may(grants, "create", "batch", "cronjobs", "")
        and _may(grants, "get", "", "secrets", new["secretName"])
    )
    assert verdict.allowed == (not gives_something or could)
    if not gives_something:
        assert verdict.asked == []


# ---------------------------------------------------------------- the image allow-list


def images(request: Request, data: Mapping[str, str] | None, with_data: bool = True) -> Verdict:
    params = None
    if data is not None:
        params = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": IMAGES}}
        if with_data:
            params["data"] = dict(data)
    return admit(policies()[IMAGES], request, params=params)


ALLOW = {"postgres": "docker.io/library/postgres:", "internal": "registry.example.com/db/"}


def test_no_allow_list_allows_every_image() -> None:
    binding = bindings()[IMAGES]["spec"]["paramRef"]
    assert binding == {
        "name": IMAGES,
        "namespace": "pg-failover-hook",
        "parameterNotFoundAction": "Allow",
    }
    assert images(create(cluster({**BACKUP, "image": "anything:1"})), None).allowed


def test_the_allow_list_admits_prefixes_only() -> None:
    for image, allowed in (
        ("docker.io/library/postgres:17.6", True),
        ("registry.example.com/db/postgres@sha256:" + "0" * 64, True),
        ("docker.io/library/postgres-evil:17", False),
        ("attacker.example/docker.io/library/postgres:17", False),
        ("postgres:17", False),
    ):
        verdict = images(create(cluster({**BACKUP, "image": image})), ALLOW)
        assert verdict.allowed == allowed, image
        if not allowed:
            assert verdict.messages == [
                f"spec.backup.image {image} is not on the allow-list "
                "(ConfigMap pg-failover-hook/pg-failover-hook-backup-images)"
            ]


def test_an_empty_allow_list_admits_no_image() -> None:
    assert not images(create(cluster(BACKUP)), {}, with_data=False).allowed
    assert not images(create(cluster(BACKUP)), {}).allowed


def test_the_allow_list_checks_new_images_only() -> None:
    old = cluster({**BACKUP, "image": "legacy:1"})
    unchanged = cluster({**BACKUP, "image": "legacy:1", "keep": 9})
    assert images(update(old, unchanged), ALLOW).allowed
    assert not images(update(old, cluster({**BACKUP, "image": "other:2"})), ALLOW).allowed
    assert images(update(old, cluster(BACKUP)), ALLOW).allowed
    assert images(update(old, cluster()), ALLOW).allowed  # backup removed


def test_failure_policy_refuses_when_an_expression_errors() -> None:
    """A spec.backup without secretName (the CRD would refuse it) cannot be evaluated."""
    broken = {k: v for k, v in BACKUP.items() if k != "secretName"}
    verdict = authority(create(cluster(broken)), BOTH)
    assert not verdict.allowed and verdict.messages[0].startswith("error:")


# ------------------------------------------------------------ the shared case table


@pytest.mark.parametrize("case", BACKUP_CASES, ids=lambda case: case.id)
def test_case_table(case: Case) -> None:
    """tests/admission_cases.py, the table the real API server decides too."""
    request = Request(
        case.operation,
        "alice",
        case.new,
        case.old,
        resource="postgresqlclusters/status" if case.status else "postgresqlclusters",
    )
    verdicts = [authority(request, case.grants), images(request, LISTS[case.allow_list])]
    if case.policy == IMAGES:
        verdicts.reverse()
    decided, other = verdicts
    assert decided.allowed == case.allowed, decided
    if case.schema_refuses:  # the server's schema refuses it first; here the expression errs
        assert decided.messages[0].startswith("error:")
        return
    assert tuple(decided.messages) == case.messages
    # The other policy lets every case of the table through (what the real server runs).
    assert other.allowed, other


# ------------------------------------------------- spec.service: type and annotations


def shipped_annotation_list() -> dict[str, Any]:
    """The ConfigMap deploy/base ships as the annotation allow-list (the policy's params)."""
    return copy.deepcopy(find(_rendered_base(), "ConfigMap", ANNOTATIONS))


@pytest.mark.parametrize("case", SERVICE_CASES, ids=lambda case: case.id)
def test_service_case_table(case: Case) -> None:
    """tests/admission_cases.py's spec.service cases, the ones the real API server decides."""
    request = Request(
        case.operation,
        "alice",
        case.new,
        case.old,
        resource="postgresqlclusters/status" if case.status else "postgresqlclusters",
    )
    verdicts = {
        SERVICE_TYPE: admit(policies()[SERVICE_TYPE], request, case.grants),
        ANNOTATIONS: admit(policies()[ANNOTATIONS], request, (), shipped_annotation_list()),
    }
    decided = verdicts.pop(case.policy)
    assert decided.allowed == case.allowed, decided
    assert tuple(decided.messages) == case.messages
    (other,) = verdicts.values()
    assert other.allowed, other


def test_keeping_the_type_or_clusterip_asks_the_authorizer_nothing() -> None:
    policy = policies()[SERVICE_TYPE]
    lb = cluster(service={"type": "LoadBalancer", "ports": [{"name": "p", "port": 1}]})
    moved = cluster(service={"type": "LoadBalancer", "ports": [{"name": "p", "port": 2}]})
    assert admit(policy, update(lb, moved)).asked == []
    assert admit(policy, create(cluster())).asked == []
    refused = admit(policy, create(lb))
    assert not refused.allowed
    assert refused.asked[0] == {
        "group": "",
        "resource": "services",
        "namespace": NAMESPACE,
        "verb": "create",
    }


def test_the_annotation_list_switches_off_without_its_configmap() -> None:
    key = "external-dns.alpha.kubernetes.io/hostname"
    request = create(cluster(service={"type": "ClusterIP", "annotations": {key: "x"}}))
    policy = policies()[ANNOTATIONS]
    assert not admit(policy, request, (), shipped_annotation_list()).allowed
    assert admit(policy, request, (), None).allowed  # parameterNotFoundAction: Allow
    assert not admit(policy, request, (), {"data": {}}).allowed  # an empty list: no key
    assert admit(
        policy, request, (), {"data": {"dns": "external-dns.alpha.kubernetes.io/"}}
    ).allowed
