"""What both credential rotations share (``ops/rotate.py`` says why they are spec changes):
where things are, the timing, the report, the :class:`Cluster` interface, and re-pointing
CompositeControllers then waiting until Metacontroller rebuilt each one."""

from __future__ import annotations

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


#: The defaults of ``deploy/`` and ``deploy/mtls`` (frozen, so one instance serves every call).
DEFAULT_NAMES = Names()
DEFAULT_TIMING = Timing()


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
