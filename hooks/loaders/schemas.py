"""The loader of ``PostgreSQLCluster.spec``, with marshmallow.

An **invalid spec** is not an error of the request (rule 4 of the design card): it
loads into ``(None, problems)``, each :class:`~hooks.domain.model.SpecProblem` naming a field,
so the sync reply can keep the observed Service and say why in a condition. A broken
request is :mod:`hooks.loaders.envelope`'s business.

Every default is the :mod:`hooks.domain.model` dataclass's own
(:func:`~hooks.domain.model.field_default`): a default is written once. The optional
sections' loaders are in :mod:`hooks.loaders.part_schemas`.

Pure: no I/O, no web framework.
"""

from __future__ import annotations

import ipaddress
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
    LEADER_PATHS,
    ClusterSpec,
    ReplicaServiceSpec,
    ServicePort,
    SpecProblem,
    SwitchoverSpec,
    field_default,
)
from hooks.loaders.part_schemas import BackupSchema, ReplicaServiceSchema, SwitchoverSchema
from hooks.loaders.spec_fields import (
    DNS_1123_SUBDOMAIN,
    IANA_SVC_NAME,
    SERVICE_TYPES,
    StrictBoolean,
    StrictNumber,
    bounded_integer,
    check_labels,
    flatten,
    service_name,
    string_map,
)


def _not_an_address(value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return
    raise ValidationError(
        "must be a DNS name; to verify against the pod IP, leave serverName unset"
    )


class _PatroniTLSSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    serverName = fields.String(
        load_default=field_default(ClusterSpec, "patroni_server_name"),
        validate=[
            validate.Length(min=1, max=253),
            validate.Regexp(
                DNS_1123_SUBDOMAIN,
                error="must be a DNS name (lower case a-z0-9-, dot-separated)",
            ),
            _not_an_address,
        ],
    )


class _PatroniSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    port = bounded_integer(field_default(ClusterSpec, "patroni_port"), 1, 65535)
    scheme = fields.String(
        load_default=field_default(ClusterSpec, "patroni_scheme"),
        validate=validate.OneOf(["http", "https"]),
    )
    connectTimeoutSeconds = StrictNumber(
        load_default=field_default(ClusterSpec, "connect_timeout"),
        allow_nan=False,
        validate=validate.Range(min=0.05, max=5),
    )
    readTimeoutSeconds = StrictNumber(
        load_default=field_default(ClusterSpec, "read_timeout"),
        allow_nan=False,
        validate=validate.Range(min=0.05, max=5),
    )
    memberNameMustMatchPod = StrictBoolean(
        load_default=field_default(ClusterSpec, "verify_member_name")
    )
    tls = fields.Nested(_PatroniTLSSchema, load_default=lambda: dict(_DEFAULT_PATRONI_TLS))
    bootstrapLabels = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        load_default=dict,
        validate=validate.Length(max=64, error="at most {max} labels"),
    )

    @validates_schema
    def _bootstrap_labels_are_labels(self, data: Mapping[str, Any], **_: Any) -> None:
        try:
            check_labels(data.get("bootstrapLabels") or {}, what="label", values_are_labels=True)
        except ValidationError as error:
            raise ValidationError(error.messages, "bootstrapLabels") from None

    @validates_schema
    def _tls_needs_https(self, data: Mapping[str, Any], **_: Any) -> None:
        tls = data.get("tls") or {}
        if tls.get("serverName") is not None and data.get("scheme") != "https":
            raise ValidationError("serverName is only used with scheme https", "tls")


class _PortSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    name = fields.String(
        required=True,
        validate=[validate.Length(max=15), validate.Regexp(IANA_SVC_NAME)],
    )
    port = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=65535))
    targetPort = fields.Raw(load_default=None)
    protocol = fields.String(
        load_default=field_default(ServicePort, "protocol"), validate=validate.OneOf(["TCP"])
    )

    @validates_schema
    def _target_port(self, data: Mapping[str, Any], **_: Any) -> None:
        target = data.get("targetPort")
        if target is None:
            return
        if isinstance(target, bool) or not isinstance(target, int | str):
            raise ValidationError("must be a port number or a port name", "targetPort")
        if isinstance(target, int) and not 1 <= target <= 65535:
            raise ValidationError("must be between 1 and 65535", "targetPort")
        if isinstance(target, str) and not (
            # Kubernetes' IsValidPortName: also at least one letter and no "--"
            len(target) <= 15
            and IANA_SVC_NAME.match(target)
            and re.search("[a-z]", target)
            and "--" not in target
        ):
            raise ValidationError(f"{target!r} is not a valid port name", "targetPort")

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> ServicePort:
        target = data.get("targetPort")
        return ServicePort(
            name=data["name"],
            port=data["port"],
            target_port=data["port"] if target is None else target,
            protocol=data["protocol"],
        )


