"""Clients of the primary Service as a node's Pods would be: the rig around a :class:`KubeRig`.

A client network namespace (:mod:`controlplane.netns`) with kube-proxy in it
(:mod:`controlplane.kube_proxy`) programming the primary Service's ClusterIP from the real
EndpointSlice; optionally PgBouncer in the same namespace pooling towards the ClusterIP
(:mod:`bench.pgbouncer`); the writer processes (:mod:`bench.client_writer`) and the members'
view of their connections (:class:`bench.writers.ConnectionSampler`). Shared by the benchmark
(:mod:`bench.client_downtime`) and its short test, so both measure the same thing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.client_writer import CREATE_TABLE
from bench.pgbouncer import PgBouncer, running_pgbouncer
from bench.writers import ConnectionSampler, Writers, WriterSpec
from controlplane.kube_proxy import KubeProxy, running_kube_proxy
from controlplane.netns import ClientNetns, client_netns
from controlplane.rest import resource_path
from controlplane.servers import ControlPlane
from standin.harness import SERVICE
from standin.kube_rig import NODE, KubeRig

PORT_NAME = "postgresql"
#: Client paths: name → (policy, through which PgBouncer profile or None for the ClusterIP).
CLIENT_PATHS: dict[str, tuple[str, str | None]] = {
    "direct-new": ("new", None),
    "direct-kept": ("kept", None),
    "direct-kept-rw": ("kept-rw", None),
    "pgbouncer-debian": ("kept", "debian"),
    "pgbouncer-checked": ("kept", "checked"),
}
BOUNCER_PORTS = {"debian": 6432, "checked": 6433}


@dataclass
class ClientRig:
    kube: KubeRig
    netns: ClientNetns
    proxy: KubeProxy
    cluster_ip: str
    writers: Writers
    sampler: ConnectionSampler
    bouncers: dict[str, PgBouncer]

    def rules(self) -> tuple[str, ...]:
        """The Pod IPs kube-proxy sends new connections of the ClusterIP to, now."""
        return self.proxy.endpoints(self.kube.namespace, SERVICE, PORT_NAME)

    def wait_rules(self, addresses: tuple[str, ...], timeout: float, poll: float = 0.05) -> float:
        """The first time (polled) kube-proxy's rules send to exactly ``addresses``."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.rules()
            now = time.monotonic()
            if seen == addresses:
                return now
            if now > deadline:
                raise TimeoutError(
                    f"kube-proxy's rules for {SERVICE} did not send to {list(addresses)} within "
                    f"{timeout} s; now {list(seen)} (log: {self.proxy.server.log})"
                )
            time.sleep(poll)


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
        for profile in sorted({str(CLIENT_PATHS[p][1]) for p in paths if CLIENT_PATHS[p][1]}):
            bouncers[profile] = stack.enter_context(
                running_pgbouncer(
                    netns,
                    profile=profile,
                    port=BOUNCER_PORTS[profile],
                    target=cluster_ip,
                    password=password,
                )
            )
        direct = f"host={cluster_ip} port=5432 dbname=postgres user=postgres password={password}"
        specs = [
            WriterSpec(
                name,
                direct
                if CLIENT_PATHS[name][1] is None
                else bouncers[str(CLIENT_PATHS[name][1])].dsn(),
                CLIENT_PATHS[name][0],
            )
            for name in paths
        ]
        sampler = ConnectionSampler(cluster).start()
        stack.callback(sampler.stop)
        rig = ClientRig(
            kube, netns, proxy, cluster_ip, Writers(netns, specs, interval), sampler, bouncers
        )
        rig.wait_rules((kube.leader_ip(leader),), 60)
        rig.writers.start()
        stack.callback(rig.writers.stop)
        yield rig
