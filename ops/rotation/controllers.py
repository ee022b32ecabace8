"""Reading and re-pointing CompositeControllers, for both rotations: where a spec may carry
caller credentials, the value at a path of it, the JSON patch pointer, and :func:`repoint`, which
patches every controller and then waits until Metacontroller rebuilt each one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ops.rotation.cluster import (
    EVENT_CREATE_ERROR,
    EVENT_STARTED,
    Cluster,
    Report,
    RotationError,
    Timing,
    wait_until,
)


def json_pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) from path parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def auth_locations(spec: Mapping[str, Any]) -> list[tuple[str | int, ...]]:
    """Paths (under ``/spec``) of every object that may carry caller credentials:
    each ``endpointConfigs[i]`` and each hook's ``webhook``."""
    locations: list[tuple[str | int, ...]] = []
    for i, _ in enumerate(spec.get("endpointConfigs") or []):
        locations.append(("endpointConfigs", i))
    for hook, value in sorted((spec.get("hooks") or {}).items()):
        if isinstance(value, Mapping) and isinstance(value.get("webhook"), Mapping):
            locations.append(("hooks", hook, "webhook"))
    return locations


def value_at(spec: Mapping[str, Any], path: Sequence[str | int]) -> Any:
    """What ``spec`` holds at ``path`` (keys of maps, indexes of lists), ``None`` if nothing."""
    node: Any = spec
    for part in path:
        if isinstance(node, Mapping) and isinstance(part, str):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def controller_name(cc: Mapping[str, Any]) -> str:
    """The CompositeController's ``metadata.name`` (``""`` if it has none)."""
    return str((cc.get("metadata") or {}).get("name", ""))


def controller_spec(cc: Mapping[str, Any]) -> Mapping[str, Any]:
    """The CompositeController's ``spec`` (``{}`` if it has none)."""
    spec = cc.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def repoint(
    cluster: Cluster,
    timing: Timing,
    patches: Mapping[str, list[dict[str, Any]]],
    report: Report,
    what: str,
) -> None:
    """Patch each CompositeController, then wait until Metacontroller rebuilt every one;
    ``report`` says so, naming ``what`` is re-pointed (the same words for both rotations).

    All are patched before any wait: each runs in its own Metacontroller install (sharded),
    so they rebuild side by side. A failed patch or rebuild stops here, before anything old
    is removed; the message says which controllers already use the new credential.
    """
    report.say(f"pointing {what} in CompositeController(s) {', '.join(patches)}")
    markers = {
        name: (
            _events_count(cluster, name, EVENT_STARTED),
            _events_count(cluster, name, EVENT_CREATE_ERROR),
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
    report.changed = True
    report.say(f"Metacontroller rebuilt {len(patches)} controller(s) (Event Started on each)")


def _events_count(cluster: Cluster, name: str, reason: str) -> int:
    """How many times ``reason`` was recorded so far (Events aggregate by count)."""
    return sum(count for r, _, count in cluster.events(name) if r == reason)


def _wait_rebuilt(
    cluster: Cluster, name: str, timing: Timing, started_before: int, errors_before: int
) -> None:
    """Wait for Metacontroller's ``Started`` Event after the patch; fail on ``CreateError``."""

    def done() -> bool:
        if _events_count(cluster, name, EVENT_CREATE_ERROR) > errors_before:
            messages = [m for r, m, _ in cluster.events(name) if r == EVENT_CREATE_ERROR]
            raise RotationError(
                f"Metacontroller could not rebuild CompositeController {name} "
                f"({messages[-1] if messages else 'CreateError'}); no sync runs until it can. "
                "Nothing old was removed: fix the Secret or point the CompositeController "
                "back at the previous key"
            )
        return _events_count(cluster, name, EVENT_STARTED) > started_before

    wait_until(cluster, timing.rebuild_timeout, timing.poll, done, f"the Started Event on {name}")
