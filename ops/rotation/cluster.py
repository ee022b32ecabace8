"""What both credential rotations talk to and in which words (:mod:`ops.rotation` says why they
are spec changes): the :class:`Cluster` interface, where things are (:class:`Names`), the timing,
the report, the error that stops a rotation, and a bounded wait on the cluster's clock."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

#: Events Metacontroller records on the CompositeController (``pkg/events/events.go``).
EVENT_STARTED = "Started"
EVENT_CREATE_ERROR = "CreateError"
#: The key the manifests name; always holds the current token (see :mod:`ops.rotation`).
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


def wait_until(
    cluster: Cluster, timeout: float, poll: float, done: Callable[[], bool], what: str
) -> None:
    """Poll ``done`` every ``poll`` seconds of the cluster's clock; a :class:`RotationError`
    naming ``what`` after ``timeout`` (the model's clock is simulated, so the bound holds there
    too)."""
    deadline = cluster.now() + timeout
    while True:
        if done():
            return
        if cluster.now() >= deadline:
            raise RotationError(f"timed out after {timeout:.0f} s waiting for {what}")
        cluster.sleep(poll)
