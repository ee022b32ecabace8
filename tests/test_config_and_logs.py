"""Unit tests of the hook's settings (:mod:`hooks.shell.config`) and logs (:mod:`hooks.shell.logs`).

Test design notes
-----------------
* ``HookSettings.from_env`` gets an explicit mapping, never the real environment
  (except one test that proves ``None`` means ``os.environ``, via ``monkeypatch``).
  Each ``PGFH_*`` variable is checked for its parsed value, and every bad value must
  raise ``ValueError`` whose message names the variable, so an operator reading a
  crash-looping pod's log knows which setting to fix.
* Values that ``float()`` accepts but that make no sense (``nan``, ``inf``, a fraction
  for a thread count) are refused too, naming the variable.
* Logs are captured with a ``StreamHandler`` on a ``StringIO`` whose formatter and filter
  are built from the project's own :func:`hooks.shell.logs.logging_config` dict, attached to a
  private logger, so the global logging configuration (and pytest's capture) is never
  touched. Each line is parsed as JSON and the bound fields are looked up by key.
"""

from __future__ import annotations

import contextvars
import dataclasses
import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from importlib import import_module
from typing import Any

import pytest

from hooks.domain.model import ResyncTiming
from hooks.shell.config import HookSettings, closes_connection
from hooks.shell.logs import ContextFilter, bound, logging_config

# ===================================================================== settings


def test_no_variables_give_the_documented_defaults() -> None:
    settings = HookSettings.from_env({})
    assert settings == HookSettings()
    assert (
        settings.probe_deadline,
        settings.max_probe_body_bytes,
        settings.max_request_bytes,
        settings.resync,
        settings.log_format,
        settings.log_level,
    ) == (2.0, 65536, 256 * 1024 + 64 * 16 * 1024, ResyncTiming(1.0, 0.3), "json", "INFO")


def test_the_degraded_resync_is_faster_than_the_healthy_one_by_default() -> None:
    timing = ResyncTiming()
    assert 0 < timing.degraded < timing.healthy


@pytest.mark.parametrize(
    ("variable", "raw", "attribute", "expected"),
    [
        ("PGFH_PROBE_DEADLINE_SECONDS", "1.5", "probe_deadline", 1.5),
        ("PGFH_PROBE_DEADLINE_SECONDS", "3", "probe_deadline", 3.0),
        ("PGFH_PROBE_DEADLINE_SECONDS", " 2.5 ", "probe_deadline", 2.5),
        ("PGFH_MAX_PROBE_BODY_BYTES", "8192", "max_probe_body_bytes", 8192),
        ("PGFH_MAX_REQUEST_BYTES", "1048576", "max_request_bytes", 1048576),
        ("PGFH_MAX_JSON_DEPTH", "32", "max_json_depth", 32),
        ("PGFH_MAX_MEMBERS", "16", "probe_policy.max_members", 16),
        ("PGFH_RESYNC_HEALTHY_SECONDS", "0.75", "resync.healthy", 0.75),
        ("PGFH_RESYNC_DEGRADED_SECONDS", "0.1", "resync.degraded", 0.1),
        ("PGFH_LOG_FORMAT", "text", "log_format", "text"),
        ("PGFH_LOG_LEVEL", "debug", "log_level", "DEBUG"),
        ("PGFH_LOG_LEVEL", "Warning", "log_level", "WARNING"),
        ("PGFH_CONNECTION_MAX_REQUESTS", "20", "connection_max_requests", 20),
        ("PGFH_CONNECTION_MAX_REQUESTS", " 0 ", "connection_max_requests", 0),
    ],
)
def test_each_variable_is_parsed(variable: str, raw: str, attribute: str, expected: object) -> None:
    value: Any = HookSettings.from_env({variable: raw})
    for part in attribute.split("."):
        value = getattr(value, part)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    "variable",
    [
        "PGFH_PROBE_DEADLINE_SECONDS",
        "PGFH_MAX_PROBE_BODY_BYTES",
        "PGFH_MAX_REQUEST_BYTES",
        "PGFH_MAX_JSON_DEPTH",
        "PGFH_MAX_MEMBERS",
        "PGFH_RESYNC_HEALTHY_SECONDS",
        "PGFH_RESYNC_DEGRADED_SECONDS",
        "PGFH_CONNECTION_MAX_REQUESTS",
    ],
)
def test_an_empty_number_variable_keeps_the_default(variable: str) -> None:
    assert HookSettings.from_env({variable: ""}) == HookSettings()


NUMBER_VARIABLES = [
    "PGFH_PROBE_DEADLINE_SECONDS",
    "PGFH_MAX_PROBE_BODY_BYTES",
    "PGFH_MAX_REQUEST_BYTES",
    "PGFH_RESYNC_HEALTHY_SECONDS",
    "PGFH_RESYNC_DEGRADED_SECONDS",
]


