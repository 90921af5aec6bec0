"""The run manager: what the worker does with each message a node sends.

It is the sessions' :class:`SessionHost`. Every callback runs on the event loop between
two awaits and answers by calling the pure parts: the :class:`CreditLedger` (may this
assignment run, which node gets the freed slot), the outcome table of ``_execution.py``
(what settles an attempt) and, through :class:`Settlements`, the outbox. An accepted
assignment becomes a *run*: a task driving one :class:`Execution`, whose outcome is
settled as soon as it is known and whose slot is given back once the handler really
stopped. The :class:`Worker` owns the lifecycle (start, drain, close) and reads the
run manager's state to decide when each shutdown phase is over.

Worker self-fencing lives here too: every run holds a :class:`RunLease` (``_lease.py``)
that its assignment starts and heartbeat replies extend, and a timer per run stops it
(``StopReason.LEASE_LOST``: the handler is cancelled, the helpers refuse writes, nothing
is settled) once ``lease - margin`` passed without a renewal from any node.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import chronoshard
from chronoshard.clock import Anchor, AnchoredClock, Clock
from chronoshard.wire import DEFAULT_QUEUE
from chronoshard.worker._context import (
    FINAL_STOPS,
    BadAttempt,
    StopReason,
    TaskContext,
    build_context,
)
from chronoshard.worker._credits import CreditLedger
from chronoshard.worker._execution import (
    Abandoned,
    Completed,
    Execution,
    Failed,
    HandlerSpec,
    Outcome,
    Released,
    effective_timeout,
    failure,
)
from chronoshard.worker._lease import RunLease, initial_deadline
from chronoshard.worker._models import (
    Ack,
    Assignment,
    Backlog,
    Cancel,
    Complete,
    CreditGrant,
    CreditRecall,
    CreditReturn,
    Drain,
    DrainStarted,
    Fail,
    Heartbeat,
    HeartbeatReply,
    Hello,
    Inbound,
    Receipt,
    Release,
    ReleaseReason,
    Resume,
    RunKey,
    RunningTask,
    Settlement,
    TopologyChanged,
    Welcome,
)
from chronoshard.worker._session import NodeSession
from chronoshard.worker._settlements import Settlements
from chronoshard.worker._skew import SKEW_LOG_INTERVAL_S, WarningThrottle, skew_warning
from chronoshard.worker._slots import HandlerSlots
from chronoshard.worker._topology import Topology

logger = logging.getLogger("chronoshard.worker")

ACK_DELAY_S = 0.05
"""How long after its start a run is acked. A run that settles sooner is never acked:
its Complete (or Fail, Release) moves the task straight from DISPATCHED, which spares the
node one write and the stream two messages per task."""
ACK_WAIT_CAP_S = 1.0
"""The longest an ack waits for ``due_at``: far inside the node's ack timeout (10 s)."""
OUTCOMES = (
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "released",
    "abandoned",
    "lease_lost",
)
"""The counters of :attr:`RunManager.counts` that count ended attempts."""


@dataclass
class _Run:
    """One accepted assignment on this worker."""

    assignment: Assignment
    node: str  # address of the session that assigned it
    execution: Execution
    lease: RunLease
    task: asyncio.Task[None] | None = None
    decided: bool = False  # outcome known (settlement queued, or abandoned)
    ack_timer: asyncio.TimerHandle | None = None
    lease_timer: asyncio.TimerHandle | None = None

    @property
    def ctx(self) -> TaskContext:
        return self.execution.ctx


@dataclass
class HeartbeatSent:
    """What one heartbeat carried: when it was built (monotonic, no later than its send)
    and, per run, the checkpoint sequence it carried (None: no checkpoint)."""

    at: float
    runs: list[tuple[RunKey, int | None]] = field(default_factory=list)


