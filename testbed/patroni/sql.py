"""SQL on a member through psycopg2: one statement, or a query repeated until it returns rows."""

from __future__ import annotations

import importlib
from typing import Any

from testbed.patroni.layout import SUPERUSER, Member
from testbed.patroni.waiting import poll_until

Params = tuple[Any, ...] | dict[str, Any] | None


def dsn(m: Member, password: str, dbname: str = "postgres") -> str:
    """libpq connection string for the superuser on a member (TCP, password auth)."""
    return (
        f"host={m.ip} port={m.pg_port} dbname={dbname} user={SUPERUSER} "
        f"password={password} connect_timeout=5 application_name=devcluster"
    )


def execute(connect_to: str, sql: str, params: Params, timeout: float) -> list[tuple[Any, ...]]:
    """Run one statement (autocommit) through psycopg2; return the rows, if any.

    ``statement_timeout`` bounds the statement itself (a write to a primary that lost its
    replicas does not block: the harness uses asynchronous replication).
    """
    # Imported by name: psycopg2 ships no type information (types-psycopg2 is not a
    # project dependency), and the module object is typed Any this way on purpose.
    psycopg2: Any = importlib.import_module("psycopg2")
    conn = psycopg2.connect(connect_to, options=f"-c statement_timeout={int(timeout * 1000)}")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql, params)
            rows = cur.fetchall() if cur.description is not None else []
    finally:
        conn.close()
    return [tuple(r) for r in rows]


def wait_for_rows(
    connect_to: str, where: str, sql: str, params: Params, timeout: float, interval: float
) -> list[tuple[Any, ...]]:
    """Repeat a query until it returns rows (replication is asynchronous); return them.

    Errors count as "not yet": on a replica the table itself may not be replayed yet, and a
    member that is starting refuses connections for a moment.
    """
    last_error = ""

    def rows() -> list[tuple[Any, ...]] | None:
        nonlocal last_error
        try:
            return execute(connect_to, sql, params, timeout=2.0) or None
        except Exception as exc:  # psycopg2.Error, untyped
            last_error = f"{type(exc).__name__}: {exc}".strip()
            return None

    return poll_until(
        rows,
        timeout,
        interval=interval,
        what=f"rows from {sql!r} on {where}",
        details=lambda: f"last error: {last_error or 'none (no rows)'}",
    )
