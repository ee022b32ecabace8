"""Probing Patroni's REST API: the only outbound I/O of the hook.

Each member gets one ``GET`` of its health path. All members of a cluster are asked
concurrently, and the whole round has one deadline: a member that accepts the
connection and never answers (Patroni does exactly that for ~2 s while it shuts down)
costs the sync at most the deadline, never more. Nothing here raises: every failure
becomes :meth:`MemberStatus.unknown` with a short, stable reason (stable, because it can
end up in a status condition, and a message that changes on every sync would make
Metacontroller write the status again and again).

Modelled on Patroni's own ``fetch_nodes_statuses`` (``patroni/ha.py``): fixed small
timeouts, no retries (the next resync is the retry), a shared thread pool.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Protocol

import requests
import urllib3

from hooks.members import MemberStatus, ProbeTarget

_CHUNK = 8192
_TIMEOUTS = frozenset({"connect timeout", "read timeout"})


class Prober(Protocol):
    """Anything that can ask a set of members; injected into the app (tests use fakes)."""

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target; return one status per target's pod name."""
        ...


class _NoRedirectSession(requests.Session):
    """A Session that never looks at ``Location``.

    Even with ``allow_redirects=False``, requests prepares ``Response.next`` for a 3xx
    answer, and to do so it reads the whole body (``Response.content``: no cap, no
    deadline) before it raises ``TooManyRedirects`` (``max_redirects = 0``). With no
    redirect target, a 3xx is an ordinary answer whose body we read, capped.
    """

    def get_redirect_target(self, resp: requests.Response) -> str | None:
        return None


class PatroniProber:
    """Concurrent, bounded probes with :mod:`requests`.

    :param deadline: the bound of one whole round, in seconds.
    :param max_body_bytes: the largest body read from a member (Patroni's is ~1 KiB).
    :param threads: size of the process-wide pool shared by all concurrent syncs.
    """

    def __init__(self, *, deadline: float = 2.0, max_body_bytes: int = 65536, threads: int = 64):
        self.deadline = deadline
        self.max_body_bytes = max_body_bytes
        self.threads = threads
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid: int | None = None
        self._local = threading.local()

    # The pool is created on first use in the process that uses it: gunicorn forks
    # workers, and threads do not survive a fork.
    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(
                    max_workers=self.threads, thread_name_prefix="patroni-probe"
                )
                self._executor_pid = os.getpid()
            return self._executor

    def close(self) -> None:
        """Stop the pool (tests and graceful shutdown)."""
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = _NoRedirectSession()
            # No proxies, .netrc or CA overrides from the environment: probes go
            # straight to the pod IP, and nothing but our settings shapes them.
            session.trust_env = False
            session.max_redirects = 0
            self._local.session = session
        return session

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target concurrently; return within about ``deadline`` seconds."""
        if not targets:
            return {}
        ends_at = time.monotonic() + self.deadline
        pool = self._pool()
        futures: dict[str, Future[MemberStatus]] = {}
        for target in targets:
            context = contextvars.copy_context()  # log fields follow the probe's thread
            futures[target.pod] = pool.submit(context.run, self.probe_one, target, ends_at)
        wait(futures.values(), timeout=max(0.0, ends_at - time.monotonic()))
        results: dict[str, MemberStatus] = {}
        for pod, future in futures.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                results[pod] = future.result()
            else:
                future.cancel()
                results[pod] = MemberStatus.unknown(pod, self._late)
        return results

    @property
    def _late(self) -> str:
        return f"no answer within the {self.deadline:g} s probe deadline"

    def probe_one(self, target: ProbeTarget, ends_at: float) -> MemberStatus:
        """One bounded GET; never raises."""
        try:
            return self._probe_one(target, ends_at)
        except Exception as error:
            reason = _describe(error)
            if reason in _TIMEOUTS and time.monotonic() >= ends_at:
                # The timeout was cut to what was left of the round: say what probe()
                # says about the same member, or the reason would depend on which
                # thread noticed first.
                reason = self._late
            return MemberStatus.unknown(target.pod, reason)

    def _probe_one(self, target: ProbeTarget, ends_at: float) -> MemberStatus:
        remaining = ends_at - time.monotonic()
        if remaining <= 0:
            return MemberStatus.unknown(target.pod, self._late)
        timeout = (min(target.connect_timeout, remaining), min(target.read_timeout, remaining))
        with self._session().get(
            target.url,
            timeout=timeout,
            allow_redirects=False,
            stream=True,
            headers={"Accept": "application/json", "User-Agent": "pg-failover-hook"},
        ) as response:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                return MemberStatus.unknown(
                    target.pod, f"body larger than {self.max_body_bytes} bytes"
                )
            body = bytearray()
            # read1: whatever has arrived, after one socket read at most. A full-size
            # read (iter_content) loops until it has a whole chunk, so a member that
            # drips a byte at a time would hold this thread far past the deadline.
            while chunk := response.raw.read1(_CHUNK, decode_content=True):
                body += chunk
                if len(body) > self.max_body_bytes:
                    return MemberStatus.unknown(
                        target.pod, f"body larger than {self.max_body_bytes} bytes"
                    )
                if time.monotonic() > ends_at:
                    return MemberStatus.unknown(target.pod, self._late)
            status_code = response.status_code
        try:
            document = json.loads(body)
        except ValueError:
            return MemberStatus.unknown(
                target.pod, f"HTTP {status_code} on {target.health_path} with a non-JSON body"
            )
        return MemberStatus.from_api_response(
            target.pod,
            status_code,
            document,
            health_path=target.health_path,
            leader_roles=target.leader_roles,
        )


def _describe(error: BaseException) -> str:
    """A short reason that is the same every time the same failure happens.

    requests' messages embed object addresses (``<HTTPConnection object at 0x7f…>``),
    which would make every status write differ; walk the cause chain instead.
    """
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return "connect timeout"
    if isinstance(error, requests.exceptions.ReadTimeout):
        return "read timeout"
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, ConnectionResetError):
            return "connection reset"
        if isinstance(current, TimeoutError):
            return "read timeout"
        for arg in getattr(current, "args", ()):
            if isinstance(arg, BaseException) and id(arg) not in seen:
                current = arg
                break
        else:
            current = current.__cause__ or current.__context__
    # The body is read from urllib3 directly, so its errors arrive unwrapped.
    if isinstance(
        error, requests.exceptions.ChunkedEncodingError | urllib3.exceptions.ProtocolError
    ):
        return "connection broken mid-body"
    if isinstance(error, requests.exceptions.ConnectionError):
        return "connection failed"
    return f"probe failed ({type(error).__name__})"
