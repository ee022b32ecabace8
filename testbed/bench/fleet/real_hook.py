"""The fleet through real hook pods: gunicorn under the production config, the recorded request
bodies with each cluster's fake members (``testbed/fakes/patroni_fast.py``), in real time; and the
calibration that measures the real hook's sync latency and CPU for the modelled rows."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from testbed.bench.fleet.model import Cluster, Fleet, Reply, Result, _result
from testbed.bench.fleet.settings import Metacontroller, Policy, Row


class RealHook:
    """Syncs through real hook pods over HTTP, in threads (as Metacontroller's workers
    block on their call), with the stand-in applying each reply to the cluster's world."""

    def __init__(
        self, fleet: Fleet, urls: Sequence[str], headers: Sequence[dict[str, str]]
    ) -> None:
        import requests

        self.fleet = fleet
        self.urls = list(urls)
        self.headers = [{**h, "Content-Type": "application/json"} for h in headers]
        self.pool = ThreadPoolExecutor(max_workers=fleet.row.mc.workers * fleet.row.mc.shards)
        self.local = threading.local()
        self.latencies: list[float] = []
        self.requests = requests
        self.counter = 0
        self.errors: dict[str, int] = {}

    def _post(self, pod: int, body: bytes) -> tuple[int, bytes, float]:
        session = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = self.requests.Session()
        started = time.monotonic()
        response = session.post(
            self.urls[pod] + "/sync", data=body, headers=self.headers[pod], timeout=5
        )
        return response.status_code, response.content, time.monotonic() - started

    async def settle(self, cluster: Cluster) -> None:
        """Sync ``cluster`` until a reply changes nothing (before the clock starts)."""
        from testbed.bench.common import encode
        from testbed.metacontroller.apply import apply_reply, check_reply

        for _ in range(4):
            status, data, _ = await self.fleet.loop.run_in_executor(
                self.pool,
                self._post,
                cluster.index % len(self.urls),
                encode(cluster.world.sync_request()),
            )
            applied = apply_reply(cluster.world, check_reply(status, data))
            if not (applied.status_changed or applied.changed_children):
                return
        raise RuntimeError(f"cluster {cluster.index}: the hook's replies did not converge")

    async def call(self, cluster: Cluster) -> Reply | None:
        from testbed.bench.common import SERVICE, encode
        from testbed.kubernetes.pods import POD_NAME_LABEL
        from testbed.metacontroller.apply import HookError, apply_reply, check_reply

        if cluster.body is None:
            cluster.body = encode(cluster.world.sync_request())
        self.counter += 1
        pod = self.counter % len(self.urls)
        try:
            status, data, took = await self.fleet.loop.run_in_executor(
                self.pool, self._post, pod, cluster.body
            )
            reply = check_reply(status, data)
        except (HookError, self.requests.RequestException) as error:
            self.errors[type(error).__name__ + ": " + str(error)[:160]] = (
                self.errors.get(type(error).__name__ + ": " + str(error)[:160], 0) + 1
            )
            return None
        self.latencies.append(took)
        applied = apply_reply(cluster.world, reply)
        if applied.status_changed or applied.changed_children:
            cluster.body = None
        selector = cluster.world.services[SERVICE]["spec"]["selector"]
        selected = int(selector[POD_NAME_LABEL].rsplit("-", 1)[1])
        reason = "LeaderFound" if reply["status"].get("primary") else "NoLeader"
        degraded = float(reply.get("resyncAfterSeconds") or 0) < 1.0
        policy = self.fleet.row.policy
        if policy.from_reply:
            resync = float(reply.get("resyncAfterSeconds") or 0) or None
        else:
            resync = policy.degraded if degraded else self.fleet.healthy_resync(cluster)
        return Reply(
            selected,
            (selected, reason),
            degraded,
            resync,
            bool(applied.updated),
            applied.status_changed,
        )


