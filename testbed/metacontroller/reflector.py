"""The stand-in's informer is :class:`testbed.kubernetes.watch.Reflector`, the test bed's one
list-and-watch loop; this name stays only for the benchmarks that import it from here
(``testbed/bench/failover_kube.py``, ``testbed/bench/fleet_kube.py``) until they import it
from :mod:`testbed.kubernetes.watch`, and is then removed."""

from testbed.kubernetes.watch import Reflector, object_key

__all__ = ["Reflector", "object_key"]
