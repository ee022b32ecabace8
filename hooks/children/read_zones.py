"""Zone-aware reads: the zone and same-zone hint of each endpoint the read-only slices list.

``spec.replicaService.trafficDistribution`` (``PreferSameZone``, or its older name
``PreferClose``) asks clients' proxies to prefer a replica in their own zone and to fall back
to any zone. The read-only Service has no selector, so no EndpointSlice controller writes
its hints: the hook writes them itself, the way the controller does for a Service with a selector
(``preferCloseHeuristic.update`` in k8s.io/endpointslice v0.36.3 ``trafficdist/
trafficdist.go:160-184``: a ready endpoint with a ``zone`` gets ``hints.forZones: [{name:
<its zone>}]``). The Service carries ``spec.trafficDistribution`` too, which kube-proxy
does not read (it reads hints only) but other data planes and ``kubectl describe`` do.

**What kube-proxy does with the hints** (``topologyModeFromHints`` and
``availableForTopology`` in k8s.io/kubernetes v1.36.3 ``pkg/proxy/topology.go:164-233``):
it uses them only when *every* ready endpoint of the Service has a zone hint and at least
one is hinted for its Node's zone (the Node's ``topology.kubernetes.io/zone`` label); then
it sends new connections to those endpoints only. Otherwise it ignores the hints and uses
every endpoint. So a client in zone A reaches a zone-A replica while one is listed, and
any replica when none is: the fallback needs nothing from the hook, only that it lists
what qualifies, as it does without zones.

**Where a member's zone comes from.** The ``topology.kubernetes.io/zone`` label of its Pod,
which the hook already receives (Metacontroller sends the member Pods): no read of Nodes,
so no extra right. Since Kubernetes 1.35 the ``PodTopologyLabels`` admission plugin
(feature ``PodTopologyLabelsAdmission``, beta and on by default: ``pkg/features/
kube_features.go:1818-1821``; in the API server's default plugins: ``pkg/kubeapiserver/
options/plugins.go:192``) copies the Node's zone and region labels onto a Pod when it is
bound to the Node (``pods/binding``, as the scheduler does) or created already bound
(``plugin/pkg/admission/podtopologylabels/admission.go:127-178``). On older clusters a
Pod label set another way (a mutating webhook, the StatefulSet's template per zone) is
read the same way.

**All or nothing.** If any listed member has no zone label, no endpoint gets a zone or a
hint (and the ``ReplicasRouted`` message names the members without one): kube-proxy would
ignore partial hints anyway, and a data plane that did not would send a whole zone's
clients to the few hinted members. The leader listed by ``whenNoReplica: UseLeader`` is
hinted like any member (alone, it is used from every zone).

Pure: names and labels in, zones out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hooks.domain.model import ZONE_LABEL


@dataclass(frozen=True, slots=True)
class ZoneDecision:
    """The zone of each listed member (empty: no zone and no hint for anyone) and the
    phrase the condition's message gets (stable: names and zones only)."""

    zones: Mapping[str, str] = field(default_factory=dict)
    note: str = ""


def decide(
    traffic_distribution: str | None, listed: Sequence[tuple[str, Mapping[str, str]]]
) -> ZoneDecision:
    """The zones to write for ``listed`` (member name, its Pod's labels).

    ``None`` (the field unset): nothing, and no phrase, so the objects and the message are
    exactly those of before the field existed.
    """
    if traffic_distribution is None:
        return ZoneDecision()
    if not listed:
        return ZoneDecision(note=f"zone hints ({traffic_distribution}): no endpoint listed")
    # A label that is absent and one that is empty both leave the member unzoned.
    unzoned = sorted(name for name, labels in listed if not labels.get(ZONE_LABEL))
    if unzoned:
        return ZoneDecision(
            note=(
                f"no zone hints ({traffic_distribution}): no {ZONE_LABEL} label on "
                f"{', '.join(unzoned)}, so every client may reach every listed member"
            )
        )
    found = {name: labels[ZONE_LABEL] for name, labels in listed}
    zones = ", ".join(f"{name} {zone}" for name, zone in sorted(found.items()))
    return ZoneDecision(found, f"zone hints ({traffic_distribution}): {zones}")
