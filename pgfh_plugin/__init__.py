"""``kubectl pgfh``: a kubectl plugin that shows and checks PostgreSQLClusters.

It is installed as the executable ``kubectl-pgfh`` (``[project.scripts]``); kubectl runs any
``kubectl-<name>`` on the ``PATH`` as ``kubectl <name>``. It is a read-only client of the
Kubernetes API (the ``kubernetes`` library, the user's kubeconfig and RBAC) and never talks
to Patroni or to the hook.

- :mod:`pgfh_plugin.kube`: the only I/O, reads through the Kubernetes API, turns API errors
  into one plain sentence;
- :mod:`pgfh_plugin.report`: pure, the status report of one cluster as plain data (``-o json``);
- :mod:`pgfh_plugin.render`: pure, that report as text;
- :mod:`pgfh_plugin.style`: pure, whether to colour a stream, and the colours;
- :mod:`pgfh_plugin.checks`: pure, the checks an operator would otherwise do by hand;
- :mod:`pgfh_plugin.cli`: the command line.
"""
