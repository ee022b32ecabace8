"""The URL a probe may request: checked on the exact string about to be sent."""

from __future__ import annotations

import ipaddress

import urllib3
from urllib3.util import Url

from hooks.domain.model import LEADER_PATHS
from hooks.probe.policy import ProbePolicy


def target_problem(url: str, policy: ProbePolicy | None) -> str | None:
    """Why ``url`` must not be requested, or ``None``; nothing is sent for a refused URL.

    Targets are built by :func:`hooks.probe.plan.plan_probes` from a Pod IP, the spec's port and
    a leader path, so none of this should ever trip. It is checked here, on the exact URL
    about to be requested, so that no other code path can make the hook request a
    hostname (DNS, and whatever it resolves to), credentials, a query, or another path.
    """
    return checked_url(url, policy)[0]


def checked_url(url: str, policy: ProbePolicy | None) -> tuple[str | None, Url | None]:
    """:func:`target_problem`, and the parsed URL when there is none."""
    try:
        parsed = urllib3.util.parse_url(url)
    except urllib3.exceptions.LocationParseError:
        return "refused: not a valid URL", None
    if parsed.scheme not in ("http", "https"):
        return "refused: scheme is not http or https", None
    if parsed.auth or parsed.query is not None or parsed.fragment is not None:
        return "refused: URL carries credentials, a query or a fragment", None
    if parsed.path not in LEADER_PATHS:
        return "refused: path is not one of Patroni's leader paths", None
    host = (parsed.host or "").removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "refused: host is not an IP address", None
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return "refused: host is not an IP address", None
    if parsed.port is None:
        return "refused: no port", None
    if url != f"{parsed.scheme}://{parsed.host}:{parsed.port}{parsed.path}":
        # parse_url normalises ("/../primary" → "/primary", case, ...): only a URL that
        # is already in that form is requested, so what was checked is what is sent.
        return "refused: URL is not in canonical form", None
    if policy is not None:
        port = policy.port_problem(parsed.port)
        if port is not None:
            return f"refused: {port}", None
        address = policy.address_problem(ip)
        if address is not None:
            return address, None
    return None, parsed
