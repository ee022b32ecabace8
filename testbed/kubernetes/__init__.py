"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager
built from pinned Go modules, started on loopback, and a stand-in of the kubelet."""

from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.servers import ControlPlane, running_control_plane, start_control_plane

__all__ = ["ControlPlane", "ControlPlaneError", "running_control_plane", "start_control_plane"]
