"""The task context: what a handler knows about its attempt and how it talks back.

Every handler receives one :class:`TaskContext`. It is read-only data about the attempt
(ids, attempt number, decoded payload and checkpoint, fencing token, trace context, and
for a workflow task its workflow, ref and parents' results) plus
three channels back to the SDK:

- ``heartbeat(checkpoint=..., progress=...)`` records a checkpoint (sent with the
  worker's next heartbeat, token-checked by the node, handed to a later attempt) and a
  progress value (logged, shown by the testing helper). The worker heartbeats every
  running task on its own; a handler heartbeats only to save state.
- ``cancelled`` / ``wait_cancelled()`` / ``raise_if_cancelled()``: the SDK asks the
  handler to stop (a Cancel, a revoked token, its timeout, the end of a drain's grace,
  a lost lease); ``cancel_reason`` says which and ``draining`` is set for a drain.
- ``fencing_token``, ``check_lease()``, ``lease_remaining_s``: hand the token to systems
  the handler writes to, so a late write of a zombie attempt can be refused there too,
  and check the lease right before a write (the helpers of ``chronoshard.worker.commit``
  do both).

Sync handlers run in threads, so the cancellation flag is a ``threading.Event`` and the
checkpoint sits behind a lock; the asyncio side of the flag (for ``wait_cancelled``) is
set by the SDK on the event loop, which is the only thread that requests stops. A lapsed
lease (``_lease.py``) is read from the clock, not from the flag: a thread sees it at its
deadline even when the event loop has not run since (a process resumed after SIGSTOP).
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from chronoshard import exact_json, json_documents
from chronoshard.wire import DEFAULT_QUEUE
from chronoshard.worker._errors import CheckpointRefused, LeaseLost, TaskCancelled
from chronoshard.worker._lease import RunLease
from chronoshard.worker._models import AssignedParent, Assignment


class _Unset(enum.Enum):
    UNSET = "UNSET"


UNSET: Final = _Unset.UNSET
"""Default of ``heartbeat(checkpoint=...)``: keep the stored checkpoint."""


class StopReason(enum.Enum):
    """Why the SDK asked a handler to stop."""

    CANCELLED = "cancelled"  # a Cancel from the scheduler (CancelTask)
    REVOKED = "revoked"  # the fencing token is no longer current: another attempt owns it
    TIMED_OUT = "timed_out"  # the attempt ran past its timeout
    DRAINING = "draining"  # the worker is shutting down and the grace period is over
    LEASE_LOST = "lease_lost"  # no node renewed the lease in time: the worker fenced itself


FINAL_STOPS = frozenset({StopReason.REVOKED, StopReason.LEASE_LOST})
"""Stops after which nothing the handler does is settled: they override any other reason
and are never overridden."""


@dataclass(frozen=True)
class HeartbeatRecord:
    """One ``ctx.heartbeat(...)`` call, as the testing helper reports it."""

    checkpoint: Any  # UNSET when the call carried no checkpoint
    progress: Any
    at: datetime


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON, numbers exact (a ``Decimal`` is written as it is);
    TypeError/ValueError for what JSON cannot hold (NaN too)."""
    try:
        return exact_json.dumps(value).encode()
    except RecursionError:
        raise ValueError("nested too deeply for JSON") from None


def encode_checkpoint(checkpoint: Any) -> bytes:
    """A checkpoint as the node stores it; refused here, at the handler's call, when it
    breaks a rule of :mod:`chronoshard.json_documents` (CheckpointRefused) or is not JSON
    (TypeError/ValueError), so that it is never sent."""
    try:
        json_documents.check(checkpoint)
    except json_documents.DocumentRefused as exc:
        raise CheckpointRefused(exc.rule.value, f"checkpoint: {exc.problem}") from None
    return encode_json(checkpoint)


def decode_json(data: bytes, *, empty: Any) -> Any:
    """Decode UTF-8 JSON with exact numbers (a float where a float is the number, else a
    ``Decimal``: :mod:`chronoshard.exact_json`); ``empty`` when there are no bytes.
    ValueError when malformed."""
    if not data:
        return empty
    return exact_json.loads(data.decode("utf-8"))


