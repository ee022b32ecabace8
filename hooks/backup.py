"""Scheduled base backups: the CronJob child, the script its Job runs, and the status.

Pure, like :mod:`hooks.sync` (which calls :func:`plan` once per sync).

**What a backup is.** The Job runs :func:`backup_script` with ``/bin/sh``: ``pg_basebackup``
against the *primary Service* (``PGHOST`` is ``spec.serviceRef.name``, so the backup always
comes from the current leader, through the Service the hook keeps on it), with streamed
WAL (``-X stream``: the backup is self-contained), a fast checkpoint (``-c fast``: it starts
now, not at the next checkpoint) and a SHA-256 manifest, into a hidden ``.partial-base-<UTC
time>`` directory on the PVC. Then ``pg_verifybackup`` checks every file and the WAL
against the manifest, and only then is the directory renamed to ``base-<UTC time>``: a
``base-*`` directory is always a verified backup. Last, all but the newest ``keep``
``base-*`` directories are removed. A failed run removes its partial directory (and a run
killed too hard for that, by a later run once it is older than the Job deadline), so a
failure never costs a verified backup.

**Status** comes from the Jobs the CronJob creates, related through the customize hook by
a label that holds the parent's UID (unique to this cluster, never an empty selector): the
newest success (Job name and completion time) and the newest failure (Job name, time,
reason). Both change only when a backup ends; the previous status is kept when its Job is
gone (history limits, TTL), so the values never go back in time.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from hooks.model import (
    BACKUP_OF_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    QUANTITY,
    BackupSpec,
    ClusterSpec,
    field_default,
)

CONDITION = "BackupScheduled"
CONTAINER = "basebackup"
MOUNT_PATH = "/backups"
#: CronJob names longer than 52 characters are refused (the Job name adds 11).
MAX_CRONJOB_NAME = 52
SUCCESSFUL_JOBS_HISTORY = 3
FAILED_JOBS_HISTORY = 3
#: A run missed by more than this (controller down, cluster upgrade) is skipped, not
#: started late; it also bounds the CronJob controller's missed-schedule count.
STARTING_DEADLINE_SECONDS = 3600
#: One retry, in a fresh directory: a backup either verifies or leaves nothing behind.
BACKOFF_LIMIT = 1


@dataclass(frozen=True, slots=True)
class BackupPlan:
    """The backup part of a sync reply."""

    children: list[dict[str, Any]]
    #: ``status.backup`` (``None``: leave out).
    status: dict[str, Any] | None = None
    #: ``(type, status, reason, message)`` for ``BackupScheduled``, or ``None``.
    condition: tuple[str, str, str, str] | None = None


# --------------------------------------------------------------------- the script


def backup_script(
    keep: int,
    active_deadline_seconds: int = field_default(BackupSpec, "active_deadline_seconds"),
) -> str:
    """The shell script the backup Job runs (POSIX ``sh``, plus ``find -maxdepth -mmin``).

    It reads ``PGHOST``, ``PGPORT``, ``PGUSER`` (and ``PGPASSWORD``, through libpq) and
    ``BACKUP_DIR`` from the environment; the CronJob sets them, and a test runs the same
    text against the local Patroni cluster with other values.

    A partial directory is removed only once it is older than the Job's deadline: a run
    still going started less than that ago (``concurrencyPolicy: Forbid`` covers scheduled
    runs only, not one started by hand with ``kubectl create job --from``).
    """
    for name, value in (("keep", keep), ("active_deadline_seconds", active_deadline_seconds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    stale_minutes = -(-active_deadline_seconds // 60) + 1
    stamp = "[0-9]" * 8 + "T" + "[0-9]" * 6 + "Z"
    return f"""\
# pg-failover-hook base backup: pg_basebackup from the primary, verified, then pruned.
set -eu
umask 077
keep={keep}
stale_minutes={stale_minutes}
: "${{PGHOST:?}}" "${{PGPORT:?}}" "${{PGUSER:?}}" "${{BACKUP_DIR:?}}"
pg_basebackup --version
mkdir -p -- "$BACKUP_DIR"
cd -- "$BACKUP_DIR"
# A run killed too hard to clean up (SIGKILL, node loss) leaves its partial directory. One
# older than the Job deadline cannot belong to a run that is still going.
stale=$(find . -maxdepth 1 -type d -name '.partial-base-*' -mmin +"$stale_minutes")
for dir in $stale; do
  echo "removing $dir, left by an interrupted run"
  rm -rf -- "$dir"
