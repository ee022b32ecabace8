"""Which tests share a pytest-xdist worker: ``make test`` runs the suite on two
(``-n 2 --dist loadgroup``; ``TEST_WORKERS`` changes the count).

A worker is a process with session fixtures of its own, and xdist hands each group of tests
whole to one worker. Two rules follow:

* every module with a test on the session's real Patroni cluster (``patroni_cluster``:
  etcd on 127.0.0.1:2379 and members on 127.0.0.2-4, a fixed block held by a machine-wide
  address lock, ``testbed/patroni/address_locks.py``) is in the one group ``devcluster``.
  Two workers each starting that cluster would make the second wait for the first's whole
  session. The modules that run kube-proxy (its rules are the host's, one set per machine:
  ``tests/test_client_downtime.py``, ``tests/test_read_zones_kube.py``) are among them;
* every other module is a group of its own, so its module fixtures (a control plane or a
  Patroni cluster on an address block of its own, a hook under gunicorn) start once.

Everything else a test touches is per process or picked free (ports from the kernel, a
namespace per test, a control plane per worker), so the groups run side by side.
"""

from __future__ import annotations

import pytest

#: The group of the modules that use the session's real Patroni cluster.
DEVCLUSTER = "devcluster"
#: Fixtures whose users go in :data:`DEVCLUSTER`.
_DEVCLUSTER_FIXTURES = frozenset({"patroni_cluster"})


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def groups(items: list[pytest.Item]) -> dict[str, str]:
    """Each module's group: :data:`DEVCLUSTER`, or the module's own path."""
    on_devcluster = {
        module_of(item)
        for item in items
        if _DEVCLUSTER_FIXTURES & set(getattr(item, "fixturenames", ()))
    }
    return {
        module_of(item): DEVCLUSTER if module_of(item) in on_devcluster else module_of(item)
        for item in items
    }


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its group before xdist reads the marks (``tryfirst``)."""
    by_module = groups(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(by_module[module_of(item)]))
