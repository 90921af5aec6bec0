"""The demo worker that ``chronoshard dev`` runs: a few task types to try things with.

- ``demo.echo`` returns its payload (under ``"echo"``).
- ``demo.sleep`` sleeps ``payload["seconds"]`` (default 1), heartbeating a checkpoint, so
  a drained worker hands the rest to another.
- ``demo.flaky`` fails its first ``payload["failures"]`` attempts (default 2), then
  succeeds: watch the retries with ``chronoshard tasks get ID --attempts``.
- ``demo.fail`` always fails: it ends DEAD_LETTER after its retries.
- ``demo.tick`` is what the demo's schedule runs (``chronoshard schedules get
  demo.heartbeat``): it prints the occurrence's logical date and returns it.
- ``demo.gather`` ends the demo's workflow: it returns what its parents returned
  (``ctx.parents``), by their refs.

Every handler's result also carries ``"late_ms"``: how long after the task's due time
the handler started, on this worker's clock. ``chronoshard dev --demo`` shows these.

Run it yourself with ``chronoshard worker chronoshard.demo:worker --target HOST:PORT``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from chronoshard.worker import TaskContext, Worker

worker = Worker([], slots=50)


def lateness_ms(ctx: TaskContext) -> float:
    """Milliseconds from the task's due time to now (negative: started early)."""
    return round((datetime.now(UTC) - ctx.due_at).total_seconds() * 1000, 3)


@worker.task("demo.echo")
async def echo(ctx: TaskContext) -> dict[str, Any]:
    return {"echo": ctx.payload, "late_ms": lateness_ms(ctx)}


@worker.task("demo.sleep")
async def sleep(ctx: TaskContext) -> dict[str, Any]:
    late = lateness_ms(ctx)
    seconds = float(ctx.payload.get("seconds", 1))
    done = float((ctx.checkpoint or {}).get("slept", 0))
    while done < seconds:
        step = min(1.0, seconds - done)
        await asyncio.sleep(step)
        done += step
        await ctx.heartbeat(checkpoint={"slept": done})
    return {"slept": done, "late_ms": late}


@worker.task("demo.flaky")
async def flaky(ctx: TaskContext) -> dict[str, Any]:
    late = lateness_ms(ctx)
    failures = int(ctx.payload.get("failures", 2))
    if ctx.attempt <= failures:
        raise RuntimeError(f"demo.flaky: attempt {ctx.attempt} fails on purpose")
    return {"succeeded_on_attempt": ctx.attempt, "late_ms": late}


@worker.task("demo.fail")
async def fail(ctx: TaskContext) -> None:
    raise RuntimeError("demo.fail always fails (on purpose: look at its attempts)")


@worker.task("demo.tick")
async def tick(ctx: TaskContext) -> dict[str, Any]:
    """One occurrence of a schedule: its logical date is the time it stands for (the
    same on a retry, a catch-up or a backfill), not the time it happens to run."""
    late = lateness_ms(ctx)
    when = None if ctx.logical_date is None else ctx.logical_date.isoformat()
    print(f"demo.tick: occurrence {when} of schedule {ctx.schedule_id}", flush=True)
    return {"logical_date": when, "late_ms": late}


@worker.task("demo.gather")
async def gather(ctx: TaskContext) -> dict[str, Any]:
    """The last task of a workflow: its parents' results arrive with the assignment, so
    the pipeline needs no side store to pass small values down."""
    late = lateness_ms(ctx)
    seen = {ref: parent.result for ref, parent in ctx.parents.items()}
    print(f"demo.gather: {ctx.workflow_ref} of workflow {ctx.workflow_id} got {seen}", flush=True)
    return {"from": seen, "late_ms": late}
