"""Prometheus metrics, correct across gunicorn's worker processes.

With ``PROMETHEUS_MULTIPROC_DIR`` set (the container image sets it), each worker
writes its samples to files there and ``/metrics`` merges them with a fresh
:class:`MultiProcessCollector` per scrape; the gunicorn config wipes the directory at
start and marks dead workers. Without it (tests, a developer's shell) the default
in-process registry is used.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

SYNC_SECONDS = Histogram(
    "pgfh_sync_duration_seconds",
    "Time to answer a sync or finalize call, probes included.",
    ["hook"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0),
)
PROBES = Counter(
    "pgfh_probes_total",
    "Patroni member probes, by result (leader, not_leader, unreachable).",
    ["result"],
)
REFUSED_ADDRESSES = Counter(
    "pgfh_refused_addresses_total",
    "Pod IPs not probed because the probe policy refuses them (loopback, metadata, outside "
    "PGFH_ALLOWED_POD_CIDRS).",
)
PRIMARY_CHANGES = Counter(
    "pgfh_primary_changes_total",
    "Replies that moved a primary Service to another pod.",
)
REPLIES = Counter(
    "pgfh_sync_replies_total",
    "Sync and finalize replies, by decision (the condition reason).",
    ["decision"],
)
SELECTOR_CONFLICTS = Counter(
    "pgfh_primary_selector_conflicts_total",
    "Sync replies that did not route because another Pod carries the leader's "
    "statefulset.kubernetes.io/pod-name label (the Service would select two Pods).",
)
CUSTOMIZE_REPLIES = Counter(
    "pgfh_customize_replies_total",
    "Customize replies, by the rules they hold: all (the cluster's Pods and Services), "
    "other-shard (none: the calling Metacontroller install does not serve the cluster), "
    "invalid-spec (none until the spec is fixed).",
    ["rules"],
)
INVALID_SPECS = Counter(
    "pgfh_invalid_specs_total",
    "Sync calls for a PostgreSQLCluster whose spec is invalid.",
)
BAD_REQUESTS = Counter(
    "pgfh_bad_requests_total",
    "Requests answered 4xx, by endpoint.",
    ["endpoint"],
)
ERRORS = Counter(
    "pgfh_internal_errors_total",
    "Requests answered 500 because of a bug (Metacontroller retries them).",
    ["endpoint"],
)


BUSY = Counter(
    "pgfh_busy_refusals_total",
    "Calls answered 429 unread because the worker's bodies in progress left no room for "
    "theirs within the probe deadline (PGFH_MAX_BODY_BYTES_IN_FLIGHT).",
)
AUTH_FAILURES = Counter(
    "pgfh_auth_failures_total",
    "Calls to /sync or /customize refused for their credentials, by reason.",
    ["reason"],
)
AUTH_TOKENS = Gauge(
    "pgfh_auth_tokens",
    "Caller tokens accepted right now (the lowest over live workers): 2 during a rotation.",
    multiprocess_mode="livemin",
)


def exposition() -> tuple[bytes, str]:
    """The text exposition of every worker's metrics, and its content type."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
