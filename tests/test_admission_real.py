"""The admission policies decided by the real API server with its real RBAC authorizer.

Test design notes:

* The table is tests/admission_cases.py, the one cel-python decides in
  tests/test_admission_policy.py and tests/test_sharding.py: every case runs here too, and
  where the two disagreed the server was taken as right (the emulation now reports the first
  failed validation only, as the server does).
* The policies are the rendered ones (deploy/ for the backup and spec.service policies, with
  the shipped annotation allow-list ConfigMap; deploy/sharding/ for the shard label),
  applied after metacontroller/crd.yaml. Their bindings are applied as rendered plus a
  ``namespaceSelector`` on this run's namespaces (and a run-specific name), so the shard
  policy does not refuse other tests' unlabelled PostgreSQLClusters on the shared control
  plane; the policies' expressions, failure policy, validation actions and paramRef
  are exactly what ships.
* Every user is a client-certificate user with real Roles and RoleBindings: may edit
  PostgreSQLClusters in the namespace, plus the case's grants (create CronJobs, get one
  Secret by name, ...). Requests are dry runs (``dryRun=All``: admission runs, nothing is
  stored), so an allowed case leaves nothing behind and every case starts from the same
  stored object.
* Bindings, RBAC and the allow-list ConfigMap reach the API server's caches asynchronously:
  each is waited for, bounded, by a request whose verdict proves it took effect.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from tests.admission_cases import (
    ALLOW_LIST,
    ANNOTATIONS,
    AUTHORITY,
    BACKUP,
    BACKUP_CASES,
    BOTH,
    EMPTY_LIST,
    IMAGES,
    LISTS,
    NAMESPACE,
    NO_LIST,
    OTHER_NAMESPACE,
    SERVICE_CASES,
    SERVICE_TYPE,
    SHARD,
    SHARD_CASES,
    UNLISTED,
    Case,
    Grant,
    cluster,
    localize,
)
from tests.helpers import wait_for
from tests.manifest_helpers import CRD_FILE, find, rendered

PGC = "adg.io/v1alpha1"
RBAC = "rbac.authorization.k8s.io/v1"
SELECTOR_LABEL = "admission.pgfh.test/run"
PARAMS_NAMESPACE = "pg-failover-hook"
WAIT = 60.0
#: The order the allow-list states are run in (each change is waited for).
STATE_ORDER = {NO_LIST: 0, ALLOW_LIST: 1, EMPTY_LIST: 2}


def _wait(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    wait_for(what, check, timeout)


@dataclass
class Outcome:
    status: int
    message: str

    @property
    def allowed(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class Env:
    plane: ControlPlane
    admin: KubeRest
    run: str
    namespaces: dict[str, str]  # the table's namespace -> this run's
    shard_namespace: str
    users: dict[frozenset[Grant], tuple[str, KubeRest]] = field(default_factory=dict)
    allow_list: str = NO_LIST

    # ------------------------------------------------------------------ objects

    def place(self, obj: Mapping[str, Any], namespace: str, name: str) -> dict[str, Any]:
        placed = copy.deepcopy(dict(obj))
        placed["metadata"]["namespace"] = namespace
        placed["metadata"]["name"] = name
        return placed

    def namespace_of(self, case: Case) -> str:
        return self.shard_namespace if case.policy == SHARD else self.namespaces[NAMESPACE]

    # -------------------------------------------------------------------- users

    def user(self, grants: tuple[Grant, ...]) -> tuple[str, KubeRest]:
        key = frozenset(grants)
        if key not in self.users:
            name = "u-" + hashlib.sha256(repr(sorted(key, key=repr)).encode()).hexdigest()[:10]
            self._grant(name, key)
            rest = KubeRest.from_kubeconfig(self.plane.user_kubeconfig(f"{self.run}-{name}"))
            self.users[key] = (f"{self.run}-{name}", rest)
        return self.users[key]

    def _grant(self, short: str, grants: frozenset[Grant]) -> None:
        user = f"{self.run}-{short}"
        by_namespace: dict[str, list[dict[str, Any]]] = {}
        for namespace in (self.namespaces[NAMESPACE], self.shard_namespace):
            by_namespace[namespace] = [
                {
                    "apiGroups": ["adg.io"],
                    "resources": ["postgresqlclusters"],
                    "verbs": ["get", "list", "create", "update", "patch"],
                },
                {
                    "apiGroups": ["adg.io"],
                    "resources": ["postgresqlclusters/status"],
                    "verbs": ["update"],
                },
            ]
        for verb, group, resource, namespace, name in sorted(grants, key=repr):
            rule: dict[str, Any] = {"apiGroups": [group], "resources": [resource], "verbs": [verb]}
            if name is not None:
                rule["resourceNames"] = [name]
            by_namespace.setdefault(self.namespaces[namespace], []).append(rule)
        for namespace, rules in by_namespace.items():
            role = {
                "apiVersion": RBAC,
                "kind": "Role",
                "metadata": {"name": short, "namespace": namespace},
                "rules": rules,
            }
            binding = {
                "apiVersion": RBAC,
                "kind": "RoleBinding",
                "metadata": {"name": short, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": short},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            }
            self.admin.apply(resource_path(RBAC, "roles", namespace, short), role, "pgfh-test")
            self.admin.apply(
                resource_path(RBAC, "rolebindings", namespace, short), binding, "pgfh-test"
            )
        # The authorizer reads RBAC from its informers: wait until every grant is seen.
        checks = [(*g[:3], self.namespaces[g[3]], g[4]) for g in grants]
        checks.append(("update", "adg.io", "postgresqlclusters", self.shard_namespace, None))
        for verb, group, resource, namespace, name in checks:
            attributes = {"verb": verb, "group": group, "resource": resource}
            attributes["namespace"] = namespace
            if name:
                attributes["name"] = name
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": user, "resourceAttributes": attributes},
            }
            path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
            _wait(
                f"RBAC grants {user} {attributes}",
                lambda path=path, review=review: bool(
                    self.admin.create(path, review)["status"].get("allowed")
                ),
            )

    # ----------------------------------------------------------------- requests

    def send(self, rest: KubeRest, method: str, path: str, body: Mapping[str, Any]) -> Outcome:
        try:
            rest.request(method, path, body=body, params={"dryRun": "All"})
        except KubeApiError as error:
            return Outcome(error.status, error.message)
        return Outcome(200, "")

    def decide(self, case: Case, index: int) -> tuple[Outcome, str, str]:
        """Send the case's request as its user; (outcome, namespace, object name)."""
        namespace = self.namespace_of(case)
        name = f"c{index}-{self.run}"
        _, rest = self.user(case.grants)
        collection = resource_path(PGC, "postgresqlclusters", namespace)
        if case.operation == "CREATE":
            return (
                self.send(rest, "POST", collection, self.place(case.new, namespace, name)),
                namespace,
                name,
            )
        current = self.admin.get(f"{collection}/{name}")
        new = self.place(case.new, namespace, name)
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        path = f"{collection}/{name}" + ("/status" if case.status else "")
        return self.send(rest, "PUT", path, new), namespace, name

    def create_old(self, case: Case, index: int) -> None:
        assert case.old is not None
        namespace = self.namespace_of(case)
        obj = self.place(case.old, namespace, f"c{index}-{self.run}")
        self.admin.create(resource_path(PGC, "postgresqlclusters", namespace), obj)

    # --------------------------------------------------------------- allow list

    def set_allow_list(self, state: str) -> None:
        if state == self.allow_list:
            return
        data = LISTS[state]
        path = resource_path("v1", "configmaps", PARAMS_NAMESPACE, IMAGES)
        if data is None:
            self.admin.delete(path)
        else:
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": IMAGES, "namespace": PARAMS_NAMESPACE},
                "data": data,
            }
            self.admin.apply(path, body, "pgfh-test")
        probe_image, probe_allowed = {
            NO_LIST: ("anything:1", True),
            ALLOW_LIST: ("postgres:17", False),
            EMPTY_LIST: (BACKUP["image"], False),
        }[state]
        _, rest = self.user(BOTH)
        namespace = self.namespaces[NAMESPACE]
        probe = self.place(cluster({**BACKUP, "image": probe_image}), namespace, "probe")
        collection = resource_path(PGC, "postgresqlclusters", namespace)
        _wait(
            f"the image allow-list {state} takes effect",
            lambda: self.send(rest, "POST", collection, probe).allowed == probe_allowed,
        )
        if state == ALLOW_LIST:  # and a listed image passes (the list, not a stale empty one)
            listed = self.place(cluster(BACKUP), namespace, "probe")
            _wait("listed images pass", lambda: self.send(rest, "POST", collection, listed).allowed)
        self.allow_list = state


