"""The routing bounds of the control-path faults, derived from the settings (pure).

Each bound is the longest time from the end of a fault to the primary slice listing the new
Patroni leader, for Metacontroller run as ``deploy/metacontroller-values.yaml`` runs it (2
replicas, ``--leader-election``) and restarted as the kubelet restarts a container. The parts:

* ``ONE_SYNC`` (tests/test_kube_faults.py): the next sync + one probe round + the slice hop;
* ``START``: a new leader's controllers list what they watch, then sync every parent;
* the Lease (controller-runtime's defaults, which Metacontroller cannot change): a candidate
  takes a lease whose holder stopped renewing ``LEASE_DURATION`` after it FIRST saw the last
  record, at its next attempt (every ``RETRY_PERIOD`` x up to 2.2 = ``ACQUIRE``). A standby
  that was watching sees the last renewal at most one attempt after it was written (or
  after the API server can be reached again):
  ``TAKEOVER = LEASE_DURATION + 2 x ACQUIRE`` = 23.8 s after the leader stopped; a process
  started after the leader stopped: ``LEASE_DURATION + ACQUIRE`` = 19.4 s after its start.
* a leader that cannot renew for ``RENEW_DEADLINE`` exits (at most ``RENEW_DEADLINE +
  RETRY_PERIOD`` = 12 s into an outage); the kubelet restarts it at once the first time
  (CrashLoopBackOff delays only from the second exit on, :mod:`testbed.metacontroller.supervisor`).
"""

from __future__ import annotations

from testbed.metacontroller.leader_election import LEASE_DURATION, RETRY_PERIOD, Timings
from testbed.metacontroller.leader_election import RENEW_DEADLINE as RENEW_DEADLINE

#: The longest wait between two attempts of a candidate: 2 s x (1 + 1.2) = 4.4 s.
ACQUIRE = Timings().max_acquire_interval
#: A watching standby takes a lease whose holder stopped renewing at most this long after.
TAKEOVER = LEASE_DURATION + 2 * ACQUIRE
#: A process started after its holder stopped takes it at most this long after its start.
FRESH_TAKEOVER = LEASE_DURATION + ACQUIRE
#: A leader that cannot reach the API server has exited at most this long into the outage.
EXIT_AFTER = RENEW_DEADLINE + RETRY_PERIOD
#: An outage this much shorter than the renew deadline cannot cost the Lease (the last
#: attempt's requests and the clocks' granularity).
MARGIN = 1.0


def leader_killed(start: float, one_sync: float) -> float:
    """The leader's process killed (or its Pod deleted), a standby watching: after the kill."""
    return TAKEOVER + start + one_sync


def all_restarted(start: float, one_sync: float) -> float:
    """Every replica stopped, then started again: after the start (none released the
    Lease, so the new processes wait it out from their first look at it)."""
    return FRESH_TAKEOVER + start + one_sync


def rolling_update(start: float, one_sync: float) -> float:
    """Each replica replaced in turn (the chart's StatefulSet, one Pod at a time): after the
    rollout's end. The leader's Pod is deleted before the end, and a new leader comes at
    most :data:`TAKEOVER` after that (a replaced standby is a fresh candidate, which takes
    it at most :data:`FRESH_TAKEOVER` after its start, also before the end)."""
    return TAKEOVER + start + one_sync


def apiserver_down(unreachable: float, reconnect: float, start: float, one_sync: float) -> float:
    """The API server unreachable for ``unreachable`` s; ``reconnect``: the bound of the
    watches' reconnect and one sync without a leader change. Shorter than the renew
    deadline: the leader keeps the Lease. Longer: it exits, and the standby takes the Lease
    :data:`TAKEOVER` after the server is back at the latest: its first look after the outage
    may be the first time it sees the leader's last renewal (it looks every 2-4.4 s, the
    leader renews every 2 s), and a changed record restarts its lease-duration wait (seen
    here: 16.9 s after the server was back)."""
    if unreachable < RENEW_DEADLINE - MARGIN:
        return reconnect
    return max(reconnect, TAKEOVER + start + one_sync)


def paused_for(paused: float, start: float, one_sync: float) -> float:
    """Kubernetes' etcd or kube-apiserver paused (SIGSTOP) ``paused`` s, the bound from the
    pause's end. The leader's renewals hang (5 s client timeout,
    then a GET cut at the renew deadline), so a pause as long as the renew deadline may cost
    the Lease. A renewal the server took before the pause and applies after it may be the
    last record the standby sees, at the pause's end: the standby takes the Lease at most
    :data:`TAKEOVER` after that."""
    if paused < RENEW_DEADLINE - MARGIN:
        return one_sync
    return TAKEOVER + start + one_sync
