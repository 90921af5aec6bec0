"""Writing submits in batches: :class:`SubmitStore`, and its pure half (key resolution,
column arrays).

A submit is written as part of a batch whatever its origin: the items of one
``SubmitBatch`` call, or single ``SubmitTask`` calls from many clients that the
TaskService's group commit gathers for a few milliseconds
(:func:`chronoshard.scheduler.api.tasks.submit_committer`, docs/architecture.md#d7's group
commit applied to the submit path). A batch costs a handful of statements however many tasks
it holds (``sql/submits.sql``): the idempotency keys are claimed in one ``INSERT ... ON
CONFLICT DO NOTHING``, read back in one ``SELECT``, and the tasks go in with one ``INSERT
... SELECT FROM unnest(...)`` (one array per column), all in one transaction. A batch
without keys (most single submits) is that INSERT alone, self-committing
(:meth:`Store.self_committing`): one statement instead of four (BEGIN, the tenant check,
the INSERT, COMMIT), the tenant check inside it.

**Who writes.** A ``SubmitBatch`` (one tenant) runs as its tenant: row-level security
refuses a row of any other tenant (docs/operations.md#row-level-security), keys or none.
With keys it is :meth:`SubmitStore.insert_tasks`, a :meth:`Store.tenant_transaction`;
without, :meth:`SubmitStore.insert_streamed`, a :meth:`Store.tenant_pipelined_transaction`
whose INSERTs, one per chunk of the batch, go out as the chunks are validated. Group commit's
batches (:meth:`SubmitStore.insert_each`) hold many tenants' submits in one statement,
which no single tenant setting could admit: they run as the node's own role, which RLS
does not restrict, and what keeps them to their tenants is that each request's tenant is
the one its API key authenticated (the servicer builds the pair; a request field never
names a tenant).

The store validates nothing: it takes :class:`~chronoshard.scheduler.core.models.PreparedTask`
values, which the wire (``api.task_requests.submit_from_pb``) validated and built. What
it does own:

* **All or nothing.** :meth:`SubmitStore.insert_tasks` writes a batch in one
  transaction, or nothing (an unknown tenant, two tasks with one id, a reused key).
* **Idempotent submits.** A key is claimed in ``idempotency_keys`` (``ON CONFLICT DO
  NOTHING``) in the same transaction as its task, so of two concurrent submits of one key
  exactly one commits a task; the other waits for it, then answers with that task (same
  request fingerprint) or :class:`~.errors.IdempotencyConflict` (different request).
  :func:`resolve_keys` decides, from who owns each key after the claim, whether a request
  inserts its own task, repeats an earlier identical request (answered with the original
  task, ``created`` False) or reuses a key for a different request; it and
  :func:`insert_params` (prepared tasks as the statement's parameters) are pure and
  unit-tested without a database.
* **Unknown outcomes are read back.** A batch whose commit outcome is unknown is settled
  by reading its rows back once PostgreSQL answers again: found, the batch committed and
  each caller gets its task; not found, nothing was written and the caller may retry. It
  is never written again blindly (an unkeyed submit would then exist twice). The
  read-back first ends the backend that ran the lost transaction
  (:meth:`Store.end_lost_transactions`), so that its COMMIT cannot land afterwards.

Group commit never acknowledges early: each caller is answered only after the batch's
transaction committed, with its own outcome (:meth:`SubmitStore.insert_each` returns one
per request). A batch whose commit outcome was unknown has been read back before it
answers; only when that could not tell either do the callers get
``CommitOutcomeUnknown`` (the task may exist: repeat it only with its idempotency key).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import dict_row

from chronoshard.scheduler.core.models import (
    PreparedTask,
    SubmitResult,
    Task,
    TaskRef,
    inserted_task,
)
from chronoshard.scheduler.errors import (
    CommitOutcomeUnknown,
    IdempotencyConflict,
    InvalidArgument,
    SchedulerError,
    StoreUnavailable,
    TaskNotFound,
    TenantNotFound,
)
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import (
    READ_BACK_RETRY_S,
    READ_BACK_TIMEOUT_S,
    Connection,
    Store,
    task_from_row,
)

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


def insert_row(tenant_id: uuid.UUID, prepared: PreparedTask) -> tuple[Any, ...]:
    """One request's values for the insert statements, in ``_COLUMNS`` order."""
    new = prepared.new
    return (
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


def insert_params(requests: Sequence[Request]) -> tuple[str, dict[str, Any]]:
    """The insert statement for ``requests`` and its parameters: ``insert_task``'s scalars
    for one request, else ``insert_tasks``' arrays (one per column, in request order)."""
    if len(requests) == 1:
        return "insert_task", dict(zip(_COLUMNS, insert_row(*requests[0]), strict=True))
    rows = [insert_row(tenant_id, prepared) for tenant_id, prepared in requests]
    return "insert_tasks", {
        name: list(column) for name, column in zip(_COLUMNS, zip(*rows, strict=True), strict=True)
    }


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


class SubmitStore:
    """The submit write path over ``store``'s pool (module docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load("submits.sql")

    # --- writes -----------------------------------------------------------------------

    async def insert_tasks(
        self, tenant_id: uuid.UUID, prepared: Sequence[PreparedTask]
    ) -> list[SubmitResult]:
        """Insert ``prepared`` for ``tenant_id`` in one transaction; one result per task,
        in order.

        A task whose idempotency key was used before by the same request (equal
        fingerprint) is not inserted: its result is the original task with
        ``created=False``.

        Raises:
            InvalidArgument: two tasks share an id.
            TenantNotFound: ``tenant_id`` does not exist.
            IdempotencyConflict: a key was used before with a different request.
            StoreUnavailable: PostgreSQL failed; the batch may be retried as a whole.
        Nothing is written when any of these is raised. Of several failing tasks, the
        first in ``prepared`` order is reported.
        """
        if len({p.new.id for p in prepared}) != len(prepared):
            raise InvalidArgument("id", _REPEATED_ID)
        if not prepared:
            return []
        requests = [(tenant_id, p) for p in prepared]
        try:
            async with self._store.tenant_transaction(tenant_id) as conn:
                if _keyless(requests):
                    # One tenant: its rows all go in, or none (an unknown tenant).
                    outcomes = await self._insert_keyless(conn, requests)
                    _raise_first(outcomes)
                else:
                    outcomes = await self._write_submits(conn, requests, all_or_nothing=True)
        except CommitOutcomeUnknown as exc:
            outcomes = await self._read_back_submits(
                requests, exc, all_or_nothing=True, tenant_id=tenant_id
            )
        return [o for o in outcomes if isinstance(o, SubmitResult)]

    async def insert_streamed(
        self, tenant_id: uuid.UUID, chunks: AsyncIterable[Sequence[PreparedTask]]
    ) -> list[SubmitResult]:
        """Insert keyless tasks for ``tenant_id`` as ``chunks`` yields them, all in one
        transaction; one result per task, in order.

        A ``SubmitBatch`` without idempotency keys (the bulk load): each chunk's INSERT is
        sent as soon as the chunk is ready, without waiting for the previous one's answer
        (a :meth:`Store.tenant_pipelined_transaction`), so PostgreSQL writes a chunk while
        the node validates the next and builds the tasks of the one before. Written in one
        statement after the whole batch was validated, the node waited for PostgreSQL and
        PostgreSQL for the node (bench/README.md, "Submit batches in chunks").

        All or nothing, as :meth:`insert_tasks`: an exception from ``chunks`` (an invalid
        item, the submit rate) or from the store rolls every chunk back. The last chunk's
        rows are read before the COMMIT is sent, so a batch missing rows is never
        committed.

        Raises:
            InvalidArgument: a task repeats the id of an earlier one, or carries an
                idempotency key (keyed batches go through :meth:`insert_tasks`).
            TenantNotFound: ``tenant_id`` does not exist.
            StoreUnavailable: PostgreSQL failed; nothing was written (or, for
                ``CommitOutcomeUnknown``, the read-back could not tell).
        """
        requests: list[Request] = []
        inserted: dict[uuid.UUID, Task] = {}
        seen: set[uuid.UUID] = set()
        try:
            async with self._store.tenant_pipelined_transaction(tenant_id) as conn:
                unread: tuple[AsyncCursor[Any], list[Request]] | None = None
                async for chunk in chunks:
                    batch = [(tenant_id, p) for p in chunk]
                    if not batch:
                        continue
                    _check_streamable(batch, seen)
                    requests.extend(batch)
                    sent = (await self._send_insert(conn, batch), batch)
                    if unread is not None:
                        inserted.update(await self._read_inserted(*unread))
                    unread = sent
                if unread is not None:
                    inserted.update(await self._read_inserted(*unread))
        except CommitOutcomeUnknown as exc:
            outcomes = await self._read_back_submits(
                requests, exc, all_or_nothing=True, tenant_id=tenant_id
            )
            return [o for o in outcomes if isinstance(o, SubmitResult)]
        return [SubmitResult(inserted[p.new.id], created=True) for _, p in requests]

    async def insert_each(self, requests: Sequence[Request]) -> list[SubmitResult | SchedulerError]:
        """Write submits of any tenants in one transaction, each with its own outcome.

        What group commit writes (:func:`~chronoshard.scheduler.api.tasks.submit_committer`):
        a request that would fail alone (an unknown tenant, a key reused with a different
        request, an id already in the batch) gets its error in its place, and the others
        are written. As the node's role, not under row-level security (module docstring:
        the batch holds several tenants' rows).

        Raises:
            StoreUnavailable: PostgreSQL failed; nothing was written.
        """
        if not requests:
            return []
        try:
            if _keyless(requests):
                async with self._store.self_committing() as conn:
                    return await self._insert_keyless(conn, requests)
            async with self._store.transaction() as conn:
                return await self._write_submits(conn, requests, all_or_nothing=False)
        except CommitOutcomeUnknown as exc:
            return await self._read_back_submits(
                requests, exc, all_or_nothing=False, tenant_id=None
            )

    async def _read_back_submits(
        self,
        requests: Sequence[Request],
        unknown: CommitOutcomeUnknown,
        *,
        all_or_nothing: bool,
        tenant_id: uuid.UUID | None,
    ) -> list[SubmitResult | SchedulerError]:
        """Settle a submit batch whose commit outcome is unknown by reading it back, as
        ``tenant_id`` when the batch was one tenant's (None: group commit, as the node).

        The batch was one transaction, so either every task it inserted exists or none
        does. None found: nothing was written (or the batch inserted nothing: repeats and
        conflicts only), so StoreUnavailable tells the callers to retry. Found: the batch
        committed; each request whose own row exists gets it, and the others (repeats of
        a key, conflicts, a request that failed on its own) are answered by writing them
        again, which for them inserts nothing.

        Raises:
            CommitOutcomeUnknown: PostgreSQL did not answer within READ_BACK_TIMEOUT_S.
        """
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while True:
            try:
                await self._store.end_lost_transactions()
                found = await self._find_submitted(requests, tenant_id)
                break
            except StoreUnavailable:
                if time.monotonic() >= deadline:
                    raise unknown from None
                await asyncio.sleep(READ_BACK_RETRY_S)
        if not found:
            raise StoreUnavailable(f"nothing was committed ({unknown}); retry") from unknown
        rest = [r for r in requests if r[1].new.id not in found]
        answers: list[SubmitResult | SchedulerError] = []
        if rest:
            async with self._transaction(tenant_id) as conn:
                answers = await self._write_submits(conn, rest, all_or_nothing=all_or_nothing)
        again = iter(answers)
        return [
            SubmitResult(found[p.new.id], created=True) if p.new.id in found else next(again)
            for _, p in requests
        ]

    def _transaction(self, tenant_id: uuid.UUID | None) -> AbstractAsyncContextManager[Connection]:
        """A transaction as ``tenant_id`` (row-level security), or as the node for a batch
        of several tenants (None)."""
        if tenant_id is None:
            return self._store.transaction()
        return self._store.tenant_transaction(tenant_id)

    async def _find_submitted(
        self, requests: Sequence[Request], tenant_id: uuid.UUID | None
    ) -> dict[uuid.UUID, Task]:
        """The tasks of ``requests`` that exist, by id (their own ids: not key repeats)."""
        reader = (
            self._store.connection()
            if tenant_id is None
            else self._store.tenant_transaction(tenant_id)
        )
        async with reader as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["get_tasks_by_ref"],
                {
                    "tenant_ids": list({t for t, _ in requests}),
                    "scheduled_ats": [p.new.scheduled_at for _, p in requests],
                    "ids": [p.new.id for _, p in requests],
                },
            )
            return {task.id: task for task in map(task_from_row, await cur.fetchall())}

    async def _write_submits(
        self, conn: Connection, requests: Sequence[Request], *, all_or_nothing: bool
    ) -> list[SubmitResult | SchedulerError]:
        """The batch, in the caller's transaction: tenants checked, keys claimed and
        resolved, new tasks inserted in one statement, repeats read back. With
        ``all_or_nothing``, the first request's error is raised before anything is
        inserted (the caller's transaction then rolls the key claims back)."""
        outcomes = _repeated_ids(requests)
        cur = await conn.execute(
            self._q["tenants_exist"], {"tenant_ids": list({t for t, _ in requests})}
        )
        tenants = {row[0] for row in await cur.fetchall()}
        for i, (tenant_id, _) in enumerate(requests):
            if tenant_id not in tenants:
                outcomes[i] = TenantNotFound(tenant_id)
        if all_or_nothing:
            _raise_first(outcomes)
        valid = [(i, r) for i, r in enumerate(requests) if outcomes[i] is None]
        owners = await self._claim_keys(conn, [r for _, r in valid])
        resolutions = resolve_keys([r for _, r in valid], owners)
        for (i, _), resolution in zip(valid, resolutions, strict=True):
            if isinstance(resolution, IdempotencyConflict):
                outcomes[i] = resolution
        if all_or_nothing:
            _raise_first(outcomes)
        new = [(i, r) for (i, r), res in zip(valid, resolutions, strict=True) if res is None]
        inserted = await self._insert_new(conn, [r for _, r in new])
        for i, (_, p) in new:
            outcomes[i] = SubmitResult(inserted[p.new.id], created=True)
        repeats = [
            (i, (r[0], res))
            for (i, r), res in zip(valid, resolutions, strict=True)
            if isinstance(res, TaskRef)
        ]
        originals = await self._fetch_originals(conn, [ref for _, ref in repeats])
        for i, (_, ref) in repeats:
            outcomes[i] = SubmitResult(originals[ref.id], created=False)
        return [o for o in outcomes if o is not None]

    async def _insert_keyless(
        self, conn: Connection, requests: Sequence[Request]
    ) -> list[SubmitResult | SchedulerError]:
        """A batch without idempotency keys as one self-committing statement: nothing to
        claim, so no transaction around it. A request whose tenant does not exist is
        left out by the statement and answered TenantNotFound; one repeating an id of
        the batch, InvalidArgument."""
        outcomes = _repeated_ids(requests)
        new = [(i, r) for i, r in enumerate(requests) if outcomes[i] is None]
        inserted = await self._insert_new(conn, [r for _, r in new])
        for i, (tenant_id, p) in new:
            task = inserted.get(p.new.id)
            outcomes[i] = (
                TenantNotFound(tenant_id) if task is None else SubmitResult(task, created=True)
            )
        return [o for o in outcomes if o is not None]

    async def _claim_keys(
        self, conn: Connection, requests: Sequence[Request]
    ) -> dict[tuple[uuid.UUID, str], KeyOwner]:
        """Claim the batch's idempotency keys; who owns each key afterwards."""
        keyed = keyed_in_claim_order(requests)
        if not keyed:
            return {}
        await conn.execute(
            self._q["claim_idempotency_keys"],
            {
                "tenant_ids": [t for t, _ in keyed],
                "keys": [p.new.idempotency_key for _, p in keyed],
                "task_ids": [p.new.id for _, p in keyed],
                "scheduled_ats": [p.new.scheduled_at for _, p in keyed],
                "fingerprints": [p.fingerprint for _, p in keyed],
            },
        )
        wanted = sorted({(t, str(p.new.idempotency_key)) for t, p in keyed}, key=str)
        cur = await conn.execute(
            self._q["get_idempotency_keys"],
            {"tenant_ids": [t for t, _ in wanted], "keys": [k for _, k in wanted]},
        )
        return {
            (tenant_id, key): KeyOwner(task_id, at, fingerprint)
            for tenant_id, key, task_id, at, fingerprint in await cur.fetchall()
        }

    async def insert_in(
        self, conn: Connection, requests: Sequence[Request]
    ) -> dict[uuid.UUID, Task]:
        """Insert keyless ``requests`` in the caller's transaction (a schedule's
        occurrences, whose key is their occurrence row): the tasks inserted, by id. A
        request of a tenant that does not exist is left out."""
        return await self._insert_new(conn, requests)

    async def _insert_new(
        self, conn: Connection, requests: Sequence[Request]
    ) -> dict[uuid.UUID, Task]:
        """The tasks inserted, by id; a request of a tenant that does not exist is left
        out."""
        if not requests:
            return {}
        cur = await self._send_insert(conn, requests)
        return self._inserted(requests, await cur.fetchall())

    async def _send_insert(self, conn: Connection, requests: Sequence[Request]) -> AsyncCursor[Any]:
        # One statement for the batch (arrays unnested into rows): no per-row parse,
        # bind or round trip. It returns what PostgreSQL decided (which rows went in,
        # when, and the payload as jsonb keeps it); the rest of each row is what was sent.
        statement, params = insert_params(requests)
        return await conn.execute(self._q[statement], params)

    async def _read_inserted(
        self, cur: AsyncCursor[Any], requests: Sequence[Request]
    ) -> dict[uuid.UUID, Task]:
        """A streamed chunk's tasks, read from its INSERT; TenantNotFound when its rows
        were left out (the tenant does not exist), raised inside the transaction."""
        inserted = self._inserted(requests, await cur.fetchall())
        if len(inserted) != len(requests):
            raise TenantNotFound(requests[0][0])
        return inserted

    @staticmethod
    def _inserted(requests: Sequence[Request], rows: Sequence[Any]) -> dict[uuid.UUID, Task]:
        stored = {task_id: (at, payload) for task_id, at, payload in rows}
        return {
            p.new.id: inserted_task(tenant_id, p.new, *row)
            for tenant_id, p in requests
            if (row := stored.get(p.new.id)) is not None
        }

    async def _fetch_originals(
        self, conn: Connection, refs: Sequence[tuple[uuid.UUID, TaskRef]]
    ) -> dict[uuid.UUID, Task]:
        """The original tasks of repeated requests, as ``(tenant, ref)`` pairs."""
        if not refs:
            return {}
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            self._q["get_tasks_by_ref"],
            {
                "tenant_ids": list({t for t, _ in refs}),
                "scheduled_ats": [r.scheduled_at for _, r in refs],
                "ids": [r.id for _, r in refs],
            },
        )
        found = {task.id: task for task in map(task_from_row, await cur.fetchall())}
        for _, ref in refs:
            if ref.id not in found:
                # Retention deletes a task's key with its partition, so a key always has
                # its task; reaching this means the two were separated by hand.
                raise TaskNotFound(ref.id)
        return found


_REPEATED_ID = "two tasks in one batch share an id"


def _repeated_ids(requests: Sequence[Request]) -> list[SubmitResult | SchedulerError | None]:
    """One outcome slot per request: InvalidArgument for each that repeats an id earlier
    in the batch (the first keeps it), None for the rest."""
    outcomes: list[SubmitResult | SchedulerError | None] = [None] * len(requests)
    seen: set[uuid.UUID] = set()
    for i, (_, p) in enumerate(requests):
        if p.new.id in seen:
            outcomes[i] = InvalidArgument("id", _REPEATED_ID)
        seen.add(p.new.id)
    return outcomes


def _check_streamable(batch: Sequence[Request], seen: set[uuid.UUID]) -> None:
    """A streamed chunk's requests carry no key and no id of an earlier request (added to
    ``seen``)."""
    for _, p in batch:
        if p.new.idempotency_key is not None:
            raise InvalidArgument("idempotency_key", "a streamed batch takes no keys")
        if p.new.id in seen:
            raise InvalidArgument("id", _REPEATED_ID)
        seen.add(p.new.id)


def _keyless(requests: Sequence[Request]) -> bool:
    return all(p.new.idempotency_key is None for _, p in requests)


def _raise_first(outcomes: Sequence[SubmitResult | SchedulerError | None]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, SchedulerError):
            raise outcome
