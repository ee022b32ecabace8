"""The backup CronJob's Pod is unprivileged whatever the PostgreSQLCluster's spec says.

Test design notes:

* The hook's side of the spec.backup boundary (docs/security.md, "Who may ask for a backup"):
  the ValidatingAdmissionPolicy decides WHO may ask for a backup; this file proves WHAT any
  request can get: a Pod that never runs as root, never escalates, mounts no hostPath and
  no service account token, joins no host namespace, runs one container with the restricted
  security context, mounts only the named PVC, and reads ``spec.backup.secretName`` only
  through ``secretKeyRef`` of the keys ``username`` and ``password``.
* Hypothesis draws whole ``spec`` objects over every field that reaches the CronJob
  (``spec.backup.*``, ``spec.serviceRef.name``, ``spec.service.ports``), in two flavours:
  valid specs over each field's whole valid range (they must yield a CronJob, so the property
  is never vacuous), and hostile specs that also carry out-of-range values and keys a Pod
  spec would obey (``hostPath``, ``hostNetwork``, ``privileged``, ``serviceAccountName``,
  ``envFrom``, ...), anywhere in ``spec`` and ``spec.backup``. Each spec runs through the
  hook's real sync pipeline (load, plan, decide), with an observed CronJob that carries
  hostile fields too, and every CronJob of the reply is checked.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooks.children import backup_cronjob
from tests.child_helpers import children_of, cluster_answers, request_body
from tests.helpers import P0, run, seed_spec
from tests.manifest_helpers import restricted_problems

#: The only keys of spec.backup.secretName the Pod may read (docs/deploy.md).
SECRET_KEYS = {"username", "password"}
#: Keys a Pod (template) obeys that must never appear anywhere in the CronJob.
FORBIDDEN_KEYS = {
    "hostPath",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "hostPort",
    "privileged",
    "serviceAccountName",
    "serviceAccount",
    "envFrom",
    "secretRef",
    "projected",
    "serviceAccountToken",
    "imagePullSecrets",
    "initContainers",
    "ephemeralContainers",
    "nodeName",
    "add",
}

# ----------------------------------------------------------------------- strategies

_LABEL = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=12)
DNS_NAME = st.lists(_LABEL, min_size=1, max_size=3).map(".".join)
SERVICE_NAME = _LABEL.map(lambda s: "s" + s)
QUANTITY = st.one_of(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["250m", "1", "0.5", "256Mi", "1Gi", "1e3", "2k"]),
)
RESOURCE_NAME = st.sampled_from(["cpu", "memory", "ephemeral-storage", "example.com/gpu"])
VALID_BACKUP = st.fixed_dictionaries(
    {
        "schedule": st.sampled_from(["15 2 * * *", "@hourly", "*/5 * * * *", "0 0 1 1 *"]),
        "image": st.text(string.ascii_letters + string.digits + "./:@-_", min_size=1, max_size=80),
        "pvcName": DNS_NAME,
        "secretName": DNS_NAME,
    },
    optional={
        "keep": st.integers(min_value=1, max_value=100),
        "runAsUser": st.integers(min_value=1, max_value=2**31 - 1),
        "activeDeadlineSeconds": st.integers(min_value=60, max_value=7 * 24 * 3600),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "requests": st.dictionaries(RESOURCE_NAME, QUANTITY, max_size=3),
                "limits": st.dictionaries(RESOURCE_NAME, QUANTITY, max_size=3),
            },
        ),
    },
)
PORT = st.fixed_dictionaries(
    {"name": st.sampled_from(["postgresql", "pg", "exporter"]), "port": st.integers(1, 65535)}
)

#: What a Pod spec would obey if the hook ever copied it through.
HOSTILE_VALUE = st.sampled_from(
    [
        True,
        0,
        {"path": "/", "type": "Directory"},
        [{"name": "root", "hostPath": {"path": "/"}}],
        {"runAsUser": 0, "privileged": True, "allowPrivilegeEscalation": True},
        {"add": ["SYS_ADMIN"]},
        "admin",
        [{"secretRef": {"name": "everything"}}],
    ]
)
HOSTILE_KEYS = st.sampled_from(
    [
        "hostPath",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "privileged",
        "securityContext",
        "serviceAccountName",
        "automountServiceAccountToken",
        "volumes",
        "volumeMounts",
        "env",
        "envFrom",
        "capabilities",
        "runAsNonRoot",
        "initContainers",
        "command",
        "podSpec",
        "template",
    ]
)
HOSTILE_EXTRA = st.dictionaries(HOSTILE_KEYS, HOSTILE_VALUE, max_size=4)
ANY_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=20))


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = seed_spec(backup=draw(VALID_BACKUP))
    spec["serviceRef"] = {"name": draw(SERVICE_NAME)}
    if draw(st.booleans()):
        ports = draw(
            st.lists(
                PORT, min_size=1, max_size=3, unique_by=(lambda p: p["name"], lambda p: p["port"])
            )
        )
        spec["service"] = {"ports": ports}
    return spec


@st.composite
def hostile_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = draw(valid_specs())
    spec_backup = spec["backup"]
    for field in draw(st.lists(st.sampled_from(sorted(VALID_BACKUP_FIELDS)), max_size=3)):
        spec_backup[field] = draw(ANY_SCALAR)
    spec_backup.update(draw(HOSTILE_EXTRA))
    spec.update(draw(HOSTILE_EXTRA))
    return spec


VALID_BACKUP_FIELDS = {
    "schedule",
    "image",
    "pvcName",
    "secretName",
    "keep",
    "runAsUser",
    "activeDeadlineSeconds",
    "resources",
}

#: An observed CronJob as someone with CronJob write access may have left it: the hook reads
#: it for resource quantities only, and must not carry anything else over.
TAMPERED_CRONJOB: dict[str, Any] = {
    "apiVersion": "batch/v1",
    "kind": "CronJob",
    "metadata": {"name": "pg-orders-backup", "namespace": "databases"},
    "spec": {
        "jobTemplate": {
            "spec": {
                "template": {
                    "spec": {
                        "hostNetwork": True,
                        "serviceAccountName": "admin",
                        "automountServiceAccountToken": True,
                        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                        "containers": [
                            {
                                "name": backup_cronjob.CONTAINER,
                                "securityContext": {"privileged": True, "runAsUser": 0},
                                "envFrom": [{"secretRef": {"name": "everything"}}],
                                "resources": {"limits": {"memory": "1Gi"}},
                            }
                        ],
                    }
                }
            }
        }
    },
}


# ------------------------------------------------------------------------- the checks


def walk(node: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """Every ``(path, key, value)`` of a JSON tree."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield path, str(key), value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from walk(item, f"{path}[{index}]")


