"""The handler of the clock-step tests: records when it started by PostgreSQL's clock.

The worker processes of these tests may run with a faked wall clock, so the start time is
not read from it: the handler notes its start on the monotonic clock and the row stores
``clock_timestamp()`` minus the time elapsed since, i.e. the start as PostgreSQL's clock
saw it (late by the insert's one-way trip, never early).
"""

from __future__ import annotations

import os
import time

from ledger_pool import ledger

from chronoshard.worker import TaskContext, Worker

worker = Worker([], slots=int(os.environ.get("E2E_WORKER_SLOTS", "50")))


@worker.task("clock.record")
async def record(ctx: TaskContext) -> dict[str, int]:
    started = time.monotonic()
    pool = await ledger(os.environ["E2E_DSN"])
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO effects (task_id, attempt, token, worker_id, started_at, due_at, outcome)"
            " VALUES (%s, %s, %s, %s,"
            " clock_timestamp() - make_interval(secs => %s), %s, 'ok')",
            (
                ctx.task_id,
                ctx.attempt,
                ctx.fencing_token,
                ctx.worker_id,
                time.monotonic() - started,
                ctx.due_at,
            ),
        )
    return {"attempt": ctx.attempt}