class RunManager:
    def __init__(
        self,
        *,
        worker_id: str,
        handlers: Mapping[str, HandlerSpec],
        queues: Sequence[str],
        slots: int,
        clock: Clock,
        drain_grace_s: float,
        drain_stop_s: float,
        on_change: Callable[[], None],
        prefetch: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self._handlers = handlers
        self._queues = tuple(queues)
        # What the nodes may send (credits, and Hello's slots) is the handler slots plus
        # the prefetch; the handlers themselves take turns at ``slots`` (._slots).
        self._offered = slots + prefetch
        self._handler_slots = HandlerSlots(slots) if prefetch else None
        self._clock = clock
        self._drain_grace_s = drain_grace_s
        self._drain_stop_s = drain_stop_s
        self._changed = on_change
        self.ledger = CreditLedger(self._offered)
        self.runs: dict[RunKey, _Run] = {}
        self.counts: Counter[str] = Counter()
        self.draining = False
        self.executor: Executor | None = None
        self._skew_log = WarningThrottle(SKEW_LOG_INTERVAL_S)
        # The credit plan asked for in this event-loop turn (_regrant), not yet made.
        self._regrant_pending: asyncio.Handle | None = None
        # Wired by bind(): the topology needs the run manager as its host first.
        self._topology: Topology | None = None
        self._settlements: Settlements | None = None

    def bind(self, topology: Topology, settlements: Settlements) -> None:
        self._topology = topology
        self._settlements = settlements

    @property
    def topology(self) -> Topology:
        assert self._topology is not None, "bind() first"
        return self._topology

    @property
    def settlements(self) -> Settlements:
        assert self._settlements is not None, "bind() first"
        return self._settlements

    def _log(self, level: int, msg: str, *args: Any, **fields: Any) -> None:
        logger.log(level, msg, *args, extra={"worker_id": self.worker_id, **fields})

    def ended(self) -> int:
        """Attempts that reached an outcome so far."""
        return sum(self.counts[k] for k in OUTCOMES)

    # ---- drain -----------------------------------------------------------------------

    def start_drain(self) -> None:
        """Stop intake: no credit from now on, and DrainStarted to every node withdraws
        the credits they hold; assignments still in flight are released CANNOT_RUN, and
        held ones that wait for a handler slot (prefetch) DRAINING."""
        self.draining = True
        self.ledger.stop_granting()
        if self._handler_slots is not None:
            # Held but not begun (prefetch): given back unrun, for another worker now.
            self._handler_slots.close()
        for session in self.topology.sessions.values():
            session.send(DrainStarted(self._drain_grace_s))

    def stop_all(self, reason: StopReason) -> None:
        for run in list(self.runs.values()):
            run.execution.request_stop(reason)

    # ---- SessionHost -----------------------------------------------------------------

    def hello(self) -> Hello:
        return Hello(
            worker_id=self.worker_id,
            queues=self._queues,
            task_types=tuple(sorted(self._handlers)),
            slots=self._offered,
            sdk_version=chronoshard.__version__,
        )

    def session_welcomed(self, session: NodeSession) -> None:
        self.ledger.open(session.address)
        if self.draining:
            session.send(DrainStarted(self._drain_grace_s))
        self.settlements.on_welcome(session, lambda key: key in self.runs)
        self._regrant()

    def session_ended(self, session: NodeSession, *, welcomed: bool) -> None:
        if not welcomed:
            return
        self.ledger.close(session.address)
        self.settlements.on_stream_lost(session)
        self.topology.request_refresh()
        self._regrant()
        self._changed()

    def session_message(self, session: NodeSession, msg: Inbound) -> None:
        match msg:
            case Assignment():
                self._on_assignment(session, msg)
            case Receipt():
                self.settlements.on_receipt(session, msg)
            case Cancel():
                self._on_cancel(session, msg)
            case Backlog():
                self.ledger.set_backlog(session.address, msg.ready)
                self._regrant()
            case CreditReturn():
                self.ledger.returned(session.address, msg.credits)
                self._regrant()
            case Drain():
                self._on_drain(session, msg)
            case Resume():
                self._on_resume(session)
            case TopologyChanged():
                self.topology.request_refresh()
            case Welcome():
                self._log(logging.WARNING, "second Welcome ignored", node=session.node_id)
            case _:
                pass

    def heartbeat_for(self, session: NodeSession) -> tuple[Heartbeat, HeartbeatSent]:
        """This node's running tasks, plus those of nodes we have no usable stream to
        (any node can extend any lease), with checkpoints not yet stored. A run whose
        lease lapsed is not heartbeated: it is over, whatever a node would answer."""
        running: list[RunningTask] = []
        sent = HeartbeatSent(self._clock.monotonic())
        for key, run in list(self.runs.items()):
            if run.decided:
                continue
            if run.node != session.address and self.topology.usable(run.node):
                continue
            if not run.lease.held():
                self._check_lease(run)
                continue
            pending = run.ctx._pending_checkpoint()
            a = run.assignment
            running.append(RunningTask(a.task, a.fencing_token, pending[1] if pending else None))
            sent.runs.append((key, pending[0] if pending else None))
        return Heartbeat(tuple(running)), sent

    def heartbeat_answered(self, session: NodeSession, sent: Any, reply: HeartbeatReply) -> None:
        revoked = {(r.task.id, r.fencing_token): r for r in reply.revoked}
        lease_s = session.lease_duration_s
        if isinstance(sent, HeartbeatSent):
            for key, seq in sent.runs:
                run = self.runs.get(key)
                if run is None or key in revoked:
                    continue
                if seq is not None:
                    run.ctx._checkpoint_stored(seq)
                # The node extended this lease from when it committed the heartbeat,
                # which is after it was sent: from the send is never later than the node.
                if lease_s is not None:
                    run.lease.extend(sent.at, lease_s)
        for key, item in revoked.items():
            if self._revoke(key):
                self._zombie(key, f"heartbeat ({item.reason or 'revoked'})", session.node_id)

    # ---- messages --------------------------------------------------------------------

    def _refusal(self, a: Assignment) -> str | None:
        """Why this worker cannot take ``a`` (None: it can, and a slot is now taken)."""
        if self.draining:
            return "worker is draining"
        if a.type not in self._handlers:
            return f"no handler for task type {a.type!r}"
        if (a.queue or DEFAULT_QUEUE) not in self._queues:
            return f"worker does not serve queue {a.queue!r}"
        if not self.ledger.try_occupy():
            return "no free slot"
        return None

    def _start_clock(self, a: Assignment) -> Clock:
        """The clock a run waits for ``due_at`` on: the node's cluster clock as it was
        when the node sent ``a``, carried on from now (its receipt) by this host's
        monotonic clock, so a wrong or stepped wall clock here neither starts it early
        nor late. Transit time makes it start that much late, never early. From a node
        that sends no time: this host's wall clock."""
        if a.sent_at is None:
            return self._clock
        return AnchoredClock(self._clock, Anchor(a.sent_at, self._clock.monotonic()))

    def _on_assignment(self, session: NodeSession, a: Assignment) -> None:
        start_clock = self._start_clock(a)
        node = session.address
        fields = {"task_id": a.task.id, "token": a.fencing_token, "node": session.node_id}
        if not self.ledger.consume(node):
            self._log(logging.WARNING, "assignment without a credit", **fields)
        if a.run_key in self.runs:
            # Sent again (a node repeating itself after a hiccup): the run goes on.
            self.settlements.send(node, Ack(a.task, a.fencing_token))
            self._regrant()
            return
        refusal = self._refusal(a)
        if refusal is not None:
            self._log(logging.INFO, "releasing: %s", refusal, event="cannot_run", **fields)
            self.counts["cannot_run"] += 1
            release = Release(a.task, a.fencing_token, ReleaseReason.CANNOT_RUN, None, refusal)
            self.settlements.send(node, release)
            self._regrant()
            return
        # The credit the assignment used is granted again (to whichever node needs it most).
        self._regrant()
        if not self._start_run(session, a, start_clock, fields):
            return
        self._log(
            logging.DEBUG,
            "accepted %s attempt %d, due %s",
            a.type,
            a.attempt,
            a.due_at.isoformat(),
            event="assigned",
            **fields,
        )
        warning = skew_warning(a.sent_at, a.due_at, self._clock.now())
        if warning is not None and self._skew_log.due(self._clock.monotonic()):
            self._log(
                logging.WARNING, warning.template, *warning.args, event="clock_skew", **fields
            )

    def _start_run(
        self, session: NodeSession, a: Assignment, start_clock: Clock, fields: dict[str, Any]
    ) -> bool:
        """Start the run of accepted assignment ``a`` (its slot taken): its task, its lease
        timer and its ack timer. False when ``a`` cannot even be started: it is failed
        (not retryable) and its slot given back."""
        node = session.address
        spec = self._handlers[a.type]
        timeout_s = effective_timeout(spec.timeout_s, a.timeout_s)
        lease = self._run_lease(session, a)
        try:
            ctx = build_context(
                a, worker_id=self.worker_id, timeout_s=timeout_s, now=self._clock.now, lease=lease
            )
        except BadAttempt as exc:
            self._log(logging.ERROR, "cannot start: %s", exc, event="bad_assignment", **fields)
            self._settle(node, a, Failed(str(exc), "chronoshard.worker.BadAssignment", False))
            self.ledger.release_slot()
            self._regrant()
            return False
        execution = Execution(
            spec,
            ctx,
            now=start_clock.now,
            timeout_s=timeout_s,
            executor=self.executor,
            drain_stop_s=self._drain_stop_s,
            slots=self._handler_slots,
            tenant_id=a.tenant_id,
        )
        run = _Run(a, node, execution, lease)
        self.runs[a.run_key] = run
        run.task = asyncio.create_task(self._drive(run), name=f"chronoshard-run {a.task.id}")
        self._check_lease(run)
        wait_s = (a.due_at - start_clock.now()).total_seconds()
        run.ack_timer = asyncio.get_running_loop().call_later(
            min(max(0.0, wait_s), ACK_WAIT_CAP_S) + ACK_DELAY_S, self._ack_if_running, run
        )
        return True

    def _run_lease(self, session: NodeSession, a: Assignment) -> RunLease:
        """The lease an assignment starts, on this host's monotonic clock."""
        return RunLease(
            deadline=initial_deadline(
                received_at=self._clock.monotonic(),
                lease_s=session.lease_duration_s,
                lease_expires_at=a.lease_expires_at,
                wall_now=self._clock.now(),
                # The node's clock when it sent the assignment: what is left of the lease
                # is then read on the lease's own clock, whatever this host's says.
                sent_at=a.sent_at,
            ),
            margin_s=session.lease_margin_s,
            monotonic=self._clock.monotonic,
        )

    def _on_cancel(self, session: NodeSession, msg: Cancel) -> None:
        run = self.runs.get((msg.task.id, msg.fencing_token))
        if run is None or run.decided:
            return  # already settled: the settlement answers the cancel
        self._log(
            logging.INFO,
            "cancel requested: %s",
            msg.reason or "-",
            task_id=msg.task.id,
            token=msg.fencing_token,
            node=session.node_id,
            event="cancel",
        )
        run.execution.request_stop(StopReason.CANCELLED)

    def _on_drain(self, session: NodeSession, msg: Drain) -> None:
        self._log(
            logging.INFO,
            "node is draining (%s): settling through the others",
            msg.reason or "-",
            node=session.node_id,
            event="node_drain",
        )
        session.drained = True
        if msg.shutting_down:
            self.topology.node_leaving(session.address)
        # No more credits for it, and the ones it holds are recalled (its answer frees
        # them for the other nodes).
        self.ledger.stop_node(session.address)
        self.topology.request_refresh()
        self._regrant()

    def _on_resume(self, session: NodeSession) -> None:
        self._log(
            logging.INFO,
            "node is taking work again",
            node=session.node_id,
            event="node_resume",
        )
        session.drained = False
        self.ledger.resume_node(session.address)
        self.topology.request_refresh()
        self._regrant()

    def _regrant(self) -> None:
        """Grant and recall credits as the slots now allow, once the events of this
        event-loop turn are in: a batch of assignments, or the runs that ended together,
        then make one plan and one message per node, not one each (issue 14: planning
        per event was a tenth of a worker's CPU in a stampede, and each grant one more
        message for the node to read)."""
        if self._regrant_pending is None:
            self._regrant_pending = asyncio.get_running_loop().call_soon(self._regrant_now)

    def _regrant_now(self) -> None:
        self._regrant_pending = None
        if self.draining:
            return
        # Wall time, not monotonic: every worker reads whose turn it is off its own clock,
        # and only wall clocks agree between hosts (._credits.Turns).
        grants, recalls = self.ledger.plan(self._clock.now().timestamp())
        for node, credits in grants.items():
            session = self.topology.session(node)
            # A failed send means the stream is breaking: session_ended clears the credits.
            if session is not None:
                session.send(CreditGrant(credits))
        for node, credits in recalls.items():
            session = self.topology.session(node)
            if session is not None:
                session.send(CreditRecall(credits))

    # ---- runs ------------------------------------------------------------------------

    async def _drive(self, run: _Run) -> None:
        key = run.assignment.run_key
        try:
            try:
                outcome = await run.execution.run()
            except Exception as exc:  # a bug in the SDK: fail the attempt, keep the worker
                logger.exception(
                    "task run crashed",
                    extra={"worker_id": self.worker_id, "task_id": key[0], "token": key[1]},
                )
                outcome = failure(exc)
            self._conclude(run, outcome)
            await run.execution.handler_stopped()
        finally:
            run.decided = True
            if run.ack_timer is not None:
                run.ack_timer.cancel()
            if run.lease_timer is not None:
                run.lease_timer.cancel()
            self.runs.pop(key, None)
            run.execution.give_slot_back()
            self.ledger.release_slot()
            self._regrant()
            self._changed()

    def _ack_if_running(self, run: _Run) -> None:
        """Still running (or waiting for due_at) ACK_DELAY_S after its start: tell the node,
        which moves the task to RUNNING."""
        run.ack_timer = None
        a = run.assignment
        if not run.decided and self.runs.get(a.run_key) is run:
            self.settlements.send(run.node, Ack(a.task, a.fencing_token))

    def _check_lease(self, run: _Run) -> None:
        """Stop ``run`` if its lease lapsed; else look again when it would."""
        if run.lease_timer is not None:
            run.lease_timer.cancel()  # called early (a heartbeat saw it lapse): one timer
            run.lease_timer = None
        if run.decided or self.runs.get(run.assignment.run_key) is not run:
            return
        if not run.lease.held():
            self._lease_lost(run)
            return
        fence_at = run.lease.fence_at
        if fence_at is not None:
            # The timer may fire a hair early, or after an extension: it then re-arms.
            delay_s = max(0.0, fence_at - self._clock.monotonic())
            run.lease_timer = asyncio.get_running_loop().call_later(delay_s, self._check_lease, run)

    def _lease_lost(self, run: _Run) -> None:
        """Worker self-fencing: no node renewed the lease by ``lease - margin``. The node
        gives the attempt up only ``margin`` after the lease, so stop it now."""
        a = run.assignment
        if run.ctx._cancel_reason in FINAL_STOPS:
            return  # already stopped for good (revoked, or this)
        self._log(
            logging.WARNING,
            "lease lost: no node renewed it in time; stopping the attempt and settling "
            "nothing (the node re-runs it or holds it as OUTCOME_UNKNOWN)",
            event="lease_lost",
            task_id=a.task.id,
            token=a.fencing_token,
            node=run.node,
            idempotent=a.idempotent,
        )
        run.execution.request_stop(StopReason.LEASE_LOST)

    def _conclude(self, run: _Run, outcome: Outcome) -> None:
        a = run.assignment
        run.decided = True
        if run.ack_timer is not None:
            run.ack_timer.cancel()
            run.ack_timer = None
        counter = type(outcome).__name__.lower()
        if isinstance(outcome, Abandoned) and outcome.lease_lost:
            counter = "lease_lost"
        if isinstance(outcome, Failed):
            counter = (
                "timed_out" if outcome.timed_out else "cancelled" if outcome.cancelled else counter
            )
            self._log(
                logging.WARNING,
                "%s attempt %d %s: %s",
                a.type,
                a.attempt,
                counter,
                outcome.error_message.partition("\n")[0],
                event="task_failed",
                task_id=a.task.id,
                token=a.fencing_token,
            )
        self.counts[counter] += 1
        self._settle(run.node, a, outcome)
        self._changed()

    def _settle(self, node: str, a: Assignment, outcome: Outcome) -> None:
        settlement: Settlement
        match outcome:
            case Completed():
                settlement = Complete(a.task, a.fencing_token, outcome.result_json)
            case Failed():
                settlement = Fail(
                    a.task,
                    a.fencing_token,
                    outcome.error_message,
                    outcome.error_type,
                    outcome.retryable,
                    outcome.timed_out,
                    outcome.cancelled,
                )
            case Released():
                settlement = Release(
                    a.task,
                    a.fencing_token,
                    ReleaseReason.CANNOT_RUN if outcome.never_started else ReleaseReason.DRAINING,
                    outcome.checkpoint,
                    outcome.detail,
                )
            case Abandoned():
                self.settlements.discard(a.run_key)
                return
        self.settlements.send(node, settlement, on_draining_node=False)

    def _revoke(self, key: RunKey) -> bool:
        """Stop a run whose token is stale; False if there was nothing left to stop."""
        run = self.runs.get(key)
        if run is None or run.decided or run.ctx.cancel_reason is StopReason.REVOKED:
            return False  # gone, settled, or already revoked (several nodes may say so)
        run.execution.request_stop(StopReason.REVOKED)
        return True

    def stale(self, key: RunKey, what: str, node: str) -> None:
        """A settlement came back STALE_FENCING_TOKEN: another attempt owns the task."""
        self._revoke(key)
        self._zombie(key, what, node)

    def _zombie(self, key: RunKey, what: str, node: str) -> None:
        self.counts["zombie"] += 1
        self._log(
            logging.WARNING,
            "zombie attempt: %s refused with a stale fencing token; another attempt owns "
            "the task, this one is dropped",
            what,
            task_id=key[0],
            token=key[1],
            node=node,
            event="zombie",
        )
