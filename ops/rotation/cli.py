"""The command line of the credential rotation, ``python -m ops.rotation token|tls`` (what
``deploy/rotate-credentials.sh`` runs; why and how: :mod:`ops.rotation`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ops.rotation.bearer_token import rotate_token
from ops.rotation.client_tls import rotate_tls
from ops.rotation.cluster import RotationError, Timing, stamp_now
from ops.rotation.kubectl import KubectlCluster


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rotate-credentials",
        description="Rotate what Metacontroller presents to pg-failover-hook, as a "
        "CompositeController spec change (the only change Metacontroller acts on).",
    )
    parser.add_argument("--context", help="kubectl context (default: the current one)")
    sub = parser.add_subparsers(dest="what", required=True)
    token = sub.add_parser("token", help="a new bearer token (also the first one)")
    token.add_argument("--keep-old", action="store_true", help="do not remove old token keys")
    token.add_argument(
        "--pod-check",
        choices=("exec", "sleep"),
        default="exec",
        help="how to know every hook pod accepts the new token: look for the file with "
        "kubectl exec (default), or wait a fixed --kubelet-delay",
    )
    token.add_argument("--kubelet-delay", type=float, default=Timing.kubelet_delay)
    tls = sub.add_parser("tls", help="pin the current client certificate and CA (deploy/mtls)")
    tls.add_argument("--force", action="store_true", help="even if already current")
    args = parser.parse_args(argv)

    kubectl = ["kubectl"] + (["--context", args.context] if args.context else [])
    cluster = KubectlCluster(kubectl)
    try:
        if args.what == "token":
            report = rotate_token(
                cluster,
                timing=Timing(kubelet_delay=args.kubelet_delay),
                stamp=stamp_now(),
                keep_old=args.keep_old,
                pod_check=args.pod_check,
            )
        else:
            report = rotate_tls(cluster, stamp=stamp_now(), force=args.force)
    except RotationError as error:
        print(f"rotate-credentials: {error}", file=sys.stderr)
        return 1
    for line in report.steps:
        print(line)
    return 0
