"""List and watch one resource as client-go's reflector does, into an informer's cache.

The test bed's one watch-reconnect loop: the Metacontroller stand-in's informers
(:mod:`testbed.metacontroller.kube`), the kubelet stand-in (:mod:`testbed.kubernetes.kubelet`)
and the rig's witnesses all use :class:`Reflector`, so a fault of the API server (a restart,
a compaction, a 429) reaches each of them the way it reaches a client-go controller
(Metacontroller, kube-controller-manager, a kubelet). Two hand-written loops had drifted apart
(one relisted at once on a 410, the other backed off first; only one logged 429s); this one
follows client-go v0.36.3 (``/root/go/pkg/mod/k8s.io/client-go@v0.36.3``, cited as
``reflector.go:LINE`` for ``tools/cache/reflector.go``; apimachinery v0.36.3's
``pkg/util/wait`` as ``wait/FILE:LINE``):

* **Between ListAndWatch attempts, always a backoff** (``RunWithContext``, reflector.go:428:
  ``delayHandler.Until(ctx, immediate=true, sliding=true, ...)``, wait/loop.go:37-95): the
  delay follows the reflector's own ``wait.Backoff`` (reflector.go:57-67, built at 317-336):
  800 ms, factor 2, jitter 1.0 (each delay ``d`` becomes ``d + rand*d``, wait/wait.go:92-98,
  wait/backoff.go:98-126), cap 30 s (so a capped sleep lasts 30-60 s), reset to 800 ms once
  more than 2 min have passed since the last reset (``DelayWithReset``, wait/backoff.go:135;
  ``backoffManager.Step`` 292-304). :class:`Backoff` is that, step for step.
* **A list** first (reflector.go:674): from resourceVersion ``"0"`` the first time (the watch
  cache may answer), then from the last resourceVersion seen, and, when that list is refused
  as expired (410) or too large a version, at once again from ``""`` (a quorum read,
  reflector.go:720-728 and 1116-1145). A list that fails otherwise ends the attempt.
* **Then watches** from the last resourceVersion, each bounded by ``timeoutSeconds``
  (reflector.go:561-668). A watch whose stream ends cleanly (or whose connection drops: the
  stream watcher treats a probable EOF or a timeout as the end, apimachinery
  ``pkg/watch/streamwatcher.go:117-126``) is re-opened at once from the last
  resourceVersion, unless it lasted under 1 s with no event (``VeryShortWatchError``,
  reflector.go:1090), which ends the attempt. A watch **request** refused (connection
  refused) or answered 429 backs off and re-watches from the same resourceVersion without a
  list (``isWatchErrorRetriable``, reflector.go:607-615, 1195-1204). A 429 **during** a watch
  is logged ("watch returned 429 - backing off", V(2)) and likewise backs off and re-watches
  (reflector.go:652-658). An expired resourceVersion (410 Gone / ``Expired``: "too old
  resource version"; ``isExpiredError``, reflector.go:1154-1160) ends the attempt, so the
  relist comes **after** the backoff (reflector.go:647-651 then 428); so does any other
  error (logged: "watch ended with error", reflector.go:663-664).
* **The handlers** as a shared informer calls them: a list replaces the cache; an object the
  cache had is reported ``MODIFIED`` with its old version (``OnUpdate``; its resourceVersion
  unchanged: a resync), a new one ``ADDED``, one gone from the list ``DELETED`` (the
  ``DeletedFinalStateUnknown`` of ``DeltaFIFO.Replace``, tools/cache/delta_fifo.go:661;
  ``processDeltas``, tools/cache/controller.go:607-650).

klog's levels map to logging's: ``Info`` (V(0)) and ``HandleError`` to WARNING, V(1)-V(2) to
INFO, V(3) and above to DEBUG.

Where it differs from client-go: ``timeoutSeconds`` is the caller's ``watch_seconds`` (30 s by
default; client-go draws 5-10 min, reflector.go:588), lists are not paginated, no watch-list
streaming (``useWatchList``), no periodic resync of the handlers, no retry of internal errors
(client-go's ``MaxInternalErrorRetryDuration`` is 0 by default, so it has none either), and an
object's key is ``namespace/name`` without indexers.
"""

from __future__ import annotations

import copy
import enum
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

from testbed.kubernetes.rest import KubeApiError, KubeRest, abort

LOG = logging.getLogger("testbed.watch")

