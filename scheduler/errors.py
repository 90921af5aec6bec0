"""The scheduler's exception hierarchy: one root, translated at the boundary.

Every error the scheduler raises on purpose derives from :class:`SchedulerError`. Each
class carries a machine-readable ``reason`` (sent to clients in the gRPC error details)
and a ``retryable`` flag that drives retry logic. Driver errors (psycopg, etcd, grpc) are
mapped to these once, at the module that talks to the driver, and chained ``from exc``.
The servicer alone chooses gRPC status codes (see ``grpc_code`` below, the one table).
"""

from __future__ import annotations

import math
import uuid
from typing import ClassVar

SHOWN_CHARS = 40
"""How much of a value taken from a request an error message quotes (see :func:`shown`)."""


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters.

    A message never echoes a request field whole: a 1 MiB id quoted in full made the
    error trailer overflow gRPC's header limit, and the client saw ``RESOURCE_EXHAUSTED:
    Stream removed`` instead of the refusal.
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


_UNITS = (("year", 365 * 86_400), ("day", 86_400), ("hour", 3_600), ("minute", 60))


def seconds_text(seconds: float) -> str:
    """A duration as people read it: ``315360000 s (10 years)``, ``1.5 s``, never
    ``3.1536e+08 s``."""
    if math.isfinite(seconds) and seconds == int(seconds):
        text = f"{int(seconds)} s"
    else:
        text = f"{seconds:.9f}".rstrip("0").rstrip(".") + " s"
    for unit, size in _UNITS:
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{text} ({count} {unit}{'' if count == 1 else 's'})"
    return text


class SchedulerError(Exception):
    """Root of every error the scheduler raises on purpose."""

    reason: ClassVar[str] = "INTERNAL"
    retryable: ClassVar[bool] = False
    grpc_code_name: ClassVar[str] = "INTERNAL"


class InvalidArgument(SchedulerError):
    """Raised when a request field is invalid; ``field`` names it. Nothing was written."""

    reason = "INVALID_ARGUMENT"
    grpc_code_name = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class PayloadTooLarge(InvalidArgument):
    """Raised when a payload exceeds the configured limit. Nothing was written."""

    reason = "PAYLOAD_TOO_LARGE"

    def __init__(self, field: str, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(field, f"{size_bytes} bytes is over the limit of {limit_bytes} bytes")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class TenantNotFound(SchedulerError):
    """Raised when a write names a tenant that does not exist. Nothing was written."""

    reason = "TENANT_NOT_FOUND"
    grpc_code_name = "NOT_FOUND"

    def __init__(self, tenant_id: uuid.UUID | str) -> None:
        super().__init__(f"tenant {tenant_id} does not exist")
        self.tenant_id = tenant_id


class TaskNotFound(SchedulerError):
    """Raised when a task does not exist or belongs to another tenant (never an oracle)."""

    reason = "TASK_NOT_FOUND"
    grpc_code_name = "NOT_FOUND"

    def __init__(self, task_id: uuid.UUID | str) -> None:
        super().__init__(f"task {task_id} not found")
        self.task_id = task_id


class IdempotencyConflict(SchedulerError):
    """Raised when an idempotency key is reused with a different request.

    A repeat of the *same* request is not an error: it returns the original task.
    """

    reason = "IDEMPOTENCY_KEY_REUSED"
    grpc_code_name = "ALREADY_EXISTS"

    def __init__(self, key: str, original_task_id: uuid.UUID) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used by task {original_task_id} "
            "with a different request"
        )
        self.key = key
        self.original_task_id = original_task_id


class InvalidTransition(SchedulerError):
    """Raised by the state machine when an event is not allowed from the current state."""

    reason = "INVALID_TRANSITION"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, current: str, event: str) -> None:
        super().__init__(f"event {event} is not allowed in state {current}")
        self.current = current
        self.event = event


class StaleFencingToken(SchedulerError):
    """Raised when a worker presents a fencing token that is no longer the task's."""

    reason = "STALE_FENCING_TOKEN"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, task_id: uuid.UUID | str, token: int) -> None:
        super().__init__(f"fencing token {token} is stale for task {task_id}")
        self.task_id = task_id
        self.token = token


