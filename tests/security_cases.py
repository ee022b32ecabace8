"""Shared cases and helpers of tests/test_security_*.py (one module per subject)."""

from __future__ import annotations

from hooks.probe.policy import parse_networks

# ---------------------------------------------------------------- probe policy (pure)

LOOPBACK = parse_networks("127.0.0.0/8")
