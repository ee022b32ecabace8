"""A model of how Metacontroller 4.17.2 loads the caller credentials, to test rotations.

A DEVELOPMENT STAND-IN, in simulated time. What it reproduces, from Metacontroller's source:

* the credentials (``authorization`` token, ``clientTLS`` certificate, ``caBundle``) are
  resolved from their Secrets when the controller for the CompositeController is built
  (``newParentController`` → ``hooks.ResolveEndpointConfig`` → ``pkg/hooks/auth.go``) and
  never again: nothing watches the Secrets;
* a CompositeController update rebuilds only when the spec changed
  (``reconcileCompositeController``: ``apiequality.Semantic.DeepEqual(cc.Spec, pc.cc.Spec)``);
  an annotation changes nothing. A rebuild first stops the running controller (Event
  ``Stopped``); a build that fails (Secret or key missing) records ``CreateError`` and leaves
  **no** controller until a retry succeeds (exponential backoff); a success records
  ``Started``;
* a Metacontroller restart (or a leader change) builds from the current Secrets;
* sharded (``deploy/sharding``): one CompositeController per shard, each run by its own
  Metacontroller install (``--target-label-selector``), which builds, rebuilds and records
  Events for that controller alone.

And on the hook's side: every hook pod checks the token with the real
:class:`hooks.shell.auth.Authenticator` over a directory that the model's kubelet refreshes from the
Secret at the pod's own period (a mounted Secret lags behind the API by up to about a minute).
Client certificates are modelled as values with an expiry (the hook's TLS handshake refuses
an expired one); cert-manager's renewal rewrites its Secret in place.

:class:`ModelCluster` implements :class:`ops.rotation.Cluster`, so the documented procedure runs
unchanged against it, while the model's Metacontroller keeps calling the hook pods; every call
is recorded with its verdict.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hooks.shell.auth import Authenticator
from hooks.shell.config import AuthSettings
from ops.rotation import EVENT_CREATE_ERROR, EVENT_STARTED, Names, RotationError

EVENT_STOPPED = "Stopped"


class BuildError(Exception):
    """The controller could not be built (Metacontroller's ``CreateError``)."""


@dataclass(frozen=True)
class Call:
    """One hook call of the model's Metacontroller."""

    time: float
    pod: str
    ok: bool
    reason: str
    #: The CompositeController whose Metacontroller made the call.
    controller: str = ""


@dataclass
class ClientCert:
    """A client certificate as the model needs it: who issued it and until when it is valid."""

    serial: int
    not_after: float

    def pem(self) -> bytes:
        return f"CERT serial={self.serial} not_after={self.not_after}".encode()

    @staticmethod
    def parse(pem: bytes | None) -> ClientCert | None:
        if not pem or not pem.startswith(b"CERT "):
            return None
        fields = dict(part.split("=", 1) for part in pem.decode().split()[1:])
        return ClientCert(int(fields["serial"]), float(fields["not_after"]))


@dataclass
class HookPod:
    """One hook pod: its mounted copy of the token Secret and the real authenticator."""

    name: str
    directory: Path
    #: The kubelet refreshes the mount every ``period`` seconds, first at ``offset``.
    period: float
    offset: float
    authenticator: Authenticator = field(init=False)
    next_refresh: float = field(init=False)

    def __post_init__(self) -> None:
        self.authenticator = Authenticator(
            AuthSettings(mode="token", tokens_path=str(self.directory))
        )
        self.next_refresh = self.offset

    def mount(self, data: Mapping[str, bytes]) -> None:
        """Replace the directory's files the way the kubelet does (new files, then rename)."""
        wanted = dict(data)
        for existing in list(self.directory.iterdir()):
            if existing.name not in wanted:
                existing.unlink()
        for key, value in wanted.items():
            target = self.directory / key
            if target.exists() and target.read_bytes() == value:
                continue
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp")
            with os.fdopen(fd, "wb") as handle:
                handle.write(value)
            os.replace(tmp, target)


@dataclass
class BuiltController:
    """What Metacontroller holds in memory for the CompositeController."""

    spec: dict[str, Any]
    header: str | None
    client_cert: ClientCert | None


@dataclass
class Install:
    """One Metacontroller install and the CompositeController it runs: what it holds in
    memory, the Events it recorded on that controller, and its retry after a failed build."""

    cc: dict[str, Any]
    controller: BuiltController | None = None
    event_log: list[tuple[str, str]] = field(default_factory=list)
    retry_at: float | None = None
    retry_delay: float = 1.0

    @property
    def name(self) -> str:
        return str(self.cc["metadata"]["name"])


class ModelCluster:
    """Secrets, CompositeControllers with their Metacontroller installs, and the hook pods, in
    simulated time.

    ``tick`` is the time between two hook calls of each install's Metacontroller (each call
    goes to the next hook pod in turn); :meth:`sleep` advances the clock call by call. With
    one CompositeController, :attr:`controller`, :attr:`event_log`, :meth:`annotate` are
    about that one; :attr:`installs` holds them all.
    """

    def __init__(
        self,
        workdir: Path,
        compositecontrollers: Iterable[Mapping[str, Any]],
        *,
        names: Names | None = None,
        pods: int = 3,
        kubelet_period: float = 60.0,
        tick: float = 0.5,
        mtls: bool = False,
    ) -> None:
        self.names = names or Names()
        self.clock = 0.0
        self.tick = tick
        self.secrets: dict[tuple[str, str], dict[str, bytes]] = {}
        self.installs: dict[str, Install] = {}
        for cc in compositecontrollers:
            install = Install(copy.deepcopy(dict(cc)))
            self.installs[install.name] = install
        self.calls: list[Call] = []
        #: deploy/mtls: calls also need an unexpired client certificate.
        self.mtls = mtls
        self.pods: list[HookPod] = []
        for i in range(pods):
            directory = workdir / f"pod-{i}"
            directory.mkdir(parents=True)
            self.pods.append(
                HookPod(
                    f"hook-{i}",
                    directory,
                    period=kubelet_period,
                    offset=kubelet_period * (i + 1) / pods,
                )
            )
        self._next_pod = 0

    # ----------------------------------------------------------- the world moves

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass: kubelet refreshes, retries, hook calls."""
        end = self.clock + seconds
        while self.clock < end:
            self.clock = min(end, self.clock + self.tick)
            for pod in self.pods:
                if self.clock >= pod.next_refresh:
                    pod.mount(self._secret(self.names.hook_namespace, self.names.token_secret))
                    pod.next_refresh += pod.period
            for install in self.installs.values():
                if (
                    install.controller is None
                    and install.retry_at is not None
                    and self.clock >= install.retry_at
                ):
                    self._build(install)
                if install.controller is not None:
                    self._call(install)

    def now(self) -> float:
        return self.clock

    def mount_everywhere(self) -> None:
        """Every kubelet refreshes now (pods starting with the current Secret)."""
        for pod in self.pods:
            pod.mount(self._secret(self.names.hook_namespace, self.names.token_secret))

    # ----------------------------------------------------------------- Secrets

    def _secret(self, namespace: str, name: str) -> dict[str, bytes]:
        return dict(self.secrets.get((namespace, name), {}))

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        data = self.secrets.get((namespace, name))
        return None if data is None else dict(data)

    def update_secret(
        self, namespace: str, name: str, put: Mapping[str, bytes], remove: Iterable[str] = ()
    ) -> None:
        data = self.secrets.setdefault((namespace, name), {})
        data.update(put)
        for key in remove:
            data.pop(key, None)

    # ------------------------------------------------------ the CompositeController

    @property
    def only(self) -> Install:
        """The one install (tests of an unsharded installation)."""
        assert len(self.installs) == 1, "several CompositeControllers: use installs[name]"
        return next(iter(self.installs.values()))

    @property
    def controller(self) -> BuiltController | None:
        return self.only.controller

    @property
    def event_log(self) -> list[tuple[str, str]]:
        return self.only.event_log

    def compositecontrollers(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(install.cc) for install in self.installs.values()]

    def patch_compositecontroller(self, name: str, patch: list[dict[str, Any]]) -> None:
        install = self.installs[name]
        updated = copy.deepcopy(install.cc)
        try:
            for op in patch:
                _apply_op(updated, op)
        except ValueError as error:  # the API server refuses the whole patch (kubectl fails)
            raise RotationError(f"the JSON patch was refused: {error}") from error
        install.cc = updated
        self._reconcile(install)

    def annotate(self, key: str, value: str) -> None:
        """``kubectl annotate compositecontroller …``: an update without a spec change."""
        install = self.only
        install.cc.setdefault("metadata", {}).setdefault("annotations", {})[key] = value
        self._reconcile(install)

    def apply(self, compositecontroller: Mapping[str, Any]) -> None:
        """``kubectl apply`` of a manifest: that controller's spec becomes the manifest's (a
        new name adds a CompositeController, run by an install of its own)."""
        name = str(compositecontroller["metadata"]["name"])
        install = self.installs.setdefault(name, Install(copy.deepcopy(dict(compositecontroller))))
        install.cc["spec"] = copy.deepcopy(dict(compositecontroller["spec"]))
        self._reconcile(install)

    def events(self, name: str) -> list[tuple[str, str, int]]:
        counts: dict[tuple[str, str], int] = {}
        install = self.installs.get(name)
        for reason, message in install.event_log if install else ():
            counts[(reason, message)] = counts.get((reason, message), 0) + 1
        return [(reason, message, count) for (reason, message), count in counts.items()]

    def hook_pods_with_file(self, names: Names, path: str) -> tuple[int, int]:
        key = Path(path).name
        have = sum((pod.directory / key).is_file() for pod in self.pods)
        return have, len(self.pods)

    # ----------------------------------------------------------- Metacontroller

    def start_metacontroller(self) -> None:
        """Every Metacontroller install starts (or restarts, or another replica becomes
        leader)."""
        for install in self.installs.values():
            install.controller = None
            self._build(install)

    def _reconcile(self, install: Install) -> None:
        """``reconcileCompositeController``: nothing unless the spec changed."""
        if install.controller is not None and install.controller.spec == install.cc["spec"]:
            return
        if install.controller is not None:
            install.controller = None
            install.event_log.append((EVENT_STOPPED, "Stopped controller"))
        install.retry_delay = 1.0
        self._build(install)

    def _build(self, install: Install) -> None:
        try:
            header, cert = self._resolve(install.cc["spec"])
        except BuildError as error:
            install.event_log.append((EVENT_CREATE_ERROR, f"Cannot create new controller: {error}"))
            install.retry_at = self.clock + install.retry_delay
            install.retry_delay = min(install.retry_delay * 2, 1000.0)
            return
        install.controller = BuiltController(copy.deepcopy(install.cc["spec"]), header, cert)
        install.retry_at = None
        install.event_log.append((EVENT_STARTED, "Started controller"))

    def _resolve(self, spec: Mapping[str, Any]) -> tuple[str | None, ClientCert | None]:
        """``ResolveEndpointConfig`` for the sync hook's endpoint: read the Secrets now."""
        entries = spec.get("endpointConfigs") or []
        if not entries:
            return None, None
        entry = entries[0]
        header = None
        auth = entry.get("authorization")
        if auth:
            value = self._key(auth["secretRef"], auth["secretRef"]["key"])
            header = f"{auth.get('type') or 'Bearer'} {value.decode().strip()}"
        cert = None
        client = entry.get("clientTLS")
        if client:
            ref = client["secretRef"]
            pem = self._key(ref, client.get("certKey") or "tls.crt")
            self._key(ref, client.get("privateKeyKey") or "tls.key")
            cert = ClientCert.parse(pem)
            if cert is None:
                raise BuildError("can't parse clientTLS certificate")
        ca = entry.get("caBundle")
        if ca and ca.get("secretRef"):
            self._key(ca["secretRef"], ca["secretRef"].get("key") or "ca.crt")
        return header, cert

    def _key(self, ref: Mapping[str, Any], key: str) -> bytes:
        data = self.secrets.get((ref["namespace"], ref["name"]))
        if data is None:
            raise BuildError(f"can't get secret {ref['namespace']}/{ref['name']}")
        if key not in data:
            raise BuildError(
                f"secret {ref['namespace']}/{ref['name']} does not contain key {key!r}"
            )
        return data[key]

    def _call(self, install: Install) -> None:
        """One sync call to the next hook pod with what the built controller holds."""
        assert install.controller is not None
        pod = self.pods[self._next_pod % len(self.pods)]
        self._next_pod += 1
        cert = install.controller.client_cert
        if self.mtls and (cert is None or self.clock >= cert.not_after):
            self.calls.append(
                Call(self.clock, pod.name, False, "client_certificate_expired", install.name)
            )
            return
        verdict = pod.authenticator.check(install.controller.header, None)
        self.calls.append(Call(self.clock, pod.name, verdict.ok, verdict.reason, install.name))

    # -------------------------------------------------------------- cert-manager

    def issue_client_certificate(self, serial: int, lifetime: float) -> ClientCert:
        """cert-manager (re)issues Metacontroller's client certificate in place."""
        cert = ClientCert(serial, self.clock + lifetime)
        self.update_secret(
            self.names.client_namespace,
            self.names.client_secret,
            {"tls.crt": cert.pem(), "tls.key": f"KEY {serial}".encode(), "ca.crt": b"CA"},
        )
        return cert


def _apply_op(document: dict[str, Any], op: Mapping[str, Any]) -> None:
    """One JSON-patch operation (``test``, ``replace``, ``add``, ``remove``)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent: Any = document
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last: Any = int(parts[-1]) if isinstance(parent, list) else parts[-1]
    kind = op["op"]
    if kind == "test":
        if parent[last] != op["value"]:
            raise ValueError(f"test failed at {op['path']}")
    elif kind == "replace":
        if (last >= len(parent)) if isinstance(parent, list) else (last not in parent):
            raise ValueError(f"nothing to replace at {op['path']}")  # RFC 6902
        parent[last] = copy.deepcopy(op["value"])
    elif kind == "add":
        parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[last]
    else:
        raise ValueError(f"unsupported op {kind}")
