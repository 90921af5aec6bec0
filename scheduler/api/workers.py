"""The worker gateway: ``WorkerService`` sessions, credits, and group-committed reports.

Each ``Connect`` stream is a :class:`WorkerSession`: what the worker serves (queues,
types), the credits it granted (the node never sends more assignments than that), the
tasks this node assigned to it, and a bounded outbox. A reader task consumes the
worker's messages; the servicer's response generator drains the outbox, so a stalled
worker fills only its own outbox and is then dropped, never blocking other sessions
(docs/architecture.md#d12).

Acks, heartbeats and settlements from all sessions (and the unary ``Complete``, ``Fail``,
``Release`` RPCs, which any node accepts) go through one :class:`GroupCommitter` per kind,
so the database sees one statement per few milliseconds per kind, not one per message
(docs/architecture.md#d7). Every answer is sent after its batch committed. What the dispatcher needs
to know (new credits, tasks released back, retries scheduled, tasks that ended) it learns through
the :class:`GatewayListener` it registers; the gateway knows nothing of wheels.

The protocol is written down in ``docs/worker-protocol.md``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import unicodedata
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import grpc

from chronoshard.batching import MAX_BATCH_MESSAGES, encoded_size, pack, take_queued
from chronoshard.clock import Clock
from chronoshard.scheduler.api import boundary, convert, payloads
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.fairness import WorkerOffer
from chronoshard.scheduler.core.models import Task, TaskRef
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.runs import (
    Beat,
    Completion,
    Failure,
    FailureResult,
    LeaseUpdate,
    Release,
    Settle,
    SettleOutcome,
    TimerTask,
)
from chronoshard.scheduler.core.states import AttemptState
from chronoshard.scheduler.dispatch import faults
from chronoshard.scheduler.dispatch.faults import CrashPoint
from chronoshard.scheduler.dispatch.group_commit import GroupCommitter
from chronoshard.scheduler.errors import (
    SETTLE_OUTCOME_ERRORS,
    CommitOutcomeUnknown,
    CommitterStopped,
    InvalidArgument,
    PayloadTooLarge,
    SchedulerError,
    StoreUnavailable,
)
from chronoshard.scheduler.store.runs import DispatchStore
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


class GatewayListener(Protocol):
    """What the dispatcher hears from the gateway."""

    def credits_available(self) -> None: ...

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None: ...

    def retry_scheduled(self, shard: int, due_at: datetime) -> None: ...

    def task_ended(self, task: TimerTask) -> None: ...

    def preloaded_unknown(self) -> None: ...


@dataclass(eq=False)
class WorkerSession:
    session_id: str
    worker_id: str
    queues: frozenset[str]
    types: frozenset[str]
    slots: int
    outbox: asyncio.Queue[worker_service_pb2.SchedulerMessage]
    credits: int = 0
    draining: bool = False
    closed: bool = False
    # The worker reads SchedulerBatch (its Hello said so).
    accepts_batches: bool = False
    # The last Backlog.ready sent on this stream (None: none yet); reports go on change.
    backlog_sent: int | None = None
    # Tasks this node assigned and the worker has not settled: id -> (task, token).
    assigned: dict[uuid.UUID, tuple[TimerTask, int]] = field(default_factory=dict)
    # The task refs the last heartbeat carried, by id as sent: (seconds, nanos, ref).
    heartbeat_refs: dict[str, tuple[int, int, TaskRef]] = field(default_factory=dict)
    # When the stream opened (monotonic): a young session cannot vouch for what the
    # worker holds (it may have been assigned on an earlier stream or by an earlier node).
    opened_at: float = 0.0

    @property
    def offer(self) -> WorkerOffer:
        return WorkerOffer(queues=self.queues, types=self.types, session_id=self.session_id)

    def send(self, message: worker_service_pb2.SchedulerMessage) -> bool:
        """Queue a message; False (and the session is closed) if the outbox is full."""
        if self.closed:
            return False
        try:
            self.outbox.put_nowait(message)
        except asyncio.QueueFull:
            log.warning(
                "worker outbox full; dropping the session",
                extra={"worker_id": self.worker_id, "session_id": self.session_id},
            )
            self.closed = True
            return False
        return True


def _scheduler_batch(
    messages: list[worker_service_pb2.SchedulerMessage],
) -> worker_service_pb2.SchedulerMessage:
    return worker_service_pb2.SchedulerMessage(
        batch=worker_service_pb2.SchedulerBatch(messages=messages)
    )


class Gateway(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self,
        config: SchedulerConfig,
        store: DispatchStore,
        clock: Clock,
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._listener: GatewayListener | None = None
        # Called when a session opens or closes (a new stream hears its backlog at once).
        self.on_sessions_changed: Callable[[], None] | None = None
        self._sessions: dict[str, WorkerSession] = {}
        self._by_worker: dict[str, WorkerSession] = {}
        self._session_ids = itertools.count(1)
        # The node is draining (DrainNode, or shutting down): it sends nothing more and
        # has told every worker so; credits granted meanwhile stay here until recalled.
        self._draining = False
        self._shutting_down = False
        self._drain_reason = ""
        # Resolved once the node flushed at stop: every stream sends what is queued for
        # it and ends (made lazily: it needs the running loop).
        self._streams_end: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        linger = config.workers.group_commit_interval_s
        self._acks = GroupCommitter("ack", self._ack_batch, linger_s=linger)
        self._beats = GroupCommitter("heartbeat", self._beat_batch, linger_s=linger)
        self._completions = GroupCommitter("complete", self._complete_batch, linger_s=linger)
        self._failures = GroupCommitter("fail", self._fail_batch, linger_s=linger)
        self._releases = GroupCommitter("release", self._release_batch, linger_s=linger)
        self._committers: list[GroupCommitter[Any, Any]] = [
            self._acks,
            self._beats,
            self._completions,
            self._failures,
            self._releases,
        ]
        self.stats: dict[str, int] = {
            "sessions_opened": 0,
            "sessions_rejected": 0,
            "assignments_sent": 0,
            "stale_settlements": 0,
            "revoked_in_heartbeats": 0,
            # Heartbeat cost (bench/heartbeats.py): messages, the extend_leases statements
            # their group commits issued, and the leases those statements extended.
            "heartbeats": 0,
            "heartbeat_statements": 0,
            "leases_extended": 0,
        }

    # ---- lifecycle ----------------------------------------------------------------------

    def set_listener(self, listener: GatewayListener) -> None:
        self._listener = listener

    def start(self) -> None:
        for committer in self._committers:
            committer.start()

    async def stop(self) -> None:
        """Tell every worker to go elsewhere, then flush what is queued (every message
        handled so far gets its answer), then end the worker streams.

        A stream ends once the messages queued for it (the last receipts) are sent; the
        worker was told ``Drain{shutting_down}``, so it does not reconnect, and it sends
        what it still has unconfirmed to another node. The streams never end on their
        own: left open, they held the gRPC server's grace (5 s) at every stop."""
        self.drain_all("scheduler node shutting down", shutting_down=True)
        # All at once: every kind refuses from here on, and a slow flush of one kind
        # does not keep the others taking requests.
        await asyncio.gather(*(committer.stop() for committer in self._committers))
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

    @property
    def accepting_settlements(self) -> bool:
        """False once :meth:`stop` began: acks, heartbeats and settlements are refused
        (``NODE_STOPPING``, retryable) instead of being queued."""
        return all(committer.accepting for committer in self._committers)

    def drain_all(self, reason: str, *, shutting_down: bool = False) -> None:
        """Send nothing more to any worker and tell each (``Drain``); a worker that
        connects meanwhile is told at once. The credits the workers granted stay counted
        here: each worker recalls them, and the answer (``CreditReturn``) is what frees
        its slots. Zeroing them silently left them counted on the worker, where nothing
        ever freed them while the node lived on drained. ``shutting_down`` also tells
        the workers not to reconnect (a drained node that stops says so once more)."""
        if self._draining and (self._shutting_down or not shutting_down):
            return
        self._draining = True
        self._shutting_down = shutting_down
        self._drain_reason = reason
        for session in list(self._sessions.values()):
            session.send(self._drain_message())

    def resume(self) -> None:
        """Undrained: tell every worker it may grant credits here again (``Resume``)."""
        self._draining = False
        for session in list(self._sessions.values()):
            session.send(worker_service_pb2.SchedulerMessage(resume=worker_service_pb2.Resume()))

    def _drain_message(self) -> worker_service_pb2.SchedulerMessage:
        return worker_service_pb2.SchedulerMessage(
            drain=worker_service_pb2.Drain(
                reason=self._drain_reason, shutting_down=self._shutting_down
            )
        )

    def announce_topology(self) -> None:
        """The membership changed: every worker asks GetTopology now (a joining node gets
        its sessions before it takes shards over)."""
        for session in list(self._sessions.values()):
            session.send(
                worker_service_pb2.SchedulerMessage(
                    topology_changed=worker_service_pb2.TopologyChanged()
                )
            )

    # ---- what the dispatcher uses --------------------------------------------------------

    def sessions_with_credit(self) -> list[WorkerSession]:
        if self._draining:
            return []
        return [
            s for s in self._sessions.values() if s.credits > 0 and not s.closed and not s.draining
        ]

    def credits_held(self) -> int:
        """Credits the workers granted this node and it has not used (a gauge)."""
        return sum(s.credits for s in self._sessions.values() if not s.closed)

    def sessions(self) -> list[WorkerSession]:
        return [s for s in self._sessions.values() if not s.closed]

    def total_slots(self) -> int:
        return sum(s.slots for s in self._sessions.values() if not s.closed)

    def session(self, session_id: str) -> WorkerSession | None:
        return self._sessions.get(session_id)

    def send_assignment(self, session: WorkerSession, task: Task, timer: TimerTask) -> bool:
        """Send a committed intent to its worker; False if the session is gone."""
        if session.closed or session.session_id not in self._sessions:
            return False
        assignment = worker_service_pb2.Assignment(
            task=convert.ref_to_pb(task.ref),
            type=task.type,
            payload_json=convert.json_bytes(task.payload),
            fencing_token=task.fencing_token,
            attempt=task.attempt,
            max_retries=task.max_retries,
            due_at=convert.ts_to_pb(task.due_at),
            checkpoint=bytes(task.checkpoint or b""),
            trace_context=task.trace_context or {},
            queue=task.queue,
            priority=convert.priority_to_pb(task.priority),
            idempotent=task.idempotent,
            # The cluster clock: the worker waits due_at - sent_at on its monotonic clock.
            sent_at=convert.ts_to_pb(self._clock.now()),
        )
        if task.lease_expires_at is not None:
            assignment.lease_expires_at.CopyFrom(convert.ts_to_pb(task.lease_expires_at))
        if task.timeout_s is not None:
            assignment.timeout.CopyFrom(convert.duration_to_pb(task.timeout_s))
        if not session.send(worker_service_pb2.SchedulerMessage(assignment=assignment)):
            return False
        session.assigned[task.id] = (timer, task.fencing_token)
        self.stats["assignments_sent"] += 1
        return True

    # ---- what the reconciler asks ------------------------------------------------------

    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None:
        """Whether this node sent attempt ``token`` of ``task_id`` on the live session of
        ``worker_id`` and it is unsettled; None when that worker has no session here, or
        only one younger than ``min_age_s``.

        False is an answer only from a session that has been open for a while: a worker
        that just reconnected (or reached a node that just restarted or took the shard
        over) may hold an attempt sent on its earlier stream and not have heartbeated it
        here yet.
        """
        session = self._by_worker.get(worker_id)
        if session is None or session.closed:
            return None
        if self._clock.monotonic() - session.opened_at < min_age_s:
            return None
        held = session.assigned.get(task_id)
        return held is not None and held[1] == token

    def attempt_superseded(self, task_id: uuid.UUID, token: int) -> None:
        """The reconciler gave attempt ``token`` up: its session stops holding it (the
        worker learns at its next heartbeat, whose reply revokes the token)."""
        for session in self._sessions.values():
            held = session.assigned.get(task_id)
            if held is not None and held[1] == token:
                del session.assigned[task_id]
                if self._listener is not None:
                    self._listener.task_ended(held[0])

    def outboxes_empty(self) -> bool:
        """Every queued message was handed to its stream (fault injection waits on it)."""
        return all(s.outbox.empty() for s in self._sessions.values())

    def worker_ids(self) -> set[str]:
        """Workers with a live session on this node."""
        return {s.worker_id for s in self._sessions.values() if not s.closed}

    def send_cancel(self, task_id: uuid.UUID, reason: str) -> bool:
        """Ask the worker running ``task_id`` (if its session is here) to stop it."""
        for session in self._sessions.values():
            held = session.assigned.get(task_id)
            if held is not None:
                timer, token = held
                return session.send(
                    worker_service_pb2.SchedulerMessage(
                        cancel=worker_service_pb2.Cancel(
                            task=convert.ref_to_pb(timer.ref), fencing_token=token, reason=reason
                        )
                    )
                )
        return False

    def send_backlog(self, session: WorkerSession, ready: int) -> None:
        """Report ``ready`` to the worker if it is not what the stream last carried."""
        if ready == session.backlog_sent:
            return
        message = worker_service_pb2.Backlog(ready=ready)
        if session.send(worker_service_pb2.SchedulerMessage(backlog=message)):
            session.backlog_sent = ready

    # ---- Connect ------------------------------------------------------------------------

    async def Connect(
        self,
        request_iterator: AsyncIterator[worker_service_pb2.WorkerMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_service_pb2.SchedulerMessage]:
        try:
            first = await asyncio.wait_for(anext(request_iterator), HELLO_TIMEOUT_S)
        except (TimeoutError, StopAsyncIteration):
            self.stats["sessions_rejected"] += 1
            return
        try:
            session = self._open_session(first)
        except InvalidArgument as exc:
            self.stats["sessions_rejected"] += 1
            yield worker_service_pb2.SchedulerMessage(
                reject=worker_service_pb2.Reject(error=boundary.error_info(exc))
            )
            return
        reader = asyncio.create_task(
            self._read(session, request_iterator), name=f"worker-reader-{session.session_id}"
        )
        try:
            yield worker_service_pb2.SchedulerMessage(
                welcome=worker_service_pb2.Welcome(
                    node_id=self._config.node_id,
                    session_id=session.session_id,
                    heartbeat_interval=convert.duration_to_pb(
                        self._config.workers.heartbeat_interval_s
                    ),
                    lease_duration=convert.duration_to_pb(self._config.workers.task_lease_s),
                    lease_margin=convert.duration_to_pb(self._config.workers.lease_margin_s),
                    accepts_batches=True,
                )
            )
            if self._draining:
                yield self._drain_message()
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
                first_out = get.result()
                if not session.accepts_batches or session.outbox.empty():
                    yield first_out
                    continue
                # Everything queued goes out in one write (bounded in count and bytes).
                queued = take_queued(first_out, session.outbox, MAX_BATCH_MESSAGES)
                for out in pack(queued, encoded_size, _scheduler_batch):
                    yield out
        finally:
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
            self._close_session(session)

    def _open_session(self, message: worker_service_pb2.WorkerMessage) -> WorkerSession:
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
        previous = self._by_worker.get(hello.worker_id)
        if previous is not None:
            # A reconnect: the new stream replaces the old one, which may be half-dead.
            previous.closed = True
            self._close_session(previous)
        session = WorkerSession(
            session_id=f"{self._config.node_id}/{next(self._session_ids)}",
            worker_id=hello.worker_id,
            queues=frozenset(hello.queues) or frozenset({"default"}),
            types=frozenset(hello.task_types),
            slots=hello.slots,
            accepts_batches=hello.accepts_batches,
            # Up to `slots` assignments and a receipt or two per task can be queued at
            # once for a worker that settles everything together.
            outbox=asyncio.Queue(maxsize=max(self._config.grpc.worker_send_queue, 4 * hello.slots)),
            opened_at=self._clock.monotonic(),
        )
        self._sessions[session.session_id] = session
        self._by_worker[session.worker_id] = session
        self.stats["sessions_opened"] += 1
        if self.on_sessions_changed is not None:
            self.on_sessions_changed()
        log.info(
            "worker connected",
            extra={
                "worker_id": session.worker_id,
                "session_id": session.session_id,
                "slots": session.slots,
                "queues": sorted(session.queues),
                "types": sorted(session.types),
            },
        )
        return session

    def _close_session(self, session: WorkerSession) -> None:
        session.closed = True
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
        if self._by_worker.get(session.worker_id) is session:
            del self._by_worker[session.worker_id]
        # Its unsettled tasks stay DISPATCHED/RUNNING in the database: the worker may
        # still be running them and settle through another node; the lease decides.
        if self._listener is not None:
            for timer, _ in session.assigned.values():
                self._listener.task_ended(timer)
        session.assigned.clear()
        if self.on_sessions_changed is not None:
            self.on_sessions_changed()
        log.info(
            "worker disconnected",
            extra={"worker_id": session.worker_id, "session_id": session.session_id},
        )

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
            if not session.draining:
                # Never more outstanding credits than slots, whatever the worker says.
                session.credits = min(session.slots, session.credits + message.credit_grant.credits)
                if self._listener is not None:
                    self._listener.credits_available()
        elif kind == "credit_recall":
            # Exact by construction: every assignment this session was sent before
            # this answer used a credit; the worker frees what we report.
            returned = min(session.credits, message.credit_recall.credits)
            session.credits -= returned
            session.send(
                worker_service_pb2.SchedulerMessage(
                    credit_return=worker_service_pb2.CreditReturn(credits=returned)
                )
            )
        elif kind == "drain_started":
            session.draining = True
            session.credits = 0
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
            ref = convert.ref_from_pb(body.task, f"{kind}.task")
            token = _token(body.fencing_token, f"{kind}.fencing_token")
            outcome = await self._settle(kind, body, ref, token, session.worker_id)
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
            held = session.assigned.pop(ref.id, None)
            if held is not None and self._listener is not None:
                self._listener.task_ended(held[0])
        session.send(self._receipt(kind, body, outcome))

    async def _settle(
        self, kind: str, body: Any, ref: TaskRef, token: int, worker_id: str
    ) -> SettleOutcome:
        if kind == "ack":
            return await self._acks.submit(Settle(ref, token))
        limit = self._config.limits.payload_limit_bytes
        if kind == "complete":
            # Checked like a submit's payload (exact numbers, nesting, size): a document
            # the database would refuse must not fail the whole group-committed batch.
            result = payloads.stored_form(body.result_json, f"{kind}.result_json", limit)
            return await self._completions.submit(Completion(ref, token, result))
        if kind == "fail":
            report = FailureReport(
                retryable=body.retryable, timed_out=body.timed_out, cancelled=body.cancelled
            )
            error = _free_text(body.error_message)
            if body.error_type:
                error = f"{_free_text(body.error_type)}: {error}"
            return await self._failures.submit(Failure(ref, token, error, report))
        assert kind == "release"
        cannot_run = body.reason == worker_service_pb2.RELEASE_REASON_CANNOT_RUN
        state = AttemptState.ABANDONED if cannot_run else AttemptState.RELEASED
        checkpoint = _checkpoint(body, f"{kind}.checkpoint", limit)
        return await self._releases.submit(
            Release(ref, token, checkpoint, state, _free_text(body.detail))
        )

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
            self.stats["stale_settlements"] += 1
            receipt.error.CopyFrom(_outcome_error(result))
        return worker_service_pb2.SchedulerMessage(receipt=receipt)

    async def _heartbeat(
        self, session: WorkerSession, heartbeat: worker_service_pb2.Heartbeat
    ) -> None:
        beats = _beats(session, heartbeat, self._config.limits.payload_limit_bytes)
        update: LeaseUpdate = await self._beats.submit(beats)
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
                self.stats["revoked_in_heartbeats"] += 1
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

    # ---- group-commit flushes -------------------------------------------------------------

    async def _ack_batch(self, acks: Sequence[Settle]) -> list[SettleOutcome]:
        outcomes = await self._store.ack(acks)
        return [outcomes[a.ref.id] for a in acks]

    async def _complete_batch(self, completions: Sequence[Completion]) -> list[SettleOutcome]:
        outcomes = await self._store.complete(completions)
        return [outcomes[c.ref.id] for c in completions]

    async def _beat_batch(self, batches: Sequence[Sequence[Beat]]) -> list[LeaseUpdate]:
        flat = [beat for batch in batches for beat in batch]
        workers = self._config.workers
        update = await self._store.extend_leases(flat, workers.task_lease_s, workers.lease_margin_s)
        self.stats["heartbeats"] += len(batches)
        self.stats["heartbeat_statements"] += 1 if flat else 0
        self.stats["leases_extended"] += len(update.extended)
        # Every heartbeat in the batch gets the same answer: it filters by its own ids.
        return [update] * len(batches)

    async def _fail_batch(self, failures: Sequence[Failure]) -> list[SettleOutcome]:
        result: FailureResult = await self._store.fail(failures, self._clock.now())
        if self._listener is not None:
            for shard, due_at in result.retrying:
                self._listener.retry_scheduled(shard, due_at)
        return [result.outcomes[f.ref.id] for f in failures]

    async def _release_batch(self, releases: Sequence[Release]) -> list[SettleOutcome]:
        try:
            outcomes, ready = await self._store.release(releases)
        except CommitOutcomeUnknown:
            # Released rows may be PRELOADED now and on no wheel: they are read back. (The
            # worker's retry finds them released and answers OK without new rows.)
            if self._listener is not None:
                self._listener.preloaded_unknown()
            raise
        if ready and self._listener is not None:
            self._listener.tasks_ready_again(ready)
        return [outcomes[r.ref.id] for r in releases]

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
            ref = convert.ref_from_pb(body.task, f"{kind}.task")
            token = _token(body.fencing_token, f"{kind}.fencing_token")
            return await self._settle(kind, body, ref, token, "")

        outcome = await boundary.serve(f"WorkerService.{kind.capitalize()}", context, settle)
        if outcome is not SettleOutcome.OK:
            self.stats["stale_settlements"] += 1
            await boundary.abort(context, _outcome_error(outcome))


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
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise InvalidArgument(field, "must not contain control characters")


def _free_text(value: str) -> str:
    """Error text and release details from a worker, stored as they are but cut to
    MAX_ERROR_CHARS and without NUL (PostgreSQL text cannot hold it): a worker's failure
    report is never refused for its wording."""
    return value[:MAX_ERROR_CHARS].replace("\x00", "\ufffd")


def _outcome_error(outcome: SettleOutcome) -> common_pb2.ErrorInfo:
    code, message = SETTLE_OUTCOME_ERRORS[outcome.value]
    return common_pb2.ErrorInfo(code=code, reason=outcome.value, message=message)
