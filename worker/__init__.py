"""The Chronoshard worker SDK: run task handlers for a Chronoshard cluster.

::

    from chronoshard.worker import TaskContext, Worker

    worker = Worker(["127.0.0.1:7070"], slots=10)

    @worker.task("send-email", timeout_s=60)
    async def send_email(ctx: TaskContext) -> dict[str, str]:
        await ctx.heartbeat(checkpoint={"step": 1})
        return {"status": "sent"}

    if __name__ == "__main__":
        raise SystemExit(worker.run_sync())

Or run it with ``python -m chronoshard.worker mymodule:worker --target host:port``.
``chronoshard.worker.testing`` runs a handler without a cluster; ``chronoshard.worker.commit``
makes a handler's side effect happen once (PostgreSQL effect rows, atomically published
files). The user guide is ``docs/worker-sdk.md``; the wire protocol is
``docs/worker-protocol.md``.
"""

from chronoshard.worker._context import (
    UNSET,
    HeartbeatRecord,
    ParentResult,
    StopReason,
    TaskContext,
)
from chronoshard.worker._errors import (
    RESULT_REFUSED,
    CheckpointRefused,
    ConfigurationError,
    LeaseLost,
    LoadError,
    NonRetryableError,
    TaskCancelled,
    WorkerError,
)
from chronoshard.worker._transport import TLSConfig
from chronoshard.worker._worker import DrainReport, Worker

__all__ = [
    "RESULT_REFUSED",
    "UNSET",
    "CheckpointRefused",
    "ConfigurationError",
    "DrainReport",
    "HeartbeatRecord",
    "LeaseLost",
    "LoadError",
    "NonRetryableError",
    "ParentResult",
    "StopReason",
    "TLSConfig",
    "TaskCancelled",
    "TaskContext",
    "Worker",
    "WorkerError",
]
