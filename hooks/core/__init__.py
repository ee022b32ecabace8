"""The pure core: the rules of one sync as functions of typed values.

Probe planning and the probe policy, the routing decision, keeping observed children,
conditions, switchover detection, the child manifests. No I/O, no clock, no settings, no
loader (``pyproject.toml``, contract ``core``): it reads :mod:`hooks.domain` values only.
:mod:`hooks.sync` puts it together with the parts (:mod:`hooks.parts`).
"""
