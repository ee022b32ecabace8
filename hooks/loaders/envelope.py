"""The requests Metacontroller sends, checked: a broken one raises :class:`RequestError`.

A **broken request** (not JSON, not an object, no parent, no children map, an observed
object whose ``metadata`` cannot be read: :mod:`hooks.loaders.observed`) raises
:class:`RequestError`; the app answers HTTP 400, which Metacontroller treats as "change
nothing, retry with backoff". The parent's spec inside a well-formed request is loaded
by :func:`hooks.loaders.schemas.load_spec`: an invalid spec is not a broken request (rule 4 of
the design card), it becomes a :class:`~hooks.domain.request.SyncRequest` whose ``spec`` is
``None`` and whose ``spec_problems`` name each field.

Pure: no I/O, no web framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate

from hooks.domain.model import (
    SERVICE_KEY,
    ClusterSpec,
)
from hooks.domain.request import SyncRequest
from hooks.domain.scope import OPERATORS, CustomizeScope, ParentSelector, Requirement
from hooks.loaders.observed import ObservedError, load_observed
from hooks.loaders.schemas import load_spec
from hooks.loaders.spec_fields import StrictBoolean, flatten


class RequestError(ValueError):
    """The request itself is broken: answer 400 and let Metacontroller retry."""


class _MetadataSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    name = fields.String(required=True, validate=validate.Length(min=1, max=253))
    namespace = fields.String(required=True, validate=validate.Length(min=1, max=63))
    generation = fields.Integer(load_default=None, allow_none=True, strict=True)
    uid = fields.String(load_default=None, allow_none=True)


class _ParentSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    metadata = fields.Nested(_MetadataSchema, required=True)
    spec = fields.Raw(load_default=None, allow_none=True)


class SyncEnvelopeSchema(Schema):
    """The v1 sync/finalize request: ``controller, parent, children, related, finalizing``."""

    class Meta:
        unknown = EXCLUDE

    parent = fields.Dict(required=True)
    children = fields.Dict(
        keys=fields.String(),
        values=fields.Dict(keys=fields.String(), values=fields.Dict()),
        required=True,
    )
    related = fields.Dict(
        keys=fields.String(),
        values=fields.Dict(keys=fields.String(), values=fields.Dict()),
        load_default=dict,
    )
    finalizing = StrictBoolean(load_default=False)


class CustomizeEnvelopeSchema(Schema):
    """The v1 customize request: ``controller, parent``."""

    class Meta:
        unknown = EXCLUDE

    parent = fields.Dict(required=True)
    controller = fields.Raw(load_default=None, allow_none=True)


def _describe(messages: object) -> str:
    problems = flatten(messages, "request")
    return "; ".join(f"{p.field.removeprefix('request.')}: {p.message}" for p in problems)


def _load_parent(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        parent: Mapping[str, Any] = _PARENT.load(raw)
    except ValidationError as error:
        raise RequestError(f"invalid parent: {_describe(error.messages)}") from None
    return parent


_NOT_A_MAPPING = "Not a valid mapping type."
_NOT_NULL = "Field may not be null."
_MISSING = "Missing data for required field."


def _group_errors(value: object) -> dict[str, Any] | list[str] | None:
    """``fields.Dict(keys=String, values=Dict(keys=String, values=Dict()))``'s errors."""
    if value is None:
        return [_NOT_NULL]
    if not isinstance(value, Mapping):
        return [_NOT_A_MAPPING]
    errors: dict[str, Any] = {}
    for key, objects in value.items():
        problems = _entry_problems(key, objects)
        if "value" not in problems:  # a mapping: its objects are checked one level down
            inner = {name: p for name, obj in objects.items() if (p := _entry_problems(name, obj))}
            if inner:
                problems["value"] = inner
        if problems:
            errors[key] = problems
    return errors or None


