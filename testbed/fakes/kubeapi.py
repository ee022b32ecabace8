"""A loopback stand-in for kube-apiserver's read API, for the kubectl plugin's tests.

The plugin's real ``kubernetes`` client talks HTTP to it through a generated kubeconfig, so
the tests cover the real client's URL building, authentication header, JSON handling and
exceptions. It answers the way kube-apiserver does, for what the plugin reads:

- ``GET /api/v1/...`` and ``GET /apis/<group>/<version>/...``: a collection (namespaced,
  cluster-wide, or a cluster-scoped type) or one object, with equality ``labelSelector``s.
- A collection is a ``<Kind>List`` with ``apiVersion``, ``metadata.resourceVersion`` and
  ``items``. Items of built-in types carry no ``kind``/``apiVersion`` (the API server's typed
  lists leave them out); custom resources' items keep them (unstructured lists do).
- A group/version or resource the server does not serve (a CRD not installed) falls through
  every handler to the API server's last one, ``notfoundhandler``, which answers Go's
  ``http.NotFound``: a plain-text ``404 page not found``, no ``Status``. Other errors are
  ``Status`` objects: a missing object is a 404 whose ``details`` name it
  (``<resource>[.<group>] "<name>" not found``); a request without the expected bearer token
  is a 401; a verb the user may not use is a 403 with the authorizer's sentence (``...
  cannot list resource "pods" in API group "" in the namespace "databases"``); a pod proxy
  to a port nothing listens on is a 503 ``error trying to reach service``.

For a list-and-watch client (:mod:`testbed.kubernetes.watch`), a collection with ``watch=1``
answers with what the test scripted in :attr:`FakeKubeAPI.watches`, one
:class:`WatchAnswer` per watch request in order: a refusal (a non-200 ``Status``, e.g. the
429 of a watch cache still initializing), or a stream of events (an ``ERROR`` event carries a
``Status``, e.g. the 410 ``Expired`` of "too old resource version") that then ends or is held
open until ``timeoutSeconds`` or :meth:`FakeKubeAPI.close`. With no answer left, a watch is
held open, as on an idle server. :attr:`FakeKubeAPI.list_answers` scripts refusals of lists
likewise. A server closed and started again on the same ``port`` plays an API server
restart (connections refused in between).

Everything stays on 127.0.0.1 with an ephemeral port (or the ``port`` asked for); the server
thread is a daemon, and :meth:`FakeKubeAPI.close` stops it and closes the socket.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "test-token-0123456789"
USER = "jane@example.com"


@dataclass(frozen=True)
class Resource:
    """A served resource type: where it lives and what its objects and lists are called."""

    api_version: str  # "v1", "apps/v1", "adg.io/v1alpha1"
    plural: str
    kind: str
    namespaced: bool = True
    custom: bool = False  # served from a CRD: list items keep kind/apiVersion

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""


BUILTIN = (
    Resource("v1", "pods", "Pod"),
    Resource("v1", "services", "Service"),
    Resource("v1", "secrets", "Secret"),
    Resource("discovery.k8s.io/v1", "endpointslices", "EndpointSlice"),
    Resource("apps/v1", "deployments", "Deployment"),
    Resource("apps/v1", "statefulsets", "StatefulSet"),
)
POSTGRESQLCLUSTERS = Resource(
    "adg.io/v1alpha1", "postgresqlclusters", "PostgreSQLCluster", custom=True
)
COMPOSITECONTROLLERS = Resource(
    "metacontroller.k8s.io/v1alpha1",
    "compositecontrollers",
    "CompositeController",
    namespaced=False,
    custom=True,
)


@dataclass(frozen=True)
class WatchAnswer:
    """One watch request's answer: ``status`` other than 200 refuses it with ``body`` (a
    ``Status``); else ``events`` are streamed, then the stream ends (``hold=False``) or is
    held open until the request's ``timeoutSeconds`` or :meth:`FakeKubeAPI.close`."""

    status: int = 200
    body: Mapping[str, Any] | None = None
    events: tuple[Mapping[str, Any], ...] = ()
    hold: bool = False


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``Status`` object, as an error answer's body or an ``ERROR`` event's object."""
    return _status(code, reason, message, None)


@dataclass
class FakeKubeAPI:
    """The served types, the stored objects, the user's refusals, and the requests seen."""

    resources: list[Resource] = field(
        default_factory=lambda: [*BUILTIN, POSTGRESQLCLUSTERS, COMPOSITECONTROLLERS]
    )
    #: (plural, namespace or "", name) -> object
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    #: (verb, plural) the user may not use, e.g. ("get", "secrets"), ("list", "pods").
    forbidden: set[tuple[str, str]] = field(default_factory=set)
    #: (namespace, pod) -> what the pod's Patroni answers on GET /patroni (absent: refused).
    patroni: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    token: str = TOKEN
    #: The scripted answers of the next watch requests, first first (see :class:`WatchAnswer`).
    watches: list[WatchAnswer] = field(default_factory=list)
    #: The scripted (code, ``Status``) refusals of the next list requests, first first.
    list_answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: The resourceVersion of every list.
    list_version: str = "424242"
    #: The port to listen on (0: an ephemeral one); set to the bound port by :meth:`start`.
    port: int = 0
    requests: list[str] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _closing: threading.Event = field(default_factory=threading.Event)
    _connections: set[socket.socket] = field(default_factory=set)

    # -------------------------------------------------------------- the store

    def resource(self, plural: str) -> Resource:
        return next(
            r for r in [*BUILTIN, POSTGRESQLCLUSTERS, COMPOSITECONTROLLERS] if r.plural == plural
        )

    def add(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object (deep-copied); ``kind``/``apiVersion`` are set from its type."""
        res = self.resource(plural)
        stored = copy.deepcopy(dict(obj))
        stored["apiVersion"] = res.api_version
        stored["kind"] = res.kind
        meta = stored.setdefault("metadata", {})
        meta.setdefault("resourceVersion", str(1000 + len(self.objects)))
        namespace = meta.get("namespace", "") if res.namespaced else ""
        self.objects[(plural, namespace, meta["name"])] = stored
        return stored

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return self.objects[(plural, namespace, name)]

    def remove(self, plural: str, namespace: str, name: str) -> None:
        del self.objects[(plural, namespace, name)]

    def unserve(self, plural: str) -> None:
        """Stop serving a type, as if its CRD (or API group) were not installed."""
        self.resources = [r for r in self.resources if r.plural != plural]

    # -------------------------------------------------------------- the server

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        if isinstance(host, bytes):  # typeshed's address type; an AF_INET server's is a str
            host = host.decode()
        return f"http://{host}:{port}"

    def start(self) -> FakeKubeAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes on a kept-alive connection: without
            # TCP_NODELAY, Nagle and the client's delayed ACK add ~40 ms to each answer.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                api.requests.append(self.path)
                api.authorizations.append(self.headers.get("Authorization"))
                query = parse_qs(urlsplit(self.path).query)
                watch = query.get("watch", [""])[0] in ("1", "true")
                scripted = api.watches.pop(0) if watch and api.watches else WatchAnswer(hold=True)
                if watch and self.headers.get("Authorization") != f"Bearer {api.token}":
                    scripted = WatchAnswer(401, status(401, "Unauthorized", "Unauthorized"))
                if watch and scripted.status == 200:
                    timeout = float(query.get("timeoutSeconds", ["30"])[0])
                    self._stream(scripted, timeout)
                    return
                body: dict[str, Any] | str
                if watch:
                    code, body = scripted.status, dict(scripted.body or {})
                elif api.list_answers:
                    code, body = api.list_answers.pop(0)
                else:
                    code, body = api.answer(self.path, self.headers.get("Authorization"))
                if isinstance(body, str):
                    data, content_type = body.encode(), "text/plain; charset=utf-8"
                else:
                    data, content_type = json.dumps(body).encode(), "application/json"
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, answer: WatchAnswer, timeout: float) -> None:
                """The events, one JSON line per chunk (as kube-apiserver streams a watch,
                so that a client reads each one as it comes), then the last chunk."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in answer.events:
                        self._chunk(json.dumps(event).encode() + b"\n")
                    if answer.hold:
                        api._closing.wait(timeout)
                    self._chunk(b"")
                except OSError:
                    return  # the client went away

            def setup(self) -> None:
                super().setup()
                api._connections.add(self.connection)

            def finish(self) -> None:
                api._connections.discard(self.connection)
                super().finish()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._closing.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = int(self._server.server_address[1])
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening and end every held watch (a client then sees its stream end, and
        its next connection refused until :meth:`start` again)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for connection in list(self._connections):  # a dead server's connections end too
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._closing.set()  # after: a client's next connection is refused, never held
        if self._thread is not None:
            self._thread.join(timeout=5)

    def kubeconfig(
        self, directory: Path, namespace: str = "databases", token: str | None = None
    ) -> Path:
        """A kubeconfig whose current context points at this server as ``USER``."""
        path = directory / "kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": USER, "user": {"token": token or self.token}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {"cluster": "fake", "user": USER, "namespace": namespace},
                        },
                        {"name": "other", "context": {"cluster": "fake", "user": USER}},
                    ],
                    "current-context": "fake",
                }
            ),
            encoding="utf-8",
        )
        return path

    # -------------------------------------------------------------- answering

    def _proxy(self, namespace: str, target: str, path: str) -> tuple[int, dict[str, Any]]:
        """``pods/<[scheme:]name:port>/proxy/<path>``: the API server relays to the pod."""
        parts = target.split(":")
        pod, port = parts[-2], parts[-1]
        if ("get", "pods/proxy") in self.forbidden:
            message = (
                f'pods "{pod}" is forbidden: User "{USER}" cannot get resource "pods/proxy" in '
                f'API group "" in the namespace "{namespace}"'
            )
            details = {"name": pod, "kind": "pods"}
            return 403, _status(403, "Forbidden", message, details)
        obj = self.objects.get(("pods", namespace, pod))
        if obj is None:
            return 404, _status(
                404, "NotFound", f'pods "{pod}" not found', {"name": pod, "kind": "pods"}
            )
        body = self.patroni.get((namespace, pod))
        if body is None or path != "patroni":
            ip = obj.get("status", {}).get("podIP")
            message = (
                f"error trying to reach service: dial tcp {ip}:{port}: connect: connection refused"
            )
            return 503, _status(503, "ServiceUnavailable", message, None)
        return 200, copy.deepcopy(body)

    def answer(self, raw_path: str, authorization: str | None) -> tuple[int, dict[str, Any] | str]:
        if authorization != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized", None)
        parts = urlsplit(raw_path)
        segments = [s for s in parts.path.split("/") if s]
        query = parse_qs(parts.query)
        if segments[:2] == ["api", "v1"]:
            api_version, rest = "v1", segments[2:]
        elif len(segments) >= 3 and segments[0] == "apis":
            api_version, rest = f"{segments[1]}/{segments[2]}", segments[3:]
        else:
            return 404, _not_served()
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if (
            api_version == "v1"
            and namespace
            and len(rest) >= 3
            and rest[::2][:2] == ["pods", "proxy"]
        ):
            return self._proxy(namespace, unquote(rest[1]), "/".join(rest[3:]))
        if not rest or len(rest) > 2:
            return 404, _not_served()
        plural, name = rest[0], (rest[1] if len(rest) == 2 else None)
        res = next(
            (r for r in self.resources if r.api_version == api_version and r.plural == plural),
            None,
        )
        if res is None or (namespace and not res.namespaced):
            return 404, _not_served()
        verb = "get" if name else "list"
        if (verb, plural) in self.forbidden:
            return 403, _forbidden(res, verb, namespace, name)
        if name is not None:
            obj = self.objects.get((plural, namespace, name))
            if obj is None:
                qualified = f"{plural}.{res.group}" if res.group else plural
                details = {"name": name, "kind": plural}
                if res.group:
                    details["group"] = res.group
                return 404, _status(404, "NotFound", f'{qualified} "{name}" not found', details)
            return 200, copy.deepcopy(obj)
        selector = _parse_selector(query.get("labelSelector", [""])[0])
        items = [
            copy.deepcopy(obj)
            for (p, ns, _), obj in sorted(self.objects.items())
            if p == plural and (not namespace or ns == namespace) and _matches(obj, selector)
        ]
        if not res.custom:
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        return 200, {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": self.list_version},
            "items": items,
        }


