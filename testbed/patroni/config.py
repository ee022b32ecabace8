"""Each member's ``patroni.yml``: the timing profile, the DCS (etcd, or Patroni's Kubernetes DCS),
PostgreSQL and its authentication.

Pure: everything it renders comes in as arguments, so a test can read a member's config without
starting anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.patroni import tls
from testbed.patroni.layout import (
    ETCD_CLIENT_PORT,
    NAMESPACE,
    REPLICATION_USER,
    SUPERUSER,
    Member,
    RestApiTLS,
)


def patroni_config(
    m: Member,
    *,
    scope: str,
    ttl: int,
    loop_wait: int,
    retry_timeout: int,
    etcd_host: str,
    pg_bin_dir: Path,
    superuser_password: str,
    replication_password: str,
    fsync: bool,
    restapi_tls: RestApiTLS | None,
    tls_dir: Path,
    kubernetes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``patroni.yml`` of member ``m`` (as a dict; written as YAML).

    ``kubernetes``: the ``kubernetes:`` section in place of ``etcd3:`` (the rest of that
    section comes from the member's environment, :mod:`testbed.patroni.kubernetes_dcs`). Then
    there is no top-level ``namespace``: Patroni's ``get_dcs`` copies it over the DCS
    section's own (``patroni/dcs/__init__.py``), so ``/service/`` would silently replace
    ``PATRONI_KUBERNETES_NAMESPACE`` and every API call would go to
    ``/api/v1/namespaces//service//...``.
    """
    dcs: dict[str, Any] = (
        {"etcd3": {"hosts": [f"{etcd_host}:{ETCD_CLIENT_PORT}"]}}
        if kubernetes is None
        else {"kubernetes": kubernetes}
    )
    return {
        "scope": scope,
        **({"namespace": NAMESPACE} if kubernetes is None else {}),
        "name": m.name,
        "log": {"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
        "restapi": {
            "listen": f"{m.ip}:{m.api_port}",
            "connect_address": f"{m.ip}:{m.api_port}",
            **tls.restapi_config(restapi_tls, tls_dir),
        },
        **tls.ctl_config(restapi_tls, tls_dir),
        **dcs,
        "bootstrap": {
            "dcs": {
                "ttl": ttl,
                "loop_wait": loop_wait,
                "retry_timeout": retry_timeout,
                "maximum_lag_on_failover": 16 * 1024 * 1024,
                "postgresql": {
                    # A killed primary diverges from the new timeline; rewind it back.
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_connections": 50,
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "wal_keep_size": "64MB",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "data-checksums"],
        },
        "postgresql": {
            "listen": f"{m.ip}:{m.pg_port}",
            "connect_address": f"{m.ip}:{m.pg_port}",
            "data_dir": str(m.data_dir),
            "bin_dir": str(pg_bin_dir),
            "pgpass": str(m.dir / "pgpass"),
            "use_unix_socket": True,
            "authentication": {
                "superuser": {"username": SUPERUSER, "password": superuser_password},
                "replication": {
                    "username": REPLICATION_USER,
                    "password": replication_password,
                },
            },
            "parameters": {
                "unix_socket_directories": str(m.socket_dir),
                "shared_buffers": "32MB",
                "fsync": "on" if fsync else "off",
                "logging_collector": "on",
                "log_directory": str(m.logs_dir),
                "log_filename": f"{m.name}.postgresql.log",
                "log_line_prefix": "%m [%p] %q%u@%d ",
            },
            "pg_hba": [
                "local all all trust",
                "local replication all trust",
                "host all all 127.0.0.0/8 scram-sha-256",
                f"host replication {REPLICATION_USER} 127.0.0.0/8 scram-sha-256",
            ],
            "basebackup": [{"checkpoint": "fast"}],
            # If rewinding fails (or timelines diverged) rebuild from the leader instead of
            # leaving the member broken: rejoining must be reliable, the data is a copy.
            "remove_data_directory_on_rewind_failure": True,
            "remove_data_directory_on_diverged_timelines": True,
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }
