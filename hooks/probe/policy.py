"""Where the hook may send a probe: the one outbound request an attacker could try to aim.

Everything the hook probes comes from the request Metacontroller sends: the Pods' own
``status.podIP`` and the spec's Patroni port and path. Whoever can write a Pod's status,
create a PostgreSQLCluster, or forge a request could try to point a probe somewhere else:
the node's metadata service, a loopback listener of the hook's own pod, another service's
port. This module decides, purely, what is allowed:

* only Patroni ports the hook's operator allowed (``PGFH_ALLOWED_PATRONI_PORTS``);
* never a loopback, link-local (cloud metadata), unspecified, multicast or reserved
  address, unless an allowed network *inside* that range names it explicitly (the local
  tests run Patroni on 127.0.0.2-4 and allow ``127.0.0.0/8``; allowing ``0.0.0.0/0`` does
  not open loopback);
* optionally only addresses inside the cluster's Pod networks (``PGFH_ALLOWED_POD_CIDRS``);
* at most ``max_members`` probes per request.

Pure: no I/O. :mod:`hooks.probe.plan` applies it to each request; :mod:`hooks.patroni` checks
each target again just before it connects.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hooks.domain.model import ClusterSpec, SpecProblem, field_default

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Ranges no Pod IP legitimately comes from, and what they are (for the reason).
SPECIAL_NETWORKS: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), what)
    for net, what in (
        # Metadata services first: opening all of link-local does not open them.
        ("169.254.169.254/32", "a cloud metadata address"),  # AWS, GCP, Azure, OpenStack, ...
        ("100.100.100.200/32", "a cloud metadata address"),  # Alibaba Cloud
        ("fd00:ec2::254/128", "a cloud metadata address"),  # AWS IMDS over IPv6
        ("0.0.0.0/8", "an unspecified address"),  # connect() to 0.0.0.0 reaches this host
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.0.0/16", "a link-local address"),
        ("224.0.0.0/4", "a multicast address"),
        ("240.0.0.0/4", "a reserved address"),  # includes 255.255.255.255
        ("::/128", "an unspecified address"),
        ("::1/128", "a loopback address"),
        ("fe80::/10", "a link-local address"),
        ("ff00::/8", "a multicast address"),
        ("64:ff9b::/96", "a NAT64 address"),  # embeds any IPv4 address
        ("64:ff9b:1::/48", "a NAT64 address"),
    )
)

#: Without PGFH_ALLOWED_PATRONI_PORTS: the Patroni port a spec gets when it names none.
DEFAULT_PATRONI_PORTS: frozenset[int] = frozenset({field_default(ClusterSpec, "patroni_port")})


@dataclass(frozen=True, slots=True)
class ProbePolicy:
    """The hook-level limits on probes (from ``PGFH_*`` settings, see :mod:`hooks.shell.config`)."""

    #: Ports a spec may ask for (``spec.patroni.port``).
    allowed_ports: frozenset[int] = DEFAULT_PATRONI_PORTS
    #: If not empty, Pod IPs must be inside one of these (the cluster's Pod CIDRs). A
    #: network inside a special range (e.g. ``127.0.0.0/8``) also opens that range.
    allowed_networks: tuple[IPNetwork, ...] = ()
    #: Most Pods probed for one request: more means primarySelector matches far too much.
    max_members: int = 64

    def port_problem(self, port: int) -> str | None:
        """Why a spec's Patroni port is refused, or ``None``."""
        if port in self.allowed_ports:
            return None
        return (
            f"port {port} is not an allowed Patroni port on this hook (allowed: "
            f"{describe_ports(self.allowed_ports)}; the hook's PGFH_ALLOWED_PATRONI_PORTS)"
        )

    def members_problem(self, count: int) -> str | None:
        """Why a request with ``count`` related Pods is not probed, or ``None``."""
        if count <= self.max_members:
            return None
        return (
            f"matches {count} Pods, more than the {self.max_members} members this hook "
            f"probes per cluster (the hook's PGFH_MAX_MEMBERS); nothing was probed"
        )

    def spec_problems(self, port: int, members: int) -> list[SpecProblem]:
        """What makes a spec invalid *for this hook*: its Patroni port, its member count."""
        problems = []
        if (problem := self.port_problem(port)) is not None:
            problems.append(SpecProblem("spec.patroni.port", problem))
        if (problem := self.members_problem(members)) is not None:
            problems.append(SpecProblem("spec.primarySelector", problem))
        return problems

    def screen(self, ips: Mapping[str, IPAddress]) -> tuple[dict[str, IPAddress], dict[str, str]]:
        """Each Pod's address as a probe reaches it (:func:`effective_address`), or why it
        is never probed (:meth:`address_problem`), by Pod name, in the order given."""
        allowed: dict[str, IPAddress] = {}
        refused: dict[str, str] = {}
        for name, ip in ips.items():
            problem = self.address_problem(ip)
            if problem is None:
                allowed[name] = effective_address(ip)
            else:
                refused[name] = problem
        return allowed, refused

    def address_problem(self, ip: IPAddress) -> str | None:
        """Why a Pod IP is never probed, or ``None``: a short, stable reason."""
        address = effective_address(ip)
        for network, what in SPECIAL_NETWORKS:
            inside = address.version == network.version and address in network
            if inside and not self._opens(address, network):
                return f"{ip} is {what}: not probed"
        if self.allowed_networks and not any(
            address.version == n.version and address in n for n in self.allowed_networks
        ):
            return f"{ip} is outside the allowed Pod networks: not probed"
        return None

    def _opens(self, address: IPAddress, special: IPNetwork) -> bool:
        """Whether an allowed network names (part of) ``special`` and holds ``address``.

        ``address`` is inside ``special``, so an allowed network that holds it is of the same
        family (``in`` is false across families) and overlaps ``special``; being CIDR blocks,
        the allowed one is inside ``special`` exactly when it is no larger.
        """
        for allowed in self.allowed_networks:
            if address not in allowed:
                continue
            if allowed.prefixlen >= special.prefixlen:
                return True
        return False


