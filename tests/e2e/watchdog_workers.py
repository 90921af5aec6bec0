"""The user worker of the watchdog end-to-end tests: runs the watched job's tasks.

It serves the default queue only, never the canary queue: killing it silences user jobs
while the watchdog's own canary worker keeps canaries flowing.
"""

from __future__ import annotations

from chronoshard.worker import TaskContext, Worker

worker = Worker([], slots=10)


@worker.task("e2e.job")
async def job(ctx: TaskContext) -> dict[str, int]:
    return {"attempt": ctx.attempt}
