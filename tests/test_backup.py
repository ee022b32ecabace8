"""Unit tests of the scheduled base backups (:mod:`hooks.children.backup`, through the sync
pipeline).

Test design notes
-----------------
* The CronJob is checked in plain dicts: the fields that make it safe (Forbid, deadlines,
  history limits, one retry, the restricted security context, the secret-sourced
  credentials, the primary Service as ``PGHOST``), and the status it yields from related
  Jobs: newest success and failure, never going back in time, stable when fed back.
* The script is *executed*: ``/bin/sh`` runs the exact text the CronJob carries, with stub
  ``pg_basebackup``/``pg_verifybackup``/``date`` first on ``PATH``, to prove the file
  handling: a backup is renamed only once verified, failures leave no partial directory and
  prune nothing, leftovers of a killed run are removed, pruning keeps the newest ``keep``
  verified backups and touches nothing else. (tests/test_backup_patroni.py runs the same
  text against the real cluster with the real binaries.)
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hooks.children import backup, backup_cronjob
from hooks.core.routing import Decision
from hooks.domain.model import BACKUP_OF_LABEL, CRONJOB_KEY, LAST_APPLIED_ANNOTATION
from hooks.loaders.envelope import RequestError
from hooks.loaders.schemas import load_spec
from tests.child_helpers import (
    backup_fields,
    children_of,
    cluster_answers,
    condition,
    observed,
    request_body,
)
from tests.doubts import DOUBTS
from tests.helpers import P0, PARENT_UID, fed_back, make_service, preserved, run, seed_spec
from tests.manifest_helpers import restricted_problems

PRIMARY = make_service(pod=P0)
CRONJOB = "pg-orders-backup"


def spec_with(**fields: Any) -> dict[str, Any]:
    return seed_spec(backup=backup_fields(**fields))


def cronjob_of(body: dict[str, Any], answers: Any = None) -> dict[str, Any]:
    _, outcome = run(body, cluster_answers(P0) if answers is None else answers)
    return children_of(outcome, "CronJob")[CRONJOB]


def pod_spec(cronjob: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def job(
    name: str,
    *,
    complete: str | None = None,
    failed: str | None = None,
    reason: str = "BackoffLimitExceeded",
    uid: str = PARENT_UID,
) -> dict[str, Any]:
    """A backup Job as the informer delivers it; running unless ``complete``/``failed``."""
    status: dict[str, Any] = {"startTime": "2026-08-20T02:15:00Z"}
    if complete is not None:
        status["completionTime"] = complete
        status["succeeded"] = 1
        status["conditions"] = [
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": complete},
            {"type": "Complete", "status": "True", "lastTransitionTime": complete},
        ]
    elif failed is not None:
        status["failed"] = 2
        status["conditions"] = [
            {"type": "FailureTarget", "status": "True", "lastTransitionTime": failed},
            {"type": "Failed", "status": "True", "reason": reason, "lastTransitionTime": failed},
        ]
    else:
        status["active"] = 1
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "databases",
            "labels": {BACKUP_OF_LABEL: uid, "app.kubernetes.io/managed-by": "x"},
        },
        "status": status,
    }


# ===================================================================== the CronJob


def test_the_cronjob_runs_the_backup_script_against_the_primary_service() -> None:
    cronjob = cronjob_of(request_body(spec=spec_with()))

    assert cronjob["apiVersion"] == "batch/v1"
    assert cronjob["metadata"] == {
        "name": CRONJOB,
        "namespace": "databases",
        "labels": {
            "app.kubernetes.io/managed-by": "pg-failover-hook",
            "pg-failover-hook.adg.io/backup-of": PARENT_UID,
        },
    }
    spec = cronjob["spec"]
    assert {k: v for k, v in spec.items() if k != "jobTemplate"} == {
        "schedule": "15 2 * * *",
        "suspend": False,
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": 3600,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 3,
    }
    job_spec = spec["jobTemplate"]["spec"]
    assert (job_spec["backoffLimit"], job_spec["activeDeadlineSeconds"]) == (1, 21600)
    # The Jobs (and their Pods) carry the label the customize hook relates them by.
    for metadata in (spec["jobTemplate"]["metadata"], job_spec["template"]["metadata"]):
        assert metadata["labels"]["pg-failover-hook.adg.io/backup-of"] == PARENT_UID
    pod = pod_spec(cronjob)
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["volumes"] == [
        {"name": "backups", "persistentVolumeClaim": {"claimName": "pg-orders-backups"}}
    ]
    (container,) = pod["containers"]
    assert container["image"] == "postgres:18.1"
    assert container["command"] == ["/bin/sh", "-c", backup_cronjob.backup_script(3, 21600)]
    assert container["volumeMounts"] == [{"name": "backups", "mountPath": "/backups"}]
    assert container["env"] == [
        {"name": "PGHOST", "value": "pg-orders-primary"},
        {"name": "PGPORT", "value": "5432"},
        {
            "name": "PGUSER",
            "valueFrom": {"secretKeyRef": {"name": "pg-orders-replication", "key": "username"}},
        },
        {
            "name": "PGPASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "pg-orders-replication", "key": "password"}},
        },
        {"name": "PGAPPNAME", "value": "pg-failover-hook-backup"},
        {"name": "PGCONNECT_TIMEOUT", "value": "30"},
        {"name": "BACKUP_DIR", "value": "/backups/pg-orders"},
    ]
    assert "resources" not in container


def test_the_backup_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = pod_spec(cronjob_of(request_body(spec=spec_with(runAsUser=70))))
    assert restricted_problems(pod) == []
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 70,
        "runAsGroup": 70,
        "fsGroup": 70,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_keep_deadline_and_resources_come_from_the_spec() -> None:
    fields = backup_fields(
        keep=7,
        activeDeadlineSeconds=3600,
        resources={"requests": {"cpu": "250m", "memory": 268435456}, "limits": {"memory": "1Gi"}},
    )
    cronjob = cronjob_of(request_body(spec=seed_spec(backup=fields)))
    (container,) = pod_spec(cronjob)["containers"]
    assert container["command"][2] == backup_cronjob.backup_script(7, 3600)
    assert "stale_minutes=61\n" in container["command"][2]
    # A partial directory is stale one minute after the deadline, in whole minutes up.
    assert "stale_minutes=3\n" in backup_cronjob.backup_script(7, 61)
    assert "stale_minutes=2\n" in backup_cronjob.backup_script(7, 60)
    assert cronjob["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 3600
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "268435456"},
        "limits": {"memory": "1Gi"},
    }


def test_limits_without_requests_are_written() -> None:
    fields = backup_fields(resources={"limits": {"memory": "1Gi"}})
    (container,) = pod_spec(cronjob_of(request_body(spec=seed_spec(backup=fields))))["containers"]
    assert container["resources"] == {"limits": {"memory": "1Gi"}}


def test_a_quantity_the_api_server_rewrote_is_echoed_past_junk_containers() -> None:
    fields = backup_fields(resources={"requests": {"cpu": "0.5"}})
    (stored,) = observed(cronjob_of(request_body(spec=seed_spec(backup=fields))))
    pod_spec(stored)["containers"][:0] = ["junk", {"name": "sidecar", "resources": {}}]
    again = cronjob_of(request_body(spec=seed_spec(backup=fields), cronjobs=[stored]))
    assert pod_spec(again)["containers"][0]["resources"] == {"requests": {"cpu": "500m"}}


def test_a_quantity_the_api_server_rewrote_is_echoed_as_it_is_stored() -> None:
    fields = backup_fields(resources={"requests": {"cpu": "0.5", "memory": "1024Mi"}})
    body = request_body(spec=seed_spec(backup=fields))
    first = cronjob_of(body)
    (stored,) = observed(first)  # the stand-in stores canonical quantities, like the API server
    (stored_container,) = pod_spec(stored)["containers"]
    assert stored_container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}

    again = cronjob_of(request_body(spec=seed_spec(backup=fields), cronjobs=[stored]))
    (container,) = pod_spec(again)["containers"]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}

    # A changed value is a change: written as the spec says.
    fields["resources"]["requests"]["cpu"] = "2"
    changed = cronjob_of(request_body(spec=seed_spec(backup=fields), cronjobs=[stored]))
    assert pod_spec(changed)["containers"][0]["resources"]["requests"]["cpu"] == "2"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", 0.5),
        ("0.5", 0.5),
        ("1Gi", 2**30),
        ("1024Mi", 2**30),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2E", 2 * 10**18),
        ("2k", 2000),
    ],
)
def test_quantity_values(text: str, value: float) -> None:
    assert backup_cronjob.quantity_value(text) == value
    assert backup_cronjob.quantity_value("-1") is None


def test_the_postgresql_port_is_the_one_named_postgresql_else_the_first() -> None:
    spec = seed_spec(
        backup=backup_fields(),
        service={
            "ports": [{"name": "metrics", "port": 9187}, {"name": "postgresql", "port": 6432}]
        },
    )
    env = pod_spec(cronjob_of(request_body(spec=spec)))["containers"][0]["env"]
    assert {"name": "PGPORT", "value": "6432"} in env
    spec["service"]["ports"] = [{"name": "pg", "port": 5433}]
    loaded, _ = load_spec(spec)
    assert loaded is not None and backup_cronjob.postgres_port(loaded) == 5433


@pytest.mark.parametrize(
    ("cluster", "name"),
    [
        ("a" * 45, "a" * 45 + "-backup"),  # exactly 52: kept as it is
        ("a" * 46, "a" * 36 + "-6643110c-backup"),
        ("a" * 35 + "-" + "b" * 20, "a" * 35 + "-838b8bd0-backup"),  # no "--" at the cut
        ("a" * 34 + ".-" + "b" * 20, "a" * 34 + "-d53a6348-backup"),
    ],
)
def test_long_cronjob_names_are_cut_with_a_hash_of_the_whole_name(cluster: str, name: str) -> None:
    assert backup_cronjob.cronjob_name(cluster) == name
    assert len(name) <= 52


@pytest.mark.parametrize("length", [1, 44, 45, 60, 253])
def test_cronjob_names_fit_the_52_character_limit(length: int) -> None:
    cluster = ("pg." * 100)[:length].strip(".") or "p"
    name = backup_cronjob.cronjob_name(cluster)
    assert len(name) <= 52
    assert name.endswith("-backup")
    assert name == backup_cronjob.cronjob_name(cluster)  # stable
    if len(f"{cluster}-backup") <= 52:
        assert name == f"{cluster}-backup"
    assert not name.startswith(("-", ".")) and "-." not in name and ".-" not in name


def test_the_cronjob_does_not_depend_on_routing() -> None:
    for answers in (cluster_answers(P0), DOUBTS[0].answers, {}):
        cronjob = cronjob_of(request_body(spec=spec_with(), services=[PRIMARY]), answers)
        assert cronjob["spec"]["schedule"] == "15 2 * * *"
    _, outcome = run(request_body(spec=spec_with()), DOUBTS[0].answers)
    assert outcome.decision is Decision.NO_LEADER
    assert condition(outcome, "BackupScheduled")["status"] == "True"


def test_the_backup_scheduled_condition_describes_the_schedule() -> None:
    _, outcome = run(request_body(spec=spec_with()), cluster_answers(P0))
    scheduled = condition(outcome, "BackupScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("True", "Scheduled")
    assert scheduled["message"] == (
        'CronJob pg-orders-backup runs "15 2 * * *": pg_basebackup from Service '
        "pg-orders-primary into PVC pg-orders-backups, keeping the newest 3 verified backups"
    )
    assert outcome.body["status"]["backup"] == {"cronJob": CRONJOB}


# ============================================================ keeping, finalizing


def test_after_backup_is_removed_the_cronjob_is_kept_but_suspended() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    _, outcome = run(request_body(spec=seed_spec(), cronjobs=[stored]), cluster_answers(P0))

    kept = children_of(outcome, "CronJob")[CRONJOB]
    expected = preserved(stored)
    expected["spec"]["suspend"] = True
    assert kept == expected
    removed = condition(outcome, "BackupScheduled")
    assert (removed["status"], removed["reason"]) == ("False", "BackupRemoved")
    assert removed["message"] == (
        "spec.backup is not set; CronJob pg-orders-backup is kept but suspended until it is "
        "deleted by hand or with the PostgreSQLCluster"
    )
    # Nothing recorded and no Job seen: no ``status.backup`` at all (not ``backup: null``).
    assert "backup" not in outcome.body["status"]


def test_after_backup_is_removed_the_status_still_follows_the_jobs() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    body = request_body(
        spec=seed_spec(), cronjobs=[stored], jobs=[NEWER_JOB], status={"backup": RECORDED}
    )
    _, outcome = run(body, cluster_answers(P0))
    assert outcome.body["status"]["backup"]["lastSuccessful"]["job"] == "pg-orders-backup-29010"


def test_a_removed_cronjob_recorded_without_a_spec_is_suspended_all_the_same() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    applied = json.loads(stored["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    del applied["spec"]
    stored["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = json.dumps(applied)
    _, outcome = run(request_body(spec=seed_spec(), cronjobs=[stored]), cluster_answers(P0))
    assert children_of(outcome, "CronJob")[CRONJOB]["spec"] == {"suspend": True}


def test_another_cronjob_of_the_cluster_is_kept_as_it_is() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    other = {**stored, "metadata": {**stored["metadata"], "name": "pg-orders-backup-old"}}
    _, outcome = run(request_body(spec=spec_with(), cronjobs=[stored, other]), cluster_answers(P0))
    assert children_of(outcome, "CronJob")["pg-orders-backup-old"] == preserved(other)


def test_after_backup_is_removed_every_cronjob_is_named() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    other = {**stored, "metadata": {**stored["metadata"], "name": "pg-orders-backup-old"}}
    _, outcome = run(request_body(spec=seed_spec(), cronjobs=[stored, other]), cluster_answers(P0))
    assert condition(outcome, "BackupScheduled")["message"].startswith(
        "spec.backup is not set; CronJob pg-orders-backup, pg-orders-backup-old is kept"
    )


def test_after_backup_is_removed_the_recorded_status_and_cronjob_name_stay() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    recorded = {
        "cronJob": CRONJOB,
        "lastSuccessful": {
            "job": "pg-orders-backup-29002",
            "completionTime": "2026-08-19T02:19:44Z",
        },
    }
    body = request_body(spec=seed_spec(), cronjobs=[stored], status={"backup": recorded})
    _, outcome = run(body, cluster_answers(P0))
    assert outcome.body["status"]["backup"] == recorded


def test_without_a_declared_cronjob_type_no_cronjob_is_emitted() -> None:
    body = request_body(spec=spec_with(), cronjobs=None)
    assert CRONJOB_KEY not in body["children"]
    _, outcome = run(body, cluster_answers(P0))
    assert children_of(outcome, "CronJob") == {}
    not_declared = condition(outcome, "BackupScheduled")
    assert (not_declared["status"], not_declared["reason"], not_declared["message"]) == (
        "False",
        "CronJobsNotDeclared",
        "The CompositeController does not declare batch/v1 cronjobs as a child resource; "
        "apply metacontroller/compositecontroller.yaml",
    )


RECORDED = {
    "cronJob": CRONJOB,
    "lastSuccessful": {"job": "pg-orders-backup-29002", "completionTime": "2026-08-19T02:19:44Z"},
}
NEWER_JOB = job("pg-orders-backup-29010", complete="2026-08-20T02:20:00Z")


def test_without_a_declared_cronjob_type_the_backup_status_still_follows_the_jobs() -> None:
    body = request_body(
        spec=spec_with(), cronjobs=None, jobs=[NEWER_JOB], status={"backup": RECORDED}
    )
    _, outcome = run(body, cluster_answers(P0))
    assert outcome.body["status"]["backup"] == {
        "cronJob": CRONJOB,
        "lastSuccessful": {
            "job": "pg-orders-backup-29010",
            "completionTime": "2026-08-20T02:20:00Z",
        },
    }


def test_without_a_parent_uid_the_observed_cronjob_is_kept() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    body = request_body(spec=spec_with(keep=9), cronjobs=[stored])
    del body["parent"]["metadata"]["uid"]
    _, outcome = run(body, cluster_answers(P0))
    assert children_of(outcome, "CronJob")[CRONJOB] == preserved(stored)
    no_uid = condition(outcome, "BackupScheduled")
    assert (no_uid["status"], no_uid["reason"], no_uid["message"]) == (
        "False",
        "NoParentUID",
        "The request carries no parent UID to label the backup Jobs with",
    )


def test_without_a_parent_uid_the_recorded_backup_status_stays() -> None:
    body = request_body(spec=spec_with(), jobs=[NEWER_JOB], status={"backup": RECORDED})
    del body["parent"]["metadata"]["uid"]
    _, outcome = run(body, cluster_answers(P0))
    assert outcome.body["status"]["backup"] == RECORDED  # no Job can be told to be ours


def test_an_invalid_spec_keeps_the_cronjob_and_the_condition() -> None:
    body = request_body(spec=spec_with())
    _, first = run(body, cluster_answers(P0))
    (stored,) = observed(children_of(first, "CronJob")[CRONJOB])
    broken = fed_back(request_body(spec=spec_with(), cronjobs=[stored]), first)
    broken["parent"]["spec"]["backup"]["schedule"] = "every night"
    _, outcome = run(broken, cluster_answers(P0))

    assert outcome.decision is Decision.INVALID_SPEC
    assert children_of(outcome, "CronJob")[CRONJOB] == preserved(stored)
    assert condition(outcome, "BackupScheduled") == condition(first, "BackupScheduled")
    assert "spec.backup.schedule" in condition(outcome, "SpecValid")["message"]


def test_finalize_drops_the_cronjob_and_waits_for_it() -> None:
    (stored,) = observed(cronjob_of(request_body(spec=spec_with())))
    body = request_body(spec=spec_with(), cronjobs=[stored], finalizing=True)
    _, outcome = run(body)
    assert outcome.body["children"] == [] and outcome.body["finalized"] is False
    body["children"][CRONJOB_KEY] = {}
    _, outcome = run(body)
    assert outcome.body["finalized"] is True


# ============================================================== status from Jobs


def backup_status(jobs: list[dict[str, Any]], previous: dict[str, Any] | None = None) -> Any:
    status = {"backup": previous} if previous is not None else None
    body = request_body(spec=spec_with(), jobs=jobs, status=status)
    _, outcome = run(body, cluster_answers(P0))
    return outcome.body["status"]["backup"]


def test_the_status_names_the_newest_success_and_the_newest_failure() -> None:
    status = backup_status(
        [
            job("pg-orders-backup-29001", complete="2026-08-18T02:21:07Z"),
            job("pg-orders-backup-29002", complete="2026-08-19T02:19:44Z"),
            job("pg-orders-backup-29003", failed="2026-08-17T08:15:00Z", reason="DeadlineExceeded"),
            job("pg-orders-backup-29004", failed="2026-08-16T02:15:30Z"),
            job("pg-orders-backup-29005"),  # running
        ]
    )
    assert status == {
        "cronJob": CRONJOB,
        "lastSuccessful": {
            "job": "pg-orders-backup-29002",
            "completionTime": "2026-08-19T02:19:44Z",
        },
        "lastFailed": {
            "job": "pg-orders-backup-29003",
            "failureTime": "2026-08-17T08:15:00Z",
            "reason": "DeadlineExceeded",
        },
    }


def test_jobs_before_one_of_another_cluster_or_a_running_one_are_still_read() -> None:
    status = backup_status(
        [
            job("a-other", complete="2026-08-19T03:00:00Z", uid="another-uid"),
            job("b-running"),
            job("pg-orders-backup-29002", complete="2026-08-19T02:19:44Z"),
        ]
    )
    assert status["lastSuccessful"]["job"] == "pg-orders-backup-29002"


def test_a_job_s_conditions_are_read_past_junk_and_unfinished_ones() -> None:
    junk = job("pg-orders-backup-29003", failed="2026-08-19T08:15:00Z", reason="")
    junk["status"]["conditions"][:0] = [
        "junk",
        {"type": "Complete", "status": "False", "lastTransitionTime": "2026-08-19T08:00:00Z"},
        {"type": "Suspended", "status": "True", "lastTransitionTime": "2026-08-19T08:00:00Z"},
        {"type": "Complete", "status": "True", "lastTransitionTime": "not a time"},
    ]
    assert backup_status([junk])["lastFailed"] == {
        "job": "pg-orders-backup-29003",
        "failureTime": "2026-08-19T08:15:00Z",
        "reason": "Failed",  # an empty reason: the condition's type
    }


def test_a_failure_is_dated_by_its_condition_not_by_a_completion_time() -> None:
    failed = job("pg-orders-backup-29003", failed="2026-08-19T08:15:00Z")
    failed["status"]["completionTime"] = "2026-08-19T09:00:00Z"
    assert backup_status([failed])["lastFailed"]["failureTime"] == "2026-08-19T08:15:00Z"


def test_at_the_same_time_the_later_job_name_wins_and_an_earlier_one_does_not() -> None:
    at = "2026-08-19T02:19:44Z"
    recorded = {
        "cronJob": CRONJOB,
        "lastSuccessful": {"job": "pg-orders-backup-29002", "completionTime": at},
    }
    earlier = job("pg-orders-backup-29001", complete=at)
    later = job("pg-orders-backup-29003", complete=at)
    assert backup_status([earlier], recorded) == recorded
    assert backup_status([earlier, later], recorded)["lastSuccessful"]["job"] == (
        "pg-orders-backup-29003"
    )
    failures = [job(n, failed=at) for n in ("pg-orders-backup-29005", "pg-orders-backup-29004")]
    assert backup_status(failures)["lastFailed"]["job"] == "pg-orders-backup-29005"


def test_the_recorded_result_of_the_same_job_is_kept_as_recorded() -> None:
    at = "2026-08-17T08:15:00Z"
    recorded = {
        "cronJob": CRONJOB,
        "lastFailed": {
            "job": "pg-orders-backup-29003",
            "failureTime": at,
            "reason": "DeadlineExceeded",
        },
    }
    again = job("pg-orders-backup-29003", failed=at, reason="BackoffLimitExceeded")
    assert backup_status([again], recorded) == recorded


def test_jobs_of_another_cluster_are_ignored() -> None:
    status = backup_status([job("x-1", complete="2026-08-19T02:00:00Z", uid="another-uid")])
    assert status == {"cronJob": CRONJOB}


def test_a_recorded_result_outlives_its_job_and_never_goes_back_in_time() -> None:
    previous = {
        "cronJob": CRONJOB,
        "lastSuccessful": {
            "job": "pg-orders-backup-29002",
            "completionTime": "2026-08-19T02:19:44Z",
        },
        "lastFailed": {
            "job": "pg-orders-backup-29000",
            "failureTime": "2026-08-15T02:15:30Z",
            "reason": "BackoffLimitExceeded",
        },
    }
    # The Jobs are gone (history limits): the status keeps what it recorded.
    assert backup_status([], previous) == previous
    # An older Job shows up again: it does not replace the newer record.
    older = job("pg-orders-backup-28999", complete="2026-08-10T02:00:00Z")
    assert backup_status([older], previous) == previous
    # A newer one does.
    newer = job("pg-orders-backup-29010", complete="2026-08-20T02:20:00Z")
    assert backup_status([older, newer], previous)["lastSuccessful"] == {
        "job": "pg-orders-backup-29010",
        "completionTime": "2026-08-20T02:20:00Z",
    }


def test_the_backup_status_converges_when_fed_back() -> None:
    jobs = [job("pg-orders-backup-29002", complete="2026-08-19T02:19:44Z")]
    body = request_body(spec=spec_with(), jobs=jobs)
    _, first = run(body, cluster_answers(P0))
    _, second = run(fed_back(body, first), cluster_answers(P0))
    assert second.body == first.body


def test_garbage_in_a_recorded_status_is_dropped() -> None:
    assert backup_status([], {"lastSuccessful": {"job": 5}, "lastFailed": "x"}) == {
        "cronJob": CRONJOB
    }
    for record in (
        {"job": 5, "completionTime": "2026-08-19T02:19:44Z"},
        {"job": "pg-orders-backup-29002", "completionTime": "yesterday"},
    ):
        assert backup_status([], {"lastSuccessful": record}) == {"cronJob": CRONJOB}


def test_junk_labels_on_a_job_refuse_the_request() -> None:
    """Labels that are not a map of strings cannot be read: a broken request (400), which
    changes nothing, rather than a Job that silently does not count."""
    stray = job("pg-orders-backup-29002", complete="2026-08-19T02:19:44Z")
    stray["metadata"]["labels"] = "junk"
    body = request_body(spec=spec_with(), jobs=[stray])
    with pytest.raises(RequestError, match=r"Job.batch/v1\['pg-orders-backup-29002'\] has "):
        run(body, cluster_answers(P0))


def test_the_related_rule_selects_this_clusters_jobs_by_uid() -> None:
    spec, _ = load_spec(spec_with())
    assert backup.related_rules(spec, "u-1") == [
        {
            "apiVersion": "batch/v1",
            "resource": "jobs",
            "labelSelector": {"matchLabels": {"pg-failover-hook.adg.io/backup-of": "u-1"}},
        }
    ]
    assert backup.related_rules(spec, None) == []
    assert backup.related_rules(spec, "") == []
    assert backup.related_rules(load_spec(seed_spec())[0], "u-1") == []
    assert backup.related_rules(None, "u-1") == []


# ==================================================================== the script

STUBS = {
    "pg_basebackup": r"""#!/bin/sh
