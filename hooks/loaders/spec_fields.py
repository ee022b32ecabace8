"""What the loaders share: strict marshmallow field types, Kubernetes name rules, messages.

:mod:`hooks.loaders.schemas` (the spec), :mod:`hooks.loaders.part_schemas` (its optional
sections) and :mod:`hooks.loaders.envelope` (the request around it) build on these, so a
rule such as "a label key" or "a JSON boolean, not 1" is written once.

Pure: no I/O, no web framework.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from marshmallow import ValidationError, fields, validate

from hooks.domain.model import SpecProblem

#: ``\Z``, not ``$``: Python's ``$`` also matches before a trailing newline, which the API
#: server's patterns (Go) refuse, and so must the hook.
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)\Z")
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")
#: The Service types a spec may ask for (the CRD's enum).
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")


class StrictBoolean(fields.Boolean):
    """Only JSON ``true``/``false``: ``fields.Boolean`` also takes 1, 0 and 1.0 (1 == True)."""

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class StrictNumber(fields.Float):
    """Only a JSON number, as the CRD's ``type: number``: ``fields.Float`` also takes "1"."""

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid")
        # Float's own check (allow_nan: json.loads reads NaN and Infinity) reads only value.
        return float(super()._deserialize(value, attr, data, **kwargs))  # pragma: no mutate


def label_key(key: str) -> bool:
    """Whether ``key`` is a Kubernetes label (or annotation) key: ``[prefix/]name``."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not DNS_1123_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))  # the pattern needs a character


def check_labels(value: Mapping[str, str], *, what: str, values_are_labels: bool) -> None:
    """Raise :class:`ValidationError` for the first key (or label value) that is not valid."""
    for key, item in value.items():
        if not label_key(key):
            raise ValidationError(f"{key!r} is not a valid {what} key")
        if values_are_labels and (len(item) > 63 or not LABEL_VALUE.match(item)):
            raise ValidationError(f"{item!r} (for {key!r}) is not a valid label value")


# Field factories run once, at import (class bodies): no mutant of them is ever active while
# the tests run, so mutmut leaves them alone.
def service_name() -> fields.String:  # pragma: no mutate block
    """A Service name: a DNS-1035 label."""
    return fields.String(
        required=True,
        validate=[
            validate.Length(min=1, max=63),
            validate.Regexp(DNS_1035, error="must be a DNS-1035 label (lower case, a-z0-9-)"),
        ],
    )


def bounded_integer(default: int, low: int, high: int) -> fields.Integer:  # pragma: no mutate block
    """A whole number in ``[low, high]`` (never a float or a string), ``default`` when absent."""
    return fields.Integer(
        load_default=default, strict=True, validate=validate.Range(min=low, max=high)
    )


def string_map(default: Any) -> fields.Dict:  # pragma: no mutate block (runs at import)
    """A ``{string: string}`` map (labels, annotations) loaded as ``default`` when absent."""
    return fields.Dict(keys=fields.String(), values=fields.String(), load_default=default)


def flatten(messages: object, path: str) -> list[SpecProblem]:
    """marshmallow's nested ``{field: [msg]}`` → ``[SpecProblem("spec.a.b", msg)]``."""
    if isinstance(messages, Mapping):
        problems: list[SpecProblem] = []
        for key in sorted(messages, key=str):
            child = path if key == "_schema" else f"{path}.{key}"
            problems.extend(flatten(messages[key], child))
        return problems
    if isinstance(messages, list):
        flat: list[SpecProblem] = []
        for item in messages:
            flat.extend(flatten(item, path))
        return flat
    return [SpecProblem(path, str(messages))]