@pytest.mark.parametrize("variable", NUMBER_VARIABLES)
@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("fast", "is not a number"),
        ("2s", "is not a number"),
        ("1,5", "is not a number"),
        (" ", "is not a number"),
        ("0", "must be positive"),
        ("-1", "must be positive"),
        ("-0.0", "must be positive"),
    ],
)
def test_a_bad_number_raises_value_error_naming_the_variable(
    variable: str, raw: str, why: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(f"{variable}={raw!r} {why}") + "$"):
        HookSettings.from_env({variable: raw})


def _refusals(cases: list[tuple[str, str]]) -> list[str]:
    """The cases that ``from_env`` accepts, or refuses without naming the variable."""
    wrong = []
    for variable, raw in cases:
        try:
            settings = HookSettings.from_env({variable: raw})
        except ValueError as error:
            if variable not in str(error):
                wrong.append(f"{variable}={raw!r}: {error}")
        except Exception as error:  # OverflowError from int(inf), ...
            wrong.append(f"{variable}={raw!r}: {type(error).__name__}: {error}")
        else:
            wrong.append(f"{variable}={raw!r} accepted: {settings}")
    return wrong


# Each test loops over the variables, so a regression is one failing line, not a dozen.


@pytest.mark.parametrize("raw", ["nan", "-nan", "inf", "1e999"])
def test_nan_and_infinity_are_rejected_naming_the_variable(raw: str) -> None:
    assert _refusals([(v, raw) for v in NUMBER_VARIABLES]) == []


def test_a_fraction_for_a_count_is_rejected_not_truncated_to_zero() -> None:
    counts = ["PGFH_MAX_PROBE_BODY_BYTES", "PGFH_MAX_REQUEST_BYTES"]
    assert _refusals([(v, "0.5") for v in counts]) == []


def test_an_unknown_log_format_or_level_is_rejected_naming_the_variable() -> None:
    assert _refusals([("PGFH_LOG_FORMAT", "xml"), ("PGFH_LOG_LEVEL", "LOUD")]) == []


@pytest.mark.parametrize("raw", ["-1", "2.5", "many", "0.0"])
def test_a_bad_connection_request_limit_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="PGFH_CONNECTION_MAX_REQUESTS"):
        HookSettings.from_env({"PGFH_CONNECTION_MAX_REQUESTS": raw})


def test_a_connection_is_closed_at_its_nth_request_and_never_with_zero() -> None:
    assert HookSettings().connection_max_requests == 100
    closes = [n for n in range(1, 301) if closes_connection(n, 100)]
    assert closes[0] == 100  # requests 1..99 keep the connection; the 100th ends it
    assert not any(closes_connection(n, 0) for n in range(1, 1000))
    assert closes_connection(1, 1)  # 1: every reply says Connection: close


def test_from_env_without_a_mapping_reads_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGFH_MAX_PROBE_BODY_BYTES", "3000")
    monkeypatch.setenv("PGFH_RESYNC_DEGRADED_SECONDS", "0.2")
    settings = HookSettings.from_env()
    assert (settings.max_probe_body_bytes, settings.resync.degraded) == (3000, 0.2)


def test_unrelated_variables_are_ignored() -> None:
    assert HookSettings.from_env({"PGFH_UNKNOWN": "x", "PROBE_THREADS": "1"}) == HookSettings()


def test_a_retired_setting_is_ignored_not_refused() -> None:
    # docs/upgrade.md: Deployments that still set PGFH_PROBE_THREADS (the probe pool is
    # gone) keep starting; a refused start-up would turn an upgrade into an outage.
    assert HookSettings.from_env({"PGFH_PROBE_THREADS": "64"}) == HookSettings()


def test_settings_are_immutable() -> None:
    settings = HookSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.probe_deadline = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.resync.healthy = 9  # type: ignore[misc]


# ========================================================================= logs


class Captured:
    """JSON log lines written by the project's formatter and context filter."""

    def __init__(self, logger: logging.Logger, stream: io.StringIO) -> None:
        self.logger = logger
        self.stream = stream

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]


def _formatter(config: dict[str, Any], name: str) -> logging.Formatter:
    spec = dict(config["formatters"][name])
    factory = spec.pop("()", None)
    if factory is None:
        return logging.Formatter(spec["format"])
    module, _, attribute = factory.rpartition(".")
    formatter: logging.Formatter = getattr(import_module(module), attribute)(**spec)
    return formatter


