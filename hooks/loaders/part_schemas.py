"""Loaders of the spec's optional sections: ``replicaService``, ``backup``, ``switchover``.

Each loads into its :mod:`hooks.domain.model` dataclass, with that dataclass's defaults
(:func:`~hooks.domain.model.field_default`); :class:`hooks.loaders.schemas.ClusterSpecSchema`
nests them.

Pure: no I/O, no web framework.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from marshmallow import (
    EXCLUDE,
    Schema,
    ValidationError,
    fields,
    post_load,
    validate,
    validates_schema,
)

from hooks.domain.model import (
    CONSISTENCY_LEVELS,
    MAX_POLL_SECONDS,
    MIN_POLL_SECONDS,
    QUANTITY,
    TRAFFIC_DISTRIBUTIONS,
    WHEN_NO_REPLICA,
    BackupSpec,
    ReplicaServiceSpec,
    RoleLabelSpec,
    SwitchoverSpec,
    field_default,
)
from hooks.loaders.spec_fields import (
    DNS_1123_SUBDOMAIN,
    LABEL_VALUE,
    SERVICE_TYPES,
    StrictBoolean,
    StrictNumber,
    bounded_integer,
    check_labels,
    label_key,
    service_name,
    string_map,
)

_CRON_FIELD = r"[0-9A-Za-z*?/,-]+"
#: Five cron fields or one of the macros CronJob accepts (no ``TZ=``: use the cluster's zone).
_CRON_MACRO = "@(annually|yearly|monthly|weekly|daily|midnight|hourly)"
_CRON_SCHEDULE = re.compile(rf"^({_CRON_MACRO}|{_CRON_FIELD}( +{_CRON_FIELD}){{4}})\Z")


class ReplicaServiceSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    name = service_name()
    maxLagBytes = bounded_integer(field_default(ReplicaServiceSpec, "max_lag_bytes"), 0, 2**63 - 1)
    whenNoReplica = fields.String(
        load_default=field_default(ReplicaServiceSpec, "when_no_replica"),
        validate=validate.OneOf(WHEN_NO_REPLICA),
    )
    includePausedReplicas = StrictBoolean(
        load_default=field_default(ReplicaServiceSpec, "include_paused_replicas")
    )
    consistency = fields.String(
        load_default=field_default(ReplicaServiceSpec, "consistency"),
        validate=validate.OneOf(
            CONSISTENCY_LEVELS,
            error="must be one of: {choices} (lag: replay within maxLagBytes; synchronous: "
            "also a sync standby of the leader; quorum: also a quorum standby, Patroni >= 4.0)",
        ),
    )
    trafficDistribution = fields.String(
        load_default=None,
        validate=validate.OneOf(
            TRAFFIC_DISTRIBUTIONS,
            error="must be one of: {choices} (same-zone endpoints first, from each member "
            "Pod's topology.kubernetes.io/zone label; PreferClose is the name before "
            "Kubernetes 1.34)",
        ),
    )
    type = fields.String(
        load_default=field_default(ReplicaServiceSpec, "service_type"),
        validate=validate.OneOf(SERVICE_TYPES),
    )
    labels = string_map(field_default(ReplicaServiceSpec, "labels"))
    annotations = string_map(field_default(ReplicaServiceSpec, "annotations"))

    @validates_schema
    def _metadata(self, data: Mapping[str, Any], **_: Any) -> None:
        check_labels(data.get("labels", {}), what="label", values_are_labels=True)
        check_labels(data.get("annotations", {}), what="annotation", values_are_labels=False)

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> ReplicaServiceSpec:
        return ReplicaServiceSpec(
            name=data["name"],
            max_lag_bytes=data["maxLagBytes"],
            when_no_replica=data["whenNoReplica"],
            include_paused_replicas=data["includePausedReplicas"],
            consistency=data["consistency"],
            traffic_distribution=data["trafficDistribution"],
            service_type=data["type"],
            labels=dict(data["labels"]),
            annotations=dict(data["annotations"]),
        )


class ResourcesSchema(Schema):
    """``requests``/``limits``: ``{resource name: quantity}``, a JSON integer or a string."""

    class Meta:
        unknown = EXCLUDE

    requests = fields.Dict(keys=fields.String(), values=fields.Raw(), load_default=dict)
    limits = fields.Dict(keys=fields.String(), values=fields.Raw(), load_default=dict)

    @validates_schema
    def _quantities(self, data: Mapping[str, Any], **_: Any) -> None:
        for group in ("requests", "limits"):
            for key, item in data.get(group, {}).items():
                if not label_key(key):
                    raise ValidationError(f"{key!r} is not a resource name", group)
                if not _quantity_text(item):
                    raise ValidationError(f"{item!r} (for {key!r}) is not a quantity", group)

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> dict[str, dict[str, str]]:
        return {g: {k: _quantity_text(v) for k, v in data[g].items()} for g in data}


def _quantity_text(value: object) -> str:
    """A quantity as the string Kubernetes reads, ``""`` if it is none."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        value = str(value)
    return value if isinstance(value, str) and QUANTITY.match(value) else ""


class BackupSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    schedule = fields.String(
        required=True,
        validate=validate.Regexp(
            _CRON_SCHEDULE, error="must be a cron schedule (5 fields) or @hourly, @daily, ..."
        ),
    )
    image = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=1024), validate.Regexp(r"^\S+\Z")],
    )
    pvcName = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=253), validate.Regexp(DNS_1123_SUBDOMAIN)],
    )
    secretName = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=253), validate.Regexp(DNS_1123_SUBDOMAIN)],
    )
    keep = bounded_integer(field_default(BackupSpec, "keep"), 1, 100)
    runAsUser = bounded_integer(field_default(BackupSpec, "run_as_user"), 1, 2**31 - 1)
    activeDeadlineSeconds = bounded_integer(
        field_default(BackupSpec, "active_deadline_seconds"), 60, 7 * 24 * 3600
    )
    resources = fields.Nested(ResourcesSchema, load_default=lambda: {"requests": {}, "limits": {}})

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> BackupSpec:
        resources = {k: dict(v) for k, v in data["resources"].items() if v}
        return BackupSpec(
            schedule=data["schedule"],
            image=data["image"],
            pvc_name=data["pvcName"],
            secret_name=data["secretName"],
            keep=data["keep"],
            run_as_user=data["runAsUser"],
            active_deadline_seconds=data["activeDeadlineSeconds"],
            resources=resources,
        )


def _resync_seconds(default: float | None) -> fields.Float:  # pragma: no mutate block (import)
    return StrictNumber(
        load_default=default,
        allow_nan=False,
        validate=validate.Range(min=MIN_POLL_SECONDS, max=MAX_POLL_SECONDS),
    )


class RoleLabelSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    key = fields.String(required=True, validate=validate.Length(min=1, max=317))
    leaderValue = fields.String(
        load_default=field_default(RoleLabelSpec, "leader_value"),
        validate=[validate.Length(min=1, max=63), validate.Regexp(LABEL_VALUE)],
    )
    replicaValue = fields.String(
        load_default=field_default(RoleLabelSpec, "replica_value"),
        validate=[validate.Length(min=1, max=63), validate.Regexp(LABEL_VALUE)],
    )

    @validates_schema
    def _label(self, data: Mapping[str, Any], **_: Any) -> None:
        key = data.get("key")
        if isinstance(key, str) and not label_key(key):
            raise ValidationError(f"{key!r} is not a valid label key", "key")
        if data.get("leaderValue") == data.get("replicaValue"):
            raise ValidationError("must differ from leaderValue", "replicaValue")

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> RoleLabelSpec:
        return RoleLabelSpec(data["key"], data["leaderValue"], data["replicaValue"])


class SwitchoverSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    pollSeconds = _resync_seconds(field_default(SwitchoverSpec, "poll_seconds"))
    eventDrivenResyncSeconds = _resync_seconds(
        field_default(SwitchoverSpec, "event_driven_resync_seconds")
    )
    roleLabel = fields.Nested(RoleLabelSchema, load_default=None)

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> SwitchoverSpec:
        return SwitchoverSpec(
            poll_seconds=data["pollSeconds"],
            event_driven_resync_seconds=data["eventDrivenResyncSeconds"],
            role_label=data["roleLabel"],
        )
