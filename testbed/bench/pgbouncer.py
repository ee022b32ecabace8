"""PgBouncer (Debian's package) in the client namespace, pooling towards the primary ClusterIP.

The pooler sees only the ClusterIP: which member its server connections really reach is
decided by kube-proxy's DNAT when each one is opened, and stays so for the connection's life
(conntrack keeps an established connection's translation when the rules change). So its
settings decide how long it stays on a demoted member:

* ``debian``: PgBouncer's own defaults (``pool_mode = session``, ``server_lifetime = 3600``,
  ``server_login_retry = 15``, ``server_check_delay = 30`` with ``select 1``): what a pooler
  set up from the package does;
* ``checked``: transaction pooling, ``server_login_retry = 0.5`` and a server check before
  every reuse (``server_check_delay = 0``) whose query fails on a member in recovery, so a
  server connection left on a demoted member is closed at its next reuse instead of serving
  read-only errors until ``server_lifetime``.

PgBouncer refuses to run as root: it runs as the devcluster's unprivileged user (``setpriv``
execs it, so the process is PgBouncer's own). Clients authenticate with ``auth_type = any``
on the namespace's loopback only; PgBouncer logs in to PostgreSQL with the superuser's
password from its ``[databases]`` entry (SCRAM). Bounded start: it must accept a connection
within the timeout, else it is stopped and the error names its log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.netns import ClientNetns
from testbed.kubernetes.servers import Server
from testbed.patroni._runtime import cluster_user

#: A check that errors on a member in recovery: PgBouncer closes a server whose check fails.
CHECK_FAILS_ON_REPLICA = "select case when pg_is_in_recovery() then 1/0 else 1 end"
PROFILES: Mapping[str, Mapping[str, str]] = {
    "debian": {},
    "checked": {
        "pool_mode": "transaction",
        "server_login_retry": "0.5",
        "server_check_delay": "0",
        "server_check_query": CHECK_FAILS_ON_REPLICA,
    },
}


@dataclass(frozen=True)
class PgBouncer:
    profile: str
    port: int
    server: Server
    work: Path

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user=postgres"


def _config(profile: str, port: int, target: str, password: str, work: Path) -> str:
    settings = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "any",
        "logfile": str(work / "pgbouncer.log"),
        "pidfile": str(work / "pgbouncer.pid"),
        "max_client_conn": "100",
        "default_pool_size": "4",
        "ignore_startup_parameters": "extra_float_digits",
        **PROFILES[profile],
    }
    database = f"host={target} port=5432 dbname=postgres user=postgres password={password}"
    lines = ["[databases]", f"postgres = {database}", "", "[pgbouncer]"]
    lines += [f"{key} = {value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_pgbouncer(
    netns: ClientNetns,
    *,
    profile: str,
    port: int,
    target: str,
    password: str,
    timeout: float = 20.0,
) -> Iterator[PgBouncer]:
    """PgBouncer with ``profile`` on the namespace's ``127.0.0.1:port`` towards ``target``.

    Its files go to a folder of its own in the temporary directory, owned by the user it runs
    as (a run's folder may be one that user cannot enter); removed again on exit."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise ControlPlaneError("PgBouncer is missing: apt-get install -y pgbouncer (Debian)")
    user = cluster_user()
    work = Path(tempfile.mkdtemp(prefix=f"pgfh-pgbouncer-{profile}-"))
    config = work / "pgbouncer.ini"
    config.write_text(_config(profile, port, target, password, work))
    config.chmod(0o600)
    for path in (work, config):
        os.chown(path, user.uid, user.gid)
    drop = [
        "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--",
    ]  # fmt: skip
    server = Server(
        f"pgbouncer-{profile}",
        netns.command(*(drop if user.drop else []), binary, str(config)),
        work / "pgbouncer.stdout.log",
    )
    server.start()
    try:
        try:
            server.wait_until(lambda: netns.tcp_refusal(port), timeout, f"accepting on port {port}")
        except ControlPlaneError as error:  # its own log says why (stdout holds little)
            raise ControlPlaneError(f"{error}; see {work / 'pgbouncer.log'}") from None
        yield PgBouncer(profile, port, server, work)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
