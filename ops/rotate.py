"""Rotate the credentials Metacontroller presents to the hook, as a change of the
CompositeController's **spec** — the only thing that makes Metacontroller read them again.

Why a spec change (Metacontroller 4.17.2): the caller credentials (``authorization``,
``clientTLS``, ``caBundle``) are resolved from their Secrets once, in
``newParentController`` (``pkg/controller/composite/controller.go`` →
``hooks.ResolveEndpointConfig`` → ``pkg/hooks/auth.go``). Nothing watches those Secrets, and
``reconcileCompositeController`` (``pkg/controller/composite/metacontroller.go``) returns early
while ``apiequality.Semantic.DeepEqual(cc.Spec, pc.cc.Spec)``: an annotation, a label or a
changed Secret rebuilds nothing. A changed ``secretRef.key`` does — the controller is stopped
and rebuilt (Events ``Stopped`` and ``Started`` on the CompositeController, or
``CreateError`` if a Secret or key is missing; the old controller is then already stopped).

So every rotation writes the new credential under a **new key** (``token-<stamp>``,
``tls-<stamp>.crt`` …), makes sure the hook accepts it, points the CompositeControllers at
that key, waits for Metacontroller's ``Started`` Event on each, and only then removes what is
old.

Which CompositeControllers: **every one whose spec names the Secret** being rotated, found by
listing them all. One install has one (``pg-failover-hook``); the sharded install
(``deploy/sharding``) has one per shard (``pg-failover-hook-<k>``), each run by its own
Metacontroller install that records its own Events. They share the Secret, so they are
rotated together: removing an old key that one of them still sends would lock that shard out.
The Secret reference is the criterion (not a name, label or hook URL) because it is exactly
what makes a controller depend on the keys this removes.


``token``
    1. add ``token-<stamp>`` to ``pg-failover-hook-auth`` (the hook accepts every key of its
       mounted Secret, so old and new both work from the moment the kubelet has refreshed
       the mount, within about a minute);
    2. wait until every running hook pod sees the new file (``kubectl exec``; or a fixed
       wait with ``--pod-check sleep``);
    3. point every ``authorization.secretRef`` that names the Secret, in every
       CompositeController, at ``token-<stamp>`` (one JSON patch per controller, with
       ``test`` ops: a concurrent change makes it fail instead of being overwritten);
    4. wait for each controller's ``Started`` Event (each now sends the new token);
    5. check that no CompositeController names an old key any more (one applied meanwhile
       stops the rotation here, before anything is removed), then write the new token
       under ``token`` too and remove the other ``token*`` keys (unless ``--keep-old``).
       ``token`` always holds the current token because the manifests name it:
       re-applying ``deploy/`` points Metacontroller back at ``token``, a spec change that
       rebuilds with the current token instead of a stale or missing one.

``tls`` (with ``deploy/mtls``)
    cert-manager renews ``metacontroller/metacontroller-client-tls`` in place, which
    Metacontroller never notices. This copies the current client certificate and key, and
    the hook's CA (``ca.crt`` of ``pg-failover-hook-tls``), into pinned Secrets under
    stamped keys, points ``clientTLS`` and ``caBundle`` of every CompositeController whose
    ``clientTLS`` names the client certificate (or its pinned copy) at them, waits for
    ``Started`` on each and prunes older stamped keys. It does nothing when the pinned copy
    is already current, so it can run from a daily CronJob: cert-manager renews at two thirds
    of a certificate's lifetime, which leaves the last third for this to pick the renewal up.

The procedure talks to the cluster through :class:`Cluster`; :class:`KubectlCluster` runs
``kubectl``, and the stand-in's model (``standin/credentials.py``) runs the same procedure
against a simulated Metacontroller in the tests. Standard library only: run it from a
checkout with ``deploy/rotate-credentials.sh token`` (or ``tls``).
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

#: Events Metacontroller records on the CompositeController (``pkg/events/events.go``).
EVENT_STARTED = "Started"
EVENT_CREATE_ERROR = "CreateError"
#: The key the manifests name; always holds the current token (see the module docstring).
STABLE_TOKEN_KEY = "token"
TOKEN_KEY_PREFIX = "token-"


class RotationError(Exception):
    """The rotation stopped; the message says what was changed and what to do."""


@dataclass(frozen=True)
class Names:
    """Where things are; the defaults are those of ``deploy/`` and ``deploy/mtls``."""

    hook_namespace: str = "pg-failover-hook"
    token_secret: str = "pg-failover-hook-auth"
    #: Label selector of the hook pods, their container, and where the Secret is mounted.
    hook_selector: str = (
        "app.kubernetes.io/name=pg-failover-hook,app.kubernetes.io/component=webhook"
    )
    hook_container: str = "hook"
    token_mount: str = "/etc/pg-failover-hook/auth"
    #: The client certificate cert-manager keeps current, and the pinned copy.
    client_namespace: str = "metacontroller"
    client_secret: str = "metacontroller-client-tls"
    client_pinned_secret: str = "metacontroller-client-tls-pinned"
    #: The hook's serving certificate (its ``ca.crt`` is the caBundle), and the pinned copy.
    server_secret: str = "pg-failover-hook-tls"
    ca_pinned_secret: str = "pg-failover-hook-ca-pinned"


@dataclass(frozen=True)
class Timing:
    #: How long the new token may take to reach every hook pod (kubelet refresh ≤ ~1 min).
    pods_timeout: float = 180.0
    #: With ``pod_check="sleep"``: the fixed wait instead of looking into the pods.
    kubelet_delay: float = 120.0
    #: How long Metacontroller may take to rebuild the controller after the patch.
    rebuild_timeout: float = 120.0
    poll: float = 2.0


@dataclass
class Report:
    """What was done, for the operator (and the tests)."""

    steps: list[str] = field(default_factory=list)
    changed: bool = False
    new_key: str | None = None

    def say(self, line: str) -> None:
        self.steps.append(line)


class Cluster(Protocol):
    """The few operations the procedure needs."""

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """The Secret's decoded data (``{}`` if it has none), ``None`` if it does not exist."""

    def update_secret(
        self, namespace: str, name: str, put: Mapping[str, bytes], remove: Iterable[str] = ()
    ) -> None:
        """Add or replace keys and remove keys; create the Secret if it does not exist."""

    def compositecontrollers(self) -> list[dict[str, Any]]:
        """Every CompositeController object in the cluster."""

    def patch_compositecontroller(self, name: str, patch: list[dict[str, Any]]) -> None:
        """Apply a JSON patch (RFC 6902) to the CompositeController."""

    def events(self, name: str) -> list[tuple[str, str, int]]:
        """``(reason, message, count)`` of the Events on the CompositeController ``name``."""

    def hook_pods_with_file(self, names: Names, path: str) -> tuple[int, int]:
        """``(pods that have the file, running hook pods)``."""

    def now(self) -> float:
        """Monotonic seconds."""

    def sleep(self, seconds: float) -> None:
        """Wait (the model advances its simulated time instead)."""