@dataclass(frozen=True)
class ParentResult:
    """One parent of a workflow task, as the child sees it (``ctx.parents[ref]``).

    ``status`` is the parent's terminal status: ``"COMPLETED"``, or under the
    ``all_done`` trigger rule any other terminal one (``"DEAD_LETTER"``,
    ``"CANCELLED"``, ``"UPSTREAM_FAILED"``). ``result`` is what the parent's handler
    returned, decoded as a payload is (exact numbers); None when it returned nothing,
    did not complete, or when ``omitted`` is true: the node left the result out to keep
    the assignment within ``workflows.max_parent_results_bytes`` (read it with
    ``GetTask(task_id)`` if the child needs it).
    """

    ref: str
    task_id: uuid.UUID
    status: str
    result: Any = None
    omitted: bool = False


@dataclass
class _CheckpointState:
    value: bytes | None = None  # latest checkpoint recorded in this attempt
    seq: int = 0  # bumped on every new checkpoint
    confirmed_seq: int = 0  # highest seq a heartbeat reply confirmed as stored


class TaskContext:
    """The attempt a handler runs, and its way to checkpoint and to notice a stop."""

    def __init__(
        self,
        *,
        task_id: uuid.UUID,
        task_type: str,
        scheduled_at: datetime,
        due_at: datetime,
        attempt: int,
        max_retries: int,
        payload: Any,
        fencing_token: int,
        checkpoint: Any,
        queue: str,
        trace_context: Mapping[str, str],
        worker_id: str,
        timeout_s: float | None = None,
        idempotent: bool = False,
        logical_date: datetime | None = None,
        schedule_id: uuid.UUID | None = None,
        workflow_id: uuid.UUID | None = None,
        workflow_ref: str | None = None,
        parents: Mapping[str, ParentResult] | None = None,
        now: Callable[[], datetime],
        on_heartbeat: Callable[[HeartbeatRecord], None] | None = None,
        lease: RunLease | None = None,
    ) -> None:
        self._task_id = task_id
        self._task_type = task_type
        self._scheduled_at = scheduled_at
        self._due_at = due_at
        self._attempt = attempt
        self._max_retries = max_retries
        self._payload = payload
        self._fencing_token = fencing_token
        self._checkpoint = checkpoint
        self._queue = queue
        self._trace_context: Mapping[str, str] = MappingProxyType(dict(trace_context))
        self._worker_id = worker_id
        self._timeout_s = timeout_s
        self._idempotent = idempotent
        self._logical_date = logical_date
        self._schedule_id = schedule_id
        self._workflow_id = workflow_id
        self._workflow_ref = workflow_ref
        # Read-only and in the order given (the workflow's): a handler may iterate it.
        self._parents: Mapping[str, ParentResult] = MappingProxyType(dict(parents or {}))
        self._now = now
        self._on_heartbeat = on_heartbeat
        self._lock = threading.Lock()
        self._state = _CheckpointState()
        self._progress: Any = None
        # Asked to stop. The events that wait for it are made only when something waits
        # (few handlers do), under ``_lock`` for the thread's: building both for every
        # run was a twentieth of a no-op worker's CPU (issue 14).
        self._stop_requested = False
        self._cancel_flag: threading.Event | None = None
        self._cancel_event: asyncio.Event | None = None
        self._cancel_reason: StopReason | None = None
        self._draining = False
        self._lease = lease or RunLease.unbounded(time.monotonic)

    # ---- the attempt -----------------------------------------------------------------

    @property
    def task_id(self) -> uuid.UUID:
        return self._task_id

    @property
    def task_type(self) -> str:
        return self._task_type

    @property
    def scheduled_at(self) -> datetime:
        """The time the client asked for (the task's partition key; never moves)."""
        return self._scheduled_at

    @property
    def due_at(self) -> datetime:
        """When this attempt was due: scheduled_at plus jitter, moved by retries."""
        return self._due_at

    @property
    def logical_date(self) -> datetime | None:
        """The occurrence this run is, when a schedule created the task: the instant its
        rule fired (UTC), the same across retries, a late catch-up or a backfill (whose
        ``scheduled_at`` is when it ran). None for a task submitted directly."""
        return self._logical_date

    @property
    def schedule_id(self) -> uuid.UUID | None:
        """The schedule that created the task; None if none did."""
        return self._schedule_id

    @property
    def workflow_id(self) -> uuid.UUID | None:
        """The workflow the task belongs to; None for a task outside any workflow."""
        return self._workflow_id

    @property
    def workflow_ref(self) -> str | None:
        """The task's reference in its workflow (``"B"`` of the edge ``A -> B``); None
        outside a workflow."""
        return self._workflow_ref

    @property
    def parents(self) -> Mapping[str, ParentResult]:
        """The task's workflow parents by ref, in the workflow's order: what each one
        returned (see :class:`ParentResult`). Empty for a root task and outside a
        workflow. Read-only."""
        return self._parents

    @property
    def attempt(self) -> int:
        """1-based attempt number."""
        return self._attempt

    @property
    def max_retries(self) -> int:
        return self._max_retries

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure now goes to DEAD_LETTER instead of a retry."""
        return self._attempt > self._max_retries

    @property
    def payload(self) -> Any:
        """The JSON object given at submit, decoded."""
        return self._payload

    @property
    def fencing_token(self) -> int:
        """The attempt's token: pass it to downstream systems to fence zombie writes."""
        return self._fencing_token

    @property
    def checkpoint(self) -> Any:
        """The checkpoint an earlier attempt stored (decoded JSON), or None."""
        return self._checkpoint

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def trace_context(self) -> Mapping[str, str]:
        """W3C trace context captured at submit (``traceparent``, ``tracestate``)."""
        return self._trace_context

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def timeout_s(self) -> float | None:
        """Longest this attempt may run before the SDK stops it; None: no limit."""
        return self._timeout_s

    @property
    def idempotent(self) -> bool:
        return self._idempotent

    # ---- stopping --------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once the SDK asked the handler to stop (see ``cancel_reason``), or once the
        attempt's lease lapsed (read from the clock: true at the deadline, from any
        thread)."""
        return self._stop_requested or not self._lease.held()

    @property
    def cancel_reason(self) -> StopReason | None:
        if self._cancel_reason is None and not self._lease.held():
            return StopReason.LEASE_LOST
        return self._cancel_reason

    @property
    def draining(self) -> bool:
        """True when the stop request comes from a worker drain: checkpoint and return
        by raising (``raise_if_cancelled()``); the task resumes on another worker."""
        return self._draining

    async def wait_cancelled(self) -> StopReason | None:
        """Return once the handler is asked to stop (async handlers only)."""
        if not self._stop_requested:
            if self._cancel_event is None:
                self._cancel_event = asyncio.Event()  # the event loop's thread: no race
            await self._cancel_event.wait()
        return self._cancel_reason

    def wait_cancelled_sync(self, timeout_s: float | None = None) -> bool:
        """Block until asked to stop or ``timeout_s`` passed (sync handlers); True if asked.

        A lease that lapses meanwhile ends the wait at its deadline, whether or not the
        event loop got to say so."""
        clock = self._lease.monotonic
        flag = self._stop_flag()
        until = None if timeout_s is None else clock() + timeout_s
        while not self.cancelled:
            left = None if until is None else until - clock()
            if left is not None and left <= 0:
                return False
            waits = [w for w in (left, self._lease.remaining_s()) if w is not None]
            if flag.wait(min(waits) if waits else None):
                return True
        return True

    def raise_if_cancelled(self) -> None:
        """Raise :class:`TaskCancelled` if the handler was asked to stop (its subclass
        :class:`LeaseLost` when the lease was lost)."""
        reason = self.cancel_reason
        if reason is StopReason.LEASE_LOST:
            raise LeaseLost(f"task {self._task_id}: the lease was lost; stop without writing")
        if self.cancelled:
            raise TaskCancelled(
                f"task {self._task_id} asked to stop: {reason.value if reason else 'stop'}"
            )

    # ---- the lease (worker self-fencing) ---------------------------------------------

    @property
    def lease_remaining_s(self) -> float | None:
        """Seconds this attempt may still write: until its lease lapses unless a node
        renews it (0 once lapsed, revoked or given up). None: no lease is known (the
        testing helper without ``lease_s``). Bound a write by it (a statement timeout)."""
        if self._cancel_reason in FINAL_STOPS:
            return 0.0
        return self._lease.remaining_s()

    @property
    def holds_lease(self) -> bool:
        """False once this attempt may no longer write (see :meth:`check_lease`)."""
        return self._cancel_reason not in FINAL_STOPS and self._lease.held()

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` unless this attempt may still write: call it right
        before a side effect. It may not once its lease lapsed with no renewal from any
        node (the worker fenced itself), its token was revoked, or the SDK gave the
        attempt up (timed out, released, settled). Thread-safe."""
        if self.holds_lease:
            return
        why = self._lease.fenced or (
            "revoked: another attempt owns the task"
            if self._cancel_reason is StopReason.REVOKED
            else "no node renewed its lease in time"
        )
        raise LeaseLost(f"task {self._task_id} (token {self._fencing_token}) may not write: {why}")

    # ---- heartbeats and checkpoints --------------------------------------------------

    async def heartbeat(self, *, checkpoint: Any = UNSET, progress: Any = None) -> None:
        """Record a checkpoint and/or progress; sent with the worker's next heartbeat.

        Raises at once, recording nothing: :class:`CheckpointRefused` (a ValueError) if
        ``checkpoint`` is JSON the scheduler would not store (a NUL or lone surrogate in a
        string, more than 100 levels of nesting, a number of more than 1000 digits),
        TypeError/ValueError if it is not JSON-serialisable.
        """
        self.heartbeat_sync(checkpoint=checkpoint, progress=progress)

    def heartbeat_sync(self, *, checkpoint: Any = UNSET, progress: Any = None) -> None:
        """Thread-safe ``heartbeat`` for sync handlers."""
        encoded = None if checkpoint is UNSET else encode_checkpoint(checkpoint)
        with self._lock:
            if encoded is not None:
                self._state.value = encoded
                self._state.seq += 1
            if progress is not None:
                self._progress = progress
        if self._on_heartbeat is not None:
            self._on_heartbeat(HeartbeatRecord(checkpoint, progress, self._now()))

    @property
    def progress(self) -> Any:
        """The last progress value given to ``heartbeat``."""
        with self._lock:
            return self._progress

    # ---- SDK side (event loop only) --------------------------------------------------

    def _request_stop(self, reason: StopReason) -> None:
        # The first reason wins, except that a revocation or a lost lease overrides
        # everything else: from then on nothing the handler does can be settled.
        current = self._cancel_reason
        if current is None or (reason in FINAL_STOPS and current not in FINAL_STOPS):
            self._cancel_reason = reason
        if reason is StopReason.DRAINING:
            self._draining = True
        with self._lock:
            self._stop_requested = True
            flag = self._cancel_flag
        if flag is not None:
            flag.set()
        if self._cancel_event is not None:
            self._cancel_event.set()

    def _stop_flag(self) -> threading.Event:
        """The thread-side event of the stop request, made on first use: under the lock,
        so a request is either seen here or sets the event made here."""
        with self._lock:
            if self._cancel_flag is None:
                self._cancel_flag = threading.Event()
                if self._stop_requested:
                    self._cancel_flag.set()
            return self._cancel_flag

    def _pending_checkpoint(self) -> tuple[int, bytes] | None:
        """The checkpoint to send with the next heartbeat, if one is not yet stored."""
        with self._lock:
            state = self._state
            if state.value is None or state.seq == state.confirmed_seq:
                return None
            return state.seq, state.value

    def _checkpoint_stored(self, seq: int) -> None:
        with self._lock:
            self._state.confirmed_seq = max(self._state.confirmed_seq, seq)

    def _latest_checkpoint(self) -> bytes | None:
        """The newest checkpoint of this attempt (stored or not), for a Release."""
        with self._lock:
            return self._state.value

    def _end_attempt(self, why: str) -> None:
        """The SDK decided how the attempt ends: nothing of it may write any more, even if
        its handler (a thread) runs on."""
        self._lease.fence(why)


