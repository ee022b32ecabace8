"""JSON logs, one object per line, with the cluster and request id on every sync line.

The fields come from a :class:`contextvars.ContextVar` that the app binds per request;
a logging filter copies them onto each record, so code that logs does not have to pass
them along. The same configuration is used for gunicorn's own loggers (see
:mod:`hooks.shell.gunicorn_conf`), so every line a hook pod prints is JSON.
"""

from __future__ import annotations

import contextvars
import logging
import logging.config
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

_NO_FIELDS: Mapping[str, str] = MappingProxyType({})
_FIELDS: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "pg_failover_hook_log_fields", default=_NO_FIELDS
)


@contextmanager
def bound(**fields: str) -> Iterator[None]:
    """Add ``fields`` to every log record emitted inside the block (and its probes)."""
    token = _FIELDS.set({**_FIELDS.get(), **fields})
    try:
        yield
    finally:
        _FIELDS.reset(token)


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (without overwriting explicit extras)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _FIELDS.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def logging_config(log_format: str = "json", level: str = "INFO") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dict for the app and gunicorn alike."""
    formatters: dict[str, Any] = {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            "datefmt": "%Y-%m-%dT%H:%M:%S%z",
        },
        "text": {"format": "%(asctime)s %(levelname)-7s %(name)s [%(cluster)s] %(message)s"},
    }
    if log_format not in formatters:
        raise ValueError(f"log format must be json or text, not {log_format!r}")
    handler = {
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stdout",
        "formatter": log_format,
        "filters": ["context"],
    }
    # gunicorn's defaults give its loggers their own handlers *and* propagate=True:
    # define them here explicitly, or every gunicorn line is printed twice.
    gunicorn_logger = {"level": level, "handlers": ["stdout"], "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": ContextFilter}},
        "formatters": formatters,
        "handlers": {"stdout": handler},
        "loggers": {
            "hooks": {"level": level, "handlers": ["stdout"], "propagate": False},
            "gunicorn.error": gunicorn_logger,
            "gunicorn.access": gunicorn_logger,
        },
        "root": {"level": "WARNING", "handlers": ["stdout"]},
    }


class _TextDefaults(logging.Filter):
    """The text format names ``cluster``; give records without one a dash."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "cluster"):
            record.cluster = "-"
        return True


def configure(log_format: str = "json", level: str = "INFO") -> None:
    """Configure logging for this process (call before the Flask app is created)."""
    logging.config.dictConfig(logging_config(log_format, level))
    if log_format == "text":
        for handler in logging.getLogger("hooks").handlers:
            handler.addFilter(_TextDefaults())
