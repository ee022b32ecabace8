"""The domain: the values every layer speaks in, and nothing else.

The spec dataclasses, the sync request and the typed observed state (Pods, Services, the
previous status), Patroni's member answers, the group keys and label names. Imports only
the standard library and each other (``pyproject.toml``, contract ``domain``): a value here
never validates, probes or logs, so any layer may use it.
"""
