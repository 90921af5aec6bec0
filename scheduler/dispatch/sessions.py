"""Worker sessions: who is connected to this node, the credits each granted, what each holds.

Each ``Connect`` stream is one :class:`WorkerSession`: what the worker serves (queues,
types), the credits it granted (the node never sends more assignments than that), the
tasks this node assigned to it and not yet settled, and a bounded outbox. The outbox is
the session's: whoever wants to tell the worker something queues it here, and the
stream (:mod:`chronoshard.scheduler.api.workers`) drains it. A stalled worker fills only
its own outbox and is then dropped, never blocking other sessions
(docs/architecture.md#d12).

The outbox holds ``chronoshard.v1`` ``SchedulerMessage`` values, built here, and not
core types converted at the stream: the server keeps protobuf messages on its hot path
on purpose, because converting dominated the cost of a heartbeat (see
:mod:`chronoshard.scheduler.api.workers`). So this is the one module outside ``api/``
that builds worker-protocol messages; it parses none (the servicer does).

Credits (docs/worker-protocol.md, "Credits") are counted per session by
:class:`WorkerSession`'s pure bookkeeping: a grant is capped at the worker's slots and
ignored once the worker drains, a recall returns exactly what is unused, ``DrainStarted``
withdraws everything. The dispatch round spends and returns them
(:mod:`chronoshard.scheduler.core.rounds`). A drained node (:meth:`SessionRegistry.drain_all`)
keeps the credits it holds: the worker recalls them, and the ``CreditReturn`` is what
frees its slots.

The :class:`SessionRegistry` holds the sessions and is what the dispatcher sends through,
what the reconciler asks about attempts, and what liveness reports; it tells its
:class:`SessionListener` (the dispatcher) when credits arrive and when a task this node
sent is no longer held by a session.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from chronoshard.clock import Clock
from chronoshard.scheduler.api import convert
from chronoshard.scheduler.config import WorkflowsConfig
from chronoshard.scheduler.core.fairness import WorkerOffer
from chronoshard.scheduler.core.models import Task, TaskRef
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.core.workflows import Place, bounded_results
from chronoshard.v1 import worker_service_pb2

log = logging.getLogger(__name__)

OUTBOX_PER_SLOT = 4
"""Up to ``slots`` assignments and a receipt or two per task can be queued at once for a
worker that settles everything together."""


class SessionListener(Protocol):
    """What the dispatcher hears from the sessions."""

    def credits_available(self) -> None: ...

    def task_ended(self, task: TimerTask) -> None:
        """A task this node sent settled (or its attempt was given up): no longer held
        by any session, nor running."""
        ...

    def task_left(self, task: TimerTask) -> None:
        """A task this node sent is no longer held by a session (its stream closed), but
        its worker may still be running it."""
        ...


@dataclass(eq=False)
class WorkerSession:
    session_id: str
    worker_id: str
    queues: frozenset[str]
    types: frozenset[str]
    slots: int
    outbox: asyncio.Queue[worker_service_pb2.SchedulerMessage]
    credits: int = 0
    # The worker said DrainStarted: it grants nothing more here.
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

    # ---- credits (pure bookkeeping) ----------------------------------------------------

    def grant(self, credits: int) -> bool:
        """``CreditGrant``: count ``credits`` more, never more outstanding than slots,
        whatever the worker says. False (nothing counted) once the worker drains."""
        if self.draining:
            return False
        self.credits = min(self.slots, self.credits + credits)
        return True

    def recall(self, credits: int) -> int:
        """``CreditRecall``: give back up to ``credits`` unused ones; how many (the
        ``CreditReturn``). Exact by construction: every assignment this session was sent
        before the answer used a credit, and the worker frees what is reported."""
        returned = min(self.credits, credits)
        self.credits -= returned
        return returned

    def worker_draining(self) -> None:
        """``DrainStarted``: the worker withdrew every credit and grants no more."""
        self.draining = True
        self.credits = 0

    @property
    def can_dispatch(self) -> bool:
        """Open, not draining, with a credit to spend."""
        return self.credits > 0 and not self.closed and not self.draining

    # ---- the outbox ----------------------------------------------------------------------

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


class SessionRegistry:
    """This node's worker sessions, by session and by worker, and the node's drain state."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        node_id: str,
        clock: Clock,
        *,
        send_queue: int,
        max_parent_results_bytes: int = WorkflowsConfig.max_parent_results_bytes,
    ) -> None:
        self._node_id = node_id
        self._clock = clock
        self._send_queue = send_queue
        self._max_parent_results_bytes = max_parent_results_bytes
        self._listener: SessionListener | None = None
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
        self._stats: dict[str, int] = {"sessions_opened": 0, "assignments_sent": 0}

    def set_listener(self, listener: SessionListener) -> None:
        self._listener = listener

    # ---- open and close --------------------------------------------------------------

    def open(
        self,
        worker_id: str,
        *,
        queues: frozenset[str],
        types: frozenset[str],
        slots: int,
        accepts_batches: bool,
    ) -> WorkerSession:
        """A new stream of ``worker_id`` (its Hello already checked). It replaces the
        worker's previous session here, which may be half-dead."""
        previous = self._by_worker.get(worker_id)
        if previous is not None:
            previous.closed = True
            self.close(previous)
        session = WorkerSession(
            session_id=f"{self._node_id}/{next(self._session_ids)}",
            worker_id=worker_id,
            queues=queues,
            types=types,
            slots=slots,
            accepts_batches=accepts_batches,
            outbox=asyncio.Queue(maxsize=max(self._send_queue, OUTBOX_PER_SLOT * slots)),
            opened_at=self._clock.monotonic(),
        )
        self._sessions[session.session_id] = session
        self._by_worker[worker_id] = session
        self._stats["sessions_opened"] += 1
        if self.on_sessions_changed is not None:
            self.on_sessions_changed()
        log.info(
            "worker connected",
            extra={
                "worker_id": worker_id,
                "session_id": session.session_id,
                "slots": slots,
                "queues": sorted(queues),
                "types": sorted(types),
            },
        )
        return session

    def close(self, session: WorkerSession) -> None:
        session.closed = True
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
        if self._by_worker.get(session.worker_id) is session:
            del self._by_worker[session.worker_id]
        # Its unsettled tasks stay DISPATCHED/RUNNING in the database: the worker may
        # still be running them and settle through another node; the lease decides. So
        # they still count against their tenants' concurrency.
        if self._listener is not None:
            for timer, _ in session.assigned.values():
                self._listener.task_left(timer)
        session.assigned.clear()
        if self.on_sessions_changed is not None:
            self.on_sessions_changed()
        log.info(
            "worker disconnected",
            extra={"worker_id": session.worker_id, "session_id": session.session_id},
        )

    # ---- drain -------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    def drain_all(self, reason: str, *, shutting_down: bool = False) -> None:
        """Send nothing more to any worker and tell each (``Drain``); a worker that
        connects meanwhile is told at once (:meth:`drain_message`). The credits the
        workers granted stay counted here: each worker recalls them, and the answer
        (``CreditReturn``) is what frees its slots. Zeroing them silently left them
        counted on the worker, where nothing ever freed them while the node lived on
        drained. ``shutting_down`` also tells the workers not to reconnect (a drained
        node that stops says so once more)."""
        if self._draining and (self._shutting_down or not shutting_down):
            return
        self._draining = True
        self._shutting_down = shutting_down
        self._drain_reason = reason
        for session in list(self._sessions.values()):
            session.send(self.drain_message())

    def resume(self) -> None:
        """Undrained: tell every worker it may grant credits here again (``Resume``)."""
        self._draining = False
        for session in list(self._sessions.values()):
            session.send(worker_service_pb2.SchedulerMessage(resume=worker_service_pb2.Resume()))

    def drain_message(self) -> worker_service_pb2.SchedulerMessage:
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

    # ---- credits -----------------------------------------------------------------------

    def credits_granted(self, session: WorkerSession, credits: int) -> None:
        if session.grant(credits) and self._listener is not None:
            self._listener.credits_available()

    def credits_recalled(self, session: WorkerSession, credits: int) -> None:
        returned = session.recall(credits)
        session.send(
            worker_service_pb2.SchedulerMessage(
                credit_return=worker_service_pb2.CreditReturn(credits=returned)
            )
        )

    def with_credit(self) -> list[WorkerSession]:
        """The sessions the dispatcher may send to now (none while the node drains)."""
        if self._draining:
            return []
        return [s for s in self._sessions.values() if s.can_dispatch]

    def credits_held(self) -> int:
        """Credits the workers granted this node and it has not used (a gauge)."""
        return sum(s.credits for s in self._sessions.values() if not s.closed)

    def live(self) -> list[WorkerSession]:
        return [s for s in self._sessions.values() if not s.closed]

    def total_slots(self) -> int:
        return sum(s.slots for s in self._sessions.values() if not s.closed)

    def worker_ids(self) -> set[str]:
        """Workers with a live session on this node."""
        return {s.worker_id for s in self._sessions.values() if not s.closed}

    def outboxes_empty(self) -> bool:
        """Every queued message was handed to its stream (fault injection waits on it)."""
        return all(s.outbox.empty() for s in self._sessions.values())

    # ---- what the dispatcher and the node send -------------------------------------------

    def send_assignment(
        self, session: WorkerSession, task: Task, timer: TimerTask, place: Place | None = None
    ) -> bool:
        """Send a committed intent to its worker; False if the session is gone. A
        workflow task's ``place`` gives its ref and its parents' results."""
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
            tenant_id=str(task.tenant_id),
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
        if task.logical_date is not None:
            assignment.logical_date.CopyFrom(convert.ts_to_pb(task.logical_date))
        if task.schedule_id is not None:
            assignment.schedule_id = str(task.schedule_id)
        if task.workflow_id is not None:
            assignment.workflow_id = str(task.workflow_id)
        if place is not None:
            self._add_place(assignment, place)
        if not session.send(worker_service_pb2.SchedulerMessage(assignment=assignment)):
            return False
        session.assigned[task.id] = (timer, task.fencing_token)
        self._stats["assignments_sent"] += 1
        return True

    def _add_place(self, assignment: worker_service_pb2.Assignment, place: Place) -> None:
        assignment.workflow_ref = place.ref
        for parent, carried in bounded_results(place.parents, self._max_parent_results_bytes):
            result = assignment.parent_results.add(
                ref=parent.ref,
                task_id=str(parent.task_id),
                status=convert.status_to_pb(parent.status),
                omitted=not carried,
            )
            if carried and parent.result_json is not None:
                result.result_json = parent.result_json.encode()

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

    # ---- attempts ------------------------------------------------------------------------

    def settled(self, session: WorkerSession, task_id: uuid.UUID) -> None:
        """The worker's settlement of ``task_id`` was answered for good (done, stale or
        cancelled): its session no longer holds it."""
        held = session.assigned.pop(task_id, None)
        if held is not None and self._listener is not None:
            self._listener.task_ended(held[0])

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

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
