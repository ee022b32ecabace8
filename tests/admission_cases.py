"""The admission cases both evaluators run: cel-python (tests/test_admission_policy.py,
tests/test_sharding.py) and the real API server (tests/test_admission_real.py).

One table, so that a case the emulation covers is also decided by the real evaluator and
the two cannot drift apart. Each case names the policy it is about, the request (operation,
old and new object, the status subresource or not), what the requesting user is granted (as
``(verb, group, resource, namespace, name)``, ``name`` ``None`` for every name), the image
allow-list state, and the verdict: allowed, or refused with the messages of the failed
validations. Messages are written for namespace ``databases``, object ``pg-orders`` and user
``alice``; :func:`localize` rewrites them for the names a real run uses.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NAMESPACE = "databases"
OTHER_NAMESPACE = "other-namespace"
NAME = "pg-orders"
USER = "alice"
AUTHORITY = "pg-failover-hook-backup-authority"
IMAGES = "pg-failover-hook-backup-images"
SHARD = "pg-failover-hook-shard-label"
SHARD_LABEL = "pg-failover-hook.adg.io/shard"
SERVICE_TYPE = "pg-failover-hook-service-type"
ANNOTATIONS = "pg-failover-hook-service-annotations"

Grant = tuple[str, str, str, str, "str | None"]

#: Image allow-list states: the ConfigMap pg-failover-hook-backup-images absent, or its data.
NO_LIST = "none"
ALLOW_LIST = "allow"
EMPTY_LIST = "empty"
ALLOW = {"postgres": "docker.io/library/postgres:", "internal": "registry.example.com/db/"}
LISTS: dict[str, dict[str, str] | None] = {NO_LIST: None, ALLOW_LIST: ALLOW, EMPTY_LIST: {}}


def cluster(
    backup: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "primarySelector": {"application": "patroni", "cluster-name": NAME},
        "serviceRef": {"name": "pg-orders-primary"},
        "healthCheckPath": "/primary",
        "service": {"type": "ClusterIP", "ports": [{"name": "postgresql", "port": 5432}]},
    }
    body.update(spec)
    if backup is not None:
        body["backup"] = dict(backup)
    metadata: dict[str, Any] = {"name": NAME, "namespace": NAMESPACE}
    metadata["labels"] = dict({"team": "a"} if labels is None else labels)
    if not metadata["labels"]:
        del metadata["labels"]
    return {
        "apiVersion": "adg.io/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": metadata,
        "spec": body,
    }


def sharded(labels: Mapping[str, str] | None) -> dict[str, Any]:
    """A cluster with exactly ``labels`` (``None``: no labels at all)."""
    return cluster(labels=labels or {})


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
OTHER_SECRET: Grant = ("get", "", "secrets", NAMESPACE, "another-secret")
SECRETS_ELSEWHERE: Grant = ("get", "", "secrets", OTHER_NAMESPACE, None)
LIST_SECRETS: Grant = ("list", "", "secrets", NAMESPACE, None)
CRONJOBS_ELSEWHERE: Grant = ("create", "batch", "cronjobs", OTHER_NAMESPACE, None)
BOTH = (CRONJOBS, SECRET)

NO_CRONJOBS = (
    "spec.backup makes Metacontroller create a CronJob in namespace databases, and alice "
    "may not create CronJobs there"
)


def no_secret(secret: str = "pg-orders-replication") -> str:
    return (
        f"spec.backup hands the Secret {secret} to the backup Job, and alice "
        "may not get that Secret in namespace databases"
    )


def not_listed(image: str) -> str:
    return (
        f"spec.backup.image {image} is not on the allow-list "
        "(ConfigMap pg-failover-hook/pg-failover-hook-backup-images)"
    )


SHARD_INVALID = (
    "label pg-failover-hook.adg.io/shard must be one of 0, 1, 2, 3, 4 "
    '(python3 deploy/sharding/shards.py assign 5 databases/pg-orders), not "{shard}"'
)
SHARD_MOVED = (
    'label pg-failover-hook.adg.io/shard cannot change (it is "{old}"): '
    "delete and re-create the PostgreSQLCluster to move it"
)


@dataclass(frozen=True)
class Case:
    id: str
    policy: str
    operation: str
    new: dict[str, Any]
    old: dict[str, Any] | None = None
    grants: tuple[Grant, ...] = ()
    allowed: bool = True
    #: The message of the first failed validation (refused cases only): the API server
    #: reports that one only, even when later validations fail too.
    messages: tuple[str, ...] = ()
    #: The validations' ``reason`` of the first failure (refused cases only).
    reason: str = "Forbidden"
    allow_list: str = NO_LIST
    status: bool = False  # the request writes the status subresource
    #: Refused before admission by the CRD's schema (the real server), with this text in it.
    schema_refuses: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


def _update(old: dict[str, Any], new: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return {"operation": "UPDATE", "old": old, "new": new, **kwargs}


def _authority_cases() -> list[Case]:
    cases = [
        Case("create-both", AUTHORITY, "CREATE", cluster(BACKUP), grants=BOTH),
        Case(
            "create-no-cronjobs",
            AUTHORITY,
            "CREATE",
            cluster(BACKUP),
            grants=(SECRET,),
            allowed=False,
            messages=(NO_CRONJOBS,),
        ),
    ]
    for label, grants in (
        ("cronjobs-only", (CRONJOBS,)),
        ("other-secret", (CRONJOBS, OTHER_SECRET)),
        ("secrets-elsewhere", (CRONJOBS, SECRETS_ELSEWHERE)),
        ("list-secrets", (CRONJOBS, LIST_SECRETS)),
    ):
        cases.append(
            Case(
                f"create-{label}",
                AUTHORITY,
                "CREATE",
                cluster(BACKUP),
                grants=grants,
                allowed=False,
                messages=(no_secret(),),
            )
        )
    cases += [
        Case(
            "create-cronjobs-elsewhere",
            AUTHORITY,
            "CREATE",
            cluster(BACKUP),
            grants=(CRONJOBS_ELSEWHERE, SECRET),
            allowed=False,
            messages=(NO_CRONJOBS,),
        ),
        Case(
            "create-nothing-granted",
            AUTHORITY,
            "CREATE",
            cluster(BACKUP),
            allowed=False,
            messages=(NO_CRONJOBS,),  # the server reports the first failure only
        ),
        Case(
            "create-all-secrets",
            AUTHORITY,
            "CREATE",
            cluster(BACKUP),
            None,
            (CRONJOBS, ALL_SECRETS),
        ),
        Case("create-without-backup", AUTHORITY, "CREATE", cluster()),
    ]
    for label, grants, allowed in (
        ("secret-only", (SECRET,), False),
        ("cronjobs-only", (CRONJOBS,), False),
        ("both", BOTH, True),
    ):
        messages = () if allowed else ((NO_CRONJOBS,) if label == "secret-only" else (no_secret(),))
        cases.append(
            Case(
                f"add-backup-{label}",
                AUTHORITY,
                "UPDATE",
                cluster(BACKUP),
                cluster(),
                grants,
                allowed,
                messages,
            )
        )
    for key, value in (
        ("image", "attacker.example/tool:1"),
        ("secretName", "pg-orders-superuser"),
        ("pvcName", "someone-elses-pvc"),
        ("schedule", "* * * * *"),
        ("keep", 100),
    ):
        changed = {**BACKUP, key: value}
        secret = changed["secretName"]
        may_secret: Grant = ("get", "", "secrets", NAMESPACE, secret)
        for label, grants, messages in (
            ("both", (CRONJOBS, may_secret), ()),
            ("cronjobs-only", (CRONJOBS,), (no_secret(secret),)),
            ("secret-only", (may_secret,), (NO_CRONJOBS,)),
            ("nothing", (), (NO_CRONJOBS,)),
        ):
            cases.append(
                Case(
                    f"change-{key}-{label}",
                    AUTHORITY,
                    "UPDATE",
                    cluster(changed),
                    cluster(BACKUP),
                    grants,
                    not messages,
                    messages,
                )
            )
    cases.append(
        Case(
            "the-secret-checked-is-the-new-one",
            AUTHORITY,
            "UPDATE",
            cluster({**BACKUP, "secretName": "pg-orders-superuser"}),
            cluster(BACKUP),
            BOTH,
            False,
            (no_secret("pg-orders-superuser"),),
        )
    )
    for label, spec in (
        ("serviceRef", {"serviceRef": {"name": "attacker-service"}}),
        (
            "port",
            {"service": {"type": "ClusterIP", "ports": [{"name": "postgresql", "port": 6432}]}},
        ),
    ):
        cases += [
            Case(
                f"connect-{label}-cronjobs-only",
                AUTHORITY,
                "UPDATE",
                cluster(BACKUP, **spec),
                cluster(BACKUP),
                (CRONJOBS,),
                False,
                (no_secret(),),
            ),
            Case(
                f"connect-{label}-both",
                AUTHORITY,
                "UPDATE",
                cluster(BACKUP, **spec),
                cluster(BACKUP),
                BOTH,
            ),
            Case(
                f"connect-{label}-without-backup",
                AUTHORITY,
                "UPDATE",
                cluster(None, **spec),
                cluster(),
            ),
        ]
    old = cluster(BACKUP)
    for label, path, value in (
        ("finalizer", ("metadata", "finalizers"), ["metacontroller.io/x"]),
        ("label", ("metadata", "labels", "team"), "b"),
        ("health-path", ("spec", "healthCheckPath"), "/master"),
        ("selector", ("spec", "primarySelector", "extra"), "label"),
        ("service-type", ("spec", "service", "type"), "LoadBalancer"),
    ):
        new = copy.deepcopy(old)
        target = new
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        # A LoadBalancer needs its own grants (pg-failover-hook-service-type), none of the
        # backup policy's.
        grants = (CREATE_SERVICES, USE_LB) if label == "service-type" else ()
        cases.append(Case(f"leave-backup-alone-{label}", AUTHORITY, "UPDATE", new, old, grants))
    cases += [
        Case("remove-backup", AUTHORITY, "UPDATE", cluster(), cluster(BACKUP)),
        Case("status-write", AUTHORITY, "UPDATE", cluster(BACKUP), cluster(), status=True),
        Case(
            "backup-without-secret-name",
            AUTHORITY,
            "CREATE",
            cluster({k: v for k, v in BACKUP.items() if k != "secretName"}),
            grants=BOTH,
            allowed=False,
            messages=("error:",),
            schema_refuses="spec.backup.secretName: Required value",
        ),
    ]
    return cases


def _image_cases() -> list[Case]:
    def create_image(label: str, image: str, allowed: bool, allow_list: str) -> Case:
        return Case(
            f"image-{label}",
            IMAGES,
            "CREATE",
            cluster({**BACKUP, "image": image}),
            grants=BOTH,
            allowed=allowed,
            messages=() if allowed else (not_listed(image),),
            allow_list=allow_list,
        )

    cases = [create_image("no-list-anything", "anything:1", True, NO_LIST)]
    for label, image, allowed in (
        ("tag", "docker.io/library/postgres:17.6", True),
        ("digest", "registry.example.com/db/postgres@sha256:" + "0" * 64, True),
        ("longer-repository", "docker.io/library/postgres-evil:17", False),
        ("other-registry", "attacker.example/docker.io/library/postgres:17", False),
        ("short-name", "postgres:17", False),
    ):
        cases.append(create_image(f"listed-{label}", image, allowed, ALLOW_LIST))
    cases.append(create_image("empty-list", BACKUP["image"], False, EMPTY_LIST))
    legacy = cluster({**BACKUP, "image": "legacy:1"})
    for label, new, allowed in (
        ("unchanged", cluster({**BACKUP, "image": "legacy:1", "keep": 9}), True),
        ("changed-unlisted", cluster({**BACKUP, "image": "other:2"}), False),
        ("changed-listed", cluster(BACKUP), True),
        ("removed", cluster(), True),
    ):
        cases.append(
            Case(
                f"image-update-{label}",
                IMAGES,
                "UPDATE",
                new,
                legacy,
                BOTH,
                allowed,
                () if allowed else (not_listed("other:2"),),
                allow_list=ALLOW_LIST,
            )
        )
    return cases


def _shard_cases() -> list[Case]:
    def invalid(shard: str) -> tuple[str, ...]:
        return (SHARD_INVALID.format(shard=shard),)

    label = SHARD_LABEL
    return [
        Case("shard-create-0", SHARD, "CREATE", sharded({label: "0"})),
        Case("shard-create-last", SHARD, "CREATE", sharded({label: "4"})),
        Case(
            "shard-create-missing",
            SHARD,
            "CREATE",
            sharded(None),
            None,
            (),
            False,
            invalid(""),
            "Invalid",
        ),
        Case(
            "shard-create-other-label",
            SHARD,
            "CREATE",
            sharded({"other": "x"}),
            None,
            (),
            False,
            invalid(""),
            "Invalid",
        ),
        Case(
            "shard-create-out-of-range",
            SHARD,
            "CREATE",
            sharded({label: "5"}),
            None,
            (),
            False,
            invalid("5"),
            "Invalid",
        ),
        Case(
            "shard-create-leading-zero",
            SHARD,
            "CREATE",
            sharded({label: "01"}),
            None,
            (),
            False,
            invalid("01"),
            "Invalid",
        ),
        Case(
            "shard-update-same",
            SHARD,
            "UPDATE",
            sharded({label: "2", "x": "y"}),
            sharded({label: "2"}),
        ),
        Case(
            "shard-update-moved",
            SHARD,
            "UPDATE",
            sharded({label: "3"}),
            sharded({label: "2"}),
            (),
            False,
            (SHARD_MOVED.format(old="2"),),
        ),
        Case(
            "shard-update-removed",
            SHARD,
            "UPDATE",
            sharded(None),
            sharded({label: "2"}),
            (),
            False,
            invalid(""),
            "Invalid",
        ),
        Case("shard-update-unlabelled", SHARD, "UPDATE", sharded(None), sharded(None)),
        Case("shard-label-once", SHARD, "UPDATE", sharded({label: "4"}), sharded(None)),
        Case(
            "shard-label-once-invalid",
            SHARD,
            "UPDATE",
            sharded({label: "9"}),
            sharded(None),
            (),
            False,
            invalid("9"),
            "Invalid",
        ),
    ]


CREATE_SERVICES: Grant = ("create", "", "services", NAMESPACE, None)
USE_LB: Grant = ("use", "adg.io", "servicetypes", NAMESPACE, "LoadBalancer")
USE_NODEPORT: Grant = ("use", "adg.io", "servicetypes", NAMESPACE, "NodePort")
USE_ANY_TYPE: Grant = ("use", "adg.io", "servicetypes", NAMESPACE, None)
USE_LB_ELSEWHERE: Grant = ("use", "adg.io", "servicetypes", OTHER_NAMESPACE, "LoadBalancer")
CREATE_SERVICES_ELSEWHERE: Grant = ("create", "", "services", OTHER_NAMESPACE, None)
#: The annotation allow-list the cases run with: the ConfigMap deploy/base ships.
LISTED = "service.beta.kubernetes.io/aws-load-balancer-internal"
UNLISTED = "external-dns.alpha.kubernetes.io/hostname"


def no_services(kind: str) -> str:
    return (
        f"a {kind} Service makes Metacontroller create it in namespace databases, and alice "
        "may not create Services there"
    )


def no_type(kind: str) -> str:
    return (
        f"a {kind} Service exposes the database outside the cluster, and alice may not use "
        f"servicetypes.adg.io/{kind} in namespace databases"
    )


def unlisted(key: str) -> str:
    return (
        f"Service annotation {key} is not on the allow-list "
        "(ConfigMap pg-failover-hook/pg-failover-hook-service-annotations)"
    )


def exposed(
    kind: str = "ClusterIP",
    annotations: Mapping[str, str] | None = None,
    replica: Mapping[str, Any] | None = None,
    ports: int = 5432,
) -> dict[str, Any]:
    """A cluster whose spec.service has ``kind`` and ``annotations``; ``replica``: its
    spec.replicaService (besides its name)."""
    service: dict[str, Any] = {"type": kind, "ports": [{"name": "postgresql", "port": ports}]}
    if annotations is not None:
        service["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"service": service}
    if replica is not None:
        spec["replicaService"] = {"name": "pg-orders-replicas", **replica}
    return cluster(**spec)


def _service_type_cases() -> list[Case]:
    lb = exposed("LoadBalancer")
    both = (CREATE_SERVICES, USE_LB)

    def refused(
        label: str,
        new: dict[str, Any],
        grants: tuple[Grant, ...],
        message: str,
        old: dict[str, Any] | None = None,
    ) -> Case:
        return Case(
            label, SERVICE_TYPE, "UPDATE" if old else "CREATE", new, old, grants, False, (message,)
        )

    return [
        Case("type-create-clusterip", SERVICE_TYPE, "CREATE", exposed()),
        Case("type-create-lb-both", SERVICE_TYPE, "CREATE", lb, grants=both),
        Case(
            "type-create-lb-any-type",
            SERVICE_TYPE,
            "CREATE",
            lb,
            grants=(CREATE_SERVICES, USE_ANY_TYPE),
        ),
        Case(
            "type-create-nodeport",
            SERVICE_TYPE,
            "CREATE",
            exposed("NodePort"),
            grants=(CREATE_SERVICES, USE_NODEPORT),
        ),
        refused("type-create-lb-nothing-granted", lb, (), no_services("LoadBalancer")),
        refused("type-create-lb-services-only", lb, (CREATE_SERVICES,), no_type("LoadBalancer")),
        refused("type-create-lb-use-only", lb, (USE_LB,), no_services("LoadBalancer")),
        refused(
            "type-create-lb-nodeport-grant",
            lb,
            (CREATE_SERVICES, USE_NODEPORT),
            no_type("LoadBalancer"),
        ),
        refused(
            "type-create-lb-use-elsewhere",
            lb,
            (CREATE_SERVICES, USE_LB_ELSEWHERE),
            no_type("LoadBalancer"),
        ),
        refused(
            "type-create-lb-services-elsewhere",
            lb,
            (CREATE_SERVICES_ELSEWHERE, USE_LB),
            no_services("LoadBalancer"),
        ),
        refused(
            "type-create-replica-nodeport",
            exposed(replica={"type": "NodePort"}),
            both,
            no_type("NodePort"),
        ),
        Case(
            "type-update-keeps-lb", SERVICE_TYPE, "UPDATE", exposed("LoadBalancer", ports=5433), lb
        ),
        Case("type-update-lb-to-clusterip", SERVICE_TYPE, "UPDATE", exposed(), lb),
        refused("type-update-clusterip-to-lb", lb, (), no_services("LoadBalancer"), exposed()),
        refused("type-update-lb-to-nodeport", exposed("NodePort"), both, no_type("NodePort"), lb),
        # The status subresource is not matched (and ignores spec).
        Case("type-status-write", SERVICE_TYPE, "UPDATE", lb, exposed(), status=True),
    ]


def _annotation_cases() -> list[Case]:
    def refused(
        label: str, new: dict[str, Any], key: str, old: dict[str, Any] | None = None
    ) -> Case:
        return Case(
            label, ANNOTATIONS, "UPDATE" if old else "CREATE", new, old, (), False, (unlisted(key),)
        )

    legacy = exposed(annotations={UNLISTED: "db.example.com"})
    return [
        Case("annotations-create-none", ANNOTATIONS, "CREATE", exposed()),
        Case(
            "annotations-create-listed",
            ANNOTATIONS,
            "CREATE",
            exposed(annotations={LISTED: "true"}),
        ),
        refused(
            "annotations-create-unlisted",
            exposed(annotations={UNLISTED: "db.example.com"}),
            UNLISTED,
        ),
        refused(
            "annotations-create-lookalike-prefix",
            exposed(annotations={"service.beta.kubernetes.io.evil.example/x": "y"}),
            "service.beta.kubernetes.io.evil.example/x",
        ),
        refused(
            "annotations-create-replica-unlisted",
            exposed(replica={"annotations": {UNLISTED: "ro.example.com"}}),
            UNLISTED,
        ),
        Case(
            "annotations-update-keeps-unlisted",
            ANNOTATIONS,
            "UPDATE",
            exposed(annotations={UNLISTED: "db.example.com", LISTED: "true"}),
            legacy,
        ),
        refused(
            "annotations-update-changes-unlisted",
            exposed(annotations={UNLISTED: "attacker.example.com"}),
            UNLISTED,
            legacy,
        ),
        Case("annotations-update-removes", ANNOTATIONS, "UPDATE", exposed(), legacy),
    ]


CASES: list[Case] = (
    _authority_cases()
    + _image_cases()
    + _shard_cases()
    + _service_type_cases()
    + _annotation_cases()
)
BACKUP_CASES = [c for c in CASES if c.policy in (AUTHORITY, IMAGES)]
SHARD_CASES = [c for c in CASES if c.policy == SHARD]
SERVICE_CASES = [c for c in CASES if c.policy in (SERVICE_TYPE, ANNOTATIONS)]


def localize(message: str, namespace: str, name: str, user: str) -> str:
    """A message of the table as the real run writes it (its namespace, object, user)."""
    return (
        message.replace(f"{NAMESPACE}/{NAME}", f"{namespace}/{name}")
        .replace(f"namespace {NAMESPACE}", f"namespace {namespace}")
        .replace(f"and {USER} may", f"and {user} may")
    )