done
name="base-$(date -u +%Y%m%dT%H%M%SZ)"
work=".partial-$name"
if [ -e "$name" ] || [ -e "$work" ]; then
  echo "$BACKUP_DIR/$name exists already" >&2
  exit 1
fi
trap 'rm -rf -- "$work"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
echo "backing up $PGHOST:$PGPORT as $PGUSER into $BACKUP_DIR/$name"
pg_basebackup -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -w -D "$work" \\
  -X stream -c fast --manifest-checksums=SHA256 -l "pg-failover-hook $name" -v
pg_verifybackup "$work"
mv -- "$work" "$name"
trap - EXIT
echo "$name is verified"
# Keep the newest $keep verified backups: only a verified backup is ever named base-*.
count=0
for dir in $(ls -1d base-* 2>/dev/null | sort -r); do
  case "$dir" in
    base-{stamp}) ;;
    *) continue ;;
  esac
  if [ ! -d "$dir" ] || [ -L "$dir" ]; then
    continue
  fi
  count=$((count + 1))
  if [ "$count" -gt "$keep" ]; then
    echo "pruning $dir (keeping the newest $keep)"
    rm -rf -- "$dir"
  fi
done
"""


# ------------------------------------------------------------------------ the CronJob


def cronjob_name(cluster: str) -> str:
    """``<cluster>-backup``, shortened with a stable hash when that is too long."""
    name = f"{cluster}-backup"
    if len(name) <= MAX_CRONJOB_NAME:
        return name
    digest = hashlib.sha256(cluster.encode()).hexdigest()[:8]
    head = cluster[: MAX_CRONJOB_NAME - len(digest) - len("--backup")].rstrip("-.")
    return f"{head}-{digest}-backup"


def backup_dir(cluster: str) -> str:
    """Where on the PVC this cluster's backups go (a PVC may hold several clusters')."""
    return f"{MOUNT_PATH}/{cluster}"


def postgres_port(spec: ClusterSpec) -> int:
    """The primary Service's PostgreSQL port: the one named ``postgresql``, else the first."""
    named = [p.port for p in spec.service_ports if p.name == "postgresql"]
    return named[0] if named else spec.service_ports[0].port