def _bindings(target: str, names: tuple[str, ...], run: str, selector: str) -> list[Any]:
    objects = rendered(target)
    out: list[Any] = []
    for obj in objects:
        if obj["kind"] == "ValidatingAdmissionPolicy" and obj["metadata"]["name"] in names:
            out.append(obj)
        if obj["kind"] == "ValidatingAdmissionPolicyBinding" and obj["metadata"]["name"] in names:
            assert "matchResources" not in obj["spec"]  # shipped: every namespace
            obj["metadata"]["name"] += f"-{run}"
            obj["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {SELECTOR_LABEL: selector}}
            }
            out.append(obj)
    assert len(out) == 2 * len(names), [o["metadata"]["name"] for o in out]
    return out


def _apply_objects(plane: ControlPlane, objects: list[Any]) -> None:
    plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=pgfh-test",
        "-f",
        "-",
        input_text=yaml.safe_dump_all(objects),
    )


def _serves(admin: KubeRest) -> bool:
    """Established is not yet served: the CRD's handler comes up a moment later."""
    try:
        admin.get(resource_path(PGC, "postgresqlclusters"))
    except KubeApiError:
        return False
    return True


def _namespace(admin: KubeRest, name: str, labels: Mapping[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    admin.apply(resource_path("v1", "namespaces", name=name), body, "pgfh-test")


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[Env]:
    run = uuid.uuid4().hex[:8]
    admin = KubeRest.from_kubeconfig(control_plane.admin_kubeconfig)
    control_plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=pgfh-test",
        "-f",
        str(CRD_FILE),
    )
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/postgresqlclusters.adg.io", "--timeout=60s"
    )
    _wait("the API server serves postgresqlclusters", lambda: _serves(admin))
    namespaces = {NAMESPACE: f"adm-{run}", OTHER_NAMESPACE: f"adm-{run}-other"}
    shard_namespace = f"adm-{run}-shard"
    for name in namespaces.values():
        _namespace(admin, name, {SELECTOR_LABEL: f"{run}-backup"})
    _namespace(admin, shard_namespace, {})  # bound only once the old objects exist
    _namespace(admin, PARAMS_NAMESPACE, {})
    bindings = _bindings(
        "deploy", (AUTHORITY, IMAGES, SERVICE_TYPE, ANNOTATIONS), run, f"{run}-backup"
    )
    # The annotation allow-list as shipped (deploy/base/admission-service.yaml).
    bindings.append(find(rendered("deploy"), "ConfigMap", ANNOTATIONS))
    bindings += _bindings("deploy/sharding", (SHARD,), run, f"{run}-shard")
    environment = Env(control_plane, admin, run, namespaces, shard_namespace)
    try:
        for index, case in _indexed(SHARD_CASES):
            if case.old is not None:
                environment.create_old(case, index)  # unlabelled ones too: before the binding
        for index, case in _indexed(SERVICE_CASES):
            if case.old is not None:  # an unlisted annotation too: before the binding
                environment.create_old(case, index)
        _apply_objects(control_plane, bindings)
        for index, case in _indexed(BACKUP_CASES):
            if case.old is not None:
                environment.create_old(case, index)  # admin: may do anything the policy asks
        # Bindings take effect asynchronously: wait for a known-bad request to be refused.
        _, nobody = environment.user(())
        backup_ns = namespaces[NAMESPACE]
        bad = environment.place(cluster(BACKUP), backup_ns, "probe")
        collection = resource_path(PGC, "postgresqlclusters", backup_ns)
        _wait(
            "the backup-authority binding refuses a backup by a user without grants",
            lambda: environment.send(nobody, "POST", collection, bad).status == 403,
        )
        exposed_lb = environment.place(
            cluster(service={"type": "LoadBalancer", "ports": [{"name": "p", "port": 5432}]}),
            backup_ns,
            "probe",
        )
        _wait(
            "the service-type binding refuses a LoadBalancer by a user without grants",
            lambda: environment.send(nobody, "POST", collection, exposed_lb).status == 403,
        )
        annotated = environment.place(
            cluster(
                service={
                    "type": "ClusterIP",
                    "ports": [{"name": "p", "port": 5432}],
                    "annotations": {UNLISTED: "x.example.com"},
                }
            ),
            backup_ns,
            "probe",
        )
        _wait(
            "the annotation binding refuses an unlisted annotation",
            lambda: environment.send(nobody, "POST", collection, annotated).status == 403,
        )
        _namespace(admin, shard_namespace, {SELECTOR_LABEL: f"{run}-shard"})
        unlabelled = environment.place(cluster(labels={}), shard_namespace, "probe")
        shard_collection = resource_path(PGC, "postgresqlclusters", shard_namespace)
        _wait(
            "the shard-label binding refuses an unlabelled PostgreSQLCluster",
            lambda: environment.send(nobody, "POST", shard_collection, unlabelled).status == 422,
        )
        yield environment
    finally:
        for obj in bindings:
            if obj["kind"] == "ValidatingAdmissionPolicyBinding":
                control_plane.kubectl(
                    "delete",
                    "validatingadmissionpolicybinding",
                    obj["metadata"]["name"],
                    "--ignore-not-found",
                    check=False,
                )
        for configmap in (IMAGES, ANNOTATIONS):
            control_plane.kubectl(
                "delete",
                "configmap",
                "-n",
                PARAMS_NAMESPACE,
                configmap,
                "--ignore-not-found",
                check=False,
            )
        for name in (*namespaces.values(), shard_namespace):
            control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
        for _, rest in environment.users.values():
            rest.close()
        admin.close()