#: client-go's reflector backoff (reflector.go:62-67).
BACKOFF_INITIAL = 0.8
BACKOFF_CAP = 30.0
BACKOFF_FACTOR = 2.0
BACKOFF_JITTER = 1.0
BACKOFF_RESET = 120.0
#: A watch that ends sooner than this without an event is an error (reflector.go:1090).
VERY_SHORT_WATCH = 1.0

Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], None]


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` (``name`` for a cluster-scoped object), the informer's key."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Backoff:
    """``wait.Backoff{Duration, Cap, Steps: ceil(Cap/Duration), Factor, Jitter}`` with
    ``DelayWithReset(clock, reset)``: :meth:`step` is the next delay. Thread-safe (one
    reflector's loop calls it; tests hand a :class:`Backoff` with small values and a
    fixed ``rand``)."""

    def __init__(
        self,
        initial: float = BACKOFF_INITIAL,
        cap: float = BACKOFF_CAP,
        factor: float = BACKOFF_FACTOR,
        jitter: float = BACKOFF_JITTER,
        reset: float = BACKOFF_RESET,
        *,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.initial, self.cap, self.factor, self.jitter, self.reset = (
            initial,
            cap,
            factor,
            jitter,
            reset,
        )
        self.clock, self.rand = clock, rand
        self._lock = threading.Lock()
        self._duration, self._steps = initial, math.ceil(cap / initial)
        self._last_start = clock()

    def step(self) -> float:
        with self._lock:
            now = self.clock()
            if now - self._last_start > self.reset:  # backoffManager.Step
                self._duration, self._steps = self.initial, math.ceil(self.cap / self.initial)
                self._last_start = now
            current = self._duration
            if self._steps >= 1:  # wait.delay: the next step's base, capped
                self._steps -= 1
                following = current * self.factor
                if self.cap > 0 and following > self.cap:
                    following, self._steps = self.cap, 0
                self._duration = following
            return current + self.rand() * self.jitter * current if self.jitter > 0 else current


class Next(enum.Enum):
    """What the reflector does after a watch ended."""

    REWATCH = "re-watch from the last resourceVersion at once"
    BACKOFF_REWATCH = "back off, then re-watch from the last resourceVersion"
    BACKOFF_RELIST = "back off, then list again"


@dataclass(frozen=True)
class Verdict:
    next: Next
    level: int
    message: str


def is_expired(error: BaseException) -> bool:
    """``isExpiredError``: 410 Gone, reason ``Expired`` or ``Gone``."""
    return isinstance(error, KubeApiError) and (
        error.status == 410 or error.reason in ("Expired", "Gone")
    )


def is_too_large_version(error: BaseException) -> bool:
    """``isTooLargeResourceVersionError`` (reflector.go:1162): the cause
    ``ResourceVersionTooLarge``, or (servers before 1.18.6) a timeout saying so."""
    if not isinstance(error, KubeApiError):
        return False
    causes = (error.body.get("details") or {}).get("causes") or []
    if any(c.get("reason") == "ResourceVersionTooLarge" for c in causes):
        return True
    if error.status != 504 and error.reason != "Timeout":
        return False
    return "Too large resource version" in error.message or any(
        c.get("message") == "Too large resource version" for c in causes
    )


def is_refused(error: BaseException) -> bool:
    """``utilnet.IsConnectionRefused``: ECONNREFUSED anywhere in the chain (requests wraps
    urllib3's ``NewConnectionError`` in a ``MaxRetryError`` in a ``ConnectionError``)."""
    seen: set[int] = set()
    stack: list[object] = [error]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        if isinstance(current, ConnectionRefusedError):
            return True
        seen.add(id(current))
        stack += [current.__cause__, current.__context__, getattr(current, "reason", None)]
        stack += list(current.args)
    return False


def is_too_many_requests(error: BaseException) -> bool:
    return isinstance(error, KubeApiError) and error.status == 429


def after_watch(
    error: BaseException | None, *, opened: bool, seconds: float, events: int
) -> Verdict:
    """client-go's decision once a watch ended (reflector.go:600-668, 1090). ``opened``: the
    server answered the watch request with a 2xx; ``error``: what ended it (``None``: the
    stream ended); ``seconds``/``events``: how long it lasted and what it delivered."""
    if not opened and error is not None:
        if is_refused(error) or is_too_many_requests(error):
            return Verdict(Next.BACKOFF_REWATCH, logging.DEBUG, "watch failed - backing off")
        if is_expired(error):
            return Verdict(Next.BACKOFF_RELIST, logging.DEBUG, "watch closed")
        return Verdict(Next.BACKOFF_RELIST, logging.WARNING, "failed to watch")
    if isinstance(error, KubeApiError):  # an ERROR event
        if is_expired(error):
            return Verdict(Next.BACKOFF_RELIST, logging.DEBUG, "watch closed")
        if is_too_many_requests(error):
            return Verdict(Next.BACKOFF_REWATCH, logging.INFO, "watch returned 429 - backing off")
        return Verdict(Next.BACKOFF_RELIST, logging.WARNING, "watch ended with error")
    if error is not None and not isinstance(error, requests.RequestException):
        # an event that does not decode: the stream watcher's Error event
        return Verdict(Next.BACKOFF_RELIST, logging.WARNING, "watch ended with error")
    # the stream ended, or its connection dropped or timed out (a probable EOF)
    if seconds < VERY_SHORT_WATCH and events == 0:
        return Verdict(Next.BACKOFF_RELIST, logging.WARNING, "very short watch")
    return Verdict(Next.REWATCH, logging.DEBUG, "watch closed")


class _Stopped(Exception):
    """The reflector was stopped while it listed or watched."""


class Reflector:
    """Keeps :meth:`items` equal to the server's objects at ``path`` (narrowed by ``params``,
    e.g. a ``fieldSelector``), calling ``on_event(type, object, old)`` from its own thread
    for every change, until :meth:`stop`."""

    def __init__(
        self,
        rest: KubeRest,
        path: str,
        on_event: Handler | None = None,
        *,
        watch_seconds: int = 30,
        name: str = "",
        params: dict[str, str] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.rest = rest
        self.path = path
        self.on_event = on_event
        self.watch_seconds = watch_seconds
        self.name = name or path
        self.params = dict(params or {})
        self.backoff = backoff or Backoff()
        self.synced = threading.Event()
        self._cache: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"reflector-{self.name}", daemon=True
        )
        #: Lists done (the first one plus every re-list).
        self.lists = 0
        #: The resourceVersion the next watch starts from (the last one seen).
        self.resource_version = ""
        self._version_unavailable = False
        self._response: requests.Response | None = None
        #: The open watch's request was answered with a 2xx (set by :meth:`_opened`).
        self._streaming = False

    def start(self) -> Reflector:
        self._thread.start()
        return self

    def signal_stop(self) -> None:
        """Ask the loop to end, without waiting (many reflectors stop together)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop at once: the open watch is aborted rather than waited out (up to
        ``watch_seconds`` on a quiet resource)."""
        self._stop.set()
        abort(self._response)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.watch_seconds + 15)

    def items(self) -> list[dict[str, Any]]:
        """A deep copy of every cached object (handlers may change what they are given)."""
        with self._lock:
            return copy.deepcopy(list(self._cache.values()))

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._cache.get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        """``RunWithContext``: ListAndWatch, then a backoff, for ever."""
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except _Stopped:
                return
            except Exception as error:  # DefaultWatchErrorHandler
                if self._stop.is_set():  # whatever an aborted stream raised: stopping anyway
                    return
                if is_expired(error):
                    LOG.debug("%s: watch closed: %s", self.name, error)
                else:
                    LOG.warning("%s: failed to list or watch %s: %s", self.name, self.path, error)
            if self._stop.wait(self.backoff.step()):
                return

    def _list_and_watch(self) -> None:
        self._list()
        while True:
            if self._stop.is_set():
                raise _Stopped
            started = time.monotonic()
            error: BaseException | None = None
            opened, events = False, 0
            self._streaming = False
            try:
                for event in self.rest.watch(
                    self.path,
                    self.resource_version,
                    self.watch_seconds,
                    opened=self._opened,
                    **self.params,
                ):
                    opened = True
                    if self._stop.is_set():
                        raise _Stopped
                    events += 1
                    self._event(event)
                opened = opened or self._streaming
            except (KubeApiError, requests.RequestException, ValueError) as caught:
                if self._stop.is_set():
                    raise _Stopped from caught
                opened = opened or self._streaming
                error = caught
            if self._stop.is_set():
                raise _Stopped
            verdict = after_watch(
                error, opened=opened, seconds=time.monotonic() - started, events=events
            )
            LOG.log(verdict.level, "%s: %s: %s", self.name, verdict.message, error or "")
            if verdict.next is Next.REWATCH:
                continue
            if verdict.next is Next.BACKOFF_REWATCH:
                if self._stop.wait(self.backoff.step()):
                    raise _Stopped
                continue
            return  # BACKOFF_RELIST: the backoff of _run, then a list

    def _opened(self, response: requests.Response) -> None:
        self._response = response
        self._streaming = response.status_code < 300
        if self._stop.is_set():  # stopped while the watch was being opened
            abort(response)

    def _list(self) -> None:
        """``list``: from "0", then the last version; an expired or too large one: from ""."""
        version = "" if self._version_unavailable else (self.resource_version or "0")
        try:
            listed = self._get(version)
        except KubeApiError as error:
            if not (is_expired(error) or is_too_large_version(error)):
                raise
            self._version_unavailable = True
            listed = self._get("")
        self._version_unavailable = False
        self._replace(listed.get("items") or [])
        self.resource_version = str(listed["metadata"]["resourceVersion"])

    def _get(self, version: str) -> dict[str, Any]:
        params = dict(self.params)
        if version:
            params["resourceVersion"] = version
        return self.rest.get(self.path, **params)

    def _event(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        kind = str(event.get("type"))
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            key = object_key(obj)
            with self._lock:
                old = self._cache.get(key)
                if kind == "DELETED":
                    self._cache.pop(key, None)
                else:
                    self._cache[key] = obj
            self._notify(kind, obj, old)
        self.resource_version = str(
            (obj.get("metadata") or {}).get("resourceVersion") or self.resource_version
        )

    def _replace(self, items: list[dict[str, Any]]) -> None:
        fresh = {object_key(item): item for item in items}
        with self._lock:
            old, self._cache = self._cache, fresh
        self.lists += 1
        self.synced.set()
        for key, gone in old.items():
            if key not in fresh:
                self._notify("DELETED", gone, gone)
        for key, item in fresh.items():
            self._notify("MODIFIED" if key in old else "ADDED", item, old.get(key))

    def _notify(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(kind, copy.deepcopy(obj), old)
        except Exception:
            LOG.exception("handler of %s failed", self.path)
