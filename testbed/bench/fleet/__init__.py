"""The fleet benchmarks: N Patroni clusters behind Metacontroller's work queue.

Three entry points, each ``python -m testbed.bench.fleet.<name>``:

* :mod:`~testbed.bench.fleet.table`: the fleet table, real hook pods beside the model of them,
  then the modelled rows (today's settings, the shipped ones, docs/scale.md's);
* :mod:`~testbed.bench.fleet.resync`: what ``resyncPeriodSeconds`` costs and buys (modelled);
* :mod:`~testbed.bench.fleet.on_kube`: the fleet on the real control plane, driven by the
  stand-in or a real Metacontroller binary (the model's calibration).

Their parts: :mod:`~testbed.bench.fleet.settings` (inputs and presets, pure),
:mod:`~testbed.bench.fleet.virtual_queue` (the virtual clock and client-go's work queue and token
bucket on it), :mod:`~testbed.bench.fleet.model` (the fleet on Metacontroller's queue) and
:mod:`~testbed.bench.fleet.real_hook` (real hook pods, and the calibration of the modelled hook).
"""
