"""A small informer: list, then watch one resource across all namespaces, into a cache.

What the stand-in against the real API server (:mod:`testbed.metacontroller.kube`) needs of
client-go's
reflector and informer, on plain JSON (:class:`testbed.kubernetes.rest.KubeRest`): a list that fills
the cache and marks it synced, then watches from the list's resourceVersion, each bounded by
``watch_seconds`` (the server's ``timeoutSeconds``); a 410 Gone (the resourceVersion was
compacted) lists again; a dropped connection or a restarting server reconnects with a
bounded backoff. Every change calls ``on_event(type, object, old)`` from the reflector's own
thread, as an informer's handlers are called.

A restarted API server is what ``tests/test_kube_faults.py`` puts it through: the watch
ends (or is refused) and is retried from the same resourceVersion, which the new server
answers with its events or a 410 (then a list), so the cache catches up as client-go's
does; the retries back off to :data:`RECONNECT_CAP`, not client-go's 30 s.

Where it differs from client-go: a re-list does not synthesise DELETED events for objects
that vanished meanwhile (it replaces the cache and reports every listed object as a
resync), and there is no periodic resync of the handlers.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from typing import Any

import requests

from testbed.kubernetes.rest import KubeApiError, KubeRest, abort

LOG = logging.getLogger("standin.reflector")
RECONNECT_CAP = 2.0

Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], None]


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` (``name`` for a cluster-scoped object), the informer's key."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Reflector:
    """Keeps :meth:`items` equal to the server's objects at ``path``, until :meth:`stop`."""

    def __init__(
        self,
        rest: KubeRest,
        path: str,
        on_event: Handler | None = None,
        *,
        watch_seconds: int = 30,
        name: str = "",
    ) -> None:
        self.rest = rest
        self.path = path
        self.on_event = on_event
        self.watch_seconds = watch_seconds
        self.synced = threading.Event()
        self._cache: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"reflector-{name or path}", daemon=True
        )
        #: Lists done (the first one plus every re-list after a 410 or an error).
        self.lists = 0
        self._response: requests.Response | None = None

    def start(self) -> Reflector:
        self._thread.start()
        return self

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
        backoff = 0.1
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._list()
                for event in self.rest.watch(
                    self.path, version, self.watch_seconds, opened=self._opened
                ):
                    if self._stop.is_set():
                        return
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(str(event["type"]), obj)
                backoff = 0.1
            except KubeApiError as error:
                if error.status == 410:
                    version = ""  # compacted: list again
                    continue
                # 429 "storage is (re)initializing": a CRD's watch cache just after the CRD
                # was established (seen on kube-apiserver 1.36); retried like any other.
                log = LOG.debug if error.status == 429 else LOG.warning
                log("watch %s: %s", self.path, error)
                version = ""
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_CAP)
            except (requests.RequestException, ValueError):
                LOG.debug("watch %s dropped; reconnecting", self.path, exc_info=True)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_CAP)
            except Exception:
                if self._stop.is_set():  # whatever an aborted stream raised: stopping anyway
                    return
                raise

    def _opened(self, response: requests.Response) -> None:
        self._response = response
        if self._stop.is_set():  # stopped while the watch was being opened
            abort(response)

    def _list(self) -> str:
        listed = self.rest.get(self.path)
        items = listed.get("items") or []
        with self._lock:
            old = self._cache
            self._cache = {object_key(item): item for item in items}
        self.lists += 1
        self.synced.set()
        for item in items:
            self._notify("ADDED", item, old.get(object_key(item)))
        return str(listed["metadata"]["resourceVersion"])

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        with self._lock:
            old = self._cache.get(key)
            if kind == "DELETED":
                self._cache.pop(key, None)
            else:
                self._cache[key] = obj
        self._notify(kind, obj, old)

    def _notify(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(kind, copy.deepcopy(obj), old)
        except Exception:
            LOG.exception("handler of %s failed", self.path)