@pytest.fixture
def captured(request: pytest.FixtureRequest) -> Iterator[Captured]:
    config = logging_config("json", "DEBUG")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_formatter(config, config["handlers"]["stdout"]["formatter"]))
    for name in config["handlers"]["stdout"]["filters"]:
        handler.addFilter(config["filters"][name]["()"]())
    logger = logging.getLogger(f"hooks.tests.{request.node.name}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield Captured(logger, stream)
    finally:
        logger.removeHandler(handler)
        handler.close()


def test_the_json_handler_uses_the_context_filter() -> None:
    config = logging_config("json")
    assert config["handlers"]["stdout"]["formatter"] == "json"
    assert config["filters"]["context"]["()"] is ContextFilter
    assert config["handlers"]["stdout"]["filters"] == ["context"]


def test_a_line_logged_inside_bound_carries_the_cluster_and_request_id(captured: Captured) -> None:
    with bound(cluster="databases/pg-orders", request_id="req-1"):
        captured.logger.warning("keeping routing: %s", "no leader")
    (line,) = captured.records()
    assert line["cluster"] == "databases/pg-orders"
    assert line["request_id"] == "req-1"
    assert line["message"] == "keeping routing: no leader"
    assert line["level"] == "WARNING"
    assert line["logger"] == captured.logger.name
    assert "time" in line and "asctime" not in line and "levelname" not in line


def test_a_line_logged_outside_bound_has_no_bound_fields(captured: Captured) -> None:
    with bound(cluster="databases/pg-orders", request_id="req-1"):
        pass
    captured.logger.info("between requests")
    (line,) = captured.records()
    assert "cluster" not in line and "request_id" not in line


def test_nested_bound_adds_fields_and_restores_the_outer_ones(captured: Captured) -> None:
    with bound(cluster="databases/a", request_id="r1"):
        with bound(request_id="r2", hook="finalize"):
            captured.logger.info("inner")
        captured.logger.info("outer")
    inner, outer = captured.records()
    assert (inner["cluster"], inner["request_id"], inner["hook"]) == (
        "databases/a",
        "r2",
        "finalize",
    )
    assert (outer["cluster"], outer["request_id"]) == ("databases/a", "r1")
    assert "hook" not in outer


def test_bound_fields_are_restored_even_when_the_block_raises(captured: Captured) -> None:
    with pytest.raises(RuntimeError), bound(cluster="databases/a"):
        raise RuntimeError("boom")
    captured.logger.info("after")
    assert "cluster" not in captured.records()[0]


def test_an_explicit_extra_wins_over_a_bound_field(captured: Captured) -> None:
    with bound(cluster="databases/a", request_id="bound"):
        captured.logger.info("explicit", extra={"request_id": "explicit"})
    (line,) = captured.records()
    assert (line["cluster"], line["request_id"]) == ("databases/a", "explicit")


def test_a_thread_started_with_copy_context_sees_the_fields(captured: Captured) -> None:
    with bound(cluster="databases/b", request_id="req-8"):
        context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(captured.logger.info, "from a thread"))
    thread.start()
    thread.join()
    (line,) = captured.records()
    assert (line["cluster"], line["request_id"]) == ("databases/b", "req-8")


def test_the_text_format_names_the_cluster() -> None:
    config = logging_config("text", "debug")
    assert "%(cluster)s" in config["formatters"]["text"]["format"]
    assert config["handlers"]["stdout"]["formatter"] == "text"
    assert config["loggers"]["hooks"]["level"] == "debug"


def test_gunicorn_loggers_do_not_propagate_so_lines_are_not_doubled() -> None:
    config = logging_config()
    for name in ("hooks", "gunicorn.error", "gunicorn.access"):
        assert config["loggers"][name]["propagate"] is False
        assert config["loggers"][name]["handlers"] == ["stdout"]


@pytest.mark.parametrize("log_format", ["xml", "JSON", ""])
def test_an_unknown_log_format_is_refused(log_format: str) -> None:
    with pytest.raises(ValueError, match="log format must be json or text"):
        logging_config(log_format)


def test_the_fairness_settings_are_read_and_checked() -> None:
    default = HookSettings.from_env({})
    assert (default.resync.min_poll, default.request_threads) == (1.0, 16)
    assert default.probe_threads_per_round == 16
    settings = HookSettings.from_env(
        {
            "PGFH_MIN_POLL_SECONDS": "2.5",
            "GUNICORN_THREADS": "8",
            "PGFH_PROBE_THREADS_PER_ROUND": "4",
        }
    )
    assert (settings.resync.min_poll, settings.request_threads) == (2.5, 8)
    assert settings.probe_threads_per_round == 4
    for name, value in (
        ("PGFH_MIN_POLL_SECONDS", "0"),
        ("GUNICORN_THREADS", "1.5"),
        ("PGFH_PROBE_THREADS_PER_ROUND", "-1"),
    ):
        with pytest.raises(ValueError, match=name):
            HookSettings.from_env({name: value})


def test_the_probe_pool_holds_every_request_threads_round() -> None:
    from hooks.patroni import PatroniProber

    prober = PatroniProber.from_settings(HookSettings(request_threads=8, probe_threads_per_round=4))
    assert (prober.threads, prober.round_threads) == (32, 4)
    default = PatroniProber.from_settings(HookSettings())
    assert (default.threads, default.round_threads) == (256, 16)
