"""``WorkerService``: the worker's stream and its unary settlements, and their parsing.

A ``Connect`` stream opens with ``Hello`` (checked here) and becomes a
:class:`~chronoshard.scheduler.dispatch.sessions.WorkerSession` of the node's
:class:`~chronoshard.scheduler.dispatch.sessions.SessionRegistry`, which counts its
credits and holds its outbox. Per stream, a reader task consumes the worker's messages
and the servicer's response generator drains the session's outbox into the stream
(several queued messages go out as one ``SchedulerBatch``), so a stalled worker fills
only its own outbox and is then dropped (docs/architecture.md#d12).

Acks, heartbeats and settlements, from the streams and from the unary ``Complete``,
``Fail``, ``Release`` RPCs (which any node accepts), are parsed here into the core's
values (:mod:`chronoshard.scheduler.core.runs`) and group-committed by
:class:`~chronoshard.scheduler.dispatch.settlements.Settlements`; every answer (a
``Receipt``, a ``HeartbeatReply``, the unary call's status) is sent after its batch
committed.

Protobuf on the hot path, on purpose: the session's outbox holds ``SchedulerMessage``
values and the receipts copy the worker's own ``TaskRef`` message back, and a heartbeat's
task refs are converted once per task, not once per beat (:func:`_beats`), because
converting them dominated what a heartbeat cost the node (``bench/heartbeats.py``). Only
what the statements need becomes a core value.

Whose worker a stream is: the tenant whose key (or client certificate) opened it,
asked of the authenticator once per stream (the access interceptor has just checked the
same key, so the answer is cached) and kept in the node's
:class:`~chronoshard.scheduler.core.worker_sessions.SessionOwners` for the sessions'
records and ``AdminService.ListWorkerSessions``. It changes nothing about which tasks the
worker gets.

The protocol is written down in ``docs/worker-protocol.md``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, ClassVar

import grpc

from chronoshard.batching import MAX_BATCH_MESSAGES, encoded_size, pack, take_queued
from chronoshard.scheduler.api import boundary, convert, payloads
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.runs import (
    Beat,
    Completion,
    Failure,
    LeaseUpdate,
    Release,
    Settle,
    SettleOutcome,
)
from chronoshard.scheduler.core.states import AttemptState
from chronoshard.scheduler.core.worker_sessions import SessionOwners
from chronoshard.scheduler.dispatch import faults
from chronoshard.scheduler.dispatch.faults import CrashPoint
from chronoshard.scheduler.dispatch.sessions import SessionRegistry, WorkerSession
from chronoshard.scheduler.dispatch.settlements import Settlements
from chronoshard.scheduler.errors import (
    SETTLE_OUTCOME_ERRORS,
    CommitterStopped,
    InvalidArgument,
    PayloadTooLarge,
    SchedulerError,
    StoreUnavailable,
)
from chronoshard.v1 import common_pb2, worker_service_pb2, worker_service_pb2_grpc

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
HANDLER_STOP_TIMEOUT_S = 1.0
"""At stop, how long the message handlers get to queue their replies once the group
commits are flushed (they only have that left to do; the rest are cancelled)."""
MAX_WORKER_SLOTS = 100_000
MAX_ERROR_CHARS = 8192
MAX_NAME_CHARS = 200
"""Worker ids, and each queue and task type a Hello names."""
MAX_HELLO_NAMES = 1000


def _scheduler_batch(
    messages: list[worker_service_pb2.SchedulerMessage],
) -> worker_service_pb2.SchedulerMessage:
    return worker_service_pb2.SchedulerMessage(
        batch=worker_service_pb2.SchedulerBatch(messages=messages)
    )


def _served_queues(hello: worker_service_pb2.Hello) -> frozenset[str]:
    """The queues a Hello asks for; one that names none serves ``default``."""
    return frozenset(hello.queues) or frozenset({"default"})


def _welcome(
    config: SchedulerConfig, session: WorkerSession
) -> worker_service_pb2.SchedulerMessage:
    """A stream's first answer: its session, and the timing the worker keeps to."""
    workers = config.workers
    return worker_service_pb2.SchedulerMessage(
        welcome=worker_service_pb2.Welcome(
            node_id=config.node_id,
            session_id=session.session_id,
            heartbeat_interval=convert.duration_to_pb(workers.heartbeat_interval_s),
            lease_duration=convert.duration_to_pb(workers.task_lease_s),
            lease_margin=convert.duration_to_pb(workers.lease_margin_s),
            accepts_batches=True,
        )
    )


