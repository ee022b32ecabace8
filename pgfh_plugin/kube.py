"""The plugin's only I/O: reads through the Kubernetes API with the ``kubernetes`` client.

Every read goes through the typed client of the ``kubernetes`` library with the user's
kubeconfig (or the in-cluster service account), so it carries the user's credentials and is
subject to their RBAC, as ``kubectl`` itself would be. Answers are kept as the API server's
JSON (plain dicts, ``_preload_content=False``): the pure parts of the plugin read the same
field names as ``kubectl get -o json`` shows, and no typed model drops a field it does not
know (the PostgreSQLCluster status, a newer API's fields).

Every failure becomes a :class:`KubeError` with one sentence a user can act on: no
kubeconfig, an API server that cannot be reached, credentials refused (401), no permission
(403, with the API server's own message, which names the verb, resource and namespace),
the CRD not installed (a 404 on the group/version itself), an unknown cluster name (a 404
naming the object). Every request is bounded by a connect and a read timeout, and a failed
connection is retried at most once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

GROUP = "adg.io"
VERSION = "v1alpha1"
PLURAL = "postgresqlclusters"
KIND = "PostgreSQLCluster"

MC_GROUP = "metacontroller.k8s.io"
MC_VERSION = "v1alpha1"
MC_PLURAL = "compositecontrollers"

#: Seconds to wait for a TCP connection to the API server (the read timeout is the user's).
CONNECT_TIMEOUT = 5.0


class KubeError(Exception):
    """A read that failed, as one sentence for the user.

    ``code`` is the HTTP status of the API server's answer (0 when there was none) and
    ``reason`` its ``Status.reason`` (``NotFound``, ``Forbidden``, ...), so callers can tell
    a missing object from a refusal without parsing the sentence. ``named`` is true when a
    404 names the object (``details.name``): the resource type is served but that object does
    not exist, whereas a 404 on a type the API server does not serve names nothing.
    """

    def __init__(
        self, message: str, *, code: int = 0, reason: str = "", named: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.named = named


@dataclass(frozen=True)
class Connection:
    """Where the plugin talks to, resolved from the kubeconfig (or the in-cluster account)."""

    api_client: Any
    host: str
    #: The namespace of the kubeconfig's context, or the pod's own in-cluster; else "default".
    namespace: str


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """Load the kubeconfig as kubectl does: ``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``.

    Inside a pod without any kubeconfig it falls back to the pod's service account, as kubectl
    does. No kubeconfig at all is a :class:`KubeError` that says so plainly, where it looked
    and how to point at one (the client's own message would be a parser's complaint about a
    file that does not exist).
    """
    configuration = client.Configuration()
    paths, source = kubeconfig_paths(kubeconfig, os.environ)
    if not any(os.path.exists(os.path.expanduser(p)) for p in paths):
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            return _in_cluster(configuration)
        raise KubeError(no_kubeconfig_message(paths, source))
    path = os.pathsep.join(paths)
    try:
        contexts, current = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=path
        )
    except ConfigException as exc:
        raise KubeError(f"the kubeconfig at {path} cannot be used: {exc}") from exc
    chosen = current
    if context is not None:
        chosen = next((c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(str(c.get("name")) for c in contexts) or "none"
            raise KubeError(f"no context {context!r} in the kubeconfig (contexts: {names})")
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except ConfigException as exc:
        raise KubeError(f"the kubeconfig at {path} cannot be used: {exc}") from exc
    namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    configuration.retries = 1
    return Connection(client.ApiClient(configuration), configuration.host, str(namespace))


def kubeconfig_paths(flag: str | None, environ: Mapping[str, str]) -> tuple[list[str], str]:
    """The kubeconfig files kubectl would read, and where that list came from."""
    if flag:
        return [flag], "--kubeconfig"
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return listed, "$KUBECONFIG"
    return ["~/.kube/config"], "the default, as $KUBECONFIG is not set"


def no_kubeconfig_message(paths: list[str], source: str) -> str:
    """What to tell a user none of whose kubeconfig files exists."""
    shown = ", ".join(os.path.expanduser(p) for p in paths)
    missing = "it does not exist" if len(paths) == 1 else "none of them exists"
    return (
        f"no kubeconfig found: looked at {shown} ({source}) and {missing}; point at one with "
        "--kubeconfig FILE or KUBECONFIG=FILE, or run where kubectl works"
    )


def _in_cluster(configuration: Any) -> Connection:
    try:
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except ConfigException as exc:
        raise KubeError(f"no kubeconfig, and the in-cluster configuration failed: {exc}") from exc
    namespace = "default"
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            namespace = handle.read().strip() or "default"
    configuration.retries = 1
    return Connection(client.ApiClient(configuration), configuration.host, namespace)


def selector_string(labels: Mapping[str, str]) -> str:
    """An equality label selector (``a=b,c=d``), as a Service's selector is applied."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


