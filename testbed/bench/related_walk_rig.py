"""Metacontroller's related-object event path: the bench hook and the fleet it answers for.

The customize-reply shapes measured (:func:`customize_answer`, built by the product's own
handler; pure), the bench hook on loopback (``/customize`` answers the shape, ``/sync`` answers
at once and records when each parent's sync arrived), and the fleet of parents, member Pods
and bystanders created on the API server. Used by :mod:`testbed.bench.related_walk`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hooks.loaders.envelope import load_customize_call
from hooks.shell.handler import handle_customize
from testbed.kubernetes.pods import patroni_pod
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.metacontroller.gunicorn import free_port

PARENT_API = "adg.io/v1alpha1"
PARENTS = "postgresqlclusters"
CC_PATH = "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers"
SHARD_LABEL = "pg-failover-hook.adg.io/shard"
#: The customize-reply shapes measured (see :func:`customize_answer`).
SHAPES = ("labels", "ns-labels", "names", "no-service", "shard-aware")


# ------------------------------------------------------------------ the shapes (pure)


def customize_answer(shape: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The customize reply of ``shape`` for a request ``body``.

    * ``labels``: what the product sent before this change (member Pods by label, without a
      namespace; the Service by name in the parent's namespace);
    * ``ns-labels``: the shipped rules (:func:`hooks.children.related_rules`: the label rule
      scoped to the parent's namespace), answered for every parent;
    * ``names``: member Pods by ``names`` + namespace (the bench's Pods are ``<cluster>-0..2``);
    * ``no-service``: ``labels`` without the Service rule;
    * ``shard-aware``: the shipped handler (:func:`hooks.shell.handler.handle_customize`):
      ``ns-labels`` for parents the calling CompositeController serves, none for others.
    """
    if shape == "shard-aware":
        return handle_customize(body, request_id="bench").body
    _, spec, uid, scope = load_customize_call(body)
    shipped = handle_customize({**body, "controller": None}, request_id="bench").body[
        "relatedResources"
    ]
    parent = body["parent"]["metadata"]
    if spec is None:
        return {"relatedResources": []}
    pods = {"apiVersion": "v1", "resource": "pods"}
    service = {"apiVersion": "v1", "resource": "services", "names": [spec.service_name]}
    service["namespace"] = parent["namespace"]
    selector = {"matchLabels": dict(spec.primary_selector)}
    rules: list[dict[str, Any]]
    if shape == "ns-labels":
        rules = list(shipped)
    elif shape == "labels":
        rules = [{**pods, "labelSelector": selector}, service]
    elif shape == "no-service":
        rules = [{**pods, "labelSelector": selector}]
    elif shape == "names":
        names = [f"{parent['name']}-{i}" for i in range(3)]
        rules = [{**pods, "names": names, "namespace": parent["namespace"]}, service]
    else:
        raise ValueError(f"unknown shape {shape!r}")
    del uid, scope
    return {"relatedResources": rules}


# ------------------------------------------------------------------ the bench hook


@dataclass
class BenchHook:
    """``/customize`` answers ``shape``; ``/sync`` answers at once and records arrivals."""

    shape: str = "labels"
    port: int = field(default_factory=free_port)
    syncs: dict[str, list[float]] = field(default_factory=dict)
    customizes: int = 0
    answers: dict[tuple[str, object, object], dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> BenchHook:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                if self.path.startswith("/customize"):
                    meta = body["parent"]["metadata"]
                    key = (hook.shape, meta.get("uid"), meta.get("generation"))
                    with hook.lock:
                        hook.customizes += 1
                        reply = hook.answers.get(key)
                    if reply is None:
                        # Memoized: Metacontroller calls customize from the event handler
                        # with a 2 s timeout, and this bench hook shares a GIL with the
                        # patchers; the product's own answer is a few hundred µs.
                        reply = customize_answer(hook.shape, body)
                        with hook.lock:
                            hook.answers[key] = reply
                else:
                    meta = body["parent"]["metadata"]
                    with hook.lock:
                        hook.syncs.setdefault(meta["name"], []).append(time.monotonic())
                    reply = {"status": {}, "children": []}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024  # Metacontroller's 64 workers connect at once

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()

    def synced(self) -> int:
        with self.lock:
            return len(self.syncs)

    def first_sync_after(self, name: str, since: float) -> float | None:
        with self.lock:
            return next((t for t in self.syncs.get(name, ()) if t >= since), None)


# ------------------------------------------------------------------ the fleet


def parent_object(name: str, namespace: str, shard: int) -> dict[str, Any]:
    return {
        "apiVersion": PARENT_API,
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name, "namespace": namespace, "labels": {SHARD_LABEL: str(shard)}},
        "spec": {
            "primarySelector": {"application": "patroni", "cluster-name": name},
            "serviceRef": {"name": f"{name}-primary"},
            "healthCheckPath": "/primary",
        },
    }


def pod_object(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """An unscheduled Pod (no kubelet runs it: only its labels and changes matter here)."""
    return patroni_pod(name, namespace, labels, node=None, readiness=None)


@dataclass(frozen=True)
class Fleet:
    parents: int
    namespaces: int
    bystanders: int
    shards: int

    def namespace(self, i: int) -> str:
        return f"walk-{i % self.namespaces}"

    def members(self) -> list[tuple[str, str, str]]:
        """(namespace, pod, cluster) of every member Pod."""
        return [
            (self.namespace(i), f"pg-{i}-{m}", f"pg-{i}")
            for i in range(self.parents)
            for m in range(3)
        ]

    def bystander_pods(self) -> list[tuple[str, str]]:
        return [(self.namespace(i), f"other-{i}") for i in range(self.bystanders)]


def _retrying(call: Callable[[], object], tries: int = 50) -> None:
    for _ in range(tries):
        try:
            call()
            return
        except KubeApiError as error:
            if error.status == 409 and "already exists" in error.message:
                return
            if error.status not in (403, 404, 409, 429, 500):
                raise
            time.sleep(0.2)
    call()


def create_fleet(rest_pool: Sequence[KubeRest], fleet: Fleet) -> None:
    for n in range(fleet.namespaces):
        namespace = {"metadata": {"name": f"walk-{n}"}}
        _retrying(partial(rest_pool[0].create, "/api/v1/namespaces", namespace))
    posts: list[tuple[str, dict[str, Any]]] = []
    for ns, pod, cluster in fleet.members():
        labels = {"application": "patroni", "cluster-name": cluster}
        posts.append((resource_path("v1", "pods", ns), pod_object(pod, ns, labels)))
    for ns, pod in fleet.bystander_pods():
        body = pod_object(pod, ns, {"application": "other"})
        posts.append((resource_path("v1", "pods", ns), body))
    for i in range(fleet.parents):
        ns = fleet.namespace(i)
        body = parent_object(f"pg-{i}", ns, i % fleet.shards)
        posts.append((resource_path(PARENT_API, PARENTS, ns), body))
    _run_jobs(rest_pool, posts)


def _run_jobs(rest_pool: Sequence[KubeRest], posts: Sequence[tuple[str, dict[str, Any]]]) -> None:
    def run(k: int) -> None:
        path, body = posts[k]
        _retrying(partial(rest_pool[k % len(rest_pool)].create, path, body))

    with ThreadPoolExecutor(len(rest_pool)) as pool:
        for future in [pool.submit(run, k) for k in range(len(posts))]:
            future.result()
