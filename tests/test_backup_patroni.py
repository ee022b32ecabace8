"""The backup CronJob's script on the real Patroni cluster.

Test design: the session's 3-member Patroni cluster (127.0.0.2-4). The test runs the exact
script of the CronJob the hook emits, with the CronJob's own environment (only the Service
name is replaced by the leader's address, as there is no cluster DNS here, and the secret by
the replication credentials), as the unprivileged cluster user; then starts a fresh
PostgreSQL from the backup and queries it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hooks.children import backup_cronjob
from hooks.loaders.schemas import load_spec
from testbed.metacontroller.harness import CLUSTER, NAMESPACE, PARENT_UID, PRIMARY_SELECTOR, SERVICE
from testbed.patroni import PatroniCluster
from testbed.patroni.cluster import REPLICATION_USER, SUPERUSER

pytestmark = [pytest.mark.patroni, pytest.mark.slow]

SPEC: dict[str, Any] = {
    "primarySelector": dict(PRIMARY_SELECTOR),
    "serviceRef": {"name": SERVICE},
    "healthCheckPath": "/primary",
}


def _run_as(
    cluster: PatroniCluster, argv: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    assert cluster.runtime is not None
    user = cluster.runtime.user
    base = {"PATH": f"{cluster.runtime.pg_bin_dir}:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/"}
    kwargs: dict[str, Any] = {}
    if user.drop:
        kwargs = {"user": user.uid, "group": user.gid, "extra_groups": []}
    return subprocess.run(
        argv,
        env={**base, **env},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


def _owned_dir(cluster: PatroniCluster, path: Path) -> Path:
    assert cluster.runtime is not None
    path.mkdir(mode=0o700, parents=True)
    os.chown(path, cluster.runtime.user.uid, cluster.runtime.user.gid)
    return path


def test_the_backup_jobs_script_makes_a_backup_postgres_starts_from(
    healthy_patroni_cluster: PatroniCluster,
) -> None:
    cluster = healthy_patroni_cluster
    leader = cluster.leader()
    assert leader is not None
    token = uuid.uuid4().hex
    cluster.execute(leader, "CREATE TABLE IF NOT EXISTS backup_marker (token text)")
    cluster.execute(leader, "INSERT INTO backup_marker VALUES (%s)", (token,))

    # The CronJob exactly as the hook emits it (keep=1, to see pruning on real backups).
    spec, problems = load_spec(
        {
            **SPEC,
            "backup": {
                "schedule": "@daily",
                "image": "postgres:18",
                "pvcName": "backups",
                "secretName": "replication",
                "keep": 1,
            },
        }
    )
    assert spec is not None, problems
    cronjob = backup_cronjob.desired_cronjob(spec, NAMESPACE, CLUSTER, PARENT_UID)
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    script = container["command"][2]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["PGHOST"] == SERVICE and env["PGPORT"] == "5432"
    secret_keys = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["key"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert secret_keys == {"PGUSER": "username", "PGPASSWORD": "password"}

    work = _owned_dir(cluster, cluster.base_dir / f"backup-test-{token[:8]}")
    backups = work / "pvc" / CLUSTER
    restored = work / "restored"
    socket_dir = _owned_dir(cluster, work / "sock")
    _owned_dir(cluster, work / "pvc")
    env.update(
        {
            "PGHOST": cluster.member(leader).ip,  # the Service's DNS name does not exist here
            "PGUSER": REPLICATION_USER,
            "PGPASSWORD": cluster.replication_password,
            "BACKUP_DIR": str(backups),
        }
    )
    postmaster: int | None = None
    try:
        first = _run_as(cluster, ["/bin/sh", "-c", script], env)
        assert first.returncode == 0, first.stdout + first.stderr
        time.sleep(1.1)  # a new second, a new name
        second = _run_as(cluster, ["/bin/sh", "-c", script], env)
        assert second.returncode == 0, second.stdout + second.stderr
        (name,) = os.listdir(backups)  # keep=1: the first one was pruned
        assert name.startswith("base-") and f"{name} is verified" in second.stdout
        assert "pruning base-" in second.stdout

        verify = _run_as(cluster, ["pg_verifybackup", str(backups / name)], {})
        assert verify.returncode == 0, verify.stderr

        copy = _run_as(cluster, ["cp", "-a", str(backups / name), str(restored)], {})
        assert copy.returncode == 0, copy.stderr
        options = (
            f"-c port=5499 -c listen_addresses='' -c unix_socket_directories={socket_dir} "
            f"-c logging_collector=off -c cluster_name=restored-backup "
            f"-c hba_file={restored}/pg_hba.conf -c ident_file={restored}/pg_ident.conf"
        )
        start = _run_as(
            cluster,
            [
                "pg_ctl",
                "-D",
                str(restored),
                "-l",
                str(work / "restored.log"),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ],
            {},
        )
        pid_file = restored / "postmaster.pid"
        if pid_file.exists():
            postmaster = int(pid_file.read_text().split()[0])
        assert start.returncode == 0, start.stderr + (work / "restored.log").read_text()

        rows = _query(socket_dir, "SELECT token, pg_is_in_recovery() FROM backup_marker")
        assert (token, False) in rows
    finally:
        if postmaster is not None:
            stop = _run_as(cluster, ["pg_ctl", "-D", str(restored), "-m", "immediate", "stop"], {})
            if stop.returncode != 0:
                _kill(postmaster)
        shutil.rmtree(work, ignore_errors=True)


def _query(socket_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    import importlib

    psycopg2: Any = importlib.import_module("psycopg2")
    conn = psycopg2.connect(
        host=str(socket_dir), port=5499, user=SUPERUSER, dbname="postgres", connect_timeout=10
    )
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
