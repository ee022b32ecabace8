"""``python -m testbed.kubernetes build``: build the binaries into the per-machine cache (what
``make test`` runs before pytest, so no test waits on a build);
``python -m testbed.kubernetes helm``: build the pinned helm (the chart's tests) into the same
cache;
``python -m testbed.kubernetes run``: start a control plane by hand and print how to use it."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from testbed.kubernetes.binaries import ensure_binaries, ensure_helm
from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.servers import start_control_plane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.kubernetes")
    parser.add_argument("command", choices=("build", "helm", "run"))
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            binaries = ensure_binaries()
            how = f"built in {binaries.build_seconds:.0f} s" if binaries.built_now else "cached"
            print(f"control plane binaries {how}: {binaries.bin_dir}")
            return 0
        if args.command == "helm":
            print(f"helm: {ensure_helm()}")
            return 0
        plane = start_control_plane()
    except ControlPlaneError as error:
        print(f"control plane: {error}", file=sys.stderr)
        return 1
    print(f"control plane up in {plane.started_seconds:.1f} s at {plane.server_url}")
    print(f"export KUBECONFIG={plane.admin_kubeconfig}")
    print(f"export PATH={plane.binaries.bin_dir}:$PATH   # the pinned kubectl")
    print("Ctrl-C stops it")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
