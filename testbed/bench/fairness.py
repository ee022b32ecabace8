"""Fairness between tenants: a quiet cluster's syncs beside a noisy namespace, ONE hook pod.

The noisy namespace has clusters of 63 members that accept a connection and never answer
(what a member does while it hangs; what a tenant can arrange on purpose), each synced
again as soon as its last sync ends (the 0.3 s degraded resync of a cluster without a
leader is shorter than its 2 s probe deadline). The quiet cluster has three healthy
members; its Service still selects ``pg-orders-0`` and Patroni has promoted ``pg-orders-1``
(a failover to follow: the leader is not its first member, so its probe goes through the
pool, where the noisy probes queue). It is synced every 0.3 s, as Metacontroller does
while its Service is not on the leader.

Printed side by side, quiet alone and quiet beside the noise: its sync latency
(p50/p99/max), how many of its syncs routed the Service to the new leader (the failover
followed), and how many said the leader did not answer (a probe starved and cut at the
deadline). The hook runs under the production gunicorn config (2 workers × 16 threads).
Compare the code before the per-round bound (run this file from an export of the old
tree) with the code after.

    flock /tmp/pgfh-heavy.lock .venv/bin/python -m testbed.bench.fairness

Loopback only (the fake members are on 127.0.0.40 and up); every loop is bounded by
``--seconds``.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testbed.bench.common import encode, recorded_body
from testbed.fakes.patroni_fast import HUNG, LEADER, REPLICA, fake_members
from testbed.kubernetes.pods import POD_NAME_LABEL
from testbed.metacontroller.gunicorn import gunicorn_hook

QUIET = ["pg-orders-0", "pg-orders-1", "pg-orders-2"]
NOISY_MEMBERS = 63


@dataclass
class Quiet:
    latencies: list[float] = field(default_factory=list)
    routed: int = 0
    leader_silent: int = 0
    other: int = 0


def _post(conn: http.client.HTTPConnection, data: bytes, headers: dict[str, str]) -> bytes:
    conn.request("POST", "/sync", body=data, headers=headers)
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
    return body


def _connection(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)


def noisy_body(host: str, port: int, index: int) -> bytes:
    names = [f"noisy-{index}-{m}" for m in range(NOISY_MEMBERS)]
    body = recorded_body([host] * NOISY_MEMBERS, port, names)
    metadata = body["parent"]["metadata"]
    metadata["namespace"] = "noisy"
    metadata["name"] = f"noisy-{index}"
    metadata["uid"] = f"00000000-0000-4000-8000-{index:012d}"
    body["parent"]["spec"]["switchover"] = {"pollSeconds": 0.3}
    body["parent"]["spec"]["primarySelector"]["cluster-name"] = f"noisy-{index}"
    for pod in body["related"]["Pod.v1"].values():
        pod["metadata"]["namespace"] = "noisy"
        pod["metadata"]["labels"]["cluster-name"] = f"noisy-{index}"
    for service in body["children"]["Service.v1"].values():
        service["metadata"]["namespace"] = "noisy"
        service["spec"]["selector"]["cluster-name"] = f"noisy-{index}"
        service["spec"]["selector"][POD_NAME_LABEL] = names[0]
    return encode(body)


def quiet_run(url: str, headers: dict[str, str], data: bytes, seconds: float) -> Quiet:
    result = Quiet()
    conn = _connection(url)
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        started = time.monotonic()
        reply = json.loads(_post(conn, data, headers))
        result.latencies.append(time.monotonic() - started)
        service = next(c for c in reply["children"] if c["kind"] == "Service")
        members = {m["name"]: m for m in reply["status"]["members"]}
        if service["spec"]["selector"][POD_NAME_LABEL] == "pg-orders-1":
            result.routed += 1
        elif not members["pg-orders-1"]["reachable"]:
            result.leader_silent += 1
        else:
            result.other += 1
        time.sleep(max(0.0, 0.3 - (time.monotonic() - started)))
    conn.close()
    return result


def noise(url: str, headers: dict[str, str], data: bytes, stop: float, count: list[int]) -> None:
    conn = _connection(url)
    while time.monotonic() < stop:
        _post(conn, data, headers)
        count[0] += 1
    conn.close()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    behaviours = [REPLICA, LEADER, REPLICA, HUNG]
    with fake_members(behaviours, names=[*QUIET, "hung"], max_hold=10.0) as members:
        quiet = recorded_body(members.hosts[:3], members.port, QUIET)
        quiet_data = encode(quiet)
        noisy = [noisy_body(members.hosts[3], members.port, i) for i in range(args.noisy)]
        env = {
            "GUNICORN_ACCESS_LOG": "0",
            "PGFH_LOG_LEVEL": "ERROR",
            "PGFH_ALLOWED_PATRONI_PORTS": str(members.port),
        }
        with (
            tempfile.TemporaryDirectory(prefix="pgfh-fairness-") as tmp,
            gunicorn_hook(Path(tmp), env=env, workers=2, threads=16) as hook,
        ):
            headers = {**hook.headers, "Content-Type": "application/json"}
            alone = quiet_run(hook.url, headers, quiet_data, args.seconds)
            stop = time.monotonic() + args.seconds + 3.0
            counts = [[0] for _ in noisy]
            threads = [
                threading.Thread(
                    target=noise, args=(hook.url, headers, data, stop, count), daemon=True
                )
                for data, count in zip(noisy, counts, strict=True)
            ]
            for thread in threads:
                thread.start()
            time.sleep(2.5)  # every noisy sync is in its probe round now
            beside = quiet_run(hook.url, headers, copy.copy(quiet_data), args.seconds)
            for thread in threads:
                thread.join(timeout=args.seconds + 10)
    return {
        "noisy_clusters": args.noisy,
        "noisy_syncs": sum(c[0] for c in counts),
        "alone": alone,
        "beside": beside,
    }


def _row(name: str, quiet: Quiet) -> str:
    ms = sorted(x * 1000 for x in quiet.latencies)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (
        f"{name:<28} {len(ms):>5} {statistics.median(ms):>8.1f} {p99:>8.1f} {ms[-1]:>8.1f} "
        f"{quiet.routed:>7} {quiet.leader_silent:>13} {quiet.other:>6}"
    )


def report(result: dict[str, Any]) -> str:
    head = (
        f"{'quiet cluster (3 members)':<28} {'syncs':>5} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'routed':>7} {'leader silent':>13} {'other':>6}"
    )
    return "\n".join(
        [
            f"noisy namespace: {result['noisy_clusters']} clusters x {NOISY_MEMBERS} hung "
            f"members, synced back to back ({result['noisy_syncs']} noisy syncs answered)",
            head,
            _row("alone", result["alone"]),
            _row("beside the noisy namespace", result["beside"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noisy", type=int, default=16, help="noisy clusters synced at once")
    parser.add_argument("--seconds", type=float, default=8.0, help="each phase")
    args = parser.parse_args()
    print(report(measure(args)))


if __name__ == "__main__":
    main()
