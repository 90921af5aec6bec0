"""The task commit protocol: a handler's side effect happens once, while its attempt holds
its lease.

The scheduler fences what goes through it (a stale token's settlement is refused), but a
handler's writes to *other* systems are its own. Two attempts of one task may run (an
idempotent task after a lost lease, an operator's retry of an unknown outcome), and an
attempt may go on after its worker fenced itself (a thread cannot be stopped). The
helpers here make the effect itself safe:

:class:`PostgresEffects` (psycopg 3)
    The effect and an *effect row* keyed by the task id (recording the fencing token and
    the result) commit in one transaction of the user's database. An attempt that finds
    the row committed does not redo the effect: it gets the stored result back
    (``Effect.replayed``). Concurrent attempts serialize on the row's unique key (the
    second waits for the first to commit or roll back). The transaction is bounded by what
    is left of the lease: ``statement_timeout``, ``lock_timeout`` and
    ``idle_in_transaction_session_timeout`` are set to it (the last once more right
    before the commit), so a write cannot land long after the worker fenced itself even if
    the process is paused mid-transaction: PostgreSQL ends the session instead.

:func:`publish_file`
    Writes to a staging file beside the target, fsyncs it, and publishes it with an atomic
    ``link`` only while the attempt holds its lease; ``link`` never replaces an existing
    file, so the first attempt to publish wins and a later one finds the target there
    (``Published.replayed``). Files have no server to cut a paused writer off: the lease is
    checked immediately before the link, and the link itself never overwrites.

Both refuse (:class:`~chronoshard.worker.LeaseLost`) once the attempt may no longer write:
its lease lapsed with no renewal from any node, its token was revoked, or the SDK gave the
attempt up (``ctx.check_lease()``). The statements and the file names are built by the
pure functions below; the shells only run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, TypeVar, cast

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from chronoshard.worker._context import TaskContext, encode_json
from chronoshard.worker._errors import LeaseLost

__all__ = [
    "DEFAULT_EFFECTS_TABLE",
    "Effect",
    "PostgresEffects",
    "Published",
    "publish_file",
    "publish_file_async",
]

T = TypeVar("T")

DEFAULT_EFFECTS_TABLE = "chronoshard_effects"


# ---- the pure parts ------------------------------------------------------------------


def lease_budget_ms(ctx: TaskContext) -> int | None:
    """What is left of the attempt's lease, in whole milliseconds (None: no lease known).

    Raises:
        LeaseLost: nothing is left (less than a millisecond: PostgreSQL reads a timeout
            of 0 as "no timeout").
    """
    ctx.check_lease()
    remaining_s = ctx.lease_remaining_s
    if remaining_s is None:
        return None
    budget_ms = int(remaining_s * 1000)
    if budget_ms < 1:
        raise LeaseLost(f"task {ctx.task_id}: the lease runs out before a write could land")
    return budget_ms


@dataclass(frozen=True)
class EffectStatements:
    """The statements of :class:`PostgresEffects` for one table."""

    create: sql.Composed
    bound: sql.SQL
    claim: sql.Composed
    stored: sql.Composed
    record: sql.Composed


def effect_statements(table: str) -> EffectStatements:
    """The effect table's statements; ``table`` may be schema-qualified (``billing.effects``)."""
    parts = table.split(".")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ValueError(f"effects table must be 'name' or 'schema.name', got {table!r}")
    name = sql.Identifier(*parts)
    return EffectStatements(
        create=sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " task_id uuid PRIMARY KEY,"
            " fencing_token bigint NOT NULL,"
            " worker_id text NOT NULL,"
            " result jsonb,"
            " committed_at timestamptz NOT NULL DEFAULT now())"
        ).format(name),
        # Transaction-local (set_config(..., true)): the connection is left as it was.
        bound=sql.SQL(
            "SELECT set_config('statement_timeout', %(ms)s, true),"
            " set_config('lock_timeout', %(ms)s, true),"
            " set_config('idle_in_transaction_session_timeout', %(ms)s, true)"
        ),
        # Serializes attempts: a second INSERT of the same task id waits until the first
        # commits (then DO NOTHING) or rolls back (then it inserts).
        claim=sql.SQL(
            "INSERT INTO {} (task_id, fencing_token, worker_id)"
            " VALUES (%(task_id)s, %(token)s, %(worker_id)s)"
            " ON CONFLICT (task_id) DO NOTHING RETURNING fencing_token"
        ).format(name),
        stored=sql.SQL("SELECT fencing_token, result FROM {} WHERE task_id = %(task_id)s").format(
            name
        ),
        record=sql.SQL(
            "UPDATE {} SET result = %(result)s::jsonb, committed_at = now()"
            " WHERE task_id = %(task_id)s AND fencing_token = %(token)s"
        ).format(name),
    )


