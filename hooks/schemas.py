"""Validation of what Metacontroller sends us, with marshmallow.

Two levels of "bad input" are kept apart on purpose (rule 4 of the design card):

* a **broken request** (not JSON, not an object, no parent, no children map) raises
  :class:`RequestError`; the app answers HTTP 400, which Metacontroller treats as "change
  nothing, retry with backoff";
* an **invalid spec** is not an error of the request: it loads into a
  :class:`SyncRequest` whose ``spec`` is ``None`` and whose ``spec_problems`` name each
  field, so the sync reply can keep the observed Service and say why in a condition.

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

from hooks.model import (
    CRONJOB_KEY,
    DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS,
    DEFAULT_MAX_LAG_BYTES,
    ENDPOINTSLICE_KEY,
    JOB_KEY,
    LEADER_PATHS,
    MAX_POLL_SECONDS,
    MIN_POLL_SECONDS,
    POD_KEY,
    QUANTITY,
    SERVICE_KEY,
    WHEN_NO_REPLICA,
    BackupSpec,
    ClusterSpec,
    ReplicaServiceSpec,
    RoleLabelSpec,
    ServicePort,
    SpecProblem,
    SwitchoverSpec,
    SyncRequest,
)

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


#: Every byte but the four structural brackets and the quote, for ``bytes.translate``.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')


def nesting_problem(raw: bytes, limit: int) -> str | None:
    """Why ``raw`` must not reach the JSON parser (it "nests deeper than …"), or ``None``.

    The check runs *before* parsing so that depth is refused by an explicit rule, not by
    the parser's recursion limit (``RecursionError`` depends on the thread's stack and on
    the interpreter, and a parser that recurses 100 000 levels first has already spent
    the work). It is linear and runs at C speed: strings are cut out, everything but the
    brackets is dropped, then each pass removes one level of innermost ``[]``/``{}``
    pairs; ``limit`` passes at most. Brackets that never pair up cannot be JSON.
    """
    skeleton = bracket_skeleton(raw)
    for _ in range(limit):
        if not skeleton:
            return None
        # One level per pass: a pair is first replaced by a marker, so removing "[]"
        # cannot make a new "{}" pair appear within the same pass.
        reduced = skeleton.replace(b"[]", b"\0").replace(b"{}", b"\0").replace(b"\0", b"")
        if reduced == skeleton:
            return "is not valid JSON: its brackets do not balance"
        skeleton = reduced
    if skeleton:
        return f"nests deeper than {limit} levels"
    return None


def bracket_skeleton(raw: bytes) -> bytes:
    """The brackets of JSON text outside its strings, in order (exact for valid JSON).

    Only ``bytes`` methods, each a C loop (a regular expression over every string of a
    26 KB request cost more than parsing the request): escaped backslashes go first, then
    escaped quotes, so every quote left opens or closes a string; everything but quotes
    and brackets is dropped; two adjacent quotes enclose or separate nothing and go
    (most strings hold no bracket); of what is left, every other piece between quotes
    is outside the strings. UTF-8 never has a quote or a backslash byte inside a
    multi-byte character.
    """
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = unescaped.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in skeleton:
        skeleton = b"".join(skeleton.split(b'"')[::2])
    return skeleton


class RequestError(ValueError):
    """The request itself is broken: answer 400 and let Metacontroller retry."""


class _StrictBoolean(fields.Boolean):
    """Only JSON ``true``/``false``: ``fields.Boolean`` also takes 1, 0 and 1.0 (1 == True)."""

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


# --------------------------------------------------------------------------- spec


def _label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _DNS_1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _check_labels(value: Mapping[str, str], *, what: str, values_are_labels: bool) -> None:
    for key, item in value.items():
        if not _label_key(key):
            raise ValidationError(f"{key!r} is not a valid {what} key")
        if values_are_labels and (len(item) > 63 or not _LABEL_VALUE.match(item)):
            raise ValidationError(f"{item!r} (for {key!r}) is not a valid label value")


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
        load_default=None,
        validate=[
            validate.Length(min=1, max=253),
            validate.Regexp(
                _DNS_1123_SUBDOMAIN,
                error="must be a DNS name (lower case a-z0-9-, dot-separated)",
            ),
            _not_an_address,
        ],
    )


class _PatroniSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    port = fields.Integer(load_default=8008, strict=True, validate=validate.Range(min=1, max=65535))
    scheme = fields.String(load_default="http", validate=validate.OneOf(["http", "https"]))
    connectTimeoutSeconds = fields.Float(
        load_default=0.5, allow_nan=False, validate=validate.Range(min=0.05, max=5)
    )
    readTimeoutSeconds = fields.Float(
        load_default=1.0, allow_nan=False, validate=validate.Range(min=0.05, max=5)
    )
    memberNameMustMatchPod = _StrictBoolean(load_default=True)
    tls = fields.Nested(_PatroniTLSSchema, load_default=lambda: dict(_DEFAULT_PATRONI_TLS))

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
        validate=[validate.Length(max=15), validate.Regexp(_IANA_SVC_NAME)],
    )
    port = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=65535))
    targetPort = fields.Raw(load_default=None)
    protocol = fields.String(load_default="TCP", validate=validate.OneOf(["TCP"]))

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
            and _IANA_SVC_NAME.match(target)
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


_DEFAULT_PORTS = [{"name": "postgresql", "port": 5432, "targetPort": 5432}]
#: Loaded once: a ServicePort is immutable, so every spec without ports can share them.
_DEFAULT_SERVICE_PORTS: tuple[ServicePort, ...] = tuple(
    _PortSchema().load(_DEFAULT_PORTS, many=True)
)


class _ServiceTemplateSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    type = fields.String(
        load_default="ClusterIP", validate=validate.OneOf(["ClusterIP", "NodePort", "LoadBalancer"])
    )
    ports = fields.List(
        fields.Nested(_PortSchema),
        load_default=lambda: list(_DEFAULT_SERVICE_PORTS),
        validate=validate.Length(min=1, max=16),
    )
    labels = fields.Dict(keys=fields.String(), values=fields.String(), load_default=dict)
    annotations = fields.Dict(keys=fields.String(), values=fields.String(), load_default=dict)

    @validates_schema
    def _unique_ports(self, data: Mapping[str, Any], **_: Any) -> None:
        ports: list[ServicePort] = data.get("ports", [])
        for attribute in ("name", "port"):
            seen = [getattr(p, attribute) for p in ports]
            dupes = sorted({str(v) for v in seen if seen.count(v) > 1})
            if dupes:
                raise ValidationError(f"duplicate port {attribute}: {', '.join(dupes)}", "ports")
        _check_labels(data.get("labels", {}), what="label", values_are_labels=True)
        _check_labels(data.get("annotations", {}), what="annotation", values_are_labels=False)


def _service_name() -> fields.String:
    """A Service name: a DNS-1035 label."""
    return fields.String(
        required=True,
        validate=[
            validate.Length(min=1, max=63),
            validate.Regexp(_DNS_1035, error="must be a DNS-1035 label (lower case, a-z0-9-)"),
        ],
    )


class _ServiceRefSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    name = _service_name()


_CRON_FIELD = r"[0-9A-Za-z*?/,-]+"
#: Five cron fields or one of the macros CronJob accepts (no ``TZ=``: use the cluster's zone).
_CRON_MACRO = "@(annually|yearly|monthly|weekly|daily|midnight|hourly)"
_CRON_SCHEDULE = re.compile(rf"^({_CRON_MACRO}|{_CRON_FIELD}( +{_CRON_FIELD}){{4}})$")


class _ReplicaServiceSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    name = _service_name()
    maxLagBytes = fields.Integer(
        load_default=DEFAULT_MAX_LAG_BYTES,
        strict=True,
        validate=validate.Range(min=0, max=2**63 - 1),
    )
    whenNoReplica = fields.String(
        load_default="KeepEndpoints", validate=validate.OneOf(WHEN_NO_REPLICA)
    )
    includePausedReplicas = _StrictBoolean(load_default=False)
    type = fields.String(
        load_default="ClusterIP", validate=validate.OneOf(["ClusterIP", "NodePort", "LoadBalancer"])
    )
    labels = fields.Dict(keys=fields.String(), values=fields.String(), load_default=dict)
    annotations = fields.Dict(keys=fields.String(), values=fields.String(), load_default=dict)

    @validates_schema
    def _metadata(self, data: Mapping[str, Any], **_: Any) -> None:
        _check_labels(data.get("labels", {}), what="label", values_are_labels=True)
        _check_labels(data.get("annotations", {}), what="annotation", values_are_labels=False)

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> ReplicaServiceSpec:
        return ReplicaServiceSpec(
            name=data["name"],
            max_lag_bytes=data["maxLagBytes"],
            when_no_replica=data["whenNoReplica"],
            include_paused_replicas=data["includePausedReplicas"],
            service_type=data["type"],
            labels=dict(data["labels"]),
            annotations=dict(data["annotations"]),
        )


class _ResourcesSchema(Schema):
    """``requests``/``limits``: ``{resource name: quantity}``, a JSON integer or a string."""

    class Meta:
        unknown = EXCLUDE

    requests = fields.Dict(keys=fields.String(), values=fields.Raw(), load_default=dict)
    limits = fields.Dict(keys=fields.String(), values=fields.Raw(), load_default=dict)

    @validates_schema
    def _quantities(self, data: Mapping[str, Any], **_: Any) -> None:
        for group in ("requests", "limits"):
            for key, item in data.get(group, {}).items():
                if not _label_key(key):
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


class _BackupSchema(Schema):
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
        validate=[validate.Length(min=1, max=1024), validate.Regexp(r"^\S+$")],
    )
    pvcName = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=253), validate.Regexp(_DNS_1123_SUBDOMAIN)],
    )
    secretName = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=253), validate.Regexp(_DNS_1123_SUBDOMAIN)],
    )
    keep = fields.Integer(load_default=3, strict=True, validate=validate.Range(min=1, max=100))
    runAsUser = fields.Integer(
        load_default=999, strict=True, validate=validate.Range(min=1, max=2**31 - 1)
    )
    activeDeadlineSeconds = fields.Integer(
        load_default=6 * 3600, strict=True, validate=validate.Range(min=60, max=7 * 24 * 3600)
    )
    resources = fields.Nested(_ResourcesSchema, load_default=lambda: {"requests": {}, "limits": {}})

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


class _StrictNumber(fields.Float):
    """Only a JSON number, as the CRD's ``type: number``: ``fields.Float`` also takes "1"."""

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid", input=value)
        return float(super()._deserialize(value, attr, data, **kwargs))


