"""Probe planning: which Patroni members one sync asks, and at which address.

Only the Pod's own IP literal is ever probed (never a hostname, never an address taken
from an annotation), on the spec's Patroni port and health path, and only where the
hook's :class:`~hooks.probe.policy.ProbePolicy` allows it. :mod:`hooks.patroni` sends the
probes; this module only plans them.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.domain.request import SyncRequest
from hooks.probe.policy import ProbePolicy


def apply_policy(request: SyncRequest, policy: ProbePolicy) -> SyncRequest:
    """The request as this hook's probe policy sees it: a spec it refuses is invalid.

    A Patroni port the hook does not allow, or a primarySelector that matches more Pods
    than the hook probes per request, makes the spec invalid *for this hook*: nothing is
    probed, the observed Service is kept, and the SpecValid condition says why (the
    same path as a spec the schema refuses, so there is one reply shape for "not now").
    """
    spec = request.spec
    if spec is None or request.finalizing:
        return request
    count = request.pod_count if request.pod_count is not None else len(request.pods)
    problems = policy.spec_problems(spec.patroni_port, count)
    if not problems:
        return request
    return replace(request, spec=None, spec_problems=tuple(problems), refused_by_policy=True)


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """What to probe, and the members that are answered without a probe."""

    targets: tuple[ProbeTarget, ...] = ()
    #: Pods whose address the policy refuses: unreachable, with the reason; nothing sent.
    refused: Mapping[str, MemberStatus] = field(default_factory=dict)


def plan_probes(request: SyncRequest, policy: ProbePolicy) -> ProbePlan:
    """Which members to probe: every related Pod whose own IP the policy allows.

    An address the policy refuses (loopback, link-local/metadata, outside the Pod
    networks) becomes an unreachable member with the reason, and no packet is sent to it.
    """
    spec = request.spec
    if spec is None or request.finalizing:
        return ProbePlan()
    pods = request.pods
    ips = {name: ip for name in sorted(pods) if (ip := pods[name].ip) is not None}
    allowed, problems = policy.screen(ips)
    refused = {name: MemberStatus.unknown(name, problem) for name, problem in problems.items()}
    targets = []
    for name, address in allowed.items():
        host = f"[{address}]" if address.version == 6 else str(address)
        url = f"{spec.patroni_scheme}://{host}:{spec.patroni_port}{spec.health_check_path}"
        targets.append(
            ProbeTarget(
                pod=name,
                url=url,
                connect_timeout=spec.connect_timeout,
                read_timeout=spec.read_timeout,
                health_path=spec.health_check_path,
                leader_roles=spec.leader_roles,
                server_name=spec.patroni_server_name,
            )
        )
    return ProbePlan(tuple(targets), refused)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A sync request as this hook's policy sees it, and what to probe for it."""

    request: SyncRequest
    plan: ProbePlan


def prepare(request: SyncRequest, policy: ProbePolicy) -> Prepared:
    """One pass from the loaded request to the probe plan: the policy applied
    (:func:`apply_policy`), then the members planned under it (:func:`plan_probes`)."""
    request = apply_policy(request, policy)
    return Prepared(request, plan_probes(request, policy))


def probe_targets(request: SyncRequest, policy: ProbePolicy | None = None) -> list[ProbeTarget]:
    """The targets of :func:`plan_probes` (the default policy if none is given)."""
    return list(plan_probes(request, policy or ProbePolicy()).targets)
