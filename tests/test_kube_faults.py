"""Control-plane faults under a failover, on the real control plane with real Patroni.

Each test breaks one part of what routes clients to the leader, during a failover of the
real Patroni cluster (etcd DCS), with the real hook under gunicorn, the Metacontroller
stand-in (or ``PGFH_METACONTROLLER_BINARY``) against the real kube-apiserver, the kubelet
stand-in and the real endpointslice controller:

* (a) kube-apiserver down for 30 s (SIGTERM, started again on its port 30 s later) while the
  leader stops, and answering nothing for 5 s (SIGSTOP) while the leader stops;
* (b) every Metacontroller replica stopped before the leader stops, started after; the
  leading replica SIGKILLed; a rolling update (each replica replaced in turn);
* (c) every hook pod (gunicorn) down for 10 s while the leader stops, and for 60 s while it
  is SIGKILLed (Patroni elects inside the outage either way), then back;
* (d) the control plane's etcd paused (SIGSTOP) for 10 s while the leader stops;
* (e) the leader's Pod deleted (the kubelet stand-in stops its Patroni as a kubelet stops
  the container), recreated with a new IP, and later the leader again through that IP;
* (a), (b) and (d) run Metacontroller as deploy/metacontroller-values.yaml does: 2 replicas
  with leader election (:mod:`testbed.metacontroller.leader_election`: a Lease, 15/10/2 s, not
  released on
  stop, an exit when renewal fails past the renew deadline), each restarted as the kubelet
  restarts a container (:mod:`testbed.metacontroller.supervisor`: CrashLoopBackOff), the stand-in's
  or the
  binary's; a failing test names the hop it waits on (no lease, exited, in back-off);
* and the bad input of the issue: a stale role label (and status annotation) written by hand
  on a replica's Pod never moves the Service, and the status says so.

Over every whole run (:func:`tests.kube_faults.check_run`, watches started before the fault):
the Service is never deleted, replaced or left without a selector; its EndpointSlices never
list two addresses ready, nor a member while it answered as a running replica (ground truth:
``GET /primary`` on every member every 0.1 s); a writer that writes through the address the
slice lists never has a write refused as read-only nor committed on a non-leader. Routing
then converges within a bound derived from the settings, after the later of the fault's end
and the promotion:

* ``ONE_SYNC`` = the wait for the next sync (the hook's healthy resync:
  ``PGFH_RESYNC_HEALTHY_SECONDS`` = 1 s, phase-spread to at most 1.5 periods, so 1.5 s) +
  one probe round (the hook's deadline, 2 s) + the endpointslice controller's hop (allowed
  1 s; it is tens of ms) = 4.5 s;
* ``AFTER_FAILURES``: after syncs FAILED, the next one waits for client-go's backoff (5 ms
  doubling per parent up to 1000 s and a 10/s bucket, in the stand-in as in Metacontroller,
  :mod:`testbed.metacontroller.ratelimit`) or the CompositeController's ``resyncPeriodSeconds``
  tick,
  which ``Add``s the parent past the rate limiter: the rig sets ``RESYNC_PERIOD`` = 15 s,
  so ``AFTER_FAILURES`` = 15 s + one probe round + the hop = 18 s;
* (a) ``AFTER_FAILURES`` + the reconnect of the watches after the API server is back: the
  stand-in's reflectors (:mod:`testbed.kubernetes.watch`) and kube-controller-manager's
  (client-go: 0.8 s doubling, jitter up to ×2, cap 30 s) retry within ``2·D + 1.6`` s of a
  downtime of ``D`` s (the interval in which the server came back is at most that long),
  ``D`` counted from the SIGTERM (the server stops listening at once, then lingers: it
  had not exited after 15 s, when it is killed) to ``/readyz``;
* (a) over the renew deadline, (b) and (d): the Lease's part of :mod:`tests.control_path_bounds`
  (a standby takes a lease whose holder stopped renewing at most 15 s + 2 x 4.4 s = 23.8 s
  later; a process started afterwards 19.4 s after its start), + ``STANDIN_START`` (the new
  leader's lists; it syncs every parent first) + ``ONE_SYNC``;
* (c) ``AFTER_FAILURES`` from the hook's return: the backoff alone would be up to about the
  outage's length again (tens of seconds after 60 s; minutes after 5 minutes:
  ``python -m testbed.bench.hooks_down``), the resync tick is at most a period away; a failure
  names the hop that did not happen (no call since the hook returned: backoff pending;
  calls refused; the Service not moved; the slice not updated) with the log;
* (d) ``ONE_SYNC``: the writes waiting on the API server complete once etcd answers
  (``CALL_TIMEOUT`` 30 s > 10 s), unless the pause cost the leader its Lease (a 10 s pause can:
  its renewals hang up to the 10 s renew deadline), then the takeover's bound from the pause's
  end;
* (e) ``ONE_SYNC`` after the promotion of the member behind the new IP.

The measured figures are printed (``FAULT …`` lines) and quoted in docs/troubleshooting.md.
The module's Patroni cluster is its own, on 127.0.0.32-34 (etcd 127.0.0.31), apart from the
session's on 127.0.0.2-4; still run it under ``flock /tmp/pgfh-realcluster.lock`` on a shared
machine (real clusters are heavy on two cores).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.podnet import pod_ip
from testbed.kubernetes.rest import KubeRest, resource_path
from testbed.metacontroller.harness import CLUSTER, SERVICE
from testbed.metacontroller.kube_rig import HOOK_ENV, KubeRig, member_pod
from testbed.metacontroller.leader_election import LEASE_NAME
from testbed.metacontroller.supervisor import Supervisor
from testbed.patroni import LeaderElection, PatroniCluster
from testbed.patroni.layout import API_PORT, PG_PORT
from tests import control_path_bounds as bounds
from tests.controlplane_fixtures import running_control_plane
from tests.kube_faults import (
    RestartableHook,
    TcpForwarder,
    Witnesses,
    check_run,
    rig_on,
    summary,
    wait_gone,
    wait_status,
    witnesses,
)
from tests.patroni_fixtures import RESTART_TIMEOUT, kept_healthy

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.kube, pytest.mark.slow]

#: The hook's healthy resync (hooks/model.py ``ResyncTiming.healthy``) phase-spread to at
#: most 1.5 periods (hooks/switchover.py ``spread_resync``), and its probe round deadline
#: (hooks/config.py ``probe_deadline``).
HEALTHY_RESYNC_MAX = 1.5 * 1.0
PROBE_DEADLINE = 2.0
#: The endpointslice controller's hop from the Service write to the slice (no batch period).
SLICE_HOP = 1.0
ONE_SYNC = HEALTHY_RESYNC_MAX + PROBE_DEADLINE + SLICE_HOP
#: The safety net the rig's CompositeController runs with here: ``resyncPeriodSeconds``
#: (metacontroller/compositecontroller.yaml ships a longer one, docs/scale.md; the tests
#: set a short one so that a 60 s outage shows it). Metacontroller ``Add``s every parent
#: on each tick, past the rate limiter, so after failed syncs the next one is at most a
#: period away, where client-go's backoff (5 ms doubling per parent up to 1000 s, the
#: stand-in's too) may be minutes away.
RESYNC_PERIOD = 15
RESYNC_SPEC = {"resyncPeriodSeconds": RESYNC_PERIOD}
#: The wait for routing after syncs failed: the next tick + one probe round + the hop.
AFTER_FAILURES = RESYNC_PERIOD + PROBE_DEADLINE + SLICE_HOP
#: client-go's reflector backoff (``NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0)``,
#: tools/cache/reflector.go v0.36.3): each step is jittered by up to 100 % (jitter 1.0,
#: ``wait.delay`` in apimachinery's backoff.go applies ``Jitter(duration, 1.0)`` to the capped
#: 30 s too), so one sleep of kube-controller-manager's watches can last up to 60 s. Seen on
#: the stand-in: the Service written 16.8 s after the server was back, the slice 27.5 s later;
#: and once past the 48 s this bound had with 30 s.
CLIENT_GO_BACKOFF_CAP = 30.0 * (1 + 1.0)
#: What the new stand-in may take to list everything it watches (a few lists, idle server).
STANDIN_START = 5.0
#: Metacontroller as deploy/metacontroller-values.yaml runs it: 2 replicas, one leader.
REPLICAS = 2
#: The long API server outage: held this long from the SIGTERM, then its start (> the renew
#: deadline: the leader exits).
APISERVER_LONG_DOWN = 30.0
#: The short one: the API server answering nothing this long (< the renew deadline).
APISERVER_SHORT_DOWN = 5.0
ETCD_PAUSE_SECONDS = 10.0
FIRST_IP, ETCD_HOST = 32, "127.0.0.31"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
#: The new Pod IP of test (e): 198.18.0.62 reaches 127.0.0.62, where a forwarder is the
#: member (no other test uses that address).
NEW_LOOPBACK = "127.0.0.62"


def _after_apiserver_back(downtime: float) -> float:
    return AFTER_FAILURES + min(2 * downtime + 1.6, CLIENT_GO_BACKOFF_CAP)


@pytest.fixture(scope="module")
def fault_members(request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    """A real Patroni cluster of the module's own, on 127.0.0.32-34 (etcd on 127.0.0.31):
    the faults stop and kill its leader, and no other test's cluster is near it."""
    cluster = PatroniCluster(first_ip=FIRST_IP, etcd_host=ETCD_HOST)
    cluster.start(timeout=RESTART_TIMEOUT)
    try:
        yield cluster
    finally:
        cluster.stop(keep_logs=request.session.testsfailed > 0)


