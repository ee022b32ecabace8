"""One Metacontroller replica as a container the rig's supervisor
(:mod:`testbed.metacontroller.supervisor`)
runs: the stand-in (:class:`StandinReplica`) or a real binary (:class:`BinaryReplica`).

Both behave as Metacontroller v4.17.2 run with ``--leader-election`` does
(``pkg/cmd/metacontroller/main.go``, ``pkg/server/server.go``):

1. at start, ``k8sCommunicationCheck``: ``GET /api`` up to 6 times, 5 s timeout each, 5 s
   apart; still failing: the process exits with 1 (``server.New`` returns the error);
2. then it campaigns for the Lease ``metacontroller``
   (:mod:`testbed.metacontroller.leader_election`) and
   runs its controllers only once it leads (the CompositeController's reconciler is a
   leader-election runnable of the manager: its parent and child informers start then);
3. it EXITS with 1 when a renewal fails past the renew deadline (``OnStoppedLeading`` ->
   "leader election lost" -> ``os.Exit(1)``), and with 0 on SIGTERM, in neither case
   releasing the Lease.

The stand-in replica runs in the test's process (its "exit" stops every thread of it and its
controller and reports the exit code; a restart is a new object: a new identity, empty
caches), so the rig keeps every hook call it recorded.

The stand-in's replicas (the communication check, the Lease of
:mod:`testbed.metacontroller.leader_election`,
:class:`testbed.metacontroller.kube.KubeMetacontroller` started only while leading, an exit on
a lost lease) run under
:class:`testbed.metacontroller.supervisor.Supervisor` (the kubelet's restarts). Where that
differs from Metacontroller: a replica lives in the test's process, so its "exit" stops its
threads rather than ending a process (a hook call in flight may still complete after the
lease was lost; a real exit cuts it); a standby starts no informers before it leads (the
manager's caches of CompositeControllers are started by Metacontroller before the election;
the stand-in reads the CompositeController when it starts leading); no ``LeaderElection``
Events nor leader metrics; an elector compares the records it reads by value, where client-go
compares raw bytes and does not store its own PUT's bytes (so its next GET restamps the
leader's own observation time: the leader's view only, never a standby's); the supervisor sees
an exit within 0.1 s (the kubelet's PLEG relists every second); a "ready" replica is one past
its communication check (the binary's ``/readyz``, a ping, likewise answers before it leads).
"""

from __future__ import annotations

import contextlib
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from testbed.kubernetes.rest import KubeApiError, KubeRest
from testbed.metacontroller.kube import KubeMetacontroller
from testbed.metacontroller.leader_election import DEFAULT_TIMINGS, LeaderElector, Timings
from testbed.metacontroller.metacontroller_binary import MetacontrollerBinary, command_args

LOG = logging.getLogger("standin.metacontroller_replica")

#: ``pkg/server/server.go`` ``k8sCommunicationCheck``: 6 attempts, 5 s timeout, 5 s apart.
COMMUNICATION_ATTEMPTS = 6
COMMUNICATION_TIMEOUT = 5.0
COMMUNICATION_PAUSE = 5.0
#: Exit codes: ``os.Exit(1)`` on an error, 0 after SIGTERM, 137 after SIGKILL.
EXIT_ERROR, EXIT_TERM, EXIT_KILLED = 1, 0, 137


