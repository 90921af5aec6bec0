"""The worker of the workflow end-to-end tests (``tests/e2e/test_workflows.py``).

``wf.step`` is every task of every test DAG. The first thing it does is write one row to
``wf_starts`` (made by the test; no unique constraint, so a task run twice shows twice):
the task, attempt and token, what the SDK told it about its workflow
(``ctx.workflow_id``, ``ctx.workflow_ref``, ``ctx.parents`` as a JSON array, in
its order) and the worker's
clock at the start (``started_at``, the machine's clock, as are the tasks'
``finished_at``). Then it does what its payload says, in this order:

* ``gate``: wait until a row of that name is in ``wf_gates`` (the test releases it), so
  the test decides when the task completes;
* ``until_cancelled``: wait for a cancel and acknowledge it by raising (CANCELLED);
* ``fail_while``: raise a non-retryable error while a row of that name is in
  ``wf_flags`` (the test deletes it to "fix" the handler before a retry);
* return ``result`` (with ``pad`` x's under the key ``pad`` when ``pad`` is given: large
  results without large payloads).
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Any

from ledger_pool import ledger

from chronoshard import exact_json
from chronoshard.worker import NonRetryableError, TaskCancelled, TaskContext, Worker

worker = Worker([], slots=int(os.environ.get("E2E_WORKER_SLOTS", "50")))
GATE_POLL_S = 0.05


def _parents_json(ctx: TaskContext) -> str:
    # An array, not an object: jsonb keeps an array's order (ctx.parents' order is part
    # of what is tested) but sorts an object's keys.
    return exact_json.dumps(
        [
            {
                "ref": ref,
                "task_id": str(parent.task_id),
                "status": parent.status,
                "result": parent.result,
                "omitted": parent.omitted,
            }
            for ref, parent in ctx.parents.items()
        ]
    )


async def _record_start(ctx: TaskContext, started_at: datetime) -> None:
    pool = await ledger(os.environ["E2E_DSN"])
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO wf_starts (task_id, workflow_id, ref, attempt, token, worker_id,"
            " started_at, parents) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb)",
            (
                ctx.task_id,
                ctx.workflow_id,
                ctx.workflow_ref,
                ctx.attempt,
                ctx.fencing_token,
                ctx.worker_id,
                started_at,
                _parents_json(ctx),
            ),
        )


async def _row_exists(table: str, name: str) -> bool:
    pool = await ledger(os.environ["E2E_DSN"])
    async with pool.connection() as conn:
        cur = await conn.execute(f"SELECT 1 FROM {table} WHERE name = %s", (name,))
        return await cur.fetchone() is not None


async def _wait_gate(ctx: TaskContext, gate: str) -> None:
    # Polled: the gate is the test's, and a cancel must still end the wait.
    while not await _row_exists("wf_gates", gate):
        ctx.raise_if_cancelled()
        await asyncio.sleep(GATE_POLL_S)


@worker.task("wf.step")
async def step(ctx: TaskContext) -> Any:
    started_at = datetime.now(UTC)
    await _record_start(ctx, started_at)
    payload = ctx.payload
    if gate := payload.get("gate"):
        await _wait_gate(ctx, gate)
    if payload.get("until_cancelled"):
        reason = await ctx.wait_cancelled()
        raise TaskCancelled(f"stopped: {reason}")
    if (flag := payload.get("fail_while")) and await _row_exists("wf_flags", flag):
        raise NonRetryableError(f"failing while flag {flag!r} is set")
    result = payload.get("result")
    if "pad" in payload:
        result = {**result, "pad": "x" * int(payload["pad"])}
    return result