@pytest.fixture
def fault_cluster(
    fault_members: PatroniCluster, request: pytest.FixtureRequest
) -> Iterator[PatroniCluster]:
    """That cluster healthy (every member up, one leader, the others streaming); repaired
    after the test, which fails if it left the cluster beyond repair."""
    yield from kept_healthy(fault_members, request)


@pytest.fixture(scope="module")
def fault_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableHook]:
    """The hook from the work tree (the faults are the control plane's; the image is the
    end-to-end test's), restartable at the same URL for (c)."""
    hook = RestartableHook(tmp_path_factory.mktemp("fault-hook"), HOOK_ENV)
    hook.start()
    try:
        yield hook
    finally:
        hook.stop()


@pytest.fixture
def rig(
    control_plane: ControlPlane,
    pod_network: None,
    kube_namespace: str,
    fault_cluster: PatroniCluster,
    fault_hook: RestartableHook,
    tmp_path: Path,
) -> Iterator[KubeRig]:
    """The rig on the session's control plane (for faults that leave it intact)."""
    with rig_on(
        control_plane,
        fault_cluster,
        kube_namespace,
        fault_hook.url,
        fault_hook.token,
        tmp_path,
        RESYNC_SPEC,
    ) as running:
        yield running


@pytest.fixture
def ha_rig(
    control_plane: ControlPlane,
    pod_network: None,
    kube_namespace: str,
    fault_cluster: PatroniCluster,
    fault_hook: RestartableHook,
    tmp_path: Path,
) -> Iterator[KubeRig]:
    """The rig with Metacontroller as deployed: 2 replicas, leader election, each restarted
    as the kubelet restarts a container (:mod:`testbed.metacontroller.supervisor`); the stand-in's
    or, with
    ``PGFH_METACONTROLLER_BINARY``, the binary's."""
    with rig_on(
        control_plane,
        fault_cluster,
        kube_namespace,
        fault_hook.url,
        fault_hook.token,
        tmp_path,
        replicas=REPLICAS,
    ) as running:
        yield running


