"""The domain: what a PostgreSQLCluster asks for and what a sync request holds.

Every other module of the hook imports this one and it imports none of them (only the
standard library): the spec dataclasses (filled in by :mod:`hooks.loaders.schemas`), the sync
request, the child-group keys of Metacontroller's requests, Patroni's leader paths, the
label and annotation names on the objects the hook reads and writes, the resync timing
and the :class:`Condition` value. Keeping them here, apart from validation and from the
parts that use them, means a newcomer finds each name in one place and a pure module
never has to import a loader or the settings to use a type.

Pure: no I/O, no environment, no third-party package.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# ------------------------------------------------------------------ child groups
#: Metacontroller's keys of the ``children`` and ``related`` maps: ``<Kind>.<version>`` in
#: the core group, ``<Kind>.<group>/<version>`` outside it.
SERVICE_KEY = "Service.v1"
POD_KEY = "Pod.v1"
#: Children and related objects of the read-only endpoints and the scheduled backups.
ENDPOINTSLICE_KEY = "EndpointSlice.discovery.k8s.io/v1"
CRONJOB_KEY = "CronJob.batch/v1"
JOB_KEY = "Job.batch/v1"


# ------------------------------------------------------- labels and annotations
#: The label the StatefulSet controller puts on each of its Pods: unique per namespace,
#: so a selector that includes it can never select two Pods.
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
#: The label Metacontroller selects a parent's children by (``generateSelector: true``):
#: ``controller-uid=<parent UID>``; an orphan Service carrying it is adopted.
CONTROLLER_UID_LABEL = "controller-uid"
#: Metacontroller's record of what a hook last applied to a child (its three-way merge).
LAST_APPLIED_ANNOTATION = "metacontroller.k8s.io/last-applied-configuration"
#: On every child the hook emits (hooks.core.manifests).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "pg-failover-hook"
#: Marks our read-only Services (a primary Service never carries it).
READ_ONLY_LABEL = "pg-failover-hook.adg.io/service"
READ_ONLY = "read-only"
#: The labels kube-proxy and the EndpointSlice controllers read.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SLICE_MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
#: Not "endpointslice-controller.k8s.io": Kubernetes' own controller must leave ours alone.
SLICE_MANAGER = "pg-failover-hook.adg.io"
#: On the backup Jobs (through the CronJob's jobTemplate): ``<parent uid>``.
BACKUP_OF_LABEL = "pg-failover-hook.adg.io/backup-of"
#: Patroni's own Pod annotation with the member's JSON (``touch_member``).
STATUS_ANNOTATION = "status"
#: Without ``spec.switchover.roleLabel``: Patroni's Kubernetes-DCS defaults. ``master`` is
#: what Patroni 3 wrote, and what Patroni 4 writes with ``leader_label_value: master``
#: (its documented way to upgrade without moving Services).
PATRONI_ROLE_LABEL = "role"
PATRONI_LEADER_VALUES = frozenset({"primary", "master"})
PATRONI_REPLICA_VALUES = frozenset({"replica"})


# ------------------------------------------------------------------ Patroni
#: Patroni REST paths that answer 200 only on the leader, with the roles that the
#: leader reports there. Any other path would route to something that is not the
#: leader (``/replica``) or answer 503 everywhere (a typo): refuse it up front.
LEADER_PATHS: Mapping[str, frozenset[str]] = {
    "/primary": frozenset({"primary"}),
    "/master": frozenset({"primary"}),
    "/read-write": frozenset({"primary"}),
    "/leader": frozenset({"primary", "standby_leader"}),
    "/standby-leader": frozenset({"standby_leader"}),
    "/standby_leader": frozenset({"standby_leader"}),
}
#: ``spec.healthCheckPath`` when the spec does not say.
DEFAULT_HEALTH_CHECK_PATH = "/primary"
#: Roles as the REST API and the ``status`` annotation spell them; Patroni 3 said master.
ROLE_ALIASES: Mapping[str, str] = {"master": "primary"}

# ---------------------------------------------------------------- Kubernetes values
#: A Kubernetes resource quantity without a sign (``500m``, ``1.5``, ``256Mi``, ``1e3``).
_DECIMAL = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY = re.compile(rf"^{_DECIMAL}(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?{_DECIMAL}))?\Z")


# ------------------------------------------------------------------------- spec


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One port of the primary Service."""

    name: str
    port: int
    target_port: int | str
    protocol: str = "TCP"

    def as_manifest(self) -> dict[str, Any]:
        """The port as a Service lists it (only the fields we own, as the API stores them)."""
        return {
            "name": self.name,
            "port": self.port,
            "targetPort": self.target_port,
            "protocol": self.protocol,
        }


