"""kube-proxy (the pinned ``k8s.io/kubernetes`` build) in a client namespace of the test's own.

It watches Services and EndpointSlices on the real API server and programs their ClusterIPs
into the netfilter of :class:`testbed.kubernetes.netns.ClientNetns`, as it would on a node: a client
in that namespace that connects to the primary Service's ClusterIP is DNATed to whichever Pod
the EndpointSlice lists as ready, exactly when kube-proxy has rewritten its rules.

* Mode ``nftables`` (kube-proxy's newer backend, Debian's ``nft``), or ``iptables`` (Debian's
  ``iptables``, the nf_tables flavour); ``auto`` tries nftables and falls back to iptables,
  keeping the reason (:attr:`KubeProxy.fallback_reason`).
* It runs as ``system:kube-proxy`` (a client certificate of the test CA): the API server's
  bootstrap binding ``system:node-proxier`` gives that user exactly kube-proxy's rights.
* Its Node is the kubelet stand-in's (``--hostname-override``), its cluster CIDR the test Pod
  network (traffic from outside it is masqueraded, as on a node).
* Conntrack sysctls are left alone (``--conntrack-*=0``): in a namespace they are either the
  host's or read-only, and kube-proxy would fail setting them.
* Bounded start: ``/healthz`` (on the namespace's veth address, so the host can ask) must
  answer 200, which kube-proxy does only after its first full sync of the rules; on a timeout
  or an early exit it is stopped and the error names the cause and its log.

:func:`programmed_endpoints` reads back the rules kube-proxy wrote for a Service: the
endpoints a new connection to the ClusterIP is DNATed to right now.
"""

from __future__ import annotations

import contextlib
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.kubeconfig import write_kubeconfig
from testbed.kubernetes.netns import HOST_LOOPBACK_FROM_INSIDE, ClientNetns
from testbed.kubernetes.podnet import POD_NETWORK
from testbed.kubernetes.rest import KubeRest
from testbed.kubernetes.servers import ControlPlane, Server, http_refusal

HEALTHZ_PORT = 10256
METRICS_PORT = 10249
START_TIMEOUT = 60.0
MODES = ("nftables", "iptables")
#: The user the API server's bootstrap ClusterRoleBinding ``system:node-proxier`` binds.
KUBE_PROXY_USER = "system:kube-proxy"


@dataclass
class KubeProxy:
    """A running kube-proxy: its mode, its namespace, where its health and metrics are."""

    mode: str
    netns: ClientNetns
    server: Server
    fallback_reason: str = ""

    @property
    def healthz_url(self) -> str:
        return f"http://{self.netns.inner_ip}:{HEALTHZ_PORT}/healthz"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.netns.inner_ip}:{METRICS_PORT}/metrics"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return str(response.read().decode())

    def endpoints(self, namespace: str, service: str, port_name: str) -> tuple[str, ...]:
        """:func:`programmed_endpoints` of this kube-proxy's rules."""
        return programmed_endpoints(self.mode, self.netns, namespace, service, port_name)


def kube_proxy_kubeconfig(plane: ControlPlane, path: Path) -> Path:
    """A kubeconfig for ``system:kube-proxy`` that reaches the API server from the namespace.

    The server is the host's ``127.0.0.1`` as the namespace sees it; its serving certificate
    names ``localhost``, so ``tls-server-name`` says that name.
    """
    pair = plane.ca.issue("kube-proxy", common_name=KUBE_PROXY_USER)
    port = plane.server_url.rsplit(":", 1)[1]
    write_kubeconfig(
        path,
        server=f"https://{HOST_LOOPBACK_FROM_INSIDE}:{port}",
        ca_file=plane.ca_file,
        user=KUBE_PROXY_USER,
        client=pair,
    )
    document = yaml.safe_load(path.read_text())
    document["clusters"][0]["cluster"]["tls-server-name"] = "localhost"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _args(binary: Path, kubeconfig: Path, netns: ClientNetns, node: str, mode: str) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--proxy-mode={mode}",
        f"--hostname-override={node}",
        f"--cluster-cidr={POD_NETWORK}",
        f"--bind-address={netns.inner_ip}",  # the node's primary IP
        "--nodeport-addresses=primary",
        f"--healthz-bind-address={netns.inner_ip}:{HEALTHZ_PORT}",
        f"--metrics-bind-address={netns.inner_ip}:{METRICS_PORT}",
        "--conntrack-max-per-core=0",
        "--conntrack-min=0",
        "--conntrack-tcp-timeout-established=0s",
        "--conntrack-tcp-timeout-close-wait=0s",
        "--v=2",
    ]