def _entry_problems(key: object, value: object) -> dict[str, Any]:
    """marshmallow's errors for one entry of a ``Dict(keys=String, values=<a mapping>)``."""
    problems: dict[str, Any] = {}
    if not isinstance(key, str):
        problems["key"] = ["Not a valid string."]
    if value is None:
        problems["value"] = [_NOT_NULL]
    elif not isinstance(value, Mapping):
        problems["value"] = [_NOT_A_MAPPING]
    return problems


def check_sync_envelope(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """What :class:`SyncEnvelopeSchema` loads, with its error messages, without copying.

    The envelope is almost all of a request (the related Pods with their managedFields):
    marshmallow's ``Dict`` fields copied every group and every object in it, to check
    only that each is a mapping. These are the same checks and the same messages
    (``tests/test_schemas.py`` compares both on generated envelopes), on the objects as
    parsed; nothing downstream mutates them.
    """
    errors: dict[str, Any] = {}
    parent = body.get("parent", _ABSENT)
    if parent is _ABSENT:
        errors["parent"] = [_MISSING]
    elif parent is None:
        errors["parent"] = [_NOT_NULL]
    elif not isinstance(parent, Mapping):
        errors["parent"] = [_NOT_A_MAPPING]
    children = body.get("children", _ABSENT)
    problem = [_MISSING] if children is _ABSENT else _group_errors(children)
    if problem:
        errors["children"] = problem
    related = body.get("related", _ABSENT)
    if related is not _ABSENT:
        problem = _group_errors(related)
        if problem:
            errors["related"] = problem
    finalizing = body.get("finalizing", False)
    if finalizing is None:
        errors["finalizing"] = [_NOT_NULL]
    elif not isinstance(finalizing, bool):
        errors["finalizing"] = ["Not a valid boolean."]
    if errors:
        raise ValidationError(errors)
    return {
        "parent": parent,
        "children": children,
        "related": {} if related is _ABSENT else related,
        "finalizing": finalizing,
    }


_ABSENT = object()


def load_sync_request(body: object, *, max_pods: int | None = None) -> SyncRequest:
    """Check a sync/finalize request body (already JSON-decoded).

    ``max_pods``: more related Pods than that are only counted, not loaded
    (:attr:`SyncRequest.pod_count`): the hook refuses such a cluster by their number, and
    loading hundreds of Pods for a refusal would only cost time and memory.
    """
    if not isinstance(body, Mapping):
        raise RequestError(f"request body must be a JSON object, not {type(body).__name__}")
    try:
        envelope = check_sync_envelope(body)
    except ValidationError as error:
        raise RequestError(f"invalid sync request: {_describe(error.messages)}") from None
    parent = _load_parent(envelope["parent"])
    children: Mapping[str, Mapping[str, Mapping[str, Any]]] = envelope["children"]
    if SERVICE_KEY not in children:
        # Metacontroller always sends an entry per child type, even an empty one. Without
        # it we cannot know whether the Service exists, so no reply would be safe.
        raise RequestError(f"invalid sync request: children has no {SERVICE_KEY!r} entry")
    raw = envelope["parent"]
    try:
        observed = load_observed(
            children, envelope["related"], raw.get("status"), max_pods=max_pods
        )
    except ObservedError as error:
        raise RequestError(f"invalid sync request: {error}") from None
    spec, problems = load_spec(parent["spec"])
    metadata = parent["metadata"]
    return SyncRequest(
        namespace=metadata["namespace"],
        name=metadata["name"],
        generation=metadata["generation"],
        spec=spec,
        spec_problems=problems,
        services=observed.services,
        other_children=observed.other_children,
        pods=observed.pods,
        finalizing=envelope["finalizing"],
        uid=metadata["uid"],
        jobs=observed.jobs,
        slices=observed.slices,
        cronjobs=observed.cronjobs,
        previous=observed.previous,
        pod_count=observed.pod_count,
        pods_related=observed.pods_related,
        named_services=observed.named_services,
        api_version=str(raw.get("apiVersion", "adg.io/v1alpha1")),
        kind=str(raw.get("kind", "PostgreSQLCluster")),
    )


def load_customize_request(body: object) -> tuple[str, ClusterSpec | None]:
    """Check a customize request; return the cluster's ``namespace/name`` and its spec."""
    cluster, spec, _, _ = load_customize_call(body)
    return cluster, spec


def load_customize_call(
    body: object,
) -> tuple[str, ClusterSpec | None, str | None, CustomizeScope | None]:
    """:func:`load_customize_request` plus the parent's ``metadata.uid`` (if it has one) and
    the :class:`CustomizeScope` of the call (``None`` when the request's controller or the
    parent's labels cannot be read: the caller then answers full rules)."""
    if not isinstance(body, Mapping):
        raise RequestError(f"request body must be a JSON object, not {type(body).__name__}")
    try:
        envelope: Mapping[str, Any] = _CUSTOMIZE_ENVELOPE.load(body)
    except ValidationError as error:
        raise RequestError(f"invalid customize request: {_describe(error.messages)}") from None
    parent = _load_parent(envelope["parent"])
    spec, _ = load_spec(parent["spec"])
    metadata = parent["metadata"]
    scope = load_scope(envelope.get("controller"), envelope["parent"])
    return f"{metadata['namespace']}/{metadata['name']}", spec, metadata["uid"], scope


def load_scope(controller: object, parent: Mapping[str, Any]) -> CustomizeScope | None:
    """The calling CompositeController's name and ``parentResource.labelSelector`` and the
    parent's labels and finalizers; ``None`` if any of it is not as Kubernetes writes it."""
    if not isinstance(controller, Mapping):
        return None
    name = _get(controller, "metadata", "name")
    resource = _get(controller, "spec", "parentResource")
    metadata = parent.get("metadata")
    if not isinstance(name, str) or not name or not isinstance(resource, Mapping):
        return None
    if not isinstance(metadata, Mapping):
        return None
    labels = _or(metadata.get("labels"), {})
    finalizers = _or(metadata.get("finalizers"), [])
    if not _string_map(labels):
        return None
    if not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers):
        return None
    raw = resource.get("labelSelector")
    selector = None if raw is None else _load_selector(raw)
    if raw is not None and selector is None:
        return None
    return CustomizeScope(name, selector, dict(labels), tuple(finalizers))


