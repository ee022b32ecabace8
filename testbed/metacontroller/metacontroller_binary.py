"""Run a real Metacontroller binary instead of the stand-in, when one is given.

``PGFH_METACONTROLLER_BINARY=/path/to/metacontroller`` makes :mod:`testbed.metacontroller.kube_rig`
(the
end-to-end tests and the demo) start that binary instead of the stand-in
(:mod:`testbed.metacontroller.kube`),
under the same kubeconfig (``KUBECONFIG``; controller-runtime's config loader reads it), with
the arguments of ``deploy/metacontroller-values.yaml`` ``commandArgs``, adjusted only where a
process outside a cluster must differ:

* ``--health-probe-bind-address`` and ``--metrics-address`` on loopback ports of their own
  (the values' ``:8081`` would listen on every interface and collide between runs);
* ``--leader-election-namespace`` given (out of a cluster it has no Pod namespace to default to).

Nothing here builds or fetches Metacontroller: the repository holds none of its code, no
binary and no recipe for one. The binary is stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from testbed.metacontroller.gunicorn import free_port

ENV_BINARY = "PGFH_METACONTROLLER_BINARY"
VALUES = Path(__file__).resolve().parents[2] / "deploy" / "metacontroller-values.yaml"


def command_args(namespace: str, values: Path = VALUES) -> list[str]:
    """The values' ``commandArgs`` for a binary on this machine (pure but for the ports)."""
    args: list[str] = []
    for arg in yaml.safe_load(values.read_text())["commandArgs"]:
        name = str(arg).split("=", 1)[0]
        if name in ("--health-probe-bind-address", "--metrics-address"):
            continue
        args.append(str(arg))
    args.append(f"--health-probe-bind-address=127.0.0.1:{free_port()}")
    args.append(f"--metrics-address=127.0.0.1:{free_port()}")
    if "--leader-election" in args:
        args.append(f"--leader-election-namespace={namespace}")
    return args


@dataclass
class MetacontrollerBinary:
    binary: Path
    kubeconfig: Path
    log_path: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = field(default=None)

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(self.binary), *self.args], stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def stop(self, grace: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def binary_from_env(
    kubeconfig: Path, work_dir: Path, namespace: str
) -> MetacontrollerBinary | None:
    """The binary ``PGFH_METACONTROLLER_BINARY`` names, ready to start (``None``: unset)."""
    path = os.environ.get(ENV_BINARY)
    if not path:
        return None
    binary = Path(path)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise FileNotFoundError(f"{ENV_BINARY}={path} is not an executable file")
    return MetacontrollerBinary(
        binary, kubeconfig, work_dir / "metacontroller.log", command_args(namespace)
    )
