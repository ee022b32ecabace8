"""Probing Patroni's REST API: the only outbound I/O of the hook.

Each member gets one ``GET`` of its health path. All members of a cluster are asked
concurrently, and the whole round has one deadline: a member that accepts the
connection and never answers (Patroni does exactly that for ~2 s while it shuts down)
costs the sync at most the deadline, never more. Nothing here raises: every failure
becomes :meth:`MemberStatus.unknown` (no answer) or :meth:`MemberStatus.not_patroni`
(an answer that is not Patroni's JSON) with a short, stable reason (stable, because it can
end up in a status condition, and a message that changes on every sync would make
Metacontroller write the status again and again).

Modelled on Patroni's own ``fetch_nodes_statuses`` (``patroni/ha.py``): fixed small
timeouts, no retries (the next resync is the retry), a thread pool.

The HTTP client is **requests**, through its transport API (:mod:`hooks.probe.transport`);
what the parsed answer means is :mod:`hooks.probe.answer`'s, pure.

**The deadline is enforced by cutting sockets, not by the timeouts** (a member that
trickles a byte every 0.3 s is never "timed out"): a round probes its first member in the
calling (request) thread and every other one in a pool thread, all at once; at the deadline
every probe still running has its socket shut down (:mod:`hooks.probe.transport`). So a
trickling or hung member holds a thread no longer than the round that asked it.

**Fairness: a bound per round.** A round holds at most ``round_threads`` pool threads at
once (16); each probe that ends starts the next member waiting. So the pool (``threads``,
256 = 16 request threads x 16) always has room for every round in progress, and one
cluster whose 63 members accept and never answer delays only itself: before the bound, 16
such rounds queued 1,008 probes on 256 threads, and every other cluster's probes waited
behind them, were cut at their deadline and reported unreachable (a quiet cluster's
failover was not followed). A healthy 64-member cluster's probes take milliseconds each,
so four waves of 16 cost it nothing noticeable. (The first member in the request thread
saves its hand-off to the pool and back: a one-member round uses no pool thread at all.)

TLS (:mod:`hooks.probe.tls`): one :class:`ssl.SSLContext` per set of files, rebuilt when a
file changes, so a renewed Secret is used without a restart.

The machinery lives in :mod:`hooks.probe`; this module is the round and its public face. It
imports nothing of the shell: :meth:`PatroniProber.from_settings` is handed the settings.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

import requests
import urllib3
from urllib3.util import Url

from hooks.domain.members import MemberStatus, ProbeTarget
from hooks.probe.answer import head_verdict, status_from_body, too_large
from hooks.probe.failures import describe_failure, timed_out
from hooks.probe.policy import ProbePolicy
from hooks.probe.settings import DEFAULT_MAX_BODY_BYTES, DEFAULT_PROBE_DEADLINE, ProberSettings
from hooks.probe.targets import checked_url
from hooks.probe.tls import PatroniTLS, TLSContexts
from hooks.probe.transport import Cutter, InFlight, ProbeAdapter, ProbeFailure, running

log = logging.getLogger(__name__)

#: Most bytes taken per read of the body.
_CHUNK = 16384
#: Most URL verdicts a prober remembers (a few per member of every cluster it probes).
_CHECKED_URLS = 4096
#: How long a round waits, after its deadline, for the probes it cut off to close their
#: sockets (they do within a millisecond once their socket is shut down).
_GRACE = 0.05
#: The request's headers, exactly (a Session's defaults would add Accept-Encoding, and
#: ``Connection: keep-alive`` where Patroni closes every connection anyway).
_HEADERS = {
    "User-Agent": "pg-failover-hook",
    "Accept": "application/json",
    "Connection": "close",
}


class Prober(Protocol):
    """Anything that can ask a set of members; injected into the app (tests use fakes)."""

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target; return one status per target's pod name."""
        ...


# ------------------------------------------------------------------------ the prober

#: Probers of this process: their pools are dropped in a forked child (threads do not
#: survive a fork, and two processes must not share connections).
_probers: weakref.WeakSet[PatroniProber] = weakref.WeakSet()


def _after_fork() -> None:
    for prober in list(_probers):
        prober._forget()


os.register_at_fork(after_in_child=_after_fork)


@dataclass(frozen=True, slots=True)
class _Pools:
    executor: ThreadPoolExecutor
    adapter: ProbeAdapter
    cutter: Cutter