def effective_address(ip: IPAddress) -> IPAddress:
    """The address a connection really goes to: ``::ffff:a.b.c.d`` is ``a.b.c.d``."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _items(raw: str) -> list[str]:
    """The comma-separated items of a setting, each stripped.

    An empty item (``"8008,,8443"``, a comma at either end) is refused like any other bad
    item, so the hook does not start: it is most often a templated value that came out
    empty, and the operator meant something there (ignored, a lone ``","`` in
    ``PGFH_ALLOWED_POD_CIDRS`` would have lifted the Pod-network limit).
    """
    items = [item.strip() for item in raw.split(",")]
    if "" in items:
        raise ValueError(
            f"item {items.index('') + 1} of {len(items)} is empty "
            "(two commas in a row, or one at an end)"
        )
    return items


def parse_ports(raw: str) -> frozenset[int]:
    """``"8008"``, ``"8008,8443"`` or ``"8000-8010"`` → the set of ports; ValueError if bad."""
    ports: set[int] = set()
    for part in _items(raw):
        low, dash, high = part.partition("-")
        if not (low.strip().isdigit() and (not dash or high.strip().isdigit())):
            raise ValueError(f"{part!r} is not a port or a range of ports")
        first, last = int(low), int(high) if dash else int(low)
        if not 1 <= first <= last <= 65535:
            raise ValueError(f"{part!r}: ports are 1-65535, a range is low-high")
        ports.update(range(first, last + 1))
    return frozenset(ports)


def parse_networks(raw: str) -> tuple[IPNetwork, ...]:
    """``"10.244.0.0/16,fd00:10:244::/56"`` → networks; ValueError if one is not a CIDR."""
    networks = []
    for part in _items(raw):
        try:
            # Strict (the default): host bits set, as in 10.244.0.1/16, are refused.
            networks.append(ipaddress.ip_network(part))
        except ValueError as error:
            raise ValueError(f"{part!r} is not a network in CIDR notation ({error})") from None
    return tuple(networks)


def describe_ports(ports: Iterable[int]) -> str:
    """``{8008, 8009, 8010, 9000}`` → ``"8008-8010, 9000"`` (short, stable)."""
    ordered = sorted(ports)
    if not ordered:
        return "none"
    runs: list[tuple[int, int]] = []
    start = previous = ordered[0]
    for port in ordered[1:]:
        if port != previous + 1:
            runs.append((start, previous))
            start = port
        previous = port
    runs.append((start, previous))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
