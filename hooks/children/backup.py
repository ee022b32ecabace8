"""Scheduled base backups: the CronJob child, its condition, and the status from its Jobs.

Pure, like every part (:mod:`hooks.children.base`); the CronJob and the script its Job runs
are built in :mod:`hooks.children.backup_cronjob`.

**What a backup is.** The Job runs :func:`~hooks.children.backup_cronjob.backup_script` with
``/bin/sh``: ``pg_basebackup`` against the *primary Service* (``PGHOST`` is
``spec.serviceRef.name``, so the backup always comes from the current leader, through the
Service the hook keeps on it), with streamed WAL (``-X stream``: the backup is
self-contained), a fast checkpoint (``-c fast``: it starts now, not at the next checkpoint)
and a SHA-256 manifest, into a hidden ``.partial-base-<UTC time>`` directory on the PVC.
Then ``pg_verifybackup`` checks every file and the WAL against the manifest, and only then
is the directory renamed to ``base-<UTC time>``: a ``base-*`` directory is always a verified
backup. Last, all but the newest ``keep`` ``base-*`` directories are removed. A failed run
removes its partial directory (and a run killed too hard for that, by a later run once it is
older than the Job deadline), so a failure never costs a verified backup.

**Status** comes from the Jobs the CronJob creates, related through the customize hook by
a label that holds the parent's UID (unique to this cluster, never an empty selector): the
newest success (Job name and completion time) and the newest failure (Job name, time,
reason). Both change only when a backup ends; the previous status is kept when its Job is
gone (history limits, TTL), so the values never go back in time.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from hooks.children.backup_cronjob import cronjob_name, desired_cronjob
from hooks.children.base import ChildGroup, Part, PartContext, PartPlan
from hooks.domain.model import BACKUP_OF_LABEL, CRONJOB_KEY, ClusterSpec, Condition
from hooks.domain.observed import BackupRecord, Job, PreviousBackup, parse_time

CONDITION = "BackupScheduled"


class BackupReason(enum.Enum):
    """The ``BackupScheduled`` condition's reason."""

    SCHEDULED = "Scheduled"
    REMOVED = "BackupRemoved"
    NOT_DECLARED = "CronJobsNotDeclared"
    NO_PARENT_UID = "NoParentUID"


def plan(context: PartContext) -> PartPlan:
    """The backup children, ``status.backup`` and ``BackupScheduled`` of one sync."""
    spec, request, keep = context.spec, context.request, context.keep
    backup = spec.backup
    uid = request.uid
    # None: the request has no CronJob group (the CompositeController lacks the type).
    cronjobs = request.cronjobs
    observed = dict(cronjobs or {})
    previous = request.previous.backup
    if backup is None:
        if not observed:
            return PartPlan()
        children = [_suspended(keep(obj)) for _, obj in sorted(observed.items())]
        names = ", ".join(sorted(observed))
        return PartPlan(
            children,
            _status_fields(previous, request.jobs, uid, None),
            _condition(
                "False",
                BackupReason.REMOVED,
                f"spec.backup is not set; CronJob {names} is kept but suspended until it is "
                "deleted by hand or with the PostgreSQLCluster",
            ),
        )
    name = cronjob_name(request.name)
    status = _status_fields(previous, request.jobs, uid, name)
    kept = [keep(obj) for _, obj in sorted(observed.items())]
    if cronjobs is None:
        return PartPlan(
            kept,
            status,
            _condition(
                "False",
                BackupReason.NOT_DECLARED,
                "The CompositeController does not declare batch/v1 cronjobs as a child "
                "resource; apply metacontroller/compositecontroller.yaml",
            ),
        )
    if not uid:
        return PartPlan(
            kept,
            status,
            _condition(
                "False",
                BackupReason.NO_PARENT_UID,
                "The request carries no parent UID to label the backup Jobs with",
            ),
        )
    children = [desired_cronjob(spec, request.namespace, request.name, uid, observed.get(name))]
    children += [keep(obj) for n, obj in sorted(observed.items()) if n != name]
    message = (
        f'CronJob {name} runs "{backup.schedule}": pg_basebackup from Service '
        f"{spec.service_name} into PVC {backup.pvc_name}, keeping the newest {backup.keep} "
        "verified backups"
    )
    return PartPlan(children, status, _condition("True", BackupReason.SCHEDULED, message))


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


PART = Part(
    name="backup CronJob",
    condition=CONDITION,
    reasons=BackupReason,
    child_groups=(ChildGroup(CRONJOB_KEY, "batch/v1", "cronjobs", needed_by="backup"),),
    related_rules=related_rules,
    plan=plan,
)


def _condition(status: str, reason: BackupReason, message: str) -> Condition:
    return Condition(CONDITION, status, reason.value, message)


def _suspended(cronjob: dict[str, Any]) -> dict[str, Any]:
    spec = cronjob.get("spec")
    if not isinstance(spec, dict):
        spec = cronjob["spec"] = {}
    spec["suspend"] = True
    return cronjob


# ------------------------------------------------------------------------- status


def _status_fields(
    previous: PreviousBackup,
    jobs: Mapping[str, Job] | None,
    uid: str | None,
    cronjob: str | None,
) -> dict[str, Any]:
    status = _status(previous, jobs, uid, cronjob)
    return {} if status is None else {"backup": status}


def _status(
    previous: PreviousBackup,
    jobs: Mapping[str, Job] | None,
    uid: str | None,
    cronjob: str | None,
) -> dict[str, Any] | None:
    """``status.backup``: the newest success and failure, seen now or recorded before."""
    success = _fields(previous.last_successful)
    failure = _fields(previous.last_failed)
    for name, job in sorted((jobs or {}).items()):
        if not uid or job.labels.get(BACKUP_OF_LABEL) != uid:
            continue
        finished = job.finished
        if finished is None:
            continue
        if finished.kind == "Complete":
            candidate = {"job": name, "completionTime": finished.when}
            if success is None or _newer(candidate["completionTime"], name, success):
                success = candidate
        else:
            candidate = {"job": name, "failureTime": finished.when, "reason": finished.reason}
            if failure is None or _newer(candidate["failureTime"], name, failure):
                failure = candidate
    status: dict[str, Any] = {}
    if cronjob is not None:
        status["cronJob"] = cronjob
    elif previous.cron_job is not None:
        status["cronJob"] = previous.cron_job
    if success is not None:
        status["lastSuccessful"] = success
    if failure is not None:
        status["lastFailed"] = failure
    return status or None


def _fields(record: BackupRecord | None) -> dict[str, str] | None:
    return dict(record.fields) if record is not None else None


def _newer(when: str, job: str, than: Mapping[str, Any]) -> bool:
    old_when = next(v for k, v in than.items() if k.endswith("Time"))
    return (parse_time(when), job) > (parse_time(old_when), str(than.get("job", "")))