@pytest.fixture
def own_plane(
    tmp_path_factory: pytest.TempPathFactory, pod_network: None
) -> Iterator[ControlPlane]:
    """A control plane of the test's own, for a fault that breaks it."""
    with running_control_plane(tmp_path_factory) as plane:
        yield plane


@contextlib.contextmanager
def _rig_on_own_plane(
    plane: ControlPlane,
    cluster: PatroniCluster,
    hook: RestartableHook,
    tmp_path: Path,
    **rig_options: Any,
) -> Iterator[KubeRig]:
    """:func:`tests.kube_faults.rig_on` in a new namespace of ``plane`` (a control plane
    the test breaks, so the module's shared one is left alone)."""
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    rest = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    try:
        rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    finally:
        rest.close()
    with rig_on(
        plane, cluster, namespace, hook.url, hook.token, tmp_path, **rig_options
    ) as running:
        yield running


@pytest.fixture
def own_rig(
    own_plane: ControlPlane,
    fault_cluster: PatroniCluster,
    fault_hook: RestartableHook,
    tmp_path: Path,
) -> Iterator[KubeRig]:
    with _rig_on_own_plane(
        own_plane, fault_cluster, fault_hook, tmp_path, controller_spec=RESYNC_SPEC
    ) as running:
        yield running


@pytest.fixture
def own_ha_rig(
    own_plane: ControlPlane,
    fault_cluster: PatroniCluster,
    fault_hook: RestartableHook,
    tmp_path: Path,
) -> Iterator[KubeRig]:
    """:func:`ha_rig` on a control plane of the test's own."""
    with _rig_on_own_plane(
        own_plane, fault_cluster, fault_hook, tmp_path, replicas=REPLICAS
    ) as running:
        yield running


def _report(
    request: pytest.FixtureRequest,
    fault: str,
    converged: float,
    bound: float,
    run: Witnesses,
    **extra: Any,
) -> None:
    figures = {
        "converged_s": round(converged, 3),
        "bound_s": round(bound, 3),
        **run.figures,
        **extra,
    }
    line = f"FAULT {fault}: {json.dumps(figures)}; {summary(run)}"
    print(f"\n{line}", flush=True)
    # user_properties, not the record_property fixture: that one warns (an error here) under
    # make test's junit file (xunit2 has no properties).
    request.node.user_properties.append((f"fault_{fault}", line))


@dataclass
class Failover:
    """The leader being failed over and, after the block, who Patroni elected."""

    old: str
    election: LeaderElection | None = None

    @property
    def new(self) -> LeaderElection:
        assert self.election is not None, "the block has not ended"
        return self.election


@contextlib.contextmanager
def failing_over(cluster: PatroniCluster, *, kill: bool = False) -> Iterator[Failover]:
    """The leader stopped (SIGTERM: it releases the lock) or SIGKILLed (the lock expires
    after the TTL) as the block starts; the fault is the block; Patroni's election is
    awaited after it (a watch started before the stop)."""
    leader = cluster.leader()
    assert leader is not None
    failover = Failover(leader)
    with cluster.watch_leader(exclude={leader}) as watch:
        if kill:
            cluster.kill_member(leader)
        else:
            cluster.stop_member_gracefully(leader, wait=False)
        yield failover
        failover.election = watch.result(timeout=90 if kill else 60)


