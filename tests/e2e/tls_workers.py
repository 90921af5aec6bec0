"""The worker of the TLS end-to-end tests (``test_tls.py``): it echoes its payload back,
with the id of the worker that ran it, so the test sees the task went through this one.

The runner gives it its scheduler address and its TLS files (``chronoshard worker
--tls-ca ...`` and ``CHRONOSHARD_TLS_CERT``/``CHRONOSHARD_TLS_KEY``); it has no API key:
its client certificate names its tenant.
"""

from __future__ import annotations

from typing import Any

from chronoshard.worker import TaskContext, Worker

worker = Worker([], slots=4, worker_id="tls-worker")


@worker.task("tls.echo")
async def echo(ctx: TaskContext) -> dict[str, Any]:
    return {"echo": ctx.payload, "worker_id": ctx.worker_id}