def _one_write(
    session: WorkerSession, first_out: worker_service_pb2.SchedulerMessage
) -> list[worker_service_pb2.SchedulerMessage]:
    """What goes out in one write, ``first_out`` taken from the outbox: to a worker that
    accepts batches, everything queued behind it too, packed (bounded in count and bytes);
    to one that does not, ``first_out`` alone."""
    if not session.accepts_batches or session.outbox.empty():
        return [first_out]
    queued = take_queued(first_out, session.outbox, MAX_BATCH_MESSAGES)
    return pack(queued, encoded_size, _scheduler_batch)


async def _stop_reader(session: WorkerSession, reader: asyncio.Task[None]) -> None:
    """Cancel the stream's reader and wait for it; a failure other than the worker
    going away is logged."""
    reader.cancel()
    try:
        await reader
    except asyncio.CancelledError:
        pass
    except grpc.aio.AioRpcError:
        pass  # the worker went away: the stream's end is the news
    except Exception:
        log.exception(
            "worker stream reader failed",
            extra={"worker_id": session.worker_id, "session_id": session.session_id},
        )


class Gateway(worker_service_pb2_grpc.WorkerServiceServicer):
    """The ``WorkerService`` servicer: streams into sessions, messages into settlements."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        config: SchedulerConfig,
        sessions: SessionRegistry,
        settlements: Settlements,
        *,
        authenticator: boundary.Authenticates,
        owners: SessionOwners,
    ) -> None:
        self._config = config
        self._sessions = sessions
        self._settlements = settlements
        self._authenticator = authenticator
        self._owners = owners
        # Resolved once the node flushed at stop: every stream sends what is queued for
        # it and ends (made lazily: it needs the running loop).
        self._streams_end: asyncio.Future[None] | None = None
        # The stream messages' handlers, each waiting for its group commit.
        self._background: set[asyncio.Task[Any]] = set()
        self._stats: dict[str, int] = {
            "sessions_rejected": 0,
            "stale_settlements": 0,
            "revoked_in_heartbeats": 0,
        }

    # ---- lifecycle ----------------------------------------------------------------------

    async def stop(self) -> None:
        """Tell every worker to go elsewhere, then flush what is queued (every message
        handled so far gets its answer), then end the worker streams.

        A stream ends once the messages queued for it (the last receipts) are sent; the
        worker was told ``Drain{shutting_down}``, so it does not reconnect, and it sends
        what it still has unconfirmed to another node. The streams never end on their
        own: left open, they held the gRPC server's grace (5 s) at every stop."""
        self._sessions.drain_all("scheduler node shutting down", shutting_down=True)
        await self._settlements.stop()
        # Every handler's commit is answered now (or refused: NODE_STOPPING), so each
        # only has its reply to queue; cancelled now, some lost theirs.
        left = list(self._background)
        if left:
            _, stuck = await asyncio.wait(left, timeout=HANDLER_STOP_TIMEOUT_S)
            for task in stuck:
                task.cancel()
            # Awaited, so none is destroyed pending when the loop closes.
            await asyncio.gather(*left, return_exceptions=True)
        end = self._end_streams()
        if not end.done():
            end.set_result(None)

    def _end_streams(self) -> asyncio.Future[None]:
        if self._streams_end is None:
            self._streams_end = asyncio.get_running_loop().create_future()
        return self._streams_end

    # ---- Connect ------------------------------------------------------------------------

    async def Connect(
        self,
        request_iterator: AsyncIterator[worker_service_pb2.WorkerMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_service_pb2.SchedulerMessage]:
        try:
            first = await asyncio.wait_for(anext(request_iterator), HELLO_TIMEOUT_S)
        except (TimeoutError, StopAsyncIteration):
            self._stats["sessions_rejected"] += 1
            return
        try:
            hello = _hello(first)
        except InvalidArgument as exc:
            self._stats["sessions_rejected"] += 1
            yield worker_service_pb2.SchedulerMessage(
                reject=worker_service_pb2.Reject(error=boundary.error_info(exc))
            )
            return
        owner = await self._owner(context, hello.worker_id)
        session = self._sessions.open(
            hello.worker_id,
            queues=_served_queues(hello),
            types=frozenset(hello.task_types),
            slots=hello.slots,
            accepts_batches=hello.accepts_batches,
        )
        # Before anything awaits: the liveness record the open just asked for names it.
        self._owners.opened(session.session_id, owner)
        reader = asyncio.create_task(
            self._read(session, request_iterator), name=f"worker-reader-{session.session_id}"
        )
        try:
            yield _welcome(self._config, session)
            if self._sessions.draining:
                yield self._sessions.drain_message()
            async with aclosing(self._outbox_writes(session, reader)) as writes:
                async for out in writes:
                    yield out
        finally:
            await _stop_reader(session, reader)
            self._sessions.close(session)
            self._owners.closed(session.session_id)

    async def _owner(self, context: Any, worker_id: str) -> uuid.UUID | None:
        """The tenant whose key opened this stream (admitted by the access interceptor,
        so a cache hit); None, and a warning, if it cannot be told now (the key was
        revoked meanwhile, PostgreSQL is away): the stream serves all the same, and only
        an operator's listing shows it."""
        try:
            tenant = await self._authenticator.authenticate(
                *boundary.credentials_of(context, self._authenticator)
            )
        except SchedulerError as exc:
            log.warning(
                "could not tell whose worker this is",
                extra={"worker_id": worker_id, "error": str(exc)},
            )
            return None
        return tenant.id

    async def _outbox_writes(
        self, session: WorkerSession, reader: asyncio.Task[None]
    ) -> AsyncGenerator[worker_service_pb2.SchedulerMessage, None]:
        """What ``session``'s outbox holds, write by write, until the session closes, its
        reader ends (the worker went away), or the node stops and all that was queued for
        the stream has been sent."""
        end = self._end_streams()
        while not session.closed:
            if end.done() and session.outbox.empty():
                break  # the node stops: all that was queued here has been sent
            get = asyncio.ensure_future(session.outbox.get())
            waits: set[asyncio.Future[Any]] = {get, reader}
            if not end.done():
                waits.add(end)
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Also when the call is cancelled (the worker went away) while this
                # waits: a get left pending was destroyed with the session later
                # ("Task was destroyed but it is pending").
                if not get.done():
                    get.cancel()
            if get not in done:
                if reader in done:
                    break
                continue  # the streams end: what is still queued goes out first
            for out in _one_write(session, get.result()):
                yield out

    async def _read(
        self,
        session: WorkerSession,
        request_iterator: AsyncIterator[worker_service_pb2.WorkerMessage],
    ) -> None:
        async for message in request_iterator:
            kind = message.WhichOneof("message")
            if kind == "batch":
                for inner in message.batch.messages:
                    inner_kind = inner.WhichOneof("message")
                    if inner_kind in ("batch", "hello"):
                        log.warning(
                            "unexpected message in a batch",
                            extra={"worker_id": session.worker_id, "kind": inner_kind},
                        )
                        continue
                    self._on_message(session, inner_kind, inner)
            else:
                self._on_message(session, kind, message)

    def _on_message(
        self, session: WorkerSession, kind: str | None, message: worker_service_pb2.WorkerMessage
    ) -> None:
        if kind == "credit_grant":
            self._sessions.credits_granted(session, message.credit_grant.credits)
        elif kind == "credit_recall":
            self._sessions.credits_recalled(session, message.credit_recall.credits)
        elif kind == "drain_started":
            session.worker_draining()
        elif kind in ("ack", "heartbeat", "complete", "fail", "release"):
            if kind != "heartbeat":
                # Fault injection (test builds): the send reached the worker.
                faults.reached(CrashPoint.AFTER_SEND)
            self._spawn(self._handle(session, kind, message))
        else:
            log.warning(
                "unexpected worker message",
                extra={"worker_id": session.worker_id, "kind": kind},
            )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _handle(
        self, session: WorkerSession, kind: str, message: worker_service_pb2.WorkerMessage
    ) -> None:
        try:
            if kind == "heartbeat":
                await self._heartbeat(session, message.heartbeat)
                return
            body = getattr(message, kind)
            settlement = _settlement(kind, body, self._config.limits.payload_limit_bytes)
            outcome = await self._settlements.submit(settlement)
        except InvalidArgument as exc:
            log.warning(
                "bad worker message", extra={"worker_id": session.worker_id, "error": str(exc)}
            )
            if kind == "heartbeat":
                return  # there is no receipt of a heartbeat; its leases stay as they were
            body = getattr(message, kind, None)
            session.send(self._receipt(kind, body, exc))
            return
        except (StoreUnavailable, CommitterStopped) as exc:
            # PostgreSQL away, or this node stopping (its group commits take no more).
            body = getattr(message, kind)
            fields = {"worker_id": session.worker_id, "kind": kind, "error": str(exc)}
            if kind == "heartbeat":
                # No reply: no lease was extended. The next heartbeat tries again.
                log.info("heartbeat not recorded", extra=fields)
                return
            # Told at once, with a retryable error: the worker sends it again (through any
            # node, with backoff) instead of waiting for its receipt timeout. Settling is
            # idempotent for the same token, so a repeat of one that did commit is fine.
            log.warning(
                "settlement not committed; the worker retries",
                extra={**fields, "task_id": body.task.id, "token": body.fencing_token},
            )
            session.send(self._receipt(kind, body, exc))
            return
        except Exception:
            # A bug: logged here, not left to asyncio as "exception was never retrieved".
            log.exception(
                "worker message failed", extra={"worker_id": session.worker_id, "kind": kind}
            )
            return
        if kind != "ack" and outcome in (
            SettleOutcome.OK,
            SettleOutcome.STALE_FENCING_TOKEN,
            SettleOutcome.TASK_CANCELLED,
        ):
            self._sessions.settled(session, settlement.ref.id)
        session.send(self._receipt(kind, body, outcome))

    def _receipt(
        self, kind: str, body: Any, result: SettleOutcome | SchedulerError
    ) -> worker_service_pb2.SchedulerMessage:
        receipt = worker_service_pb2.Receipt(
            kind=getattr(worker_service_pb2, f"SETTLEMENT_KIND_{kind.upper()}"),
        )
        if body is not None:
            receipt.task.CopyFrom(body.task)
            receipt.fencing_token = body.fencing_token
        if isinstance(result, SchedulerError):
            receipt.error.CopyFrom(boundary.error_info(result))
        elif result is not SettleOutcome.OK:
            self._stats["stale_settlements"] += 1
            receipt.error.CopyFrom(_outcome_error(result))
        return worker_service_pb2.SchedulerMessage(receipt=receipt)

    async def _heartbeat(
        self, session: WorkerSession, heartbeat: worker_service_pb2.Heartbeat
    ) -> None:
        beats = _beats(session, heartbeat, self._config.limits.payload_limit_bytes)
        update: LeaseUpdate = await self._settlements.heartbeat(beats)
        # The worker extends its own view of each lease from when it sent this heartbeat,
        # known by the number it gave it (worker self-fencing).
        reply = worker_service_pb2.HeartbeatReply(seq=heartbeat.seq)
        for beat in beats:
            if beat.ref.id not in update.extended:
                reply.revoked.append(
                    worker_service_pb2.RevokedTask(
                        task=convert.ref_to_pb(beat.ref),
                        fencing_token=beat.token,
                        reason=SettleOutcome.STALE_FENCING_TOKEN.value,
                    )
                )
                self._stats["revoked_in_heartbeats"] += 1
        session.send(worker_service_pb2.SchedulerMessage(heartbeat_reply=reply))
        for beat in beats:
            reason = update.cancel_requested.get(beat.ref.id)
            if reason is not None:
                session.send(
                    worker_service_pb2.SchedulerMessage(
                        cancel=worker_service_pb2.Cancel(
                            task=convert.ref_to_pb(beat.ref),
                            fencing_token=beat.token,
                            reason=reason,
                        )
                    )
                )

    # ---- unary settlement (any node) --------------------------------------------------------

    async def Complete(
        self,
        request: worker_service_pb2.CompleteRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_service_pb2.CompleteResponse:
        await self._unary("complete", request.complete, context)
        return worker_service_pb2.CompleteResponse()

    async def Fail(
        self,
        request: worker_service_pb2.FailRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_service_pb2.FailResponse:
        await self._unary("fail", request.fail, context)
        return worker_service_pb2.FailResponse()

    async def Release(
        self,
        request: worker_service_pb2.ReleaseRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_service_pb2.ReleaseResponse:
        await self._unary("release", request.release, context)
        return worker_service_pb2.ReleaseResponse()

    async def _unary(
        self, kind: str, body: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        async def settle() -> SettleOutcome:
            settlement = _settlement(kind, body, self._config.limits.payload_limit_bytes)
            return await self._settlements.submit(settlement)

        outcome = await boundary.serve(f"WorkerService.{kind.capitalize()}", context, settle)
        if outcome is not SettleOutcome.OK:
            self._stats["stale_settlements"] += 1
            await boundary.abort(context, _outcome_error(outcome))

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)


# ---- parsing: worker messages into the core's values ------------------------------------


def _hello(message: worker_service_pb2.WorkerMessage) -> worker_service_pb2.Hello:
    """The stream's first message, checked: it must be a Hello the node can serve."""
    if message.WhichOneof("message") != "hello":
        raise InvalidArgument("hello", "the first message on a stream must be Hello")
    hello = message.hello
    if not hello.worker_id:
        raise InvalidArgument("hello.worker_id", "is required")
    _identifier(hello.worker_id, "hello.worker_id")
    if not 1 <= hello.slots <= MAX_WORKER_SLOTS:
        raise InvalidArgument("hello.slots", f"must be between 1 and {MAX_WORKER_SLOTS}")
    if not hello.task_types:
        raise InvalidArgument("hello.task_types", "a worker must serve at least one type")
    for name in ("queues", "task_types"):
        values = getattr(hello, name)
        if len(values) > MAX_HELLO_NAMES:
            raise InvalidArgument(f"hello.{name}", f"at most {MAX_HELLO_NAMES} entries")
        for i, value in enumerate(values):
            _identifier(value, f"hello.{name}[{i}]")
    return hello


def _settlement(kind: str, body: Any, limit_bytes: int) -> Settle:
    """An ``Ack``, ``Complete``, ``Fail`` or ``Release`` message (stream or unary) as the
    store takes it; :class:`InvalidArgument` names the first bad field."""
    ref = convert.ref_from_pb(body.task, f"{kind}.task")
    token = _token(body.fencing_token, f"{kind}.fencing_token")
    if kind == "ack":
        return Settle(ref, token)
    if kind == "complete":
        # Checked like a submit's payload (exact numbers, nesting, size): a document
        # the database would refuse must not fail the whole group-committed batch.
        result = payloads.stored_form(body.result_json, f"{kind}.result_json", limit_bytes)
        return Completion(ref, token, result)
    if kind == "fail":
        report = FailureReport(
            retryable=body.retryable, timed_out=body.timed_out, cancelled=body.cancelled
        )
        error = _free_text(body.error_message)
        if body.error_type:
            error = f"{_free_text(body.error_type)}: {error}"
        return Failure(ref, token, error, report)
    assert kind == "release"
    cannot_run = body.reason == worker_service_pb2.RELEASE_REASON_CANNOT_RUN
    state = AttemptState.ABANDONED if cannot_run else AttemptState.RELEASED
    checkpoint = _checkpoint(body, f"{kind}.checkpoint", limit_bytes)
    return Release(ref, token, checkpoint, state, _free_text(body.detail))


def _beats(
    session: WorkerSession, heartbeat: worker_service_pb2.Heartbeat, checkpoint_limit: int
) -> list[Beat]:
    """The beats of a heartbeat, its task refs converted once per task, not once per beat.

    A task is heartbeated for as long as it runs, and converting a ``TaskRef`` (a UUID
    parse and a datetime) costs more than everything else the node does for a beat. So
    the session keeps the refs its last heartbeat carried and reuses those that come back
    unchanged (same id text, same timestamp); the cache holds exactly the last
    heartbeat's tasks, so it needs no cleanup.
    """
    previous = session.heartbeat_refs
    current: dict[str, tuple[int, int, TaskRef]] = {}
    beats = []
    for i, running in enumerate(heartbeat.running):
        pb = running.task
        at = pb.scheduled_at
        known = previous.get(pb.id)
        field = f"heartbeat.running[{i}]"
        try:
            if known is not None and known[0] == at.seconds and known[1] == at.nanos:
                ref = known[2]
            else:
                ref = convert.ref_from_pb(pb, f"{field}.task")
            token = _token(running.fencing_token, f"{field}.fencing_token")
            checkpoint = _checkpoint(running, f"{field}.checkpoint", checkpoint_limit)
        except InvalidArgument as exc:
            # One bad entry must not cost the worker the leases of all its other tasks:
            # it is left out (its lease is not extended), the rest are beaten.
            log.warning(
                "bad heartbeat entry left out",
                extra={"worker_id": session.worker_id, "error": boundary.clip(str(exc), 300)},
            )
            continue
        current[pb.id] = (at.seconds, at.nanos, ref)
        beats.append(Beat(ref, token, checkpoint))
    session.heartbeat_refs = current
    return beats


MAX_TOKEN = 2**63 - 1
"""``tasks.fencing_token`` is a bigint; the wire's uint64 can say more."""


def _token(value: int, field: str) -> int:
    # A token no task can have would fail the whole group-committed statement (bigint out
    # of range), taking its neighbours' settlements down with it.
    if value > MAX_TOKEN:
        raise InvalidArgument(field, f"must be at most {MAX_TOKEN}")
    return int(value)


def _checkpoint(body: Any, field: str, limit_bytes: int) -> bytes | None:
    """The checkpoint a message carries (None: unset, keep the stored one). Opaque bytes
    to the node, bounded like a payload."""
    if not body.HasField("checkpoint"):
        return None
    checkpoint: bytes = body.checkpoint
    if len(checkpoint) > limit_bytes:
        raise PayloadTooLarge(field, len(checkpoint), limit_bytes)
    return checkpoint


def _identifier(value: str, field: str) -> None:
    """A worker id, queue or task type: at most MAX_NAME_CHARS, no control characters
    (a NUL would fail every later statement that writes it)."""
    if len(value) > MAX_NAME_CHARS:
        raise InvalidArgument(field, f"must be at most {MAX_NAME_CHARS} characters")
    if convert.has_control_character(value):
        raise InvalidArgument(field, "must not contain control characters")


def _free_text(value: str) -> str:
    """Error text and release details from a worker, stored as they are but cut to
    MAX_ERROR_CHARS and without NUL (PostgreSQL text cannot hold it): a worker's failure
    report is never refused for its wording."""
    return value[:MAX_ERROR_CHARS].replace("\x00", "\ufffd")


def _outcome_error(outcome: SettleOutcome) -> common_pb2.ErrorInfo:
    code, message = SETTLE_OUTCOME_ERRORS[outcome.value]
    return common_pb2.ErrorInfo(code=code, reason=outcome.value, message=message)
