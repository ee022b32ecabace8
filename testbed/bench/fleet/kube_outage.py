"""Every hook pod down, then back: the fleet's recovery on the real control plane
(``python -m testbed.bench.fleet.on_kube --hooks-down S``, docs/scale.md "After every hook pod
was down").

The hook stops (its gunicorn gone: every call refused, as when no hook pod is ready), the
window's switchovers happen while it is down, and it comes back at the same URL with the same
token, as a Deployment's pods come back behind its Service. What is measured is how long after
its return each of those switchovers is routed: with ``resyncPeriodSeconds`` a tick brings
every parent back; without it, each parent's next retry (client-go's backoff, 10 retries/s for
the whole queue) or, with ``--resync-annotate``, the runbook's
``kubectl annotate pgc --all -A pg-failover-hook.adg.io/resync=...`` done here the way kubectl
does it: one merge patch per parent, one after the other.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from testbed.kubernetes.rest import KubeRest, resource_path
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook

#: The runbook's annotation (docs/runbook.md, "PgfhHookPodsDown"): any change of a parent's
#: metadata enqueues it past the rate limiter; the hook reads none of it
#: (tests/test_kube_resync.py runs the runbook's command with it).
RESYNC_ANNOTATION = "pg-failover-hook.adg.io/resync"


class RestartableHook:
    """The hook under its production gunicorn config, which can be stopped and started again
    at the same port with the same token (each start in a directory of its own)."""

    def __init__(self, work_dir: Path, env: Mapping[str, str], workers: int, threads: int) -> None:
        self._work_dir = work_dir
        self._env = dict(env)
        self._workers, self._threads = workers, threads
        self._starts = 0
        self._running: contextlib.ExitStack | None = None
        self.hook = self._start(port=None, token=None)

    def _start(self, port: int | None, token: str | None) -> GunicornHook:
        self._starts += 1
        work_dir = self._work_dir / f"hook-{self._starts}"
        work_dir.mkdir(parents=True)
        running = contextlib.ExitStack()
        hook = running.enter_context(
            gunicorn_hook(
                work_dir,
                env=self._env,
                port=port,
                token=token,
                workers=self._workers,
                threads=self._threads,
            )
        )
        self._running = running
        return hook

    def stop(self) -> None:
        """Every hook pod gone: the port refuses connections from now on."""
        if self._running is not None:
            self._running.close()
            self._running = None

    def start_again(self) -> float:
        """Back at the same URL and token; returns when it answers ``/readyz``."""
        port = int(self.hook.url.rsplit(":", 1)[1])
        self.hook = self._start(port=port, token=self.hook.token)
        return time.monotonic()

    def close(self) -> None:
        self.stop()


@contextlib.contextmanager
def restartable_hook(
    work_dir: Path, env: Mapping[str, str], workers: int, threads: int
) -> Iterator[RestartableHook]:
    hook = RestartableHook(work_dir, env, workers, threads)
    try:
        yield hook
    finally:
        hook.close()


def annotate_all(rest: KubeRest, parents: list[tuple[str, str]], stamp: str) -> float:
    """What ``kubectl annotate pgc --all -A <RESYNC_ANNOTATION>=<stamp> --overwrite`` sends:
    a merge patch of one annotation, parent after parent; returns the seconds it took."""
    from testbed.metacontroller.kube_rig import PARENT_API, PARENTS

    started = time.monotonic()
    body = {"metadata": {"annotations": {RESYNC_ANNOTATION: stamp}}}
    for namespace, name in parents:
        rest.merge_patch(resource_path(PARENT_API, PARENTS, namespace, name), body)
    return time.monotonic() - started
