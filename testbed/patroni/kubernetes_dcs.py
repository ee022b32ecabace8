"""Patroni on its Kubernetes DCS against a real API server, outside a Pod: the rights, the
token, the member Pods, the kubeconfig and the environment each member's Patroni runs with.

Patroni 4.1's Kubernetes DCS (``patroni/dcs/kubernetes.py``) keeps the leader lock, the
dynamic configuration, the failover and sync keys in Endpoints (``use_endpoints: true``) or
ConfigMaps named after the scope, and in every HA cycle patches the member's *own* Pod
(``touch_member``: the role label and the ``status`` annotation). Outside a Pod it loads the
kubeconfig named by ``$KUBECONFIG`` (read when the module is imported) with the context
``kubernetes.context`` (default ``kind-kind``, so it must be set), so each member here gets:

* a ServiceAccount with exactly the rights of Patroni's own ``kubernetes/patroni_k8s.yaml``
  Role, and a token for it from the TokenRequest API (:func:`grant_patroni_rights`);
* a Pod object named like the member, bound to the kubelet stand-in's Node, with the Pod IP
  ``198.18.0.N`` for the member on ``127.0.0.N`` (the API server refuses loopback addresses in
  Endpoints; :mod:`testbed.kubernetes.podnet` routes the Pod IPs to loopback)
  (:func:`member_pod`);
* a kubeconfig with that token and a copy of the CA, readable by the cluster user
  (:func:`write_member_files`), and ``PATRONI_KUBERNETES_*`` in its environment
  (:func:`member_environment`).

The members still listen on, and replicate over, ``127.0.0.N``: only the Pod IP (what
Patroni writes into the leader Endpoints and what a Service would route to) is ``198.18.0.N``.

This is the Patroni member's account only; the Metacontroller stand-in's account is
``testbed/kubernetes/accounts.py``'s business.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.kubernetes.kubeconfig import write_kubeconfig
from testbed.kubernetes.kubelet import POD_IP_ANNOTATION
from testbed.kubernetes.podnet import pod_ip
from testbed.kubernetes.pods import patroni_pod
from testbed.kubernetes.rest import Credentials, KubeApiError, KubeRest

#: The context :func:`testbed.kubernetes.kubeconfig.write_kubeconfig` writes (Patroni's default,
#: ``kind-kind``, would not exist).
CONTEXT = "pgfh-test"
SERVICE_ACCOUNT = "patroni"
#: ``PATRONI_KUBERNETES_LABELS``: on every object Patroni creates and in its Pod selector;
#: Patroni adds ``<scope_label>: <scope>`` itself (``scope_label`` default ``cluster-name``).
LABELS: Mapping[str, str] = {"application": "patroni"}
SCOPE_LABEL = "cluster-name"
#: How long the member token lives: longer than any test run, short for a leaked one.
TOKEN_SECONDS = 3600

#: Patroni 4.1's ``kubernetes/patroni_k8s.yaml`` Role, rule for rule.
PATRONI_ROLE_RULES: Sequence[Mapping[str, Any]] = (
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["create", "get", "list", "patch", "update", "watch", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["endpoints"],
        "verbs": ["get", "patch", "update", "create", "list", "watch", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "patch", "update", "watch"],
    },
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create"]},
)


@dataclass(frozen=True)
class KubernetesDCS:
    """Where and as whom the members keep their DCS: one namespace of a real API server."""

    server: str
    #: The API server's CA (copied into the run's base dir for the cluster user).
    ca_file: Path
    #: The ServiceAccount token the members authenticate with (:func:`grant_patroni_rights`).
    token: str = field(repr=False)
    namespace: str
    #: Patroni's ``kubernetes.use_endpoints``: the leader lock in Endpoints ``<scope>`` (with
    #: the leader's Pod IP in it) rather than in the ConfigMap ``<scope>-leader``.
    use_endpoints: bool
    labels: Mapping[str, str] = field(default_factory=lambda: dict(LABELS))

    def selector(self, scope: str) -> dict[str, str]:
        """The labels of every Patroni object and member Pod of ``scope``."""
        return {**self.labels, SCOPE_LABEL: scope}

    def leader_object(self, scope: str) -> tuple[str, str]:
        """(resource plural, name) of the object that holds the leader lock."""
        if self.use_endpoints:
            return "endpoints", scope
        return "configmaps", f"{scope}-leader"


# ---------------------------------------------------------------------------- pure shapes


def rbac_objects(namespace: str, name: str = SERVICE_ACCOUNT) -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding of ``patroni_k8s.yaml`` in ``namespace``."""
    meta = {"name": name, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [dict(rule) for rule in PATRONI_ROLE_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def member_pod(
    name: str, member_ip: str, *, namespace: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The Pod a member patches: the test bed's one member Pod
    (:func:`testbed.kubernetes.pods.patroni_pod`), bound to the kubelet stand-in's Node.

    ``labels`` are Patroni's (:meth:`KubernetesDCS.selector`): Patroni finds its members by
    them. The readiness probe is Patroni's ``/readiness`` at the Pod IP, as in Patroni's own
    ``patroni_k8s.yaml``; the kubelet stand-in runs it and gives the Pod its IP.
    """
    return patroni_pod(name, namespace, labels, annotations={POD_IP_ANNOTATION: pod_ip(member_ip)})


def config_section(pg_port: int) -> dict[str, Any]:
    """``patroni.yml``'s ``kubernetes:`` section; the rest comes from the environment.

    ``ports`` names the port Patroni writes into the leader Endpoints (the name a Service
    without a selector would have to use); ignored with ConfigMaps.
    """
    return {"ports": [{"name": "postgresql", "port": pg_port}]}


def member_environment(dcs: KubernetesDCS, member_ip: str, kubeconfig: Path) -> dict[str, str]:
    """The ``PATRONI_KUBERNETES_*`` variables (``patroni/config.py``) and ``KUBECONFIG``.

    No scope label: Patroni adds ``cluster-name: <scope>`` to the labels itself.
    """
    return {
        "KUBECONFIG": str(kubeconfig),
        "PATRONI_KUBERNETES_CONTEXT": CONTEXT,
        "PATRONI_KUBERNETES_NAMESPACE": dcs.namespace,
        "PATRONI_KUBERNETES_LABELS": json.dumps(dict(dcs.labels)),
        "PATRONI_KUBERNETES_POD_IP": pod_ip(member_ip),
        "PATRONI_KUBERNETES_USE_ENDPOINTS": "true" if dcs.use_endpoints else "false",
    }


# ---------------------------------------------------------------------------- I/O


def grant_patroni_rights(
    admin: KubeRest, namespace: str, name: str = SERVICE_ACCOUNT, seconds: int = TOKEN_SECONDS
) -> str:
    """Create the ServiceAccount, Role and RoleBinding; return a token from TokenRequest."""
    paths = {
        "ServiceAccount": f"/api/v1/namespaces/{namespace}/serviceaccounts",
        "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
    }
    for obj in rbac_objects(namespace, name):
        try:
            admin.create(paths[obj["kind"]], obj)
        except KubeApiError as error:
            if error.status != 409:  # already there from an earlier start: keep it
                raise
    answer = admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        },
    )
    token = answer.get("status", {}).get("token")
    if not isinstance(token, str) or not token:
        raise KubeApiError(500, "NoToken", f"TokenRequest for {namespace}/{name} gave no token")
    return token


def create_member_pods(
    admin: KubeRest, dcs: KubernetesDCS, scope: str, members: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Create one Pod per member (``name → loopback IP``); an existing one is replaced."""
    created = []
    path = f"/api/v1/namespaces/{dcs.namespace}/pods"
    for name, ip in members.items():
        body = member_pod(name, ip, namespace=dcs.namespace, labels=dcs.selector(scope))
        with contextlib.suppress(KubeApiError):
            admin.delete(f"{path}/{name}", {"gracePeriodSeconds": 0})
        created.append(admin.create(path, body))
    return created


def write_member_files(dcs: KubernetesDCS, directory: Path, uid: int, gid: int) -> Path:
    """The CA copy and the token kubeconfig in ``directory``, owned by the cluster user."""
    directory.mkdir(mode=0o700, exist_ok=True)
    ca = directory / "ca.crt"
    shutil.copyfile(dcs.ca_file, ca)
    kubeconfig = write_kubeconfig(
        directory / "kubeconfig",
        server=dcs.server,
        ca_file=ca,
        user=SERVICE_ACCOUNT,
        token=dcs.token,
        namespace=dcs.namespace,
    )
    for path in (directory, ca, kubeconfig):
        os.chown(path, uid, gid)
    ca.chmod(0o600)
    return kubeconfig


def leader_key_holder(dcs: KubernetesDCS, scope: str) -> str | None:
    """Who holds the leader lock: the ``leader`` annotation of the leader object.

    Read with the members' own token (what Patroni itself can read). The annotation outlives
    a killed leader until ``renewTime + ttl``, like etcd's key; an absent object or an empty
    annotation is ``None``.
    """
    plural, name = dcs.leader_object(scope)
    rest = KubeRest(Credentials(dcs.server, str(dcs.ca_file), token=dcs.token))
    try:
        obj = rest.get(f"/api/v1/namespaces/{dcs.namespace}/{plural}/{name}")
    except KubeApiError as error:
        if error.status == 404:
            return None
        raise
    finally:
        rest.close()
    holder = (obj.get("metadata", {}).get("annotations") or {}).get("leader")
    return holder or None
