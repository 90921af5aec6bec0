"""Writing submits in batches: key resolution, column arrays, and group commit.

A submit is written as part of a batch whatever its origin: the items of one
``SubmitBatch`` call, or single ``SubmitTask`` calls from many clients that
:class:`SubmitCoalescer` gathers for a few milliseconds (docs/architecture.md#d7's group commit,
applied to the submit path). A batch costs a handful of statements however many tasks
it holds: the idempotency keys are claimed in one ``INSERT ... ON CONFLICT DO NOTHING``,
read back in one ``SELECT``, and the tasks go in with one ``INSERT ... SELECT FROM
unnest(...)`` (one array per column), all in one transaction.

The pure half lives here and is unit-tested without a database: :func:`resolve_keys`
decides, from who owns each key after the claim, whether a request inserts its own task,
repeats an earlier identical request (answered with the original task, ``created`` False)
or reuses a key for a different request (:class:`~.errors.IdempotencyConflict`, for that
request alone). :func:`insert_columns` turns prepared tasks into the statement's arrays.

Group commit never acknowledges early: each caller's future is resolved only after the
batch's transaction committed, with that caller's own outcome. A request that fails on
its own (a key conflict, an unknown tenant) fails alone. If the batch's transaction fails
as a whole with an unexpected error (one bad row would take down its neighbours), every
request is retried alone, so the culprit fails by itself exactly as without coalescing;
a ``StoreUnavailable`` (nothing was written) is every caller's answer, as it would have
been for each of them. A batch whose commit outcome was unknown has been read back by
the store before it answers; only when that could not tell either do the callers get
``CommitOutcomeUnknown`` (the task may exist: repeat it only with its idempotency key).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chronoshard.scheduler.core.models import PreparedTask, SubmitResult, TaskRef
from chronoshard.scheduler.errors import IdempotencyConflict, StoreUnavailable

if TYPE_CHECKING:
    from chronoshard.scheduler.store.database import Store

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


@dataclass
class _Waiting:
    request: Request
    future: asyncio.Future[SubmitResult]


class SubmitCoalescer:
    """Group commit for single submits: concurrent calls share one transaction.

    ``submit`` queues the request and waits. A flusher task, started by the first
    request and gone once the queue is empty (so there is nothing to start or stop),
    lingers ``linger_s`` for company, then writes up to ``max_batch`` queued requests
    with :meth:`Store.insert_each`. While it writes, new requests queue up, so batches
    grow with load while a lone request waits one linger plus one transaction.
    """

    def __init__(
        self,
        store: Store,
        *,
        linger_s: float = DEFAULT_LINGER_S,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._store = store
        self._linger_s = linger_s
        self._max_batch = max_batch
        self._queue: list[_Waiting] = []
        self._flusher: asyncio.Task[None] | None = None
        self.stats: dict[str, int] = {"batches": 0, "requests": 0, "isolated_retries": 0}

    async def submit(self, tenant_id: uuid.UUID, prepared: PreparedTask) -> SubmitResult:
        """Write one task (in some batch); its result once the batch committed.

        Raises what :meth:`Store.insert_prepared` raises for a batch of this one task."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting((tenant_id, prepared), loop.create_future())
        self._queue.append(waiting)
        if self._flusher is None:
            self._flusher = loop.create_task(self._drain(), name="submit-group-commit")
        return await waiting.future

    async def _drain(self) -> None:
        try:
            while self._queue:
                if self._linger_s > 0 and len(self._queue) < self._max_batch:
                    await asyncio.sleep(self._linger_s)
                batch = self._queue[: self._max_batch]
                del self._queue[: len(batch)]
                live = [w for w in batch if not w.future.done()]
                if live:
                    await self._write(live)
        finally:
            # No await between the loop's last check and here: a request queued after
            # it finds no flusher and starts one.
            self._flusher = None

    async def _write(self, batch: list[_Waiting]) -> None:
        self.stats["batches"] += 1
        self.stats["requests"] += len(batch)
        try:
            outcomes = await self._store.insert_each([w.request for w in batch])
        except StoreUnavailable as exc:
            # The transaction failed as a whole: nothing of the batch was written, or
            # (CommitOutcomeUnknown) the store could not find out. Each caller gets its
            # own exception of the same kind.
            for w in batch:
                _settle(w.future, type(exc)(str(exc)))
            return
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0].future, exc)
                return
            log.warning("submit batch failed; writing its requests one by one", exc_info=True)
            await self._isolate(batch)
            return
        for w, outcome in zip(batch, outcomes, strict=True):
            _settle(w.future, outcome)

    async def _isolate(self, batch: list[_Waiting]) -> None:
        self.stats["isolated_retries"] += len(batch)
        for w in batch:
            tenant_id, prepared = w.request
            try:
                [result] = await self._store.insert_prepared(tenant_id, [prepared])
            except Exception as exc:
                _settle(w.future, exc)
            else:
                _settle(w.future, result)


def _settle(future: asyncio.Future[SubmitResult], outcome: SubmitResult | BaseException) -> None:
    # A caller that went away (its RPC cancelled) left a done future behind.
    with contextlib.suppress(asyncio.InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
