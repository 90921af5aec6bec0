"""``chronoshard.worker.commit.PostgresEffects`` against a real PostgreSQL: the effect and
its effect row commit together or not at all, a second attempt replays the stored result,
concurrent attempts serialize, and no write lands after the attempt's lease ran out, not
even from a writer paused inside its transaction (PostgreSQL ends the session).

Attempts are task contexts with real leases on the monotonic clock, a few hundred
milliseconds long where a test needs one to run out; the database is the test's own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from fixtures.attempts import attempt_context, lease_for

from chronoshard.worker import LeaseLost, StopReason, TaskContext
from chronoshard.worker.commit import Effect, PostgresEffects

LEDGER_DDL = "CREATE TABLE ledger (task_id uuid NOT NULL, token bigint NOT NULL, note text)"


def attempt(task_id: uuid.UUID, token: int, *, lease_s: float | None = 30.0) -> TaskContext:
    """Attempt ``token`` of the task, its lease running out ``lease_s`` from now."""
    return attempt_context(lease_for(time.monotonic, lease_s), task_id=task_id, token=token)


@pytest.fixture
async def conn(fresh_db_dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True) as opened:
        await opened.execute(LEDGER_DDL)
        await PostgresEffects().create_table(opened)
        yield opened


async def _ledger(conn: psycopg.AsyncConnection[Any], task_id: uuid.UUID) -> list[tuple[Any, ...]]:
    cur = await conn.execute(
        "SELECT token, note FROM ledger WHERE task_id = %s ORDER BY token", (task_id,)
    )
    return await cur.fetchall()


def _write(ctx: TaskContext, note: str) -> Any:
    async def effect(c: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
        await c.execute(
            "INSERT INTO ledger (task_id, token, note) VALUES (%s, %s, %s)",
            (ctx.task_id, ctx.fencing_token, note),
        )
        return {"note": note, "token": ctx.fencing_token}

    return effect


async def test_the_effect_happens_once_and_a_later_attempt_gets_its_result(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    effects = PostgresEffects()
    task_id = uuid.uuid4()
    first = attempt(task_id, 1)
    done = await effects.once(conn, first, _write(first, "charged"))
    assert done == Effect({"note": "charged", "token": 1}, 1, replayed=False)
    second = attempt(task_id, 2)
    again = await effects.once(conn, second, _write(second, "charged again"))
    assert again == Effect({"note": "charged", "token": 1}, 1, replayed=True)
    assert await _ledger(conn, task_id) == [(1, "charged")]
    assert await effects.lookup(conn, task_id) == Effect(
        {"note": "charged", "token": 1}, 1, replayed=True
    )
    assert await effects.lookup(conn, uuid.uuid4()) is None
    # The session's own settings are left as they were (the bounds were transaction-local).
    cur = await conn.execute("SHOW statement_timeout")
    assert (await cur.fetchone()) == ("0",)


async def test_an_attempt_that_lost_its_lease_writes_nothing(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    effects = PostgresEffects()
    task_id = uuid.uuid4()
    ran: list[bool] = []

    async def effect(c: psycopg.AsyncConnection[Any]) -> None:
        ran.append(True)

    lapsed = attempt(task_id, 1, lease_s=0.0)
    with pytest.raises(LeaseLost):
        await effects.once(conn, lapsed, effect)
    revoked = attempt(task_id, 1)
    revoked._request_stop(StopReason.REVOKED)
    with pytest.raises(LeaseLost):
        await effects.once(conn, revoked, effect)
    assert ran == [] and await effects.lookup(conn, task_id) is None


async def test_a_failing_effect_leaves_no_row_and_the_next_attempt_does_it(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    effects = PostgresEffects()
    task_id = uuid.uuid4()
    first = attempt(task_id, 1)

    async def half_done(c: psycopg.AsyncConnection[Any]) -> None:
        await _write(first, "half")(c)
        raise RuntimeError("the payment API said no")

    with pytest.raises(RuntimeError):
        await effects.once(conn, first, half_done)
    not_json = attempt(task_id, 2)

    async def returns_a_set(c: psycopg.AsyncConnection[Any]) -> set[int]:
        await _write(not_json, "set")(c)
        return {1}

    with pytest.raises(TypeError):
        await effects.once(conn, not_json, returns_a_set)
    assert await _ledger(conn, task_id) == []
    third = attempt(task_id, 3)
    assert not (await effects.once(conn, third, _write(third, "done"))).replayed
    assert await _ledger(conn, task_id) == [(3, "done")]


async def test_concurrent_attempts_serialize_on_the_effect_row(fresh_db_dsn: str) -> None:
    """B starts while A's transaction is open: B waits, then replays A's result. Had A
    rolled back instead, B would do the effect (checked with a second task)."""
    effects = PostgresEffects()
    async with (
        await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True) as conn_a,
        await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True) as conn_b,
    ):
        await conn_a.execute(LEDGER_DDL)
        await effects.create_table(conn_a)
        for a_commits in (True, False):
            task_id = uuid.uuid4()
            a, b = attempt(task_id, 1), attempt(task_id, 2)
            inside, release = asyncio.Event(), asyncio.Event()

            async def slow(
                c: psycopg.AsyncConnection[Any],
                a: TaskContext = a,
                inside: asyncio.Event = inside,
                release: asyncio.Event = release,
                a_commits: bool = a_commits,
            ) -> str:
                await _write(a, "a")(c)
                inside.set()
                await release.wait()
                if not a_commits:
                    raise RuntimeError("A failed")
                return "a"

            task_a = asyncio.create_task(effects.once(conn_a, a, slow))
            await inside.wait()
            task_b = asyncio.create_task(effects.once(conn_b, b, _write(b, "b")))
            await asyncio.sleep(0.3)
            assert not task_b.done(), "B went ahead while A held the row"
            release.set()
            if a_commits:
                assert (await task_a).result == "a"
                assert await task_b == Effect("a", 1, replayed=True)
                assert await _ledger(conn_a, task_id) == [(1, "a")]
            else:
                with pytest.raises(RuntimeError):
                    await task_a
                assert not (await task_b).replayed
                assert await _ledger(conn_a, task_id) == [(2, "b")]


async def test_the_lease_running_out_mid_statement_rolls_it_back(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    effects = PostgresEffects()
    task_id = uuid.uuid4()
    ctx = attempt(task_id, 1, lease_s=0.5)

    async def long_write(c: psycopg.AsyncConnection[Any]) -> None:
        await _write(ctx, "late")(c)
        await c.execute("SELECT pg_sleep(5)")

    started = time.monotonic()
    with pytest.raises(LeaseLost, match="ran out during the write"):
        await effects.once(conn, ctx, long_write)
    assert time.monotonic() - started < 3, "statement_timeout did not cut it at the lease"
    assert await _ledger(conn, task_id) == [] and await effects.lookup(conn, task_id) is None


async def test_a_writer_paused_inside_its_transaction_past_the_lease_commits_nothing(
    fresh_db_dsn: str,
) -> None:
    """The client stops between two statements (as a SIGSTOPped worker would) for longer
    than its lease: PostgreSQL ends the idle transaction; the commit that comes after the
    pause cannot land."""
    effects = PostgresEffects()
    task_id = uuid.uuid4()
    ctx = attempt(task_id, 1, lease_s=0.5)
    async with await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True) as conn:
        await conn.execute(LEDGER_DDL)
        await effects.create_table(conn)

        async def paused(c: psycopg.AsyncConnection[Any]) -> str:
            await _write(ctx, "paused")(c)
            # Not an await: the whole process stands still, as under SIGSTOP.
            time.sleep(1.5)  # noqa: ASYNC251
            return "too late"

        with pytest.raises(LeaseLost, match="ran out during the write"):
            await effects.once(conn, ctx, paused)
    async with await psycopg.AsyncConnection.connect(fresh_db_dsn) as check:
        assert await _ledger(check, task_id) == []
        assert await effects.lookup(check, task_id) is None


async def test_a_connection_inside_a_transaction_is_refused(fresh_db_dsn: str) -> None:
    effects = PostgresEffects()
    async with await psycopg.AsyncConnection.connect(fresh_db_dsn) as conn:
        await conn.execute("SELECT 1")  # not autocommit: a transaction is open now
        with pytest.raises(ValueError, match="not inside a transaction"):
            await effects.once(
                conn, attempt(uuid.uuid4(), 1), _write(attempt(uuid.uuid4(), 1), "x")
            )


def test_the_blocking_variant_for_sync_handlers(fresh_db_dsn: str) -> None:
    effects = PostgresEffects("fx.sync_effects")
    task_id = uuid.uuid4()
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA fx")
        conn.execute(LEDGER_DDL)
        effects.create_table_sync(conn)
        for token in (1, 2):
            ctx = attempt(task_id, token)

            def effect(c: psycopg.Connection[Any], ctx: TaskContext = ctx) -> int:
                c.execute(
                    "INSERT INTO ledger (task_id, token, note) VALUES (%s, %s, 'sync')",
                    (ctx.task_id, ctx.fencing_token),
                )
                return ctx.fencing_token

            done = effects.once_sync(conn, ctx, effect)
            assert (done.result, done.fencing_token, done.replayed) == (1, 1, token == 2)
        rows = conn.execute("SELECT token FROM ledger WHERE task_id = %s", (task_id,)).fetchall()
        assert rows == [(1,)]
        assert effects.lookup_sync(conn, task_id) == Effect(1, 1, replayed=True)
        with pytest.raises(LeaseLost):
            effects.once_sync(conn, attempt(uuid.uuid4(), 1, lease_s=0.0), lambda c: None)