def desired_cronjob(
    spec: ClusterSpec,
    namespace: str,
    cluster: str,
    uid: str,
    observed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The backup CronJob, with only the fields we own.

    ``observed`` (the CronJob as it exists) is read for one thing: the API server stores
    resource quantities in canonical form (``0.5`` becomes ``500m``, ``1024Mi`` becomes
    ``1Gi``), and Metacontroller would otherwise "correct" them back on every sync. A
    quantity equal in value to the observed one is written as the observed string.
    """
    backup = spec.backup
    assert backup is not None
    labels = {MANAGED_BY_LABEL: MANAGED_BY, BACKUP_OF_LABEL: uid}
    secret = backup.secret_name
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": backup.image,
        "command": [
            "/bin/sh",
            "-c",
            backup_script(backup.keep, backup.active_deadline_seconds),
        ],
        "env": [
            {"name": "PGHOST", "value": spec.service_name},
            {"name": "PGPORT", "value": str(postgres_port(spec))},
            {
                "name": "PGUSER",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": "username"}},
            },
            {
                "name": "PGPASSWORD",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}},
            },
            {"name": "PGAPPNAME", "value": "pg-failover-hook-backup"},
            {"name": "PGCONNECT_TIMEOUT", "value": "30"},
            {"name": "BACKUP_DIR", "value": backup_dir(cluster)},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "backups", "mountPath": MOUNT_PATH}],
    }
    resources = _resources(backup.resources, _observed_resources(observed))
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": cronjob_name(cluster),
            "namespace": namespace,
            "labels": dict(labels),
        },
        "spec": {
            "schedule": backup.schedule,
            "suspend": False,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": STARTING_DEADLINE_SECONDS,
            "successfulJobsHistoryLimit": SUCCESSFUL_JOBS_HISTORY,
            "failedJobsHistoryLimit": FAILED_JOBS_HISTORY,
            "jobTemplate": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "backoffLimit": BACKOFF_LIMIT,
                    "activeDeadlineSeconds": backup.active_deadline_seconds,
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {
                            "restartPolicy": "Never",
                            "automountServiceAccountToken": False,
                            "securityContext": {
                                "runAsNonRoot": True,
                                "runAsUser": backup.run_as_user,
                                "runAsGroup": backup.run_as_user,
                                "fsGroup": backup.run_as_user,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "containers": [container],
                            "volumes": [
                                {
                                    "name": "backups",
                                    "persistentVolumeClaim": {"claimName": backup.pvc_name},
                                }
                            ],
                        },
                    },
                },
            },
        },
    }


def related_rules(spec: ClusterSpec | None, uid: str | None) -> list[dict[str, Any]]:
    """The customize rule for this cluster's backup Jobs (none without a backup or a UID).

    The selector is the parent's UID: unique to this cluster, and never empty (an empty
    selector would relate every Job in the namespace).
    """
    if spec is None or spec.backup is None or not uid:
        return []
    return [
        {
            "apiVersion": "batch/v1",
            "resource": "jobs",
            "labelSelector": {"matchLabels": {BACKUP_OF_LABEL: uid}},
        }
    ]


# --------------------------------------------------------------------------- plan


def plan(
    spec: ClusterSpec,
    namespace: str,
    cluster: str,
    uid: str | None,
    cronjobs: Mapping[str, Mapping[str, Any]] | None,
    jobs: Mapping[str, Mapping[str, Any]] | None,
    previous: Mapping[str, Any] | None,
    preserve: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> BackupPlan:
    """The backup children, ``status.backup`` and ``BackupScheduled`` of one sync.

    :param cronjobs: observed CronJob children by name; ``None`` when the request has no
        CronJob group (the CompositeController does not declare the type).
    :param jobs: related backup Jobs by name; ``None`` when not related (yet).
    :param previous: the parent's ``status.backup``.
    """
    backup = spec.backup
    observed = dict(cronjobs or {})
    if backup is None:
        if not observed:
            return BackupPlan([])
        children = [_suspended(preserve(obj)) for _, obj in sorted(observed.items())]
        names = ", ".join(sorted(observed))
        return BackupPlan(
            children,
            status=_status(previous, jobs, uid, None),
            condition=(
                CONDITION,
                "False",
                "BackupRemoved",
                f"spec.backup is not set; CronJob {names} is kept but suspended until it is "
                "deleted by hand or with the PostgreSQLCluster",
            ),
        )
    name = cronjob_name(cluster)
    kept = [preserve(obj) for _, obj in sorted(observed.items())]
    if cronjobs is None:
        return BackupPlan(
            kept,
            status=_status(previous, jobs, uid, name),
            condition=(
                CONDITION,
                "False",
                "CronJobsNotDeclared",
                "The CompositeController does not declare batch/v1 cronjobs as a child "
                "resource; apply metacontroller/compositecontroller.yaml",
            ),
        )
    if not uid:
        return BackupPlan(
            kept,
            status=_status(previous, jobs, uid, name),
            condition=(
                CONDITION,
                "False",
                "NoParentUID",
                "The request carries no parent UID to label the backup Jobs with",
            ),
        )
    children = [desired_cronjob(spec, namespace, cluster, uid, observed.get(name))]
    children += [preserve(obj) for n, obj in sorted(observed.items()) if n != name]
    message = (
        f'CronJob {name} runs "{backup.schedule}": pg_basebackup from Service '
        f"{spec.service_name} into PVC {backup.pvc_name}, keeping the newest {backup.keep} "
        "verified backups"
    )
    return BackupPlan(
        children,
        status=_status(previous, jobs, uid, name),
        condition=(CONDITION, "True", "Scheduled", message),
    )


def _suspended(cronjob: dict[str, Any]) -> dict[str, Any]:
    spec = cronjob.get("spec")
    if not isinstance(spec, dict):
        spec = cronjob["spec"] = {}
    spec["suspend"] = True
    return cronjob


# ------------------------------------------------------------------------- status


def _status(
    previous: Mapping[str, Any] | None,
    jobs: Mapping[str, Mapping[str, Any]] | None,
    uid: str | None,
    cronjob: str | None,
) -> dict[str, Any] | None:
    """``status.backup``: the newest success and failure, seen now or recorded before."""
    old = previous if isinstance(previous, Mapping) else {}
    success = _record(old.get("lastSuccessful"), ("job", "completionTime"))
    failure = _record(old.get("lastFailed"), ("job", "failureTime"))
    for name, job in sorted((jobs or {}).items()):
        if not uid or _labels(job).get(BACKUP_OF_LABEL) != uid:
            continue
        finished = _finished(job)
        if finished is None:
            continue
        kind, when, reason = finished
        if kind == "Complete":
            candidate = {"job": name, "completionTime": when}
            if success is None or _newer(candidate["completionTime"], name, success):
                success = candidate
        else:
            candidate = {"job": name, "failureTime": when, "reason": reason}
            if failure is None or _newer(candidate["failureTime"], name, failure):
                failure = candidate
    status: dict[str, Any] = {}
    if cronjob is not None:
        status["cronJob"] = cronjob
    elif isinstance(old.get("cronJob"), str):
        status["cronJob"] = old["cronJob"]
    if success is not None:
        status["lastSuccessful"] = success
    if failure is not None:
        status["lastFailed"] = failure
    return status or None


def _finished(job: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """``("Complete"|"Failed", time, reason)`` for a finished Job, else ``None``."""
    status = job.get("status")
    if not isinstance(status, Mapping):
        return None
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if not isinstance(condition, Mapping) or condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind not in ("Complete", "Failed"):
            continue
        when = status.get("completionTime") if kind == "Complete" else None
        when = when if _is_time(when) else condition.get("lastTransitionTime")
        if not _is_time(when):
            continue
        reason = condition.get("reason")
        assert isinstance(when, str)
        return str(kind), when, reason if isinstance(reason, str) and reason else str(kind)
    return None


def _record(value: object, keys: tuple[str, str]) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    if not isinstance(value.get(keys[0]), str) or not _is_time(value.get(keys[1])):
        return None
    return {k: v for k, v in value.items() if isinstance(v, str)}


def _newer(when: str, job: str, than: Mapping[str, Any]) -> bool:
    old_when = next(v for k, v in than.items() if k.endswith("Time"))
    return (_parse(when), job) > (_parse(old_when), str(than.get("job", "")))


def _is_time(value: object) -> bool:
    return isinstance(value, str) and _parse(value) is not None


def _parse(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


# ---------------------------------------------------------------------- quantities

_SUFFIXES = {
    **{s: Fraction(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_NUMBER = re.compile(r"^(?P<number>[0-9]*\.?[0-9]*)(?P<suffix>.*)$")


def quantity_value(text: str) -> Fraction | None:
    """The exact value of a Kubernetes quantity (``500m`` → 1/2), ``None`` if it is none."""
    if not QUANTITY.match(text):
        return None
    match = _NUMBER.match(text)
    assert match is not None
    number, suffix = Fraction(match["number"]), match["suffix"]
    if suffix[:1] in ("e", "E") and suffix != "E":
        return number * Fraction(10) ** int(Fraction(suffix[1:]))
    return number * _SUFFIXES[suffix]


def _observed_resources(observed: Mapping[str, Any] | None) -> Mapping[str, Any]:
    node: Any = observed or {}
    for key in ("spec", "jobTemplate", "spec", "template", "spec"):
        node = node.get(key) if isinstance(node, Mapping) else None
    containers = node.get("containers") if isinstance(node, Mapping) else None
    for container in containers if isinstance(containers, list) else []:
        if isinstance(container, Mapping) and container.get("name") == CONTAINER:
            resources = container.get("resources")
            return resources if isinstance(resources, Mapping) else {}
    return {}


def _resources(
    wanted: Mapping[str, Mapping[str, str]], observed: Mapping[str, Any]
) -> dict[str, dict[str, str]]:
    result: dict[str, dict[str, str]] = {}
    for group in ("requests", "limits"):
        values = wanted.get(group) or {}
        seen = observed.get(group)
        seen = seen if isinstance(seen, Mapping) else {}
        if not values:
            continue
        result[group] = {}
        for resource, quantity in values.items():
            current = seen.get(resource)
            same = isinstance(current, str) and quantity_value(current) == quantity_value(quantity)
            result[group][resource] = current if same and isinstance(current, str) else quantity
    return result
