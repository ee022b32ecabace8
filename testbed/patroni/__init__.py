"""A real, local 3-member Patroni cluster for tests, the demo and benchmarks.

``PatroniCluster`` runs etcd and three Patroni + PostgreSQL members on loopback addresses, the
way the hook will see them in Kubernetes (``pg-orders-0..2`` on 127.0.0.2-4, REST API on 8008),
and lets tests break it on purpose (graceful stop, SIGKILL, switchover) and measure failovers.
See :mod:`testbed.patroni.cluster` for why it is built the way it is.
"""

from testbed.patroni.cluster import (
    API_PORT,
    PG_PORT,
    SCOPE,
    LeaderElection,
    LeaderLoss,
    LeaderWatch,
    Member,
    MemberStatus,
    PatroniCluster,
    RestApiTLS,
    SwitchoverResult,
    poll_until,
    running_cluster,
    tail,
)
from testbed.patroni.errors import ClusterError
from testbed.patroni.leftovers import check_ports_free, kill_leftovers

__all__ = [
    "API_PORT",
    "PG_PORT",
    "SCOPE",
    "ClusterError",
    "LeaderElection",
    "LeaderLoss",
    "LeaderWatch",
    "Member",
    "MemberStatus",
    "PatroniCluster",
    "RestApiTLS",
    "SwitchoverResult",
    "check_ports_free",
    "kill_leftovers",
    "poll_until",
    "running_cluster",
    "tail",
]
