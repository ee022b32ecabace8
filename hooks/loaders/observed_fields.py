"""What every loader of observed objects shares: metadata checked strictly, the rest read leniently.

An observed object's ``metadata`` must be an object whose ``name`` is the object's key in its
group, with ``labels`` and ``annotations`` maps of strings to strings (absent or ``null``:
empty), as the API server always sends them; anything else is junk the hook cannot read,
refused with an :class:`ObservedError` (the envelope answers 400). Every other field is read
by the lenient readers here: what is not of the expected type reads as empty or ``None``,
never as an error (:mod:`hooks.loaders.observed`, :mod:`hooks.loaders.observed_children`,
:mod:`hooks.loaders.previous_status` load with them).

Pure: plain mappings in, plain values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hooks.domain.observed import EMPTY, parse_time


class ObservedError(ValueError):
    """An observed object's ``metadata`` is junk: the request cannot be read."""


def checked_metadata(group: str, key: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``obj``'s metadata, checked: an object named ``key`` with string maps."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if name != key:
        raise ObservedError(f"{group}[{key!r}] has metadata.name {name!r}")
    assert isinstance(metadata, Mapping)
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if value is not None and not _string_map(value):
            raise ObservedError(
                f"{group}[{key!r}] has metadata.{field} that is not a map of strings to strings"
            )
    return metadata


def _string_map(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def strings(metadata: Mapping[str, Any], field: str) -> Mapping[str, str]:
    """``metadata``'s ``labels`` or ``annotations`` (checked already), frozen; absent: empty."""
    value = metadata.get(field)
    return MappingProxyType(dict(value)) if value else EMPTY


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else empty (a field of the wrong type reads as absent)."""
    return value if isinstance(value, Mapping) else EMPTY


def integer(value: object) -> int | None:
    """An integer, never a boolean (JSON's ``true`` is not a timeline)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text(value: object) -> str | None:
    """A non-empty string, else ``None``."""
    return value if isinstance(value, str) and value else None


def is_time(value: object) -> bool:
    """Whether ``value`` is a Kubernetes timestamp the domain can read."""
    return isinstance(value, str) and parse_time(value) is not None
