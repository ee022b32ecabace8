"""A network namespace of the test's own: a "node" whose netfilter kube-proxy may program.

kube-proxy programs the netfilter of the network namespace it runs in. Run in the host's, it
would write NAT rules for every ClusterIP into the machine that other test runs share; run here,
its rules, and the clients that go through them, are confined to a namespace that is deleted
afterwards (nothing of it outlives :meth:`ClientNetns.delete`, or the context).

The members of the test Pod network listen on the host's ``127.0.0.N`` and are reached as
``198.18.0.N`` (:mod:`testbed.kubernetes.podnet`). From the namespace they are reached over a veth
pair:

* inside: ``lo`` up, the veth end ``inner_ip``/30 and a default route via the host end, so a
  ClusterIP (routed first, rewritten by kube-proxy's DNAT in the ``output`` hook) and a Pod IP
  leave through the veth;
* on the host, one nftables table of this namespace (``pgfh_ns_<id>``): packets that come in
  through the veth for ``198.18.0.N`` are rewritten to ``127.0.0.N`` (``prerouting``, the same
  prefix map as the Pod network's ``output`` rule) and their source to :data:`SNAT_SOURCE`
  (``input``), so that PostgreSQL's ``pg_hba`` (``127.0.0.0/8``) admits them and a member can
  tell this namespace's clients from everything else by ``client_addr``. A packet with a
  loopback destination that arrived on another device, and the reply leaving through it with a
  loopback source, are martians unless ``route_localnet`` is set: it is set on the host's veth
  end only (which disappears with the namespace).

The API server listens on the host's ``127.0.0.1``: from inside it is ``198.18.0.1`` (the same
map); its certificate names ``localhost``, which a kubeconfig gives as ``tls-server-name``.
Needs root (``ip``, ``nft``), as the Pod network does.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.podnet import LOOPBACK_NETWORK, POD_NETWORK

#: Where each namespace's veth pair gets its /30 (RFC 2544's second /24 block, next to the
#: Pod network's 198.18.0.0/24; never routed on the Internet).
VETH_NETWORKS = ipaddress.IPv4Network("198.19.0.0/16")
#: The source address members see for every connection from a client namespace.
SNAT_SOURCE = "127.0.0.254"
#: The API server (host ``127.0.0.1``) as the namespace reaches it.
HOST_LOOPBACK_FROM_INSIDE = str(POD_NETWORK.network_address + 1)


def _run(args: Sequence[str], input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), input=input_text, capture_output=True, text=True, timeout=30, check=False
    )


def _must(args: Sequence[str], input_text: str | None = None) -> str:
    done = _run(args, input_text)
    if done.returncode != 0:
        raise ControlPlaneError(f"{' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


@dataclass(frozen=True)
class ClientNetns:
    """One namespace and its plumbing; :func:`client_netns` makes and deletes it."""

    name: str
    host_if: str
    inner_if: str
    host_ip: str
    inner_ip: str
    table: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: the PID is argv's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def tcp_refusal(self, port: int) -> str | None:
        """``None`` when something in the namespace accepts a connection on
        ``127.0.0.1:port``, else why not (for :meth:`Server.wait_until`)."""
        probe = self.run("bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}", timeout=5)
        return None if probe.returncode == 0 else (probe.stderr.strip() or "refused")

    def ruleset(self) -> str:
        """The namespace's whole nftables ruleset (what kube-proxy wrote)."""
        return self.run("nft", "list", "ruleset").stdout

    def delete(self) -> None:
        """Remove the namespace (and with it both veth ends) and the host table; idempotent."""
        _run(["ip", "netns", "delete", self.name])
        _run(["ip", "link", "delete", self.host_if])
        _run(["nft", "delete", "table", "ip", self.table])


def _free_veth_network() -> ipaddress.IPv4Network:
    """A /30 of :data:`VETH_NETWORKS` no interface of the host has an address in."""
    used: list[ipaddress.IPv4Address] = [
        ipaddress.IPv4Interface(word).ip
        for line in _must(["ip", "-4", "-o", "addr", "show"]).splitlines()
        for word in line.split()
        if "/" in word and word[0].isdigit()
    ]
    for candidate in list(VETH_NETWORKS.subnets(new_prefix=30))[1:1024]:
        if not any(address in candidate for address in used):
            return candidate
    raise ControlPlaneError(f"no free /30 left in {VETH_NETWORKS} for a client namespace")


def _host_ruleset(table: str, host_if: str) -> str:
    return f"""table ip {table} {{
    chain prerouting {{
        type nat hook prerouting priority -100; policy accept;
        iifname "{host_if}" ip daddr {POD_NETWORK} dnat ip prefix to ip daddr map {{
            {POD_NETWORK} : {LOOPBACK_NETWORK}
        }}
    }}
    chain input {{
        type nat hook input priority 100; policy accept;
        iifname "{host_if}" snat ip to {SNAT_SOURCE}
    }}
}}
"""


def create_client_netns(tag: str | None = None) -> ClientNetns:
    """Make a namespace with its veth pair, routes and host table; deleted again on failure."""
    if os.geteuid() != 0:
        raise ControlPlaneError(
            "a client network namespace (kube-proxy's node) needs root for `ip netns` and "
            "`nft`: run as root, as CI does"
        )
    ident = tag or f"{os.getpid() % 100000}"
    network = _free_veth_network()
    host_ip, inner_ip = (str(address) for address in list(network.hosts())[:2])
    netns = ClientNetns(
        name=f"pgfh-{ident}",
        host_if=f"pgfh{ident}h"[:15],
        inner_if=f"pgfh{ident}i"[:15],
        host_ip=host_ip,
        inner_ip=inner_ip,
        table=f"pgfh_ns_{ident}",
    )
    netns.delete()  # leftovers of an earlier run of the same id
    try:
        _must(["ip", "netns", "add", netns.name])
        _must(
            [
                "ip", "link", "add", netns.host_if, "type", "veth",
                "peer", "name", netns.inner_if, "netns", netns.name,
            ]
        )  # fmt: skip
        Path(f"/proc/sys/net/ipv4/conf/{netns.host_if}/route_localnet").write_text("1\n")
        _must(["ip", "addr", "add", f"{host_ip}/30", "dev", netns.host_if])
        _must(["ip", "link", "set", netns.host_if, "up"])
        for argv in (
            ("ip", "link", "set", "lo", "up"),
            ("ip", "addr", "add", f"{inner_ip}/30", "dev", netns.inner_if),
            ("ip", "link", "set", netns.inner_if, "up"),
            ("ip", "route", "add", "default", "via", host_ip),
        ):
            _must(netns.command(*argv))
        _must(["nft", "-f", "-"], _host_ruleset(netns.table, netns.host_if))
    except BaseException:
        netns.delete()
        raise
    return netns


@contextlib.contextmanager
def client_netns(tag: str | None = None) -> Iterator[ClientNetns]:
    netns = create_client_netns(tag)
    try:
        yield netns
    finally:
        netns.delete()