def _cluster_world(index: int, port: int, members: int, polled: bool) -> Any:
    """The stand-in's objects for one fleet cluster: the recorded request with this
    cluster's member addresses, already steady (Service on member 0, status written)."""
    from testbed.bench.common import recorded_body
    from testbed.fakes.patroni_fast import fleet_host
    from testbed.metacontroller.apply import World

    names = [f"pg-orders-{m}" for m in range(members)]
    body = recorded_body([fleet_host(index, m) for m in range(members)], port, names)
    body["parent"]["metadata"]["name"] = f"pg-{index:05d}"
    if polled:  # an etcd cluster: no role label, no status annotation on its Pods
        for pod in body["related"]["Pod.v1"].values():
            pod["metadata"].get("labels", {}).pop("role", None)
            pod["metadata"].get("annotations", {}).pop("status", None)
    return World(
        parent=body["parent"],
        services=body["children"]["Service.v1"],
        pods=body["related"]["Pod.v1"],
    )


@contextmanager
def real_hook_pods(pods: int) -> Iterator[tuple[list[str], list[dict[str, str]], list[int]]]:
    """``pods`` hook pods under the production gunicorn config: URLs, auth, master PIDs."""
    from testbed.metacontroller.gunicorn import gunicorn_hook

    env = {"PGFH_ALLOWED_PATRONI_PORTS": "1024-65535", "PGFH_LOG_LEVEL": "WARNING"}
    with ExitStack() as stack:
        hooks = []
        for _ in range(pods):
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-")))
            hooks.append(stack.enter_context(gunicorn_hook(workdir, env=env, threads=16)))
        yield [h.url for h in hooks], [h.headers for h in hooks], [h.process.pid for h in hooks]


def _pods_cpu(masters: Sequence[int]) -> float:
    from testbed.bench.common import children, cpu_seconds

    return sum(cpu_seconds(p) for m in masters for p in (m, *children(m)))


def run_real(row: Row) -> tuple[Result, list[float]]:
    """One row in real time through real hook pods and a fake fleet; also returns the
    sync latencies seen (the service time the modelled rows use)."""
    from testbed.fakes.patroni_fast import fleet_members

    with (
        fleet_members(row.n, row.mix.members, lifetime=row.duration + 120) as members,
        real_hook_pods(row.hook_pods) as (urls, headers, masters),
    ):

        async def main() -> tuple[Result, list[float]]:
            fleet = Fleet(row)
            fleet.members = members
            for cluster in fleet.clusters:
                cluster.world = _cluster_world(
                    cluster.index, members.ports[cluster.index], row.mix.members, cluster.polled
                )
            hook = RealHook(fleet, urls, headers)
            fleet.hook = hook
            # Start steady, as the model does: the Service on member 0 and the hook's own
            # status written (each cluster synced until its reply changes nothing).
            await asyncio.gather(*(hook.settle(c) for c in fleet.clusters))
            cpu_start = driver_start = 0.0

            def start_cpu() -> None:
                nonlocal cpu_start, driver_start
                cpu_start = _pods_cpu(masters)
                driver_start = time.process_time()

            fleet.loop.call_later(row.warmup, start_cpu)
            try:
                await fleet.run()
            finally:
                hook.pool.shutdown(wait=True)
            cpu = (_pods_cpu(masters) - cpu_start) / max(1, fleet.counters.syncs)
            driver = (time.process_time() - driver_start) / max(1, fleet.counters.syncs)
            print(
                f"  CPU per sync: hook pods {cpu * 1000:.1f} ms, this driver (queue model, "
                f"requests, stand-in) {driver * 1000:.1f} ms",
                flush=True,
            )
            if hook.errors:
                print(f"  hook errors: {hook.errors}", file=sys.stderr)
            return _result(fleet, "real", cpu), hook.latencies

        return asyncio.run(main())


def calibrate(
    pods: int = 1, clusters: int = 20, seconds: float = 12.0
) -> tuple[list[float], float]:
    """The real hook's sync latencies and CPU per sync, on a small real fleet, steady,
    at a moderate rate (40 syncs/s): the service time, without queueing in the pod (the
    model adds that itself, from the pods' cores)."""
    row = Row(
        "calibration",
        clusters,
        Metacontroller(workers=4, qps=1000, burst=1000, resync_period=None),
        Policy(poll=0.5, from_reply=False),
        hook_pods=pods,
        duration=seconds,
        warmup=2.0,
        switchovers=0,
    )
    result, latencies = run_real(row)
    return latencies[len(latencies) // 10 :], result.hook_cpu_per_sync
