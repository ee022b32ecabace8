"""The cluster's topology and one member's layout: addresses, ports, users, files, processes.

Fixed by the project, it plays a Kubernetes StatefulSet ``pg-orders``: members ``pg-orders-0..2``
on 127.0.0.2-4, PostgreSQL on 5432 and the Patroni REST API on 8008 of each address, one etcd on
127.0.0.1:2379 (see :mod:`testbed.patroni.cluster`).
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from testbed.patroni import _http
from testbed.patroni._proc import Proc, postmaster_pid

SCOPE = "pg-orders"
NAMESPACE = "/service/"
FIRST_MEMBER_IP = 2  # pg-orders-0 is 127.0.0.2, like a pod IP
PG_PORT = 5432
API_PORT = 8008
ETCD_HOST = "127.0.0.1"
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
SUPERUSER = "postgres"
REPLICATION_USER = "replicator"


@dataclass(frozen=True)
class RestApiTLS:
    """HTTPS for every member's REST API: Patroni's ``restapi`` TLS settings.

    The files are copied into the run's base dir (the cluster user must read them). The
    server certificate must name every member's address (127.0.0.x) as an IP SAN.
    ``client_certfile``/``client_keyfile`` are what the members present to each other
    (``ctl.certfile``, needed with ``verify_client: required``) and what the harness's own
    requests present.
    """

    certfile: Path
    keyfile: Path
    cafile: Path
    client_certfile: Path
    client_keyfile: Path
    verify_client: str = "required"


@dataclass
class Member:
    """One Patroni member: static layout plus the live process handles."""

    name: str
    ip: str
    dir: Path
    logs_dir: Path
    pg_port: int = PG_PORT
    api_port: int = API_PORT
    #: The harness's HTTPS client context when the REST API uses TLS (``None``: HTTP).
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _patroni: Proc | None = field(default=None, repr=False)

    @property
    def api_url(self) -> str:
        """``http://127.0.0.x:8008`` — Patroni's REST API, what a prober would use."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.ip}:{self.api_port}"

    def api_get(self, path: str, timeout: float) -> _http.Response:
        """``GET`` on this member's REST API (over HTTPS with a client certificate if TLS)."""
        return _http.get(self.ip, self.api_port, path, timeout=timeout, tls=self.tls)

    @property
    def data_dir(self) -> Path:
        """PGDATA (created 0700 by initdb / pg_basebackup, owned by the cluster user)."""
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        """This member's own ``unix_socket_directories`` (all members share port 5432)."""
        return self.dir / "sock"

    @property
    def config_file(self) -> Path:
        """The member's ``patroni.yml``."""
        return self.dir / "patroni.yml"

    @property
    def patroni_log(self) -> Path:
        """Patroni's stdout/stderr (also bootstrap, initdb and early postmaster output)."""
        return self.logs_dir / f"{self.name}.patroni.log"

    @property
    def postgres_log(self) -> Path:
        """PostgreSQL's own log (``logging_collector``)."""
        return self.logs_dir / f"{self.name}.postgresql.log"

    @property
    def patroni_pid(self) -> int | None:
        """PID of the running Patroni process, if any."""
        return self._patroni.pid if self._patroni is not None and self._patroni.alive() else None

    @property
    def postmaster(self) -> Proc | None:
        """The running postmaster (from ``postmaster.pid``), if any."""
        return postmaster_pid(self.data_dir)

    @property
    def postmaster_pid(self) -> int | None:
        """PID of the running postmaster, if any."""
        proc = self.postmaster
        return proc.pid if proc is not None else None

    @property
    def running(self) -> bool:
        """Whether this member's Patroni process is alive (PostgreSQL may still be starting)."""
        return self.patroni_pid is not None

    def pids(self) -> dict[str, int]:
        """``{"patroni": pid, "postmaster": pid}`` for what is running now."""
        found = {"patroni": self.patroni_pid, "postmaster": self.postmaster_pid}
        return {k: v for k, v in found.items() if v is not None}
