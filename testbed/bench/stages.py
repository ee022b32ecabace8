"""Where a healthy sync's CPU goes inside a loaded hook pod, stage by stage.

``testbed.bench.load`` gives the pod's CPU per sync from ``/proc``; this splits it. The hook runs
as in ``testbed.bench.load`` (production gunicorn config, 2 workers × 16 threads, caller
authentication, access log, fake members, 32 keep-alive clients), but from
:func:`create_app`, which is :func:`hooks.shell.app.create_app` with each stage wrapped in a
thread-CPU clock (``time.thread_time``: the CPU of the calling thread, user + system,
waiting excluded): the body read and parse, the request checks, the probe plan, the probe
round (all of it runs in the request's thread), the decision and the reply. What no wrapped
stage accounts for is gunicorn (accepting, parsing HTTP, handing the request to a thread,
writing the reply, the access log).

Run: ``.venv/bin/python -m testbed.bench.stages [--duration 10] [--concurrency 32]``. Loopback only.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from flask import Flask, Response, request

from testbed.bench.common import encode, recorded_body, steady_body
from testbed.bench.load_run import run_load
from testbed.fakes.patroni_fast import LEADER, REPLICA, fake_members
from testbed.metacontroller.gunicorn import gunicorn_hook

F = TypeVar("F", bound=Callable[..., Any])

_SECONDS: defaultdict[str, float] = defaultdict(float)
_LOCK = threading.Lock()


def _timed(name: str, function: F) -> F:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent = time.thread_time() - started
            with _LOCK:
                _SECONDS[name] += spent

    return wrapper  # type: ignore[return-value]


#: Stage names, in the order of a sync: (module, function) of the hook, wrapped where the
#: pipeline looks them up (hooks.shell.app reads and writes the body, hooks.shell.handler runs
#: the rest).
STAGES = {
    ("hooks.shell.app", "_json_body"): "body: read, depth check, json.loads",
    ("hooks.shell.handler", "load_sync_request"): "request checks (envelope, parent, spec)",
    ("hooks.shell.handler", "prepare"): "probe plan (addresses, policy)",
    ("hooks.shell.handler", "reconcile"): "decision and reply body",
    ("hooks.shell.app", "_reply"): "reply: json.dumps, Response",
}


def create_app() -> Flask:
    """The hook's app with its stages clocked, and ``GET /x/stages`` to read the clocks."""
    from hooks.patroni import PatroniProber
    from hooks.shell import app as hook_app
    from hooks.shell.config import HookSettings
    from hooks.shell.logs import configure

    settings = HookSettings.from_env()
    configure(settings.log_format, settings.log_level)
    prober = PatroniProber.from_settings(settings)
    prober.probe = _timed("probe round", prober.probe)  # type: ignore[method-assign]
    for (module_name, name), label in STAGES.items():
        module = importlib.import_module(module_name)
        setattr(module, name, _timed(label, getattr(module, name)))
    app = hook_app.create_app(settings=settings, prober=prober)
    app.wsgi_app = _timed("Flask app in all (request thread)", app.wsgi_app)  # type: ignore[method-assign]

    @app.get("/x/stages")
    def stages() -> Response:
        with _LOCK:
            body = {"pid": os.getpid(), "seconds": dict(_SECONDS)}
            if request.args.get("reset"):
                _SECONDS.clear()
        return Response(json.dumps(body), content_type="application/json")

    return app


def _every_worker(url: str, workers: int, reset: bool) -> list[dict[str, Any]]:
    """``/x/stages`` of each worker (a fresh connection per call; bounded)."""
    host, port = url.removeprefix("http://").split(":")
    seen: dict[int, dict[str, Any]] = {}
    for _ in range(200):
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", "/x/stages?reset=1" if reset else "/x/stages")
            answer = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        seen.setdefault(answer["pid"], answer)
        if len(seen) >= workers:
            break
    return list(seen.values())


def measure(duration: float, concurrency: int, workers: int = 2, threads: int = 16) -> str:
    with (
        tempfile.TemporaryDirectory(prefix="pgfh-stages-") as tmp,
        fake_members([REPLICA, LEADER, REPLICA]) as fakes,
        gunicorn_hook(
            Path(tmp),
            workers=workers,
            threads=threads,
            env={"PGFH_ALLOWED_PATRONI_PORTS": str(fakes.port)},
            app="testbed.bench.stages:create_app()",
        ) as hook,
    ):
        body = encode(steady_body(hook.url, recorded_body(fakes.hosts, fakes.port, fakes.names)))
        common: dict[str, Any] = {
            "method": "POST",
            "path": "/sync",
            "body": body,
            "leader": fakes.names[1],
            "concurrency": concurrency,
        }
        run_load(hook, name="warm-up", duration=min(3.0, duration), warmup=0.0, **common)
        _every_worker(hook.url, workers, reset=True)
        run = run_load(hook, name="sync", duration=duration, warmup=0.0, members=fakes, **common)
        answers = _every_worker(hook.url, workers, reset=True)
    total: defaultdict[str, float] = defaultdict(float)
    for answer in answers:
        for name, seconds in answer["seconds"].items():
            total[name] += seconds
    syncs = max(1, run.requests)
    hook_ms = 1000 * run.cpu["hook"] / syncs
    flask = 1000 * total.pop("Flask app in all (request thread)", 0.0) / syncs
    lines = [
        f"{run.ok}/{run.requests} syncs OK at {run.rate:.0f}/s, {concurrency} clients, "
        f"{workers} workers × {threads} threads; outcomes {run.outcomes}",
        "",
        "| where (thread CPU, user + system) | ms per sync |",
        "|---|---|",
        f"| **the pod in all** (`/proc`, as `testbed.bench.load`) | **{hook_ms:.2f}** |",
        f"| Flask app, request thread | {flask:.2f} |",
    ]
    inner = 0.0
    for name, seconds in sorted(total.items(), key=lambda item: -item[1]):
        inner += 1000 * seconds / syncs
        lines.append(f"| ↳ {name} | {1000 * seconds / syncs:.2f} |")
    lines.append(f"| ↳ the rest of the app (Flask, auth, logs, metrics) | {flask - inner:.2f} |")
    lines.append(f"| not in any of the above (gunicorn) | {hook_ms - flask:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 600:
        parser.error("--duration must be between 1 and 600 s")
    print(measure(args.duration, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
