"""The control plane harness's one exception type: its message is the line a run stops on."""

from __future__ import annotations


class ControlPlaneError(RuntimeError):
    """The test control plane could not be built, started or used; the message names the cause
    and the log file to read."""
