"""deploy/base/admission-pod-name.yaml decided by the real API server, with real users and the
real StatefulSet controller (kube-controller-manager's statefulset-controller, as its own
ServiceAccount with its bootstrap RBAC).

Test design notes:

* The policy AND its binding are applied exactly as rendered from deploy/ (the binding's
  namespaceSelector is the documented opt-in label): the run's "enforced" namespace carries
  the label, a second namespace does not. Other tests' namespaces never carry it, so the
  binding changes nothing for them on the shared control plane.
* The attacker is a client-certificate user who may create, update and patch Pods in both
  namespaces (a tenant, a CI job): what the issue's intruder Pod needs, nothing more.
* Creates by the tenant are real (the objects exist afterwards) where a later update is
  tested; single verdicts use ``dryRun=All`` (admission runs, nothing is stored).
* Bindings and RBAC reach the server's caches asynchronously: each is waited for, bounded, by
  a request whose verdict proves it took effect.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from tests.helpers import wait_for
from tests.manifest_helpers import find, rendered

POLICY = "pg-failover-hook-unique-pod-name"
OPT_IN = {"pg-failover-hook.adg.io/unique-pod-name": "enforce"}
POD_NAME = "statefulset.kubernetes.io/pod-name"
RBAC = "rbac.authorization.k8s.io/v1"
WAIT = 60.0


def _wait(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    wait_for(what, check, timeout)


def pod(name: str, label: str | None, generate: bool = False) -> dict[str, Any]:
    labels = {"application": "patroni", "cluster-name": "pg-orders"}
    if label is not None:
        labels[POD_NAME] = label
    metadata: dict[str, Any] = {"labels": labels}
    metadata["generateName" if generate else "name"] = name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "db", "image": "postgres:17"}]},
    }


@dataclass
class Env:
    plane: ControlPlane
    admin: KubeRest
    tenant: KubeRest
    enforced: str
    other: str

    def create(
        self, namespace: str, body: Mapping[str, Any], dry_run: bool = True
    ) -> tuple[int, str]:
        params = {"dryRun": "All"} if dry_run else None
        try:
            self.tenant.request(
                "POST", resource_path("v1", "pods", namespace), body=body, params=params
            )
        except KubeApiError as error:
            return error.status, error.message
        return 201, ""

    def patch(
        self, namespace: str, name: str, body: Mapping[str, Any], subresource: str = ""
    ) -> tuple[int, str]:
        path = resource_path("v1", "pods", namespace, name) + subresource
        try:
            self.tenant.merge_patch(path, body)
        except KubeApiError as error:
            return error.status, error.message
        return 200, ""


def _namespace(admin: KubeRest, name: str, labels: Mapping[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    admin.apply(resource_path("v1", "namespaces", name=name), body, "pgfh-test")


def _tenant(plane: ControlPlane, admin: KubeRest, user: str, namespaces: tuple[str, ...]) -> None:
    for namespace in namespaces:
        role = {
            "apiVersion": RBAC,
            "kind": "Role",
            "metadata": {"name": "tenant", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "pods/status"],
                    "verbs": ["get", "create", "update", "patch", "delete"],
                }
            ],
        }
        binding = {
            "apiVersion": RBAC,
            "kind": "RoleBinding",
            "metadata": {"name": "tenant", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        admin.apply(resource_path(RBAC, "roles", namespace, "tenant"), role, "pgfh-test")
        admin.apply(resource_path(RBAC, "rolebindings", namespace, "tenant"), binding, "pgfh-test")
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "resourceAttributes": {
                    "verb": "patch",
                    "resource": "pods",
                    "subresource": "status",
                    "namespace": namespace,
                },
            },
        }
        _wait(
            f"RBAC lets {user} write Pods in {namespace}",
            lambda review=review: bool(
                admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)[
                    "status"
                ].get("allowed")
            ),
        )


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[Env]:
    run = uuid.uuid4().hex[:8]
    admin = KubeRest.from_kubeconfig(control_plane.admin_kubeconfig)
    enforced, other = f"podname-{run}", f"podname-{run}-other"
    _namespace(admin, enforced, OPT_IN)
    _namespace(admin, other, {})
    user = f"tenant-{run}"
    _tenant(control_plane, admin, user, (enforced, other))
    tenant = KubeRest.from_kubeconfig(control_plane.user_kubeconfig(user))
    objects = rendered("deploy")
    shipped = [
        find(objects, "ValidatingAdmissionPolicy", POLICY),
        find(objects, "ValidatingAdmissionPolicyBinding", POLICY),
    ]
    control_plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=pgfh-test",
        "-f",
        "-",
        input_text=yaml.safe_dump_all(shipped),
    )
    environment = Env(control_plane, admin, tenant, enforced, other)
    try:
        _wait(
            "the binding refuses an intruder Pod in the opted-in namespace",
            lambda: environment.create(enforced, pod("probe", "pg-orders-1"))[0] == 422,
        )
        yield environment
    finally:
        control_plane.kubectl(
            "delete", "validatingadmissionpolicybinding", POLICY, "--ignore-not-found", check=False
        )
        for name in (enforced, other):
            control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
        tenant.close()
        admin.close()


def expected(name: str, label: str) -> str:
    return (
        f"label statefulset.kubernetes.io/pod-name must equal the Pod's own name ({name}), "
        f'not "{label}": only a StatefulSet\'s own Pod may carry it (pg-failover-hook routes '
        "the primary Service by it)"
    )


def assert_refused(outcome: tuple[int, str], name: str, label: str) -> None:
    status, message = outcome
    assert status == 422, outcome
    assert f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}'" in message, message
    assert message.endswith(f"denied request: {expected(name, label)}"), message


def test_an_intruder_pod_with_the_leaders_label_is_refused(env: Env) -> None:
    """The issue's attack: a second Pod labelled like the leader."""
    assert_refused(
        env.create(env.enforced, pod("pg-orders-9", "pg-orders-1")), "pg-orders-9", "pg-orders-1"
    )


