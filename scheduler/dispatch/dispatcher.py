"""The dispatcher: due timers become committed intents, then assignments.

It owns the node's :class:`TimingWheel` (PRELOADED tasks of owned shards, keyed by the
task id's int, fired ``lead_dispatch_s`` before ``due_at`` on the monotonic clock) and the
:class:`ReadyQueues` (fired tasks waiting for a worker, chosen by the fairness policy).
One loop, :meth:`Dispatcher.run`, reads the clock once per turn, advances the wheel,
matches ready tasks to worker credits, and sleeps until the wheel's next deadline, the
next rate-limit opening, or a wake-up (new timers, new credits) — never ticking while
idle.

**Intent before action** (docs/architecture.md#d6): a round's choices are written DISPATCHED
(token+1, attempt+1, attempt row, lease) in one epoch-guarded transaction; only the tasks that
transaction returned are sent. A task whose row moved on meanwhile (cancelled) is not returned and
not sent; a task whose worker session vanished between the commit and the send is released at once
(attempt ABANDONED), not left for the lease to expire. An intent whose commit outcome is unknown
(the connection died during COMMIT) is read back before anything else happens to it
(docs/architecture.md#d12): committed ones are sent, the others are chosen again; none is written a
second time.

A write elsewhere whose outcome is unknown may have left PRELOADED rows that no wheel
holds (a preload, a release, a reconciler repair): :meth:`Dispatcher.preloaded_unknown`
asks the preloader to read the owned shards' PRELOADED rows back, and
:meth:`Dispatcher.adopt` takes those it does not hold yet.

**Cluster-wide quotas** (docs/operations.md#tenants-and-quotas): the intents' transaction
first checks each tenant of the round against its dispatch rate and concurrency, for the
whole cluster (``store/quotas.py``), and writes only what they admit. The ready queues
hear the answer: the tenant's in-flight count as the database counted it (their estimate
until the next round), and for a tenant out of tokens a hold until its next one is due
(at least ``QUOTA_MIN_HOLD_S``: a busy tenant's nodes must not ask the database every
millisecond). The refused tasks go back to the ready queues, still PRELOADED. The ready
queues' own limits (the same numbers, from the tenant cache) only spare the database
rounds it would refuse; a tenant they hold for concurrency lets one task through every
``QUOTA_PROBE_S`` (settlements through other nodes are not seen here).

Lead dispatch: the assignment carries ``due_at`` and the SDK starts the handler exactly
then, so lateness is the worker's timer precision rather than tick + commit + network.

Tracing (docs/tracing.md): with OpenTelemetry configured, each attempt of a task that
carries a trace context gets a ``dispatch <type>`` span, from its round's start (the
intent's commit) to its send, linked to the submit. Whether tracing is on is asked once
per round; when it is off nothing else is done, and a task without a trace context
costs one test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar, Protocol

from chronoshard import tracing
from chronoshard.clock import Clock
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core import rounds
from chronoshard.scheduler.core.fairness import ReadyQueues, ReadyTask, TenantLimits
from chronoshard.scheduler.core.models import Priority, Task
from chronoshard.scheduler.core.quotas import HeldBy
from chronoshard.scheduler.core.runs import (
    Intent,
    IntentResult,
    PackedTimer,
    Release,
    TimerTask,
    epoch_us,
    packed_shard,
)
from chronoshard.scheduler.core.states import AttemptState
from chronoshard.scheduler.core.timing_wheel import TimingWheel
from chronoshard.scheduler.dispatch import faults
from chronoshard.scheduler.dispatch.faults import CrashPoint
from chronoshard.scheduler.dispatch.sessions import SessionRegistry, WorkerSession
from chronoshard.scheduler.errors import CommitOutcomeUnknown, StoreUnavailable
from chronoshard.scheduler.store.runs import RunStore

if TYPE_CHECKING:
    from chronoshard.scheduler.metrics import StatsSource

log = logging.getLogger(__name__)

TRACER = "chronoshard.scheduler"
"""The instrumentation scope of the node's spans."""
STORE_RETRY_S = 0.5
BACKLOG_REPORT_S = 1.0
"""Look at every session's backlog at least this often, changed or not."""
BACKLOG_COALESCE_S = 0.005
"""After a change, wait this long before reporting: a burst of changes (a dispatch round,
a wheel tick) becomes one report per session, not one per task."""
QUOTA_PROBE_S = 1.0
"""A tenant this node believes at its concurrency lets one task through this often, for
the cluster-wide check to judge: its attempts may have settled through other nodes."""
QUOTA_MIN_HOLD_S = 0.02
"""The shortest hold after the cluster-wide check refused a tenant for its rate."""
ROUNDS_IN_FLIGHT = 2
"""Dispatch rounds whose intents are written at once. With one, a credit that came back
while a round's transaction ran waited for it to commit before its round could even be
chosen, so a worker slot spent two rounds' commits idle per task (issue 14: ~5 ms each
under load, 10 tasks a round at 2 × 10 slots)."""


