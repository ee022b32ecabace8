"""pg-failover-hook: a Metacontroller sync hook that keeps a Service on the Patroni leader."""