class BadAttempt(ValueError):
    """The assignment cannot be handed to a handler (payload or checkpoint not JSON, an
    id that is not a UUID, a malformed workflow parent)."""


def _parse_uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise BadAttempt(f"{what} {value!r} is not a UUID") from exc


def _parse_optional_uuid(value: str | None, what: str) -> uuid.UUID | None:
    return None if value is None else _parse_uuid(value, what)


def _decode_parents(parents: tuple[AssignedParent, ...]) -> dict[str, ParentResult]:
    """The parents keyed by ref. A parent the SDK cannot describe truthfully (no ref, a
    ref given twice, an id that is not a UUID, a result that is not JSON) refuses the
    attempt: a handler must not act on a half-read view of its upstream."""
    out: dict[str, ParentResult] = {}
    for parent in parents:
        if not parent.ref:
            raise BadAttempt("a workflow parent has no ref")
        if parent.ref in out:
            raise BadAttempt(f"workflow parent {parent.ref!r} is given twice")
        task_id = _parse_uuid(parent.task_id, f"workflow parent {parent.ref!r}'s task id")
        if parent.omitted:
            result = None  # whatever bytes came along are not the result
        else:
            try:
                result = decode_json(parent.result_json, empty=None)
            except ValueError as exc:
                raise BadAttempt(
                    f"workflow parent {parent.ref!r}'s result is not valid UTF-8 JSON: {exc}"
                ) from exc
        out[parent.ref] = ParentResult(
            ref=parent.ref,
            task_id=task_id,
            status=parent.status,
            result=result,
            omitted=parent.omitted,
        )
    return out


