"""The stand-in schedules syncs the way Metacontroller's work queue does
(testbed/metacontroller/loop.py).

Metacontroller v4.17.2 builds with client-go v0.36.3, whose delaying queue
(``util/workqueue/delaying_queue.go``) keeps a waiting key's EARLIER ``readyAt`` when a
second ``AddAfter`` comes (``insert``), fires each entry once, and leaves a waiting entry in
place when the key is added at once by a watch event. The stand-in used to replace its
timer on every reply; these tests pin the queue's behaviour, first on
:class:`~standin.loop.DelayedAdd` alone, then on the loop with scripted replies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from testbed.metacontroller.apply import Applied
from testbed.metacontroller.loop import DelayedAdd, MetacontrollerStandIn, SyncRecord


def test_a_second_add_after_keeps_the_earlier_ready_time() -> None:
    entry = DelayedAdd()
    entry.add_after(10.0, 1.0)
    entry.add_after(10.5, 30.0)  # a later reply asks for a long resync: ignored
    assert entry.ready_at == 11.0
    entry.add_after(10.6, 0.2)  # an earlier one wins
    assert entry.ready_at == pytest.approx(10.8)


def test_an_entry_fires_once_and_only_when_due() -> None:
    entry = DelayedAdd()
    assert entry.remaining(0.0) is None and not entry.fire(100.0)
    entry.add_after(0.0, 2.0)
    assert entry.remaining(0.5) == 1.5
    assert not entry.fire(1.9), "an event before the entry is due leaves it waiting"
    assert entry.ready_at == 2.0
    assert entry.remaining(3.0) == 0.0
    assert entry.fire(2.0)
    assert entry.ready_at is None and not entry.fire(5.0)
    entry.add_after(5.0, 30.0)  # after it fired, a new AddAfter starts afresh
    assert entry.ready_at == 35.0


class Scripted(MetacontrollerStandIn):
    """The real loop, with each sync's reply taken from a script instead of a hook call."""

    def __init__(self, resyncs: list[float]) -> None:
        super().__init__("http://127.0.0.1:9", world=None, service_name="pg")  # type: ignore[arg-type]
        self.resyncs = resyncs
        self.times: list[float] = []
        self.synced = threading.Condition()

    def _customize(self) -> None:
        return None

    def sync_once(self) -> SyncRecord:
        now = time.monotonic()
        resync = self.resyncs[min(len(self.times), len(self.resyncs) - 1)]
        with self.synced:
            self.times.append(now)
            self.synced.notify_all()
        applied = Applied(resync, (), (), (), status_changed=False, finalized=False)
        return SyncRecord(now, now, 200, None, "LeaderFound", (), resync, True, applied)

    def wait_syncs(self, count: int, timeout: float = 5.0) -> list[float]:
        with self.synced:
            assert self.synced.wait_for(lambda: len(self.times) >= count, timeout), self.times
            return list(self.times)


#: The scripted replies: the first asks for a resync after SHORT s, every later one after
#: LONG s. The bounds below come from these two, not from guessed slack: a resync that the
#: event postponed would come LONG s after its sync, one that was kept comes SHORT s after the
#: first; the event comes EVENT_AT s in, well before the SHORT entry is due.
SHORT, LONG, EVENT_AT = 1.0, 30.0, 0.2


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    # Replies: SHORT, then LONG (the event-triggered sync's reply), then LONG.
    loop = Scripted([SHORT, LONG, LONG])
    loop.start()
    try:
        yield loop
    finally:
        loop.stop()


def test_an_event_sync_does_not_postpone_a_waiting_resync(scripted: Scripted) -> None:
    """Reply 1 asks for SHORT s; an event EVENT_AT s later brings sync 2, whose reply asks for
    LONG s. Metacontroller still syncs at SHORT s (the earlier readyAt is kept); the old
    stand-in waited LONG s."""
    first = scripted.wait_syncs(1)[0]
    time.sleep(EVENT_AT)
    scripted.trigger()
    times = scripted.wait_syncs(3, timeout=LONG / 2)
    assert times[1] - first < SHORT, "the event synced at once, before the entry was due"
    resync = times[2] - first
    # (a timed wait may wake a few ms early; the entry fires then all the same)
    assert SHORT - 0.05 <= resync < LONG / 2, f"the first resync came {resync:.2f} s after"
    time.sleep(0.5)
    assert len(scripted.times) == 3, "then nothing until the LONG entry: it fired once"
    assert scripted.scheduled.ready_at is not None
    assert scripted.scheduled.ready_at - times[2] == pytest.approx(LONG, abs=0.01)