#: What the read-only endpoints list when no replica qualifies (see hooks/children/readonly.py).
WHEN_NO_REPLICA = ("KeepEndpoints", "UseLeader", "Empty")
#: Which replicas the read-only endpoints may list (see hooks/children/read_levels.py): ``lag``
#: (within ``maxLagBytes``), ``synchronous`` (also a ``sync`` standby of the leader),
#: ``quorum`` (also a ``quorum`` standby: Patroni >= 4.0, ``synchronous_mode: quorum``).
CONSISTENCY_LEVELS = ("lag", "synchronous", "quorum")
#: ``spec.replicaService.trafficDistribution`` (see hooks/children/read_zones.py): the Service's
#: ``spec.trafficDistribution`` and same-zone hints in the slices the hook writes.
#: ``PreferClose`` is the older name (the only one API servers before 1.34 accept; the 1.36
#: API server warns that it is deprecated: pkg/api/service/warnings.go:80 at v1.36.3).
TRAFFIC_DISTRIBUTIONS = ("PreferSameZone", "PreferClose")
#: The Node's zone label; Kubernetes >= 1.35 copies it onto each Pod when it is bound
#: (the PodTopologyLabels admission plugin), which is where the hook reads it.
ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_MAX_LAG_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReplicaServiceSpec:
    """``spec.replicaService``: a selector-less Service whose EndpointSlice the hook writes."""

    name: str
    max_lag_bytes: int = DEFAULT_MAX_LAG_BYTES
    when_no_replica: str = "KeepEndpoints"
    #: List replicas whose WAL replay is paused (``xlog.paused``); off: they serve old data.
    include_paused_replicas: bool = False
    #: One of :data:`CONSISTENCY_LEVELS`; ``lag`` is the behaviour before the field existed.
    consistency: str = "lag"
    #: One of :data:`TRAFFIC_DISTRIBUTIONS`, or ``None`` (the default): no zone preference,
    #: the objects exactly as before the field existed.
    traffic_distribution: str | None = None
    service_type: str = "ClusterIP"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BackupSpec:
    """``spec.backup``: a CronJob that takes verified base backups from the primary."""

    schedule: str
    image: str
    pvc_name: str
    secret_name: str
    keep: int = 3
    run_as_user: int = 999
    active_deadline_seconds: int = 6 * 3600
    #: ``{"requests": {...}, "limits": {...}}``, quantities as the user wrote them.
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


#: ``spec.switchover`` bounds: the poll is never faster than the degraded resync's default
#: (PGFH_RESYNC_DEGRADED_SECONDS, 0.3 s) and never slower than five minutes.
MIN_POLL_SECONDS = 0.3
MAX_POLL_SECONDS = 300.0
DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class RoleLabelSpec:
    """``spec.switchover.roleLabel``: a role label that something other than Patroni keeps."""

    key: str
    leader_value: str = "primary"
    replica_value: str = "replica"


