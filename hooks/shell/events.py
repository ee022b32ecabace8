"""Kubernetes Events on the PostgreSQLCluster (opt-in: ``PGFH_EMIT_EVENTS=true``).

Two rules keep Events from ever hurting a sync:

* **best effort**: an Event is handed to one background thread with a small bounded
  queue; the sync reply never waits for the API server, and a full queue or an API
  error only drops the Event (and logs it);
* **de-duplicated across hook replicas without shared state**: the trigger is a
  *transition* visible in the parent's own status (the decision differs from the
  ``Ready`` reason recorded there), and the Event's name is derived from the parent's
  UID, the transition and the previous condition's ``lastTransitionTime``. Two replicas
  that see the same transition (a retried sync, a stale cache) create the same name,
  and the API server refuses the second with 409, which is ignored.

Which Event a reply deserves is decided by the pure :func:`hooks.core.cluster_event.event_for`;
this module only sends it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from hooks.core.cluster_event import ClusterEvent

log = logging.getLogger("hooks.events")

REPORTING_CONTROLLER = "adg.io/pg-failover-hook"


class EventEmitter:
    """Sends Events from one background thread; never blocks or fails the caller."""

    def __init__(
        self,
        api_factory: Callable[[], Any],
        *,
        instance: str,
        clock: Callable[[], datetime],
        max_pending: int = 100,
        timeout: tuple[float, float] = (1.0, 2.0),
    ) -> None:
        self._api_factory = api_factory
        self._api: Any = None
        self._instance = instance
        self._clock = clock
        self._timeout = timeout
        self._pending = threading.BoundedSemaphore(max_pending)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k8s-events")

    def emit(self, event: ClusterEvent) -> None:
        """Queue ``event``; drop it (with a log line) if the queue is full."""
        if not self._pending.acquire(blocking=False):
            log.warning("event queue full; dropped %s %s", event.reason, event.name)
            return
        try:
            self._executor.submit(self._send, event)
        except RuntimeError:  # shutting down
            self._pending.release()

    def close(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    def _send(self, event: ClusterEvent) -> None:
        try:
            from kubernetes.client import EventsV1Event, V1ObjectMeta, V1ObjectReference
            from kubernetes.client.exceptions import ApiException

            if self._api is None:
                self._api = self._api_factory()
            body = EventsV1Event(
                metadata=V1ObjectMeta(name=event.name, namespace=event.namespace),
                event_time=self._clock(),
                type=event.type,
                reason=event.reason,
                action=event.action,
                note=event.note,
                reporting_controller=REPORTING_CONTROLLER,
                reporting_instance=self._instance,
                regarding=V1ObjectReference(
                    api_version=event.regarding["apiVersion"],
                    kind=event.regarding["kind"],
                    name=event.regarding["name"],
                    namespace=event.regarding["namespace"],
                    uid=event.regarding["uid"],
                ),
            )
            try:
                self._api.create_namespaced_event(
                    event.namespace, body, _request_timeout=self._timeout
                )
                log.info("event %s %s sent", event.reason, event.name)
            except ApiException as error:
                if error.status == 409:
                    log.debug("event %s already recorded by another replica", event.name)
                else:
                    log.warning("event %s not recorded: HTTP %s", event.name, error.status)
        except Exception as error:  # best effort: never let an Event break anything
            log.warning("event %s not recorded: %s", event.name, type(error).__name__)
        finally:
            self._pending.release()


def in_cluster_events_api() -> Any:
    """The events.k8s.io/v1 client with the pod's service account (in-cluster)."""
    from kubernetes import client, config

    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.EventsV1Api()