def test_a_pod_whose_label_is_its_own_name_is_admitted(env: Env) -> None:
    assert env.create(env.enforced, pod("pg-orders-7", "pg-orders-7")) == (201, "")
    assert env.create(env.enforced, pod("pg-orders-8", None)) == (201, "")


def test_namespaces_without_the_opt_in_label_are_not_judged(env: Env) -> None:
    assert env.create(env.other, pod("pg-orders-9", "pg-orders-1")) == (201, "")


def test_generate_name_pods_are_judged_with_the_name_they_get(env: Env) -> None:
    """Validating admission runs after the name is generated: the message shows it."""
    status, message = env.create(env.enforced, pod("pg-orders-", "pg-orders-1", generate=True))
    assert status == 422, message
    assert "must equal the Pod's own name (pg-orders-" in message
    assert "(not yet named)" not in message


def test_labels_added_or_changed_later_are_judged(env: Env) -> None:
    ns = env.enforced
    assert env.create(ns, pod("plain", None), dry_run=False) == (201, "")
    assert env.create(ns, pod("member", "member"), dry_run=False) == (201, "")
    # Added later, through the Pod and through its status subresource.
    steal = {"metadata": {"labels": {POD_NAME: "pg-orders-1"}}}
    assert_refused(env.patch(ns, "plain", steal), "plain", "pg-orders-1")
    assert_refused(env.patch(ns, "plain", steal, "/status"), "plain", "pg-orders-1")
    # Changed from the Pod's own name to another's.
    assert_refused(env.patch(ns, "member", steal), "member", "pg-orders-1")
    assert_refused(env.patch(ns, "member", steal, "/status"), "member", "pg-orders-1")
    # Set to its own name, and updates that keep the label: admitted.
    own = {"metadata": {"labels": {POD_NAME: "plain"}}}
    assert env.patch(ns, "plain", own) == (200, "")
    assert env.patch(ns, "member", {"metadata": {"annotations": {"x": "y"}}}) == (200, "")


def test_a_pod_labelled_wrongly_before_the_opt_in_stays_updatable_and_deletable(
    env: Env,
) -> None:
    """Opting a namespace in never wedges an existing Pod (finalizers, status, delete)."""
    late = f"{env.other}-late"
    _namespace(env.admin, late, {})
    try:
        _tenant(env.plane, env.admin, _user_of(env), (late,))
        assert env.create(late, pod("old-intruder", "pg-orders-1"), dry_run=False) == (201, "")
        _namespace(env.admin, late, OPT_IN)
        _wait(
            "the opt-in label takes effect",
            lambda: env.create(late, pod("probe", "pg-orders-1"))[0] == 422,
        )
        keep = {"metadata": {"annotations": {"touched": "yes"}, "finalizers": ["example.com/x"]}}
        assert env.patch(late, "old-intruder", keep) == (200, "")
        assert env.patch(late, "old-intruder", {"metadata": {"finalizers": None}}) == (200, "")
        env.tenant.delete(resource_path("v1", "pods", late, "old-intruder"))
    finally:
        env.plane.kubectl("delete", "namespace", late, "--wait=false", check=False)


def _user_of(env: Env) -> str:
    return f"tenant-{env.enforced.removeprefix('podname-')}"


def test_the_statefulset_controllers_own_pods_are_admitted(env: Env) -> None:
    """The real statefulset-controller (its own ServiceAccount) creates its Pods: no refusal."""
    ns = env.enforced
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "pg-sts", "namespace": ns},
        "spec": {
            "serviceName": "pg-sts",
            "replicas": 3,
            "podManagementPolicy": "Parallel",  # no kubelet: do not wait for Ready one by one
            "selector": {"matchLabels": {"application": "patroni", "cluster-name": "pg-sts"}},
            "template": {
                "metadata": {"labels": {"application": "patroni", "cluster-name": "pg-sts"}},
                "spec": {"containers": [{"name": "db", "image": "postgres:17"}]},
            },
        },
    }
    env.admin.create(resource_path("apps/v1", "statefulsets", ns), sts)
    names = {"pg-sts-0", "pg-sts-1", "pg-sts-2"}

    def created() -> bool:
        pods = env.admin.get(resource_path("v1", "pods", ns), labelSelector="cluster-name=pg-sts")
        return {p["metadata"]["name"] for p in pods["items"]} == names

    _wait("the StatefulSet controller creates its 3 Pods", created)
    pods = env.admin.get(resource_path("v1", "pods", ns), labelSelector="cluster-name=pg-sts")
    for item in pods["items"]:
        assert item["metadata"]["labels"][POD_NAME] == item["metadata"]["name"]
    events = env.admin.get(resource_path("v1", "events", ns))
    refusals = [e["message"] for e in events["items"] if e.get("reason") == "FailedCreate"]
    assert refusals == []
    # And the controller's later updates (scale down deletes, scale up creates again) pass.
    env.admin.merge_patch(
        resource_path("apps/v1", "statefulsets", ns, "pg-sts"), {"spec": {"replicas": 4}}
    )
    names.add("pg-sts-3")
    _wait("the StatefulSet controller scales up to 4", created)