def _converged(
    run: Witnesses, election: LeaderElection, back: float, bound: float, ip: str | None = None
) -> float:
    """Seconds from the later of the fault's end (``back``) and the promotion until the
    slice lists exactly the new leader's Pod IP (``ip``, else its first one; 0 if it did
    already); fails past ``bound``. Then a write through the Service must commit on the
    new leader within one more sync (the client's view: routing works again)."""
    rig = run.rig
    since = max(back, election.first_primary)
    deadline = bound - (time.monotonic() - since)
    what = f"the new leader {election.name}"
    address = ip or rig.leader_ip(election.name)
    try:
        moved = rig.slices.wait_ready((address,), max(deadline, 0.1), what)
    except TimeoutError as error:  # name the hop: no lease, exited, in back-off, or the slice
        raise TimeoutError(f"{error}; Metacontroller: {rig.describe_control_path()}") from None
    converged = max(0.0, moved - since)
    assert converged <= bound, f"{what}: routed {converged:.2f} s after the fault, bound {bound} s"
    pod = "statefulset.kubernetes.io/pod-name"
    written = [at for at, sel in rig.slices.selectors if sel.get(pod) == election.name]
    if written:  # the stand-in's hop (the Service) apart from the endpointslice controller's
        run.figures.setdefault("service_written_s", round(max(0.0, written[-1] - since), 3))
    committed = run.writer.first_commit_on(rig.cluster.member(election.name).ip, moved, ONE_SYNC)
    earlier = sum(1 for key in run.figures if key.startswith("first_write_s"))
    run.figures["first_write_s" + (f"_{earlier + 1}" if earlier else "")] = round(
        committed - since, 3
    )
    return converged


def test_apiserver_down_30_s_during_a_failover(
    own_ha_rig: KubeRig, own_plane: ControlPlane, request: pytest.FixtureRequest
) -> None:
    """Longer than the renew deadline: the leader exits ("leader election lost"), the
    supervisor restarts it at once (its communication check waits for the server), and a
    candidate takes the Lease a lease duration after it first sees the last record: at its
    first attempt after the server is back if the standby had seen the leader's last
    renewal before the outage, else 15-19.4 s later."""
    rig = own_ha_rig
    supervisor = _supervised(rig)
    with witnesses(rig) as run, LeaderWatch(supervisor) as leaders:
        first = leaders.wait_leader(30)
        with own_plane.apiserver_down() as outage, failing_over(rig.cluster) as failover:
            # Patroni elects; nothing can read or write the Service, nor renew the Lease
            time.sleep(max(0.0, outage.asked + APISERVER_LONG_DOWN - time.monotonic()))
        back = outage.ready
        refused = _forbidden(rig)  # before /readyz said ready (see _forbidden)
        # It stops listening at SIGTERM (its log: HTTPServerStoppedListening within 10 ms);
        # every client's backoff grows from then on.
        unreachable = outage.ready - outage.asked
        bound = bounds.apiserver_down(
            unreachable, _after_apiserver_back(unreachable), STANDIN_START, ONE_SYNC
        )
        converged = _converged(run, failover.new, back, bound)
    check_run(run)
    own_plane.check_alive()
    assert len(_forbidden(rig)) == len(refused), "403s after the restarted server was ready"
    _clear_forbidden(rig)  # the rig's own check: none otherwise
    exits = _exits(supervisor, outage.asked)
    assert exits, (
        f"no replica exited in {unreachable:.1f} s without the API server: Metacontroller "
        f"exits {bounds.EXIT_AFTER} s into it at the latest; {supervisor.describe()}"
    )
    _report(
        request,
        "apiserver-down-30s",
        converged,
        bound,
        run,
        apiserver_exit_after_sigterm_s=round(outage.exited - outage.asked, 2),
        apiserver_unreachable_s=round(unreachable, 2),
        apiserver_start_to_ready_s=round(outage.ready - outage.starting, 2),
        promoted_before_ready_s=round(back - failover.new.first_primary, 2),
        refused_403_before_ready=len(refused),
        leader_exited_after_s=round(exits[0] - outage.asked, 2),
        new_leader_after_back_s=leaders.first_change_after(back, first),
        hops=_hops(supervisor, outage.asked),
    )


def test_apiserver_hung_for_5_s_during_a_failover(
    own_ha_rig: KubeRig, own_plane: ControlPlane, request: pytest.FixtureRequest
) -> None:
    """kube-apiserver answering nothing for 5 s (SIGSTOP: a restart cannot be that short,
    its own start takes 5-8 s here) while Patroni elects: shorter than the renew deadline,
    so the leader keeps the Lease and nobody exits; one sync once it answers again."""
    rig = own_ha_rig
    supervisor = _supervised(rig)
    with witnesses(rig) as run, LeaderWatch(supervisor) as leaders:
        first = leaders.wait_leader(30)
        with failing_over(rig.cluster) as failover, _paused(own_plane) as paused:
            time.sleep(max(0.0, paused + APISERVER_SHORT_DOWN - time.monotonic()))
        back = time.monotonic()
        hung = back - paused
        bound = bounds.paused_for(hung, STANDIN_START, ONE_SYNC)
        converged = _converged(run, failover.new, back, bound)
    check_run(run)
    own_plane.check_alive()
    assert _exits(supervisor, paused) == [], supervisor.describe()
    assert leaders.names_since(paused) == [first], f"the Lease changed hands: {leaders.changes}"
    _report(
        request,
        "apiserver-hung-5s",
        converged,
        bound,
        run,
        apiserver_hung_s=round(hung, 2),
        promoted_after_pause_s=round(failover.new.first_primary - paused, 2),
    )