def privilege_problems(cronjob: Mapping[str, Any], secret_name: str | None) -> list[str]:
    """Everything that would make the backup Pod more than an unprivileged client."""
    problems = []
    for path, key, _ in walk(cronjob):
        if key in FORBIDDEN_KEYS:
            problems.append(f"{path}.{key} is set")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    problems += restricted_problems(pod)
    if pod.get("automountServiceAccountToken") is not False:
        problems.append("the service account token is mounted")
    if pod["securityContext"].get("runAsUser") in (0, None):
        problems.append("runs as root")
    for group in ("runAsGroup", "fsGroup"):
        if pod["securityContext"].get(group) == 0:
            problems.append(f"{group} 0")
    if len(pod["containers"]) != 1:
        problems.append("more than one container")
    for volume in pod.get("volumes", []):
        if set(volume) != {"name", "persistentVolumeClaim"}:
            problems.append(f"volume {volume}")
    # The Secret: only secretKeyRef of the documented keys, only in env, nowhere else.
    used_keys = set()
    for path, key, value in walk(cronjob):
        if key in ("secret", "secretName") and isinstance(value, (str, Mapping)):
            problems.append(f"{path}.{key}: a Secret outside secretKeyRef")
        if key != "secretKeyRef":
            continue
        if not path.startswith(".spec.jobTemplate.spec.template.spec.containers[0].env["):
            problems.append(f"{path}: secretKeyRef outside env")
        if value.get("name") != secret_name or value.get("key") not in SECRET_KEYS:
            problems.append(f"{path}: secretKeyRef {value}")
        if set(value) - {"name", "key"}:
            problems.append(f"{path}: secretKeyRef {value}")
        used_keys.add(value.get("key"))
    if used_keys != SECRET_KEYS:
        problems.append(f"the Secret's keys used: {sorted(used_keys)}")
    return problems


