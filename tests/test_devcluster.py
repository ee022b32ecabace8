"""The local Patroni cluster harness does what the hook's tests and benchmarks rely on.

These run a real cluster (etcd + 3 x Patroni/PostgreSQL on 127.0.0.1-4). The expensive case is
the SIGKILL failover (~20 s of TTL), done once; the others take seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from testbed.patroni import ClusterError, PatroniCluster, kill_leftovers, poll_until
from testbed.patroni._proc import ENV_BASE_DIR, Proc
from testbed.patroni._runtime import DEFAULT_RUNTIME_DIR, resolve_runtime
from testbed.patroni.leftovers import MARKER

pytestmark = pytest.mark.patroni
# Also listed in tests/conftest.py; repeating it here keeps this file runnable on its own.
pytest_plugins = ["tests.patroni_fixtures"]

NAMES = ["pg-orders-0", "pg-orders-1", "pg-orders-2"]


def test_cluster_has_one_leader_and_two_streaming_replicas(
    healthy_patroni_cluster: PatroniCluster,
) -> None:
    cluster = healthy_patroni_cluster
    assert cluster.names() == NAMES
    assert [m.ip for m in cluster.members] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert [m.api_url for m in cluster.members] == [
        "http://127.0.0.2:8008",
        "http://127.0.0.3:8008",
        "http://127.0.0.4:8008",
    ]
    leader = cluster.leader()
    assert leader in NAMES
    statuses = {s.name: s for s in cluster.statuses()}
    assert statuses[leader].role == "primary"
    replicas = sorted(set(NAMES) - {leader})
    assert sorted(cluster.replicas()) == replicas
    for name in replicas:
        assert statuses[name].replication_state == "streaming"
        assert not statuses[name].primary
    # The leader's own view: both replicas stream from it.
    streams = cluster.patroni_info(leader).get("replication", [])
    assert sorted(s["application_name"] for s in streams if s["state"] == "streaming") == replicas
    assert cluster.dcs_leader() == leader
    for m in cluster.members:
        pids = m.pids()
        assert set(pids) == {"patroni", "postmaster"}, (m.name, pids)
        assert (m.data_dir / "PG_VERSION").is_file()
        assert m.data_dir.stat().st_mode & 0o077 == 0
        assert m.patroni_log.is_file()
    assert cluster.startup_seconds is not None
    assert cluster.runtime is not None
    print(
        f"\nstart-up to 1 leader + 2 streaming replicas: {cluster.startup_seconds:.1f}s; "
        f"Patroni runs as {cluster.runtime.user.name} from the {cluster.runtime.source}"
    )


def test_write_on_leader_shows_up_on_replicas(healthy_patroni_cluster: PatroniCluster) -> None:
    cluster = healthy_patroni_cluster
    leader = cluster.leader()
    assert leader is not None
    token = uuid.uuid4().hex
    cluster.execute(leader, "CREATE TABLE IF NOT EXISTS harness_rows (token text PRIMARY KEY)")
    cluster.execute(leader, "INSERT INTO harness_rows VALUES (%s)", (token,))
    for name in sorted(set(NAMES) - {leader}):
        query = "SELECT token FROM harness_rows WHERE token = %s"
        assert cluster.wait_for_rows(name, query, (token,)) == [(token,)]
        assert cluster.execute(name, "SELECT pg_is_in_recovery()") == [(True,)]
    # Addresses work as well as names.
    ip = cluster.member(leader).ip
    assert cluster.execute(ip, "SELECT pg_is_in_recovery()") == [(False,)]


def test_switchover_moves_leadership_to_candidate(healthy_patroni_cluster: PatroniCluster) -> None:
    cluster = healthy_patroni_cluster
    old = cluster.leader()
    assert old is not None
    candidate = sorted(set(NAMES) - {old})[-1]
    result = cluster.switchover(candidate)
    assert (result.old_leader, result.new_leader) == (old, candidate)
    assert cluster.leader() == candidate
    print(f"\nswitchover {old} -> {candidate}: {result.seconds:.2f}s to role=primary")
    # The old leader follows the new one (no restart needed by the test).
    cluster.wait_healthy(timeout=60)
    assert old in cluster.replicas()


def test_graceful_stop_of_leader_elects_new_leader(
    healthy_patroni_cluster: PatroniCluster,
) -> None:
    cluster = healthy_patroni_cluster
    old = cluster.leader()
    assert old is not None
    with cluster.watch_leader(exclude={old}) as watch:
        stopped_at = cluster.stop_member_gracefully(old, wait=False)
        election = watch.result(timeout=30)
    cluster.wait_stopped(old)
    first_200 = election.first_200 - stopped_at
    primary = election.first_primary - stopped_at
    print(
        f"\ngraceful stop of {old}: {election.name} answered 200 after {first_200:.2f}s, "
        f"role=primary after {primary:.2f}s"
    )
    assert election.name != old
    assert primary < 15  # measured ~2.5 s with loop_wait 2
    assert not cluster.member(old).running
    assert cluster.member(old).postmaster_pid is None  # Patroni stopped PostgreSQL too
    assert cluster.status(old).reachable is False
    assert cluster.leader() == election.name


def test_kill_leader_fails_over_after_ttl_and_old_leader_rejoins(
    healthy_patroni_cluster: PatroniCluster,
) -> None:
    cluster = healthy_patroni_cluster
    old = cluster.leader()
    assert old is not None
    member = cluster.member(old)
    pids = member.pids()
    killed_at = cluster.kill_member(old)
    for pid in pids.values():
        assert Proc.of(pid) is None, f"{pid} survived the kill"
    assert cluster.dcs_leader() == old  # nobody released the lock
    election = cluster.wait_for_leader(exclude={old}, timeout=cluster.ttl + 30)
    seconds = election.first_primary - killed_at
    print(
        f"\nSIGKILL of {old}: {election.name} is primary after {seconds:.2f}s (ttl {cluster.ttl})"
    )
    assert election.name != old
    assert cluster.ttl - 5 <= seconds <= cluster.ttl + 15
    # Write on the new timeline, then bring the old leader back: it must rewind and follow.
    token = uuid.uuid4().hex
    cluster.execute(
        election.name, "CREATE TABLE IF NOT EXISTS harness_rows (token text PRIMARY KEY)"
    )
    cluster.execute(election.name, "INSERT INTO harness_rows VALUES (%s)", (token,))
    t0 = time.monotonic()
    cluster.start_member(old, timeout=120)
    print(f"{old} rejoined as a streaming replica in {time.monotonic() - t0:.1f}s")
    assert old in cluster.replicas()
    assert cluster.leader() == election.name
    query = "SELECT token FROM harness_rows WHERE token = %s"
    assert cluster.wait_for_rows(old, query, (token,)) == [(token,)]


def test_start_member_refuses_a_running_member(healthy_patroni_cluster: PatroniCluster) -> None:
    with pytest.raises(ClusterError, match="already running"):
        healthy_patroni_cluster.start_member(NAMES[0])


def test_kill_leftovers_kills_processes_of_a_dead_run(tmp_path: Path) -> None:
    """A process tagged with a base dir whose owner is gone is killed; a live owner's is not."""
    dead = tmp_path / "dead"
    live = tmp_path / "live"
    for base, owner in ((dead, Proc(2**22 + 1, 1)), (live, Proc.of(os.getpid()))):
        base.mkdir()
        assert owner is not None
        (base / MARKER).write_text(
            f'{{"owner_pid": {owner.pid}, "owner_start_time": {owner.start_time}}}'
        )
    sleepers = {}
    for base in (dead, live):
        env = {**os.environ, ENV_BASE_DIR: str(base)}
        sleepers[base] = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], env=env
        )
    try:
        poll_until(lambda: all(Proc.of(p.pid) for p in sleepers.values()), timeout=5)
        killed = kill_leftovers()
        assert any(str(dead) in line for line in killed)
        assert not any(str(live) in line for line in killed)
        assert sleepers[dead].wait(timeout=10) == -signal.SIGKILL
        assert sleepers[live].poll() is None
    finally:
        for p in sleepers.values():
            p.kill()
            p.wait(timeout=10)


def test_runtime_copy_is_usable_by_the_cluster_user() -> None:
    """The fallback for CI clones the cluster user cannot traverse (testbed.patroni._runtime)."""
    runtime = resolve_runtime(force_copy=True)
    root = Path(os.environ.get("DEVCLUSTER_RUNTIME_DIR", DEFAULT_RUNTIME_DIR))
    assert runtime.source.startswith("runtime copy")
    assert runtime.python.parent.parent.parent == root
    assert root in runtime.pg_bin_dir.parents or "/usr/lib/postgresql" in str(runtime.pg_bin_dir)
    if os.geteuid() == 0:
        assert runtime.user.drop and runtime.user.uid != 0
