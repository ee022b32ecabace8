"""Shared pieces of the benchmarks: realistic request bodies, reply checks, /proc accounting.

The request bodies are the recorded Metacontroller v4.17.2 requests in
``tests/fixtures/metacontroller/`` with only the Pods' IPs and the spec's Patroni port
pointed at the members under test (more members are clones of ``pg-orders-2``). A
*steady* body is the request Metacontroller sends once it has applied a reply: the
Service already selects the leader and the status is the one the hook wrote, as in the
normal life of a cluster (a sync every ``resyncAfterSeconds`` that changes nothing).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from testbed.kubernetes.pods import POD_NAME_LABEL
from testbed.metacontroller.apply import HookError, World, apply_reply, check_reply
from testbed.metacontroller.gunicorn import credentials_for

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "metacontroller"
BASE = "sync-service-selects-old-leader.json"
NAMESPACE = "databases"
SERVICE = "pg-orders-primary"


def fixture(name: str = BASE) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return result


def recorded_body(hosts: Sequence[str], port: int, names: Sequence[str]) -> dict[str, Any]:
    """The recorded request with one Pod per member, each pointing at its member's address."""
    body = fixture()
    recorded = body["related"]["Pod.v1"]
    pods: dict[str, Any] = {}
    for index, (name, host) in enumerate(zip(names, hosts, strict=True)):
        pod = copy.deepcopy(recorded.get(name) or recorded["pg-orders-2"])
        metadata = pod["metadata"]
        metadata["name"] = name
        metadata["uid"] = f"{metadata['uid'][:-4]}{index:04d}"
        metadata["labels"][POD_NAME_LABEL] = name
        metadata["labels"]["apps.kubernetes.io/pod-index"] = str(index)
        pod["status"]["podIP"] = host
        pod["status"]["podIPs"] = [{"ip": host}]
        pods[name] = pod
    body["related"]["Pod.v1"] = pods
    body["parent"]["spec"]["patroni"] = {"port": port}
    return body


def steady_body(
    hook_url: str, first: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """The request after Metacontroller applied the hook's reply to ``first``.

    Authenticated like Metacontroller (the rig hook's bearer token, or ``headers``).
    """
    world = World(
        parent=copy.deepcopy(first["parent"]),
        services=copy.deepcopy(first["children"]["Service.v1"]),
        pods=copy.deepcopy(first["related"]["Pod.v1"]),
    )
    for _ in range(3):  # the status write and the Service update each bring one more sync
        response = requests.post(
            f"{hook_url}/sync",
            json=world.sync_request(),
            timeout=10,
            headers=credentials_for(hook_url) if headers is None else headers,
        )
        applied = apply_reply(world, check_reply(response.status_code, response.content))
        if not (applied.status_changed or applied.created or applied.updated or applied.deleted):
            break
    else:
        raise RuntimeError("the hook's replies did not converge in 3 syncs")
    return world.sync_request(controller=first["controller"])


def encode(body: dict[str, Any]) -> bytes:
    """Compact JSON, as Metacontroller (Go's json.Marshal) sends it."""
    return json.dumps(body, separators=(",", ":")).encode()


def check_sync_reply(status: int, data: bytes, leader: str) -> str | None:
    """None if a reply is what Metacontroller may apply safely with ``leader`` as primary.

    Strict parsing (only status, children, resyncAfterSeconds, finalized), the observed
    Service kept (name, v1, Service, the parent's namespace or none, no clusterIP), and
    its selector pinned on ``leader``.
    """
    try:
        reply = check_reply(status, data)
    except HookError as error:
        return f"rejected by Metacontroller: {error}"
    services = [
        c for c in reply.get("children") or [] if (c.get("metadata") or {}).get("name") == SERVICE
    ]
    if len(services) != 1:
        return f"Service {SERVICE} missing or repeated in {len(services)} children"
    (service,) = services
    if service.get("apiVersion") != "v1" or service.get("kind") != "Service":
        return f"Service has apiVersion/kind {service.get('apiVersion')}/{service.get('kind')}"
    if service["metadata"].get("namespace", NAMESPACE) != NAMESPACE:
        return f"Service moved to namespace {service['metadata'].get('namespace')}"
    spec = service.get("spec") or {}
    if "clusterIP" in spec or "clusterIPs" in spec:
        return "reply sets clusterIP"
    selected = (spec.get("selector") or {}).get(POD_NAME_LABEL)
    if selected != leader:
        return f"Service selects {selected!r}, not the leader {leader!r}"
    if (reply.get("status") or {}).get("primary") != leader:
        return f"status.primary is {(reply.get('status') or {}).get('primary')!r}"
    return None


# ---------------------------------------------------------------------- /proc


def children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (gunicorn's workers, for its master)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return sorted(found)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (0.0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of a process in KiB; PSS shares each shared page among its users."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Rss":
                    rss = int(rest.split()[0])
                elif key == "Pss":
                    pss = int(rest.split()[0])
    except OSError:
        pass
    return rss, pss


def pod_memory(master: int) -> dict[str, int]:
    """Memory of one hook pod: gunicorn's master plus its workers, summed (KiB)."""
    pids = [master, *children(master)]
    rss = pss = 0
    for pid in pids:
        r, p = memory_kib(pid)
        rss += r
        pss += p
    return {"processes": len(pids), "rss_kib": rss, "pss_kib": pss}
