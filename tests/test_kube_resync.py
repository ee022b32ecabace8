"""``resyncPeriodSeconds`` and the rate limiter, as Metacontroller really runs them, on the real
control plane: the safety net that bounds recovery after every hook pod was down.

A CompositeController of its own (no children) with ``resyncPeriodSeconds: 3`` calls a
recording hook on loopback that answers 500 or 200 as the test says; the Metacontroller
stand-in (or ``PGFH_METACONTROLLER_BINARY``) runs it on a control plane of the module's own,
where nothing else is installed. What the call times must show, as read in Metacontroller
v4.17.2 (``pkg/controller/composite/controller.go`` ``Start``/``processNextWorkItem``,
``pkg/dynamic/informer/informer.go`` ``addHandler``/``eventHandler.start``) and client-go
v0.36.3 (``util/workqueue/default_rate_limiters.go``):

* a failed sync is retried with the per-parent backoff from 5 ms (a burst of calls in the
  first second), which grows past the period;
* yet a call comes at least every period: the ticker ``Add``s the parent past the rate
  limiter, and a failure of the tick's sync does not reset the count (no burst after it);
* once the hook answers 200, the next call is at most a period away, and then calls come
  every period (the hook asks for no ``resyncAfterSeconds``);
* a success ``Forget``s the count: failures after it start at 5 ms again.

And without a period (``deploy/large-install/``, docs/scale.md): a parent whose backoff has
grown is brought back at once by a change of its own metadata, the runbook's
``kubectl annotate pgc --all -A pg-failover-hook.adg.io/resync=...``: the update event
``Add``s it past the rate limiter, and the success ``Forget``s its count.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from testbed.bench.fleet.kube_outage import RESYNC_ANNOTATION
from testbed.kubernetes import ControlPlane
from testbed.kubernetes.rest import KubeRest, resource_path
from testbed.metacontroller.harness import CLUSTER
from testbed.metacontroller.kube import CC_PATH, KubeMetacontroller
from testbed.metacontroller.kube_rig import PARENT_API, PARENTS, cluster_resource
from testbed.metacontroller.kube_setup import apply_crds
from testbed.metacontroller.metacontroller_binary import binary_from_env
from tests.controlplane_fixtures import running_control_plane

pytestmark = [pytest.mark.kube, pytest.mark.slow]

PERIOD = 3
NAME = "pgfh-resync-probe"
#: Slack for a tick's call to reach the hook (a sync of one parent, no children).
SLACK = 0.7


class RecordingHook:
    """A sync hook on loopback that records when it was called and answers ``status``."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []
        self.status = 500
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with hook._lock:
                    status = hook.status
                    hook.calls.append((time.monotonic(), status))
                body = json.dumps({"children": []}).encode() if status == 200 else b"down"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/sync"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingHook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, status: int) -> float:
        with self._lock:
            self.status = status
        return time.monotonic()

    def times(self, since: float, until: float = float("inf")) -> list[float]:
        with self._lock:
            return [at for at, _ in self.calls if since <= at < until]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own: a real binary runs every CompositeController it
    finds, so no other test's may be there."""
    with running_control_plane(tmp_path_factory) as running:
        yield running


@contextlib.contextmanager
def metacontroller(plane: ControlPlane, namespace: str, work_dir: Path) -> Iterator[str]:
    """The stand-in, or the real binary; yields where its log is (or ``"stand-in"``)."""
    binary = binary_from_env(plane.admin_kubeconfig, work_dir, namespace)
    if binary is None:
        with KubeMetacontroller(plane.admin_kubeconfig, NAME):
            yield "stand-in"
        return
    binary.start()
    try:
        yield str(binary.log_path)
    finally:
        binary.stop()


def _max_gap(times: list[float], start: float, end: float) -> float:
    points = [start, *[t for t in times if start <= t <= end], end]
    return max(b - a for a, b in itertools.pairwise(points))


