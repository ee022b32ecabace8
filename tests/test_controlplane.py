"""The test control plane itself: the pinned versions, the kubelet stand-in, EndpointSlices
from the real controller, and the one-line failures (port taken, build failed, etcd too old)."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes import client

from testbed.kubernetes import ControlPlane, ControlPlaneError, binaries, servers
from testbed.kubernetes.binaries import PROGRAMS, pinned_version
from testbed.kubernetes.kubelet import POD_IP_ANNOTATION, KubeletStandIn
from testbed.kubernetes.podnet import loopback_ip, pod_ip
from testbed.kubernetes.pods import NODE
from testbed.kubernetes.rest import KubeRest


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_the_servers_run_the_pinned_versions(control_plane: ControlPlane) -> None:
    shown = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    pinned = pinned_version("kubernetes", "k8s.io/kubernetes")
    assert shown["serverVersion"]["gitVersion"] == pinned
    assert shown["clientVersion"]["gitVersion"] == pinned
    etcd = binaries.etcd_version(control_plane.binaries.path("etcd"))
    assert etcd is not None
    assert f"v{'.'.join(map(str, etcd))}" == pinned_version("etcd", "go.etcd.io/etcd/server/v3")


def test_only_the_controllers_a_kubelet_less_machine_honours_run(
    control_plane: ControlPlane,
) -> None:
    args = " ".join(control_plane.controller_manager.args)
    assert "endpointslice-controller" in args
    # The admission policy must admit the StatefulSet controller's own Pods
    # (tests/test_admission_pods_real.py); no other test creates StatefulSets.
    assert "statefulset-controller" in args
    assert "node-lifecycle-controller" not in args
    assert "pod-garbage-collector-controller" not in args


class _Readiness(BaseHTTPRequestHandler):
    healthy = threading.Event()
    hits: ClassVar[list[float]] = []

    def do_GET(self) -> None:
        type(self).hits.append(time.monotonic())
        self.send_response(200 if self.healthy.is_set() else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def readiness_server() -> Iterator[tuple[str, int, threading.Event, list[float]]]:
    handler = type("Handler", (_Readiness,), {"healthy": threading.Event(), "hits": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1], handler.healthy, handler.hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _pod(name: str, ip: str, labels: dict[str, str], probe: dict[str, Any] | None) -> Any:
    container: dict[str, Any] = {"name": "patroni", "image": "none"}
    if probe:
        container["readinessProbe"] = probe
    return {
        "metadata": {"name": name, "labels": labels, "annotations": {POD_IP_ANNOTATION: ip}},
        "spec": {"nodeName": NODE, "containers": [container]},
    }


def _ready(core: client.CoreV1Api, namespace: str, name: str) -> bool | None:
    pod = core.read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or []:
        if condition.type == "Ready":
            return bool(condition.status == "True")
    return None


def test_the_kubelet_stand_in_reports_readiness_from_the_pods_probe(
    kube_api: client.ApiClient,
    kube_rest: KubeRest,
    kube_namespace: str,
    pod_network: None,
    readiness_server: tuple[str, int, threading.Event, list[float]],
) -> None:
    """Ready follows the Pod's readiness probe, sent to the Pod IP (198.18.0.1 stands for the
    fake's 127.0.0.1), and the real endpointslice controller follows Ready."""
    loopback, port, healthy, _ = readiness_server
    host = pod_ip(loopback)
    core = client.CoreV1Api(kube_api)
    discovery = client.DiscoveryV1Api(kube_api)
    probe = {"httpGet": {"path": "/readiness", "port": port}, "periodSeconds": 1}
    service = {"selector": {"app": "m"}, "ports": [{"port": port}]}
    core.create_namespaced_service(kube_namespace, {"metadata": {"name": "m"}, "spec": service})

    def listed() -> list[tuple[list[str], bool]]:
        slices = discovery.list_namespaced_endpoint_slice(
            kube_namespace, label_selector="kubernetes.io/service-name=m"
        ).items
        return [(e.addresses, bool(e.conditions.ready)) for s in slices for e in s.endpoints or []]

    with KubeletStandIn(kube_rest, NODE):
        core.create_namespaced_pod(kube_namespace, _pod("member-0", host, {"app": "m"}, probe))
        pod = wait_for(
            lambda: (p := core.read_namespaced_pod("member-0", kube_namespace)).status.pod_ip and p,
            30,
            "the Pod IP",
        )
        assert pod.status.phase == "Running"
        assert [ip.ip for ip in pod.status.pod_ips] == [host]
        time.sleep(1.5)  # a failing probe keeps it not Ready
        assert _ready(core, kube_namespace, "member-0") is False
        assert listed() == [([host], False)]
        healthy.set()
        wait_for(lambda: _ready(core, kube_namespace, "member-0"), 10, "Ready after 200")
        wait_for(lambda: listed() == [([host], True)], 10, "the slice to list it ready")
        healthy.clear()
        # failureThreshold 3 at 1 s: not Ready within about 3 s, not at once
        wait_for(lambda: _ready(core, kube_namespace, "member-0") is False, 10, "not Ready")
        wait_for(lambda: listed() == [([host], False)], 10, "the slice to list it not ready")


