"""Handlers run by the benchmark's worker processes (``bench_workers:worker``).

``bench.noop`` does nothing: pure scheduler throughput. ``bench.record`` notes when it
started (the worker's wall clock, the same machine as the scheduler) with its task,
attempt, fencing token and worker, like the end-to-end tests' ``e2e.record``, then holds
its slot ``payload.ms`` milliseconds (``--handler-ms``; 0 if absent), so that how the node
spreads tasks over the workers shows in how long they wait. The rows go to the
``effects`` ledger in batches: a buffer COPYed every few milliseconds by one task of
the process. One INSERT per handler would make the ledger, not the scheduler, set the
pace of a 100,000-task stampede. The ledger is bookkeeping: the benchmark waits for it to
hold every row before checking, and a worker killed mid-run would lose its last buffer
(no benchmark kills workers).

``bench.occurrence`` (``python -m bench schedules``) is ``bench.record`` for the
occurrences of a schedule: it notes its start with the schedule and the occurrence's
logical date, into ``bench_occurrence_runs`` (created by that workload,
``bench/schedules.py``), through the same buffered COPY.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from chronoshard.worker import TaskContext, Worker

SLOTS = int(os.environ.get("BENCH_WORKER_SLOTS", "200"))
PREFETCH = int(os.environ.get("BENCH_WORKER_PREFETCH", "0"))
FLUSH_INTERVAL_S = 0.02
worker = Worker([], slots=SLOTS, prefetch=PREFETCH)

Row = tuple[uuid.UUID, int, int, str, datetime, datetime, str]
OccurrenceRow = tuple[uuid.UUID | None, datetime | None, uuid.UUID, int, str, datetime, datetime]
_buffer: list[Row] = []
_occurrences: list[OccurrenceRow] = []
_flusher: asyncio.Task[None] | None = None
_OCCURRENCE_COPY = (
    "COPY bench_occurrence_runs (schedule_id, logical_date, task_id, attempt, worker_id,"
    " started_at, due_at) FROM STDIN"
)


async def _flush_forever() -> None:
    conn = await psycopg.AsyncConnection.connect(os.environ["BENCH_DSN"], autocommit=True)
    # Bookkeeping: no disk flush per batch (the scheduler's own writes stay durable).
    await conn.execute("SET synchronous_commit = off")
    async with conn:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            if _buffer:
                rows = _buffer[:]
                del _buffer[: len(rows)]
                async with (
                    conn.cursor() as cur,
                    cur.copy(
                        "COPY effects (task_id, attempt, token, worker_id, started_at, due_at,"
                        " outcome) FROM STDIN"
                    ) as copy,
                ):
                    for row in rows:
                        await copy.write_row(row)
            if _occurrences:
                occurrences = _occurrences[:]
                del _occurrences[: len(occurrences)]
                async with conn.cursor() as cur, cur.copy(_OCCURRENCE_COPY) as copy:
                    for occurrence in occurrences:
                        await copy.write_row(occurrence)


def _ensure_flusher() -> None:
    global _flusher
    if _flusher is None or _flusher.done():
        _flusher = asyncio.get_running_loop().create_task(_flush_forever())


@worker.task("bench.noop")
async def noop(ctx: TaskContext) -> None:
    return None


@worker.task("bench.record")
async def record(ctx: TaskContext) -> dict[str, Any]:
    started_at = datetime.now(UTC)
    _ensure_flusher()
    _buffer.append(
        (
            ctx.task_id,
            ctx.attempt,
            ctx.fencing_token,
            ctx.worker_id,
            started_at,
            ctx.due_at,
            "ok",
        )
    )
    hold_ms = float(ctx.payload.get("ms", 0))
    if hold_ms > 0:
        await asyncio.sleep(hold_ms / 1000)
    return {}


@worker.task("bench.occurrence")
async def occurrence(ctx: TaskContext) -> None:
    started_at = datetime.now(UTC)
    _ensure_flusher()
    _occurrences.append(
        (
            ctx.schedule_id,
            ctx.logical_date,
            ctx.task_id,
            ctx.attempt,
            ctx.worker_id,
            started_at,
            ctx.due_at,
        )
    )