def give_node_an_address(plane: ControlPlane, node: str, address: str) -> None:
    """Give the kubelet stand-in's Node the ``InternalIP`` a kubelet would report.

    kube-proxy's NodeManager waits up to 30 s for the Node to have addresses, whatever
    ``--bind-address`` says ("Timed out waiting for node to be assigned IPs",
    ``pkg/proxy/node.go``), and the stand-in registers none.
    """
    rest = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    try:
        rest.strategic_patch(
            f"/api/v1/nodes/{node}/status",
            {"status": {"addresses": [{"type": "InternalIP", "address": address}]}},
        )
    finally:
        rest.close()


def _wait_healthy(proxy: KubeProxy, timeout: float) -> None:
    proxy.server.wait_until(
        lambda: http_refusal(proxy.healthz_url),
        timeout,
        f"healthy ({proxy.mode} mode) at {proxy.healthz_url}",
    )


def start_kube_proxy(
    plane: ControlPlane,
    netns: ClientNetns,
    run_dir: Path,
    node: str,
    *,
    mode: str = "auto",
    timeout: float = START_TIMEOUT,
) -> KubeProxy:
    """Start kube-proxy in ``netns`` and wait until it is healthy; stopped again on failure."""
    modes = MODES if mode == "auto" else (mode,)
    if any(m not in MODES for m in modes):
        raise ValueError(f"kube-proxy mode {mode!r}: one of auto, {', '.join(MODES)}")
    kubeconfig = kube_proxy_kubeconfig(plane, run_dir / "kube-proxy.kubeconfig")
    give_node_an_address(plane, node, netns.inner_ip)
    failures: list[str] = []
    for candidate in modes:
        server = Server(
            "kube-proxy",
            netns.command(
                *_args(plane.binaries.path("kube-proxy"), kubeconfig, netns, node, candidate)
            ),
            run_dir / f"kube-proxy-{candidate}.log",
        )
        proxy = KubeProxy(candidate, netns, server, fallback_reason="; ".join(failures))
        server.start()
        try:
            _wait_healthy(proxy, timeout)
        except ControlPlaneError as error:
            server.stop()
            _flush_rules(netns, candidate)
            failures.append(str(error))
            continue
        except BaseException:
            server.stop()
            raise
        return proxy
    raise ControlPlaneError("kube-proxy did not run: " + " | ".join(failures))


def _flush_rules(netns: ClientNetns, mode: str) -> None:
    """What a failed kube-proxy left in the namespace, so the other mode starts clean."""
    if mode == "nftables":
        netns.run("nft", "delete", "table", "ip", "kube-proxy")
        netns.run("nft", "delete", "table", "ip6", "kube-proxy")
    else:
        netns.run("iptables", "-t", "nat", "-F")
        netns.run("iptables", "-F")


@contextlib.contextmanager
def running_kube_proxy(
    plane: ControlPlane,
    netns: ClientNetns,
    run_dir: Path,
    node: str,
    *,
    mode: str = "auto",
    timeout: float = START_TIMEOUT,
) -> Iterator[KubeProxy]:
    proxy = start_kube_proxy(plane, netns, run_dir, node, mode=mode, timeout=timeout)
    try:
        yield proxy
    finally:
        proxy.server.stop()


_NFT_CHAIN = re.compile(r"^\s*chain (\S+) \{$(.*?)^\s*\}$", re.MULTILINE | re.DOTALL)
#: An endpoint in a service chain: ``... map { 0 : 198.18.0.3 . 5432 }`` (kube-proxy 1.36 DNATs
#: from the service chain itself) or a jump to ``endpoint-HASH-ns/svc/tcp/port__IP/PORT``.
_NFT_ENDPOINT = re.compile(r"(?:: |__)(\d+\.\d+\.\d+\.\d+)(?: \. |/)\d+")
_IPT_DNAT = re.compile(
    r'^-A KUBE-SEP-\S+ .*--comment "?(\S+?)"? .*-j DNAT --to-destination ([0-9.]+):\d+',
    re.MULTILINE,
)


def programmed_endpoints(
    mode: str, netns: ClientNetns, namespace: str, service: str, port_name: str
) -> tuple[str, ...]:
    """The Pod IPs kube-proxy's rules in ``netns`` send new connections of the Service's port
    ``port_name`` to (sorted; empty while it has none, when it rejects them)."""
    key = f"{namespace}/{service}/tcp/{port_name}"
    if mode == "nftables":
        text = netns.run("nft", "list", "table", "ip", "kube-proxy").stdout
        found = {
            address
            for name, body in _NFT_CHAIN.findall(text)
            if name.startswith("service-") and name.endswith(key)
            for address in _NFT_ENDPOINT.findall(body)
        }
        return tuple(sorted(found))
    text = netns.run("iptables-save", "-t", "nat").stdout
    comment = f"{namespace}/{service}:{port_name}"
    return tuple(sorted({ip for found, ip in _IPT_DNAT.findall(text) if found == comment}))
