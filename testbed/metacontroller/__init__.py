"""A development stand-in for Metacontroller: NOT for production (run real Metacontroller).

:mod:`testbed.metacontroller.apply` models what Metacontroller v4.17 does with a hook reply;
:mod:`testbed.metacontroller.loop` drives a hook over HTTP with that model, for tests, the demo and
the benchmarks.
"""
