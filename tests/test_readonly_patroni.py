"""The read-only Service and the backups on the real Patroni cluster.

Test design: the session's 3-member Patroni cluster (127.0.0.2-4), the hook under real
gunicorn, and the Metacontroller stand-in applying every reply, with ``spec.replicaService``
set. Each test asserts on what clients would get (which Pods the primary Service selects,
which Pods the read-only Service's EndpointSlice routes to) over every sync of the run.
Invariants after every test: no hook call failed, the primary Pod is never among the
read-only endpoints, and neither Service nor slice is ever dropped once created.

The backup test runs the exact script of the CronJob the hook emits, with the CronJob's
own environment (only the Service name is replaced by the leader's address, as there is
no cluster DNS here, and the secret by the replication credentials), as the unprivileged
cluster user; then starts a fresh PostgreSQL from the backup and queries it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import PatroniCluster
from devcluster.cluster import REPLICATION_USER, SUPERUSER
from hooks.parts import backup_cronjob
from hooks.schemas import load_spec
from standin.gunicorn import GunicornHook, gunicorn_hook
from standin.harness import (
    CLUSTER,
    NAMESPACE,
    PARENT_UID,
    PRIMARY_SELECTOR,
    READ_ONLY_SERVICE,
    SERVICE,
    Rig,
    start_rig,
)

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]

SPEC: dict[str, Any] = {
    "primarySelector": dict(PRIMARY_SELECTOR),
    "serviceRef": {"name": SERVICE},
    "healthCheckPath": "/primary",
    "replicaService": {"name": READ_ONLY_SERVICE},  # default: 16 MiB, KeepEndpoints
}
#: Paused replay makes the lag below; keep paused replicas so that only the lag decides.
SPEC_WITH_PAUSED: dict[str, Any] = {
    **SPEC,
    "replicaService": {"name": READ_ONLY_SERVICE, "includePausedReplicas": True},
}


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with gunicorn_hook(tmp_path_factory.mktemp("hook"), workers=1, threads=8) as running:
        yield running


@pytest.fixture
def rig(
    request: pytest.FixtureRequest, healthy_patroni_cluster: PatroniCluster, hook: GunicornHook
) -> Iterator[Rig]:
    """The rig with ``SPEC``, or with the spec given by indirect parametrization."""
    spec = getattr(request, "param", SPEC)
    running = start_rig(healthy_patroni_cluster, hook.url, spec=spec)
    try:
        leader = healthy_patroni_cluster.leader()
        assert leader is not None
        replicas = tuple(sorted(n for n in healthy_patroni_cluster.names() if n != leader))
        running.wait_record(
            lambda r: r.selected == (leader,) and r.read_only == replicas,
            timeout=10,
            what="the Services on the leader and the replicas",
        )
        yield running
    finally:
        running.standin.stop()
    assert_invariants(running)


def assert_invariants(rig: Rig) -> None:
    created = False
    for record in rig.records:
        assert record.error is None, f"hook call failed: {record.error}"
        assert not set(record.selected) & set(record.read_only), f"leader listed: {record}"
        if record.read_only:
            created = True
        applied = record.applied
        assert applied is not None
        assert not [o for o in applied.deleted_objects if READ_ONLY_SERVICE in o], record
    assert created, "the read-only endpoints never listed anyone"


def replicas_routed(rig: Rig) -> dict[str, Any]:
    status = rig.status()
    return next(c for c in status["conditions"] if c["type"] == "ReplicasRouted")


def test_the_read_only_endpoints_follow_a_failover(rig: Rig) -> None:
    cluster = rig.cluster
    old = cluster.leader()
    assert old is not None
    with cluster.watch_leader(exclude={old}) as watch:
        cluster.stop_member_gracefully(old, wait=False)
        rig.pod_changed(old, ready=False)
        election = watch.result(timeout=30)
    new = election.name
    (remaining,) = [n for n in cluster.names() if n not in (old, new)]
    # The promoted member leaves the read-only endpoints in the reply that moves the
    # primary Service to it.
    moved = rig.wait_record(
        lambda r: r.selected == (new,), timeout=10, what=f"the primary Service on {new}"
    )
    assert moved.read_only == (remaining,), moved
    cluster.wait_stopped(old)

    cluster.start_member(old)  # returns once it streams from the new leader
    rig.pod_changed(old, ready=True)
    rejoined = rig.wait_record(
        lambda r: r.read_only == tuple(sorted((old, remaining))),
        timeout=15,
        what=f"{old} back in the read-only endpoints",
    )
    assert rejoined.selected == (new,)
    assert rig.status()["replicaEndpoints"] == sorted((old, remaining))
    assert replicas_routed(rig)["status"] == "True"


def test_a_paused_replica_leaves_the_read_only_endpoints_at_once_and_comes_back(
    rig: Rig,
) -> None:
    """Issue 10: paused replay is out by default, lag or not (on a quiet primary a paused
    replica would never fall behind). Real Patroni reports it as ``xlog.paused: true``."""
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    paused, other = sorted(n for n in cluster.names() if n != leader)
    # Patroni 4 resumes a paused replay at its next HA loop unless automation is paused.
    with cluster.maintenance_mode():
        cluster.execute(paused, "SELECT pg_wal_replay_pause()")
        try:
            left = rig.wait_record(
                lambda r: r.read_only == (other,),
                timeout=15,
                what=f"{paused} out of the read-only endpoints",
            )
            assert left.selected == (leader,)
            routed = replicas_routed(rig)
            assert f"left out: {paused} (replay paused)" in routed["message"], routed
        finally:
            cluster.execute(paused, "SELECT pg_wal_replay_resume()")
    rig.wait_record(
        lambda r: r.read_only == tuple(sorted((paused, other))),
        timeout=15,
        what=f"{paused} back once replay resumed",
    )


@pytest.mark.parametrize("rig", [SPEC_WITH_PAUSED], indirect=True, ids=["includePausedReplicas"])
def test_a_lagging_replica_leaves_the_read_only_endpoints_and_comes_back(rig: Rig) -> None:
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    lagging, other = sorted(n for n in cluster.names() if n != leader)
    # Patroni 4 resumes a paused replay at its next HA loop unless automation is paused.
    with cluster.maintenance_mode():
        cluster.execute(lagging, "SELECT pg_wal_replay_pause()")
        try:
            cluster.execute(leader, "CREATE TABLE IF NOT EXISTS lag_probe (n int)")
            for n in range(3):  # each switch moves the WAL position to the next 16 MiB
                cluster.execute(leader, "INSERT INTO lag_probe VALUES (%s)", (n,))
                cluster.execute(leader, "SELECT pg_switch_wal()")
            left = rig.wait_record(
                lambda r: r.read_only == (other,),
                timeout=15,
                what=f"{lagging} out of the read-only endpoints",
            )
            assert left.selected == (leader,)
            routed = replicas_routed(rig)
            assert routed["status"] == "True"
            assert f"{lagging} (replay lags more than 16 MiB)" in routed["message"]
        finally:
            cluster.execute(lagging, "SELECT pg_wal_replay_resume()")
    rig.wait_record(
        lambda r: r.read_only == tuple(sorted((lagging, other))),
        timeout=15,
        what=f"{lagging} back once it replayed",
    )


# ------------------------------------------------------------------------ backups


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
