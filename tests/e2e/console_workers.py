"""The worker of the console's browser tests (``tests/e2e/test_console.py``).

``console.flaky`` fails its first attempt with a traceback two frames deep (so the page
has a real one to show) and succeeds on any later attempt: submitted without retries it
dead-letters, and an operator retry (the console's Retry button) completes it.
``console.ok`` returns its payload: the schedule's and the workflow's tasks.
"""

from __future__ import annotations

from typing import Any

from chronoshard.worker import TaskContext, Worker

WORKER_ID = "ledger-worker-1"
# A fixed id: the workers page lists it by name.
worker = Worker([], slots=8, worker_id=WORKER_ID)
FIRST_ATTEMPT_ERROR = "the first attempt of a console test task fails on purpose"


def _load_ledger(attempt: int) -> None:
    if attempt == 1:
        raise ValueError(FIRST_ATTEMPT_ERROR)


@worker.task("console.flaky")
async def flaky(ctx: TaskContext) -> dict[str, Any]:
    _load_ledger(ctx.attempt)
    return {"attempt": ctx.attempt, "ok": True}


@worker.task("console.ok")
async def ok(ctx: TaskContext) -> dict[str, Any]:
    return {"ref": ctx.workflow_ref, "ok": True}
