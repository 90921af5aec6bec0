"""Handlers of the fair-queuing flood test (``test_fair_queuing.py``).

Each run appends one line to ``FAIR_RECORDS`` (a file per worker process): the task's
type, its id, its due instant and when the handler started and ended, all UNIX seconds
by this machine's clock (the scheduler's too: one machine). A file rather than a table:
the flood runs hundreds of tasks a second, and the test must measure the scheduler, not
an extra database write per task.
"""

from __future__ import annotations

import asyncio
import os
import time

from chronoshard.worker import TaskContext, Worker

SLOTS = int(os.environ.get("FAIR_WORKER_SLOTS", "10"))
RUN_S = float(os.environ.get("FAIR_RUN_S", "0.05"))
worker = Worker([], slots=SLOTS)
# Line-buffered: a line is on disk when the run that wrote it settles, whatever kills us.
_records = open(os.environ["FAIR_RECORDS"], "a", buffering=1)  # noqa: SIM115


async def _run(ctx: TaskContext, kind: str, run_s: float = RUN_S) -> None:
    started = time.time()
    await asyncio.sleep(run_s)
    _records.write(
        f"{kind} {ctx.task_id} {ctx.due_at.timestamp():.6f} {started:.6f} {time.time():.6f}\n"
    )


@worker.task("fair.bulk")
async def bulk(ctx: TaskContext) -> None:
    await _run(ctx, "bulk")


@worker.task("fair.critical")
async def critical(ctx: TaskContext) -> None:
    await _run(ctx, "critical")


@worker.task("fair.critical_long")
async def critical_long(ctx: TaskContext) -> None:
    await _run(ctx, "critical_long", float(ctx.payload["seconds"]))
