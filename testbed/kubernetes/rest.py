"""The Kubernetes REST API as plain JSON, for the test infrastructure: the test bed's one
Kubernetes client (the kubelet and Metacontroller stand-ins, their informers in
:mod:`testbed.kubernetes.watch`, the Lease elector, the Patroni members' Kubernetes DCS set-up,
the control plane's own readiness wait, the benchmarks): any resource by path, lists,
watches, server-side apply, ``/readyz``.

The ``kubernetes`` package's typed models turn every object into a class per kind; the stand-ins
need every kind as the plain dict Metacontroller itself sends to the hook (managedFields and
all), so they talk JSON through ``requests`` with the credentials of a kubeconfig: a client
certificate or a bearer token. Every call has a timeout; a watch ends after ``timeout``
seconds at the latest (the server's ``timeoutSeconds`` plus a margin on the read).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

JSON = dict[str, Any]
CALL_TIMEOUT = 30.0


class KubeApiError(Exception):
    """A non-2xx answer of the API server: its status code, reason and message."""

    def __init__(self, status: int, reason: str, message: str, body: JSON | None = None) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_file: str
    client_cert: tuple[str, str] | None = None
    token: str | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Credentials:
        """The current context's cluster and user (certificate files or a token)."""
        config = yaml.safe_load(path.read_text())
        context = next(
            c["context"] for c in config["contexts"] if c["name"] == config["current-context"]
        )
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        cert = (
            (user["client-certificate"], user["client-key"])
            if "client-certificate" in user
            else None
        )
        return cls(cluster["server"], cluster["certificate-authority"], cert, user.get("token"))


def group_version_path(api_version: str) -> str:
    """``/api/v1`` for the core group, ``/apis/<group>/<version>`` for the others (the
    discovery document of that group/version, and the prefix of its resources)."""
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def resource_path(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """``/api/v1/namespaces/ns/pods/name`` or ``/apis/group/v/...`` for any resource."""
    prefix = group_version_path(api_version)
    path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    return path + (f"/{name}" if name else "")


class KubeRest:
    """One session to one API server with one identity."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        #: Every call the server refused with 403 (method and path), so a test running a
        #: controller under a least-privilege account can fail on any of them.
        self.forbidden: list[str] = []
        self.session = requests.Session()
        self.session.trust_env = False  # loopback only: no proxy from the environment
        self.session.verify = credentials.ca_file
        if credentials.client_cert:
            self.session.cert = credentials.client_cert
        if credentials.token:
            self.session.headers["Authorization"] = f"Bearer {credentials.token}"

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeRest:
        return cls(Credentials.from_kubeconfig(path))

    def close(self) -> None:
        self.session.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = CALL_TIMEOUT,
    ) -> JSON:
        response = self.session.request(
            method,
            self.credentials.server + path,
            data=None if body is None else json.dumps(body),
            params=params,
            headers={"Content-Type": content_type, "Accept": "application/json"},
            timeout=timeout,
        )
        if response.status_code == 403:
            self.forbidden.append(f"{method} {path}")
        return _decode(response)

    def readiness(self, path: str = "/readyz", timeout: float = 5.0) -> str | None:
        """``None`` when the API server answers ``path`` with 200, else what it answered or
        why it could not (for :meth:`testbed.kubernetes.servers.Server.wait_until`)."""
        try:
            self.request("GET", path, timeout=timeout)
        except KubeApiError as error:
            return f"HTTP {error.status}"
        except requests.RequestException as error:
            return str(error)
        return None

    def get(self, path: str, **params: str) -> JSON:
        return self.request("GET", path, params=params)

    def create(self, path: str, body: Mapping[str, Any]) -> JSON:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: Mapping[str, Any]) -> JSON:
        return self.request("PUT", path, body=body)

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> JSON:
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, body: Mapping[str, Any]) -> JSON:
        return self.request(
            "PATCH", path, body=body, content_type="application/strategic-merge-patch+json"
        )

    def apply(self, path: str, body: Mapping[str, Any], manager: str, force: bool = True) -> JSON:
        """Server-side apply of ``body`` as field manager ``manager``."""
        return self.request(
            "PATCH",
            path + f"?fieldManager={manager}&force={'true' if force else 'false'}",
            body=body,
            content_type="application/apply-patch+yaml",
        )

    def delete(self, path: str, body: Mapping[str, Any] | None = None) -> JSON:
        return self.request("DELETE", path, body=body)

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout: int = 30,
        *,
        opened: Callable[[requests.Response], None] | None = None,
        **params: str,
    ) -> Iterator[JSON]:
        """Watch events (``{"type", "object"}``) from ``resource_version`` for at most
        ``timeout`` seconds; an ``ERROR`` event raises :class:`KubeApiError` (410: list again).
        ``opened`` is handed the streaming response, so that another thread can end the
        watch at once with :func:`abort` (a quiet watch otherwise blocks until ``timeout``)."""
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout),
            "allowWatchBookmarks": "true",
        }
        with self.session.get(
            self.credentials.server + path,
            params=query,
            stream=True,
            timeout=(CALL_TIMEOUT, timeout + 10),
        ) as response:
            if opened is not None:
                opened(response)
            if response.status_code == 403:
                self.forbidden.append(f"WATCH {path}")
            if response.status_code >= 300:
                _decode(response)
            for line in response.iter_lines():
                if not line:
                    continue
                event: JSON = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise KubeApiError(
                        int(status.get("code", 500)),
                        str(status.get("reason", "")),
                        str(status.get("message", "")),
                        status,
                    )
                yield event


def abort(response: requests.Response | None) -> None:
    """End a streaming response from another thread: its socket is shut down, so the thread
    reading it sees the end of the stream at once. Closing the session would not wake it."""
    raw = getattr(response, "raw", None)
    connection = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _decode(response: requests.Response) -> JSON:
    try:
        body: Any = response.json() if response.content else {}
    except ValueError:
        body = {"message": response.text[:500]}
    if response.status_code >= 300:
        body = body if isinstance(body, dict) else {}
        raise KubeApiError(
            response.status_code,
            str(body.get("reason", response.reason)),
            str(body.get("message", response.text[:500])),
            body,
        )
    return body if isinstance(body, dict) else {"items": body}
