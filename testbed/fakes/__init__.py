"""Every fake server of the test bed, in one place: what real servers cannot be made to do.

:mod:`testbed.fakes.patroni` (fault-injecting Patroni members, a thread per connection),
:mod:`testbed.fakes.patroni_fast` (fast Patroni members for the benchmarks, one asyncio loop
in a process of their own), both answering with :mod:`testbed.fakes.patroni_wire`'s document;
:mod:`testbed.fakes.kubeapi` (a loopback kube-apiserver read API for the kubectl plugin).
"""
