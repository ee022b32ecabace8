"""HAProxy (Debian's) in the client namespace with Patroni's reference health checks: the routing
that Service-less Patroni installations use, measured side by side with the ClusterIP.

The configuration is Patroni's documented one (``haproxy.cfg`` in Patroni's repository): TCP
mode, ``option httpchk OPTIONS /primary``, ``http-check expect status 200``, every member a
server with ``check port 8008`` and ``default-server inter 3s fall 3 rise 2 on-marked-down
shutdown-sessions``. Its members are the Pod IPs (``198.18.0.N``), reached over the namespace's
veth like kube-proxy's endpoints. HAProxy runs in the foreground (``-db``) so the process is
its own; bounded start: it must accept a connection within the timeout.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.netns import ClientNetns
from testbed.kubernetes.servers import Server


@dataclass(frozen=True)
class HAProxy:
    port: int
    server: Server

    def dsn(self, password: str) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=postgres user=postgres password={password}"


def _config(port: int, members: Sequence[tuple[str, str]]) -> str:
    servers = "\n".join(
        f"    server {name} {address}:5432 maxconn 100 check port 8008" for name, address in members
    )
    return f"""global
    maxconn 200

defaults
    mode tcp
    retries 2
    timeout client 30m
    timeout connect 4s
    timeout server 30m
    timeout check 5s

listen primary
    bind 127.0.0.1:{port}
    option httpchk OPTIONS /primary
    http-check expect status 200
    default-server inter 3s fall 3 rise 2 on-marked-down shutdown-sessions
{servers}
"""


@contextlib.contextmanager
def running_haproxy(
    netns: ClientNetns, members: Sequence[tuple[str, str]], *, port: int, timeout: float = 20.0
) -> Iterator[HAProxy]:
    """HAProxy on the namespace's ``127.0.0.1:port``; ``members`` are (name, Pod IP)."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(binary).exists():
        raise ControlPlaneError("HAProxy is missing: apt-get install -y haproxy (Debian)")
    work = Path(tempfile.mkdtemp(prefix="pgfh-haproxy-"))
    config = work / "haproxy.cfg"
    config.write_text(_config(port, members))
    server = Server(
        "haproxy", netns.command(binary, "-db", "-f", str(config)), work / "haproxy.log"
    )
    server.start()
    try:
        server.wait_until(lambda: netns.tcp_refusal(port), timeout, f"accepting on port {port}")
        yield HAProxy(port, server)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