@dataclass(frozen=True)
class Effect(Generic[T]):
    """What :meth:`PostgresEffects.once` did."""

    result: T
    """The effect function's return value, or (replayed) the one stored by the attempt
    that did it, as JSON decodes it."""
    fencing_token: int
    """The token of the attempt that did the effect."""
    replayed: bool
    """True: an earlier attempt did it and this one did nothing."""


def _ids(ctx: TaskContext) -> dict[str, Any]:
    return {"task_id": ctx.task_id, "token": ctx.fencing_token, "worker_id": ctx.worker_id}


_LEASE_TIMEOUTS = (
    psycopg.errors.QueryCanceled,  # statement_timeout
    psycopg.errors.LockNotAvailable,  # lock_timeout
    psycopg.errors.IdleInTransactionSessionTimeout,  # the writer stopped mid-transaction
)


def _translate_timeout(ctx: TaskContext, exc: psycopg.Error) -> None:
    """A timeout set from the lease fired and the lease is gone: the transaction was
    rolled back (or its session ended), nothing of it committed."""
    if isinstance(exc, _LEASE_TIMEOUTS) and not ctx.holds_lease:
        raise LeaseLost(
            f"task {ctx.task_id}: the lease ran out during the write; rolled back"
        ) from exc


def _require_idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError(
            "the effect commits with its effect row in a transaction of its own: pass a "
            "connection that is not inside a transaction"
        )


# ---- PostgreSQL ----------------------------------------------------------------------


