"""Pytest plugin: the real Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager from pinned Go modules, :mod:`testbed.kubernetes`) as fixtures.

* ``control_plane`` (session): started once for the whole run, on loopback ports the kernel
  hands out, stopped at the end with nothing left running. The first run on a machine builds
  the binaries into the per-machine cache (about 10 minutes); later runs start in seconds. A
  control plane that cannot be built or started stops the whole run with one line naming the
  cause and the log to read (``pytest.exit``), rather than failing every test after it.
* ``kube_api`` (session): a ``kubernetes`` client ``ApiClient`` as ``system:masters``;
  ``kube_rest`` (session): the same identity as plain JSON
  (:class:`testbed.kubernetes.rest.KubeRest`).
* ``pod_network`` (session): routable Pod IPs ``198.18.0.N`` for processes on ``127.0.0.N``
  (:mod:`testbed.kubernetes.podnet`: the server refuses loopback addresses in EndpointSlices).
* ``kube_namespace`` (function): a namespace of the test's own, deleted afterwards.

Every test that uses one is marked ``kube`` automatically, so ``-m "not kube"`` deselects them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from testbed.kubernetes import ControlPlane, ControlPlaneError, start_control_plane
from testbed.kubernetes.podnet import ensure_pod_network
from testbed.kubernetes.rest import KubeRest

_FIXTURES = {"control_plane", "kube_api", "kube_rest", "kube_namespace", "pod_network"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kube)


@contextlib.contextmanager
def running_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own (fresh etcd, nothing applied), stopped on exit. For the
    session's ``control_plane`` and for a module that must start from an empty server."""
    run_dir = tmp_path_factory.mktemp("controlplane")
    try:
        plane = start_control_plane(run_dir, log=lambda line: print(f"\n{line}", flush=True))
    except ControlPlaneError as error:
        pytest.exit(f"the test control plane did not come up: {error}", returncode=3)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with running_control_plane(tmp_path_factory) as plane:
        yield plane


@pytest.fixture(scope="session")
def pod_network() -> None:
    try:
        ensure_pod_network()
    except ControlPlaneError as error:
        pytest.exit(f"the test Pod network could not be set up: {error}", returncode=3)


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(control_plane.admin_kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def kube_rest(control_plane: ControlPlane) -> Iterator[KubeRest]:
    rest = KubeRest.from_kubeconfig(control_plane.admin_kubeconfig)
    try:
        yield rest
    finally:
        rest.close()


@pytest.fixture
def kube_namespace(kube_api: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)
