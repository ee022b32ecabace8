"""A PostgreSQL client that writes one row at a time and says what became of each write.

Run as its own process inside the client network namespace (``ip netns exec``), so that its
connections go through kube-proxy's rules for the primary Service's ClusterIP (or through a
pooler in the same namespace). It is libpq through psycopg2, the driver the devcluster itself
uses: what an application sees, not what the harness assumes.

Every ``--interval`` seconds it runs one transaction::

    SET LOCAL statement_timeout = ...; SELECT inet_server_addr(), pg_is_in_recovery();
    INSERT INTO pgfh_client_writes (writer, seq) VALUES (...); COMMIT

and prints one JSON line: the monotonic start and end of the attempt (CLOCK_MONOTONIC is the
machine's, so the benchmark compares them with its own events), the outcome and the member
that answered (``inet_server_addr()``: the member's own ``127.0.0.N`` behind the DNAT).

Outcomes: ``ok`` (committed), ``read_only`` (SQLSTATE 25006: the write reached a member in
recovery), ``connect`` (no connection: refused, rejected for want of endpoints, shutting
down, or refused by ``target_session_attrs``), ``lost`` (the connection broke under the
transaction), ``error`` (anything else, with its SQLSTATE).

Connection policies, as applications have them:

* ``new``: a fresh connection for every write (what a new client, or a pool's new connection,
  sees of the routing at that moment);
* ``kept``: one connection, opened again only when it breaks; a read-only error leaves it
  where it is (most pools: 25006 is not a connection error);
* ``kept-rw``: the same, but it connects with ``target_session_attrs=read-write`` (libpq
  refuses a server in recovery at connect) and drops the connection on a read-only error.

Bounded: libpq's ``connect_timeout`` and ``tcp_user_timeout``, a statement timeout, and
``--duration`` for the whole run; SIGTERM ends it after the current attempt.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import signal
import sys
import time
from typing import Any

POLICIES = ("new", "kept", "kept-rw")
TABLE = "pgfh_client_writes"
CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (writer text, seq bigint, at timestamptz DEFAULT now())"
)
READ_ONLY = "25006"
#: SQLSTATE classes of a connection that is gone: 08 connection exception, 57P admin shutdown.
LOST_PREFIXES = ("08", "57P")


def _connect_args(dsn: str, policy: str, name: str, timeout: float) -> str:
    extra = f" application_name={name} connect_timeout={max(1, round(timeout))}"
    extra += f" tcp_user_timeout={int(timeout * 1000)} keepalives=1 keepalives_idle=1"
    extra += " keepalives_interval=1 keepalives_count=2"
    if policy == "kept-rw":
        extra += " target_session_attrs=read-write"
    return dsn + extra


class Writer:
    def __init__(self, name: str, dsn: str, policy: str, timeout: float) -> None:
        self.name = name
        self.policy = policy
        self.timeout = timeout
        self.dsn = _connect_args(dsn, policy, name, timeout)
        self.psycopg2: Any = importlib.import_module("psycopg2")
        self.conn: Any = None
        self.seq = 0

    def close(self) -> None:
        if self.conn is not None:
            # psycopg2.Error, untyped: a broken connection may not close cleanly
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None

    def attempt(self) -> dict[str, Any]:
        self.seq += 1
        started = time.monotonic()
        record: dict[str, Any] = {"w": self.name, "seq": self.seq, "t0": started}
        if self.conn is None:
            try:
                self.conn = self.psycopg2.connect(self.dsn)
                record["new_conn"] = True
            except self.psycopg2.Error as error:
                self.conn = None
                return {**record, "t1": time.monotonic(), "out": "connect", "detail": _line(error)}
        server = None
        try:
            with self.conn.cursor() as cur:
                cur.execute(
                    f"SET LOCAL statement_timeout = {int(self.timeout * 1000)}; "
                    "SELECT host(inet_server_addr()), pg_is_in_recovery()"
                )
                server, in_recovery = cur.fetchone()
                record["server"] = server
                record["recovery"] = in_recovery
                cur.execute(
                    f"INSERT INTO {TABLE} (writer, seq) VALUES (%s, %s)", (self.name, self.seq)
                )
            self.conn.commit()
            outcome, detail = "ok", ""
        except self.psycopg2.Error as error:
            code = getattr(error, "pgcode", None) or ""
            detail = _line(error)
            if code == READ_ONLY:
                outcome = "read_only"
            elif isinstance(
                error, (self.psycopg2.OperationalError, self.psycopg2.InterfaceError)
            ) or code.startswith(LOST_PREFIXES):
                outcome = "lost"
            else:
                outcome = "error"
            record["code"] = code
            if outcome == "lost" or (outcome == "read_only" and self.policy == "kept-rw"):
                self.close()
            else:
                try:
                    self.conn.rollback()
                except self.psycopg2.Error:
                    self.close()
        if self.policy == "new":
            self.close()
        return {
            **record,
            "t1": time.monotonic(),
            "out": outcome,
            "detail": detail,
            "server": server,
        }


def _line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument(
        "--dsn", required=True, help="libpq keywords: host, port, dbname, user, password"
    )
    parser.add_argument("--policy", choices=POLICIES, default="new")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument(
        "--timeout", type=float, default=2.0, help="connect and statement bound (s)"
    )
    parser.add_argument("--duration", type=float, default=3600.0, help="the whole run's bound (s)")
    args = parser.parse_args(argv)
    stop = {"now": False}

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    writer = Writer(args.name, args.dsn, args.policy, args.timeout)
    end = time.monotonic() + args.duration
    next_at = time.monotonic()
    try:
        while not stop["now"] and time.monotonic() < end:
            record = writer.attempt()
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()
            next_at = max(next_at + args.interval, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))
    except BrokenPipeError:
        return 0
    finally:
        writer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