@contextlib.contextmanager
def _paused(plane: ControlPlane, limit: float = 30.0) -> Iterator[float]:
    """kube-apiserver SIGSTOPped for the block (resumed however it ends, and by a timer
    after ``limit`` s at the latest); yields when it was stopped."""
    server = plane.apiserver
    timer = threading.Timer(limit, server.resume)
    timer.daemon = True
    started = time.monotonic()
    server.pause()
    timer.start()
    try:
        yield started
    finally:
        timer.cancel()
        server.resume()


def _forbidden(rig: KubeRig) -> list[str]:
    """The calls of Metacontroller's account the server refused (403) so far. A restarted
    kube-apiserver serves before ``/readyz`` says ready, and its RBAC authorizer refuses
    until its informers have synced: the stand-in, retrying every second, meets that
    (docs/troubleshooting.md, section 5); each such call is retried and allowed."""
    return rig.forbidden()


def _clear_forbidden(rig: KubeRig) -> None:
    for controller in [rig.controller, *rig.supervised]:
        if controller is not None:
            controller.rest.forbidden.clear()
    for rest in rig.supervised_rests:
        rest.forbidden.clear()


def _supervised(rig: KubeRig) -> Supervisor:
    assert rig.supervisor is not None, "the rig runs no supervised replicas"
    return rig.supervisor


def _exits(supervisor: Supervisor, since: float) -> list[float]:
    """When a replica exited on its own (not stopped by the test) since ``since``."""
    return [at for at, _, what in supervisor.events if at >= since and " exited with " in what]


def _hops(supervisor: Supervisor, since: float) -> list[str]:
    """The supervisor's hops since ``since`` (seconds from it), for the report."""
    return [f"+{at - since:.1f} s r{r}: {what}" for at, r, what in supervisor.events if at >= since]


def _lease(rig: KubeRig) -> dict[str, Any]:
    path = resource_path("coordination.k8s.io/v1", "leases", rig.namespace, LEASE_NAME)
    return dict(rig.rest.get(path)["spec"])


class LeaderWatch:
    """Which replica leads, sampled every 0.1 s: ``(monotonic time, container or None)`` at
    every change, so a test can say when the Lease changed hands."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.changes: list[tuple[float, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watch", daemon=True)

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def current(self) -> str | None:
        supervisor = self.supervisor
        index = supervisor.leader()
        return None if index is None else supervisor.containers[index].name

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            name = self.current()
            if not self.changes or self.changes[-1][1] != name:
                self.changes.append((time.monotonic(), name))

    def wait_leader(self, timeout: float) -> str:
        index = self.supervisor.wait_leader(timeout)
        return self.supervisor.containers[index].name

    def names_since(self, since: float) -> list[str | None]:
        names = [name for at, name in self.changes if at >= since]
        earlier = [name for at, name in self.changes if at < since]
        return [*earlier[-1:], *names]

    def first_change_after(self, since: float, old: str) -> float | None:
        """Seconds from ``since`` until a replica other than ``old`` led (``None``: never;
        negative: before ``since``)."""
        for at, name in self.changes:
            if name is not None and name != old:
                return round(at - since, 2)
        return None


def test_metacontroller_restarted_around_a_failover(
    ha_rig: KubeRig, request: pytest.FixtureRequest
) -> None:
    """Every replica stopped (SIGTERM: none releases the Lease, controller-runtime's
    ``LeaderElectionReleaseOnCancel`` is false in Metacontroller), the leader failed over,
    every replica started again: the new processes wait out the Lease from their first look
    at it."""
    rig = ha_rig
    supervisor = _supervised(rig)
    supervisor.wait_leader(30)
    with witnesses(rig) as run:
        held = _lease(rig)
        rig.stop_controller()
        after = _lease(rig)
        assert after["holderIdentity"] == held["holderIdentity"] != "", (
            f"a stopped Metacontroller released its Lease: {held} -> {after}"
        )
        assert after["leaseDurationSeconds"] == held["leaseDurationSeconds"] == 15
        with failing_over(rig.cluster) as failover:
            pass  # nothing syncs meanwhile
        back = time.monotonic()
        rig.start_controller()
        bound = bounds.all_restarted(STANDIN_START, ONE_SYNC)
        with LeaderWatch(_supervised(rig)) as leaders:
            converged = _converged(run, failover.new, back, bound)
    check_run(run)
    _report(
        request,
        "metacontroller-restart",
        converged,
        bound,
        run,
        leader_after_start_s=leaders.first_change_after(back, ""),
    )


def test_metacontroller_leader_killed_during_a_failover(
    ha_rig: KubeRig, request: pytest.FixtureRequest
) -> None:
    """The leading replica SIGKILLed (the kubelet restarts it at once, a new identity), the
    Patroni leader stopped right after: the standby takes the Lease once it expires."""
    rig = ha_rig
    supervisor = _supervised(rig)
    with witnesses(rig) as run, LeaderWatch(supervisor) as leaders:
        first = leaders.wait_leader(30)
        index = supervisor.leader()
        assert index is not None
        supervisor.kill(index)
        killed = time.monotonic()
        with failing_over(rig.cluster) as failover:
            pass
        bound = bounds.leader_killed(STANDIN_START, ONE_SYNC)
        converged = _converged(run, failover.new, killed, bound)
    check_run(run)
    took = leaders.first_change_after(killed, first)
    assert took is not None and took >= 0, leaders.changes
    _report(
        request,
        "metacontroller-leader-killed",
        converged,
        bound,
        run,
        new_leader_after_kill_s=took,
        promoted_after_kill_s=round(failover.new.first_primary - killed, 2),
    )


def test_metacontroller_rolling_update_during_a_failover(
    ha_rig: KubeRig, request: pytest.FixtureRequest
) -> None:
    """The chart's StatefulSet rolled: each Pod deleted and made again in turn, highest
    ordinal first, the next once the new one is ready (``/readyz``, which answers before it
    leads), while the Patroni leader stops."""
    rig = ha_rig
    supervisor = _supervised(rig)
    with witnesses(rig) as run, LeaderWatch(supervisor) as leaders:
        first = leaders.wait_leader(30)
        started = time.monotonic()
        with failing_over(rig.cluster) as failover:
            for replica in reversed(range(REPLICAS)):
                supervisor.replace(replica, ready=lambda c: c.ready(), timeout=60)
        end = time.monotonic()
        bound = bounds.rolling_update(STANDIN_START, ONE_SYNC)
        converged = _converged(run, failover.new, end, bound)
    check_run(run)
    _report(
        request,
        "metacontroller-rolling-update",
        converged,
        bound,
        run,
        rollout_s=round(end - started, 2),
        new_leader_after_rollout_s=leaders.first_change_after(end, first),
        promoted_after_rollout_start_s=round(failover.new.first_primary - started, 2),
    )


def _hook_calls(hook: RestartableHook) -> list[str]:
    """The sync calls the (restarted) hook's access log shows: every one since it returned."""
    assert hook.hook is not None
    return [line for line in hook.hook.log_lines() if '"POST /sync' in line]


