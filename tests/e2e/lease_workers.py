"""Handlers run by the worker processes of the lease, drain, crash and cancel tests.

Every handler appends what it did to the ``lease_effects`` ledger of the test's database
(no unique constraint: a handler that ran twice shows twice), with the attempt, the
fencing token and the worker it ran under. ``committed`` rows are the side effect proper:
a handler writes one only when it got to the end of its work, so an attempt that was
killed or revoked on the way leaves none.

The process environment shapes the worker: ``LEASE_QUEUE`` (each test submits to a
queue of its own, so workers another test left behind never take its tasks),
``LEASE_SLOTS``, ``LEASE_DRAIN_GRACE_S``,
``CHRONOSHARD_WORKER_ID``, and ``LEASE_HOLD_S`` (how long ``lease.hold`` blocks before
committing: set on the worker a test kills, unset on the one that takes over).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from ledger_pool import ledger

from chronoshard.worker import TaskContext, Worker

worker = Worker(
    [],
    queues=[os.environ.get("LEASE_QUEUE", "default")],
    slots=int(os.environ.get("LEASE_SLOTS", "10")),
    drain_grace_s=float(os.environ.get("LEASE_DRAIN_GRACE_S", "30")),
    worker_id=os.environ.get("CHRONOSHARD_WORKER_ID") or None,
)


async def record(ctx: TaskContext, event: str, detail: Any = None) -> None:
    pool = await ledger(os.environ["LEASE_DSN"])
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO lease_effects (task_id, attempt, token, worker_id, event, detail)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (
                ctx.task_id,
                ctx.attempt,
                ctx.fencing_token,
                ctx.worker_id,
                event,
                None if detail is None else json.dumps(detail),
            ),
        )


def _reason(ctx: TaskContext) -> str | None:
    return ctx.cancel_reason.value if ctx.cancel_reason is not None else None


@worker.task("lease.rows")
async def rows(ctx: TaskContext) -> dict[str, int]:
    """Process ``payload.rows`` rows, ``payload.row_s`` each, checkpointing the counter.

    Resumes from ``ctx.checkpoint``; on a drain it stops after the current row (the
    checkpoint is already saved) and lets the SDK release it.
    """
    total = int(ctx.payload["rows"])
    row_s = float(ctx.payload.get("row_s", 0.1))
    start = int(ctx.checkpoint["next"]) if ctx.checkpoint else 0
    await record(ctx, "resumed" if ctx.checkpoint else "started", {"from": start})
    for row in range(start, total):
        await asyncio.sleep(row_s)
        await ctx.heartbeat(checkpoint={"next": row + 1}, progress=row + 1)
        if ctx.cancelled:
            await record(ctx, "stopped", {"next": row + 1, "reason": _reason(ctx)})
            ctx.raise_if_cancelled()
    await record(ctx, "committed", {"from": start, "rows": total})
    return {"rows": total, "resumed_from": start}


@worker.task("lease.hold")
async def hold(ctx: TaskContext) -> dict[str, int]:
    """Block ``LEASE_HOLD_S`` (this worker's setting), then commit."""
    await record(ctx, "started")
    await asyncio.sleep(float(os.environ.get("LEASE_HOLD_S", "0")))
    await record(ctx, "committed")
    return {"attempt": ctx.attempt}


@worker.task("lease.cancellable")
async def cancellable(ctx: TaskContext) -> None:
    """Wait until asked to stop (at most ``payload.wait_s``); acknowledge it by raising."""
    await record(ctx, "started")
    await asyncio.wait_for(ctx.wait_cancelled(), float(ctx.payload.get("wait_s", 60)))
    await record(ctx, "stop_seen", {"reason": _reason(ctx)})
    ctx.raise_if_cancelled()


@worker.task("lease.slow_first")
async def slow_first(ctx: TaskContext) -> dict[str, int]:
    """The first attempt outlives any sensible timeout; later ones are quick."""
    await record(ctx, "started")
    try:
        if ctx.attempt == 1:
            await asyncio.sleep(float(ctx.payload.get("first_s", 60)))
    except asyncio.CancelledError:
        # The SDK cancels an async handler at its timeout: note that it did.
        await asyncio.shield(record(ctx, "interrupted", {"reason": _reason(ctx)}))
        raise
    await record(ctx, "committed")
    return {"attempt": ctx.attempt}
