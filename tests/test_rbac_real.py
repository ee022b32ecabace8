"""Least privilege on the real API server: Metacontroller's ClusterRole and the events
overlay's hook account, as its RBAC authorizer decides.

Test design notes:

* Metacontroller's identity is ``system:serviceaccount:metacontroller:metacontroller`` with a
  bound token (testbed/kubernetes/accounts.py), its ClusterRole exactly ``clusterRole.rules`` of
  deploy/metacontroller-values.yaml. CALLS lists the requests Metacontroller v4.17.2 makes
  for pg-failover-hook (each with the source that makes it; tests/test_rbac.py and the
  values' comments have the paths): every one is allowed, asked with ``kubectl auth can-i
  --as=...``; and removing any one rule from the ClusterRole denies at least one of them
  (asked by SelfSubjectAccessReview with the token), so no rule is there for nothing.
* NOT_CALLED: requests v4.17.2 does not make and the role must not grant: ``patch`` on the
  children (only --apply-strategy=server-side-apply patches), events.k8s.io Events (leader
  election records through the core recorder), writes to Pods or Jobs, other leases.
* The events overlay's hook account may create events.k8s.io Events and nothing else: a
  matrix of every verb over the resources it could plausibly touch.
* RBAC reaches the authorizer through informers: each change is waited for (bounded).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.accounts import (
    METACONTROLLER_ACCOUNT,
    METACONTROLLER_NAMESPACE,
    metacontroller_kubeconfig,
    metacontroller_rules,
    service_account_kubeconfig,
    subject,
)
from testbed.kubernetes.rest import KubeRest
from tests.helpers import wait_for
from tests.manifest_helpers import CRD_FILE, METACONTROLLER_CRDS, rendered

NS = "databases"  # a namespace of PostgreSQLClusters (RBAC needs it to exist only for nothing)
HOOK_NS = "pg-failover-hook"
WAIT = 30.0


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str
    why: str
    namespace: str | None = NS
    name: str | None = None
    subresource: str = ""

    def can_i_args(self) -> list[str]:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.name:
            resource += f"/{self.name}"
        args = ["auth", "can-i", self.verb, resource]
        args += ["-n", self.namespace] if self.namespace else ["--all-namespaces"]
        if self.subresource:
            args.append(f"--subresource={self.subresource}")
        return args

    def attributes(self) -> dict[str, str]:
        found = {"verb": self.verb, "group": self.group, "resource": self.resource}
        if self.namespace:
            found["namespace"] = self.namespace
        if self.name:
            found["name"] = self.name
        if self.subresource:
            found["subresource"] = self.subresource
        return found


def _informer(group: str, resource: str, why: str) -> list[Call]:
    """A cluster-wide informer: list and watch in every namespace."""
    return [Call(verb, group, resource, why, namespace=None) for verb in ("list", "watch")]


CHILDREN = (("", "services"), ("discovery.k8s.io", "endpointslices"), ("batch", "cronjobs"))
#: The requests Metacontroller v4.17.2 makes for pg-failover-hook.
CALLS: list[Call] = [
    *_informer("metacontroller.k8s.io", "compositecontrollers", "server.go: manager cache"),
    *_informer("metacontroller.k8s.io", "decoratorcontrollers", "server.go: manager cache"),
    Call("get", "metacontroller.k8s.io", "compositecontrollers", "Reconcile", None, "pgfh"),
    *_informer("metacontroller.k8s.io", "controllerrevisions", "NewMetacontroller informer"),
    *[
        Call(verb, "metacontroller.k8s.io", "controllerrevisions", "manageRevisions")
        for verb in ("get", "create", "update", "delete")
    ],
    *_informer("apiextensions.k8s.io", "customresourcedefinitions", "cached Get of the CRD"),
    Call("get", "apiextensions.k8s.io", "customresourcedefinitions", "Reconcile", None, "x"),
    Call("create", "coordination.k8s.io", "leases", "LeaseLock.Create", METACONTROLLER_NAMESPACE),
    *[
        Call(
            verb,
            "coordination.k8s.io",
            "leases",
            "LeaseLock",
            METACONTROLLER_NAMESPACE,
            "metacontroller",
        )
        for verb in ("get", "update")
    ],
    *[
        Call(verb, "", "events", "pkg/events EventSinkImpl, leader election")
        for verb in ("create", "patch")
    ],
    *_informer("", "secrets", "endpointConfigs secretRef: cached client"),
    Call("get", "", "secrets", "ResolveAuthorization", HOOK_NS, "pg-failover-hook-auth"),
    *_informer("adg.io", "postgresqlclusters", "parent informer"),
    *[
        Call(verb, "adg.io", "postgresqlclusters", "live Get; finalizer AtomicUpdate")
        for verb in ("get", "update")
    ],
    Call("update", "adg.io", "postgresqlclusters", "AtomicStatusUpdate", subresource="status"),
    Call("update", "adg.io", "postgresqlclusters", "blockOwnerDeletion", subresource="finalizers"),
    *[
        call
        for group, resource in CHILDREN
        for call in (
            *_informer(group, resource, "child informer"),
            *[
                Call(verb, group, resource, "manage_children.go dynamic-apply; adoptChild")
                for verb in ("get", "create", "update", "delete")
            ],
        )
    ],
    *_informer("", "pods", "related: spec.primarySelector"),
    *_informer("batch", "jobs", "related: the backup Jobs"),
    *_informer("", "namespaces", "customize manager namespace informer"),
]
#: Requests Metacontroller v4.17.2 does not make for pg-failover-hook: denied.
NOT_CALLED: list[Call] = [
    *[Call("patch", group, resource, "server-side apply only") for group, resource in CHILDREN],
    *[
        Call(verb, "events.k8s.io", "events", "no events.k8s.io recorder")
        for verb in ("create", "patch")
    ],
    Call("patch", "adg.io", "postgresqlclusters", "AtomicUpdate is Get + Update"),
    Call("delete", "adg.io", "postgresqlclusters", "never deletes a parent"),
    Call("create", "", "pods", "related objects are read only"),
    Call("delete", "batch", "jobs", "related objects are read only"),
    Call(
        "update",
        "coordination.k8s.io",
        "leases",
        "another lease",
        METACONTROLLER_NAMESPACE,
        "other",
    ),
    Call("list", "", "configmaps", "no configMapRef in endpointConfigs"),
    Call("create", "", "secrets", "secrets are read"),
]


def _wait(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    wait_for(what, check, timeout)


def self_review(rest: KubeRest, call: Call) -> bool:
    """SelfSubjectAccessReview with the account's own token."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": call.attributes()},
    }
    answer = rest.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def can_i(plane: ControlPlane, user: str, call: Call) -> bool:
    result = plane.kubectl(*call.can_i_args(), f"--as={user}", check=False)
    if result.returncode not in (0, 1) or result.stdout.strip() not in ("yes", "no"):
        raise AssertionError(f"kubectl {' '.join(call.can_i_args())}: {result.stderr}")
    return result.returncode == 0