def test_the_kubelet_stand_in_probes_on_its_period_not_when_the_pod_changes(
    kube_api: client.ApiClient,
    kube_rest: KubeRest,
    kube_namespace: str,
    pod_network: None,
    readiness_server: tuple[str, int, threading.Event, list[float]],
) -> None:
    """Patroni on its Kubernetes DCS patches its own Pod every HA loop (role label, status
    annotation); a kubelet probes once a period whatever happens to the Pod's metadata, so
    the stand-in must not probe on a patch (it did: a new leader labelling itself primary was
    probed, and listed Ready, at once, which no kubelet does)."""
    loopback, port, healthy, hits = readiness_server
    healthy.set()
    core = client.CoreV1Api(kube_api)
    probe = {"httpGet": {"path": "/readiness", "port": port}, "periodSeconds": 4}
    with KubeletStandIn(kube_rest, NODE):
        core.create_namespaced_pod(
            kube_namespace, _pod("member-0", pod_ip(loopback), {"app": "p"}, probe)
        )
        wait_for(lambda: _ready(core, kube_namespace, "member-0"), 30, "Ready")
        time.sleep(0.5)
        before = len(hits)
        for index in range(10):  # ten patches in about 2 s: at most one period boundary
            core.patch_namespaced_pod(
                "member-0", kube_namespace, {"metadata": {"labels": {"role": f"r{index}"}}}
            )
            time.sleep(0.2)
        assert len(hits) - before <= 1, hits[before:]


def test_endpoint_slices_list_pods_of_the_node_and_the_server_refuses_loopback(
    kube_api: client.ApiClient, kube_rest: KubeRest, kube_namespace: str
) -> None:
    """The real endpointslice controller lists a Pod of an existing Node with its IP and
    Ready; a loopback Pod IP is valid on a Pod but refused in an EndpointSlice (the API
    server's ValidateEndpointIP), which is why member Pods need non-loopback addresses."""
    core = client.CoreV1Api(kube_api)
    discovery = client.DiscoveryV1Api(kube_api)
    with KubeletStandIn(kube_rest, NODE):
        # No readiness probe: nothing ever connects to this address.
        core.create_namespaced_pod(
            kube_namespace, _pod("routable", "198.18.0.250", {"app": "a"}, None)
        )
        core.create_namespaced_service(
            kube_namespace,
            {
                "metadata": {"name": "a"},
                "spec": {"selector": {"app": "a"}, "ports": [{"port": 5432}]},
            },
        )

        def endpoints() -> list[tuple[list[str], bool]]:
            slices = discovery.list_namespaced_endpoint_slice(
                kube_namespace, label_selector="kubernetes.io/service-name=a"
            ).items
            return [
                (e.addresses, bool(e.conditions.ready)) for s in slices for e in s.endpoints or []
            ]

        assert wait_for(lambda: endpoints() == [(["198.18.0.250"], True)] and True, 30, "slice")
        slice_body = {
            "metadata": {"name": "loopback", "labels": {"kubernetes.io/service-name": "a"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.2"]}],
            "ports": [{"port": 5432}],
        }
        with pytest.raises(client.ApiException) as refused:
            discovery.create_namespaced_endpoint_slice(kube_namespace, slice_body)
        assert refused.value.status == 422
        assert "may not be in the loopback range" in refused.value.body


# -- bad input: one line naming the cause and the log, never a hang -------------------------


def test_a_taken_port_stops_the_start_with_one_line(
    control_plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setattr(servers, "free_port", lambda host="127.0.0.1": taken.getsockname()[1])
    monkeypatch.setenv(binaries.ENV_BIN_DIR, str(control_plane.binaries.bin_dir))
    try:
        with pytest.raises(ControlPlaneError) as error:
            servers.start_control_plane(tmp_path / "run", log=lambda _: None)
    finally:
        taken.close()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("etcd exited")
    assert "a port it needs is taken" in message
    assert str(tmp_path / "run" / "etcd.log") in message


def test_a_too_old_etcd_is_refused_by_name(
    control_plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in PROGRAMS:
        (bin_dir / program).symlink_to(control_plane.binaries.path(program))
    (bin_dir / "etcd").unlink()
    (bin_dir / "etcd").write_text("#!/bin/sh\necho 'etcd Version: 3.4.23'\n")
    (bin_dir / "etcd").chmod(0o755)
    monkeypatch.setenv(binaries.ENV_BIN_DIR, str(bin_dir))
    with pytest.raises(ControlPlaneError) as error:
        servers.start_control_plane(tmp_path / "run", log=lambda _: None)
    assert str(error.value) == (
        f"etcd 3.4.23 at {bin_dir / 'etcd'} is too old for kube-apiserver "
        "(watch progress requests need etcd 3.5.13 or newer)"
    )


def test_a_failed_build_names_the_module_and_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go_dir = tmp_path / "go"
    shutil.copytree(binaries.GO_DIR, go_dir)
    (go_dir / "etcd" / "go.sum").write_text("")  # -mod=readonly: every sum is missing
    monkeypatch.setattr(binaries, "GO_DIR", go_dir)
    monkeypatch.setenv(binaries.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    with pytest.raises(binaries.BuildError) as error:
        binaries.ensure_binaries(log=lambda _: None)
    message = str(error.value)
    assert message.startswith("building etcd (go.etcd.io/etcd/server/v3, ")
    assert ".build.log" in message
    log_file = Path(message.rsplit("see ", 1)[1])
    assert "missing go.sum entry" in log_file.read_text()
    assert not list((tmp_path / "cache" / "controlplane").glob("*/.complete"))


def test_pod_ips_stand_for_loopback_addresses_one_to_one() -> None:
    assert pod_ip("127.0.0.2") == "198.18.0.2"
    assert loopback_ip("198.18.0.254") == "127.0.0.254"
    with pytest.raises(ValueError):
        pod_ip("10.0.0.2")
    with pytest.raises(ValueError):
        loopback_ip("127.0.0.2")
