"""Handlers of the worker-partition test: each waits at a gate, then does its effect once.

A *gate* is a row of ``partition_gates`` the test writes when a handler may go on; until
then the handler of the partitioned worker waits (``PARTITION_HOLD=1``): an async one
cancellably, a blocking one in its thread without ever looking at ``ctx.cancelled`` (a
blocking call, as a thread the SDK cannot stop). A worker without ``PARTITION_HOLD``
runs straight through: it is the one that takes over.

The effect is a row of the history checker's ``effects`` ledger (tests/harness/history.py),
written through ``chronoshard.worker.commit.PostgresEffects`` (effect rows in
``partition_effects``): at most once per task, and never once the attempt lost its lease.
What each handler did goes to ``partition_ledger`` (with the database's clock): started,
cancelled (and why), refused (the helper said LeaseLost), committed or replayed.

``PARTITION_DSN`` is the database as this worker reaches it: through the test's forwarder
from inside the network namespace, directly from the host.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from ledger_pool import ledger

from chronoshard.worker import LeaseLost, TaskContext, Worker
from chronoshard.worker.commit import PostgresEffects

QUEUE = "partition"
DSN = os.environ.get("PARTITION_DSN", "")
HOLD = os.environ.get("PARTITION_HOLD") == "1"
POLL_S = 0.1

worker = Worker(
    [],
    queues=[QUEUE],
    slots=int(os.environ.get("PARTITION_SLOTS", "8")),
    worker_id=os.environ.get("CHRONOSHARD_WORKER_ID") or None,
)
effects = PostgresEffects("partition_effects")

GATE_OPEN = "SELECT 1 FROM partition_gates WHERE name = %s"
RECORD = (
    "INSERT INTO partition_ledger (task_id, token, worker_id, event, detail)"
    " VALUES (%s, %s, %s, %s, %s)"
)
EFFECT = (
    "INSERT INTO effects (task_id, attempt, token, worker_id, started_at, due_at, outcome)"
    " VALUES (%s, %s, %s, %s, %s, %s, 'ok')"
)


def _row(ctx: TaskContext, event: str, detail: Any) -> tuple[Any, ...]:
    return (
        ctx.task_id,
        ctx.fencing_token,
        ctx.worker_id,
        event,
        None if detail is None else json.dumps(detail),
    )


def _effect_row(ctx: TaskContext, started_at: datetime) -> tuple[Any, ...]:
    return (ctx.task_id, ctx.attempt, ctx.fencing_token, ctx.worker_id, started_at, ctx.due_at)


async def _record(ctx: TaskContext, event: str, detail: Any = None) -> None:
    pool = await ledger(DSN)
    async with pool.connection() as conn:
        await conn.execute(RECORD, _row(ctx, event, detail))


@worker.task("partition.async")
async def async_effect(ctx: TaskContext) -> dict[str, Any]:
    started_at = datetime.now(UTC)
    await _record(ctx, "started")
    gate = ctx.payload.get("gate")
    if HOLD:
        pool = await ledger(DSN)
        try:
            while True:
                if gate is not None:
                    async with pool.connection() as conn:
                        if await (await conn.execute(GATE_OPEN, (gate,))).fetchone():
                            break
                await asyncio.sleep(POLL_S)
        except asyncio.CancelledError:
            reason = ctx.cancel_reason.value if ctx.cancel_reason else None
            await asyncio.shield(_record(ctx, "cancelled", {"reason": reason}))
            raise

    async def effect(conn: psycopg.AsyncConnection[Any]) -> int:
        await conn.execute(EFFECT, _effect_row(ctx, started_at))
        return ctx.fencing_token

    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        try:
            done = await effects.once(conn, ctx, effect)
        except LeaseLost as exc:
            await _record(ctx, "refused", {"error": str(exc)})
            raise
    await _record(ctx, "replayed" if done.replayed else "committed")
    return {"token": done.fencing_token, "replayed": done.replayed}


@worker.task("partition.blocking")
def blocking_effect(ctx: TaskContext) -> dict[str, Any]:
    started_at = datetime.now(UTC)
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(RECORD, _row(ctx, "started", None))
        gate = ctx.payload.get("gate")
        # A blocking wait that never looks at ctx.cancelled: the SDK cannot stop it.
        while HOLD and not conn.execute(GATE_OPEN, (gate,)).fetchone():
            time.sleep(POLL_S)

        def effect(c: psycopg.Connection[Any]) -> int:
            c.execute(EFFECT, _effect_row(ctx, started_at))
            return ctx.fencing_token

        try:
            done = effects.once_sync(conn, ctx, effect)
        except LeaseLost as exc:
            conn.execute(RECORD, _row(ctx, "refused", {"error": str(exc)}))
            raise
        conn.execute(RECORD, _row(ctx, "replayed" if done.replayed else "committed", None))
    return {"token": done.fencing_token, "replayed": done.replayed}