def cronjobs_for(spec: Mapping[str, Any], tampered: bool) -> dict[str, dict[str, Any]]:
    cronjobs = [TAMPERED_CRONJOB] if tampered else []
    body = request_body(spec=dict(spec), cronjobs=cronjobs)
    _, outcome = run(body, cluster_answers(P0))
    return children_of(outcome, "CronJob")


def _secret(spec: Mapping[str, Any]) -> str | None:
    value = spec.get("backup", {}).get("secretName")
    return value if isinstance(value, str) else None


# ----------------------------------------------------------------------------- tests


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=valid_specs())
def test_every_valid_spec_yields_an_unprivileged_backup_pod(spec: dict[str, Any]) -> None:
    children = cronjobs_for(spec, tampered=False)
    assert list(children) == [backup_cronjob.cronjob_name("pg-orders")], (
        "a valid spec yields the CronJob"
    )
    (cronjob,) = children.values()
    assert privilege_problems(cronjob, _secret(spec)) == []
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "backups", "persistentVolumeClaim": {"claimName": spec["backup"]["pvcName"]}}
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=hostile_specs(), tampered=st.booleans())
def test_no_spec_and_no_observed_cronjob_makes_the_pod_privileged(
    spec: dict[str, Any], tampered: bool
) -> None:
    for name, cronjob in cronjobs_for(spec, tampered).items():
        if tampered and cronjob.get("spec", {}).get("suspend") is not False:
            # An observed CronJob the hook keeps as it is (invalid spec or doubt): Metacontroller
            # writes back what it observed, so no privilege comes from the hook.
            assert cronjob["metadata"]["name"] == name
            continue
        assert privilege_problems(cronjob, _secret(spec)) == [], name


_BACKUP = {
    "schedule": "15 2 * * *",
    "image": "postgres:18.1",
    "pvcName": "pg-orders-backups",
    "secretName": "pg-orders-replication",
}
_SECRET = "pg-orders-replication"

Mutation = Callable[[dict[str, Any], dict[str, Any]], object]
#: Each turns the hook's CronJob into one the checks must refuse: ``(pod, container)``.
MUTATIONS: dict[str, Mutation] = {
    "token": lambda pod, c: pod.update(automountServiceAccountToken=True),
    "root": lambda pod, c: pod["securityContext"].update(runAsUser=0),
    "root group": lambda pod, c: pod["securityContext"].update(runAsGroup=0),
    "not non-root": lambda pod, c: c["securityContext"].update(runAsNonRoot=False),
    "host network": lambda pod, c: pod.update(hostNetwork=True),
    "host pid": lambda pod, c: pod.update(hostPID=True),
    "hostPath": lambda pod, c: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    "escalation": lambda pod, c: c["securityContext"].update(allowPrivilegeEscalation=True),
    "privileged": lambda pod, c: c["securityContext"].update(privileged=True),
    "capability": lambda pod, c: c["securityContext"]["capabilities"].update(add=["NET_RAW"]),
    "service account": lambda pod, c: pod.update(serviceAccountName="admin"),
    "other key": lambda pod, c: c["env"].append(
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": _SECRET, "key": "x"}}}
    ),
    "other secret": lambda pod, c: c["env"][3]["valueFrom"]["secretKeyRef"].update(name="y"),
    "envFrom": lambda pod, c: c.update(envFrom=[{"secretRef": {"name": _SECRET}}]),
    "secret volume": lambda pod, c: pod["volumes"].append(
        {"name": "s", "secret": {"secretName": _SECRET}}
    ),
    "password dropped": lambda pod, c: c["env"].pop(3),
    "second container": lambda pod, c: pod["containers"].append(dict(c, name="x")),
}


def test_negative_control_each_privilege_is_caught() -> None:
    (good,) = cronjobs_for(seed_spec(backup=_BACKUP), tampered=False).values()
    assert privilege_problems(good, _SECRET) == []
    assert (
        good["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"][3]["name"]
        == "PGPASSWORD"
    )
    for name, mutate in MUTATIONS.items():
        cronjob = copy.deepcopy(good)
        pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        mutate(pod, pod["containers"][0])
        assert privilege_problems(cronjob, _SECRET), name
    assert privilege_problems(_tampered_with_context(), _SECRET)


def _tampered_with_context() -> dict[str, Any]:
    cronjob = copy.deepcopy(TAMPERED_CRONJOB)
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod["securityContext"] = {}
    pod["containers"][0]["env"] = []
    return cronjob
