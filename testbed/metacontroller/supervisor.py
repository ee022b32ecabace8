"""What the kubelet does for Metacontroller's containers: restart one that exited, with the
CrashLoopBackOff delays of the kubelet the test control plane pins (k8s.io/kubernetes v1.36.3).

From that source:

* ``pkg/kubelet/kubelet.go``: ``klet.crashLoopBackOff = flowcontrol.NewBackOff(base, boMax)``
  with ``newCrashLoopBackOff``: ``initialCrashLoopBackOff`` 10 s, ``MaxCrashLoopBackOff`` =
  ``MaxContainerBackOff`` 300 s. The gate ``KubeletCrashLoopBackOffMax`` (beta, on by default
  since 1.35, ``pkg/features/kube_features.go``) takes the maximum from the kubelet config's
  ``crashLoopBackOff.maxContainerRestartPeriod``, which defaults to the same 300 s
  (``pkg/kubelet/apis/config/v1beta1/defaults.go``); ``ReduceDefaultCrashLoopBackOffDecay``
  (1 s to 60 s) is alpha, off by default. So the defaults are unchanged: 10 s doubling to 300 s.
* ``pkg/kubelet/kuberuntime/kuberuntime_manager.go`` ``doBackOff``: a container that exited
  is restarted at once if its key has no backoff entry (the FIRST exit: no delay), else once
  ``backOff.Get(key)`` has passed since it finished; each restart calls ``Next``, which
  doubles the delay (client-go ``util/flowcontrol/backoff.go``, no jitter with
  ``NewBackOff``) up to the maximum, or starts over at 10 s when the exit came more than
  ``2 x max`` = 600 s after the previous restart (``hasExpired``): a container that ran
  10 minutes without exiting counts as new.
* ``pkg/kubelet/pod_workers.go``: a pod in backoff is synced again after
  ``wait.Jitter(remaining, 0.5)``: up to half the remaining delay later.

So the delays before restarts 1, 2, 3, ... of a container that keeps exiting are 0, 10, 20,
40, 80, 160, 300, 300 s (each up to x1.5 by the pod worker's jitter). A pod that is deleted
and made again (a rollout, a kill of the Pod) is a new key: no backoff.

:func:`restart_delay` is the pure rule; :class:`Supervisor` is the shell: it runs ``replicas``
:class:`Container` s, restarts those that exit and logs each hop it takes ("exited with 1",
"back-off 10 s restarting", "started"), so a failing test can say which hop it waits on.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

LOG = logging.getLogger("standin.supervisor")

#: ``pkg/kubelet/kubelet.go`` (v1.36.3) ``initialCrashLoopBackOff`` and ``MaxCrashLoopBackOff``.
INITIAL_BACKOFF = 10.0
MAX_BACKOFF = 300.0
#: ``pkg/kubelet/pod_workers.go`` ``workerBackOffPeriodJitterFactor``.
WORKER_JITTER = 0.5
#: How often the supervisor looks at its containers (the kubelet's PLEG relists every 1 s).
POLL = 0.1


@dataclass(frozen=True)
class BackOffEntry:
    """The kubelet's backoff entry of one container (``None`` in :func:`restart_delay`: none)."""

    backoff: float
    last_update: float


def restart_delay(
    entry: BackOffEntry | None,
    exited_at: float,
    *,
    initial: float = INITIAL_BACKOFF,
    maximum: float = MAX_BACKOFF,
) -> tuple[float, BackOffEntry]:
    """How long after ``exited_at`` the container is started again (before the pod worker's
    jitter), and the entry after that restart (``Next`` at the restart)."""
    if entry is None or exited_at - entry.last_update > 2 * maximum:
        return 0.0, BackOffEntry(initial, exited_at)
    restart = exited_at + entry.backoff
    return entry.backoff, BackOffEntry(min(entry.backoff * 2, maximum), restart)


def jittered(delay: float, draw: float, factor: float = WORKER_JITTER) -> float:
    """``wait.Jitter(delay, factor)`` for a uniform ``draw`` in [0, 1)."""
    return delay * (1 + factor * draw)


class Container(Protocol):
    """One Metacontroller process as the kubelet sees its container."""

    name: str

    def start(self) -> None: ...

    def exit_code(self) -> int | None:
        """``None`` while it runs."""
        ...

    def stop(self) -> None:
        """SIGTERM (then SIGKILL after the grace period); not restarted."""
        ...

    def kill(self) -> None:
        """SIGKILL: a crash; the supervisor restarts it."""
        ...

    def leading(self) -> bool: ...

    def ready(self) -> bool:
        """Its readiness probe passes (Metacontroller's ``/readyz``: a ping)."""
        ...

    def describe(self) -> str:
        """Where it is (waiting for the lease, leading, exited): for a failing test."""
        ...