def _resync_seconds(default: float | None) -> fields.Float:
    return _StrictNumber(
        load_default=default,
        allow_nan=False,
        validate=validate.Range(min=MIN_POLL_SECONDS, max=MAX_POLL_SECONDS),
    )


class _RoleLabelSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    key = fields.String(required=True, validate=validate.Length(min=1, max=317))
    leaderValue = fields.String(
        load_default="primary",
        validate=[validate.Length(min=1, max=63), validate.Regexp(_LABEL_VALUE)],
    )
    replicaValue = fields.String(
        load_default="replica",
        validate=[validate.Length(min=1, max=63), validate.Regexp(_LABEL_VALUE)],
    )

    @validates_schema
    def _label(self, data: Mapping[str, Any], **_: Any) -> None:
        key = data.get("key")
        if isinstance(key, str) and not _label_key(key):
            raise ValidationError(f"{key!r} is not a valid label key", "key")
        if data.get("leaderValue") == data.get("replicaValue"):
            raise ValidationError("must differ from leaderValue", "replicaValue")

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> RoleLabelSpec:
        return RoleLabelSpec(data["key"], data["leaderValue"], data["replicaValue"])


class _SwitchoverSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    pollSeconds = _resync_seconds(None)
    eventDrivenResyncSeconds = _resync_seconds(DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS)
    roleLabel = fields.Nested(_RoleLabelSchema, load_default=None)

    @post_load
    def _make(self, data: Mapping[str, Any], **_: Any) -> SwitchoverSpec:
        return SwitchoverSpec(
            poll_seconds=data["pollSeconds"],
            event_driven_resync_seconds=data["eventDrivenResyncSeconds"],
            role_label=data["roleLabel"],
        )


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
        load_default="/primary",
        validate=validate.OneOf(
            list(LEADER_PATHS),
            error="must be one of Patroni's leader paths: {choices}",
        ),
    )
    # Defaults are loaded once (module end) and copied per request: instantiating a
    # marshmallow Schema deep-copies its fields, which cost more than the whole load.
    patroni = fields.Nested(_PatroniSchema, load_default=lambda: dict(_DEFAULT_PATRONI))
    service = fields.Nested(_ServiceTemplateSchema, load_default=lambda: dict(_DEFAULT_SERVICE))
    replicaService = fields.Nested(_ReplicaServiceSchema, load_default=None)
    backup = fields.Nested(_BackupSchema, load_default=None)
    switchover = fields.Nested(_SwitchoverSchema, load_default=None)

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
            _check_labels(selector, what="label", values_are_labels=True)
        except ValidationError as error:
            raise ValidationError(error.messages, "primarySelector") from None
        name = data.get("serviceRef", {}).get("name")
        scope = selector.get("cluster-name")
        if name and scope:
            # Patroni's Kubernetes DCS owns these names; a Service with a selector named
            # like its leader Endpoints would make the endpoints controller fight Patroni.
            reserved = {scope, *(f"{scope}-{s}" for s in ("config", "leader", "sync", "failover"))}
            if name in reserved:
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
        if scope and replica.name in {
            scope,
            *(f"{scope}-{s}" for s in ("config", "leader", "sync", "failover")),
        }:
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
        return None, tuple(_flatten(error.messages, "spec"))
    assert isinstance(loaded, ClusterSpec)
    return loaded, ()


