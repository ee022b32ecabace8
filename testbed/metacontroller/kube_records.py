"""What the stand-in against the real API server (:mod:`testbed.metacontroller.kube`) records
of each hook call, for the tests and the benchmarks that time or inspect its syncs: which
parent and hook, when it started, when the answer came and when everything of it was applied,
the HTTP status or the error, and the children it created, updated and deleted."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed.metacontroller.kube_apply import Managed


@dataclass(frozen=True)
class KubeSyncRecord:
    """One hook call as the stand-in saw it (monotonic times; children as ``Kind/name``)."""

    parent: str
    hook: str
    started: float
    finished: float
    http_status: int | None
    error: str | None
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    status_written: bool = False
    finalized: bool = False
    resync_after: float | None = None
    reply: Mapping[str, Any] | None = None
    #: When the hook's answer arrived (before anything of it was applied): what a benchmark
    #: times as "the hook's reply", apart from ``finished`` (after the children and status).
    replied: float | None = None

    @classmethod
    def of(
        cls,
        parent: str,
        hook: str,
        started: float,
        http_status: int | None,
        error: str | None,
        managed: Managed,
        **outcome: Any,
    ) -> KubeSyncRecord:
        """The record of a call that finishes now, with what ``managed`` did to children;
        ``outcome``: ``status_written``, ``finalized``, ``resync_after``, ``reply``,
        ``replied``."""
        return cls(
            parent,
            hook,
            started,
            time.monotonic(),
            http_status,
            error,
            tuple(managed.created),
            tuple(managed.updated),
            tuple(managed.deleted),
            **outcome,
        )
