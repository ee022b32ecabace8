"""The test suite: test modules named by feature, and one layer of support beside them.

A test module is ``test_<feature>.py`` (pure logic with plain dicts), ``_contract`` (the
real Flask app, replies applied by the Metacontroller stand-in) or ``_patroni`` (the real
devcluster). Whatever two of them, or a test and a benchmark, need is defined once in a
support module here, never in a test module another one imports:

* ``helpers.py``: recorded requests, plain-dict builders (Pods, Services, sync bodies),
  member answers, :class:`~tests.helpers.FakeProber`, ``NOW``/``TIMING`` and the pipeline
  without HTTP (``run``, ``fed_back``);
* ``child_helpers.py``: requests and observed children with the read-only Service and
  backup CronJob groups; ``contract_helpers.py``: a stand-in world, one sync, ``settle``;
* ``doubts.py``: the cases where routing cannot be confirmed, for every child part;
* ``manifest_helpers.py``: rendering and checking what a cluster admin applies;
* ``import_contracts.py``: import-linter on a scratch copy, to show that a contract bites;
* the fake servers (fault-injecting Patroni members, a loopback kube-apiserver for the
  plugin) and the throw-away CAs are test bed, not tests: ``testbed/fakes/`` and
  ``testbed/certs.py``, beside the real clusters they stand in for;
* ``patroni_fixtures.py`` (loaded by ``conftest.py``): the real cluster, the hook under
  gunicorn, the ``rig`` and the invariants every real-cluster run must keep.
"""
