"""The scheduler's exception hierarchy: one root, translated at the boundary.

Every error the scheduler raises on purpose derives from :class:`SchedulerError`. Each
class carries a machine-readable ``reason`` (sent to clients in the gRPC error details)
and a ``retryable`` flag that drives retry logic. Driver errors (psycopg, etcd, grpc) are
mapped to these once, at the module that talks to the driver, and chained ``from exc``.
gRPC status codes are chosen here and nowhere else: each class names its own
(``grpc_code_name``), and :data:`SETTLE_OUTCOME_ERRORS` names those of the settlement
outcomes that are not errors raised (a stale token, a cancelled or unknown task). The
servicers' boundary (:mod:`chronoshard.scheduler.api.boundary`) turns either into a status.
"""

from __future__ import annotations

import math
import uuid
from typing import ClassVar

# Re-exported: the servicers quote request values through these.
from chronoshard.quoting import SHOWN_CHARS as SHOWN_CHARS
from chronoshard.quoting import shown as shown

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


class CompareAndSetLost(SchedulerError):
    """Raised when a conditional write changed nothing because the row moved on."""

    reason = "COMPARE_AND_SET_LOST"
    retryable = True
    grpc_code_name = "ABORTED"


class StoreUnavailable(SchedulerError):
    """Raised when PostgreSQL cannot be reached or a statement failed transiently."""

    reason = "STORE_UNAVAILABLE"
    retryable = True
    grpc_code_name = "UNAVAILABLE"


class CommitOutcomeUnknown(StoreUnavailable):
    """Raised when the connection failed while a transaction was committing: it may have
    committed or not (docs/architecture.md#d12: settle it by reading the rows back, never by a blind
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


class QuotaExceeded(SchedulerError):
    """Raised when a tenant's call is over one of its quotas (its submit rate): nothing
    was written. ``retry_after_s`` is how long the client should wait before sending it
    again (the gRPC status carries it as ``google.rpc.RetryInfo``)."""

    reason = "QUOTA_EXCEEDED"
    retryable = True
    grpc_code_name = "RESOURCE_EXHAUSTED"

    def __init__(self, quota: str, limit: float, retry_after_s: float) -> None:
        super().__init__(
            f"over the tenant's {quota} of {limit:g}/s: nothing was written; "
            f"retry in {retry_after_s:.3f} s"
        )
        self.quota = quota
        self.limit = limit
        self.retry_after_s = retry_after_s


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


class NodeNotFound(SchedulerError):
    """Raised when an AdminService call names a node that is not live. Nothing was done."""

    reason = "NODE_NOT_FOUND"
    grpc_code_name = "NOT_FOUND"

    def __init__(self, node_id: str) -> None:
        super().__init__(f"no live node {shown(node_id)}")
        self.node_id = node_id
        self.field = "node_id"


class WrongNode(SchedulerError):
    """Raised when DrainNode/UndrainNode names another live node: it acts on the node
    asked only; the message says where to ask. Nothing was done."""

    reason = "WRONG_NODE"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, node_id: str, address: str, verb: str) -> None:
        super().__init__(f"ask node {shown(node_id)} (at {address}) to {verb} itself")
        self.node_id = node_id
        self.field = "node_id"


class WrongRegion(SchedulerError):
    """Raised when the caller's tenant is homed in another region than this cluster's
    (and not one it adopted in a disaster recovery): the error details name the home
    region (``metadata["home_region"]``) so the client can follow it. Nothing was done."""

    reason = "WRONG_REGION"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, tenant_name: str, home_region: str, region: str) -> None:
        super().__init__(
            f"tenant {shown(tenant_name)} is homed in region {shown(home_region)}; this "
            f"cluster serves region {shown(region)}: send the call to a node of "
            f"{shown(home_region)}"
        )
        self.metadata = {"home_region": home_region, "region": region}


class ExpectationNotFound(SchedulerError):
    """Raised when DeleteExpectation names a job the tenant has no expectation for."""

    reason = "EXPECTATION_NOT_FOUND"
    grpc_code_name = "NOT_FOUND"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no expectation for job {shown(job_id)}")
        self.field = "job_id"


class ExpectationManagedByConfig(SchedulerError):
    """Raised when the API is asked to change or delete an expectation that the
    watchdog's config file defines; nothing was written."""

    reason = "EXPECTATION_MANAGED_BY_CONFIG"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"the expectation for job {shown(job_id)} is defined in the watchdog's config file; "
            "change it there"
        )
        self.field = "job_id"