def _flatten(messages: object, path: str) -> list[SpecProblem]:
    """marshmallow's nested ``{field: [msg]}`` → ``[SpecProblem("spec.a.b", msg)]``."""
    if isinstance(messages, Mapping):
        problems: list[SpecProblem] = []
        for key in sorted(messages, key=str):
            child = path if key == "_schema" else f"{path}.{key}"
            problems.extend(_flatten(messages[key], child))
        return problems
    if isinstance(messages, list):
        flat: list[SpecProblem] = []
        for item in messages:
            flat.extend(_flatten(item, path))
        return flat
    return [SpecProblem(path, str(messages))]


# ----------------------------------------------------------------------- envelope


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
    finalizing = _StrictBoolean(load_default=False)


class CustomizeEnvelopeSchema(Schema):
    """The v1 customize request: ``controller, parent``."""

    class Meta:
        unknown = EXCLUDE

    parent = fields.Dict(required=True)


def _describe(messages: object) -> str:
    problems = _flatten(messages, "request")
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
        problems: dict[str, Any] = {}
        if not isinstance(key, str):
            problems["key"] = ["Not a valid string."]
        if objects is None:
            problems["value"] = [_NOT_NULL]
        elif not isinstance(objects, Mapping):
            problems["value"] = [_NOT_A_MAPPING]
        else:
            inner: dict[str, Any] = {}
            for name, obj in objects.items():
                problem: dict[str, Any] = {}
                if not isinstance(name, str):
                    problem["key"] = ["Not a valid string."]
                if obj is None:
                    problem["value"] = [_NOT_NULL]
                elif not isinstance(obj, Mapping):
                    problem["value"] = [_NOT_A_MAPPING]
                if problem:
                    inner[name] = problem
            if inner:
                problems["value"] = inner
        if problems:
            errors[key] = problems
    return errors or None


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


