"""Pytest plugin: the real Patroni cluster as fixtures.

Load it with ``pytest_plugins = ["tests.patroni_fixtures"]`` in ``tests/conftest.py`` (or
``-p tests.patroni_fixtures``).

* ``patroni_cluster`` (session): one cluster for the whole session. Starting it costs a few
  seconds, so tests share it; the teardown runs at session end even after failures and on
  Ctrl-C, and keeps the logs (printing where) if any test failed.
* ``healthy_patroni_cluster`` (function): the same cluster, but first brought back to the
  state every test may assume: all members running, exactly one leader, all others streaming.
  Members a previous test stopped or killed are restarted (rejoining via pg_rewind if needed).

Every test that uses either fixture is marked ``patroni`` automatically, so
``-m "not patroni"`` deselects all of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import ClusterError, PatroniCluster

_FIXTURES = {"patroni_cluster", "healthy_patroni_cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests that need the cluster, whatever marks they were written with."""
    for item in items:
        if _FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.patroni)


@pytest.fixture(scope="session")
def patroni_cluster(request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    """A started 3-member cluster shared by the session; torn down at the end."""
    cluster = PatroniCluster()
    cluster.start(timeout=90)
    try:
        yield cluster
    finally:
        # Keep the logs for a post-mortem if anything failed (the path is printed on stderr).
        cluster.stop(keep_logs=request.session.testsfailed > 0)


@pytest.fixture
def healthy_patroni_cluster(patroni_cluster: PatroniCluster) -> PatroniCluster:
    """The session cluster with all members up, one leader and the others streaming.

    If a previous test left the cluster beyond repair (members that do not rejoin within the
    timeout), it is replaced by a fresh one, so one broken test does not fail all that follow;
    the reason is printed and the old logs are kept.
    """
    try:
        patroni_cluster.ensure_healthy(timeout=120)
    except ClusterError as exc:
        print(f"\ncluster not healthy, starting a fresh one (logs kept): {exc}")
        patroni_cluster.restart(timeout=90)
    return patroni_cluster