class ShardEpochLost(SchedulerError):
    """Raised when a shard write finds that another owner raised the shard's epoch.

    The node must stop the shard: it no longer owns it.
    """

    reason = "SHARD_EPOCH_LOST"
    grpc_code_name = "UNAVAILABLE"

    def __init__(self, shard: int, epoch: int) -> None:
        super().__init__(f"shard {shard}: epoch {epoch} has been superseded")
        self.shard = shard
        self.epoch = epoch


class CompareAndSetLost(SchedulerError):
    """Raised when a conditional write changed nothing because the row moved on."""

    reason = "COMPARE_AND_SET_LOST"
    retryable = True
    grpc_code_name = "ABORTED"


class QuotaExceeded(SchedulerError):
    """Raised when a tenant is over its rate or concurrency quota."""

    reason = "QUOTA_EXCEEDED"
    retryable = True
    grpc_code_name = "RESOURCE_EXHAUSTED"


class StoreUnavailable(SchedulerError):
    """Raised when PostgreSQL cannot be reached or a statement failed transiently."""

    reason = "STORE_UNAVAILABLE"
    retryable = True
    grpc_code_name = "UNAVAILABLE"


class CommitOutcomeUnknown(StoreUnavailable):
    """Raised when the connection failed while a transaction was committing: it may have
    committed or not (DESIGN §12: settle it by reading the rows back, never by a blind
    retry of a write that is not idempotent).

    Raised to a caller only once reading back could not tell either: a write that is
    idempotent (a keyed submit, a settlement) may be repeated; any other may then exist
    twice.
    """

    reason = "COMMIT_OUTCOME_UNKNOWN"


class CommitterStopped(SchedulerError):
    """Raised by a group committer that stopped (the node is shutting down) or whose
    flusher is gone: the request was not queued, nothing of it was written. Retryable
    on another node (a worker resends a settlement so refused elsewhere)."""

    reason = "NODE_STOPPING"
    retryable = True
    grpc_code_name = "UNAVAILABLE"

    def __init__(self, committer: str) -> None:
        super().__init__(
            f"the scheduler node is stopping (its {committer!r} group commit is closed): "
            "nothing was written; send it to another node"
        )
        self.committer = committer


class MigrationError(SchedulerError):
    """Raised by ``chronoshard migrate`` when the schema cannot be brought up to date:
    an applied migration's file changed, migrations are missing or out of order, or a
    migration failed (its transaction was rolled back; nothing of it was applied)."""

    reason = "MIGRATION_FAILED"
    grpc_code_name = "FAILED_PRECONDITION"


UNAUTHENTICATED_MESSAGE = "missing or invalid API key: send 'authorization: Bearer <key>'"


class Unauthenticated(SchedulerError):
    """Raised when a call carries no API key, a malformed one, or one no tenant holds.

    The message is always :data:`UNAUTHENTICATED_MESSAGE`, whichever it was: a caller
    learns nothing about which keys exist.
    """

    reason = "UNAUTHENTICATED"
    grpc_code_name = "UNAUTHENTICATED"

    def __init__(self) -> None:
        super().__init__(UNAUTHENTICATED_MESSAGE)


class TaskAlreadyFinished(SchedulerError):
    """Raised when a cancel names a task that already reached a terminal state other than
    CANCELLED (cancelling a CANCELLED task returns it unchanged). Nothing was written."""

    reason = "TASK_ALREADY_FINISHED"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, task_id: uuid.UUID | str, status: str) -> None:
        super().__init__(f"task {task_id} is already {status}")
        self.task_id = task_id
        self.status = status


class NothingToResolve(SchedulerError):
    """Raised when ``ResolveTask`` names a task that is not OUTCOME_UNKNOWN (and is not a
    repeat of a resolution already applied to it). Nothing was written."""

    reason = "NOTHING_TO_RESOLVE"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, task_id: uuid.UUID | str, status: str) -> None:
        super().__init__(
            f"task {task_id} is {status}: only an OUTCOME_UNKNOWN task can be resolved"
        )
        self.task_id = task_id
        self.status = status


class PermissionDenied(SchedulerError):
    """Raised when an authenticated caller asks for something its key does not allow:
    a tenant key calling an operator-only admin operation. Nothing was done."""

    reason = "PERMISSION_DENIED"
    grpc_code_name = "PERMISSION_DENIED"
