"""The worker of the schedule end-to-end tests (``tests/e2e/test_schedules.py``).

``sched.record`` is an occurrence's handler: the first thing it does is write one row
to ``schedule_runs`` (made by the test; no unique constraint, so an occurrence run twice
shows twice) with the occurrence it ran (``ctx.logical_date``, ``ctx.schedule_id``), the
attempt and token, and PostgreSQL's clock at the write (``recorded_at``: when it really
started, on the same clock as the tasks' ``due_at``); then the history checker's
``effects`` row (``harness.history``), and it returns.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from ledger_pool import ledger
from ledger_pool import record as record_effect

from chronoshard.worker import TaskContext, Worker

worker = Worker([], slots=int(os.environ.get("E2E_WORKER_SLOTS", "20")))


@worker.task("sched.record")
async def record(ctx: TaskContext) -> dict[str, str | None]:
    started_at = datetime.now(UTC)
    dsn = os.environ["E2E_DSN"]
    pool = await ledger(dsn)
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO schedule_runs (task_id, schedule_id, logical_date, attempt, token,"
            " worker_id, started_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                ctx.task_id,
                ctx.schedule_id,
                ctx.logical_date,
                ctx.attempt,
                ctx.fencing_token,
                ctx.worker_id,
                started_at,
            ),
        )
    await record_effect(dsn, ctx, started_at, "ok")
    return {"logical_date": None if ctx.logical_date is None else ctx.logical_date.isoformat()}
