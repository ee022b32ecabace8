"""The Metacontroller stand-in against the real API server: one CompositeController, for real.

A DEVELOPMENT STAND-IN for the tests and the demo (production runs real Metacontroller, and
:mod:`testbed.metacontroller.metacontroller_binary` runs a real binary here instead when one is
given). It reads the CompositeController from the server, then does what Metacontroller
v4.17.2 does for it (``pkg/controller/composite/controller.go`` ``syncParentObject``), with any
kubeconfig (the admin's, or the ``metacontroller`` ServiceAccount's):

* lists and watches the parents, every declared child type and every related type
  (:class:`testbed.kubernetes.watch.Reflector`: client-go's list-and-watch and its backoff);
* calls ``/customize`` once per parent and generation (cached 20 minutes, as
  ``newResponseCache``) to learn the related resources (:mod:`testbed.metacontroller.kube_hooks`);
* for each queued parent: adds the finalizer ``metacontroller.io/compositecontroller-<name>``
  (a finalize hook exists), claims its children (:mod:`testbed.metacontroller.kube_claim`:
  controller reference to the parent and the
  ``controller-uid`` label of ``generateSelector``: adopting matching orphans, releasing
  owned objects that no longer match), and POSTs the sync (or, once it is being deleted,
  finalize) request in the fixtures' shape: ``controller``, ``parent``, ``children`` keyed
  ``Service.v1`` etc. then by name (every declared type present, empty or not), ``related``
  keyed likewise, ``finalizing``, every object as the server returned it (managedFields and
  all);
* a non-200, a transport error or a reply that strict unmarshalling refuses changes nothing
  and requeues with ``AddRateLimited`` (:class:`testbed.metacontroller.workqueue.WorkQueue` with
  client-go's ``DefaultTypedControllerRateLimiter``, :mod:`testbed.metacontroller.ratelimit`:
  5 ms doubling per parent up to 1000 s, and a 10/s burst-100 bucket, the longer of the two); a
  successful sync ``Forget``s the parent's count; a 429 with a positive ``Retry-After``
  requeues after it, neither counted nor forgotten;
* applies an accepted reply (:mod:`testbed.metacontroller.kube_apply`): namespaces defaulted, the
  ``controller-uid`` label added and checked, ``resyncAfterSeconds`` scheduled,
  ``finalized: true`` removes the finalizer, then children managed (deletes first, UID
  precondition), then the status written through the subresource only when it changed;
* queues a parent (``Add``, never rate limited) on its own events, on events of children
  whose controller it is (and of orphans its selector matches), on related objects its rules
  match, every ``--cache-flush-interval`` (30 min) and, if the CompositeController sets
  ``resyncPeriodSeconds`` (0 included: raised to 1 s), on a ticker of that period when it is
  shorter than the cache flush (:func:`resync_periods`).

Where it differs from Metacontroller (beyond :mod:`testbed.metacontroller.kube_apply` and
:mod:`testbed.kubernetes.watch`): hook ``version: v1`` only; webhook ``url`` only (no
``service`` + ``path``), no ``etag``, mTLS or basic auth (the bearer token of a matching
``endpointConfigs`` entry is read from its Secret, as 4.16+ does); ``responseUnMarshallMode``
is always strict; ``parentResource.labelSelector`` is checked when a parent is synced, not
also when it is enqueued; no ``ignoreStatusChanges``; no Events
(``SyncError``), metrics or leader election (below); no client-go REST rate limit
(``--client-go-qps``/``--client-go-burst``); the cache flush resyncs the parents from the
cache without re-listing them from the server; a related event walks only the parents
whose customize answer is cached (Metacontroller would call customize from the event
handler); the bearer token's Secret is read from the API server for every hook call
(Metacontroller reads it once, when it builds the controller), so while the API server is
unreachable the stand-in cannot call the hook at all, where Metacontroller would call it
and fail at the write: either way nothing changes until the server is back; the
``controller`` object is the server's, plus the ``status: {}`` and
``statusChecks: {}`` that Metacontroller's typed struct always serialises.

Leader election is not this class's: with ``replicas`` the rig runs each replica as a
:class:`testbed.metacontroller.metacontroller_replica.StandinReplica`, which starts this class
only while it leads (how that differs from Metacontroller: that module's docstring).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests

from testbed.kubernetes.rest import KubeApiError, KubeRest, group_version_path, resource_path
from testbed.kubernetes.watch import Reflector, object_key
from testbed.metacontroller.apply import HookError, check_reply
from testbed.metacontroller.dynamic_apply import group_key
from testbed.metacontroller.kube_apply import (
    ChildType,
    Managed,
    manage_children,
    set_finalizer,
    should_manage,
    write_status,
)
from testbed.metacontroller.kube_claim import (
    claim,
    controller_ref_of,
    create_undeclared,
    desired_children,
    rule_gvr,
    rule_matches,
    selector_of,
)
from testbed.metacontroller.kube_hooks import HookClient, retry_after
from testbed.metacontroller.kube_records import KubeSyncRecord
from testbed.metacontroller.selectors import matches
from testbed.metacontroller.workqueue import WorkQueue

LOG = logging.getLogger("standin.kube")
CC_PATH = "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers"
FINALIZER_PREFIX = "metacontroller.io/compositecontroller-"
#: ``--cache-flush-interval`` (deploy/metacontroller-values.yaml, Metacontroller's default).
CACHE_FLUSH = 30 * 60.0


def _unchanged(kind: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """An update event without a new resourceVersion (a re-list's resync): ignored, as
    Metacontroller ignores resync events of children and related objects."""
    if kind != "MODIFIED" or old is None:
        return False
    version = obj["metadata"].get("resourceVersion")
    return bool(old["metadata"].get("resourceVersion") == version)


def resync_periods(resync_period_seconds: object, cache_flush: float) -> list[float]:
    """The periods at which every parent is enqueued, as Metacontroller v4.17.2 sets them up:
    the shared informer's own resync at ``--cache-flush-interval`` (client-go's resync of
    the store, delivered to every handler: ``pkg/dynamic/informer/informer.go``
    ``newSharedResourceInformer``), and, when ``resyncPeriodSeconds`` is set (``0``
    included), a ticker of its own for the parent handler, raised to 1 s when below
    (``pkg/controller/composite/controller.go`` ``Start``), and started only when shorter
    than the cache flush (``sharedEventHandler.addHandler``)."""
    periods = [cache_flush]
    if resync_period_seconds is not None:
        if not isinstance(resync_period_seconds, int):
            raise ValueError(f"resyncPeriodSeconds {resync_period_seconds!r} is not an integer")
        period = max(1.0, float(resync_period_seconds))
        if period < cache_flush:
            periods.append(period)
    return periods


class KubeMetacontroller:
    """Runs the CompositeController ``name`` against the API server of ``kubeconfig``."""

    def __init__(
        self,
        kubeconfig: Path,
        name: str = "pg-failover-hook",
        *,
        workers: int = 5,
        cache_flush: float = CACHE_FLUSH,
        watch_seconds: int = 30,
        on_record: Callable[[KubeSyncRecord], None] | None = None,
    ) -> None:
        self.rest = KubeRest.from_kubeconfig(kubeconfig)
        self.name = name
        self.finalizer = FINALIZER_PREFIX + name
        self.workers = workers
        self.watch_seconds = watch_seconds
        self.on_record = on_record
        self.cache_flush = cache_flush
        self.queue = WorkQueue()
        #: When each resync tick enqueued every parent (monotonic; for tests).
        self.resyncs: list[float] = []
        self.records: list[KubeSyncRecord] = []
        #: The last sync or finalize request sent for each parent (for tests).
        self.last_requests: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._related: dict[str, Reflector] = {}
        self._kinds: dict[tuple[str, str], str] = {}
        self.hooks = HookClient(self.rest)
        self.controller: dict[str, Any] = {}
        self.child_types: dict[str, ChildType] = {}
        self.children: dict[str, Reflector] = {}
        self.parents: Reflector | None = None

    @property
    def customize_calls(self) -> int:
        """Customize hook calls made (for tests)."""
        return self.hooks.customize_calls

    # -- life cycle ------------------------------------------------------------------------
    def start(self, sync_timeout: float = 30.0) -> KubeMetacontroller:
        controller = self.rest.get(f"{CC_PATH}/{self.name}")
        controller.setdefault("status", {})
        spec = controller["spec"]
        for child in spec.get("childResources") or []:
            child.setdefault("updateStrategy", {}).setdefault("statusChecks", {})
        self.controller = controller
        self.hooks.controller = controller
        parent = spec["parentResource"]
        self.parent_api = str(parent["apiVersion"])
        self.parent_resource = str(parent["resource"])
        self.parent_kind = self.kind_of(self.parent_api, self.parent_resource)
        for child in spec.get("childResources") or []:
            kind = self.kind_of(child["apiVersion"], child["resource"])
            key = group_key(child["apiVersion"], kind)
            method = (child.get("updateStrategy") or {}).get("method") or "OnDelete"
            self.child_types[key] = ChildType(
                key, child["apiVersion"], child["resource"], kind, method
            )
        self.parents = Reflector(
            self.rest,
            resource_path(self.parent_api, self.parent_resource),
            self._on_parent,
            watch_seconds=self.watch_seconds,
            name="parents",
        )
        for key, child_type in self.child_types.items():
            self.children[key] = Reflector(
                self.rest,
                resource_path(child_type.api_version, child_type.resource),
                self._on_child,
                watch_seconds=self.watch_seconds,
                name=key,
            )
        for reflector in [*self.children.values(), self.parents]:
            reflector.start()
        for reflector in [*self.children.values(), self.parents]:
            if not reflector.wait_synced(sync_timeout):
                self.stop()
                raise TimeoutError(f"the informer for {reflector.path} did not sync")
        for index in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"mc-worker-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for period in resync_periods(spec.get("resyncPeriodSeconds"), self.cache_flush):
            thread = threading.Thread(target=self._resync, args=(period,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()
        reflectors = [*self.children.values(), *self._related.values()]
        if self.parents is not None:
            reflectors.append(self.parents)
        for reflector in reflectors:
            reflector.signal_stop()
        for thread in self._threads:
            thread.join(timeout=15)
        for reflector in reflectors:
            reflector.stop()
        self.hooks.close()
        self.rest.close()

    def __enter__(self) -> KubeMetacontroller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kind_of(self, api_version: str, resource: str) -> str:
        """The kind of a resource, from the API server's discovery document."""
        known = self._kinds.get((api_version, resource))
        if known is not None:
            return known
        for entry in self.rest.get(group_version_path(api_version)).get("resources") or []:
            if entry.get("name") == resource:
                self._kinds[(api_version, resource)] = str(entry["kind"])
                return str(entry["kind"])
        raise KubeApiError(404, "NotFound", f"no resource {resource} in {api_version}")

    # -- events ----------------------------------------------------------------------------
    def _on_parent(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.queue.add(object_key(obj))

    def _on_child(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if _unchanged(kind, obj, old):
            return
        for candidate in (obj, old):
            if candidate is None:
                continue
            meta = candidate["metadata"]
            ref = controller_ref_of(candidate)
            if ref is not None:
                if (
                    ref.get("kind") == self.parent_kind
                    and str(ref.get("apiVersion", "")).split("/")[0]
                    == self.parent_api.split("/")[0]
                ):
                    self.queue.add(f"{meta.get('namespace')}/{ref['name']}")
                continue
            for parent in self._parents():  # an orphan: every parent whose selector matches
                if parent["metadata"].get("namespace") == meta.get("namespace") and matches(
                    selector_of(self.controller, parent), meta.get("labels")
                ):
                    self.queue.add(object_key(parent))

    def _on_related(self, gvr: str) -> Callable[[str, dict[str, Any], dict[str, Any] | None], None]:
        def handler(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            if _unchanged(kind, obj, old):
                return
            for parent in self._parents():
                rules = self.hooks.cached_rules(parent)
                if rules is None:
                    continue
                for candidate in (obj, old):
                    if candidate is not None and any(
                        rule_gvr(r) == gvr and rule_matches(r, parent, candidate) for r in rules
                    ):
                        self.queue.add(object_key(parent))

        return handler

    def _resync(self, period: float) -> None:
        """A ticker (Go's ``time.NewTicker``: every ``period`` from the start, not from the
        last tick's end) that ``Add``s every parent in the cache, as ``eventHandler.resync``
        does: no rate limiter, no ``Forget``."""
        started = time.monotonic()
        ticks = 0
        while True:
            ticks += 1
            if self._stop.wait(max(0.0, started + ticks * period - time.monotonic())):
                return
            self.resyncs.append(time.monotonic())
            for parent in self._parents():
                self.queue.add(object_key(parent))

    def _parents(self) -> list[dict[str, Any]]:
        return self.parents.items() if self.parents is not None else []

    # -- the worker ------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=0.5)
            if key is None:
                continue
            try:
                delay = self.sync(key)
            except Exception as error:  # a sync error: back off, as processNextWorkItem
                LOG.warning("sync %s failed: %s", key, error)
                self.queue.add_rate_limited(key)
            else:
                if delay is not None:
                    self.queue.add_after(key, delay)  # 429 Retry-After, no backoff growth
                else:
                    self.queue.forget(key)
            finally:
                self.queue.done(key)

    def sync(self, key: str) -> float | None:
        """``syncParentObject`` for the parent ``key``; raises on any error (the caller backs
        off); returns a delay to requeue after (a 429's Retry-After) or ``None``."""
        assert self.parents is not None
        parent = self.parents.get(key)
        if parent is None:
            return None  # deleted
        meta = parent["metadata"]
        path = resource_path(self.parent_api, self.parent_resource, meta["namespace"], meta["name"])
        hooks = self.controller["spec"].get("hooks") or {}
        deleting = bool(meta.get("deletionTimestamp"))
        finalizers = meta.get("finalizers") or []
        selector = (self.controller["spec"].get("parentResource") or {}).get("labelSelector")
        if (
            selector is not None
            and self.finalizer not in finalizers
            and not matches(selector, meta.get("labels"))
        ):
            return None  # not this controller's (composite/controller.go 627-629, 643)
        if "finalize" in hooks and not deleting and self.finalizer not in finalizers:
            live = set_finalizer(self.rest, path, self.finalizer, True)
            if live is None:
                return None
            parent = live  # the live object returned by that update
        if deleting and self.finalizer not in finalizers:
            return None  # nothing of ours holds it: it is going away
        observed = claim(self.rest, self.controller, self.child_types, self.children, parent, path)
        rules = self.hooks.rules(parent)
        related = self._related_objects(parent, rules)
        finalizing = deleting and "finalize" in hooks
        hook = "finalize" if finalizing else "sync"
        body = {
            "controller": self.controller,
            "parent": parent,
            "children": observed,
            "related": related,
            "finalizing": finalizing,
        }
        with self._lock:
            self.last_requests[key] = body
        started = time.monotonic()
        response: requests.Response | None = None
        try:
            response = self.hooks.call(hooks[hook]["webhook"], body)
            replied = time.monotonic()
            if response.status_code == 429:
                delay = retry_after(response.headers.get("Retry-After"))
                self._record(key, hook, started, response.status_code, "429 Too Many Requests")
                return delay
            reply = check_reply(response.status_code, response.content)
            desired = desired_children(self.controller, self.child_types, parent, reply)
        except (requests.RequestException, HookError) as error:
            status = response.status_code if response is not None else None
            self._record(key, hook, started, status, f"{type(error).__name__}: {error}")
            raise
        resync = reply.get("resyncAfterSeconds")
        resync_after = float(resync) if resync and resync > 0 else None
        if resync_after is not None:
            self.queue.add_after(key, resync_after)
        finalized = bool(reply.get("finalized"))
        if finalized:
            live = set_finalizer(self.rest, path, self.finalizer, False)
            if live is not None:
                parent = live
            else:
                parent["metadata"]["finalizers"] = [
                    f for f in parent["metadata"].get("finalizers") or [] if f != self.finalizer
                ]
        managed = Managed()
        if should_manage(parent, self.finalizer):
            declared = {k: v for k, v in desired.items() if k in self.child_types}
            managed = manage_children(self.rest, self.child_types, parent, observed, declared)
            for key_, objects in desired.items():  # undeclared: created, never observed
                if key_ not in self.child_types:
                    for obj in objects.values():
                        create_undeclared(self.rest, obj, parent, managed)
        written = write_status(self.rest, path, reply.get("status"))
        failed = "; ".join(managed.errors) or None
        self._record(
            key,
            hook,
            started,
            response.status_code,
            failed,
            managed,
            written is not None,
            finalized,
            resync_after,
            reply,
            replied,
        )
        if failed:
            raise RuntimeError(failed)
        return None

    def _record(
        self,
        key: str,
        hook: str,
        started: float,
        status: int | None,
        error: str | None,
        managed: Managed | None = None,
        status_written: bool = False,
        finalized: bool = False,
        resync_after: float | None = None,
        reply: Mapping[str, Any] | None = None,
        replied: float | None = None,
    ) -> None:
        record = KubeSyncRecord.of(
            key,
            hook,
            started,
            status,
            error,
            managed or Managed(),
            status_written=status_written,
            finalized=finalized,
            resync_after=resync_after,
            reply=reply,
            replied=replied,
        )
        with self._lock:
            self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    # -- related objects -------------------------------------------------------------------
    def _related_objects(
        self, parent: dict[str, Any], rules: list[dict[str, Any]]
    ) -> dict[str, dict[str, dict[str, Any]]]:
        related: dict[str, dict[str, dict[str, Any]]] = {}
        for rule in rules:
            namespace = rule.get("namespace")
            if namespace and namespace != parent["metadata"]["namespace"]:
                raise HookError(
                    f"related rule namespace {namespace!r} is not the parent's (hook v1)"
                )
            if rule.get("names") and (rule.get("labelSelector") or rule.get("namespaceSelector")):
                raise HookError("a related rule cannot combine names with a selector")
            gvr = rule_gvr(rule)
            reflector = self._related_informer(gvr, str(rule["apiVersion"]), str(rule["resource"]))
            if not reflector.synced.is_set():
                raise HookError(f"related informer for {gvr} not synced yet")
            kind = self.kind_of(str(rule["apiVersion"]), str(rule["resource"]))
            group = related.setdefault(group_key(str(rule["apiVersion"]), kind), {})
            for obj in reflector.items():
                if rule_matches(rule, parent, obj):
                    group[obj["metadata"]["name"]] = obj
        return related

    def _related_informer(self, gvr: str, api_version: str, resource: str) -> Reflector:
        with self._lock:
            reflector = self._related.get(gvr)
            if reflector is None:
                reflector = Reflector(
                    self.rest,
                    resource_path(api_version, resource),
                    self._on_related(gvr),
                    watch_seconds=self.watch_seconds,
                    name=gvr,
                ).start()
                self._related[gvr] = reflector
        reflector.wait_synced(5.0)
        return reflector