@contextlib.contextmanager
def probe_controller(rest: KubeRest, hook: RecordingHook, period: int | None) -> Iterator[str]:
    """A CompositeController ``NAME`` calling ``hook`` (no children; ``period`` its
    ``resyncPeriodSeconds``, None: absent) and one parent in a new namespace, which it yields;
    both are deleted afterwards, so the module's next test has a controller and a parent of
    its own."""
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    apply_crds(rest)
    rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    spec: dict[str, object] = {
        "parentResource": {"apiVersion": PARENT_API, "resource": PARENTS},
        "generateSelector": True,  # else claimChildren wants a spec.selector
        "hooks": {"sync": {"webhook": {"url": hook.url, "timeout": "2s"}}},
    }
    if period is not None:
        spec["resyncPeriodSeconds"] = period
    controller = {
        "apiVersion": "metacontroller.k8s.io/v1alpha1",
        "kind": "CompositeController",
        "metadata": {"name": NAME},
        "spec": spec,
    }
    rest.create(CC_PATH, controller)
    rest.create(resource_path(PARENT_API, PARENTS, namespace), cluster_resource(namespace))
    try:
        yield namespace
    finally:
        rest.delete(f"{CC_PATH}/{NAME}")
        rest.delete(resource_path(PARENT_API, PARENTS, namespace, CLUSTER))


def _first_call(hook: RecordingHook, log: str) -> float:
    deadline = time.monotonic() + 60
    while not hook.times(0.0) and time.monotonic() < deadline:
        time.sleep(0.05)
    calls = hook.times(0.0)
    assert calls, f"no sync call within 60 s ({log})"
    return calls[0]


@contextlib.contextmanager
def probed(
    plane: ControlPlane, tmp_path: Path, period: int | None
) -> Iterator[tuple[RecordingHook, str, float]]:
    """The recording hook (answering 500), its controller and parent, Metacontroller running
    them: yields the hook, where Metacontroller logs, and when the first call came."""
    rest = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    try:
        with (
            RecordingHook() as hook,
            probe_controller(rest, hook, period) as namespace,
            metacontroller(plane, namespace, tmp_path) as log,
        ):
            yield hook, log, _first_call(hook, log)
    finally:
        rest.close()


def test_resync_period_brings_a_backed_off_parent_back_and_success_forgets(
    plane: ControlPlane, tmp_path: Path
) -> None:
    with probed(plane, tmp_path, PERIOD) as (hook, log, first):
        # Phase A: failing for 4 periods.
        time.sleep(max(0.0, first + 4 * PERIOD - time.monotonic()))
        failing = hook.times(first)
        early = [t for t in failing if t < first + 1.0]
        assert len(early) >= 6, f"the backoff does not start at 5 ms: {failing} ({log})"
        # By the first tick the backoff is past 2.5 s and grows: only ticks keep the pace.
        late = [t for t in failing if t >= first + 2.6]
        gap = _max_gap(late, first + PERIOD, first + 4 * PERIOD)
        assert gap <= PERIOD + SLACK, (
            f"no call for {gap:.2f} s while failing: the resync tick did not bypass the "
            f"backoff; calls {[round(t - first, 2) for t in failing]} ({log})"
        )
        bursts = [a for a, c in zip(late, late[2:], strict=False) if c - a < 0.2]
        assert bursts == [], (
            f"calls {[round(t - first, 2) for t in failing]}: a tick's failure reset the "
            f"backoff (a burst after it) ({log})"
        )
        # Phase B: the hook answers 200: the next call is at most a period away.
        healthy = hook.answer(200)
        time.sleep(3 * PERIOD + SLACK)
        ok = [at for at, status in hook.calls if status == 200]
        assert ok and ok[0] - healthy <= PERIOD + SLACK, (
            f"first 200 {[round(t - healthy, 2) for t in ok]} s after the hook came back ({log})"
        )
        # Calls at least every period, and ticks a period apart (besides them: its own
        # status write's event, and a backoff entry of phase A still waiting: Forget
        # does not remove it).
        gap = _max_gap(ok, ok[0], healthy + 3 * PERIOD + SLACK)
        paired = [a for a in ok if any(abs(b - a - PERIOD) <= SLACK for b in ok)]
        assert gap <= PERIOD + SLACK and len(paired) >= 2, (
            f"healthy calls {[round(t - healthy, 2) for t in ok]}: not every {PERIOD} s ({log})"
        )
        # Phase C: failing again right after a success: the backoff starts over at 5 ms.
        last = ok[-1]
        hook.answer(500)
        time.sleep(max(0.0, last + 2 * PERIOD + 1.0 - time.monotonic()))
        again = [at for at, status in hook.calls if status == 500 and at > last]
        assert again, f"no call after the hook failed again ({log})"
        burst = [t for t in again if t < again[0] + 1.0]
        assert len(burst) >= 6, (
            f"after a success the backoff did not restart at 5 ms (Forget): "
            f"{[round(t - again[0], 3) for t in again]} ({log})"
        )
    calls_seen = [(round(at - first, 3), status) for at, status in hook.calls]
    figures = {"period_s": PERIOD, "metacontroller": log, "calls": calls_seen}
    print(f"\nRESYNC {json.dumps(figures)}", flush=True)