if [ "${1:-}" = "--version" ]; then echo "pg_basebackup (PostgreSQL) 18.1"; exit 0; fi
echo "pg_basebackup $*" >> "$STUB_LOG"
dir=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-D" ]; then dir="$2"; fi
  shift
done
mkdir -p "$dir"
echo data > "$dir/PG_VERSION"
if [ -n "${STUB_FAIL_BASEBACKUP:-}" ]; then exit 1; fi
echo manifest > "$dir/backup_manifest"
""",
    "pg_verifybackup": r"""#!/bin/sh
echo "pg_verifybackup $*" >> "$STUB_LOG"
if [ -n "${STUB_FAIL_VERIFY:-}" ]; then exit 1; fi
test -f "$1/backup_manifest"
""",
    "date": r"""#!/bin/sh
echo "$STUB_DATE"
""",
}


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, Any]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "backups" / "pg-orders"
    return {"bin": bin_dir, "root": root, "log": tmp_path / "stub.log"}


def run_script(
    sandbox: dict[str, Any],
    keep: int = 3,
    stamp: str = "20260820T021500Z",
    deadline: int = 21600,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    environment = {
        "PATH": f"{sandbox['bin']}:/usr/bin:/bin",
        "PGHOST": "pg-orders-primary",
        "PGPORT": "5432",
        "PGUSER": "replicator",
        "PGPASSWORD": "secret",
        "BACKUP_DIR": str(sandbox["root"]),
        "STUB_LOG": str(sandbox["log"]),
        "STUB_DATE": stamp,
        **env,
    }
    environment = {k: v for k, v in environment.items() if v != "<unset>"}
    return subprocess.run(
        ["/bin/sh", "-c", backup_cronjob.backup_script(keep, deadline)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_the_script_is_valid_posix_shell() -> None:
    check = subprocess.run(
        ["/bin/sh", "-n", "-c", backup_cronjob.backup_script(3)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr


def test_a_backup_is_taken_with_the_required_flags_verified_and_renamed(
    sandbox: dict[str, Any],
) -> None:
    done = run_script(sandbox)
    assert done.returncode == 0, done.stderr
    assert entries(sandbox["root"]) == ["base-20260820T021500Z"]
    assert (sandbox["root"] / "base-20260820T021500Z" / "backup_manifest").is_file()
    log = sandbox["log"].read_text().splitlines()
    assert log == [
        "pg_basebackup -h pg-orders-primary -p 5432 -U replicator -w "
        "-D .partial-base-20260820T021500Z -X stream -c fast --manifest-checksums=SHA256 "
        "-l pg-failover-hook base-20260820T021500Z -v",
        "pg_verifybackup .partial-base-20260820T021500Z",
    ]
    assert "base-20260820T021500Z is verified" in done.stdout
    assert oct(sandbox["root"].stat().st_mode & 0o777) == "0o700"


def _old_backups(root: Path, *stamps: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for stamp in stamps:
        (root / f"base-{stamp}").mkdir()
        (root / f"base-{stamp}" / "backup_manifest").write_text("old")


def test_pruning_keeps_the_newest_verified_backups_and_nothing_else_is_touched(
    sandbox: dict[str, Any],
) -> None:
    root = sandbox["root"]
    _old_backups(root, "20260816T021500Z", "20260817T021500Z", "20260818T021500Z")
    (root / "base-manual-copy").mkdir()  # not a name the script writes
    (root / "notes.txt").write_text("mine")
    os.symlink(root / "base-20260816T021500Z", root / "base-20200101T000000Z")

    done = run_script(sandbox, keep=2)

    assert done.returncode == 0, done.stderr
    assert entries(root) == [
        "base-20200101T000000Z",  # a symlink: never counted, never removed (now dangling)
        "base-20260818T021500Z",
        "base-20260820T021500Z",
        "base-manual-copy",
        "notes.txt",
    ]
    assert "pruning base-20260817T021500Z" in done.stdout
    assert "pruning base-20260816T021500Z" in done.stdout


@pytest.mark.parametrize("failing", ["STUB_FAIL_BASEBACKUP", "STUB_FAIL_VERIFY"])
def test_a_failed_backup_leaves_nothing_and_prunes_nothing(
    sandbox: dict[str, Any], failing: str
) -> None:
    root = sandbox["root"]
    _old_backups(root, "20260817T021500Z", "20260818T021500Z")

    done = run_script(sandbox, keep=1, **{failing: "1"})

    assert done.returncode != 0
    assert entries(root) == ["base-20260817T021500Z", "base-20260818T021500Z"]


def test_the_partial_directory_of_a_killed_run_is_removed(sandbox: dict[str, Any]) -> None:
    root = sandbox["root"]
    stale = root / ".partial-base-20260819T021500Z"
    (stale / "base").mkdir(parents=True)
    past = time.time() - 3600 - 120  # older than the Job deadline (+1 min)
    os.utime(stale, (past, past))
    done = run_script(sandbox, deadline=3600)
    assert done.returncode == 0, done.stderr
    assert entries(root) == ["base-20260820T021500Z"]
    assert "removing ./.partial-base-20260819T021500Z" in done.stdout


def test_the_partial_directory_of_a_run_still_going_is_left_alone(
    sandbox: dict[str, Any],
) -> None:
    # Started by hand (kubectl create job --from=cronjob/...) while the scheduled run goes.
    root = sandbox["root"]
    running = root / ".partial-base-20260820T021400Z"
    (running / "base").mkdir(parents=True)
    past = time.time() - 3600 + 300  # younger than the deadline
    os.utime(running, (past, past))
    done = run_script(sandbox, deadline=3600)
    assert done.returncode == 0, done.stderr
    assert entries(root) == [".partial-base-20260820T021400Z", "base-20260820T021500Z"]


def test_an_existing_backup_of_the_same_second_is_never_overwritten(
    sandbox: dict[str, Any],
) -> None:
    _old_backups(sandbox["root"], "20260820T021500Z")
    done = run_script(sandbox)
    assert done.returncode == 1
    assert "exists already" in done.stderr
    assert (sandbox["root"] / "base-20260820T021500Z" / "backup_manifest").read_text() == "old"


@pytest.mark.parametrize("variable", ["PGHOST", "PGPORT", "PGUSER", "BACKUP_DIR"])
def test_a_missing_setting_fails_before_anything_is_written(
    sandbox: dict[str, Any], variable: str
) -> None:
    done = run_script(sandbox, **{variable: "<unset>"})
    assert done.returncode != 0
    assert not sandbox["log"].exists()


@pytest.mark.parametrize("keep", [0, -1, True, 2.0])
def test_keep_and_the_deadline_must_be_positive_integers(keep: Any) -> None:
    with pytest.raises(ValueError, match="keep must be a positive integer"):
        backup_cronjob.backup_script(keep)
    with pytest.raises(ValueError, match="active_deadline_seconds must be a positive integer"):
        backup_cronjob.backup_script(3, keep)