def _failing_hop(run: Witnesses, hook: RestartableHook, election: LeaderElection) -> str:
    """Which hop did not happen after the hook returned, with the log that shows it."""
    rig = run.rig
    calls = _hook_calls(hook)
    pod = "statefulset.kubernetes.io/pod-name"
    selected = rig.slices.selectors[-1][1].get(pod) if rig.slices.selectors else None
    if rig.binary is not None:
        log = "\n".join(rig.binary.log_path.read_text(errors="replace").splitlines()[-25:])
    elif rig.controller is not None:
        key = f"{rig.namespace}/{CLUSTER}"
        queue = rig.controller.queue
        log = (
            f"stand-in queue: {key} waits {queue.waiting(key)} s more, "
            f"{queue.num_requeues(key)} failures counted; resync ticks at "
            f"{[round(t, 1) for t in rig.controller.resyncs[-3:]]}; last calls: "
            f"{[(round(r.started, 1), r.http_status, r.error) for r in rig.records[-5:]]}"
        )
    else:
        log = "no Metacontroller"
    if not calls:
        hop = "backoff pending: no sync call reached the hook since it returned"
    elif not any('" 200 ' in line for line in calls):
        hop = f"hook refused: {len(calls)} call(s) since it returned, none answered 200"
    elif selected != election.name:
        hop = f"Service not moved: it selects {selected} after {len(calls)} call(s)"
    else:
        hop = "slice not updated: the Service selects the new leader, its slice does not list it"
    return f"{hop}\n{log}\nhook log (last 5): " + "\n".join(calls[-5:])


def _every_hook_pod_down(
    rig: KubeRig,
    hook: RestartableHook,
    request: pytest.FixtureRequest,
    seconds: float,
    *,
    kill: bool,
) -> None:
    """Every hook pod down for ``seconds`` while Patroni fails over inside the outage; the
    slice must list the new leader within ``AFTER_FAILURES`` of the hook's return."""
    with witnesses(rig) as run:
        down = time.monotonic()
        hook.stop()
        try:
            with failing_over(rig.cluster, kill=kill) as failover:
                pass  # every sync the Pods' events trigger fails: connection refused
            time.sleep(max(0.0, down + seconds - time.monotonic()))
        finally:
            hook.start()
        back = time.monotonic()
        election = failover.new
        assert election.first_primary < back, "Patroni elected after the outage: nothing tested"
        if rig.controller is not None:
            failed = sum(1 for r in rig.records if r.error and r.started >= down)
            assert failed > 0, "no sync was attempted while the hook was down: nothing tested"
        bound = AFTER_FAILURES
        try:
            converged = _converged(run, election, back, bound)
        except (TimeoutError, AssertionError) as error:
            raise AssertionError(f"{error}\n{_failing_hop(run, hook, election)}") from None
    check_run(run)
    _report(
        request,
        f"hook-down-{seconds:g}s",
        converged,
        bound,
        run,
        hook_down_s=round(back - down, 2),
        promoted_after_down_s=round(election.first_primary - down, 2),
        hook_calls_until_routed=len(_hook_calls(hook)),
        resync_period_s=RESYNC_PERIOD,
    )


