"""What the control-plane fault tests (``tests/test_kube_faults.py``) watch, and what they
hold it to; shared with the end-to-end test of the real control plane where it applies.

The tests break the control plane under a running rig (:mod:`testbed.metacontroller.kube_rig`) and
must
show what a client of the primary Service would have lived through, so three witnesses run
over the whole test, started before the fault:

* :class:`SliceWatch` (the rig's): the Service and its EndpointSlices from watches: the
  Service's selector at every change, every DELETED, the ready addresses at every change;
* :class:`GroundTruth`: ``GET /primary`` on every member's REST API every 0.1 s, straight
  to the member (not through any Pod IP): who Patroni says is the leader, when;
* :class:`Writer`: a client writing through whatever single address the slice lists ready
  now (a new connection per write, as a client that reconnects after an error would), ten
  times a second; a replica refuses a write (``read-only transaction``), so every refusal
  and every commit on a member that was not the leader is counted.

:func:`check_run` then asserts what must hold whatever the fault: the Service never deleted
(nor replaced: same UID at the end as at the start), its selector never emptied, never two
addresses ready at once, never a ready address whose member answered as a running replica
while it was listed, no write refused as read-only and none committed on a non-leader.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.kubernetes import ControlPlane
from testbed.kubernetes.accounts import metacontroller_kubeconfig
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook
from testbed.metacontroller.harness import SERVICE
from testbed.metacontroller.kube_rig import KubeRig, SliceWatch, kube_rig
from testbed.patroni import PatroniCluster

#: How often the ground truth asks every member, and how long one answer may take.
TRUTH_INTERVAL = 0.1
TRUTH_TIMEOUT = 0.5
#: How often the writer writes, and the bounds of one write (libpq's connect_timeout is
#: whole seconds, at least 2).
WRITE_INTERVAL = 0.1
WRITE_CONNECT_TIMEOUT = 2
WRITE_STATEMENT_TIMEOUT_MS = 1000
WRITES_TABLE = "pgfh_fault_writes"
#: How far apart a commit and a ground-truth sample saying its member led may be: one
#: sampling interval plus one answer's timeout, either side.
LEADER_TOLERANCE = TRUTH_INTERVAL + TRUTH_TIMEOUT
#: Patroni's states of a member that accepts connections as a replica (read-only).
REPLICA_STATES = frozenset({"running", "streaming"})


@dataclass(frozen=True)
class Sample:
    """One answer of a member to ``GET /primary`` (``code`` ``None``: no answer)."""

    at: float
    member: str
    code: int | None
    role: str | None = None
    state: str | None = None

    @property
    def leader(self) -> bool:
        return self.code == 200

    @property
    def live_replica(self) -> bool:
        """Up and serving as a replica: a client sent there gets ``read-only`` refusals."""
        return self.code == 503 and self.role == "replica" and self.state in REPLICA_STATES


@dataclass
class GroundTruth:
    """Every member's ``GET /primary`` every :data:`TRUTH_INTERVAL`, one thread per member
    (a member that hangs cannot delay the others), until :meth:`stop`."""

    cluster: PatroniCluster
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> GroundTruth:
        for member in self.cluster.members:
            self.samples[member.name] = []
            thread = threading.Thread(
                target=self._run, args=(member.name,), name=f"truth-{member.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=TRUTH_TIMEOUT + 2)

    def _run(self, name: str) -> None:
        member = self.cluster.member(name)
        while not self._stop.is_set():
            try:
                response = member.api_get("/primary", timeout=TRUTH_TIMEOUT)
                body = response.json() if response.status in (200, 503) else {}
                sample = Sample(
                    time.monotonic(), name, response.status, body.get("role"), body.get("state")
                )
            except Exception:  # refused, timed out, reset: no answer
                sample = Sample(time.monotonic(), name, None)
            with self._lock:
                self.samples[name].append(sample)
            self._stop.wait(TRUTH_INTERVAL)

    def of(self, name: str, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples.get(name, ()) if start <= s.at <= end]

    def led_near(self, name: str, at: float, tolerance: float = LEADER_TOLERANCE) -> bool:
        return any(s.leader for s in self.of(name, at - tolerance, at + tolerance))


@dataclass(frozen=True)
class Write:
    """One write through the Service's ready address: ``outcome`` is ``committed``,
    ``read-only`` (a replica refused it), ``no-endpoint`` (nothing or more than one address
    ready: not attempted) or ``failed`` (refused connection, shutting down, timed out)."""

    at: float
    address: str | None
    outcome: str
    server: str | None = None
    message: str = ""


@dataclass
class Writer:
    """Writes through the address the primary slice lists ready, until :meth:`stop`."""

    slices: SliceWatch
    password: str
    writes: list[Write] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Writer:
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WRITE_CONNECT_TIMEOUT + 5)

    def _run(self) -> None:
        psycopg2: Any = importlib.import_module("psycopg2")  # untyped, as testbed.patroni.sql
        while not self._stop.is_set():
            ready = self.slices.ready()
            if len(ready) != 1:
                self.writes.append(Write(time.monotonic(), None, "no-endpoint"))
            else:
                self.writes.append(self._write(psycopg2, ready[0]))
            self._stop.wait(WRITE_INTERVAL)

    def _write(self, psycopg2: Any, address: str) -> Write:
        try:
            conn = psycopg2.connect(
                host=address,
                port=5432,
                dbname="postgres",
                user="postgres",
                password=self.password,
                connect_timeout=WRITE_CONNECT_TIMEOUT,
                application_name="pgfh-fault-writer",
                options=f"-c statement_timeout={WRITE_STATEMENT_TIMEOUT_MS}",
            )
        except psycopg2.Error as error:
            return Write(time.monotonic(), address, "failed", message=str(error).strip()[:200])
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(
                    f"INSERT INTO {WRITES_TABLE} DEFAULT VALUES RETURNING host(inet_server_addr())"
                )
                (server,) = cur.fetchone()
            return Write(time.monotonic(), address, "committed", str(server))
        except psycopg2.Error as error:
            text = str(error).strip()
            outcome = "read-only" if "read-only transaction" in text else "failed"
            return Write(time.monotonic(), address, outcome, message=text[:200])
        finally:
            conn.close()

    def first_commit_on(self, server: str, after: float, timeout: float) -> float:
        """When a write through the Service first committed on ``server`` (a member's
        address) after ``after``; waits up to ``timeout`` for one."""
        deadline = time.monotonic() + timeout
        while True:
            for write in list(self.writes):
                if write.at > after and write.outcome == "committed" and write.server == server:
                    return write.at
            if time.monotonic() > deadline:
                raise AssertionError(f"no write committed on {server} within {timeout} s")
            time.sleep(WRITE_INTERVAL / 2)

    def count(self, outcome: str) -> int:
        return sum(1 for w in self.writes if w.outcome == outcome)


def create_writes_table(cluster: PatroniCluster) -> None:
    leader = cluster.leader()
    assert leader is not None
    cluster.execute(leader, f"CREATE TABLE IF NOT EXISTS {WRITES_TABLE} (id bigserial)")


@dataclass
class Witnesses:
    """The three witnesses of one run and where each Pod IP leads (a member's name)."""

    rig: KubeRig
    truth: GroundTruth
    writer: Writer
    members_by_ip: dict[str, str]
    service_uid: str
    started: float
    #: What the test measured, for its report.
    figures: dict[str, float] = field(default_factory=dict)

    def stop(self) -> None:
        self.writer.stop()
        self.truth.stop()


@contextlib.contextmanager
def witnesses(rig: KubeRig) -> Iterator[Witnesses]:
    """Start the ground truth and the writer (the rig's slice watch runs already), once the
    slice lists the leader; stopped on exit."""
    cluster = rig.cluster
    leader = cluster.leader()
    assert leader is not None
    rig.slices.wait_ready((rig.leader_ip(leader),), 30, f"the leader {leader}")
    create_writes_table(cluster)
    service = rig.rest.get(resource_path("v1", "services", rig.namespace, SERVICE))
    running = Witnesses(
        rig,
        GroundTruth(cluster).start(),
        Writer(rig.slices, cluster.superuser_password).start(),
        {rig.leader_ip(m.name): m.name for m in cluster.members},
        str(service["metadata"]["uid"]),
        time.monotonic(),
    )
    try:
        yield running
    finally:
        running.stop()


def check_run(run: Witnesses) -> None:
    """What must hold over the whole run, whatever the fault (see the module docstring)."""
    rig, truth, writer = run.rig, run.truth, run.writer
    slices = rig.slices
    assert slices.service_deleted == [], f"the Service was deleted at {slices.service_deleted}"
    service = rig.rest.get(resource_path("v1", "services", rig.namespace, SERVICE))
    assert service["metadata"]["uid"] == run.service_uid, "the Service was replaced"
    emptied = [(at, sel) for at, sel in slices.selectors if not sel]
    assert emptied == [], f"the Service's selector was emptied: {emptied}"
    assert slices.most_ready_at_once() <= 1, slices.history
    history = [(at, ready) for at, ready in slices.history]
    listed_replicas: list[str] = []
    for index, (at, ready) in enumerate(history):
        until = history[index + 1][0] if index + 1 < len(history) else time.monotonic()
        start = max(at, run.started)
        if until < start:
            continue
        for address in ready:
            name = run.members_by_ip.get(address)
            assert name is not None, f"the slice listed {address}, which is no member's Pod IP"
            for sample in truth.of(name, start, until):
                if sample.live_replica:
                    listed_replicas.append(
                        f"{address} ({name}) listed ready at +{sample.at - run.started:.2f} s "
                        f"while it answered role={sample.role} state={sample.state}"
                    )
    assert listed_replicas == [], listed_replicas[:5]
    read_only = [w for w in writer.writes if w.outcome == "read-only"]
    assert read_only == [], f"{len(read_only)} writes refused as read-only: {read_only[:3]}"
    misplaced = []
    for write in writer.writes:
        if write.outcome != "committed" or write.server is None:
            continue
        name = rig.cluster.member(write.server).name
        if not truth.led_near(name, write.at):
            misplaced.append(write)
    assert misplaced == [], f"{len(misplaced)} writes committed on a non-leader: {misplaced[:3]}"
    assert writer.count("committed") > 0, "the writer never committed: it tested nothing"


def summary(run: Witnesses) -> str:
    """The run's counts, for the test's output (and the docs' figures)."""
    writer = run.writer
    counts = ", ".join(
        f"{outcome} {writer.count(outcome)}"
        for outcome in ("committed", "read-only", "failed", "no-endpoint")
    )
    failures = sorted(
        {w.message.split(":")[-1].strip()[:60] for w in writer.writes if w.outcome == "failed"}
    )
    return f"writes: {counts} ({'; '.join(failures)}); slice changes {len(run.rig.slices.history)}"


@contextlib.contextmanager
def rig_on(
    plane: ControlPlane,
    cluster: PatroniCluster,
    namespace: str,
    hook_url: str,
    token: str | None,
    work_dir: Path,
    controller_spec: Mapping[str, Any] | None = None,
    replicas: int | None = None,
    parent_labels: Mapping[str, str] | None = None,
) -> Iterator[KubeRig]:
    """The rig of the end-to-end tests on ``plane``: Metacontroller (stand-in or binary) as
    its own least-privilege ServiceAccount (``replicas``: that many, with leader election,
    under the supervisor); on exit, not one of its calls may have been refused (403).
    ``controller_spec``: the CompositeController's spec fields the test sets
    (:func:`testbed.metacontroller.kube_rig.kube_rig`)."""
    with kube_rig(
        cluster,
        plane.admin_kubeconfig,
        namespace,
        hook_url,
        token,
        work_dir=work_dir,
        controller_kubeconfig=metacontroller_kubeconfig(plane),
        controller_spec=controller_spec,
        replicas=replicas,
        parent_labels=parent_labels,
    ) as running:
        yield running
        assert running.forbidden() == []


def wait_status(
    rig: KubeRig, predicate: Callable[[Mapping[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    """The PostgreSQLCluster once its status satisfies ``predicate`` (polled, bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        parent = rig.parent()
        if parent is not None and predicate(parent.get("status") or {}):
            return parent
        if time.monotonic() > deadline:
            raise AssertionError(f"status not reached in {timeout} s: {parent}")
        time.sleep(0.1)


def wait_gone(rest: KubeRest, path: str, timeout: float, what: str) -> None:
    """Wait until the list at ``path`` is empty, or the object at ``path`` is gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = rest.get(path)
        except KubeApiError as error:
            if error.status == 404:
                return
            raise
        items = found.get("items") if "items" in found else [found]
        if not items:
            return
        if time.monotonic() > deadline:
            names = [i["metadata"]["name"] for i in items]
            raise AssertionError(f"{what} still there after {timeout} s: {names}")
        time.sleep(0.2)


class TcpForwarder:
    """What a recreated Pod's new IP reaches: every port of ``listen`` forwarded to the same
    port of ``target`` (the member's own address). The kubelet stand-in gives a Pod the IP
    of its annotation, and ``198.18.0.N`` reaches ``127.0.0.N``; a member keeps its
    address, so the new Pod IP needs something listening there that is the member.

    A thread per connection direction, each socket bounded by ``idle`` seconds of silence;
    :meth:`stop` closes the listeners and every open connection."""

    def __init__(self, listen: str, target: str, ports: tuple[int, ...], idle: float = 60.0):
        self.listen, self.target, self.ports, self.idle = listen, target, ports, idle
        self._listeners: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __enter__(self) -> TcpForwarder:
        for port in self.ports:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.listen, port))
            listener.listen(64)
            listener.settimeout(0.5)
            self._listeners.append(listener)
            threading.Thread(
                target=self._accept, args=(listener, port), name=f"fwd-{port}", daemon=True
            ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            sockets = [*self._listeners, *self._open]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self, listener: socket.socket, port: int) -> None:
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection((self.target, port), timeout=2)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(self.idle)
            with self._lock:
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            with contextlib.suppress(OSError):
                src.close()


class RestartableHook:
    """The hook under gunicorn that can go away and come back at the same URL with the same
    token, as every pod of the hook's Deployment gone and back behind its Service
    (:func:`testbed.metacontroller.gunicorn.gunicorn_hook` with ``port`` and ``token``)."""

    def __init__(self, work_dir: Path, env: Mapping[str, str]) -> None:
        self.work_dir = work_dir
        self.env = dict(env)
        self.port: int | None = None
        self.token: str | None = None
        self.starts = 0
        self._running: contextlib.ExitStack | None = None
        self.hook: GunicornHook | None = None

    @property
    def url(self) -> str:
        assert self.hook is not None, "the hook was never started"
        return self.hook.url

    def start(self) -> GunicornHook:
        assert self._running is None, "the hook is running"
        self.starts += 1
        stack = contextlib.ExitStack()
        workdir = self.work_dir / f"start-{self.starts}"
        workdir.mkdir(parents=True)
        hook = stack.enter_context(
            gunicorn_hook(workdir, env=self.env, port=self.port, token=self.token)
        )
        self._running, self.hook = stack, hook
        self.port = int(hook.url.rsplit(":", 1)[1])
        self.token = hook.token
        return hook

    def stop(self) -> None:
        """Every worker and the arbiter gone (SIGTERM, then SIGKILL of the group)."""
        if self._running is not None:
            running, self._running = self._running, None
            running.close()