@pytest.fixture(scope="module")
def metacontroller(control_plane: ControlPlane) -> Iterator[tuple[Path, KubeRest]]:
    # kubectl auth can-i resolves a resource through discovery: without the CRDs it asks
    # about a resource that does not exist and answers "no".
    for crds in (METACONTROLLER_CRDS, CRD_FILE):
        control_plane.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=pgfh-test",
            "-f",
            str(crds),
        )
    control_plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubeconfig = metacontroller_kubeconfig(control_plane)
    rest = KubeRest.from_kubeconfig(kubeconfig)
    try:
        _wait(
            "the ClusterRole reaches the authorizer",
            lambda: all(self_review(rest, c) for c in CALLS[:1]),
        )
        yield kubeconfig, rest
    finally:
        rest.close()


def test_the_token_is_metacontrollers_service_account(
    metacontroller: tuple[Path, KubeRest],
) -> None:
    kubeconfig, rest = metacontroller
    answer = rest.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    user = answer["status"]["userInfo"]
    assert user["username"] == subject(METACONTROLLER_NAMESPACE, METACONTROLLER_ACCOUNT)
    assert "system:serviceaccounts:metacontroller" in user["groups"]
    assert "token" in yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]


def test_every_call_metacontroller_makes_is_allowed(
    control_plane: ControlPlane, metacontroller: tuple[Path, KubeRest]
) -> None:
    user = subject(METACONTROLLER_NAMESPACE, METACONTROLLER_ACCOUNT)
    _wait(
        "every rule reaches the authorizer",
        lambda: all(self_review(metacontroller[1], c) for c in CALLS),
    )
    denied = [call for call in CALLS if not can_i(control_plane, user, call)]
    assert denied == []


