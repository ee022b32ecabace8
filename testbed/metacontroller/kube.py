"""The Metacontroller stand-in against the real API server: one CompositeController, for real.

A DEVELOPMENT STAND-IN for the tests and the demo (production runs real Metacontroller, and
:mod:`testbed.metacontroller.metacontroller_binary` runs a real binary here instead when one is
given). It
reads the CompositeController from the server, then does what Metacontroller v4.17.2 does
for it (``pkg/controller/composite/controller.go`` ``syncParentObject``), with any
kubeconfig (the admin's, or the ``metacontroller`` ServiceAccount's):

* lists and watches the parents, every declared child type and every related type
  (:class:`testbed.kubernetes.watch.Reflector`: client-go's list-and-watch and its backoff);
* calls ``/customize`` once per parent and generation (cached 20 minutes, as
  ``newResponseCache``) to learn the related resources;
* for each queued parent: adds the finalizer ``metacontroller.io/compositecontroller-<name>``
  (a finalize hook exists), claims its children (controller reference to the parent and the
  ``controller-uid`` label of ``generateSelector``: adopting matching orphans, releasing
  owned objects that no longer match), and POSTs the sync (or, once it is being deleted,
  finalize) request in the fixtures' shape: ``controller``, ``parent``, ``children`` keyed
  ``Service.v1`` etc. then by name (every declared type present, empty or not), ``related``
  keyed likewise, ``finalizing``, every object as the server returned it (managedFields and
  all);
* a non-200, a transport error or a reply that strict unmarshalling refuses changes nothing
  and requeues with ``AddRateLimited`` (:class:`testbed.metacontroller.workqueue.WorkQueue` with
  client-go's
  ``DefaultTypedControllerRateLimiter``, :mod:`testbed.metacontroller.ratelimit`: 5 ms doubling per
  parent
  up to 1000 s, and a 10/s burst-100 bucket for the queue, the longer of the two); a
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
``service`` +
``path``), no ``etag``, mTLS or basic auth (the bearer token of a matching
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
:class:`testbed.metacontroller.metacontroller_replica.StandinReplica` (the communication check, the
Lease of
:mod:`testbed.metacontroller.leader_election`, this class started only while leading, an exit on a
lost
lease) under :class:`testbed.metacontroller.supervisor.Supervisor` (the kubelet's restarts). Where
that
differs from Metacontroller: a replica lives in the test's process, so its "exit" stops its
threads rather than ending a process (a hook call in flight may still complete after the
lease was lost; a real exit cuts it); a standby starts no informers before it leads (the
manager's caches of CompositeControllers are started by Metacontroller before the election;
the stand-in reads the CompositeController when it starts leading); no ``LeaderElection``
Events nor leader metrics; an elector compares the records it reads by value, where client-go
compares raw bytes and does not store its own PUT's bytes (so its next GET restamps the
leader's own observation time: the leader's view only, never a standby's); the supervisor sees
an exit within 0.1 s (the kubelet's PLEG relists every second); a "ready" replica is one past
its communication check (the binary's ``/readyz``, a ping, likewise answers before it leads).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from testbed.kubernetes.rest import KubeApiError, KubeRest, group_version_path, resource_path
from testbed.kubernetes.watch import Reflector, object_key
from testbed.metacontroller.apply import HookError, check_reply
from testbed.metacontroller.dynamic_apply import controller_ref, group_key
from testbed.metacontroller.kube_apply import (
    ChildType,
    Managed,
    create,
    manage_children,
    set_finalizer,
    should_manage,
    write_status,
)
from testbed.metacontroller.selectors import matches
from testbed.metacontroller.workqueue import WorkQueue

LOG = logging.getLogger("standin.kube")
CC_PATH = "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers"
FINALIZER_PREFIX = "metacontroller.io/compositecontroller-"
CUSTOMIZE_TTL = 20 * 60.0
DEFAULT_TIMEOUT = 10.0
#: ``--cache-flush-interval`` (deploy/metacontroller-values.yaml, Metacontroller's default).
CACHE_FLUSH = 30 * 60.0


@dataclass(frozen=True)
class KubeSyncRecord:
    """One hook call as the stand-in saw it (monotonic times; children as ``Kind/name``)."""

    parent: str
    hook: str
    started: float
    finished: float
    http_status: int | None
    error: str | None
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    status_written: bool = False
    finalized: bool = False
    resync_after: float | None = None
    reply: Mapping[str, Any] | None = None
    #: When the hook's answer arrived (before anything of it was applied): what a benchmark
    #: times as "the hook's reply", apart from ``finished`` (after the children and status).
    replied: float | None = None


def _unchanged(kind: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """An update event without a new resourceVersion (a re-list's resync): ignored, as
    Metacontroller ignores resync events of children and related objects."""
    if kind != "MODIFIED" or old is None:
        return False
    version = obj["metadata"].get("resourceVersion")
    return bool(old["metadata"].get("resourceVersion") == version)


def parse_duration(text: str | None) -> float:
    """A Go duration as the CRD's webhook ``timeout`` carries it (``5s``, ``500ms``, ``1m``);
    missing or not positive: Metacontroller's default 10 s."""
    if not text:
        return DEFAULT_TIMEOUT
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
    for unit, factor in units:
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            value = float(text[: -len(unit)]) * factor
            return value if value > 0 else DEFAULT_TIMEOUT
    raise ValueError(f"cannot parse the webhook timeout {text!r}")


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


def retry_after(value: str | None) -> float:
    """Seconds of a ``Retry-After`` header (seconds or an HTTP date); 0 if absent/bad."""
    if not value:
        return 0.0
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return 0.0


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
        self.customize_calls = 0
        #: The last sync or finalize request sent for each parent (for tests).
        self.last_requests: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._customized: dict[tuple[str, int], tuple[float, list[dict[str, Any]]]] = {}
        self._related: dict[str, Reflector] = {}
        self._kinds: dict[tuple[str, str], str] = {}
        self._hook = requests.Session()
        self._hook.trust_env = False
        self.controller: dict[str, Any] = {}
        self.child_types: dict[str, ChildType] = {}
        self.children: dict[str, Reflector] = {}
        self.parents: Reflector | None = None

    # -- life cycle ------------------------------------------------------------------------
    def start(self, sync_timeout: float = 30.0) -> KubeMetacontroller:
        controller = self.rest.get(f"{CC_PATH}/{self.name}")
        controller.setdefault("status", {})
        spec = controller["spec"]
        for child in spec.get("childResources") or []:
            child.setdefault("updateStrategy", {}).setdefault("statusChecks", {})
        self.controller = controller
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
        self._hook.close()
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
            ref = self._controller_ref(candidate)
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
                    self._selector(parent), meta.get("labels")
                ):
                    self.queue.add(object_key(parent))

    def _on_related(self, gvr: str) -> Callable[[str, dict[str, Any], dict[str, Any] | None], None]:
        def handler(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            if _unchanged(kind, obj, old):
                return
            for parent in self._parents():
                rules = self._cached_rules(parent)
                if rules is None:
                    continue
                for candidate in (obj, old):
                    if candidate is not None and any(
                        self._rule_gvr(r) == gvr and self._rule_matches(r, parent, candidate)
                        for r in rules
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
        observed = self._claim(parent)
        rules = self._rules(parent)
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
            response = self._call(hooks[hook]["webhook"], body)
            replied = time.monotonic()
            if response.status_code == 429:
                delay = retry_after(response.headers.get("Retry-After"))
                self._record(key, hook, started, response.status_code, "429 Too Many Requests")
                return delay
            reply = check_reply(response.status_code, response.content)
            desired = self._desired(parent, reply)
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
                        self._create_undeclared(obj, parent, managed)
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
        managed = managed or Managed()
        record = KubeSyncRecord(
            key,
            hook,
            started,
            time.monotonic(),
            status,
            error,
            tuple(managed.created),
            tuple(managed.updated),
            tuple(managed.deleted),
            status_written,
            finalized,
            resync_after,
            reply,
            replied,
        )
        with self._lock:
            self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    # -- hook calls ------------------------------------------------------------------------
    def _call(self, webhook: Mapping[str, Any], body: Mapping[str, Any]) -> requests.Response:
        url = webhook.get("url")
        if not url:
            raise HookError("the stand-in supports webhook.url only")
        return self._hook.post(
            str(url),
            json=body,
            headers=self._auth(str(url)),
            timeout=parse_duration(webhook.get("timeout")),
        )

    def _auth(self, url: str) -> dict[str, str]:
        """The bearer token of the ``endpointConfigs`` entry whose host is the URL's."""
        host = urlsplit(url).netloc
        for entry in self.controller["spec"].get("endpointConfigs") or []:
            if entry.get("host") != host:
                continue
            auth = entry.get("authorization") or {}
            ref = auth.get("secretRef") or {}
            if auth.get("type") != "Bearer" or not ref:
                continue
            secret = self.rest.get(
                resource_path("v1", "secrets", ref.get("namespace"), ref.get("name"))
            )
            token = base64.b64decode((secret.get("data") or {})[ref.get("key", "token")])
            return {"Authorization": f"Bearer {token.decode().strip()}"}
        return {}

    def _rules(self, parent: dict[str, Any]) -> list[dict[str, Any]]:
        cached = self._cached_rules(parent)
        if cached is not None:
            return cached
        hooks = self.controller["spec"].get("hooks") or {}
        rules: list[dict[str, Any]] = []
        if "customize" in hooks:
            response = self._call(
                hooks["customize"]["webhook"], {"controller": self.controller, "parent": parent}
            )
            self.customize_calls += 1
            if response.status_code != 200:
                raise HookError(f"customize: unsupported status code: {response.status_code}")
            answer = response.json()
            unknown = set(answer) - {"relatedResources"}
            if unknown:
                raise HookError(f"customize: unknown field(s) in response: {sorted(unknown)}")
            rules = list(answer.get("relatedResources") or [])
        meta = parent["metadata"]
        with self._lock:
            self._customized[(meta["uid"], int(meta.get("generation") or 0))] = (
                time.monotonic(),
                rules,
            )
        return rules

    def _cached_rules(self, parent: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        meta = parent["metadata"]
        with self._lock:
            entry = self._customized.get((meta["uid"], int(meta.get("generation") or 0)))
        if entry is None or time.monotonic() - entry[0] > CUSTOMIZE_TTL:
            return None
        return entry[1]

    # -- children and related objects ------------------------------------------------------
    @staticmethod
    def _controller_ref(obj: Mapping[str, Any]) -> dict[str, Any] | None:
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("controller"):
                return dict(ref)
        return None

    def _selector(self, parent: Mapping[str, Any]) -> dict[str, Any]:
        if self.controller["spec"].get("generateSelector"):
            return {"matchLabels": {"controller-uid": parent["metadata"]["uid"]}}
        selector = (parent.get("spec") or {}).get("selector") or {}
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            raise HookError(
                ".spec.selector must have either matchLabels, matchExpressions, or both"
            )
        return dict(selector)

    def _claim(self, parent: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
        """``claimChildren``: owned and matching, adopted orphans; owned but not matching
        released. Every declared type is present, empty or not."""
        meta = parent["metadata"]
        selector = self._selector(parent)
        groups: dict[str, dict[str, dict[str, Any]]] = {}
        for key, reflector in sorted(self.children.items()):
            kind = self.child_types[key]
            group: dict[str, dict[str, Any]] = {}
            for obj in reflector.items():
                child_meta = obj["metadata"]
                if child_meta.get("namespace") != meta["namespace"]:
                    continue
                ref = self._controller_ref(obj)
                labelled = matches(selector, child_meta.get("labels"))
                if ref is not None and ref.get("uid") == meta["uid"]:
                    if labelled:
                        group[child_meta["name"]] = obj
                    else:
                        self._set_owner(kind, obj, None)
                elif ref is None and labelled and not child_meta.get("deletionTimestamp"):
                    adopted = self._adopt(kind, obj, parent)
                    if adopted is not None:
                        group[child_meta["name"]] = adopted
            groups[key] = group
        return groups

    def _adopt(
        self, kind: ChildType, obj: dict[str, Any], parent: dict[str, Any]
    ) -> dict[str, Any] | None:
        meta = parent["metadata"]
        live = self.rest.get(
            resource_path(self.parent_api, self.parent_resource, meta["namespace"], meta["name"])
        )
        if live["metadata"].get("deletionTimestamp") or live["metadata"]["uid"] != meta["uid"]:
            return None
        return self._set_owner(kind, obj, controller_ref(parent))

    def _set_owner(
        self, kind: ChildType, obj: dict[str, Any], ref: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """Adopt (``ref``) or release (``None``) with GET+PUT; the updated object."""
        meta = obj["metadata"]
        path = resource_path(kind.api_version, kind.resource, meta["namespace"], meta["name"])
        try:
            live = self.rest.get(path)
            if live["metadata"]["uid"] != meta["uid"]:
                return None
            refs = [
                r for r in live["metadata"].get("ownerReferences") or [] if not r.get("controller")
            ]
            live["metadata"]["ownerReferences"] = [*refs, ref] if ref else refs
            return self.rest.replace(path, live)
        except KubeApiError as error:
            if error.status in (404, 409):
                return None
            raise

    @staticmethod
    def _rule_gvr(rule: Mapping[str, Any]) -> str:
        return f"{rule.get('apiVersion')}/{rule.get('resource')}"

    @staticmethod
    def _rule_matches(
        rule: Mapping[str, Any], parent: Mapping[str, Any], obj: Mapping[str, Any]
    ) -> bool:
        meta = obj["metadata"]
        if meta.get("namespace") != parent["metadata"]["namespace"]:
            return False  # v1, namespaced parent: its own namespace only
        names = rule.get("names")
        if names:
            return meta.get("name") in names
        return matches(rule.get("labelSelector"), meta.get("labels"))

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
            gvr = self._rule_gvr(rule)
            reflector = self._related_informer(gvr, str(rule["apiVersion"]), str(rule["resource"]))
            if not reflector.synced.is_set():
                raise HookError(f"related informer for {gvr} not synced yet")
            kind = self.kind_of(str(rule["apiVersion"]), str(rule["resource"]))
            group = related.setdefault(group_key(str(rule["apiVersion"]), kind), {})
            for obj in reflector.items():
                if self._rule_matches(rule, parent, obj):
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

    # -- the reply -------------------------------------------------------------------------
    def _desired(
        self, parent: Mapping[str, Any], reply: Mapping[str, Any]
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """Steps 5 and 8: namespaces defaulted, the selector label added and enforced."""
        meta = parent["metadata"]
        selector = self._selector(parent)
        generate = bool(self.controller["spec"].get("generateSelector"))
        desired: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in self.child_types}
        for child in reply.get("children") or []:
            if not isinstance(child, dict):
                raise HookError("a child is not an object")
            child = copy.deepcopy(child)
            child_meta = child.setdefault("metadata", {})
            child_meta.setdefault("namespace", meta["namespace"])
            labels = child_meta.setdefault("labels", {})
            if generate:
                labels.setdefault("controller-uid", meta["uid"])
            if not matches(selector, labels):
                raise HookError(
                    f"labels on desired child {child.get('kind')} {child_meta.get('name')} "
                    "don't match parent selector"
                )
            key = group_key(str(child.get("apiVersion")), str(child.get("kind")))
            if child_meta["namespace"] != meta["namespace"]:
                continue  # v1: only the parent's namespace is observed
            desired.setdefault(key, {})[str(child_meta.get("name"))] = child
        return desired

    def _create_undeclared(
        self, obj: dict[str, Any], parent: Mapping[str, Any], done: Managed
    ) -> None:
        api_version, kind = str(obj.get("apiVersion")), str(obj.get("kind"))
        for entry in self.rest.get(group_version_path(api_version)).get("resources") or []:
            if entry.get("kind") == kind and "/" not in str(entry.get("name")):
                child_type = ChildType(
                    group_key(api_version, kind), api_version, entry["name"], kind
                )
                create(self.rest, child_type, obj, parent, done)
                return
        done.errors.append(f"no resource for {kind} in {api_version}")
