"""A real Prometheus for the tests (Debian's ``prometheus`` package, as promtool): an
ephemeral loopback port, its own temporary storage, 1 s scrapes and rule evaluations, stopped
with the context. Shared by the failover alert test and the monitoring kit's test on the real
control plane."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from testbed.metacontroller.gunicorn import free_port, stop

HINT = "prometheus is missing: apt-get install -y prometheus (Debian; .ci/run installs it)"


@dataclass
class Prometheus:
    """A running Prometheus: its API base URL and log file."""

    url: str
    log_path: Path

    def get(self, path: str, **params: Any) -> Any:
        response = requests.get(f"{self.url}{path}", params=params, timeout=5)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name]

    def wait(self, what: str, check: Any, timeout: float) -> Any:
        """Poll ``check()`` until it returns something truthy (bounded in time)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = check()
            except requests.RequestException:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise TimeoutError(f"Prometheus: no {what} within {timeout} s\n{tail}")
            time.sleep(0.2)


@contextlib.contextmanager
def running_prometheus(
    directory: Path,
    targets: Mapping[str, str],
    rules: Path,
    *,
    labels: Mapping[str, str] | None = None,
) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` (job name → ``host:port``) and evaluating ``rules``."""
    binary = shutil.which("prometheus")
    assert binary, HINT
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [target], "labels": dict(labels or {})}],
            }
            for job, target in targets.items()
        ],
    }
    config_path = directory / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=directory,
            start_new_session=True,  # its own process group: stop() kills only it
        )
    running = Prometheus(f"http://127.0.0.1:{port}", log_path)
    try:
        running.wait("readiness", lambda: requests.get(f"{running.url}/-/ready", timeout=1).ok, 30)
        yield running
    finally:
        stop(process, timeout=10)
