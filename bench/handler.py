"""The TaskService submit handler in this process, without gRPC (issue 14, targets 2 and 4).

``python -m bench submit-handler --submits N`` builds the node's ``TaskServiceServicer``
on a real store (a fresh migrated database) and calls its ``SubmitTask`` N times, one at
a time, as the gRPC server would (with a minimal servicer context carrying the API key),
after 200 warm-up calls. What it reports is the handler's own cost per submit:
authenticate, validate, group commit, insert, commit, answer. The gRPC hop and the
rest of a node are not in it, so this is the number to compare when a change is to the
handler's Python: it moves less with the machine's moment than a rate across three
processes does.

With ``--batch K`` (K > 1) each call is a ``SubmitBatch`` of K tasks instead (10 warm-up
calls). The wall time of a call less this process's CPU is what the handler waited for
PostgreSQL (and for the CPU, when PostgreSQL had it): the number that shows how much of
the database's work a change hides behind the handler's own.

For a count that does not move at all, run it under callgrind twice and take the
difference (the warm-up and start-up cancel out)::

    valgrind --tool=callgrind python -m bench submit-handler --submits 200
    valgrind --tool=callgrind python -m bench submit-handler --submits 400
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import uvloop
from google.protobuf import timestamp_pb2

from bench._cluster import Infrastructure
from bench._report import Report
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.tasks import TaskServiceServicer
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.tenants import TenantStore, create_tenant
from chronoshard.v1 import task_service_pb2

WARMUP_SUBMITS = 200
WARMUP_BATCHES = 10
FAR_OUT = timedelta(hours=2)


class _Context:
    """What the handler reads of a grpc.aio servicer context on a successful submit."""

    def __init__(self, api_key: str) -> None:
        self._metadata = (("authorization", f"Bearer {api_key}"),)

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        return self._metadata

    def auth_context(self) -> dict[str, Any]:
        return {}


async def _submits(dsn: str, api_key: str, submits: int, batch: int) -> tuple[float, float]:
    async with await Store.open(dsn, min_size=2, max_size=4) as store:
        servicer = TaskServiceServicer(
            config=SchedulerConfig(), store=store, authenticator=Authenticator(TenantStore(store))
        )
        context: Any = _Context(api_key)
        at = timestamp_pb2.Timestamp()
        at.FromDatetime(datetime.now(UTC) + FAR_OUT)
        request = task_service_pb2.SubmitTaskRequest(
            type="bench.stamp", scheduled_at=at, strict_timing=True, payload_json=b'{"i": 1}'
        )
        many = task_service_pb2.SubmitBatchRequest(tasks=[request] * batch)

        async def call() -> None:
            if batch == 1:
                await servicer.SubmitTask(request, context)
            else:
                await servicer.SubmitBatch(many, context)

        try:
            for _ in range(WARMUP_SUBMITS if batch == 1 else WARMUP_BATCHES):
                await call()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(submits):
                await call()
            return time.perf_counter() - wall, time.process_time() - cpu
        finally:
            await servicer.stop()


def submit_handler(infra: Infrastructure, submits: int, batch: int = 1) -> Report:
    warmup = WARMUP_SUBMITS if batch == 1 else WARMUP_BATCHES
    with infra.database("submit_handler") as dsn:
        api_key = create_tenant(dsn, "bench-handler").api_key
        wall_s, cpu_s = uvloop.run(_submits(dsn, api_key, submits, batch))
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM tasks").fetchone()
    stored = 0 if row is None else int(row[0])
    result = {
        "calls": submits,
        "tasks per call": batch,
        "tasks/s": submits * batch / wall_s,
        "wall ms per call": f"{wall_s / submits * 1000:.3f}",
        "CPU ms per call": f"{cpu_s / submits * 1000:.3f}",
        "waited ms per call": f"{(wall_s - cpu_s) / submits * 1000:.3f}",
        "rows stored": stored,
    }
    return Report(
        workload="submit-handler",
        command="",
        parameters={"calls": submits, "tasks per call": batch, "warm-up calls": warmup},
        columns=list(result),
        rows=[result],
        notes=[
            f"{stored:,} rows for {(submits + warmup) * batch:,} tasks submitted "
            "(the measured calls and the warm-up): each answered task is a committed row."
        ],
    )
