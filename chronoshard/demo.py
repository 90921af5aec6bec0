"""The demo worker that ``chronoshard dev`` runs: a few task types to try things with.

- ``demo.echo`` returns its payload.
- ``demo.sleep`` sleeps ``payload["seconds"]`` (default 1), heartbeating a checkpoint.
- ``demo.flaky`` fails its first ``payload["failures"]`` attempts (default 2), then
  succeeds: watch the retries with ``chronoshard tasks get ID --attempts``.
- ``demo.fail`` always fails: it ends DEAD_LETTER after its retries.

Run it yourself with ``chronoshard worker chronoshard.demo:worker --target HOST:PORT``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from chronoshard.worker import TaskContext, Worker

worker = Worker([], slots=20)


@worker.task("demo.echo")
async def echo(ctx: TaskContext) -> Any:
    return ctx.payload


@worker.task("demo.sleep")
async def sleep(ctx: TaskContext) -> dict[str, float]:
    seconds = float(ctx.payload.get("seconds", 1))
    done = float((ctx.checkpoint or {}).get("slept", 0))
    while done < seconds:
        step = min(1.0, seconds - done)
        await asyncio.sleep(step)
        done += step
        await ctx.heartbeat(checkpoint={"slept": done})
    return {"slept": done}


@worker.task("demo.flaky")
async def flaky(ctx: TaskContext) -> dict[str, int]:
    failures = int(ctx.payload.get("failures", 2))
    if ctx.attempt <= failures:
        raise RuntimeError(f"demo.flaky: attempt {ctx.attempt} fails on purpose")
    return {"succeeded_on_attempt": ctx.attempt}


@worker.task("demo.fail")
async def fail(ctx: TaskContext) -> None:
    raise RuntimeError("demo.fail always fails")
