"""Shared cases and helpers of tests/test_manifests_*.py (one module per subject)."""

from __future__ import annotations

from typing import Any

from tests.manifest_helpers import (
    HOOK_NAME,
    find,
    rendered,
)

# ------------------------------------------------------------------ the hook Deployment


def hook_pod_spec(target: str = "deploy") -> dict[str, Any]:
    spec: dict[str, Any] = find(rendered(target), "Deployment", HOOK_NAME)["spec"]["template"][
        "spec"
    ]
    return spec


def hook_container(target: str = "deploy") -> dict[str, Any]:
    """The container named "hook" (deploy/mtls-transition adds "hook-tls" next to it)."""
    (container,) = [c for c in hook_pod_spec(target)["containers"] if c["name"] == "hook"]
    return container