#: A ServicePort is immutable, so every spec without ports can share the model's.
_DEFAULT_SERVICE_PORTS: tuple[ServicePort, ...] = field_default(ClusterSpec, "service_ports")


class _ServiceTemplateSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    type = fields.String(
        load_default=field_default(ClusterSpec, "service_type"),
        validate=validate.OneOf(SERVICE_TYPES),
    )
    ports = fields.List(
        fields.Nested(_PortSchema),
        load_default=lambda: list(_DEFAULT_SERVICE_PORTS),
        validate=validate.Length(min=1, max=16),
    )
    labels = string_map(field_default(ClusterSpec, "service_labels"))
    annotations = string_map(field_default(ClusterSpec, "service_annotations"))

    @validates_schema
    def _unique_ports(self, data: Mapping[str, Any], **_: Any) -> None:
        ports: list[ServicePort] = data.get("ports", [])
        for attribute in ("name", "port"):
            seen = [getattr(p, attribute) for p in ports]
            dupes = sorted({str(v) for v in seen if seen.count(v) > 1})
            if dupes:
                raise ValidationError(f"duplicate port {attribute}: {', '.join(dupes)}", "ports")
        check_labels(data.get("labels", {}), what="label", values_are_labels=True)
        check_labels(data.get("annotations", {}), what="annotation", values_are_labels=False)


class _ServiceRefSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    name = service_name()


def _patroni_object_names(scope: str) -> set[str]:
    """The objects Patroni's Kubernetes DCS names after its scope (``cluster-name``)."""
    return {scope, *(f"{scope}-{s}" for s in ("config", "leader", "sync", "failover"))}


