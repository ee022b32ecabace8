"""The loaders: where what comes in (Metacontroller's requests, Patroni's answers) is checked.

A broken request is refused here (HTTP 400 with the reason), an invalid spec becomes spec
problems, and everything else becomes a typed value of :mod:`hooks.domain`: no module above
this layer reads a raw Metacontroller dict. Imports the domain, marshmallow and the
standard library's pure modules only (``pyproject.toml``, contract ``loaders``).
"""