# --------------------------------------------------------------------------- helpers


def stamp_now() -> str:
    """A key suffix that sorts by time: ``20261130T182512Z``."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def _pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) from path parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _auth_locations(spec: Mapping[str, Any]) -> list[tuple[str | int, ...]]:
    """Paths (under ``/spec``) of every object that may carry caller credentials:
    each ``endpointConfigs[i]`` and each hook's ``webhook``."""
    locations: list[tuple[str | int, ...]] = []
    for i, _ in enumerate(spec.get("endpointConfigs") or []):
        locations.append(("endpointConfigs", i))
    for hook, value in sorted((spec.get("hooks") or {}).items()):
        if isinstance(value, Mapping) and isinstance(value.get("webhook"), Mapping):
            locations.append(("hooks", hook, "webhook"))
    return locations


def _get(spec: Mapping[str, Any], path: Sequence[str | int]) -> Any:
    node: Any = spec
    for part in path:
        if isinstance(node, Mapping) and isinstance(part, str):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _events_marker(cluster: Cluster, name: str, reason: str) -> int:
    """How many times ``reason`` was recorded so far (Events aggregate by count)."""
    return sum(count for r, _, count in cluster.events(name) if r == reason)


def _wait(
    cluster: Cluster, timeout: float, poll: float, done: Callable[[], bool], what: str
) -> None:
    deadline = cluster.now() + timeout
    while True:
        if done():
            return
        if cluster.now() >= deadline:
            raise RotationError(f"timed out after {timeout:.0f} s waiting for {what}")
        cluster.sleep(poll)