class PatroniProber:
    """Concurrent, bounded probes through :mod:`requests` in a thread pool.

    The defaults are the operator's ``PGFH_*`` defaults (``HookSettings`` uses the same).
    Any number of request threads may call :meth:`probe` at once; the pool, the cutter
    and the adapter are made on first use in the process that uses them (gunicorn forks).

    :param deadline: the bound of one whole round, in seconds.
    :param max_body_bytes: the largest body read from a member (Patroni's is ~1 KiB).
    :param policy: checked again for every target just before connecting (the targets
        were planned under it already: this is the second lock on the same door). Without
        one, only the shape of each target is checked.
    :param tls: CA bundle and client certificate for ``https`` members (see
        :class:`TLSContexts`).
    :param threads: the most pool probes in flight at once in this process. Each holds its
        thread one deadline at most; threads are started only when that many are needed.
        At least ``round_threads`` times the request threads (gunicorn's ``threads``), so
        that no round ever waits for a pool thread.
    :param round_threads: the most pool probes one round has in flight at once; its other
        members wait for one of them to end (see the module docstring, "Fairness").
    """

    def __init__(
        self,
        *,
        deadline: float = DEFAULT_PROBE_DEADLINE,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        policy: ProbePolicy | None = None,
        tls: PatroniTLS | None = None,
        threads: int = 256,
        round_threads: int = 16,
    ):
        self.deadline = deadline
        self.max_body_bytes = max_body_bytes
        self.policy = policy
        self.tls = tls or PatroniTLS()
        self.threads = threads
        self.round_threads = round_threads
        self.contexts = TLSContexts(self.tls)
        self._checked: dict[
            str, tuple[str | None, Url | None, requests.PreparedRequest | None]
        ] = {}
        self._lock = threading.Lock()
        self._pools: _Pools | None = None
        _probers.add(self)

    @classmethod
    def from_settings(cls, settings: ProberSettings) -> PatroniProber:
        """The prober the hook runs with these settings (the app and the benchmarks).

        Unusable TLS files are logged here, once, as well as being every https probe's
        reason (the hook may serve clusters that do not use TLS: it starts anyway).
        """
        prober = cls(
            deadline=settings.probe_deadline,
            max_body_bytes=settings.max_probe_body_bytes,
            policy=settings.probe_policy,
            tls=settings.patroni_tls,
            threads=settings.request_threads * settings.probe_threads_per_round,
            round_threads=settings.probe_threads_per_round,
        )
        if prober.contexts._files():
            problem = prober.contexts.problem()
            if problem is not None:
                log.error("https members cannot be probed: %s", problem)
        return prober

    def close(self) -> None:
        """Stop the pool and drop the connections (tests and shutdown)."""
        with self._lock:
            pools, self._pools = self._pools, None
        if pools is not None:
            pools.executor.shutdown(wait=False, cancel_futures=True)
            pools.cutter.stop()
            pools.adapter.close()

    def _forget(self) -> None:
        # In a forked child: the parent's threads are gone and its lock may be held.
        self._lock = threading.Lock()
        self._pools = None

    def _pools_here(self) -> _Pools:
        pools = self._pools
        if pools is not None:
            return pools
        with self._lock:
            if self._pools is None:
                self._pools = _Pools(
                    ThreadPoolExecutor(self.threads, thread_name_prefix="patroni-probe"),
                    ProbeAdapter(),
                    Cutter(),
                )
            return self._pools

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[str, MemberStatus]:
        """Ask every target concurrently; return within about ``deadline`` seconds."""
        if not targets:
            return {}
        return self._round(targets, time.monotonic() + self.deadline)

    def probe_one(self, target: ProbeTarget, ends_at: float) -> MemberStatus:
        """One bounded GET that gives up at ``ends_at`` (``time.monotonic``); never raises."""
        return self._round([target], ends_at)[target.pod]

    @property
    def _late(self) -> str:
        return f"no answer within the {self.deadline:g} s probe deadline"

    # ------------------------------------------------------------------ the round

    def _round(self, targets: Sequence[ProbeTarget], ends_at: float) -> dict[str, MemberStatus]:
        """Probe ``targets`` until ``ends_at``: the first in this thread, the others in the
        pool, at most ``round_threads`` of them at once (each finished probe starts the next
        one waiting): one cluster's hung members hold no more of the pool than that."""
        first, *rest = targets
        probes = {target.pod: InFlight(target, ends_at) for target in rest}
        waiting = deque(rest)
        futures: dict[str, Future[MemberStatus]] = {}
        lock = threading.Lock()
        closed = [False]

        def start_next() -> None:
            with lock:
                if closed[0] or not waiting:
                    return
                probe = probes[waiting.popleft().pod]
                context = contextvars.copy_context()  # log fields follow the probe's thread
                future = pools.executor.submit(context.run, self._ask, probe)
                futures[probe.target.pod] = future
            future.add_done_callback(lambda _: start_next())

        try:
            pools = self._pools_here()
            for _ in range(min(self.round_threads, len(rest))):
                start_next()
            # The first member in this thread, meanwhile; the cutter ends it at the deadline.
            here = InFlight(first, ends_at)
            pools.cutter.watch(here)
            statuses = {first.pod: self._ask(here)}
            while rest:
                with lock:
                    running = [f for f in futures.values() if not f.done()]
                    if not running and not waiting:
                        break
                left = ends_at - time.monotonic()
                if left <= 0:
                    break
                if running:
                    wait(running, timeout=left, return_when=FIRST_COMPLETED)
                else:  # a probe just ended; its callback is starting the next one
                    time.sleep(min(left, 0.001))
            with lock:
                closed[0] = True
                started = dict(futures)
            late = [(probes[pod], f) for pod, f in started.items() if not f.done()]
            for probe, future in late:
                future.cancel()
                probe.cut()
            if late:
                wait([future for _, future in late], timeout=_GRACE)
            for target in rest:
                begun = started.get(target.pod)
                statuses[target.pod] = (
                    self._result(target.pod, begun)
                    if begun is not None
                    else MemberStatus.unknown(target.pod, self._late)
                )
            return {target.pod: statuses[target.pod] for target in targets}
        except Exception as error:  # a bug or the OS out of resources: no member is known
            with lock:
                closed[0] = True
            for probe in probes.values():
                probe.cut()
            return {
                target.pod: MemberStatus.unknown(target.pod, describe_failure(error, target))
                for target in targets
            }

    def _result(self, pod: str, future: Future[MemberStatus]) -> MemberStatus:
        if future.done() and not future.cancelled() and future.exception() is None:
            return future.result()
        return MemberStatus.unknown(pod, self._late)

    def _ask(self, probe: InFlight) -> MemberStatus:
        """One member's probe, in a pool thread or the round's own; never raises."""
        target = probe.target
        if probe.cut_off:
            return MemberStatus.unknown(target.pod, self._late)
        running.probe = probe
        answered = [False]
        try:
            return self._exchange(probe, answered)
        except Exception as error:
            return MemberStatus.unknown(target.pod, self._reason(error, probe, answered[0]))
        finally:
            running.probe = None
            probe.finish()

    def _reason(self, error: Exception, probe: InFlight, answered: bool) -> str:
        if isinstance(error, ProbeFailure):
            return error.reason
        late = timed_out(error)
        if probe.cut_off or (late and time.monotonic() >= probe.ends_at):
            # Cut off, or a timeout cut to what was left of the round: the round's
            # deadline, one reason for the same member whatever ran out first.
            return self._late
        if late:
            return "read timeout" if probe.connected else "connect timeout"
        return describe_failure(error, probe.target, in_body=answered)

    def _exchange(self, probe: InFlight, answered: list[bool]) -> MemberStatus:
        target = probe.target
        refused, url, request = self._check(target.url)
        if url is None or request is None:
            return MemberStatus.unknown(target.pod, refused or "refused")
        probe.url = url
        if url.scheme == "https":
            probe.context = self.contexts.context()
        remaining = probe.ends_at - time.monotonic()
        if remaining <= 0:
            return MemberStatus.unknown(target.pod, self._late)
        # The adapter only reads the prepared GET: every probe of the URL sends the same one.
        response = self._pools_here().adapter.send(
            request,
            stream=True,
            timeout=(min(target.connect_timeout, remaining), min(target.read_timeout, remaining)),
        )
        try:
            answered[0] = True
            return self._read(probe, response)
        finally:
            # One request per connection, as Patroni does: nothing half-read is kept.
            response.close()

    def _read(self, probe: InFlight, response: requests.Response) -> MemberStatus:
        target, cap, code = probe.target, self.max_body_bytes, response.status_code
        raw: urllib3.HTTPResponse = response.raw
        verdict = head_verdict(
            target,
            code,
            content_lengths=raw.headers.getlist("Content-Length"),
            transfer_coded="Transfer-Encoding" in raw.headers,
            cap=cap,
        )
        if verdict is not None:
            return verdict
        body = bytearray()
        # read1: whatever has arrived, after one socket read at most (a full-size read
        # loops until it has its whole size); the deadline is checked between reads, and
        # a read that blocks past it is ended by the round's cut.
        while chunk := raw.read1(_CHUNK):
            body += chunk
            if len(body) > cap:
                return too_large(target, code, cap)
            if time.monotonic() >= probe.ends_at:
                return MemberStatus.unknown(target.pod, self._late)
        if probe.cut_off:
            return MemberStatus.unknown(target.pod, self._late)
        return status_from_body(target, code, bytes(body))

    def _check(self, url: str) -> tuple[str | None, Url | None, requests.PreparedRequest | None]:
        # The same members are probed every second: remember each URL's verdict (the
        # policy is fixed for this prober; the check is pure) and its prepared GET
        # (preparing one is a fifth of a probe's CPU).
        checked = self._checked.get(url)
        if checked is None:
            refused, parsed = checked_url(url, self.policy)
            request = None
            if parsed is not None:
                request = requests.Request("GET", url, headers=_HEADERS).prepare()
            checked = (refused, parsed, request)
            if len(self._checked) >= _CHECKED_URLS:
                self._checked.clear()
            self._checked[url] = checked
        return checked
