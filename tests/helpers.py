"""Small builders shared by the tests: fixtures on disk, member answers, fake probers."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hooks.members import MemberStatus, ProbeTarget

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "metacontroller"
SYNC_FIXTURES = sorted(
    p.name for p in FIXTURES.glob("*.json") if p.name != "customize-request.json"
)


def fixture(name: str) -> dict[str, Any]:
    """A Metacontroller request body recorded from v4.17.2's Go types (deep copy)."""
    return copy.deepcopy(json.loads((FIXTURES / name).read_text()))


def patroni_body(
    role: str = "replica", state: str = "running", timeline: int = 1, name: str = "m"
) -> dict[str, Any]:
    """A Patroni 4.1 health-check JSON body."""
    body: dict[str, Any] = {
        "state": state,
        "postmaster_start_time": "2026-08-20 09:10:00.000000+00:00",
        "role": role,
        "server_version": 180006,
        "timeline": timeline,
        "dcs_last_seen": 1787216000,
        "database_system_identifier": "7400000000000000000",
        "patroni": {"version": "4.1.5", "scope": "pg-orders", "name": name},
    }
    if role in ("primary", "master"):
        body["xlog"] = {"location": 50332016}
    else:
        body["xlog"] = {
            "received_location": 50332016,
            "replayed_location": 50332016,
            "replayed_timestamp": None,
            "paused": False,
        }
        body["replication_state"] = "streaming"
    return body


def leader(name: str, timeline: int = 1) -> MemberStatus:
    """What Patroni's leader answers on /primary."""
    return MemberStatus.from_api_response(
        name, 200, patroni_body("primary", timeline=timeline, name=name)
    )


def replica(name: str, timeline: int = 1) -> MemberStatus:
    """What a streaming replica answers on /primary."""
    return MemberStatus.from_api_response(
        name, 503, patroni_body("replica", timeline=timeline, name=name)
    )


def down(name: str, reason: str = "connection refused") -> MemberStatus:
    return MemberStatus.unknown(name, reason)


class FakeProber:
    """Answers from a table; records what it was asked (so tests can prove no I/O)."""

    def __init__(self, answers: Mapping[str, MemberStatus] | None = None) -> None:
        self.answers = dict(answers or {})
        self.calls: list[list[ProbeTarget]] = []

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        self.calls.append(list(targets))
        return {
            t.pod: self.answers.get(t.pod) or MemberStatus.unknown(t.pod, "connection refused")
            for t in targets
        }
