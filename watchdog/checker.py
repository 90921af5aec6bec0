"""One check: read, decide, act. The async shell around :mod:`.incidents`.

Each check, the active replica

1. reads every enabled expectation with its newest completion (one indexed query per
   batch, :meth:`~.store.WatchdogStore.job_statuses`) and the database's time, and every
   watched schedule with its due occurrence's inputs
   (:meth:`~.store.WatchdogStore.schedule_statuses`);
2. reads the recent canaries with what the scheduler's tables know of them, brings their
   rows up to date (dispatched, completed, LATE) and observes the end-to-end latency of
   each newly completed one;
3. reads the alerts on record (open ones, and resolves still owed);
4. asks :func:`~.incidents.plan` what to do, given the deliveries in flight;
5. records each decision in ``alerts`` first and only then hands the notification to the
   :class:`~.notifier.Notifier`, which records the delivery when a paging sink took it.

Writing before sending means a replica that dies in between leaves a record saying what
is owed (an alert never notified, a resolve never delivered), which the successor's
first check sends. The cost is at-least-once: a replica that dies after sending but
before recording the delivery makes its successor send it again; receivers can tell by
the alert id and event (PagerDuty by the dedup key).

Decisions are made on the database's clock, the clock that stamped the completions, so a
watchdog host whose clock drifts neither fires early nor stays silent.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from chronoshard.clock import Clock
from chronoshard.watchdog.canary import CanaryStats
from chronoshard.watchdog.config import WatchdogConfig
from chronoshard.watchdog.incidents import (
    Action,
    AlertRecord,
    CanaryStatus,
    Condition,
    Event,
    Kind,
    Notify,
    Open,
    Resolve,
    Severity,
    canary_condition,
    canary_status,
    job_condition,
    plan,
    schedule_condition,
    seconds_since,
)
from chronoshard.watchdog.notifier import Notifier
from chronoshard.watchdog.sinks import Notice
from chronoshard.watchdog.store import CanaryUpdate, WatchdogStore

log = logging.getLogger(__name__)

CHECKED_KINDS = (Kind.JOB_OVERDUE, Kind.SCHEDULE_MISSED, Kind.CANARY_LATE)
RESOLVE_HORIZON_S = 86_400.0
"""A resolve owed for longer than this is not sent any more."""
CANARY_HISTORY = 100
"""Canaries read per check: enough to find the newest decided one."""


@dataclass
class CheckStats:
    """What the last checks saw; read by the metrics collector and /healthz."""

    checks: int = 0
    failures: int = 0
    last_check_unix: float | None = None
    last_check_monotonic: float | None = None
    last_duration_s: float = 0.0
    expectations: int = 0
    overdue: int = 0
    # Schedules with watch and not paused, and those of them missing an occurrence.
    schedules: int = 0
    missed_schedules: int = 0
    open_alerts: int = 0
    opened: Counter[str] = field(default_factory=Counter)
    resolved: Counter[str] = field(default_factory=Counter)
    # (tenant_id, job_id) -> seconds since the last completion (or registration).
    seconds_since: dict[tuple[str, str], float] = field(default_factory=dict)

    def clear_gauges(self) -> None:
        """Forget what the checks saw (the replica stopped leading); counters stay."""
        self.expectations = self.overdue = self.open_alerts = 0
        self.schedules = self.missed_schedules = 0
        self.seconds_since = {}


class Checker:
    def __init__(
        self,
        config: WatchdogConfig,
        store: WatchdogStore,
        notifier: Notifier,
        clock: Clock,
        stats: CheckStats,
        canary_stats: CanaryStats,
        observe_canary_latency: Callable[[float], None],
    ) -> None:
        self._config = config
        self._store = store
        self._notifier = notifier
        self._clock = clock
        self.stats = stats
        self._canary_stats = canary_stats
        self._observe_latency = observe_canary_latency

    async def check(self) -> list[Action]:
        """Run one check; the actions it took. Raises DatabaseUnavailable."""
        started = self._clock.monotonic()
        db_now, statuses = await self._store.job_statuses(self._config.check_batch_size)
        if db_now is None:
            db_now = await self._store.now()
        firing: list[Condition] = []
        since: dict[tuple[str, str], float] = {}
        for status in statuses:
            exp = status.expectation
            since[(str(exp.tenant_id), exp.job_id)] = seconds_since(
                exp, status.last_completed_at, db_now
            )
            condition = job_condition(exp, status.last_completed_at, db_now)
            if condition is not None:
                firing.append(condition)
        overdue = len(firing)
        schedules = await self._store.schedule_statuses(self._config.check_batch_size)
        for sched in schedules:
            # Each batch's own now(): the instant its deadline probe used.
            condition = schedule_condition(
                sched.schedule,
                sched.next_at,
                () if sched.occurrence is None else (sched.occurrence,),
                sched.last_completed_at,
                sched.checked_at,
            )
            if condition is not None:
                firing.append(condition)
        missed = len(firing) - overdue
        if self._config.canary.enabled:
            canary = await self._check_canaries()
            if canary is not None:
                firing.append(canary)
        alerts = await self._store.alerts_to_plan(
            [str(k) for k in CHECKED_KINDS], RESOLVE_HORIZON_S
        )
        actions = plan(
            firing,
            alerts,
            now=db_now,
            renotify_interval_s=self._config.renotify_interval_s,
            busy=self._notifier.busy(),
        )
        watched = {s.expectation.dedup_key for s in statuses}
        watched |= {s.schedule.dedup_key for s in schedules}
        for action in actions:
            await self._apply(action, watched)

        open_keys = {a.dedup_key for a in alerts if a.is_open}
        open_keys |= {a.condition.dedup_key for a in actions if isinstance(a, Open)}
        open_keys -= {a.alert.dedup_key for a in actions if isinstance(a, Resolve)}
        stats = self.stats
        stats.checks += 1
        stats.last_check_unix = self._clock.now().timestamp()
        stats.last_check_monotonic = self._clock.monotonic()
        stats.last_duration_s = stats.last_check_monotonic - started
        stats.expectations = len(statuses)
        stats.overdue = overdue
        stats.schedules = len(schedules)
        stats.missed_schedules = missed
        stats.open_alerts = len(open_keys)
        stats.seconds_since = since
        return actions

    async def _check_canaries(self) -> Condition | None:
        config = self._config.canary
        horizon_s = config.tolerance_s + 10 * config.interval_s
        db_now, stored = await self._store.recent_canaries(horizon_s, CANARY_HISTORY)
        if db_now is None:
            return None
        updates: list[CanaryUpdate] = []
        for canary in stored:
            run = canary.run
            status = canary_status(run, db_now, config.tolerance_s)
            newly_completed = canary.stored_completed_at is None and run.completed_at is not None
            if newly_completed and run.completed_at is not None:
                latency_s = (run.completed_at - run.scheduled_at).total_seconds()
                self._observe_latency(latency_s)
                if status is CanaryStatus.COMPLETED:
                    self._canary_stats.completed_on_time += 1
            if status is CanaryStatus.LATE and canary.status is not CanaryStatus.LATE:
                self._canary_stats.late += 1
            if (
                status is not canary.status
                or newly_completed
                or (canary.stored_dispatched_at is None and run.dispatched_at is not None)
            ):
                updates.append(CanaryUpdate(run.id, status, run.dispatched_at, run.completed_at))
        await self._store.update_canaries(updates)
        return canary_condition(
            [c.run for c in stored], db_now, config.tolerance_s, Severity(config.severity)
        )

    async def _apply(self, action: Action, watched: set[str]) -> None:
        if isinstance(action, Open):
            alert = await self._store.open_alert(action.condition)
            if alert is None:  # someone else opened it first: their record, their trigger
                return
            self.stats.opened[alert.kind] += 1
            log.info(
                "alert opened",
                extra={"alert_id": alert.id, "dedup_key": alert.dedup_key, "kind": alert.kind},
            )
            self._send(alert, Event.TRIGGER)
        elif isinstance(action, Resolve):
            resolved = await self._store.resolve_alert(
                _db_id(action.alert), self._resolution(action.alert, watched)
            )
            if resolved is None:
                return
            self.stats.resolved[resolved.kind] += 1
            log.info(
                "alert resolved",
                extra={"alert_id": resolved.id, "dedup_key": resolved.dedup_key},
            )
            self._send(resolved, Event.RESOLVE)
        elif isinstance(action, Notify):
            self._send(action.alert, action.event)

    def _resolution(self, alert: AlertRecord, watched: set[str]) -> str:
        if alert.kind == Kind.JOB_OVERDUE:
            if alert.dedup_key in watched:
                return "a completion arrived"
            return "the expectation was removed or disabled"
        if alert.kind == Kind.SCHEDULE_MISSED:
            if alert.dedup_key in watched:
                return "an occurrence completed"
            return "the schedule was paused, unwatched or deleted"
        if alert.kind == Kind.CANARY_LATE and not self._config.canary.enabled:
            return "canaries are disabled"
        return "a canary completed on time"

    def _send(self, alert: AlertRecord, event: Event) -> None:
        notice = Notice(event, alert, self._config.node_id, self._clock.now())
        alert_id = alert.id

        async def record(_: Notice) -> None:
            if alert_id is not None:
                await self._store.mark_notified(alert_id, event)

        self._notifier.submit(notice, record)


def last_check_age_s(stats: CheckStats, now_monotonic: float) -> float | None:
    if stats.last_check_monotonic is None:
        return None
    return now_monotonic - stats.last_check_monotonic


def _db_id(alert: AlertRecord) -> int:
    if alert.id is None:  # only the in-memory outage alert has none, never checked here
        raise ValueError(f"alert {alert.dedup_key} was never recorded")
    return alert.id
