"""Handlers run by the worker processes of the end-to-end tests.

Every handler appends its side effect to the ``effects`` ledger of the test's database
(no unique constraint, so a task run twice shows twice), recording when the handler
started by the worker's clock, the attempt and the fencing token it ran under.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Any

from ledger_pool import record as record_effect

from chronoshard.worker import CheckpointRefused, NonRetryableError, TaskContext, Worker

SLOTS = int(os.environ.get("E2E_WORKER_SLOTS", "50"))
worker = Worker([], slots=SLOTS)


async def record(ctx: TaskContext, started_at: datetime, outcome: str) -> None:
    await record_effect(os.environ["E2E_DSN"], ctx, started_at, outcome)


@worker.task("e2e.record")
async def record_task(ctx: TaskContext) -> dict[str, int]:
    started_at = datetime.now(UTC)
    await record(ctx, started_at, "ok")
    return {"attempt": ctx.attempt}


@worker.task("e2e.work")
async def work(ctx: TaskContext) -> dict[str, int]:
    """Work for ``payload.seconds`` (default 0.1), then commit the effect: settlements of
    such tasks are in flight all the time under load, whatever instant a fault hits."""
    started_at = datetime.now(UTC)
    await asyncio.sleep(float(ctx.payload.get("seconds", 0.1)))
    await record(ctx, started_at, "ok")
    return {"attempt": ctx.attempt}


@worker.task("e2e.flaky")
async def flaky(ctx: TaskContext) -> dict[str, int]:
    started_at = datetime.now(UTC)
    failures = int(ctx.payload.get("failures", 2))
    if ctx.attempt <= failures:
        await record(ctx, started_at, "failed")
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    await record(ctx, started_at, "ok")
    return {"attempt": ctx.attempt}


@worker.task("e2e.always_fail")
async def always_fail(ctx: TaskContext) -> None:
    await record(ctx, datetime.now(UTC), "failed")
    raise RuntimeError("always fails")


@worker.task("e2e.fatal")
async def fatal(ctx: TaskContext) -> None:
    await record(ctx, datetime.now(UTC), "failed")
    raise NonRetryableError("not worth retrying")


@worker.task("e2e.sleep")
async def sleep(ctx: TaskContext) -> dict[str, float]:
    await record(ctx, datetime.now(UTC), "started")
    seconds = float(ctx.payload.get("seconds", 1))
    await asyncio.sleep(seconds)
    return {"slept": seconds}


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@worker.task("e2e.bad_result")
async def bad_result(ctx: TaskContext) -> Any:
    """Return a result the scheduler does not store (``payload.kind``): a NUL, nesting
    200 deep, more than the node's size limit (``payload.bytes``); or, for
    ``checkpoint``, try such a checkpoint first and report what was raised."""
    await record(ctx, datetime.now(UTC), "started")
    kind = ctx.payload["kind"]
    if kind == "nul":
        return {"x": "\u0000"}
    if kind == "deep":
        return {"deep": _nested(200)}
    if kind == "huge":
        return {"blob": "x" * int(ctx.payload["bytes"])}
    assert kind == "checkpoint"
    try:
        await ctx.heartbeat(checkpoint={"step": "a\u0000b"})
    except CheckpointRefused as exc:
        return {"caught": type(exc).__name__, "rule": exc.rule}
    return {"caught": None}
