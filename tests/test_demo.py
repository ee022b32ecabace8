"""The demo's timeline says what ``t`` counts from, and the event it counts from is ``t +0``."""

from __future__ import annotations

import pytest

from testbed.demo.__main__ import Clock


def test_the_timeline_names_its_origin_and_starts_at_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock()
    killed = 1000.0
    clock.start(killed, "the SIGKILL of pg-orders-0")
    clock.say("leader pg-orders-0 killed", killed)
    clock.say("Patroni: pg-orders-1 reports role primary (promoted)", killed + 20.5)
    clock.say("seen just before", killed - 0.045)
    assert capsys.readouterr().out.splitlines() == [
        "   t = seconds since the SIGKILL of pg-orders-0",
        "  t  +0.000s  leader pg-orders-0 killed",
        "  t +20.500s  Patroni: pg-orders-1 reports role primary (promoted)",
        "  t  -0.045s  seen just before",
    ]