def test_every_hook_pod_down_for_10_s_during_a_failover(
    rig: KubeRig, fault_hook: RestartableHook, request: pytest.FixtureRequest
) -> None:
    """The leader stopped (it releases the lock: Patroni elects within the 10 s; a kill would
    be elected after Patroni's 20 s TTL, past the outage)."""
    _every_hook_pod_down(rig, fault_hook, request, 10.0, kill=False)


def test_every_hook_pod_down_for_60_s_during_a_kill(
    rig: KubeRig, fault_hook: RestartableHook, request: pytest.FixtureRequest
) -> None:
    """The leader SIGKILLed: Patroni elects after its 20 s TTL, inside the outage; by the
    hook's return client-go's backoff for the parent is tens of seconds."""
    _every_hook_pod_down(rig, fault_hook, request, 60.0, kill=True)


def test_etcd_of_kubernetes_paused_for_10_s_during_a_failover(
    own_ha_rig: KubeRig, own_plane: ControlPlane, request: pytest.FixtureRequest
) -> None:
    rig = own_ha_rig
    supervisor = _supervised(rig)
    with witnesses(rig) as run, LeaderWatch(supervisor) as leaders:
        first = leaders.wait_leader(30)
        with own_plane.etcd_paused(limit=3 * ETCD_PAUSE_SECONDS) as paused:
            with failing_over(rig.cluster) as failover:
                pass  # Patroni (its own etcd) elects; the API server cannot store anything
            time.sleep(max(0.0, paused + ETCD_PAUSE_SECONDS - time.monotonic()))
        back = time.monotonic()
        bound = bounds.paused_for(back - paused, STANDIN_START, ONE_SYNC)
        converged = _converged(run, failover.new, back, bound)
    check_run(run)
    own_plane.check_alive()
    _report(
        request,
        "etcd-paused-10s",
        converged,
        bound,
        run,
        etcd_paused_s=round(back - paused, 2),
        promoted_during_pause_s=round(failover.new.first_primary - paused, 2),
        replica_exits=len(_exits(supervisor, paused)),
        new_leader_after_pause_s=leaders.first_change_after(back, first),
    )


def test_a_pod_deleted_and_recreated_with_a_new_ip(
    rig: KubeRig, request: pytest.FixtureRequest
) -> None:
    cluster, rest, namespace = rig.cluster, rig.rest, rig.namespace
    old = cluster.leader()
    assert old is not None
    old_ip, new_ip = rig.leader_ip(old), pod_ip(NEW_LOOPBACK)
    pod_path = resource_path("v1", "pods", namespace, old)
    uid = rest.get(pod_path)["metadata"]["uid"]
    member = cluster.member(old)

    def stop_container(pod: dict[str, Any]) -> None:  # the kubelet's SIGTERM to the container
        if pod["metadata"]["uid"] == uid:
            cluster.stop_member_gracefully(old)

    assert rig.kubelet is not None
    rig.kubelet.on_terminate = stop_container
    with TcpForwarder(NEW_LOOPBACK, member.ip, (API_PORT, PG_PORT)), witnesses(rig) as run:
        run.members_by_ip[new_ip] = old
        with cluster.watch_leader(exclude={old}) as watch:
            rest.delete(pod_path)
            election = watch.result(timeout=60)
        wait_gone(rest, pod_path, 40, f"the Pod {old}")
        gone = time.monotonic()
        first = _converged(run, election, election.first_primary, ONE_SYNC)

        # The StatefulSet controller's part: the Pod again, the CNI's part: a new address.
        rest.create(
            resource_path("v1", "pods", namespace), member_pod(old, NEW_LOOPBACK, namespace)
        )
        cluster.start_member(old)  # rejoins as a replica, behind the new Pod IP
        # The old member leads again, reached through its new IP only: the other replica
        # and then the leader stopped, so it is the one member left to promote.
        other = next(n for n in cluster.names() if n not in (old, election.name))
        cluster.stop_member_gracefully(other)
        with cluster.watch_leader(exclude={election.name, other}) as watch:
            cluster.stop_member_gracefully(election.name, wait=False)
            again = watch.result(timeout=60)
        assert again.name == old
        second = _converged(run, again, again.first_primary, ONE_SYNC, new_ip)
    check_run(run)
    history = rig.slices.history
    stale = [
        (at, ready)
        for index, (at, ready) in enumerate(history)
        if old_ip in ready
        and (at > gone or index + 1 == len(history) or history[index + 1][0] > gone)
    ]
    assert stale == [], f"the deleted Pod's IP {old_ip} was listed after it was gone: {stale}"
    _report(
        request,
        "pod-recreated-new-ip",
        max(first, second),
        ONE_SYNC,
        run,
        after_delete_s=round(first, 3),
        via_new_ip_s=round(second, 3),
    )