def _status(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = dict(details)
    body["code"] = code
    return body


def _not_served() -> str:
    return "404 page not found\n"


def _forbidden(res: Resource, verb: str, namespace: str, name: str | None) -> dict[str, Any]:
    qualified = f"{res.plural}.{res.group}" if res.group else res.plural
    subject = f'{qualified} "{name}"' if name else qualified
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{USER}" cannot {verb} resource "{res.plural}" in API '
        f'group "{res.group}" {scope}'
    )
    details: dict[str, Any] = {"kind": res.plural}
    if name:
        details = {"name": name, **details}
    if res.group:
        details["group"] = res.group
    return _status(403, "Forbidden", message, details)


def _parse_selector(text: str) -> dict[str, str]:
    wanted: dict[str, str] = {}
    for term in filter(None, text.split(",")):
        key, sep, value = term.replace("==", "=").partition("=")
        if not sep:
            raise AssertionError(f"the fake serves equality selectors only, not {term!r}")
        wanted[key] = value
    return wanted


def _matches(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def endpoint_slice_for(
    service: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], suffix: str = "x7k2p"
) -> dict[str, Any]:
    """The EndpointSlice kube-controller-manager's endpointslice controller writes for a Service."""
    meta = service["metadata"]
    ports = [
        {
            "name": p.get("name", ""),
            "port": p.get("targetPort", p["port"]),
            "protocol": p.get("protocol", "TCP"),
        }
        for p in service["spec"].get("ports", [])
    ]
    endpoints = []
    for pod in pods:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
        endpoints.append(
            {
                "addresses": [pod["status"]["podIP"]],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "nodeName": pod["spec"].get("nodeName"),
                "targetRef": {
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "namespace": pod["metadata"]["namespace"],
                    "uid": pod["metadata"]["uid"],
                },
            }
        )
    return {
        "addressType": "IPv4",
        "endpoints": endpoints,
        "metadata": {
            "name": f"{meta['name']}-{suffix}",
            "namespace": meta["namespace"],
            "generateName": f"{meta['name']}-",
            "labels": {
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": meta["name"],
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": "Service",
                    "name": meta["name"],
                    "uid": meta.get("uid", "0f0e0d0c-0000-4000-8000-000000000001"),
                }
            ],
        },
        "ports": ports,
    }
