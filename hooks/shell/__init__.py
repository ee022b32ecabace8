"""The I/O shell: HTTP (Flask under gunicorn), caller authentication, settings, logs, metrics
and Kubernetes Events around the pure core.

It may import every other layer and is imported by none of them (``pyproject.toml``,
contract ``shell``: nothing of the kubectl plugin either). The entry points are
``hooks.shell.app:create_app()`` and ``python:hooks.shell.gunicorn_conf``.
"""
