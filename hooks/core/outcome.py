"""What one sync decided: the reply body plus what the shell needs for logs, metrics, Events.

:func:`hooks.sync.reconcile` makes it; :mod:`hooks.shell.handler` observes it and
:mod:`hooks.core.cluster_event` turns a transition into an Event. A value, so that the
Event's decision (pure) does not have to import the decision itself.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hooks.core.routing import Decision


@dataclass(frozen=True, slots=True)
class SyncOutcome:
    """The reply body plus what the app needs for logs, metrics and Events."""

    body: dict[str, Any]
    decision: Decision
    message: str
    #: The pod the primary Service selected before this reply, and selects after it.
    previous_primary: str | None
    primary: str | None
    #: The Ready condition's reason before this reply (from the parent's status).
    previous_reason: str | None = None

    @property
    def transition(self) -> bool:
        """Whether the decision differs from the one the parent's status records."""
        return self.decision.value != self.previous_reason

    @property
    def primary_changed(self) -> bool:
        """Whether this reply moves the Service to another pod."""
        return self.primary != self.previous_primary and self.decision is Decision.ROUTED
