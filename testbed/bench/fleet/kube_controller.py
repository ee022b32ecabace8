"""The fleet on the real control plane: Metacontroller for the run, and its counters.

A real binary when ``PGFH_METACONTROLLER_BINARY`` names one, else the stand-in in a process of
its own (so that its CPU is its own); the counters at each end of the measured window (CPU,
the hook's syncs, the work queue), RSS, and a pprof CPU profile of the binary. Used by
:mod:`testbed.bench.fleet.on_kube`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.synchronize
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.bench.fleet.kube_figures import workqueue_figures


def _standin_main(kubeconfig: str, stop: multiprocessing.synchronize.Event) -> None:
    """The stand-in in a process of its own (its CPU then is its own)."""
    from testbed.metacontroller.kube import KubeMetacontroller

    controller = KubeMetacontroller(Path(kubeconfig))
    controller.start(sync_timeout=120)
    try:
        stop.wait(7200)
    finally:
        controller.stop()


@dataclass
class Controller:
    """Metacontroller as this run has it: a binary or the stand-in's process."""

    pid: int
    stop: Callable[[], None]
    metrics_url: str | None = None
    pprof_url: str | None = None
    binary: Path | None = None
    log: Path | None = None


@contextlib.contextmanager
def metacontroller(
    kubeconfig: Path, work_dir: Path, system_ns: str, pprof: bool, workers: int | None = None
) -> Iterator[Controller]:
    """Metacontroller for the run; ``workers``: the binary's ``--workers`` instead of the
    shipped values' (per CompositeController: K controllers run K times as many)."""
    from testbed.metacontroller.gunicorn import free_port
    from testbed.metacontroller.metacontroller_binary import binary_from_env

    binary = binary_from_env(kubeconfig, work_dir, system_ns)
    if binary is not None:
        if workers is not None:
            binary.args = [a for a in binary.args if not a.startswith("--workers=")]
            binary.args.append(f"--workers={workers}")
        pprof_url = None
        if pprof:
            address = f"127.0.0.1:{free_port()}"
            binary.args.append(f"--pprof-address={address}")
            pprof_url = f"http://{address}/debug/pprof/profile"
        binary.start()
        assert binary.process is not None
        (address,) = [a.split("=", 1)[1] for a in binary.args if a.startswith("--metrics-address=")]
        try:
            yield Controller(
                binary.process.pid,
                binary.stop,
                f"http://{address}/metrics",
                pprof_url,
                binary.binary,
                binary.log_path,
            )
        finally:
            binary.stop()
        return
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    process = context.Process(
        target=_standin_main, args=(str(kubeconfig), stop), name="standin", daemon=True
    )
    process.start()
    assert process.pid is not None

    def stop_it() -> None:
        stop.set()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(5)

    try:
        yield Controller(process.pid, stop_it)
    finally:
        stop_it()


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_cpu(pid: int) -> float:
    from testbed.bench.common import children, cpu_seconds

    return sum(cpu_seconds(p) for p in [pid, *children(pid)])


@dataclass
class Window:
    """Counters at the start of the measured window."""

    at: float
    mc_cpu: float
    hook_cpu: float
    own_cpu: float
    syncs: float
    queue: dict[str, float]


def hook_syncs(url: str) -> float:
    """Sync and finalize calls the hook answered (its ``pgfh_sync_duration_seconds_count``):
    the same on the stand-in and on a binary."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pgfh_sync_duration_seconds_count"
    )


def scrape(url: str | None) -> dict[str, float]:
    import requests

    if url is None:
        return {}
    try:
        return workqueue_figures(requests.get(url, timeout=10).text)
    except requests.RequestException:
        return {}


def window(controller: Controller, hook_pid: int, hook_url: str) -> Window:
    from testbed.bench.common import cpu_seconds

    return Window(
        time.monotonic(),
        cpu_seconds(controller.pid),
        tree_cpu(hook_pid),
        cpu_seconds(os.getpid()),
        hook_syncs(hook_url),
        scrape(controller.metrics_url),
    )


def profile(controller: Controller, seconds: int, out: Path, result: list[str]) -> None:
    """Fetch the binary's CPU profile of ``seconds`` to ``out``; its top functions into
    ``result``."""
    import requests

    assert controller.pprof_url is not None
    try:
        answer = requests.get(f"{controller.pprof_url}?seconds={seconds}", timeout=seconds + 30)
        answer.raise_for_status()
        out.write_bytes(answer.content)
    except requests.RequestException as error:
        result.append(f"pprof failed: {error}")
        return
    go = shutil.which("go") or "/usr/local/go/bin/go"
    for flags in (["-top", "-nodecount=25"], ["-top", "-cum", "-nodecount=400"]):
        top = subprocess.run(
            [go, "tool", "pprof", *flags, str(controller.binary), str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        result.append(top.stdout or top.stderr)
