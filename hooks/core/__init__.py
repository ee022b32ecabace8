"""The pure core: the rules of one sync as functions of typed values.

The routing decision, keeping observed children, conditions, switchover detection, the
child manifests. No I/O, no clock, no settings (``pyproject.toml``, contract ``pure``), no
loader (contract ``layers``: the core and the loaders stand side by side): it reads
:mod:`hooks.domain` values only. The probe's policy and plan are the probe step's
(:mod:`hooks.probe`).
:mod:`hooks.sync` puts it together with the parts (:mod:`hooks.children`).
"""