@dataclass(frozen=True, slots=True)
class SwitchoverSpec:
    """``spec.switchover``: how soon a healthy cluster is looked at again (core.switchover)."""

    #: The healthy resync while polled; ``None``: the operator's PGFH_RESYNC_HEALTHY_SECONDS.
    poll_seconds: float | None = None
    #: The healthy resync while every member Pod's role label agrees with Patroni.
    event_driven_resync_seconds: float = DEFAULT_EVENT_DRIVEN_RESYNC_SECONDS
    #: ``None``: Patroni's own Kubernetes-DCS label ``role`` plus its ``status`` annotation.
    role_label: RoleLabelSpec | None = None


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A validated ``PostgreSQLCluster.spec`` with every default filled in."""

    primary_selector: Mapping[str, str]
    service_name: str
    health_check_path: str = DEFAULT_HEALTH_CHECK_PATH
    patroni_port: int = 8008
    patroni_scheme: str = "http"
    connect_timeout: float = 0.5
    read_timeout: float = 1.0
    #: Route only to a member whose ``patroni.name`` equals its pod's name.
    verify_member_name: bool = True
    #: https: verify the members' certificates against this DNS name, not the pod IP.
    patroni_server_name: str | None = None
    #: ``spec.patroni.bootstrapLabels``: Patroni's ``kubernetes.bootstrap_labels`` (4.1+),
    #: the labels it puts on a member Pod while that member is being built.
    bootstrap_labels: Mapping[str, str] = field(default_factory=dict)
    service_type: str = "ClusterIP"
    service_ports: tuple[ServicePort, ...] = (ServicePort("postgresql", 5432, 5432),)
    service_labels: Mapping[str, str] = field(default_factory=dict)
    service_annotations: Mapping[str, str] = field(default_factory=dict)
    #: ``spec.replicaService``: the read-only Service, if asked for.
    replica_service: ReplicaServiceSpec | None = None
    #: ``spec.backup``: the scheduled base backups, if asked for.
    backup: BackupSpec | None = None
    #: ``spec.switchover``: poll and event-driven resyncs, the role label to trust.
    switchover: SwitchoverSpec = field(default_factory=SwitchoverSpec)

    @property
    def leader_roles(self) -> frozenset[str]:
        """The roles a leader reports on this spec's health-check path."""
        return LEADER_PATHS[self.health_check_path]


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """One reason the spec is invalid: a dotted field path and a message."""

    field: str
    message: str


# ------------------------------------------------------------------------ resync


@dataclass(frozen=True, slots=True)
class ResyncTiming:
    """How soon Metacontroller should call again (``resyncAfterSeconds``).

    A planned Patroni switchover changes no Kubernetes object, so with an etcd or
    Consul DCS nothing but this timer makes Metacontroller call us again: ``healthy``
    bounds how long the Service can lag a switchover. ``degraded`` is used while there
    is no confirmed leader, so the new one is picked up a fraction of a second after
    Patroni promotes it. ``healthy`` is a period: each reply asks for the time to the
    cluster's own slot of it (:func:`hooks.core.switchover.spread_resync`), so one resync may
    be up to one and a half periods (right after a restart), then one period.
    The operator sets both (``PGFH_RESYNC_*``, read by :mod:`hooks.shell.config`).
    """

    healthy: float = 1.0
    degraded: float = 0.3
    #: The floor the operator puts under every cluster's ``spec.switchover.pollSeconds``
    #: (``PGFH_MIN_POLL_SECONDS``). The CRD lets a PostgreSQLCluster's author ask for 0.3 s;
    #: a tenant with many clusters would then take more than its share of Metacontroller's
    #: workers and the hook's threads. 1 s: the default healthy period, which the fleet
    #: budget of docs/scale.md assumes, and the switchover lag a polled cluster gets anyway.
    min_poll: float = 1.0
    #: The resync of a cluster the hook's own limits refuse (more Pods than
    #: ``PGFH_MAX_MEMBERS``, a Patroni port not allowed), ``PGFH_RESYNC_REFUSED_SECONDS``:
    #: nothing changes until its Pods or spec do, and either brings a sync at once (watch
    #: events), so re-reading its large request every second would only cost memory and CPU.
    refused: float = 60.0


# --------------------------------------------------------------------- conditions
#: The values of a Kubernetes condition's ``status``.
CONDITION_STATUSES = ("True", "False", "Unknown")


@dataclass(frozen=True, slots=True)
class Condition:
    """One entry of ``status.conditions`` as the hook decides it, before it is stamped.

    The time of the last transition and the observed generation are not part of the
    decision: :func:`hooks.core.conditions.stamped` adds them, keeping the previous
    ``lastTransitionTime`` while ``status`` stays the same, so that Metacontroller's status
    write converges.
    """

    type: str
    status: str
    reason: str
    message: str


# ----------------------------------------------------------------------- defaults


def field_default(cls: type[Any], name: str) -> Any:
    """The default of field ``name`` of the dataclass ``cls``: the one source of it.

    The loaders (:mod:`hooks.loaders.schemas`) give marshmallow this as ``load_default``, so a
    default is written once, on the dataclass. For a field with a ``default_factory`` the
    factory itself is returned (marshmallow calls a callable default on every load, so
    no two specs share a mutable default).
    """
    for item in dataclasses.fields(cls):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory
            raise LookupError(f"{cls.__name__}.{name} has no default")
    raise LookupError(f"{cls.__name__} has no field {name!r}")