def _name(cc: Mapping[str, Any]) -> str:
    return str((cc.get("metadata") or {}).get("name", ""))


def _spec(cc: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = cc.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _repoint(cluster: Cluster, timing: Timing, patches: Mapping[str, list[dict[str, Any]]]) -> None:
    """Patch each CompositeController, then wait until Metacontroller rebuilt every one.

    All are patched before any wait: each runs in its own Metacontroller install (sharded),
    so they rebuild side by side. A failed patch or rebuild stops here, before anything old
    is removed; the message says which controllers already use the new credential.
    """
    markers = {
        name: (
            _events_marker(cluster, name, EVENT_STARTED),
            _events_marker(cluster, name, EVENT_CREATE_ERROR),
        )
        for name in patches
    }
    done: list[str] = []
    for name, patch in patches.items():
        try:
            cluster.patch_compositecontroller(name, patch)
        except RotationError as error:
            raise RotationError(
                f"patching CompositeController {name} failed ({error}); "
                + (f"already pointed at the new key: {', '.join(done)}; " if done else "")
                + "nothing old was removed, run the rotation again"
            ) from error
        done.append(name)
    for name in patches:
        _wait_rebuilt(cluster, name, timing, *markers[name])


def _wait_rebuilt(
    cluster: Cluster, name: str, timing: Timing, started_before: int, errors_before: int
) -> None:
    """Wait for Metacontroller's ``Started`` Event after the patch; fail on ``CreateError``."""

    def done() -> bool:
        if _events_marker(cluster, name, EVENT_CREATE_ERROR) > errors_before:
            messages = [m for r, m, _ in cluster.events(name) if r == EVENT_CREATE_ERROR]
            raise RotationError(
                f"Metacontroller could not rebuild CompositeController {name} "
                f"({messages[-1] if messages else 'CreateError'}); no sync runs until it can. "
                "Nothing old was removed: fix the Secret or point the CompositeController "
                "back at the previous key"
            )
        return _events_marker(cluster, name, EVENT_STARTED) > started_before

    _wait(cluster, timing.rebuild_timeout, timing.poll, done, f"the Started Event on {name}")


def _token_refs(cc: Mapping[str, Any], names: Names) -> list[tuple[str | int, ...]]:
    """Where ``cc`` names the token Secret (``authorization.secretRef``)."""
    spec = _spec(cc)
    return [
        loc
        for loc in _auth_locations(spec)
        if _get(spec, (*loc, "authorization", "secretRef", "name")) == names.token_secret
        and _get(spec, (*loc, "authorization", "secretRef", "namespace")) == names.hook_namespace
    ]


# ------------------------------------------------------------------------ token


def rotate_token(
    cluster: Cluster,
    names: Names = Names(),
    timing: Timing = Timing(),
    *,
    token: str | None = None,
    stamp: str | None = None,
    keep_old: bool = False,
    pod_check: str = "exec",
) -> Report:
    """Rotate (or set for the first time) the bearer token; see the module docstring."""
    report = Report()
    token = token if token is not None else secrets.token_hex(32)
    if len(token) < 16 or not all(33 <= ord(c) <= 126 for c in token):
        raise RotationError("the token must be 16+ printable ASCII characters without spaces")
    new_key = TOKEN_KEY_PREFIX + (stamp or stamp_now())
    report.new_key = new_key
    ns, secret = names.hook_namespace, names.token_secret

    controllers = {
        _name(cc): (cc, refs)
        for cc in cluster.compositecontrollers()
        if (refs := _token_refs(cc, names))
    }
    if not controllers:
        raise RotationError(
            f"no CompositeController has an authorization.secretRef naming {ns}/{secret}; "
            "nothing to rotate"
        )
    existing = cluster.secret_data(ns, secret) or {}
    if new_key in existing:
        raise RotationError(f"{ns}/{secret} already has the key {new_key}; use another stamp")

    # 1. The new token under a new key: from now on the hook accepts old and new.
    cluster.update_secret(ns, secret, {new_key: token.encode()})
    report.say(f"added key {new_key} to Secret {ns}/{secret}")

    # 2. Every running hook pod must accept it before Metacontroller sends it.
    if pod_check == "sleep":
        cluster.sleep(timing.kubelet_delay)
        report.say(f"waited {timing.kubelet_delay:.0f} s for the kubelets to refresh the mount")
    else:
        path = f"{names.token_mount.rstrip('/')}/{new_key}"

        def every_pod_has_it() -> bool:
            have, total = cluster.hook_pods_with_file(names, path)
            return total > 0 and have == total

        _wait(
            cluster, timing.pods_timeout, timing.poll, every_pod_has_it, f"{path} in every hook pod"
        )
        report.say(f"every running hook pod has {path}")

    # 3. The spec change that makes Metacontroller read the Secret again, in every
    # CompositeController that names it.
    patches: dict[str, list[dict[str, Any]]] = {}
    for name, (cc, refs) in sorted(controllers.items()):
        patch: list[dict[str, Any]] = []
        for loc in refs:
            path_ = _pointer("spec", *loc, "authorization", "secretRef", "key")
            old = _get(_spec(cc), (*loc, "authorization", "secretRef", "key"))
            patch.append({"op": "test", "path": path_, "value": old})
            patch.append({"op": "replace", "path": path_, "value": new_key})
        patches[name] = patch
    count = sum(len(refs) for _, refs in controllers.values())
    report.say(
        f"pointing {count} authorization.secretRef(s) at key {new_key} in "
        f"CompositeController(s) {', '.join(patches)}"
    )
    _repoint(cluster, timing, patches)
    report.changed = True

    # 4. Metacontroller rebuilt every controller: each sends the new token now.
    report.say(f"Metacontroller rebuilt {len(patches)} controller(s) (Event Started on each)")

    # A CompositeController applied meanwhile (a new shard, deploy/ re-applied) may still
    # send an old key: removing it, or rewriting "token", would lock it out.
    behind = sorted(
        _name(cc)
        for cc in cluster.compositecontrollers()
        for loc in _token_refs(cc, names)
        if _get(_spec(cc), (*loc, "authorization", "secretRef", "key")) != new_key
    )
    if behind:
        raise RotationError(
            f"CompositeController(s) {', '.join(sorted(set(behind)))} name an older key of "
            f"{ns}/{secret} (changed during the rotation); nothing old was removed: "
            "run the rotation again"
        )

    # 5. "token" holds the current token; the old ones go.
    old_keys = [
        k
        for k in (cluster.secret_data(ns, secret) or {})
        if k != new_key and k != STABLE_TOKEN_KEY and k.startswith(STABLE_TOKEN_KEY)
    ]
    remove = [] if keep_old else old_keys
    cluster.update_secret(ns, secret, {STABLE_TOKEN_KEY: token.encode()}, remove)
    report.say(
        f"key {STABLE_TOKEN_KEY} now holds the new token"
        + (f"; removed {', '.join(sorted(remove))}" if remove else "; no old key removed")
    )
    return report


# -------------------------------------------------------------------------- tls


def rotate_tls(
    cluster: Cluster,
    names: Names = Names(),
    timing: Timing = Timing(),
    *,
    stamp: str | None = None,
    force: bool = False,
) -> Report:
    """Pin the current client certificate and hook CA under stamped keys (``deploy/mtls``)."""
    report = Report()
    stamp = stamp or stamp_now()
    controllers = {
        _name(cc): (_spec(cc), locations)
        for cc in cluster.compositecontrollers()
        if (locations := _client_tls_locations(cc, names))
    }
    if not controllers:
        raise RotationError(
            "no CompositeController has a clientTLS naming "
            f"{names.client_namespace}/{names.client_secret} (or its pinned copy): "
            "apply deploy/mtls"
        )
    source = cluster.secret_data(names.client_namespace, names.client_secret) or {}
    crt, key = source.get("tls.crt"), source.get("tls.key")
    if not crt or not key:
        raise RotationError(
            f"Secret {names.client_namespace}/{names.client_secret} has no tls.crt/tls.key"
        )
    ca = (cluster.secret_data(names.hook_namespace, names.server_secret) or {}).get("ca.crt")
    if not ca:
        raise RotationError(f"Secret {names.hook_namespace}/{names.server_secret} has no ca.crt")

    # Current only if the entry names the pinned copy: stamped keys are never rewritten, so
    # what they hold is what Metacontroller loaded. cert-manager's own Secret changes under
    # Metacontroller's feet, so naming it says nothing about what was loaded.
    if not force and all(
        _get(spec, (*loc, "clientTLS", "secretRef", "name")) == names.client_pinned_secret
        and _referenced(cluster, spec, loc, names) == (crt, key, ca)
        for spec, locations in controllers.values()
        for loc in locations
    ):
        report.say("every CompositeController already uses the current certificate and CA")
        return report

    crt_key, key_key, ca_key = f"tls-{stamp}.crt", f"tls-{stamp}.key", f"ca-{stamp}.crt"
    pinned = cluster.secret_data(names.client_namespace, names.client_pinned_secret) or {}
    if crt_key in pinned:
        raise RotationError(f"the stamp {stamp} was used already; use another one")
    report.new_key = crt_key
    cluster.update_secret(
        names.client_namespace, names.client_pinned_secret, {crt_key: crt, key_key: key}
    )
    cluster.update_secret(names.hook_namespace, names.ca_pinned_secret, {ca_key: ca})
    report.say(
        f"copied the client certificate to {names.client_namespace}/"
        f"{names.client_pinned_secret} ({crt_key}, {key_key}) and the CA to "
        f"{names.hook_namespace}/{names.ca_pinned_secret} ({ca_key})"
    )

    new_tls = {
        "secretRef": {"name": names.client_pinned_secret, "namespace": names.client_namespace},
        "certKey": crt_key,
        "privateKeyKey": key_key,
    }
    new_ca = {
        "secretRef": {
            "name": names.ca_pinned_secret,
            "namespace": names.hook_namespace,
            "key": ca_key,
        }
    }
    patches: dict[str, list[dict[str, Any]]] = {}
    for name, (_, locations) in sorted(controllers.items()):
        patches[name] = [
            op
            for loc in locations
            for op in (
                {"op": "replace", "path": _pointer("spec", *loc, "clientTLS"), "value": new_tls},
                # add replaces an existing member too
                {"op": "add", "path": _pointer("spec", *loc, "caBundle"), "value": new_ca},
            )
        ]
    count = sum(len(locations) for _, locations in controllers.values())
    report.say(
        f"pointing clientTLS and caBundle of {count} entry(ies) in CompositeController(s) "
        f"{', '.join(patches)} at the copies"
    )
    _repoint(cluster, timing, patches)
    report.changed = True
    report.say(f"Metacontroller rebuilt {len(patches)} controller(s) (Event Started on each)")

    for ns, name, keep in (
        (names.client_namespace, names.client_pinned_secret, {crt_key, key_key}),
        (names.hook_namespace, names.ca_pinned_secret, {ca_key}),
    ):
        old = [k for k in (cluster.secret_data(ns, name) or {}) if k not in keep]
        if old:
            cluster.update_secret(ns, name, {}, old)
            report.say(f"removed {', '.join(sorted(old))} from {ns}/{name}")
    return report


def _client_tls_locations(cc: Mapping[str, Any], names: Names) -> list[tuple[str | int, ...]]:
    """Where ``cc`` presents Metacontroller's client certificate (cert-manager's Secret or
    the pinned copy): a ``clientTLS`` naming another Secret is someone else's."""
    spec = _spec(cc)
    ours = {names.client_secret, names.client_pinned_secret}
    return [
        loc
        for loc in _auth_locations(spec)
        if _get(spec, (*loc, "clientTLS", "secretRef", "name")) in ours
        and _get(spec, (*loc, "clientTLS", "secretRef", "namespace")) == names.client_namespace
    ]


def _referenced(
    cluster: Cluster, spec: Mapping[str, Any], loc: tuple[str | int, ...], names: Names
) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The certificate, key and CA the entry at ``loc`` makes Metacontroller load."""
    tls_ = _get(spec, (*loc, "clientTLS")) or {}
    ref = tls_.get("secretRef") or {}
    data = cluster.secret_data(str(ref.get("namespace", "")), str(ref.get("name", ""))) or {}
    crt = data.get(str(tls_.get("certKey") or "tls.crt"))
    key = data.get(str(tls_.get("privateKeyKey") or "tls.key"))
    ca_ref = _get(spec, (*loc, "caBundle", "secretRef")) or {}
    ca_data = (
        cluster.secret_data(str(ca_ref.get("namespace", "")), str(ca_ref.get("name", ""))) or {}
    )
    return crt, key, ca_data.get(str(ca_ref.get("key") or "ca.crt"))


# ---------------------------------------------------------------------- kubectl


class KubectlCluster:
    """:class:`Cluster` through ``kubectl`` (the current context, or ``--context``)."""

    def __init__(self, kubectl: Sequence[str] = ("kubectl",)) -> None:
        self.kubectl = list(kubectl)

    def _run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [*self.kubectl, *args], input=stdin, capture_output=True, text=True, check=False
        )
        if check and result.returncode != 0:
            raise RotationError(f"kubectl {' '.join(args[:4])} …: {result.stderr.strip()}")
        return result.stdout if result.returncode == 0 else ""

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        out = self._run("-n", namespace, "get", "secret", name, "-o", "json", check=False)
        if not out:
            return None
        data = json.loads(out).get("data") or {}
        return {k: base64.b64decode(v) for k, v in data.items()}

    def update_secret(
        self, namespace: str, name: str, put: Mapping[str, bytes], remove: Iterable[str] = ()
    ) -> None:
        if self.secret_data(namespace, name) is None:
            self._run("-n", namespace, "create", "secret", "generic", name)
        data: dict[str, str | None] = {k: base64.b64encode(v).decode() for k, v in put.items()}
        data.update({k: None for k in remove})  # null removes a key in a merge patch
        if data:
            patch = json.dumps({"data": data})
            self._run("-n", namespace, "patch", "secret", name, "--type", "merge", "-p", patch)

    def compositecontrollers(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(
            self._run("get", "compositecontrollers", "-o", "json")
        ).get("items", [])
        return items

    def patch_compositecontroller(self, name: str, patch: list[dict[str, Any]]) -> None:
        self._run("patch", "compositecontroller", name, "--type", "json", "-p", json.dumps(patch))

    def events(self, name: str) -> list[tuple[str, str, int]]:
        out = self._run(
            "get",
            "events",
            "--all-namespaces",
            "--field-selector",
            f"involvedObject.kind=CompositeController,involvedObject.name={name}",
            "-o",
            "json",
        )
        return [
            (str(e.get("reason", "")), str(e.get("message", "")), int(e.get("count") or 1))
            for e in json.loads(out).get("items", [])
        ]

    def hook_pods_with_file(self, names: Names, path: str) -> tuple[int, int]:
        pods = json.loads(
            self._run(
                "-n", names.hook_namespace, "get", "pods", "-l", names.hook_selector, "-o", "json"
            )
        ).get("items", [])
        running = [
            p["metadata"]["name"]
            for p in pods
            if p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        check = "import os, sys; sys.exit(0 if os.path.isfile(sys.argv[1]) else 1)"
        have = 0
        for pod in running:
            result = subprocess.run(
                [
                    *self.kubectl,
                    "-n",
                    names.hook_namespace,
                    "exec",
                    pod,
                    "-c",
                    names.hook_container,
                    "--",
                    "python",
                    "-c",
                    check,
                    path,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            have += result.returncode == 0
        return have, len(running)

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


# -------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rotate-credentials",
        description="Rotate what Metacontroller presents to pg-failover-hook, as a "
        "CompositeController spec change (the only change Metacontroller acts on).",
    )
    parser.add_argument("--context", help="kubectl context (default: the current one)")
    sub = parser.add_subparsers(dest="what", required=True)
    token = sub.add_parser("token", help="a new bearer token (also the first one)")
    token.add_argument("--keep-old", action="store_true", help="do not remove old token keys")
    token.add_argument(
        "--pod-check",
        choices=("exec", "sleep"),
        default="exec",
        help="how to know every hook pod accepts the new token: look for the file with "
        "kubectl exec (default), or wait a fixed --kubelet-delay",
    )
    token.add_argument("--kubelet-delay", type=float, default=Timing.kubelet_delay)
    tls = sub.add_parser("tls", help="pin the current client certificate and CA (deploy/mtls)")
    tls.add_argument("--force", action="store_true", help="even if already current")
    args = parser.parse_args(argv)

    kubectl = ["kubectl"] + (["--context", args.context] if args.context else [])
    cluster = KubectlCluster(kubectl)
    try:
        if args.what == "token":
            report = rotate_token(
                cluster,
                timing=Timing(kubelet_delay=args.kubelet_delay),
                keep_old=args.keep_old,
                pod_check=args.pod_check,
            )
        else:
            report = rotate_tls(cluster, force=args.force)
    except RotationError as error:
        print(f"rotate-credentials: {error}", file=sys.stderr)
        return 1
    for line in report.steps:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
