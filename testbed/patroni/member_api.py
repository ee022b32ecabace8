"""What the harness asks of a member's Patroni REST API beyond its status: a switchover, the
maintenance mode, other dynamic configuration, the full ``GET /patroni``."""

from __future__ import annotations

from typing import Any

from testbed.patroni import _http
from testbed.patroni.errors import ClusterError
from testbed.patroni.layout import Member


def patroni_info(member: Member, timeout: float = 2.0) -> dict[str, Any]:
    """``GET /patroni`` of a member (full JSON; ``{}`` when it does not answer)."""
    return member.api_get("/patroni", timeout=timeout).json()


def post_switchover(leader: Member, old: str, candidate: str, timeout: float) -> None:
    """``POST /switchover`` on the leader; raises unless Patroni answers 200.

    The request carries no credentials: the harness configures no REST API authentication.
    """
    resp = _http.request(
        "POST",
        leader.ip,
        leader.api_port,
        "/switchover",
        {"leader": old, "candidate": candidate},
        timeout=timeout,
        tls=leader.tls,
    )
    if resp.status != 200:
        raise ClusterError(
            f"POST {leader.api_url}/switchover -> {resp.status} {resp.error} "
            f"{resp.body.decode(errors='replace')}"
        )


def patch_pause(target: Member, enabled: bool) -> None:
    """``PATCH /config {"pause": enabled}``: Patroni's maintenance mode for the whole cluster."""
    resp = _http.request(
        "PATCH", target.ip, target.api_port, "/config", {"pause": enabled}, timeout=5
    )
    if resp.status != 200:
        raise ClusterError(f"PATCH {target.api_url}/config -> {resp.status} {resp.error}")


def patch_config(target: Member, patch: dict[str, Any]) -> dict[str, Any]:
    """``PATCH /config`` with ``patch`` (what ``patronictl edit-config`` sends; ``None`` removes
    a key); returns the dynamic configuration Patroni answers with."""
    resp = _http.request("PATCH", target.ip, target.api_port, "/config", patch, timeout=5)
    if resp.status != 200:
        raise ClusterError(f"PATCH {target.api_url}/config {patch} -> {resp.status} {resp.error}")
    config: dict[str, Any] = resp.json()
    return config


def reports_pause(member: Member) -> bool:
    """Whether a member's ``GET /patroni`` says the cluster is paused."""
    return bool(_http.get(member.ip, member.api_port, "/patroni").json().get("pause"))


def failsafe_members(member: Member) -> dict[str, Any] | None:
    """``GET /failsafe``: the members the leader last wrote to the DCS's ``/failsafe`` key
    (``do_GET_failsafe``, patroni/api.py); ``None`` while failsafe mode is off (502) or
    the member does not answer."""
    resp = _http.get(member.ip, member.api_port, "/failsafe")
    if resp.status != 200:
        return None
    body = resp.json()
    return body if isinstance(body, dict) else None
