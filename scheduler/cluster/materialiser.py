"""The materialiser: the owned shards' schedules become occurrence tasks, ahead of time.

Every ``schedules.interval_s`` (and at once when woken: a schedule of an owned shard
created, updated or resumed here, a shard claimed), one transaction takes the fence on
the owned shards, locks their schedules whose ``materialise_at`` has come (``FOR UPDATE
SKIP LOCKED``, at most ``schedules.batch``), decides each one's step
(:func:`~chronoshard.scheduler.core.schedules.step`: pure) and writes the occurrences,
their tasks and the schedules' new instants (:meth:`.store.schedules.ScheduleStore.advance`).
Only the owner of a schedule's shard does this, under that shard's epoch; the occurrence
key ``(schedule_id, logical_date)`` makes any second write of an occurrence a no-op, so
a handoff, a crash or a retried commit creates none twice. A crash loses none either:
the occurrences are created ``lookahead_s`` ahead, longer than a shard takes to move,
and the new owner goes on from the schedule's cursor.

The tasks created are handed to the change router (``on_created``) like submits, so
their own shards' owners preload them. The task of an occurrence is built by the
callable the node passes in (``build_task``: the template through the submit's own
validation, ``api.schedule_requests.occurrence_task``); a template that no longer
passes (the node's limits were lowered since) leaves its schedule where it is, logged,
and retried a minute later: the watchdog sees its ``next_at`` go by, so nothing goes
silently missing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import ClassVar, Protocol

from chronoshard.clock import Clock
from chronoshard.events import wait_event
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.models import PreparedTask, Task
from chronoshard.scheduler.core.recurrence import Recurrence
from chronoshard.scheduler.core.schedules import Pacing, Schedule, rule_of, step
from chronoshard.scheduler.errors import InvalidArgument, StoreUnavailable
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.schedules import DueSchedule, ScheduleStore, Written
from chronoshard.scheduler.store.workflows import NewRun

log = logging.getLogger(__name__)

RETRY_BROKEN_TEMPLATE = timedelta(seconds=60)
_RULE_CACHE_LIMIT = 100_000

BuildTask = Callable[[Schedule, datetime, datetime, datetime], PreparedTask | NewRun]
"""``(schedule, logical_date, scheduled_at, now)`` -> the occurrence's task, or its
workflow run."""


class OwnedShards(Protocol):
    def epochs(self) -> Mapping[int, int]: ...
    def owns(self, shard: int) -> bool: ...
    def dispatch_allowed(self) -> bool: ...
    def epochs_lost(self, shards: Iterable[int]) -> None: ...


class Materialiser:
    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        config: SchedulerConfig,
        clock: Clock,
        store: Store,
        schedules: ScheduleStore,
        shards: OwnedShards,
        pacing: Pacing,
        build_task: BuildTask,
        on_created: Callable[[Sequence[Task]], None],
    ) -> None:
        self._interval_s = config.schedules.interval_s
        self._batch = config.schedules.batch
        self._clock = clock
        self._store = store
        self._schedules = schedules
        self._shards = shards
        self._pacing = pacing
        self._build_task = build_task
        self._on_created = on_created
        self._wake = asyncio.Event()
        # Building a cron rule parses the expression (~40 us): one per schedule version.
        self._rules: dict[tuple[uuid.UUID, datetime], Recurrence] = {}
        self._stats: dict[str, int] = {
            "passes": 0,
            "schedules_stepped": 0,
            "occurrences_created": 0,
            "occurrences_skipped": 0,
            "occurrences_missed": 0,
            "broken_templates": 0,
            "store_errors": 0,
        }

    def wake(self) -> None:
        self._wake.set()

    def schedule_changed(self, schedule: Schedule) -> None:
        """``schedule`` changed here: look now if it is ours and due before the next
        pass. Only then: 10,000 creates woke 1,500 passes that found nothing to do."""
        at = schedule.materialise_at
        if at is None or schedule.paused or not self._shards.owns(schedule.shard):
            return
        if at <= self._clock.now() + timedelta(seconds=self._interval_s):
            self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            if await self.pass_once():
                continue  # a whole batch was due: more may be waiting
            await wait_event(self._wake, self._interval_s)

    async def pass_once(self) -> bool:
        """One pass; True when it took a whole batch."""
        epochs = dict(self._shards.epochs())
        if not epochs or not self._shards.dispatch_allowed():
            return False
        self._stats["passes"] += 1
        now = self._clock.now()
        try:
            async with self._store.transaction() as conn:
                due, lost = await self._schedules.due(conn, epochs, now, self._batch)
                steps = [self._written(d, now) for d in due]
                created = await self._schedules.advance(conn, steps) if steps else []
        except StoreUnavailable as exc:
            # Lost or failed, the pass is simply run again: the occurrence key and the
            # row lock make a second write of anything that did commit a no-op.
            self._stats["store_errors"] += 1
            log.warning("materialise pass failed; retrying next pass", extra={"error": str(exc)})
            return False
        if lost:
            self._shards.epochs_lost(lost)
        self._stats["schedules_stepped"] += len(steps)
        self._stats["occurrences_created"] += len(created)
        if created:
            self._on_created(created)
        return len(due) == self._batch

    def _written(self, due: DueSchedule, now: datetime) -> Written:
        schedule = due.schedule
        decided = step(
            schedule, self._rule(schedule, now), now, self._pacing,
            previous_running=due.previous_running,
        )  # fmt: skip
        try:
            occurrences = [
                (
                    o.logical_date,
                    o.origin,
                    self._build_task(schedule, o.logical_date, o.scheduled_at, now)
                    if o.run
                    else None,
                )
                for o in decided.occurrences
            ]
        except InvalidArgument as exc:
            self._stats["broken_templates"] += 1
            log.error(
                "schedule template no longer valid; occurrence not created",
                extra={
                    "schedule_id": str(schedule.id),
                    "tenant": str(schedule.tenant_id),
                    "shard": schedule.shard,
                    "error": str(exc),
                },
            )
            return Written(
                schedule.id, schedule.tenant_id, (), schedule.cursor_at, schedule.next_at,
                now + RETRY_BROKEN_TEMPLATE, schedule.buffered_at,
            )  # fmt: skip
        skipped = sum(1 for o in decided.occurrences if not o.run)
        self._stats["occurrences_skipped"] += skipped
        if decided.missed:
            self._stats["occurrences_missed"] += decided.missed
            log.warning(
                "occurrences missed while no node materialised them; not run (catchup policy)",
                extra={
                    "schedule_id": str(schedule.id),
                    "tenant": str(schedule.tenant_id),
                    "shard": schedule.shard,
                    "missed": decided.missed,
                    "catchup": str(schedule.spec.catchup),
                },
            )
        return Written(
            schedule.id,
            schedule.tenant_id,
            occurrences,
            decided.cursor_at,
            decided.next_at,
            decided.materialise_at,
            decided.buffered_at,
        )

    def _rule(self, schedule: Schedule, now: datetime) -> Recurrence:
        key = (schedule.id, schedule.updated_at)
        rule = self._rules.get(key)
        if rule is None:
            if len(self._rules) >= _RULE_CACHE_LIMIT:
                self._rules.clear()
            rule = self._rules[key] = rule_of(schedule.spec, schedule.anchor_at, now)
        return rule

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