def test_a_stale_role_label_by_hand_never_moves_the_service(rig: KubeRig) -> None:
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    rig.slices.wait_ready((rig.leader_ip(leader),), 30, f"the leader {leader}")
    replica = next(n for n in cluster.names() if n != leader)
    stale = {"role": "primary", "state": "running", "conn_url": f"postgres://{replica}:5432"}
    rig.rest.merge_patch(
        resource_path("v1", "pods", rig.namespace, replica),
        {
            "metadata": {
                "labels": {"role": "primary"},
                "annotations": {"status": json.dumps(stale)},
            }
        },
    )

    def said(status: Mapping[str, Any]) -> bool:
        for condition in status.get("conditions") or []:
            if condition.get("type") == "SwitchoverDetection":
                return bool(
                    condition.get("reason") == "RoleLabelDisagrees"
                    and replica in condition.get("message", "")
                )
        return False

    parent = wait_status(rig, said, 30)
    assert parent["status"]["primary"] == leader
    time.sleep(3 * HEALTHY_RESYNC_MAX)  # a few more syncs with the label in place
    assert rig.slices.ready() == (rig.leader_ip(leader),)
    selected = {sel.get("statefulset.kubernetes.io/pod-name") for _, sel in rig.slices.selectors}
    assert selected == {leader}, rig.slices.selectors
    assert rig.slices.service_deleted == []
    service = rig.rest.get(resource_path("v1", "services", rig.namespace, SERVICE))
    assert service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == leader


#: The impostor Pods' IPs (198.18.0.63 and .64; nothing listens at 127.0.0.63 and .64, and
#: no other test uses these addresses).
IMPOSTOR_LOOPBACKS = ("127.0.0.63", "127.0.0.64")


def test_a_copy_of_a_members_pod_never_gets_the_primary_slice(
    rig: KubeRig, request: pytest.FixtureRequest
) -> None:
    """A Pod that copies a member's labels (``kubectl debug --copy-to … --keep-labels``),
    created on the real API server, for each replica: Ready at once (no readiness probe,
    as such a copy often has), so the endpointslice controller lists it as soon as a
    selector matches it; no fake Patroni behind it (nothing answers at its address). The
    leader stops; whichever replica Patroni elects, a copy carries its pod-name label, so
    the hook must not move the Service: the slice never lists two addresses (nor the
    copy's), the status names the copy. Deleting that copy lets the Service move to the
    new leader within one sync."""
    cluster, rest, namespace = rig.cluster, rig.rest, rig.namespace
    old = cluster.leader()
    assert old is not None
    replicas = [n for n in cluster.names() if n != old]
    copies = {name: f"{name}-debug" for name in replicas}
    copy_ips = {pod_ip(loopback) for loopback in IMPOSTOR_LOOPBACKS}
    with contextlib.ExitStack() as stack:
        stack.callback(_delete_pods, rest, namespace, list(copies.values()))
        run = stack.enter_context(witnesses(rig))
        for (name, copy_name), loopback in zip(copies.items(), IMPOSTOR_LOOPBACKS, strict=True):
            pod = member_pod(copy_name, loopback, namespace)
            pod["metadata"]["labels"][POD_NAME_LABEL] = name  # the copied label
            del pod["spec"]["containers"][0]["readinessProbe"]  # Ready once running
            rest.create(resource_path("v1", "pods", namespace), pod)
        with cluster.watch_leader(exclude={old}) as watch:
            cluster.stop_member_gracefully(old, wait=False)
            election = watch.result(timeout=60)
        new = election.name
        impostor = copies[new]

        def refused(status: Mapping[str, Any]) -> bool:
            return any(
                c.get("type") == "PrimaryRouted"
                and c.get("reason") == "SelectorNotUnique"
                and impostor in c.get("message", "")
                for c in status.get("conditions") or []
            )

        wait_status(rig, refused, ONE_SYNC + 5)
        time.sleep(3 * HEALTHY_RESYNC_MAX)  # more syncs with the copy in place
        moved = [sel for _, sel in rig.slices.selectors if sel.get(POD_NAME_LABEL) == new]
        assert moved == [], f"the Service selected {new} while {impostor} existed: {moved}"
        deleted = time.monotonic()
        rest.delete(resource_path("v1", "pods", namespace, impostor))
        converged = _converged(run, election, deleted, ONE_SYNC + SLICE_HOP)
    check_run(run)
    listed = [(at, ready) for at, ready in rig.slices.history if copy_ips & set(ready)]
    assert listed == [], f"a copy's address was listed: {listed}"
    assert rig.slices.most_ready_at_once() <= 1, rig.slices.history
    _report(request, "impostor-pod", converged, ONE_SYNC + SLICE_HOP, run, leader=new)


def _delete_pods(rest: KubeRest, namespace: str, names: list[str]) -> None:
    """Whatever is left of the test's Pods (the namespace is the session's)."""
    for name in names:
        with contextlib.suppress(Exception):
            rest.delete(resource_path("v1", "pods", namespace, name))
    for name in names:
        wait_gone(rest, resource_path("v1", "pods", namespace, name), 40, f"the Pod {name}")
