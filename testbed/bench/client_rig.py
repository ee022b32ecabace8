"""Clients of the primary Service as a node's Pods would be: the rig around a :class:`KubeRig`.

A client network namespace (:mod:`testbed.kubernetes.netns`) with kube-proxy in it
(:mod:`testbed.kubernetes.kube_proxy`) programming the primary Service's ClusterIP from the real
EndpointSlice; optionally PgBouncer in the same namespace pooling towards the ClusterIP
(:mod:`testbed.bench.pgbouncer`); the writer processes (:mod:`testbed.bench.client_writer`) and the
members' view of their connections (:class:`testbed.bench.writers.ConnectionSampler`). Shared by the
benchmark (:mod:`testbed.bench.client_downtime`) and its short test, so both measure the same thing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.bench.client_writer import CREATE_TABLE
from testbed.bench.haproxy import running_haproxy
from testbed.bench.pgbouncer import PgBouncer, running_pgbouncer
from testbed.bench.writers import ConnectionSampler, Writers, WriterSpec
from testbed.kubernetes.kube_proxy import KubeProxy, running_kube_proxy
from testbed.kubernetes.netns import ClientNetns, client_netns
from testbed.kubernetes.pods import NODE
from testbed.kubernetes.rest import resource_path
from testbed.kubernetes.servers import ControlPlane
from testbed.metacontroller.harness import SERVICE
from testbed.metacontroller.kube_rig import KubeRig

PORT_NAME = "postgresql"
#: Client paths: name → (policy, through what: ``None`` for the ClusterIP itself, a PgBouncer
#: profile of :mod:`testbed.bench.pgbouncer`, or ``"haproxy"``: HAProxy with Patroni's reference
#: checks
#: towards the Pod IPs, instead of the Service, for comparison).
CLIENT_PATHS: dict[str, tuple[str, str | None]] = {
    "direct-new": ("new", None),
    "direct-kept": ("kept", None),
    "direct-kept-rw": ("kept-rw", None),
    "pgbouncer-debian": ("kept", "debian"),
    "pgbouncer-checked": ("kept", "checked"),
    "haproxy-new": ("new", "haproxy"),
}
BOUNCER_PORTS = {"debian": 6432, "checked": 6433}
HAPROXY_PORT = 5000


@dataclass
class ClientRig:
    kube: KubeRig
    netns: ClientNetns
    proxy: KubeProxy
    cluster_ip: str
    writers: Writers
    sampler: ConnectionSampler
    bouncers: dict[str, PgBouncer]
    rules_watch: RulesWatch

    def rules(self) -> tuple[str, ...]:
        """The Pod IPs kube-proxy sends new connections of the ClusterIP to, now."""
        return self.proxy.endpoints(self.kube.namespace, SERVICE, PORT_NAME)

    def wait_rules(
        self, addresses: tuple[str, ...], timeout: float, *, since: float | None = None
    ) -> float:
        """The first time after ``since`` (default: now) that kube-proxy's rules sent to
        exactly ``addresses``, from :class:`RulesWatch`'s history (polled every 50 ms, from
        before the trigger, so the figure does not depend on when this is called)."""
        since = time.monotonic() if since is None else since
        deadline = time.monotonic() + timeout
        while True:
            found = self.rules_watch.first(addresses, since)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"kube-proxy's rules for {SERVICE} did not send to {list(addresses)} within "
                    f"{timeout} s; now {list(self.rules())} (log: {self.proxy.server.log})"
                )
            time.sleep(0.05)


@dataclass
class RulesWatch:
    """kube-proxy's endpoints for the ClusterIP, read back every ``interval`` s, as a history
    of changes ``(monotonic time of the first read that saw them, endpoints)``."""

    read: Callable[[], tuple[str, ...]]
    interval: float = 0.05
    history: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> RulesWatch:
        self._thread = threading.Thread(target=self._run, name="kube-proxy-rules", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            seen = self.read()
            with self._lock:
                if not self.history or self.history[-1][1] != seen:
                    self.history.append((started, seen))
            self._stop.wait(self.interval)

    def first(self, addresses: tuple[str, ...], since: float) -> float | None:
        """When the rules last became ``addresses`` at or after ``since`` (None: not yet)."""
        with self._lock:
            changes = list(self.history)
        for index, (at, seen) in enumerate(changes):
            ends = changes[index + 1][0] if index + 1 < len(changes) else float("inf")
            if seen == addresses and ends > since:
                return max(at, since)
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _cluster_ip(kube: KubeRig, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            service = kube.rest.get(resource_path("v1", "services", kube.namespace, SERVICE))
            address = str(service["spec"].get("clusterIP") or "")
            if address and address != "None":
                return address
        if time.monotonic() > deadline:
            raise TimeoutError(f"the Service {SERVICE} got no ClusterIP within {timeout} s")
        time.sleep(0.2)


@contextlib.contextmanager
def client_rig(
    plane: ControlPlane,
    kube: KubeRig,
    work: Path,
    paths: Sequence[str],
    *,
    mode: str = "auto",
    interval: float = 0.05,
) -> Iterator[ClientRig]:
    """kube-proxy, the poolers the ``paths`` need and their writers, all stopped on exit."""
    cluster = kube.cluster
    leader = cluster.leader()
    if leader is None:
        raise RuntimeError("the client rig needs a leader to start from")
    cluster_ip = _cluster_ip(kube)
    cluster.execute(leader, CREATE_TABLE)
    password = cluster.superuser_password
    with contextlib.ExitStack() as stack:
        netns = stack.enter_context(client_netns())
        proxy = stack.enter_context(running_kube_proxy(plane, netns, work, NODE, mode=mode))
        bouncers: dict[str, PgBouncer] = {}
        vias = {str(CLIENT_PATHS[p][1]) for p in paths if CLIENT_PATHS[p][1]}
        for profile in sorted(vias - {"haproxy"}):
            bouncers[profile] = stack.enter_context(
                running_pgbouncer(
                    netns,
                    profile=profile,
                    port=BOUNCER_PORTS[profile],
                    target=cluster_ip,
                    password=password,
                )
            )
        dsns: dict[str | None, str] = {
            None: f"host={cluster_ip} port=5432 dbname=postgres user=postgres password={password}"
        }
        dsns.update({profile: bouncer.dsn() for profile, bouncer in bouncers.items()})
        if "haproxy" in vias:
            members = [(m.name, kube.leader_ip(m.name)) for m in cluster.members]
            haproxy = stack.enter_context(running_haproxy(netns, members, port=HAPROXY_PORT))
            dsns["haproxy"] = haproxy.dsn(password)
        specs = [
            WriterSpec(name, dsns[CLIENT_PATHS[name][1]], CLIENT_PATHS[name][0]) for name in paths
        ]
        sampler = ConnectionSampler(cluster).start()
        stack.callback(sampler.stop)
        rules_watch = RulesWatch(
            lambda: proxy.endpoints(kube.namespace, SERVICE, PORT_NAME)
        ).start()
        stack.callback(rules_watch.stop)
        writers = Writers(netns, specs, interval)
        rig = ClientRig(kube, netns, proxy, cluster_ip, writers, sampler, bouncers, rules_watch)
        rig.wait_rules((kube.leader_ip(leader),), 60, since=0.0)
        rig.writers.start()
        stack.callback(rig.writers.stop)
        yield rig
