"""A development stand-in for Metacontroller: NOT for production (run real Metacontroller).

:mod:`standin.apply` models what Metacontroller v4.17 does with a hook reply;
:mod:`standin.loop` drives a hook over HTTP with that model, for tests, the demo and
the benchmarks.
"""
