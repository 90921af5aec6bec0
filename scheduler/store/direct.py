"""Direct connections: one synchronous psycopg connection, outside any pool.

For what runs before an event loop exists or without one, from the CLI, the dev
launcher and the test fixtures: the migrations (:mod:`.migrate`), the operator's
partition commands (:mod:`.partitions`) and tenant writes (:mod:`.tenants`). The node's
own statements go through the :class:`~.database.Store`'s pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from chronoshard.scheduler.errors import StoreUnavailable

CONNECT_TIMEOUT_S = 10


@contextmanager
def connect(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection; failing to reach the server is StoreUnavailable."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
    with conn:
        yield conn
