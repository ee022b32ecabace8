"""The short chaos run in CI: a few failovers with a client writing through "the Service".

The full run (>= 20 failovers mixing SIGKILLs, graceful stops and switchovers) is the
benchmark script ``python -m testbed.bench.failover_patroni --failovers 21``; this short version
skips the SIGKILL (each costs the 20 s leader-lock TTL, covered once in tests/test_failover.py) and
checks the same invariants on the session's real cluster: no hook call fails, the Service
never selects two pods and is never dropped, no write lands on a non-leader, and after each
promotion the Service follows within the bound the issue sets (2.5 s).
"""

from __future__ import annotations

import pytest

from testbed.bench.failover_patroni import run_on
from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import Rig

pytestmark = [pytest.mark.patroni, pytest.mark.gunicorn, pytest.mark.slow]


def test_short_chaos_run_keeps_every_invariant(rig: Rig, hook: GunicornHook) -> None:
    results = run_on(rig, hook.url, 3, ["graceful", "switchover"], probe_rounds=20, quiet=True)
    assert results["invariants"]["failed_hook_calls"] == 0
    assert results["invariants"]["replies_selecting_two_pods"] == 0
    assert results["invariants"]["service_dropped"] is False
    assert results["writes"]["on_non_leader"] == 0
    assert results["writes"]["ok"] > 0
    for failover in results["failovers"]:
        assert failover["routing_lag"] < 2.5, failover
