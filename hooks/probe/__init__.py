"""The probe step in one place, behind :mod:`hooks.patroni` (the face the design card names).

Its pure half, mutation-tested with the core: ``policy`` (the ports and networks this hook
may probe, and what it refuses of a spec), ``plan`` (which members one sync asks, at which
address: one pass from the request to the plan) and ``answer`` (what a member's status code,
head and body mean). Its I/O half: ``transport`` (requests' adapter, urllib3's pools, sockets
cut at the round's deadline), ``tls`` (the files and the one client context built from
them), ``targets`` (the URL a probe may request, checked on the exact string sent),
``failures`` (a failed probe as a reason that never varies), ``settings`` (the defaults,
and the settings' shape). It reads no settings of the shell: the prober is handed them.
"""