def load_sync_request(body: object) -> SyncRequest:
    """Check a sync/finalize request body (already JSON-decoded)."""
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
    services = children[SERVICE_KEY]
    pods = envelope["related"].get(POD_KEY, {})
    jobs = envelope["related"].get(JOB_KEY)
    groups = [(SERVICE_KEY, services), (POD_KEY, pods)]
    groups += [(k, children[k]) for k in (ENDPOINTSLICE_KEY, CRONJOB_KEY) if k in children]
    groups += [(JOB_KEY, jobs)] if jobs is not None else []
    for group, objects in groups:
        for key, obj in objects.items():
            metadata = obj.get("metadata")
            name = metadata.get("name") if isinstance(metadata, Mapping) else None
            if name != key:
                raise RequestError(
                    f"invalid sync request: {group}[{key!r}] has metadata.name {name!r}"
                )
    spec, problems = load_spec(parent["spec"])
    metadata = parent["metadata"]
    return SyncRequest(
        parent=envelope["parent"],
        namespace=metadata["namespace"],
        name=metadata["name"],
        generation=metadata["generation"],
        spec=spec,
        spec_problems=problems,
        services=services,
        other_children={k: v for k, v in children.items() if k != SERVICE_KEY},
        pods=pods,
        finalizing=envelope["finalizing"],
        uid=metadata["uid"],
        jobs=jobs,
    )


def load_customize_request(body: object) -> tuple[str, ClusterSpec | None]:
    """Check a customize request; return the cluster's ``namespace/name`` and its spec."""
    cluster, spec, _ = load_customize_parent(body)
    return cluster, spec


def load_customize_parent(body: object) -> tuple[str, ClusterSpec | None, str | None]:
    """:func:`load_customize_request` plus the parent's ``metadata.uid`` (if it has one)."""
    if not isinstance(body, Mapping):
        raise RequestError(f"request body must be a JSON object, not {type(body).__name__}")
    try:
        envelope: Mapping[str, Any] = _CUSTOMIZE_ENVELOPE.load(body)
    except ValidationError as error:
        raise RequestError(f"invalid customize request: {_describe(error.messages)}") from None
    parent = _load_parent(envelope["parent"])
    spec, _ = load_spec(parent["spec"])
    metadata = parent["metadata"]
    return f"{metadata['namespace']}/{metadata['name']}", spec, metadata["uid"]


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
_PARENT = _ParentSchema()
_SYNC_ENVELOPE = SyncEnvelopeSchema()
_CUSTOMIZE_ENVELOPE = CustomizeEnvelopeSchema()
# Every Nested field of the spec, loaded once so each creates its inner schema now.
_CLUSTER_SPEC.load(
    {
        "primarySelector": {"a": "b"},
        "serviceRef": {"name": "warm"},
        "patroni": {"scheme": "https", "tls": {"serverName": "warm.example"}},
        "service": {"ports": _DEFAULT_PORTS},
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
_PARENT.load({"metadata": {"name": "warm", "namespace": "warm"}})
