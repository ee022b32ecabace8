"""The ``kubectl-pgfh`` command line: ``status``, ``check`` and ``adopt``.

Exit codes: 0 all good; 1 ``check`` found a problem (one plain reason per failed check), or
``adopt`` refused (one plain reason); 2 the command could not run (usage, no kubeconfig, API
server unreachable, credentials refused, no permission, CRD not installed, unknown cluster
name), with one ``error:`` line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TextIO

from hooks.domain.members import MemberStatus
from hooks.domain.model import ClusterSpec, field_default
from pgfh_plugin import adoption, checks, render, report
from pgfh_plugin.checks import Check
from pgfh_plugin.kube import Kube, KubeError, connect
from pgfh_plugin.style import Style, use_colour

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", nargs="?", metavar="NAME", help="one PostgreSQLCluster")
    common.add_argument(
        "-n", "--namespace", help="namespace (default: the kubeconfig context's namespace)"
    )
    common.add_argument(
        "-A", "--all-namespaces", action="store_true", help="PostgreSQLClusters of every namespace"
    )
    common.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    common.add_argument("--context", help="kubeconfig context (default: the current one)")
    common.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up on an API request after this long (default 10)",
    )
    common.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour: auto (on a terminal, unless NO_COLOR is set), always, never",
    )
    common.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="output format"
    )

    parser = argparse.ArgumentParser(
        prog="kubectl pgfh",
        description="Show and check pg-failover-hook's PostgreSQLClusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = sub.add_parser(
        "status",
        parents=[common],
        help="primary, members, conditions, read-only endpoints, last backup",
        description="Show each PostgreSQLCluster's primary, members (role, state, timeline, "
        "lag, reachable), conditions, read-only endpoints and last backup.",
    )
    status.add_argument(
        "--lag",
        action="store_true",
        help="also ask each member's Patroni (GET /patroni through the API server's pod proxy; "
        "needs get on pods/proxy) for its replay lag",
    )
    check = sub.add_parser(
        "check",
        parents=[common],
        help="verify routing, the CompositeController, the token Secret, leader election",
        description="Verify what an operator would check by hand; exit 1 if anything is wrong.",
    )
    check.add_argument(
        "--metacontroller-namespace",
        default="metacontroller",
        help="namespace Metacontroller runs in (default: metacontroller)",
    )
    adopt = sub.add_parser(
        "adopt",
        parents=[common],
        help="hand the existing Service spec.serviceRef names over to its PostgreSQLCluster",
        description="Label the Service spec.serviceRef names so that Metacontroller adopts it "
        "(ServiceNotOwned); the hook pins its selector from the next sync. Needs get on "
        "postgresqlclusters and get, patch on services. Refuses a Service another controller "
        "controls unless --force.",
    )
    adopt.add_argument(
        "--force",
        action="store_true",
        help="also remove another controller's reference (stop that controller first), or "
        "adopt a Service without a selector",
    )
    adopt.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="then wait up to this long for the selector to be pinned, and say how long it took",
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run one command; returns the exit code (the console script exits with it)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    env = os.environ if environ is None else environ
    args = _parser().parse_args(argv)
    style = Style(use_colour(args.color, out, env))
    err_style = Style(use_colour(args.color, err, env))
    if args.name and args.all_namespaces:
        err.write(f"{err_style.bad('error:')} a NAME cannot be combined with -A\n")
        return EXIT_ERROR
    if args.command == "adopt" and not args.name:
        err.write(f"{err_style.bad('error:')} adopt needs the NAME of one PostgreSQLCluster\n")
        return EXIT_ERROR
    if args.command == "adopt" and not 0 <= args.wait <= 600:
        err.write(f"{err_style.bad('error:')} --wait must be between 0 and 600 seconds\n")
        return EXIT_ERROR
    if args.request_timeout <= 0:
        err.write(f"{err_style.bad('error:')} --request-timeout must be positive\n")
        return EXIT_ERROR
    try:
        connection = connect(args.kubeconfig, args.context)
    except KubeError as exc:
        err.write(f"{err_style.bad('error:')} {exc.message}\n")
        return EXIT_ERROR
    try:
        kube = Kube(connection, args.request_timeout)
        namespace = None if args.all_namespaces else (args.namespace or kube.namespace)
        clusters = sorted(
            kube.clusters(namespace, args.name),
            key=lambda c: (c["metadata"].get("namespace", ""), c["metadata"].get("name", "")),
        )
        if args.command == "adopt":
            return _adopt(kube, clusters, args, style, out, err_style, err)
        if args.command == "status":
            return _status(kube, clusters, namespace, args, style, out, err)
        return _check(kube, clusters, namespace, args, style, out, err)
    except KubeError as exc:
        err.write(f"{err_style.bad('error:')} {exc.message}\n")
        return EXIT_ERROR
    finally:
        connection.api_client.close()


def _status(
    kube: Kube,
    clusters: list[dict[str, Any]],
    namespace: str | None,
    args: argparse.Namespace,
    style: Style,
    out: TextIO,
    err: TextIO,
) -> int:
    output = args.output
    reports = []
    for cluster in clusters:
        ns = cluster["metadata"].get("namespace", "")
        selector = cluster.get("spec", {}).get("primarySelector") or {}
        pods: list[dict[str, Any]] | None = []
        pods_error = None
        if isinstance(selector, dict) and selector:
            try:
                pods = kube.pods(ns, selector)
            except KubeError as exc:
                pods, pods_error = None, exc.message
        live = _ask_patroni(kube, cluster, pods or []) if args.lag else None
        entry = report.build(cluster, pods, live)
        if pods_error:
            entry["membersNote"] = f"the Pods could not be read ({pods_error})"
        reports.append(entry)
    if output == "json":
        out.write(json.dumps({"clusters": reports}, indent=2, ensure_ascii=False) + "\n")
        return EXIT_OK
    if not reports:
        where = f"namespace {namespace}" if namespace else "any namespace"
        err.write(f"No PostgreSQLClusters found in {where}.\n")
        return EXIT_OK
    out.write(render.render(reports, style))
    return EXIT_OK


def _ask_patroni(
    kube: Kube, cluster: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> dict[str, MemberStatus | str]:
    """Every member's ``GET /patroni`` at once (bounded: one request per Pod, each timed out)."""
    ns = cluster["metadata"].get("namespace", "")
    patroni = (cluster.get("spec") or {}).get("patroni") or {}
    port = patroni.get("port", field_default(ClusterSpec, "patroni_port"))
    scheme = patroni.get("scheme", field_default(ClusterSpec, "patroni_scheme"))
    names = sorted(str(p["metadata"]["name"]) for p in pods if (p.get("status") or {}).get("podIP"))
    if not names:
        return {}

    def ask(name: str) -> MemberStatus | str:
        try:
            body = kube.patroni(ns, name, int(port), str(scheme))
        except KubeError as exc:
            return exc.message
        return MemberStatus.from_api_response(name, 200, body, health_path="/patroni")

    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        return dict(zip(names, pool.map(ask, names), strict=True))


