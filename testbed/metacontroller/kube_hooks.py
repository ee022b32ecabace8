"""The stand-in's calls to the hook's webhooks, as Metacontroller v4.17.2 makes them.

What :class:`testbed.metacontroller.kube.KubeMetacontroller` needs of Metacontroller's
webhook client (``pkg/hooks/webhook.go``) and of its customize cache
(``pkg/controller/common/customize``): a POST of the request body to the webhook's ``url``
with its ``timeout`` (a Go duration; 10 s when missing), the bearer token of the
``endpointConfigs`` entry whose host is the URL's, read from its Secret (4.16+); the
customize answer cached per parent UID and generation for 20 minutes
(``newResponseCache``) and checked strictly (unknown fields refused). ``Retry-After`` of a
429 is parsed here too. The differences from Metacontroller are listed in
:mod:`testbed.metacontroller.kube`'s docstring.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import requests

from testbed.kubernetes.rest import KubeRest, resource_path
from testbed.metacontroller.apply import HookError

CUSTOMIZE_TTL = 20 * 60.0
DEFAULT_TIMEOUT = 10.0


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


class HookClient:
    """The webhook calls of one CompositeController (``controller``, set once it is read)."""

    def __init__(self, rest: KubeRest) -> None:
        self.rest = rest
        self.controller: dict[str, Any] = {}
        self.customize_calls = 0
        self._session = requests.Session()
        self._session.trust_env = False
        self._lock = threading.Lock()
        self._customized: dict[tuple[str, int], tuple[float, list[dict[str, Any]]]] = {}

    def close(self) -> None:
        self._session.close()

    def call(self, webhook: Mapping[str, Any], body: Mapping[str, Any]) -> requests.Response:
        url = webhook.get("url")
        if not url:
            raise HookError("the stand-in supports webhook.url only")
        return self._session.post(
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

    def rules(self, parent: dict[str, Any]) -> list[dict[str, Any]]:
        """The parent's related-resource rules: cached, else the customize hook's answer."""
        cached = self.cached_rules(parent)
        if cached is not None:
            return cached
        hooks = self.controller["spec"].get("hooks") or {}
        rules: list[dict[str, Any]] = []
        if "customize" in hooks:
            response = self.call(
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

    def cached_rules(self, parent: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        meta = parent["metadata"]
        with self._lock:
            entry = self._customized.get((meta["uid"], int(meta.get("generation") or 0)))
        if entry is None or time.monotonic() - entry[0] > CUSTOMIZE_TTL:
            return None
        return entry[1]