#: The backoff the parent must have reached before the annotation: its next retry is then
#: at least twice this away, well past the annotation's call.
GROWN_BACKOFF = 2.0


def _annotate(plane: ControlPlane) -> float:
    """The runbook's command, as written there, with the control plane's own kubectl; returns
    when it was started."""
    started = time.monotonic()
    stamp = f"{RESYNC_ANNOTATION}={time.time():.3f}"
    plane.kubectl("annotate", "pgc", "--all", "-A", stamp, "--overwrite")
    return started


def test_without_a_period_an_annotation_brings_a_backed_off_parent_back_at_once(
    plane: ControlPlane, tmp_path: Path
) -> None:
    with probed(plane, tmp_path, None) as (hook, log, first):
        # The hook is down until the backoff has grown past GROWN_BACKOFF (5 ms doubling:
        # about 5 s of failures).
        deadline = first + 30
        gaps: list[float] = []
        while time.monotonic() < deadline:
            failing = hook.times(first)
            gaps = [b - a for a, b in itertools.pairwise(failing)]
            if gaps and gaps[-1] >= GROWN_BACKOFF:
                break
            time.sleep(0.05)
        assert gaps and gaps[-1] >= GROWN_BACKOFF, (
            f"the backoff never grew past {GROWN_BACKOFF} s: calls "
            f"{[round(t - first, 3) for t in hook.times(first)]} ({log})"
        )
        last_failure = hook.times(first)[-1]
        next_retry = last_failure + 2 * gaps[-1]  # the backoff's own next call
        hook.answer(200)
        annotated = _annotate(plane)
        time.sleep(max(0.0, next_retry - 0.2 - time.monotonic()))
        ok = [at for at, status in hook.calls if status == 200]
        assert ok and ok[0] - annotated <= 2.0 and ok[0] < next_retry - 0.2, (
            f"200s {[round(t - annotated, 2) for t in ok]} s after the annotation; the "
            f"backoff's next call was due {next_retry - annotated:.2f} s after it ({log})"
        )
        # The success forgot the count: failing again (brought by the next annotation),
        # the retries start over at 5 ms.
        hook.answer(500)
        again_from = _annotate(plane)
        time.sleep(1.5)
        again = [at for at, status in hook.calls if status == 500 and at > again_from]
        burst = [t for t in again if again and t < again[0] + 1.0]
        assert len(burst) >= 6, (
            f"after a success the backoff did not restart at 5 ms (Forget): "
            f"{[round(t - again_from, 3) for t in again]} ({log})"
        )
    figures = {
        "metacontroller": log,
        "grown_backoff_s": round(gaps[-1], 3),
        "first_200_after_annotation_s": round(ok[0] - annotated, 3),
        "backoff_next_call_after_annotation_s": round(next_retry - annotated, 3),
    }
    print(f"\nRESYNC-ANNOTATION {json.dumps(figures)}", flush=True)
