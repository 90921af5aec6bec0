"""Which replica is active: a PostgreSQL session-level advisory lock.

Every replica keeps one dedicated connection and asks ``pg_try_advisory_lock(key)`` every
``retry_interval_s``; the one that gets it is the leader *for as long as that session
lives*, and does all its work on that same connection (:mod:`.store`). When the leader
process dies or its connection breaks, PostgreSQL ends the session, the lock goes with
it, and a standby's next try wins: handover within about one retry interval. No lease to
renew and no extra service: the database the watchdog needs anyway is the arbiter.

The leader checks its session every retry interval; a failed check ends its term at
once (its loops are cancelled and the connection closed). Because the leader writes only
through the session that holds the lock, a deposed leader cannot write anything after
the lock was released. A leader whose host vanishes (power, network) is noticed by the
server's TCP keepalives, which the session sets to about 11 s, and its lock released.
What an advisory lock cannot do is depose a leader whose process is frozen (SIGSTOP, a
VM pause) while its kernel keeps the connection up: the standby waits until it is killed
or resumes.

Every successful round-trip, on either side, is recorded in :class:`Contact`: how long
this replica has been without its database is what the outage alert is about.

``mechanism = "none"`` skips the lock: the single replica is always the leader.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import psycopg

from chronoshard.clock import Clock
from chronoshard.watchdog.config import WatchdogConfig
from chronoshard.watchdog.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[Any]

# TCP keepalives, ~idle + interval * count = 11 s, on both ends: libpq's (this replica
# notices a vanished server) and the server's for this session (PostgreSQL notices a
# vanished replica and releases its lock).
_KEEPALIVE_GUCS = (
    ("tcp_keepalives_idle", "5"),
    ("tcp_keepalives_interval", "2"),
    ("tcp_keepalives_count", "3"),
)
_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}


def lock_key(name: str) -> int:
    """The advisory lock key for ``name``: a stable signed 64-bit hash (never ``hash()``)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class Contact:
    """When this replica last heard from its database (monotonic clock)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # Counting from start: a database that is unreachable from the beginning is an
        # outage too, not a state without an age.
        self._last = clock.monotonic()
        self.up = False

    def touch(self) -> None:
        self._last = self._clock.monotonic()
        self.up = True

    def lost(self) -> None:
        self.up = False

    def seconds_since(self) -> float:
        return max(0.0, self._clock.monotonic() - self._last)


class Election:
    def __init__(self, config: WatchdogConfig, contact: Contact) -> None:
        self._config = config
        self._contact = contact
        self._key = lock_key(config.election.lock_name)
        self._interval_s = config.election.retry_interval_s
        self._use_lock = config.election.mechanism == "advisory_lock"
        self.attempts = 0
        self.terms = 0

    async def connect(self) -> Connection:
        """A fresh session: autocommit, UTC, the statement timeout, keepalives.

        Raises:
            DatabaseUnavailable: it could not be opened within the connect timeout.
        """
        db = self._config.database
        try:
            async with asyncio.timeout(db.connect_timeout_s + 1):
                conn = await psycopg.AsyncConnection.connect(
                    db.dsn,
                    autocommit=True,
                    connect_timeout=max(1, round(db.connect_timeout_s)),
                    application_name=f"chronoshard-watchdog {self._config.node_id}"[:63],
                    **_KEEPALIVES,
                )
                await conn.execute("SET TIME ZONE 'UTC'")
                settings = [
                    ("statement_timeout", f"{int(db.statement_timeout_s * 1000)}ms"),
                    *_KEEPALIVE_GUCS,
                ]
                for name, value in settings:
                    await conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        except TimeoutError as exc:
            raise DatabaseUnavailable("connecting timed out") from exc
        except psycopg.Error as exc:
            raise DatabaseUnavailable(str(exc) or type(exc).__name__) from exc
        self._contact.touch()
        return conn

    async def acquire(self) -> Connection:
        """Wait until this replica leads; the session that holds the lock."""
        conn: Connection | None = None
        try:
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = await self.connect()
                    if await self._try_lock(conn):
                        self.terms += 1
                        leader, conn = conn, None
                        return leader
                except DatabaseUnavailable as exc:
                    self._contact.lost()
                    log.warning("watchdog database unreachable", extra={"error": str(exc)})
                    if conn is not None:
                        await close_quietly(conn)
                    conn = None
                await asyncio.sleep(self._interval_s)
        finally:
            if conn is not None:  # cancelled while standing by
                await close_quietly(conn)

    async def _try_lock(self, conn: Connection) -> bool:
        if not self._use_lock:
            return True
        self.attempts += 1
        try:
            async with asyncio.timeout(self._config.database.statement_timeout_s):
                cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,))
                row = await cur.fetchone()
        except TimeoutError as exc:
            raise DatabaseUnavailable("lock attempt timed out") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise DatabaseUnavailable(str(exc) or type(exc).__name__) from exc
        self._contact.touch()
        return bool(row and row[0])

    @property
    def interval_s(self) -> float:
        return self._interval_s


async def close_quietly(conn: Connection) -> None:
    """Close a session that may already be broken; its advisory lock goes with it."""
    try:
        async with asyncio.timeout(2):
            await conn.close()
    except Exception as exc:  # it is going away either way
        log.debug("closing the session failed", extra={"error": repr(exc)})
