"""The prober's machinery, behind :mod:`hooks.patroni` (the face the design card names).

``transport`` (requests' adapter, urllib3's pools, sockets cut at the round's deadline),
``tls`` (the files and the one client context built from them), ``targets`` (the URL a
probe may request, checked on the exact string sent), ``failures`` (a failed probe as a
reason that never varies), ``settings`` (the defaults, and the settings' shape). I/O, like
:mod:`hooks.patroni`; it reads no settings of the shell: the prober is handed them.
"""
