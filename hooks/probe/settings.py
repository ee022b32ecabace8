"""What the prober is handed: its defaults, and the shape of the settings it reads.

A Protocol, not the shell's ``HookSettings``: the prober stays below the shell (nothing
under :mod:`hooks.shell` is imported here), and the shell's settings fit it as they are.
"""

from __future__ import annotations

from typing import Protocol

from hooks.probe.policy import ProbePolicy
from hooks.probe.tls import PatroniTLS

#: A probe round's bound by default (``PGFH_PROBE_DEADLINE``): well below the
#: CompositeController's webhook timeout (5 s in our manifest).
DEFAULT_PROBE_DEADLINE = 2.0
#: The largest member body read by default; Patroni's own answers are about 1 KiB.
DEFAULT_MAX_BODY_BYTES = 64 * 1024


class ProberSettings(Protocol):
    """What :meth:`PatroniProber.from_settings` reads (the shell's ``HookSettings`` has it)."""

    @property
    def probe_deadline(self) -> float: ...
    @property
    def max_probe_body_bytes(self) -> int: ...
    @property
    def probe_policy(self) -> ProbePolicy: ...
    @property
    def patroni_tls(self) -> PatroniTLS: ...
    @property
    def request_threads(self) -> int: ...
    @property
    def probe_threads_per_round(self) -> int: ...