class StandinReplica:
    """The stand-in as one container: communication check, election, controllers while
    leading, exit on a lost lease."""

    def __init__(
        self,
        name: str,
        kubeconfig: Path,
        namespace: str,
        make_controller: Callable[[], KubeMetacontroller],
        *,
        timings: Timings = DEFAULT_TIMINGS,
        on_rest: Callable[[KubeRest], None] | None = None,
    ) -> None:
        self.name = name
        self.make_controller = make_controller
        self.rest = KubeRest.from_kubeconfig(kubeconfig)
        if on_rest is not None:
            on_rest(self.rest)
        self.elector = LeaderElector(
            self.rest,
            namespace,
            timings=timings,
            on_started_leading=self._lead,
            on_stopped_leading=self._stop_controller,
        )
        self.controller: KubeMetacontroller | None = None
        self._code: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.phase = "created"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        self.phase = "checking communication with the API server"
        if not self._communication_check():
            self._exit(EXIT_ERROR, "exited: no communication with the API server")
            return
        self.phase = "waiting for the lease"
        lost = self.elector.run(self._stop)
        if lost:
            self._exit(EXIT_ERROR, "exited: leader election lost (renewal failed)")
        else:
            self._exit(EXIT_TERM, "stopped")

    def _communication_check(self) -> bool:
        for attempt in range(COMMUNICATION_ATTEMPTS):
            try:
                self.rest.request("GET", "/api", timeout=COMMUNICATION_TIMEOUT)
                return True
            except (KubeApiError, requests.RequestException):
                LOG.info(
                    "%s: communication with the API server failed (attempt %d)",
                    self.name,
                    attempt + 1,
                )
            if self._stop.wait(COMMUNICATION_PAUSE):
                return False
        return False

    def _lead(self) -> None:
        """``OnStartedLeading``: the controllers start (their informers list, then sync);
        retried while leading if the API server cannot be listed yet."""
        self.phase = "leading, starting controllers"
        while self.elector.leading.is_set() and not self._stop.is_set():
            controller = self.make_controller()
            try:
                controller.start()
            except Exception as error:  # API server unreachable: informers retry
                LOG.info("%s: controllers not started: %s", self.name, error)
                controller.stop()
                self._stop.wait(1.0)
                continue
            with self._lock:
                if self.elector.leading.is_set() and not self._stop.is_set():
                    self.controller = controller
                    self.phase = "leading"
                    return
            controller.stop()
            return

    def _stop_controller(self) -> None:
        with self._lock:
            controller, self.controller = self.controller, None
        if controller is not None:
            controller.stop()

    def _exit(self, code: int, phase: str) -> None:
        self._stop_controller()
        self.phase = phase
        with self._lock:
            if self._code is None:
                self._code = code

    def exit_code(self) -> int | None:
        with self._lock:
            return self._code

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._stop_controller()
        with self._lock:
            if self._code is None:
                self._code = EXIT_TERM
        self.rest.close()

    def kill(self) -> None:
        """SIGKILL: at once (the controller's threads are stopped in the background)."""
        with self._lock:
            self._code = EXIT_KILLED
        self._stop.set()
        threading.Thread(target=self.stop, daemon=True).start()

    def leading(self) -> bool:
        return self.elector.leading.is_set() and self.exit_code() is None

    def ready(self) -> bool:
        """Serving its probes: past the communication check (readiness is a ping)."""
        return self.phase not in ("created", "checking communication with the API server")

    def describe(self) -> str:
        return f"{self.name} ({self.elector.identity}): {self.phase}"


#: The log lines of client-go's elector (klog) that tell where a binary is.
ACQUIRING = re.compile(r"attempting to acquire leader lease", re.IGNORECASE)
ACQUIRED = re.compile(r"successfully acquired lease", re.IGNORECASE)
LOST = re.compile(r"leader election lost|stopped leading", re.IGNORECASE)


class BinaryReplica:
    """A real Metacontroller binary as one container (its own log file and ports)."""

    def __init__(
        self, name: str, binary: Path, kubeconfig: Path, work_dir: Path, namespace: str
    ) -> None:
        self.name = name
        self.log_path = work_dir / f"metacontroller-{name}.log"
        self.process = MetacontrollerBinary(
            binary, kubeconfig, self.log_path, command_args(namespace)
        )
        probe = next(a for a in self.process.args if a.startswith("--health-probe-bind-address"))
        self.readyz = f"http://{probe.split('=', 1)[1]}/readyz"

    def start(self) -> None:
        self.process.start()

    def exit_code(self) -> int | None:
        running = self.process.process
        return None if running is None else running.poll()

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        running = self.process.process
        if running is not None and running.poll() is None:
            running.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.wait(5)

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def leading(self) -> bool:
        log = self._log()
        return bool(ACQUIRED.search(log)) and not LOST.search(log) and self.exit_code() is None

    def ready(self) -> bool:
        try:
            return requests.get(self.readyz, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def describe(self) -> str:
        code = self.exit_code()
        log = self._log()
        if code is not None:
            state = f"exited with {code}"
        elif ACQUIRED.search(log):
            state = "leading"
        elif ACQUIRING.search(log):
            state = "waiting for the lease"
        else:
            state = "starting"
        last = [line for line in log.splitlines() if line.strip()][-1:] or [""]
        return f"{self.name}: {state} (log {self.log_path}: {last[0][:200]})"


def wait_ready(container: StandinReplica | BinaryReplica, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not container.ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{container.describe()} not ready in {timeout} s")
        time.sleep(0.1)
