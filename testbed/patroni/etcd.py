"""The cluster's one etcd: its command line, its start, and the leader key Patroni keeps in it."""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path

from testbed.patroni import _http
from testbed.patroni._proc import Proc
from testbed.patroni.errors import ClusterError
from testbed.patroni.layout import ETCD_CLIENT_PORT, ETCD_PEER_PORT, NAMESPACE
from testbed.patroni.waiting import poll_until, tail

_NO_FSYNC_CACHE: dict[str, bool] = {}


def url(host: str) -> str:
    """The DCS endpoint Patroni uses."""
    return f"http://{host}:{ETCD_CLIENT_PORT}"


def argv(etcd: Path, host: str, data: Path, token: str) -> list[str]:
    """etcd's command line: one member, listening on ``host`` only, data in ``data``."""
    peer = f"http://{host}:{ETCD_PEER_PORT}"
    args = [
        str(etcd),
        "--name=devcluster",
        f"--data-dir={data}",
        f"--listen-client-urls={url(host)}",
        f"--advertise-client-urls={url(host)}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token={token}",
        "--log-level=warn",
    ]
    if supports_no_fsync(etcd):
        args.append("--unsafe-no-fsync")  # throwaway data; keeps CI disks out of the timings
    return args


def start(
    etcd: Path, host: str, base_dir: Path, log: Path, env: dict[str, str], deadline: float
) -> tuple[subprocess.Popen[bytes], Proc | None]:
    """Start etcd with its data in ``base_dir/etcd``; return once it answers healthy."""
    data = base_dir / "etcd"
    data.mkdir(mode=0o700, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            argv(etcd, host, data, base_dir.name),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "HOME": str(data)},
            cwd=str(data),
            start_new_session=True,
        )
    proc = Proc.of(popen.pid)

    def healthy() -> bool:
        if popen.poll() is not None:
            raise ClusterError(f"etcd exited with {popen.returncode}; {log}:\n{tail(log)}")
        resp = _http.get(host, ETCD_CLIENT_PORT, "/health", timeout=1)
        return resp.status == 200 and resp.json().get("health") == "true"

    poll_until(
        healthy,
        max(1.0, deadline - time.monotonic()),
        interval=0.1,
        what=f"etcd to answer healthy on {url(host)}/health",
        details=lambda: f"{log}:\n{tail(log)}",
    )
    return popen, proc


def leader_key_holder(host: str, scope: str) -> str | None:
    """Who holds the leader lock in etcd (the key outlives a killed leader until its TTL)."""
    key = f"{NAMESPACE}{scope}/leader"
    resp = _http.request(
        "POST",
        host,
        ETCD_CLIENT_PORT,
        "/v3/kv/range",
        {"key": base64.b64encode(key.encode()).decode()},
        timeout=2,
    )
    if resp.status != 200:
        raise ClusterError(f"etcd range request failed: {resp.status} {resp.error}")
    kvs = resp.json().get("kvs") or []
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def supports_no_fsync(etcd: Path) -> bool:
    """Whether this etcd binary has ``--unsafe-no-fsync`` (asked once per binary)."""
    key = str(etcd)
    if key not in _NO_FSYNC_CACHE:
        try:
            out = subprocess.run(
                [key, "--help"], capture_output=True, text=True, timeout=10, check=False
            )
            _NO_FSYNC_CACHE[key] = "--unsafe-no-fsync" in out.stdout + out.stderr
        except (OSError, subprocess.SubprocessError):
            _NO_FSYNC_CACHE[key] = False
    return _NO_FSYNC_CACHE[key]
