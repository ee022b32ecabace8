"""The one exception type of the harness, so callers can tell harness trouble from test failures."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster could not be started, changed or stopped as asked.

    The message is meant for whoever is on call: it names the member and the step, and includes
    the tail of the relevant log files (Patroni, PostgreSQL, etcd) so that a failed CI run can be
    diagnosed from the test output alone.
    """