def _check(
    kube: Kube,
    clusters: list[dict[str, Any]],
    namespace: str | None,
    args: argparse.Namespace,
    style: Style,
    out: TextIO,
    err: TextIO,
) -> int:
    results: list[Check] = []
    for cluster in clusters:
        results += _cluster_checks(kube, cluster)
    try:
        controllers = kube.composite_controllers()
    except KubeError as exc:
        results.append(Check("CompositeController", False, exc.message))
    else:
        found, ours = checks.controller(controllers, clusters)
        results += found
        if ours:
            refs = checks.token_refs(ours)
            if not refs:
                results.append(checks.no_token_ref(ours))
            for ref in refs:
                try:
                    secret = kube.secret(ref[0], ref[1])
                except KubeError as exc:
                    results.append(Check(f"Secret {ref[0]}/{ref[1]}", False, exc.message))
                else:
                    results.append(checks.token(ref, secret))
    mc_namespace = args.metacontroller_namespace
    try:
        workloads = kube.workloads(mc_namespace)
    except KubeError as exc:
        results.append(Check("Metacontroller", False, exc.message))
    else:
        results += checks.leader_election(workloads, mc_namespace)

    failed = [r for r in results if not r.ok]
    if args.output == "json":
        body = {"ok": not failed, "checks": [r.as_json() for r in results]}
        out.write(json.dumps(body, indent=2, ensure_ascii=False) + "\n")
        return EXIT_PROBLEM if failed else EXIT_OK
    if not clusters:
        where = f"namespace {namespace}" if namespace else "any namespace"
        out.write(f"No PostgreSQLClusters found in {where}; checking the installation only.\n")
    for r in results:
        mark = style.good("ok  ") if r.ok else style.bad("FAIL")
        out.write(f"{mark}  {r.subject}: {r.detail}\n")
    summary = f"{len(results)} checks, {len(failed)} failed"
    out.write((style.bad(summary) if failed else style.good(summary)) + "\n")
    return EXIT_PROBLEM if failed else EXIT_OK


