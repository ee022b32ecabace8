"""Builders for the read-only Service and backup tests (plain dicts, like tests/helpers.py).

Observed children are made the way they come to exist: a desired object is applied by the
Metacontroller stand-in (:mod:`testbed.metacontroller.apply`), which adds what Metacontroller and
the API
server add (last-applied record, ``controller-uid`` label, ownerReferences, the server's
rewrites), so a test never hand-writes a shape the hook would not really see.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hooks.children import readonly_objects
from hooks.core.outcome import SyncOutcome
from hooks.domain.members import MemberStatus
from hooks.domain.model import CRONJOB_KEY, ENDPOINTSLICE_KEY, JOB_KEY
from testbed.fakes.patroni_wire import patroni_body
from testbed.metacontroller.apply import World, apply_reply
from tests.helpers import (
    CLUSTER,
    NAMESPACE,
    P0,
    P1,
    P2,
    PARENT_UID,
    loaded_pod,
    make_pod,
    member_ip,
    seed_spec,
    sync_body,
)

READ_ONLY = "pg-orders-replicas"
SLICE = f"{READ_ONLY}-ipv4"
MIB = 1024 * 1024
#: The leader's WAL location in every answer built here (replicas are measured from it).
LEADER_AT = 200 * MIB


def rs_spec(**replica_service: Any) -> dict[str, Any]:
    """The seed spec plus ``spec.replicaService`` (name defaulted)."""
    return seed_spec(replicaService={"name": READ_ONLY, **replica_service})


def backup_fields(**overrides: Any) -> dict[str, Any]:
    """A valid ``spec.backup``."""
    fields: dict[str, Any] = {
        "schedule": "15 2 * * *",
        "image": "postgres:18.1",
        "pvcName": "pg-orders-backups",
        "secretName": "pg-orders-replication",
    }
    fields.update(overrides)
    return fields


def answer(
    name: str,
    role: str = "replica",
    *,
    behind: int | None = 0,
    state: str = "running",
    replication_state: str | None = "streaming",
    patroni_name: str | None = None,
    scope: str = CLUSTER,
    location: int | None = LEADER_AT,
    http_status: int | None = None,
) -> MemberStatus:
    """A Patroni answer on /primary; a replica ``behind`` bytes of replay behind the leader.

    ``behind=None`` leaves the replayed location out; ``location=None`` leaves the leader's
    location out.
    """
    body = patroni_body(role, state, name=patroni_name or name)
    body["patroni"]["scope"] = scope
    if role == "primary":
        body["xlog"] = {} if location is None else {"location": location}
    else:
        body["xlog"] = {"received_location": LEADER_AT, "paused": False}
        if behind is not None:
            body["xlog"]["replayed_location"] = LEADER_AT - behind
        body.pop("replication_state", None)
        if replication_state is not None:
            body["replication_state"] = replication_state
    status = http_status if http_status is not None else (200 if role == "primary" else 503)
    return MemberStatus.from_api_response(name, status, body)


def cluster_answers(
    leading: str = P0, names: Sequence[str] = (P0, P1, P2), **replica_overrides: MemberStatus
) -> dict[str, MemberStatus]:
    """The leader plus streaming replicas that are fully caught up, with overrides by name."""
    answers = {n: answer(n, "primary") if n == leading else answer(n) for n in names}
    answers.update({k.replace("_", "-"): v for k, v in replica_overrides.items()})
    return answers


def request_body(
    *,
    spec: object = None,
    pods: Sequence[Mapping[str, Any]] | None = None,
    services: Sequence[Mapping[str, Any]] = (),
    slices: Sequence[Mapping[str, Any]] | None = (),
    cronjobs: Sequence[Mapping[str, Any]] | None = (),
    jobs: Sequence[Mapping[str, Any]] | None = None,
    status: Mapping[str, Any] | None = None,
    finalizing: bool = False,
) -> dict[str, Any]:
    """A sync request with the EndpointSlice and CronJob groups (``None``: undeclared)."""
    extra: dict[str, Mapping[str, Any]] = {}
    if slices is not None:
        extra[ENDPOINTSLICE_KEY] = {s["metadata"]["name"]: s for s in slices}
    if cronjobs is not None:
        extra[CRONJOB_KEY] = {c["metadata"]["name"]: c for c in cronjobs}
    body = sync_body(
        spec=rs_spec() if spec is None else spec,
        pods=pods,
        services=services,
        status=status,
        finalizing=finalizing,
        extra_children=extra,
    )
    if jobs is not None:
        body["related"][JOB_KEY] = {j["metadata"]["name"]: copy.deepcopy(dict(j)) for j in jobs}
    return body


def observed(*desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``desired`` children as they exist once Metacontroller created them (in order)."""
    world = World(
        parent={
            "apiVersion": "adg.io/v1alpha1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "uid": PARENT_UID},
        }
    )
    apply_reply(world, {"children": [copy.deepcopy(dict(d)) for d in desired]})
    found = []
    for child in desired:
        kind, name = child["kind"], child["metadata"]["name"]
        group = {"Service": world.services, "EndpointSlice": world.endpointslices}.get(
            kind, world.cronjobs
        )
        found.append(copy.deepcopy(group[name]))
    return found


def listed_slice(names: Iterable[str], service: str = READ_ONLY) -> dict[str, Any]:
    """An observed IPv4 slice of ``service`` that lists ``names`` (at their usual IPs)."""
    endpoints = [
        readonly_objects.endpoint(n, loaded_pod(make_pod(n)), _ip(member_ip(n)), NAMESPACE)
        for n in sorted(names)
    ]
    ports = [{"name": "postgresql", "port": 5432, "protocol": "TCP"}]
    (slice_,) = observed(readonly_objects.desired_slice(NAMESPACE, service, 4, endpoints, ports))
    return slice_


def read_only_service(name: str = READ_ONLY) -> dict[str, Any]:
    """An observed read-only Service, as the hook created it with the seed spec."""
    from hooks.loaders.schemas import load_spec

    spec, _ = load_spec(rs_spec(name=name))
    assert spec is not None and spec.replica_service is not None
    (service,) = observed(
        readonly_objects.desired_service(spec, spec.replica_service, NAMESPACE, name)
    )
    return service


def children_of(outcome: SyncOutcome, kind: str) -> dict[str, dict[str, Any]]:
    found = [c for c in outcome.body["children"] if c.get("kind") == kind]
    by_name = {c["metadata"]["name"]: c for c in found}
    assert len(by_name) == len(found), f"a {kind} is listed twice"
    return by_name


def slice_names(slice_: Mapping[str, Any]) -> list[str]:
    """The Pod names an EndpointSlice lists."""
    return [e["targetRef"]["name"] for e in slice_.get("endpoints") or []]


def condition(outcome_or_status: SyncOutcome | Mapping[str, Any], type_: str) -> dict[str, Any]:
    status = (
        outcome_or_status.body["status"]
        if isinstance(outcome_or_status, SyncOutcome)
        else outcome_or_status
    )
    matches = [c for c in status["conditions"] if c["type"] == type_]
    assert len(matches) == 1, f"expected exactly one {type_} condition in {status}"
    return matches[0]


def _ip(text: str) -> Any:
    import ipaddress

    return ipaddress.ip_address(text)
