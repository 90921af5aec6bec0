"""Chronoshard: a distributed, durable task scheduler.

The root package holds what every process shares (the clock, the CLI, the client); the
scheduler daemon lives in ``chronoshard.scheduler``, the worker SDK in
``chronoshard.worker`` and the dead man's switch in ``chronoshard.watchdog``.

The client API is re-exported here (``from chronoshard import Client, Task,
NotFoundError``) but imported lazily, on first access: every Chronoshard process imports
this package, and most of them (the CLI's ``migrate``, the watchdog's store) should not pay
for grpc and protobuf just to start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from chronoshard._submit_stream import SubmitStream
    from chronoshard.client import Client, TLSConfig
    from chronoshard.errors import (
        AbortedError,
        AlreadyExistsError,
        ChronoshardError,
        DeadlineExceededError,
        FailedPreconditionError,
        InternalError,
        InvalidArgumentError,
        NotFoundError,
        NotSentError,
        PermissionDeniedError,
        ProtocolError,
        QuotaExceededError,
        ResourceExhaustedError,
        StaleFencingTokenError,
        UnauthenticatedError,
        UnavailableError,
        WrongRegionError,
    )
    from chronoshard.sync_client import SyncClient
    from chronoshard.types import (
        AlertSeverity,
        AttemptState,
        BackfillResult,
        CatchupPolicy,
        Incident,
        JitterMode,
        OverlapPolicy,
        Priority,
        Resolution,
        RetryPolicy,
        RunOrigin,
        Schedule,
        ScheduleDetails,
        SchedulePage,
        ScheduleRun,
        ScheduleSpec,
        ScheduleWatch,
        SubmitResult,
        Task,
        TaskAttempt,
        TaskPage,
        TaskSpec,
        TaskStatus,
        TriggerRule,
        WorkerSession,
        WorkerSessionPage,
        Workflow,
        WorkflowCancelResult,
        WorkflowCreateResult,
        WorkflowDetail,
        WorkflowEdge,
        WorkflowPage,
        WorkflowRetryResult,
        WorkflowState,
        WorkflowTask,
        WorkflowTaskState,
        WorkflowTemplate,
    )

# public name -> module that defines it
_LAZY: dict[str, str] = {
    **dict.fromkeys(("Client", "TLSConfig"), "chronoshard.client"),
    "SyncClient": "chronoshard.sync_client",
    "SubmitStream": "chronoshard._submit_stream",
    **dict.fromkeys(
        (
            "AbortedError",
            "AlreadyExistsError",
            "ChronoshardError",
            "DeadlineExceededError",
            "FailedPreconditionError",
            "InternalError",
            "InvalidArgumentError",
            "NotFoundError",
            "NotSentError",
            "PermissionDeniedError",
            "ProtocolError",
            "QuotaExceededError",
            "ResourceExhaustedError",
            "StaleFencingTokenError",
            "UnauthenticatedError",
            "UnavailableError",
            "WrongRegionError",
        ),
        "chronoshard.errors",
    ),
    **dict.fromkeys(
        (
            "AlertSeverity",
            "AttemptState",
            "BackfillResult",
            "CatchupPolicy",
            "Incident",
            "JitterMode",
            "OverlapPolicy",
            "Priority",
            "Resolution",
            "RetryPolicy",
            "RunOrigin",
            "Schedule",
            "ScheduleDetails",
            "SchedulePage",
            "ScheduleRun",
            "ScheduleSpec",
            "ScheduleWatch",
            "SubmitResult",
            "Task",
            "TaskAttempt",
            "TaskPage",
            "TaskSpec",
            "TaskStatus",
            "TriggerRule",
            "WorkerSession",
            "WorkerSessionPage",
            "Workflow",
            "WorkflowCancelResult",
            "WorkflowCreateResult",
            "WorkflowDetail",
            "WorkflowEdge",
            "WorkflowPage",
            "WorkflowRetryResult",
            "WorkflowState",
            "WorkflowTask",
            "WorkflowTaskState",
            "WorkflowTemplate",
        ),
        "chronoshard.types",
    ),
}

__all__ = [
    "AbortedError",
    "AlertSeverity",
    "AlreadyExistsError",
    "AttemptState",
    "BackfillResult",
    "CatchupPolicy",
    "ChronoshardError",
    "Client",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "Incident",
    "InternalError",
    "InvalidArgumentError",
    "JitterMode",
    "NotFoundError",
    "NotSentError",
    "OverlapPolicy",
    "PermissionDeniedError",
    "Priority",
    "ProtocolError",
    "QuotaExceededError",
    "Resolution",
    "ResourceExhaustedError",
    "RetryPolicy",
    "RunOrigin",
    "Schedule",
    "ScheduleDetails",
    "SchedulePage",
    "ScheduleRun",
    "ScheduleSpec",
    "ScheduleWatch",
    "StaleFencingTokenError",
    "SubmitResult",
    "SubmitStream",
    "SyncClient",
    "TLSConfig",
    "Task",
    "TaskAttempt",
    "TaskPage",
    "TaskSpec",
    "TaskStatus",
    "TriggerRule",
    "UnauthenticatedError",
    "UnavailableError",
    "WorkerSession",
    "WorkerSessionPage",
    "Workflow",
    "WorkflowCancelResult",
    "WorkflowCreateResult",
    "WorkflowDetail",
    "WorkflowEdge",
    "WorkflowPage",
    "WorkflowRetryResult",
    "WorkflowState",
    "WorkflowTask",
    "WorkflowTaskState",
    "WorkflowTemplate",
    "WrongRegionError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chronoshard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