def _indexed(cases: list[Case]) -> list[tuple[int, Case]]:
    from tests.admission_cases import CASES

    return [(CASES.index(case), case) for case in cases]


ORDERED = sorted(
    _indexed(BACKUP_CASES + SHARD_CASES + SERVICE_CASES),
    key=lambda item: STATE_ORDER[item[1].allow_list],
)


@pytest.mark.parametrize(("index", "case"), ORDERED, ids=[c.id for _, c in ORDERED])
def test_the_api_server_decides_as_the_table_says(env: Env, index: int, case: Case) -> None:
    env.set_allow_list(case.allow_list)
    outcome, namespace, name = env.decide(case, index)
    assert outcome.allowed == case.allowed, outcome
    if case.allowed:
        return
    if case.schema_refuses:  # the CRD's schema refuses it before any admission policy runs
        assert outcome.status == 422 and case.schema_refuses in outcome.message, outcome
        return
    user, _ = env.user(case.grants)
    expected = localize(case.messages[0], namespace, name, user)
    assert outcome.status == {"Forbidden": 403, "Invalid": 422}[case.reason], outcome
    assert f"ValidatingAdmissionPolicy '{case.policy}' with binding" in outcome.message
    assert outcome.message.endswith(f"denied request: {expected}"), outcome.message


def test_a_user_who_may_edit_clusters_but_not_create_cronjobs_or_read_the_secret(
    env: Env,
) -> None:
    """The confused deputy, by name: refused; the same request by a user who may, admitted."""
    env.set_allow_list(NO_LIST)
    namespace = env.namespaces[NAMESPACE]
    collection = resource_path(PGC, "postgresqlclusters", namespace)
    body = env.place(cluster(BACKUP), namespace, f"deputy-{env.run}")
    editor, editor_rest = env.user(())
    refused = env.send(editor_rest, "POST", collection, body)
    assert refused.status == 403
    assert f"and {editor} may not create CronJobs there" in refused.message
    _, trusted = env.user(BOTH)
    assert env.send(trusted, "POST", collection, body).allowed
    # And the editor may still create a cluster without a backup.
    plain = env.place(cluster(), namespace, f"plain-{env.run}")
    assert env.send(editor_rest, "POST", collection, plain).allowed