class Kube:
    """Typed reads of the objects the plugin needs, each answered as the API's JSON."""

    def __init__(self, connection: Connection, timeout: float) -> None:
        self.host = connection.host
        self.namespace = connection.namespace
        self._timeout = (min(CONNECT_TIMEOUT, timeout), timeout)
        api = connection.api_client
        self._core = client.CoreV1Api(api)
        self._apps = client.AppsV1Api(api)
        self._discovery = client.DiscoveryV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    # -------------------------------------------------------------- PostgreSQLClusters

    def clusters(self, namespace: str | None, name: str | None) -> list[dict[str, Any]]:
        """The PostgreSQLClusters asked for: one by name, a namespace's, or all (``None``)."""
        where = f"in namespace {namespace}" if namespace else "in any namespace"
        if name is not None:
            assert namespace is not None
            try:
                return [
                    self._read(
                        self._custom.get_namespaced_custom_object,
                        GROUP,
                        VERSION,
                        namespace,
                        PLURAL,
                        name,
                    )
                ]
            except KubeError as exc:
                raise self._cluster_error(exc, f"{KIND} {name!r} not found {where}") from exc
        try:
            if namespace is None:
                answer = self._read(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
            else:
                answer = self._read(
                    self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL
                )
        except KubeError as exc:
            raise self._cluster_error(exc, "") from exc
        return _items(answer)

    @staticmethod
    def _cluster_error(exc: KubeError, unknown_name: str) -> KubeError:
        if exc.reason == "NotFound" and unknown_name and exc.named:
            return KubeError(unknown_name, code=404, reason="NotFound")
        if exc.code == 404:
            return KubeError(
                f"the API server does not serve {PLURAL}.{GROUP}/{VERSION}: the {KIND} CRD is "
                "not installed (kubectl apply -k deploy/ installs it)",
                code=404,
                reason="NotFound",
            )
        return exc

    # -------------------------------------------------------------- related objects

    def pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The Pods whose labels match ``labels`` exactly, as a Service selector matches."""
        return _items(
            self._read(
                self._core.list_namespaced_pod, namespace, label_selector=selector_string(labels)
            )
        )

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Service, or ``None`` if it does not exist."""
        return self._optional(self._core.read_namespaced_service, name, namespace)

    def endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """The EndpointSlices of a Service (label ``kubernetes.io/service-name``)."""
        return _items(
            self._read(
                self._discovery.list_namespaced_endpoint_slice,
                namespace,
                label_selector=f"kubernetes.io/service-name={service}",
            )
        )

    def patch_service(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of one Service (``kubectl pgfh adopt``: the plugin's one write).

        Needs ``patch`` on ``services`` in that namespace; a 403 is a :class:`KubeError` that
        names the missing right, and nothing changes. A ``metadata.resourceVersion`` in the
        patch makes it conditional: a Service changed meanwhile is a 409, unchanged.
        """
        return self._read(
            self._core.patch_namespaced_service,
            name,
            namespace,
            dict(patch),
            _content_type="application/merge-patch+json",
        )

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or ``None`` if it does not exist."""
        return self._optional(self._core.read_namespaced_secret, name, namespace)

    def composite_controllers(self) -> list[dict[str, Any]]:
        """Every Metacontroller CompositeController (cluster-scoped)."""
        try:
            answer = self._read(
                self._custom.list_cluster_custom_object, MC_GROUP, MC_VERSION, MC_PLURAL
            )
        except KubeError as exc:
            if exc.code == 404:
                raise KubeError(
                    f"the API server does not serve {MC_PLURAL}.{MC_GROUP}/{MC_VERSION}: "
                    "Metacontroller's CRDs are not installed",
                    code=404,
                    reason="NotFound",
                ) from exc
            raise
        return _items(answer)

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        """The Deployments and StatefulSets of a namespace (Metacontroller runs as either)."""
        found = []
        for kind, method in (
            ("Deployment", self._apps.list_namespaced_deployment),
            ("StatefulSet", self._apps.list_namespaced_stateful_set),
        ):
            # Items of a typed list carry no kind: the list's kind says it.
            found += [{**item, "kind": kind} for item in _items(self._read(method, namespace))]
        return found

    def patroni(self, namespace: str, pod: str, port: int, scheme: str) -> dict[str, Any]:
        """One member's ``GET /patroni``, through the API server's pod proxy (``pods/proxy``).

        Read-only, bounded by the request timeout like every other read, and sent by the API
        server, so it needs no route from the user's machine to the pod network and no more
        than the user's RBAC allows. Patroni answers ``/patroni`` with 200 whatever its role.
        """
        target = f"https:{pod}:{port}" if scheme == "https" else f"{pod}:{port}"
        return self._read(
            self._core.connect_get_namespaced_pod_proxy_with_path, target, namespace, "patroni"
        )

    # -------------------------------------------------------------- plumbing

    def _optional(self, method: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        try:
            return self._read(method, *args)
        except KubeError as exc:
            if exc.reason == "NotFound" and exc.named:
                return None
            raise

    def _read(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """One GET; its JSON body, or a :class:`KubeError` with a sentence for the user."""
        try:
            response = method(
                *args, _preload_content=False, _request_timeout=self._timeout, **kwargs
            )
            body = response.data
        except ApiException as exc:
            raise _api_error(exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise KubeError(
                f"cannot reach the Kubernetes API server at {self.host}: {exc}"
            ) from exc
        try:
            value = json.loads(body)
        except ValueError as exc:
            raise KubeError(f"the API server at {self.host} answered something not JSON") from exc
        if not isinstance(value, dict):
            raise KubeError(f"the API server at {self.host} answered JSON that is not an object")
        return value


def _items(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = answer.get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _api_error(exc: ApiException) -> KubeError:
    """The API server's ``Status`` (or the bare HTTP status) as a :class:`KubeError`."""
    code = int(exc.status or 0)
    status: dict[str, Any] = {}
    if exc.body:
        try:
            parsed = json.loads(exc.body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("kind") == "Status":
            status = parsed
    reason = str(status.get("reason") or exc.reason or "")
    message = str(status.get("message") or exc.reason or "no message")
    details = status.get("details")
    named = isinstance(details, dict) and bool(details.get("name"))
    if code == 0:
        return KubeError(f"cannot talk to the Kubernetes API server: {message}")
    if code == 401:
        return KubeError(
            f"the API server did not accept the kubeconfig's credentials (401 {message}): "
            "log in again or check the user of the current context",
            code=code,
            reason=reason,
        )
    if code == 403:
        return KubeError(f"no permission: {message}", code=code, reason=reason)
    return KubeError(f"{message} (HTTP {code})", code=code, reason=reason, named=named)
