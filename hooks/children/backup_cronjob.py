"""The backup Job's shell script and the CronJob that runs it: builders, no decisions.

:mod:`hooks.children.backup` decides whether the CronJob exists and what the status says;
this module builds the object (with only the fields we own) and the script, and keeps
resource quantities as the API server stores them.

Pure: plain values in, new dicts out.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from hooks.domain.model import (
    BACKUP_OF_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    QUANTITY,
    BackupSpec,
    ClusterSpec,
    field_default,
)
from hooks.domain.observed import CronJobChild

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
    observed: CronJobChild | None = None,
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


def _observed_resources(observed: CronJobChild | None) -> Mapping[str, Mapping[str, str]]:
    if observed is None:
        return {}
    return observed.container_resources.get(CONTAINER, {})


def _resources(
    wanted: Mapping[str, Mapping[str, str]], observed: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    result: dict[str, dict[str, str]] = {}
    for group in ("requests", "limits"):
        values = wanted.get(group) or {}
        seen = observed.get(group) or {}
        if not values:
            continue
        result[group] = {}
        for resource, quantity in values.items():
            current = seen.get(resource)
            same = current is not None and quantity_value(current) == quantity_value(quantity)
            result[group][resource] = current if same and current is not None else quantity
    return result