class PostgresEffects:
    """Exactly-once effects in a PostgreSQL database (psycopg 3), one row per task.

    ::

        effects = PostgresEffects("billing_effects")

        @worker.task("charge")
        async def charge(ctx: TaskContext) -> dict:
            async with await psycopg.AsyncConnection.connect(DSN) as conn:
                done = await effects.once(conn, ctx, lambda c: record_charge(c, ctx.payload))
            return {"charge_id": done.result, "replayed": done.replayed}

    The effect function gets the connection, inside the transaction; it must not commit.
    Its return value must be JSON (it is stored and handed to a later attempt).
    """

    def __init__(self, table: str = DEFAULT_EFFECTS_TABLE) -> None:
        self.table = table
        self._q = effect_statements(table)

    # ---- async -------------------------------------------------------------------

    async def create_table(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Create the effect table if it does not exist (commits on an autocommit
        connection; otherwise the caller commits)."""
        await conn.execute(self._q.create)

    async def once(
        self,
        conn: psycopg.AsyncConnection[Any],
        ctx: TaskContext,
        effect: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
    ) -> Effect[T]:
        """Run ``effect(conn)`` and record it, in one transaction, unless an attempt of
        this task already did: then return what it stored.

        Raises:
            LeaseLost: the attempt may not write, or its lease ran out during the
                transaction (rolled back).
            ValueError: ``conn`` is inside a transaction.
            TypeError: the effect's result is not JSON (rolled back).
        """
        _require_idle(conn)
        budget_ms = lease_budget_ms(ctx)
        try:
            async with conn.transaction():
                if budget_ms is not None:
                    await conn.execute(self._q.bound, {"ms": str(budget_ms)})
                cur = await conn.execute(self._q.claim, _ids(ctx))
                if await cur.fetchone() is None:
                    cur = await conn.execute(self._q.stored, _ids(ctx))
                    token, stored = await cur.fetchone() or (ctx.fencing_token, None)
                    # What an earlier attempt's effect returned, through JSON.
                    return Effect(cast(T, stored), token, replayed=True)
                value = await effect(conn)
                result = encode_json(value).decode()
                await conn.execute(self._q.record, {**_ids(ctx), "result": result})
                # The last word before the commit: still ours, and a pause from here to
                # the commit is cut off by the server within what is left.
                budget_ms = lease_budget_ms(ctx)
                if budget_ms is not None:
                    await conn.execute(self._q.bound, {"ms": str(budget_ms)})
        except psycopg.Error as exc:
            _translate_timeout(ctx, exc)
            raise
        return Effect(value, ctx.fencing_token, replayed=False)

    async def lookup(
        self, conn: psycopg.AsyncConnection[Any], task_id: uuid.UUID
    ) -> Effect[Any] | None:
        """The committed effect of ``task_id``, if any (for an operator deciding an
        OUTCOME_UNKNOWN task: was the effect done?)."""
        cur = await conn.execute(self._q.stored, {"task_id": task_id})
        row = await cur.fetchone()
        return None if row is None else Effect(row[1], row[0], replayed=True)

    # ---- sync (handlers that run in a thread) ------------------------------------

    def create_table_sync(self, conn: psycopg.Connection[Any]) -> None:
        """:meth:`create_table` for a blocking connection."""
        conn.execute(self._q.create)

    def once_sync(
        self,
        conn: psycopg.Connection[Any],
        ctx: TaskContext,
        effect: Callable[[psycopg.Connection[Any]], T],
    ) -> Effect[T]:
        """:meth:`once` for a blocking connection (a ``def`` handler)."""
        _require_idle(conn)
        budget_ms = lease_budget_ms(ctx)
        try:
            with conn.transaction():
                if budget_ms is not None:
                    conn.execute(self._q.bound, {"ms": str(budget_ms)})
                if conn.execute(self._q.claim, _ids(ctx)).fetchone() is None:
                    row = conn.execute(self._q.stored, _ids(ctx)).fetchone()
                    token, stored = row or (ctx.fencing_token, None)
                    # What an earlier attempt's effect returned, through JSON.
                    return Effect(cast(T, stored), token, replayed=True)
                value = effect(conn)
                result = encode_json(value).decode()
                conn.execute(self._q.record, {**_ids(ctx), "result": result})
                budget_ms = lease_budget_ms(ctx)
                if budget_ms is not None:
                    conn.execute(self._q.bound, {"ms": str(budget_ms)})
        except psycopg.Error as exc:
            _translate_timeout(ctx, exc)
            raise
        return Effect(value, ctx.fencing_token, replayed=False)

    def lookup_sync(self, conn: psycopg.Connection[Any], task_id: uuid.UUID) -> Effect[Any] | None:
        """:meth:`lookup` for a blocking connection."""
        row = conn.execute(self._q.stored, {"task_id": task_id}).fetchone()
        return None if row is None else Effect(row[1], row[0], replayed=True)


# ---- files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """What :func:`publish_file` did."""

    path: Path
    replayed: bool
    """True: the target was already there (an earlier attempt published it)."""


STAGING_SUFFIX = ".staging"


def staging_path(target: Path, task_id: uuid.UUID, token: int) -> Path:
    """Where an attempt writes before it publishes: beside the target (same directory,
    so the same file system: ``link`` is atomic there), hidden, one per attempt."""
    return target.with_name(f".{target.name}.{task_id}.{token}{STAGING_SUFFIX}")


def stale_stagings(target: Path, task_id: uuid.UUID, token: int, names: list[str]) -> list[str]:
    """Of ``names`` (a directory listing), the staging files earlier attempts of the task
    left behind (killed before they published)."""
    prefix = f".{target.name}.{task_id}."
    found = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(STAGING_SUFFIX)):
            continue
        middle = name[len(prefix) : -len(STAGING_SUFFIX)]
        if middle.isdigit() and int(middle) < token:
            found.append(name)
    return found


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_file(
    ctx: TaskContext, target: str | os.PathLike[str], write: Callable[[IO[bytes]], object]
) -> Published:
    """Publish ``target`` once: ``write(f)`` fills a staging file beside it, which is
    fsynced and then linked to ``target`` atomically, only while the attempt holds its
    lease. A target already there (an earlier attempt published it) is left alone and
    ``write`` is not called.

    Blocking (call it from a ``def`` handler, or use :func:`publish_file_async`).

    Raises:
        LeaseLost: the attempt may not write (before or after ``write``; nothing is
            published then).
    """
    path = Path(target)
    if path.exists():
        return Published(path, replayed=True)
    ctx.check_lease()
    staging = staging_path(path, ctx.task_id, ctx.fencing_token)
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()  # this attempt's own leftover (its write raised before)
    try:
        with staging.open("xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # The last check; from here the link is one system call, and never overwrites.
        ctx.check_lease()
        try:
            os.link(staging, path)
        except FileExistsError:
            return Published(path, replayed=True)
        _fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
    for name in stale_stagings(path, ctx.task_id, ctx.fencing_token, os.listdir(path.parent)):
        with contextlib.suppress(FileNotFoundError):
            (path.parent / name).unlink()
    return Published(path, replayed=False)


async def publish_file_async(
    ctx: TaskContext, target: str | os.PathLike[str], write: Callable[[IO[bytes]], object]
) -> Published:
    """:func:`publish_file` from an ``async def`` handler (the file I/O, ``write``
    included, runs in a thread)."""
    return await asyncio.to_thread(publish_file, ctx, target, write)