def build_context(
    info: Assignment,
    *,
    worker_id: str,
    timeout_s: float | None,
    now: Callable[[], datetime],
    on_heartbeat: Callable[[HeartbeatRecord], None] | None = None,
    lease: RunLease | None = None,
) -> TaskContext:
    """Decode the attempt's JSON and build its context. Raises BadAttempt."""
    task_id = _parse_uuid(info.task.id, "task id")
    schedule_id = _parse_optional_uuid(info.schedule_id, "schedule id")
    workflow_id = _parse_optional_uuid(info.workflow_id, "workflow id")
    parents = _decode_parents(info.parent_results)
    try:
        payload = decode_json(info.payload_json, empty={})
    except ValueError as exc:
        raise BadAttempt(f"payload is not valid UTF-8 JSON: {exc}") from exc
    try:
        checkpoint = decode_json(info.checkpoint, empty=None)
    except ValueError as exc:
        raise BadAttempt(f"stored checkpoint is not valid UTF-8 JSON: {exc}") from exc
    return TaskContext(
        task_id=task_id,
        task_type=info.type,
        scheduled_at=info.task.scheduled_at,
        due_at=info.due_at,
        attempt=info.attempt,
        max_retries=info.max_retries,
        payload=payload,
        fencing_token=info.fencing_token,
        checkpoint=checkpoint,
        queue=info.queue or DEFAULT_QUEUE,
        trace_context=info.trace_context,
        worker_id=worker_id,
        timeout_s=timeout_s,
        idempotent=info.idempotent,
        logical_date=info.logical_date,
        schedule_id=schedule_id,
        workflow_id=workflow_id,
        workflow_ref=info.workflow_ref,
        parents=parents,
        now=now,
        on_heartbeat=on_heartbeat,
        lease=lease,
    )