@dataclass
class _Slot:
    """One replica (a Pod): its current container and the kubelet's backoff entry."""

    container: Container
    entry: BackOffEntry | None = None
    restart_at: float | None = None
    restarts: int = 0


class Supervisor:
    """Runs ``replicas`` containers made by ``make(replica)``; a container that exits on its
    own is made again (a process restarted with a new identity and empty caches) after
    :func:`restart_delay`. :meth:`replace` is a Pod deleted and made again (a rollout, a Pod
    killed): a new key, no backoff."""

    def __init__(
        self,
        make: Callable[[int], Container],
        replicas: int,
        *,
        initial: float = INITIAL_BACKOFF,
        maximum: float = MAX_BACKOFF,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.make = make
        self.initial, self.maximum, self.draw = initial, maximum, draw
        self._slots = [_Slot(make(index)) for index in range(replicas)]
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: ``(monotonic time, replica, what)``: every hop, in order.
        self.events: list[tuple[float, int, str]] = []

    def _event(self, replica: int, what: str) -> None:
        self.events.append((time.monotonic(), replica, what))
        LOG.info("replica %d: %s", replica, what)

    def start(self) -> Supervisor:
        for index, slot in enumerate(self._slots):
            slot.container.start()
            self._event(index, f"started {slot.container.name}")
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for slot in self._slots:
                slot.container.stop()

    @property
    def containers(self) -> list[Container]:
        with self._lock:
            return [slot.container for slot in self._slots]

    def leader(self) -> int | None:
        """The replica whose container leads now (``None``: none)."""
        for index, container in enumerate(self.containers):
            if container.exit_code() is None and container.leading():
                return index
        return None

    def wait_leader(self, timeout: float, what: str = "a leader") -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.leader()
            if found is not None:
                return found
            time.sleep(POLL)
        raise TimeoutError(
            f"no Metacontroller replica leads ({what}) after {timeout} s: {self.describe()}"
        )

    def kill(self, replica: int) -> None:
        """SIGKILL the replica's process: the kubelet restarts it (its backoff applies)."""
        with self._lock:
            self._slots[replica].container.kill()
        self._event(replica, "killed (SIGKILL)")

    def replace(
        self,
        replica: int,
        *,
        ready: Callable[[Container], bool] | None = None,
        timeout: float = 60.0,
    ) -> None:
        """The replica's Pod deleted (SIGTERM, grace) and made again, as a StatefulSet's
        rolling update does one Pod at a time; returns once the new one is ready."""
        with self._lock:
            slot = self._slots[replica]
            slot.container.stop()
            self._event(replica, f"deleted {slot.container.name}")
            fresh = self.make(replica)
            self._slots[replica] = _Slot(fresh)
            fresh.start()
            self._event(replica, f"started {fresh.name} (new pod)")
        deadline = time.monotonic() + timeout
        while ready is not None and not ready(fresh):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"replica {replica} not ready in {timeout} s: {fresh.describe()}"
                )
            time.sleep(POLL)

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            with self._lock:
                for index, slot in enumerate(self._slots):
                    self._tend(index, slot)

    def _tend(self, index: int, slot: _Slot) -> None:
        now = time.monotonic()
        if slot.restart_at is None:
            code = slot.container.exit_code()
            if code is None:
                return
            delay, slot.entry = restart_delay(
                slot.entry, now, initial=self.initial, maximum=self.maximum
            )
            wait = jittered(delay, self.draw()) if delay else 0.0
            slot.restart_at = now + wait
            self._event(
                index,
                f"{slot.container.name} exited with {code}; "
                + (
                    f"back-off {delay:.0f} s restarting (CrashLoopBackOff, {wait:.1f} s)"
                    if delay
                    else "restarting at once (first exit)"
                ),
            )
            return
        if now < slot.restart_at:
            return
        slot.restart_at = None
        slot.restarts += 1
        slot.container = self.make(index)
        slot.container.start()
        self._event(index, f"restarted as {slot.container.name} (restart {slot.restarts})")

    def describe(self) -> str:
        with self._lock:
            parts = []
            for index, slot in enumerate(self._slots):
                state = slot.container.describe()
                if slot.restart_at is not None:
                    state = (
                        f"waiting in back-off, restart in "
                        f"{max(0.0, slot.restart_at - time.monotonic()):.1f} s"
                    )
                parts.append(f"replica {index}: {state}")
        recent = (
            "; ".join(f"+{at - self.events[0][0]:.1f} s r{r}: {w}" for at, r, w in self.events[-8:])
            if self.events
            else ""
        )
        return " | ".join(parts) + (f" (last hops: {recent})" if recent else "")