class ShardView(Protocol):
    """What the dispatcher needs to know of shard ownership (the shard manager)."""

    def epochs(self) -> Mapping[int, int]:
        """Owned shard -> its epoch."""
        ...

    def dispatch_allowed(self) -> bool:
        """False while the node is self-fenced (its etcd lease may have lapsed)."""
        ...

    def epochs_lost(self, shards: Iterable[int]) -> None:
        """A write found that another node owns these shards now."""
        ...

    def retry_due(self, shard: int, due_at: datetime) -> None:
        """A task of ``shard`` went to RETRYING, due at ``due_at``."""
        ...


class Dispatcher:
    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        config: SchedulerConfig,
        clock: Clock,
        runs: RunStore,
        sessions: SessionRegistry,
        shards: ShardView,
        tenant_limits: Callable[[uuid.UUID], TenantLimits],
        on_dispatched: Callable[[TimerTask, float], None] | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._runs = runs
        self._sessions = sessions
        self._shards = shards
        scheduling = config.scheduling
        self._lead_s = scheduling.lead_dispatch_s
        self._gathering = rounds.Gathering(scheduling.dispatch_gather_s)
        self._batch_max = scheduling.dispatch_batch_max
        # Keyed by the id's int (TimerTask.id_int), holding the timer packed into one int
        # (TimerTask.pack): a UUID object per timer was ~100 bytes, a TimerTask 112.
        self._wheel: TimingWheel[int, PackedTimer] = TimingWheel(
            clock.monotonic(), tick_s=scheduling.wheel_tick_s, slots=scheduling.wheel_slots
        )
        self._ready = ReadyQueues(
            policy=config.fairness.policy(),
            tenant_limits=tenant_limits,
            concurrency_probe_s=QUOTA_PROBE_S,
        )
        # Whose turn it is among worker sessions holding equal credits (issue 14).
        self._spread = rounds.Spread()
        # Chosen in the round being written: neither on the wheel nor ready meanwhile.
        self._in_round: set[uuid.UUID] = set()
        self._wake = asyncio.Event()
        # Set whenever the ready queues or the sessions changed: backlogs are reported.
        self._backlog_changed = asyncio.Event()
        # Told when a write's unknown outcome may have left PRELOADED rows unheld (the
        # node wires it to the preloader's resync).
        self.on_preloaded_unknown: Callable[[], None] | None = None
        self._on_dispatched = on_dispatched
        # Told of released tasks whose shard another node owns (the node's change router).
        self.on_remote_ready: Callable[[Sequence[TimerTask]], None] | None = None
        self._stats: dict[str, int] = {
            "dispatched": 0,
            "intent_batches": 0,
            "intent_rows_skipped": 0,
            "abandoned_undeliverable": 0,
            "store_errors": 0,
            "intents_read_back": 0,
            "adopted": 0,
            # Rounds in which the cluster-wide quota check refused a tenant's tasks.
            "quota_rate_holds": 0,
            "quota_concurrency_refusals": 0,
        }
        sessions.set_listener(self)

    # ---- what others tell the dispatcher --------------------------------------------------

    def schedule(self, timers: Iterable[TimerTask]) -> None:
        """Put PRELOADED tasks on the wheel, firing ``lead_dispatch_s`` before due.

        ``due_at`` becomes a monotonic deadline through the clock's ``now()``, which on a
        node is the cluster clock (``cluster/clock.py``): the host's wall clock would
        move every deadline by its own error, and a step of it by the step.
        """
        mono_now = self._clock.monotonic()
        wall_now_us = epoch_us(self._clock.now())
        added = False
        for timer in timers:
            # (due_at - now).total_seconds(), exactly, without building datetimes.
            delay_s = (timer.due_at_us - wall_now_us) / 1_000_000 - self._lead_s
            self._wheel.add(timer.id_int, mono_now + delay_s, timer.pack())
            added = True
        if added:
            self._wake.set()

    def adopt(self, timers: Iterable[TimerTask]) -> int:
        """Schedule the PRELOADED tasks read back that this node does not hold yet (not on
        the wheel, not ready, not in the round being written); how many."""
        missing = [
            t
            for t in timers
            if t.id_int not in self._wheel
            and (task_id := t.id) not in self._ready
            and task_id not in self._in_round
        ]
        self.schedule(missing)
        self._stats["adopted"] += len(missing)
        return len(missing)

    def preloaded_unknown(self) -> None:
        """A write that may have made tasks PRELOADED failed with its outcome unknown."""
        if self.on_preloaded_unknown is not None:
            self.on_preloaded_unknown()

    def forget(self, task_id: uuid.UUID) -> bool:
        """Take a task off the wheel or the ready queues (cancelled); whether it was here."""
        was_ready = self._ready.remove(task_id)
        if was_ready:
            self._backlog_changed.set()
        return self._wheel.cancel(task_id.int) | was_ready

    def drop_shards(self, shards: Iterable[int]) -> int:
        """Forget every task of shards this node no longer owns; how many were dropped.

        It looks at every task held (on the wheel or ready): ~75 ms per million held,
        paid on a shard release, which is rare; an index of the tasks by shard cost ~40
        bytes per pending task all the time (issue 14, target 7), and kept the ids of
        cancelled tasks until their shard was released.
        """
        gone = frozenset(shards)
        if not gone:
            return 0
        dropped = self._wheel.cancel_where(lambda packed: packed_shard(packed) in gone)
        ready = self._ready.remove_where(lambda task: _timer(task).shard in gone)
        if ready:
            self._backlog_changed.set()
        return dropped + ready

    def pending(self) -> int:
        return len(self._wheel) + len(self._ready)

    def ready_depths(self) -> dict[tuple[str, Priority, uuid.UUID], int]:
        """Ready tasks per (queue, class, tenant), for the metrics endpoint."""
        return self._ready.depths()

    def structures(self) -> dict[str, StatsSource]:
        """The timing wheel and the ready queues, for the metrics endpoint."""
        return {"wheel": self._wheel, "ready": self._ready}

    def sessions_changed(self) -> None:
        """A stream opened or closed: a new one hears its backlog at once."""
        self._backlog_changed.set()

    async def report_backlogs(self) -> None:
        """Tell each worker how much waits for it here whenever that changed, to guide
        its credits (docs/architecture.md#d7). A node whose tasks became ready while it
        holds no credit says so within milliseconds, and the worker moves credits to it;
        a report only every second left such tasks waiting that long, or for good while
        the worker's credits sat on nodes with no work."""
        changed = self._backlog_changed
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), BACKLOG_REPORT_S)
            await asyncio.sleep(BACKLOG_COALESCE_S)
            changed.clear()
            for session in self._sessions.live():
                ready = self._ready.waiting_for(session.queues, session.types)
                self._sessions.send_backlog(session, ready)

    # SessionListener and SettlementListener

    def credits_available(self) -> None:
        self._wake.set()

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None:
        owned = self._shards.epochs()
        self.schedule(t for t in tasks if t.shard in owned)
        elsewhere = [t for t in tasks if t.shard not in owned]
        if elsewhere and self.on_remote_ready is not None:
            # Released through this node, owned by another: its wheel must hear of them.
            self.on_remote_ready(elsewhere)

    def task_due(self, shard: int, due_at: datetime) -> None:
        self._shards.retry_due(shard, due_at)

    def task_ended(self, task: TimerTask) -> None:
        self._ready.task_finished(task.tenant_id, task.priority)
        self._wake.set()

    def task_left(self, task: TimerTask) -> None:
        """Its worker's stream closed unsettled: the slot left with the stream, but the
        attempt may still run, so it still counts for its tenant."""
        self._ready.task_left(task.priority)
        self._wake.set()

    def throttles(self) -> dict[tuple[uuid.UUID, HeldBy], int]:
        """Times each tenant's ready work was held back by its quotas, by which (metrics)."""
        return self._ready.throttles()

    def tenant_limits_changed(self, tenant_id: uuid.UUID) -> None:
        """The tenant's limits were changed: its parked tasks are looked at again, and
        its next round is checked against the new limits (not spent from an allowance
        granted under the old ones)."""
        self._ready.limits_changed(tenant_id)
        self._runs.limits_changed(tenant_id)
        self._wake.set()

    # ---- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        running: set[asyncio.Task[None]] = set()
        failed: list[BaseException] = []

        def ended(task: asyncio.Task[None]) -> None:
            running.discard(task)
            error = None if task.cancelled() else task.exception()
            if error is not None:
                failed.append(error)
            self._wake.set()

        try:
            while True:
                self._wake.clear()
                if failed:
                    raise failed[0]
                now = self._clock.monotonic()
                for entry in self._wheel.advance(self._gathering.horizon(now)):
                    self._push_ready(TimerTask.unpack(entry.key, entry.item), now)
                if len(running) < ROUNDS_IN_FLIGHT and self._shards.dispatch_allowed():
                    round_ = self._choose_round(now)
                    if round_ is not None:
                        task = asyncio.create_task(self._write_and_send(round_, now))
                        running.add(task)
                        task.add_done_callback(ended)
                        continue  # more credits or more ready work may be waiting
                await self._sleep(now)
        finally:
            # A round cut short here may leave committed intents unsent: their leases
            # expire and the reconciler dispatches them again, as when the node dies.
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _push_ready(self, timer: TimerTask, now: float) -> None:
        self._backlog_changed.set()
        self._ready.push(
            ReadyTask(
                id=timer.id,
                tenant_id=timer.tenant_id,
                priority=timer.priority,
                queue=timer.queue,
                type=timer.type,
                due_at_wall=timer.due_at_us / 1_000_000,  # due_at.timestamp(), exactly
                item=timer,
            ),
            now,
        )

    async def _sleep(self, now: float) -> None:
        """Sleep until woken or the next deadline. The deadline sets the wake-up event
        from a timer, rather than a timeout cancelling the wait: the loop sleeps until a
        wheel tick many times a second under a steady load, and a timeout's
        cancellation and exception were a seventh of the node's CPU (issue 14: steady
        5,000/s)."""
        if self._wake.is_set():
            return
        candidates = (
            self._gathering.wake_at(self._wheel.next_deadline()),
            self._ready.next_eligible_at(now),
        )
        wake_at = [t for t in candidates if t is not None]
        alarm = None
        if wake_at:
            delay = max(0.0, min(wake_at) - self._clock.monotonic())
            alarm = asyncio.get_running_loop().call_later(delay, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            if alarm is not None:
                alarm.cancel()

    def _choose_round(self, now: float) -> _Round | None:
        """Choose a round's tasks for the credits the sessions hold (the policy is
        :mod:`chronoshard.scheduler.core.rounds`); None when nothing can go."""
        if not len(self._ready):
            return None
        self._ready.set_capacity(self._sessions.total_slots())
        chosen = self._spread.choose(
            self._sessions.with_credit(), self._ready, self._batch_max, now
        )
        if not chosen:
            return None
        self._backlog_changed.set()
        ids = {r.id for _, r in chosen}
        self._in_round |= ids
        return _Round(chosen, ids, dict(self._shards.epochs()))

    async def _write_and_send(self, round_: _Round, now: float) -> None:
        """Write a chosen round's intents, send what they returned, give the rest back.
        Up to ``ROUNDS_IN_FLIGHT`` of these run at once: they hold disjoint tasks, and
        the intents are fenced per shard."""
        chosen = round_.chosen
        intents = [Intent(_timer(r), s.worker_id) for s, r in chosen]
        traced_since_ns = time.time_ns() if tracing.enabled() else None
        try:
            result = await self._commit_intents(round_.epochs, intents)
        finally:
            self._in_round -= round_.ids
        if result is None:  # nothing committed: try again shortly (holding this round's turn)
            rounds.put_back(chosen, self._ready, now)
            self._backlog_changed.set()
            await asyncio.sleep(STORE_RETRY_S)
            return
        self._stats["intent_batches"] += 1
        if result.dispatched:
            faults.reached(CrashPoint.AFTER_INTENT)  # fault injection (test builds)
        if result.lost_shards:
            self._shards.epochs_lost(result.lost_shards)
        written = rounds.match_written(chosen, result.dispatched)
        wall_now = self._clock.now()
        undeliverable = []
        for sent, (session, task, ready) in enumerate(written.to_send):
            if sent == len(written.to_send) // 2 > 0 and faults.armed(CrashPoint.INSIDE_BATCH):
                # Fault injection (test builds): half the batch is on its way, half not.
                await faults.crash_when(CrashPoint.INSIDE_BATCH, self._sessions.outboxes_empty)
            timer = _timer(ready)
            sent = self._sessions.send_assignment(session, task, timer, result.places.get(task.id))
            if sent:
                self._stats["dispatched"] += 1
                if self._on_dispatched is not None:
                    self._on_dispatched(timer, (wall_now - timer.due_at).total_seconds())
            else:
                undeliverable.append((task, timer))
            if traced_since_ns is not None and task.trace_context:
                self._trace_dispatch(task, session.worker_id, traced_since_ns, sent)
        self._stats["intent_rows_skipped"] += rounds.give_back(
            written.leftover, result.unwritten, self._ready, now
        )
        self._heard_quotas(result, now)
        if undeliverable:
            await self._abandon(undeliverable)

    def _heard_quotas(self, result: IntentResult, now: float) -> None:
        """What the cluster-wide check said of each tenant of the round (after the
        leftovers were given back: its count already includes what it admitted)."""
        for tenant_id, answer in result.quotas.items():
            self._ready.observe_in_flight(tenant_id, answer.in_flight, now)
            if answer.held_by is HeldBy.RATE:
                self._stats["quota_rate_holds"] += 1
                self._ready.hold(tenant_id, now + max(answer.wait_s, QUOTA_MIN_HOLD_S))
            elif answer.held_by is HeldBy.CONCURRENCY:
                self._stats["quota_concurrency_refusals"] += 1

    def _trace_dispatch(self, task: Task, worker_id: str, since_ns: int, sent: bool) -> None:
        """The span of one dispatched attempt (tracing is on and the task carries a trace
        context), linked to the submit's span: a dispatch may come days after it."""
        attributes: dict[str, str | bool | int | float] = {
            "messaging.system": tracing.MESSAGING_SYSTEM,
            "messaging.operation.name": "dispatch",
            "messaging.operation.type": "send",
            "messaging.destination.name": task.queue,
            "messaging.message.id": str(task.id),
            "chronoshard.task.type": task.type,
            "chronoshard.task.attempt": task.attempt,
            "chronoshard.fencing_token": task.fencing_token,
            "chronoshard.shard": task.shard,
            "chronoshard.tenant": str(task.tenant_id),
            "chronoshard.node": self._config.node_id,
            "chronoshard.worker.id": worker_id,
        }
        tracing.record_span(
            TRACER,
            f"dispatch {task.type}",
            tracing.PRODUCER,
            attributes,
            task.trace_context or {},
            start_time_ns=since_ns,
            outcome="sent" if sent else "undeliverable",
            # The intent was committed, the session closed before the send: it is
            # released at once (_abandon), and the next round dispatches it again.
            error_type=None if sent else "WorkerSessionGone",
        )

    async def _commit_intents(
        self, epochs: dict[int, int], intents: list[Intent]
    ) -> IntentResult | None:
        """Write the round's intents; None when nothing committed. An unknown commit
        outcome is read back, until PostgreSQL answers: nothing else can be dispatched
        meanwhile anyway, and a committed intent must be sent, never written again."""
        try:
            return await self._runs.write_intents(
                epochs, intents, self._config.workers.task_lease_s
            )
        except CommitOutcomeUnknown as exc:
            log.warning(
                "dispatch intent outcome unknown; reading it back",
                extra={"error": str(exc), "tasks": len(intents)},
            )
        except StoreUnavailable as exc:
            self._stats["store_errors"] += 1
            log.warning("dispatch intent failed; will retry", extra={"error": str(exc)})
            return None
        self._stats["store_errors"] += 1
        self._stats["intents_read_back"] += 1
        while True:
            try:
                return await self._runs.read_back_intents(epochs, intents)
            except StoreUnavailable as exc:
                log.info("intent read-back failed; retrying", extra={"error": str(exc)})
                await asyncio.sleep(STORE_RETRY_S)

    async def _abandon(self, tasks: list[tuple[Task, TimerTask]]) -> None:
        """Intents committed for a worker that vanished before the send: give them back."""
        releases = []
        for task, timer in tasks:
            releases.append(
                Release(timer.ref, task.fencing_token, None, AttemptState.ABANDONED, "worker gone")
            )
            self._ready.task_finished(timer.tenant_id, timer.priority)
        self._stats["abandoned_undeliverable"] += len(releases)
        try:
            _, ready = await self._runs.release(releases)
        except StoreUnavailable as exc:
            # The lease will expire and the reconciler will redispatch them; if the
            # release committed after all, they are PRELOADED and must be read back.
            log.warning("could not release undeliverable intents", extra={"error": str(exc)})
            if isinstance(exc, CommitOutcomeUnknown):
                self.preloaded_unknown()
            return
        self.tasks_ready_again(ready)

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)


@dataclass(frozen=True, slots=True)
class _Round:
    """A round's choices, taken out of the ready queues and the sessions' credits."""

    chosen: list[tuple[WorkerSession, ReadyTask]]
    ids: set[uuid.UUID]
    epochs: dict[int, int]
    """The owned shards' epochs when it was chosen: its intents are written under them."""


def _timer(ready: ReadyTask) -> TimerTask:
    item = ready.item
    assert isinstance(item, TimerTask)
    return item
