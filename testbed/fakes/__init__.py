"""Every fake server of the test bed, in one place: what real servers cannot be made to do.

:mod:`testbed.fakes.patroni_model` says what a fake Patroni member answers, for each behaviour
and path (written once, no I/O); :mod:`testbed.fakes.patroni` plays it with fault-injecting
members of the tests (a thread per connection), :mod:`testbed.fakes.patroni_fast` with fast
members and fleets for the benchmarks (one asyncio loop in a process of their own, each
connection :mod:`testbed.fakes.patroni_async`'s), both with
:mod:`testbed.fakes.patroni_wire`'s document, head and sockets; :mod:`testbed.fakes.kubeapi`
(a loopback kube-apiserver read API for the kubectl plugin).
"""
