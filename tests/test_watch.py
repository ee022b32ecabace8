"""The test bed's one list-and-watch loop (:mod:`testbed.kubernetes.watch`) behaves as
client-go v0.36.3's reflector: its backoff step for step with plain values, its decision
after each way a watch ends, and, against the loopback fake API server
(:mod:`testbed.fakes.kubeapi`), the requests it really sends: a 410 relists after a backoff,
a 429 backs off, is logged and re-watches without a list, refused connections back off up to
the cap and then re-watch from the last resourceVersion, a cleanly closed watch re-watches at
once from the last resourceVersion seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from testbed.fakes.kubeapi import FakeKubeAPI, WatchAnswer, status
from testbed.kubernetes.rest import Credentials, KubeApiError, KubeRest
from testbed.kubernetes.watch import (
    Backoff,
    Next,
    Reflector,
    after_watch,
    is_refused,
    is_too_large_version,
)

PODS = "/api/v1/pods"


# -- the backoff, with plain values ---------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_is_client_gos_without_jitter_doubling_from_800_ms_to_the_30_s_cap() -> None:
    backoff = Backoff(clock=Clock(), rand=lambda: 0.0)
    assert [backoff.step() for _ in range(9)] == [
        0.8,
        1.6,
        3.2,
        6.4,
        12.8,
        25.6,
        30.0,
        30.0,
        30.0,
    ]


def test_backoff_jitter_adds_up_to_the_whole_step_so_a_capped_sleep_is_30_to_60_s() -> None:
    backoff = Backoff(clock=Clock(), rand=lambda: 0.999)
    delays = [backoff.step() for _ in range(10)]
    assert delays[0] == pytest.approx(0.8 * 1.999)
    assert all(30.0 <= d < 60.0 for d in delays[6:])


def test_backoff_resets_to_800_ms_once_2_min_passed_since_the_last_reset() -> None:
    clock = Clock()
    backoff = Backoff(clock=clock, rand=lambda: 0.0)
    assert [backoff.step() for _ in range(3)] == [0.8, 1.6, 3.2]
    clock.now = 120.0  # not more than 2 min: keeps growing
    assert backoff.step() == 6.4
    clock.now = 120.5
    assert backoff.step() == 0.8
    clock.now = 200.0  # 79.5 s after that reset: no reset
    assert backoff.step() == 1.6


# -- the decision after a watch, with plain values ------------------------------------------
def _refused() -> requests.ConnectionError:
    try:
        requests.get("http://127.0.0.1:9/", timeout=2)  # discard: nothing listens on loopback
    except requests.ConnectionError as error:
        return error
    raise AssertionError("something answered on 127.0.0.1:9")


def _api(code: int, reason: str, message: str = "") -> KubeApiError:
    return KubeApiError(code, reason, message, status(code, reason, message))


@pytest.mark.parametrize(
    ("error", "opened", "seconds", "events", "expected"),
    [
        (None, True, 30.0, 0, Next.REWATCH),  # the server's timeoutSeconds
        (None, True, 0.2, 3, Next.REWATCH),
        (None, True, 0.2, 0, Next.BACKOFF_RELIST),  # VeryShortWatchError
        (requests.ConnectionError("reset"), True, 5.0, 1, Next.REWATCH),  # a probable EOF
        (requests.exceptions.ChunkedEncodingError("eof"), True, 5.0, 1, Next.REWATCH),
        (requests.ReadTimeout("read"), True, 40.0, 0, Next.REWATCH),
        (ValueError("not JSON"), True, 5.0, 1, Next.BACKOFF_RELIST),
        (
            _api(410, "Expired", "too old resource version: 1 (5)"),
            True,
            5.0,
            0,
            Next.BACKOFF_RELIST,
        ),
        (_api(410, "Gone", "gone"), False, 0.01, 0, Next.BACKOFF_RELIST),
        (
            _api(429, "TooManyRequests", "storage is (re)initializing"),
            True,
            5.0,
            2,
            Next.BACKOFF_REWATCH,
        ),
        (
            _api(429, "TooManyRequests", "storage is (re)initializing"),
            False,
            0.01,
            0,
            Next.BACKOFF_REWATCH,
        ),
        (_api(500, "InternalError", "boom"), True, 5.0, 0, Next.BACKOFF_RELIST),
        (_api(403, "Forbidden", "no"), False, 0.01, 0, Next.BACKOFF_RELIST),
        (requests.ConnectTimeout("timed out"), False, 30.0, 0, Next.BACKOFF_RELIST),
    ],
)
def test_after_a_watch_the_reflector_does_what_client_go_does(
    error: BaseException | None, opened: bool, seconds: float, events: int, expected: Next
) -> None:
    assert after_watch(error, opened=opened, seconds=seconds, events=events).next is expected


def test_a_refused_watch_request_backs_off_and_rewatches() -> None:
    error = _refused()
    assert is_refused(error)
    assert after_watch(error, opened=False, seconds=0.0, events=0).next is Next.BACKOFF_REWATCH
    assert not is_refused(requests.ConnectTimeout("timed out"))


def test_a_too_large_resource_version_is_recognised_by_cause_or_old_message() -> None:
    by_cause = KubeApiError(
        504,
        "Timeout",
        "Too large resource version: 9, current: 5",
        {"details": {"causes": [{"reason": "ResourceVersionTooLarge"}]}},
    )
    old = KubeApiError(504, "Timeout", "Too large resource version: 9, current: 5", {})
    assert is_too_large_version(by_cause) and is_too_large_version(old)
    assert not is_too_large_version(KubeApiError(504, "Timeout", "slow", {}))


# -- against the loopback fake API server ---------------------------------------------------
class RecordedBackoff(Backoff):
    """Small, jitter-free steps, each one recorded."""

    def __init__(self) -> None:
        super().__init__(0.02, 0.08, reset=1e9, rand=lambda: 0.0)
        self.delays: list[float] = []

    def step(self) -> float:
        delay = super().step()
        self.delays.append(delay)
        return delay


def _pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "db", "uid": name, "resourceVersion": version}}


def _event(kind: str, name: str, version: str) -> dict[str, Any]:
    return {"type": kind, "object": {"kind": "Pod", "apiVersion": "v1", **_pod(name, version)}}


def _error(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"type": "ERROR", "object": status(code, reason, message)}


def _until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def _calls(api: FakeKubeAPI) -> list[tuple[str, str | None]]:
    """Each request as ("list" | "watch", its resourceVersion or None)."""
    calls = []
    for path in list(api.requests):
        query = parse_qs(urlsplit(path).query)
        verb = "watch" if query.get("watch") else "list"
        calls.append((verb, query.get("resourceVersion", [None])[0]))
    return calls


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    server = FakeKubeAPI()
    server.add("pods", _pod("a", "1000"))
    server.start()
    try:
        yield server
    finally:
        server.close()


Events = list[tuple[str, str]]


def _reflector(
    api: FakeKubeAPI, seen: Events, also: Callable[[str, str], None] | None = None
) -> tuple[Reflector, RecordedBackoff]:
    rest = KubeRest(Credentials(api.url, "", token=api.token))
    backoff = RecordedBackoff()

    def on_event(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        seen.append((kind, obj["metadata"]["name"]))
        if also is not None:
            also(kind, obj["metadata"]["name"])

    return Reflector(rest, PODS, on_event, watch_seconds=5, backoff=backoff), backoff


def test_a_410_during_a_watch_relists_after_one_backoff(api: FakeKubeAPI) -> None:
    api.watches = [WatchAnswer(events=(_error(410, "Expired", "too old resource version"),))]
    api.add("pods", _pod("b", "1001"))
    seen: Events = []

    def gone_by_the_relist(kind: str, name: str) -> None:
        if (kind, name) == ("ADDED", "b"):
            api.remove("pods", "db", "b")

    reflector, backoff = _reflector(api, seen, gone_by_the_relist)
    with _running(reflector):
        _until(lambda: reflector.lists == 2, "a relist")
        _until(lambda: len(_calls(api)) >= 4, "the watch after the relist")
    assert _calls(api)[:4] == [
        ("list", "0"),
        ("watch", "424242"),
        ("list", "424242"),  # not older than what was seen
        ("watch", "424242"),
    ]
    assert backoff.delays == [0.02], "client-go backs off before it relists"
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "b"), ("MODIFIED", "a")]


def test_a_list_refused_as_expired_is_retried_at_once_from_the_latest(api: FakeKubeAPI) -> None:
    api.watches = [WatchAnswer(events=(_error(410, "Expired", "too old resource version"),))]
    seen: Events = []
    reflector, backoff = _reflector(api, seen)
    with _running(reflector):
        _until(lambda: len(_calls(api)) >= 2, "the first watch")
        api.list_answers = [(410, status(410, "Expired", "too old resource version"))]
        _until(lambda: reflector.lists == 2, "a relist")
    assert _calls(api)[2:4] == [("list", "424242"), ("list", None)]
    assert backoff.delays == [0.02]


@pytest.mark.parametrize("during", [True, False], ids=["during-the-watch", "the-watch-request"])
def test_a_429_backs_off_is_logged_and_rewatches_without_a_list(
    api: FakeKubeAPI, caplog: pytest.LogCaptureFixture, during: bool
) -> None:
    too_many = status(429, "TooManyRequests", "storage is (re)initializing")
    first = WatchAnswer(events=(_event("MODIFIED", "a", "1001"),))
    api.watches = [
        WatchAnswer(events=(_event("MODIFIED", "a", "1001"), {"type": "ERROR", "object": too_many}))
        if during
        else first,
        *([] if during else [WatchAnswer(429, too_many)]),
    ]
    caplog.set_level(logging.DEBUG, logger="testbed.watch")
    seen: Events = []
    reflector, backoff = _reflector(api, seen)
    with _running(reflector):
        _until(lambda: len(_calls(api)) >= (3 if during else 4), "the re-watch")
    calls = _calls(api)
    assert calls[0] == ("list", "0") and calls[1:] == [("watch", "424242")] + [
        ("watch", "1001")
    ] * (len(calls) - 2)
    assert backoff.delays == [0.02]
    logged = [r for r in caplog.records if r.name == "testbed.watch" and "429" in r.getMessage()]
    assert logged, "the 429 is not logged"
    assert logged[0].levelno == (logging.INFO if during else logging.DEBUG)


def test_refused_connections_back_off_up_to_the_cap_then_rewatch_from_the_last_version(
    api: FakeKubeAPI,
) -> None:
    api.watches = [WatchAnswer(events=(_event("MODIFIED", "a", "1003"),), hold=True)]
    seen: Events = []
    reflector, backoff = _reflector(api, seen)
    with _running(reflector):
        _until(lambda: seen[-1:] == [("MODIFIED", "a")], "the first event")
        api.close()  # the server goes away: the watch ends, every connection is refused
        _until(lambda: len(backoff.delays) >= 6, "six refused watches")
        again = FakeKubeAPI(port=api.port)
        again.add("pods", _pod("a", "1003"))
        again.start()
        try:
            _until(lambda: again.requests, "a request to the restarted server")
            calls = _calls(again)
        finally:
            again.close()
    assert backoff.delays[:6] == [0.02, 0.04, 0.08, 0.08, 0.08, 0.08]
    assert max(backoff.delays) == 0.08, "a delay beyond the cap"
    assert calls[0] == ("watch", "1003"), "not a re-watch from the last resourceVersion"
    assert reflector.lists == 1


def test_a_cleanly_closed_watch_rewatches_at_once_from_the_last_version(api: FakeKubeAPI) -> None:
    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "metadata": {"resourceVersion": "1007"}},
    }
    api.watches = [WatchAnswer(events=(_event("MODIFIED", "a", "1004"), bookmark))]
    seen: Events = []
    reflector, backoff = _reflector(api, seen)
    with _running(reflector):
        _until(lambda: len(_calls(api)) >= 3, "the re-watch")
    assert _calls(api)[:3] == [("list", "0"), ("watch", "424242"), ("watch", "1007")]
    assert backoff.delays == [], "a clean close is not backed off"
    assert reflector.lists == 1
    assert seen == [("ADDED", "a"), ("MODIFIED", "a")]


class _running:
    """The reflector started for the block and stopped however it ends."""

    def __init__(self, reflector: Reflector) -> None:
        self.reflector = reflector

    def __enter__(self) -> Reflector:
        return self.reflector.start()

    def __exit__(self, *exc: object) -> None:
        self.reflector.stop()