def test_calls_metacontroller_does_not_make_are_denied(
    control_plane: ControlPlane, metacontroller: tuple[Path, KubeRest]
) -> None:
    user = subject(METACONTROLLER_NAMESPACE, METACONTROLLER_ACCOUNT)
    _wait(
        "every rule reaches the authorizer",
        lambda: all(self_review(metacontroller[1], c) for c in CALLS),
    )
    allowed = [call for call in NOT_CALLED if can_i(control_plane, user, call)]
    assert allowed == []


def test_removing_any_rule_denies_a_call_metacontroller_makes(
    control_plane: ControlPlane, metacontroller: tuple[Path, KubeRest]
) -> None:
    _, rest = metacontroller
    rules = metacontroller_rules()
    needed_by: dict[int, list[Call]] = {}
    try:
        for index in range(len(rules)):
            without = rules[:index] + rules[index + 1 :]
            metacontroller_kubeconfig(control_plane, rules=copy.deepcopy(without))
            try:
                _wait(
                    f"removing rule {index} {rules[index]} denies some call",
                    lambda: any(not self_review(rest, call) for call in CALLS),
                    timeout=10,
                )
            except AssertionError:
                needed_by[index] = []
            else:
                needed_by[index] = [call for call in CALLS if not self_review(rest, call)]
            metacontroller_kubeconfig(control_plane)  # restore, and wait for it
            _wait("the full rules again", lambda: all(self_review(rest, call) for call in CALLS))
    finally:
        metacontroller_kubeconfig(control_plane)
    unneeded = [rules[index] for index, calls in needed_by.items() if not calls]
    assert unneeded == [], "rules no call of Metacontroller v4.17.2 needs"


# ------------------------------------------------------------- the events overlay


VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
RESOURCES = (
    ("", "events"),
    ("events.k8s.io", "events"),
    ("", "pods"),
    ("", "services"),
    ("", "secrets"),
    ("", "configmaps"),
    ("adg.io", "postgresqlclusters"),
    ("discovery.k8s.io", "endpointslices"),
    ("coordination.k8s.io", "leases"),
)


@pytest.fixture(scope="module")
def hook_account(control_plane: ControlPlane) -> Iterator[KubeRest]:
    objects = rendered("deploy/events")
    rbac = [
        o
        for o in objects
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    assert {o["kind"] for o in rbac} == {"ClusterRole", "ClusterRoleBinding"}
    kubeconfig = service_account_kubeconfig(control_plane, HOOK_NS, "pg-failover-hook", rbac=rbac)
    rest = KubeRest.from_kubeconfig(kubeconfig)
    try:
        event = Call("create", "events.k8s.io", "events", "hooks/shell/events.py")
        _wait("the events ClusterRole reaches the authorizer", lambda: self_review(rest, event))
        yield rest
    finally:
        rest.close()


def test_the_hook_account_may_create_events_and_nothing_else(
    control_plane: ControlPlane, hook_account: KubeRest
) -> None:
    user = subject(HOOK_NS, "pg-failover-hook")
    matrix = {
        (verb, group, resource, namespace or "*"): self_review(
            hook_account, Call(verb, group, resource, "matrix", namespace)
        )
        for verb in VERBS
        for group, resource in RESOURCES
        for namespace in (NS, None)
    }
    assert len(matrix) == len(VERBS) * len(RESOURCES) * 2
    allowed = sorted(key for key, yes in matrix.items() if yes)
    # Create, in one namespace and in all: a ClusterRole, as PostgreSQLClusters live anywhere.
    assert allowed == [
        ("create", "events.k8s.io", "events", "*"),
        ("create", "events.k8s.io", "events", NS),
    ]
    # kubectl auth can-i --as says the same for the one grant and a neighbour.
    assert can_i(control_plane, user, Call("create", "events.k8s.io", "events", "hook"))
    assert not can_i(control_plane, user, Call("patch", "events.k8s.io", "events", "hook"))
    assert not can_i(control_plane, user, Call("create", "", "events", "hook"))


def test_negative_control_can_i_sees_a_removed_grant(control_plane: ControlPlane) -> None:
    """The matrix can fail: an account without the binding is denied the one grant."""
    kubeconfig = service_account_kubeconfig(control_plane, HOOK_NS, "unbound")
    rest = KubeRest.from_kubeconfig(kubeconfig)
    try:
        assert not self_review(rest, Call("create", "events.k8s.io", "events", "nothing bound"))
    finally:
        rest.close()