def _or(value: object, default: object) -> object:
    """``value``, or ``default`` for a missing (``null``) one; an empty value of the wrong
    type stays wrong (``[]`` is not a map of labels)."""
    return default if value is None else value


def _get(obj: Mapping[str, Any], *path: str) -> object:
    found: object = obj
    for key in path:
        if not isinstance(found, Mapping):
            return None
        found = found.get(key)
    return found


def _string_map(value: object) -> TypeGuard[Mapping[str, str]]:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _load_selector(raw: object) -> ParentSelector | None:
    """A ``metav1.LabelSelector``; ``None`` if malformed (unknown operator, wrong types)."""
    if not isinstance(raw, Mapping):
        return None
    labels = _or(raw.get("matchLabels"), {})
    expressions = _or(raw.get("matchExpressions"), [])
    if not _string_map(labels) or not isinstance(expressions, list):
        return None
    requirements = []
    for entry in expressions:
        if not isinstance(entry, Mapping):
            return None
        key, operator, values = (
            entry.get("key"),
            entry.get("operator"),
            _or(entry.get("values"), []),
        )
        if not isinstance(key, str) or operator not in OPERATORS or not isinstance(values, list):
            return None
        if not all(isinstance(v, str) for v in values):
            return None
        requirements.append(Requirement(key, str(operator), tuple(values)))
    return ParentSelector(tuple(sorted(labels.items())), tuple(requirements))


# ------------------------------------------------------------- shared instances
# One instance of each schema per process, shared by all request threads (see
# hooks/loaders/schemas.py): loaded once here, at import, before any request thread exists.
_PARENT = _ParentSchema()
_CUSTOMIZE_ENVELOPE = CustomizeEnvelopeSchema()
_PARENT.load({"metadata": {"name": "warm", "namespace": "warm"}})
