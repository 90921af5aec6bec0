"""Chronoshard's side of the comparison: a worker with ``bench.stamp``
(``chronoshard.worker bench._peers.chronoshard_app:worker``), ``$BENCH_WORKER_SLOTS``
slots (10 in the comparison)."""

from __future__ import annotations

import os

from bench._peers import stamps
from chronoshard.worker import TaskContext, Worker

worker = Worker(
    [],
    slots=int(os.environ.get("BENCH_WORKER_SLOTS", "10")),
    prefetch=int(os.environ.get("BENCH_WORKER_PREFETCH", "0")),
)


@worker.task("bench.stamp")
async def stamp(ctx: TaskContext) -> None:
    stamps.record(int(ctx.payload["i"]))