class ClusterSpecSchema(Schema):
    """``PostgreSQLCluster.spec`` (the CRD in ``metacontroller/crd.yaml`` is the contract)."""

    class Meta:
        # The API server prunes fields the CRD does not know; anything unknown here comes
        # from a CRD newer than this hook (a rolling upgrade) and is safe to ignore.
        unknown = EXCLUDE

    primarySelector = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        required=True,
        validate=validate.Length(min=1, error="must name at least one label"),
    )
    serviceRef = fields.Nested(_ServiceRefSchema, required=True)
    healthCheckPath = fields.String(
        load_default=field_default(ClusterSpec, "health_check_path"),
        validate=validate.OneOf(
            list(LEADER_PATHS),
            error="must be one of Patroni's leader paths: {choices}",
        ),
    )
    # Defaults are loaded once (module end) and copied per request: instantiating a
    # marshmallow Schema deep-copies its fields, which cost more than the whole load.
    patroni = fields.Nested(_PatroniSchema, load_default=lambda: dict(_DEFAULT_PATRONI))
    service = fields.Nested(_ServiceTemplateSchema, load_default=lambda: dict(_DEFAULT_SERVICE))
    replicaService = fields.Nested(
        ReplicaServiceSchema, load_default=field_default(ClusterSpec, "replica_service")
    )
    backup = fields.Nested(BackupSchema, load_default=field_default(ClusterSpec, "backup"))
    switchover = fields.Nested(SwitchoverSchema, load_default=None)

    @validates_schema
    def _role_label_is_not_selected_on(self, data: Mapping[str, Any], **_: Any) -> None:
        switchover = data.get("switchover")
        role_label = switchover.role_label if isinstance(switchover, SwitchoverSpec) else None
        if role_label is not None and role_label.key in data.get("primarySelector", {}):
            # Every member carries a different value: the replicas would not be related
            # Pods, and the role would be decided by a label instead of by Patroni.
            raise ValidationError(
                f"{role_label.key!r} is a primarySelector key; the role label must not select "
                "the member Pods",
                "switchover",
            )

    @validates_schema
    def _selector_and_name(self, data: Mapping[str, Any], **_: Any) -> None:
        selector: Mapping[str, str] = data.get("primarySelector", {})
        try:
            check_labels(selector, what="label", values_are_labels=True)
        except ValidationError as error:
            raise ValidationError(error.messages, "primarySelector") from None
        name = data.get("serviceRef", {}).get("name")
        scope = selector.get("cluster-name")
        # Patroni's Kubernetes DCS owns these names; a Service with a selector named
        # like its leader Endpoints would make the endpoints controller fight Patroni.
        if name and scope and name in _patroni_object_names(scope):
            raise ValidationError(
                f"{name!r} is one of Patroni's own object names for scope {scope!r}",
                "serviceRef",
            )

    @validates_schema
    def _replica_service_name(self, data: Mapping[str, Any], **_: Any) -> None:
        replica = data.get("replicaService")
        if not isinstance(replica, ReplicaServiceSpec):
            return
        if replica.name == data.get("serviceRef", {}).get("name"):
            raise ValidationError(
                "must not be the name of the primary Service (spec.serviceRef.name)",
                "replicaService",
            )
        scope = data.get("primarySelector", {}).get("cluster-name")
        if scope and replica.name in _patroni_object_names(scope):
            raise ValidationError(
                f"{replica.name!r} is one of Patroni's own object names for scope {scope!r}",
                "replicaService",
            )

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> ClusterSpec:
        patroni = data["patroni"]
        service = data["service"]
        return ClusterSpec(
            primary_selector=dict(data["primarySelector"]),
            service_name=data["serviceRef"]["name"],
            health_check_path=data["healthCheckPath"],
            patroni_port=patroni["port"],
            patroni_scheme=patroni["scheme"],
            connect_timeout=patroni["connectTimeoutSeconds"],
            read_timeout=patroni["readTimeoutSeconds"],
            verify_member_name=patroni["memberNameMustMatchPod"],
            patroni_server_name=patroni["tls"]["serverName"],
            bootstrap_labels=dict(patroni["bootstrapLabels"]),
            service_type=service["type"],
            service_ports=tuple(service["ports"]),
            service_labels=dict(service["labels"]),
            service_annotations=dict(service["annotations"]),
            replica_service=data["replicaService"],
            backup=data["backup"],
            switchover=data["switchover"] or _DEFAULT_SWITCHOVER,
        )


#: Without ``spec.switchover``: poll at the operator's setting, Patroni's own labels.
_DEFAULT_SWITCHOVER = SwitchoverSpec()


def load_spec(spec: object) -> tuple[ClusterSpec | None, tuple[SpecProblem, ...]]:
    """Validate a parent's spec; never raises."""
    if not isinstance(spec, Mapping):
        return None, (SpecProblem("spec", "must be an object"),)
    try:
        loaded = _CLUSTER_SPEC.load(spec)
    except ValidationError as error:
        return None, tuple(flatten(error.messages, "spec"))
    assert isinstance(loaded, ClusterSpec)
    return loaded, ()


# ------------------------------------------------------------- shared instances
# One instance of each schema per process, shared by all request threads. marshmallow
# 4's ``load`` keeps no per-call state on the schema (errors live in a per-call store;
# there is no ``context`` any more); the only lazy state is each ``Nested`` field's
# cached inner schema, which the defaults below create here, at import, before any
# request thread exists.
_DEFAULT_PATRONI_TLS: Mapping[str, Any] = _PatroniTLSSchema().load({})
_DEFAULT_PATRONI: Mapping[str, Any] = _PatroniSchema().load({})
_DEFAULT_SERVICE: Mapping[str, Any] = _ServiceTemplateSchema().load({})
_CLUSTER_SPEC = ClusterSpecSchema()
# Every Nested field of the spec, loaded once so each creates its inner schema now.
_CLUSTER_SPEC.load(
    {
        "primarySelector": {"a": "b"},
        "serviceRef": {"name": "warm"},
        "patroni": {"scheme": "https", "tls": {"serverName": "warm.example"}},
        "service": {"ports": [port.as_manifest() for port in _DEFAULT_SERVICE_PORTS]},
        "replicaService": {"name": "warm-ro"},
        "backup": {
            "schedule": "@daily",
            "image": "warm",
            "pvcName": "warm",
            "secretName": "warm",
            "resources": {"requests": {"cpu": "1"}},
        },
        "switchover": {"roleLabel": {"key": "warm"}},
    }
)