class ScheduleNotFound(SchedulerError):
    """Raised when a schedule does not exist or belongs to another tenant."""

    reason = "SCHEDULE_NOT_FOUND"
    grpc_code_name = "NOT_FOUND"

    def __init__(self, name_or_id: str) -> None:
        super().__init__(f"schedule {shown(name_or_id)} not found")
        self.field = "id"


class ScheduleExists(SchedulerError):
    """Raised when a tenant already has a schedule of the name asked for; nothing written."""

    reason = "SCHEDULE_EXISTS"
    grpc_code_name = "ALREADY_EXISTS"

    def __init__(self, name: str) -> None:
        super().__init__(f"a schedule named {shown(name)} exists")
        self.field = "spec.name"


class WorkflowNotFound(SchedulerError):
    """Raised when a workflow does not exist or belongs to another tenant."""

    reason = "WORKFLOW_NOT_FOUND"
    grpc_code_name = "NOT_FOUND"

    def __init__(self, workflow_id: uuid.UUID | str) -> None:
        super().__init__(f"workflow {shown(str(workflow_id))} not found")
        self.field = "id"


class WorkflowStillRunning(SchedulerError):
    """Raised when ``RetryWorkflow`` names a run that has not finished: a task still live
    below a failure cannot be reopened under its worker. Nothing was written."""

    reason = "WORKFLOW_RUNNING"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, workflow_id: uuid.UUID) -> None:
        super().__init__(
            f"workflow {workflow_id} is still running: wait for it to finish, or cancel "
            "it, then retry"
        )
        self.field = "id"


class WorkflowKeyReused(SchedulerError):
    """Raised when a workflow create reuses an idempotency key of the tenant's for a
    different request. A repeat of the same request returns the original run."""

    reason = "IDEMPOTENCY_KEY_REUSED"
    grpc_code_name = "ALREADY_EXISTS"

    def __init__(self, key: str, original: uuid.UUID) -> None:
        super().__init__(
            f"idempotency key {shown(key)} was already used by workflow {original} "
            "with a different request"
        )
        self.field = "idempotency_key"


class PartOfWorkflow(SchedulerError):
    """Raised when ``RetryTask`` names a task of a workflow: reopening it alone would
    leave its UPSTREAM_FAILED descendants failed and the run finished. Nothing written."""

    reason = "PART_OF_WORKFLOW"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, task_id: uuid.UUID, workflow_id: uuid.UUID) -> None:
        super().__init__(
            f"task {task_id} belongs to workflow {workflow_id}: retry the workflow "
            "(RetryWorkflow), which reopens it with its descendants"
        )
        self.field = "id"


SETTLE_OUTCOME_ERRORS: dict[str, tuple[str, str]] = {
    "STALE_FENCING_TOKEN": (
        "FAILED_PRECONDITION",
        "the fencing token is no longer current: another attempt owns the task; abort this one",
    ),
    "TASK_CANCELLED": ("FAILED_PRECONDITION", "the task was cancelled"),
    "TASK_NOT_FOUND": ("NOT_FOUND", "no such task"),
}
"""The gRPC status code and message of each settlement outcome that is not OK
(:class:`chronoshard.scheduler.core.runs.SettleOutcome`, keyed by its value; the reason
sent is the value itself)."""
