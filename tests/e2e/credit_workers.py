"""Handlers run by the worker processes of ``test_credits.py``.

Every handler appends its start to the ``effects`` ledger of the test's database (the
history checker's, no unique constraint: a task run twice shows twice) with the
worker's wall clock (the same machine as the schedulers) and the task's ``due_at``, so
a test reads how late each handler started. The environment shapes the worker:
``CREDITS_QUEUES`` (comma-separated; each test uses queues of its own, so one test's
workers never take another's tasks), ``CREDITS_SLOTS``, ``CREDITS_DRAIN_GRACE_S``,
``CHRONOSHARD_WORKER_ID``.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime

from ledger_pool import record as record_effect

from chronoshard.worker import TaskContext, Worker

worker = Worker(
    [],
    queues=os.environ.get("CREDITS_QUEUES", "default").split(","),
    slots=int(os.environ.get("CREDITS_SLOTS", "10")),
    drain_grace_s=float(os.environ.get("CREDITS_DRAIN_GRACE_S", "30")),
    worker_id=os.environ.get("CHRONOSHARD_WORKER_ID") or None,
)


async def record(ctx: TaskContext, started_at: datetime, outcome: str) -> None:
    await record_effect(os.environ["CREDITS_DSN"], ctx, started_at, outcome)


@worker.task("credits.hold")
async def hold(ctx: TaskContext) -> None:
    """Note the start, then keep the slot ``payload.s`` seconds (0: a quick task)."""
    started_at = datetime.now(UTC)
    await record(ctx, started_at, "ok")
    await asyncio.sleep(float(ctx.payload.get("s", 0)))


@worker.task("credits.rows")
async def rows(ctx: TaskContext) -> dict[str, int]:
    """``payload.rows`` rows of 0.1 s, checkpointing the next row; resumes from the
    checkpoint, and on a drain stops after the current row for the SDK to release it."""
    started_at = datetime.now(UTC)
    start = int(ctx.checkpoint["next"]) if ctx.checkpoint else 0
    await record(ctx, started_at, "resumed" if ctx.checkpoint else "started")
    total = int(ctx.payload["rows"])
    for row in range(start, total):
        await asyncio.sleep(0.1)
        await ctx.heartbeat(checkpoint={"next": row + 1})
        ctx.raise_if_cancelled()
    return {"resumed_from": start}
