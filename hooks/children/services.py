"""Which observed Service is which: the primary's, a read-only one, one outside this controller.

Both Service parts read this; neither imports the other (each part stands on
:mod:`hooks.children.base` and on the shared readers here, so a part can change without the
other following).

Pure: typed observed values in, answers out.
"""

from __future__ import annotations

from hooks.domain.model import READ_ONLY, READ_ONLY_LABEL
from hooks.domain.observed import ServiceChild
from hooks.domain.request import SyncRequest


def is_read_only_service(service: ServiceChild) -> bool:
    """Whether an observed Service is one of our read-only Services (by its label, now or
    in its last-applied record)."""
    return READ_ONLY in (
        service.labels.get(READ_ONLY_LABEL),
        service.applied_labels.get(READ_ONLY_LABEL),
    )


def foreign_service(request: SyncRequest, name: str) -> ServiceChild | None:
    """The Service named ``name`` if it exists but is not a child of this parent.

    Related by name but not among the children. One whose controller reference is this
    parent's UID is ours (created a moment after Metacontroller listed the children):
    not foreign.
    """
    if request.named_services is None or name in request.services:
        return None
    found = request.named_services.get(name)
    if found is None:
        return None
    controller = found.controller
    if controller is not None and request.uid and controller.uid == request.uid:
        return None
    return found


def primary_services(request: SyncRequest) -> dict[str, ServiceChild]:
    """Observed Services that route to the primary: all but our read-only Services.

    The names in the spec decide first: the one named like ``spec.serviceRef`` is the
    primary's and the one named like ``spec.replicaService`` is not, whatever they were
    before a change of the spec swapped the names; the others go by their label.
    """
    spec = request.spec
    primary = spec.service_name if spec is not None else None
    read_only = spec.replica_service.name if spec and spec.replica_service else None
    return {
        name: service
        for name, service in request.services.items()
        if name == primary or (name != read_only and not is_read_only_service(service))
    }
