"""Writing submits in batches: key resolution and column arrays.

A submit is written as part of a batch whatever its origin: the items of one
``SubmitBatch`` call, or single ``SubmitTask`` calls from many clients that the
TaskService's group commit gathers for a few milliseconds
(:func:`chronoshard.scheduler.api.tasks.submit_committer`, docs/architecture.md#d7's group
commit applied to the submit path). A batch costs a handful of statements however many tasks
it holds: the idempotency keys are claimed in one ``INSERT ... ON CONFLICT DO NOTHING``,
read back in one ``SELECT``, and the tasks go in with one ``INSERT ... SELECT FROM
unnest(...)`` (one array per column), all in one transaction.

The pure half lives here and is unit-tested without a database: :func:`resolve_keys`
decides, from who owns each key after the claim, whether a request inserts its own task,
repeats an earlier identical request (answered with the original task, ``created`` False)
or reuses a key for a different request (:class:`~.errors.IdempotencyConflict`, for that
request alone). :func:`insert_columns` turns prepared tasks into the statement's arrays.

Group commit never acknowledges early: each caller is answered only after the batch's
transaction committed, with its own outcome (:meth:`Store.insert_each` returns one per
request). A batch whose commit outcome was unknown has been read back by the store before
it answers; only when that could not tell either do the callers get
``CommitOutcomeUnknown`` (the task may exist: repeat it only with its idempotency key).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chronoshard.scheduler.core.models import PreparedTask, TaskRef
from chronoshard.scheduler.errors import IdempotencyConflict

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

DEFAULT_LINGER_S = 0.002
DEFAULT_MAX_BATCH = 1000

Request = tuple[uuid.UUID, PreparedTask]
"""One submit: the tenant and its validated task."""


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """The task holding an idempotency key, as ``idempotency_keys`` records it."""

    task_id: uuid.UUID
    scheduled_at: datetime
    fingerprint: str


Resolution = TaskRef | IdempotencyConflict | None
"""None: insert the request's own task; a ref: a repeat of that task; a conflict."""


def keyed_in_claim_order(requests: Sequence[Request]) -> list[Request]:
    """The requests that carry a key, ordered by (tenant, key), first occurrence first.

    Every batch claims its keys in this order, so two batches sharing keys take their
    row locks in the same order and cannot deadlock."""
    keyed = [r for r in requests if r[1].new.idempotency_key is not None]
    return sorted(keyed, key=lambda r: (str(r[0]), str(r[1].new.idempotency_key)))


def resolve_keys(
    requests: Sequence[Request], owners: Mapping[tuple[uuid.UUID, str], KeyOwner]
) -> list[Resolution]:
    """What each request does, given the owner of every key after the batch's claim.

    ``owners`` must hold every key of ``requests`` (the claim guarantees an owner)."""
    resolutions: list[Resolution] = []
    for tenant_id, prepared in requests:
        key = prepared.new.idempotency_key
        if key is None:
            resolutions.append(None)
            continue
        owner = owners[(tenant_id, key)]
        if owner.task_id == prepared.new.id:
            resolutions.append(None)
        elif owner.fingerprint == prepared.fingerprint:
            resolutions.append(TaskRef(owner.scheduled_at, owner.task_id))
        else:
            resolutions.append(IdempotencyConflict(key, owner.task_id))
    return resolutions


def insert_columns(requests: Sequence[Request]) -> dict[str, list[Any]]:
    """The arrays of ``insert_tasks``, one per column, in request order."""
    columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    for tenant_id, prepared in requests:
        new = prepared.new
        values = (
            new.id,
            tenant_id,
            new.type,
            new.scheduled_at,
            new.due_at,
            new.idempotency_key,
            new.max_retries,
            float(new.backoff_initial_s),
            float(new.backoff_max_s),
            float(new.backoff_multiplier),
            str(new.jitter_mode),
            prepared.payload_json,
            new.shard,
            str(new.priority),
            new.queue,
            new.strict_timing,
            new.idempotent,
            None if new.timeout_s is None else float(new.timeout_s),
            new.job_id,
            new.workflow_id,
            new.unresolved_dependencies,
            new.schedule_id,
            new.logical_date,
            None if new.trace_context is None else json.dumps(new.trace_context),
            new.submitted_by,
        )
        for name, value in zip(_COLUMNS, values, strict=True):
            columns[name].append(value)
    return columns


_COLUMNS = (
    "id",
    "tenant_id",
    "type",
    "scheduled_at",
    "due_at",
    "idempotency_key",
    "max_retries",
    "backoff_initial_s",
    "backoff_max_s",
    "backoff_multiplier",
    "jitter_mode",
    "payload",
    "shard",
    "priority",
    "queue",
    "strict_timing",
    "idempotent",
    "timeout_s",
    "job_id",
    "workflow_id",
    "unresolved_dependencies",
    "schedule_id",
    "logical_date",
    "trace_context",
    "submitted_by",
)