def _adopt(
    kube: Kube,
    clusters: list[dict[str, Any]],
    args: argparse.Namespace,
    style: Style,
    out: TextIO,
    err_style: Style,
    err: TextIO,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Plan the hand-over (pure), send its one patch, optionally wait for the pinned selector."""
    (cluster,) = clusters
    ns = cluster["metadata"].get("namespace", "")
    name = ((cluster.get("spec") or {}).get("serviceRef") or {}).get("name")
    service = kube.service(ns, name) if isinstance(name, str) and name else None
    planned = adoption.plan(cluster, service, force=args.force)
    if planned.refused:
        out.write(f"{style.bad('refused:')} {planned.message}\n")
        return EXIT_PROBLEM
    if planned.patch is None:
        out.write(f"{planned.message}\n")
        return EXIT_OK
    started = clock()
    try:
        kube.patch_service(ns, str(name), planned.patch)
    except KubeError as exc:
        if exc.code == 409:
            raise KubeError(
                f"Service {name} changed while it was being adopted (409): nothing was changed; "
                "run the command again",
                code=409,
                reason=exc.reason,
            ) from exc
        raise
    for note in planned.notes:
        out.write(f"note: {note}\n")
    out.write(f"{style.good('adopted:')} {planned.message}\n")
    if args.wait <= 0:
        return EXIT_OK
    deadline = started + args.wait
    while True:
        pod = adoption.pinned(cluster, kube.service(ns, str(name)))
        if pod is not None:
            out.write(
                f"pinned: Service {name} selects {pod}, {clock() - started:.2f} s after the patch\n"
            )
            return EXIT_OK
        if clock() >= deadline:
            out.write(
                f"{style.bad('not pinned')} within {args.wait:g} s: see kubectl pgfh status "
                f"-n {ns} {cluster['metadata'].get('name')}\n"
            )
            return EXIT_PROBLEM
        time.sleep(0.1)


def _cluster_checks(kube: Kube, cluster: Mapping[str, Any]) -> list[Check]:
    ns = cluster["metadata"].get("namespace", "")
    name = f"{ns}/{cluster['metadata'].get('name')}"
    service_name = (cluster.get("spec", {}).get("serviceRef") or {}).get("name")
    primary = (cluster.get("status") or {}).get("primary")
    if not service_name or not primary:
        return checks.routing(cluster, None, None, None)
    subject = f"{name}: Service {service_name}"
    try:
        service = kube.service(ns, service_name)
    except KubeError as exc:
        return [*checks.routing(cluster, None, None, None)[:1], Check(subject, False, exc.message)]
    selector = ((service or {}).get("spec") or {}).get("selector") or {}
    selected: list[dict[str, Any]] | None = None
    slices: list[dict[str, Any]] | None = None
    extra: list[Check] = []
    if service is not None and selector:
        try:
            selected = kube.pods(ns, selector)
        except KubeError as exc:
            extra.append(Check(subject, False, f"cannot list the Pods it selects: {exc.message}"))
        try:
            slices = kube.endpoint_slices(ns, service_name)
        except KubeError as exc:
            extra.append(Check(subject, False, f"cannot read its EndpointSlices: {exc.message}"))
    return checks.routing(cluster, service, selected, slices) + extra


def entry_point() -> None:
    """The ``kubectl-pgfh`` console script."""
    sys.exit(main())
