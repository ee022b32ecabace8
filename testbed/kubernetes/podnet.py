"""The test Pod network: routable Pod IPs for processes that listen on loopback.

The API server refuses loopback addresses in EndpointSlices and Endpoints (``ValidateEndpointIP``
in ``pkg/apis/core/validation``: "may not be in the loopback range"), so Pods whose processes run
on 127.0.0.x would never appear in a Service's slices. This module gives each such process a Pod
IP the server accepts, the way a node's CNI plugin does: ``198.18.0.N`` (RFC 2544's benchmarking
block, never routed on the Internet) stands for ``127.0.0.N``.

* the whole ``198.18.0.0/24`` is routed to the loopback device (``src 127.0.0.1``), so no packet
  for a Pod IP can leave the machine, mapped or not (an unmapped one is dropped on ``lo``);
* one nftables rule in the ``output`` NAT hook rewrites each new connection to ``198.18.0.N``
  to ``127.0.0.N`` (a prefix map), like kube-proxy's DNAT from a ClusterIP to a Pod.

Both are set up idempotently and shared by every test run on the machine (nothing of them runs,
and a run that removed them would break another run that uses them); :func:`remove_pod_network`
takes them away. Needs root (``ip`` and ``nft``), as CI has.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

from testbed.kubernetes.errors import ControlPlaneError

POD_NETWORK = ipaddress.ip_network("198.18.0.0/24")
LOOPBACK_NETWORK = ipaddress.ip_network("127.0.0.0/24")
NFT_TABLE = "pgfh_podnet"
_RULESET = f"""table ip {NFT_TABLE} {{
    chain output {{
        type nat hook output priority -100; policy accept;
        ip daddr {POD_NETWORK} dnat ip prefix to ip daddr map {{
            {POD_NETWORK} : {LOOPBACK_NETWORK}
        }}
    }}
}}
"""


def pod_ip(loopback_ip: str) -> str:
    """The Pod IP that stands for ``127.0.0.N``: ``198.18.0.N``."""
    address = ipaddress.ip_address(loopback_ip)
    if address not in LOOPBACK_NETWORK:
        raise ValueError(f"{loopback_ip} is not in {LOOPBACK_NETWORK}")
    offset = int(address) - int(LOOPBACK_NETWORK.network_address)
    return str(POD_NETWORK.network_address + offset)


def loopback_ip(pod_address: str) -> str:
    """The loopback address a Pod IP of :data:`POD_NETWORK` reaches."""
    address = ipaddress.ip_address(pod_address)
    if address not in POD_NETWORK:
        raise ValueError(f"{pod_address} is not in {POD_NETWORK}")
    return str(LOOPBACK_NETWORK.network_address + (int(address) - int(POD_NETWORK.network_address)))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)


def ensure_pod_network() -> None:
    """Route :data:`POD_NETWORK` to ``lo`` and map it onto loopback (idempotent)."""
    if os.geteuid() != 0:
        raise ControlPlaneError(
            "the test Pod network (routable Pod IPs 198.18.0.N for members on 127.0.0.N) needs "
            "root for `ip route` and `nft`: run the tests as root, as CI does"
        )
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            raise ControlPlaneError(
                f"the test Pod network needs `{tool}`: apt-get install "
                f"{'iproute2' if tool == 'ip' else 'nftables'}"
            )
    route = _run("ip", "route", "replace", str(POD_NETWORK), "dev", "lo", "src", "127.0.0.1")
    if route.returncode != 0:
        raise ControlPlaneError(f"ip route replace {POD_NETWORK} dev lo: {route.stderr.strip()}")
    if _run("nft", "list", "table", "ip", NFT_TABLE).returncode == 0:
        return
    loaded = subprocess.run(
        ["nft", "-f", "-"], input=_RULESET, capture_output=True, text=True, timeout=30, check=False
    )
    if loaded.returncode != 0 and _run("nft", "list", "table", "ip", NFT_TABLE).returncode != 0:
        raise ControlPlaneError(f"nft could not load the Pod network map: {loaded.stderr.strip()}")


def remove_pod_network() -> None:
    """Take the route and the map away (for a machine that is done with the tests)."""
    _run("nft", "delete", "table", "ip", NFT_TABLE)
    _run("ip", "route", "del", str(POD_NETWORK), "dev", "lo")
