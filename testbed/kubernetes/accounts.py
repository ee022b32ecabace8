"""ServiceAccounts with real RBAC on the test control plane, and kubeconfigs with their tokens.

A program under test (Metacontroller's stand-in, a real Metacontroller binary, the hook with
the events overlay) should meet the API server as the account it runs as in a cluster, not as
``system:masters``: a rule missing from its ClusterRole must show up as a 403 in the test, as
it would in production. So:

* :func:`service_account_kubeconfig` creates (server-side applies) a ServiceAccount, applies
  the (Cluster)Roles and (Cluster)RoleBindings given to it, and returns a kubeconfig holding a
  bound token of that account from the TokenRequest API
  (``POST /api/v1/namespaces/NS/serviceaccounts/NAME/token``), the same kind of token the
  kubelet projects into a Pod. The token expires after ``duration`` seconds (the API server's
  minimum is 600).
* :func:`metacontroller_kubeconfig` does that for Metacontroller as pg-failover-hook installs
  it: ServiceAccount ``metacontroller`` in namespace ``metacontroller``, bound to a
  ClusterRole ``metacontroller`` whose rules are ``clusterRole.rules`` of
  deploy/metacontroller-values.yaml, exactly what the Helm chart renders
  (templates/clusterrole.yaml: ``rules: {{ toYaml .Values.clusterRole.rules }}``).

Everything is applied with server-side apply (field manager ``pgfh-accounts``), so calling a
function again with the same arguments changes nothing and returns a fresh token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.kubeconfig import write_kubeconfig
from testbed.kubernetes.rest import KubeApiError, KubeRest, resource_path
from testbed.kubernetes.servers import ControlPlane

REPO = Path(__file__).resolve().parents[2]
#: The Helm values whose ``clusterRole.rules`` are Metacontroller's ClusterRole.
METACONTROLLER_VALUES = REPO / "deploy" / "metacontroller-values.yaml"
METACONTROLLER_NAMESPACE = "metacontroller"
METACONTROLLER_ACCOUNT = "metacontroller"
FIELD_MANAGER = "pgfh-accounts"
RBAC = "rbac.authorization.k8s.io/v1"

#: kind -> (plural, namespaced) of what may be passed as ``rbac``.
_RBAC_KINDS = {
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
}


def subject(namespace: str, name: str) -> str:
    """The user name the API server gives the account (for ``kubectl --as``, RBAC subjects)."""
    return f"system:serviceaccount:{namespace}:{name}"


def _apply(rest: KubeRest, obj: Mapping[str, Any]) -> None:
    kind = obj["kind"]
    if kind == "Namespace":
        path = resource_path("v1", "namespaces", name=obj["metadata"]["name"])
    elif kind == "ServiceAccount":
        meta = obj["metadata"]
        path = resource_path("v1", "serviceaccounts", meta["namespace"], meta["name"])
    elif kind in _RBAC_KINDS:
        plural, namespaced = _RBAC_KINDS[kind]
        meta = obj["metadata"]
        if namespaced and not meta.get("namespace"):
            raise ControlPlaneError(f"{kind} {meta['name']} names no namespace")
        path = resource_path(
            RBAC, plural, meta.get("namespace") if namespaced else None, meta["name"]
        )
    else:
        raise ControlPlaneError(f"not a ServiceAccount or RBAC object: {kind}")
    try:
        rest.apply(path, obj, FIELD_MANAGER)
    except KubeApiError as error:
        raise ControlPlaneError(f"applying {kind} {obj['metadata']['name']}: {error}") from error


def request_token(rest: KubeRest, namespace: str, name: str, duration: int = 3600) -> str:
    """A bound token of the ServiceAccount from the TokenRequest API."""
    path = resource_path("v1", "serviceaccounts", namespace, name) + "/token"
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": duration},
    }
    try:
        answer = rest.create(path, body)
    except KubeApiError as error:
        raise ControlPlaneError(f"TokenRequest for {namespace}/{name}: {error}") from error
    return str(answer["status"]["token"])


def service_account_kubeconfig(
    plane: ControlPlane,
    namespace: str,
    name: str,
    *,
    rbac: Iterable[Mapping[str, Any]] = (),
    duration: int = 3600,
) -> Path:
    """A kubeconfig for ServiceAccount ``namespace/name`` with the given RBAC objects applied.

    ``rbac``: Roles, RoleBindings, ClusterRoles and ClusterRoleBindings (plain dicts, as in a
    manifest), applied as given, in order; bind them to :func:`subject` yourself, or use
    :func:`cluster_role_for` for the common case. The namespace is created if missing. The
    file is ``<run dir>/sa-<namespace>-<name>.kubeconfig``; the token in it lasts
    ``duration`` seconds (at least 600, the API server's minimum).
    """
    rest = KubeRest.from_kubeconfig(plane.admin_kubeconfig)
    try:
        _apply(rest, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        _apply(
            rest,
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            },
        )
        for obj in rbac:
            _apply(rest, obj)
        token = request_token(rest, namespace, name, duration)
    finally:
        rest.close()
    return write_kubeconfig(
        plane.run_dir / f"sa-{namespace}-{name}.kubeconfig",
        server=plane.server_url,
        ca_file=plane.ca_file,
        user=subject(namespace, name),
        token=token,
        namespace=namespace,
    )


def cluster_role_for(
    namespace: str, name: str, role: str, rules: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A ClusterRole ``role`` with ``rules`` and its ClusterRoleBinding to the account."""
    return [
        {
            "apiVersion": RBAC,
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [dict(rule) for rule in rules],
        },
        {
            "apiVersion": RBAC,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def metacontroller_rules(values: Path = METACONTROLLER_VALUES) -> list[dict[str, Any]]:
    """``clusterRole.rules`` of the Helm values: the chart renders them verbatim."""
    document = yaml.safe_load(values.read_text(encoding="utf-8"))
    rules = (document.get("clusterRole") or {}).get("rules")
    if not isinstance(rules, list) or not rules:
        raise ControlPlaneError(f"{values} has no clusterRole.rules")
    return rules


def metacontroller_kubeconfig(
    plane: ControlPlane,
    *,
    rules: Sequence[Mapping[str, Any]] | None = None,
    duration: int = 3600,
) -> Path:
    """Metacontroller's identity: ``system:serviceaccount:metacontroller:metacontroller``,
    bound to ClusterRole ``metacontroller`` with the values' rules (or ``rules``, to test a
    variant; applying again replaces the role's rules)."""
    chosen = metacontroller_rules() if rules is None else list(rules)
    return service_account_kubeconfig(
        plane,
        METACONTROLLER_NAMESPACE,
        METACONTROLLER_ACCOUNT,
        rbac=cluster_role_for(
            METACONTROLLER_NAMESPACE, METACONTROLLER_ACCOUNT, "metacontroller", chosen
        ),
        duration=duration,
    )
