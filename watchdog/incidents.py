"""The watchdog's decisions, without I/O: what is wrong now, and what to do about alerts.

Four things can be wrong. A watched job is **overdue** when its newest completion is
older than ``interval + tolerance`` (strictly: ``now − last_completed > interval +
tolerance``); a job that never completed counts from when its expectation was
registered. A watched **schedule missed** an occurrence when the newest occurrence
whose deadline (logical date + expected duration + tolerance) has passed is not
satisfied: neither its own task nor any run of the schedule's job since its logical
date completed (:func:`schedule_condition`). A **canary is late** when the newest
canary whose outcome is known did not complete within its tolerance of its scheduled
time. The watchdog's own **database is unreachable** when no statement succeeded for
longer than the outage tolerance. Each is a :class:`Condition` with a stable
``dedup_key``.

:func:`plan` turns the conditions firing now and the alerts on record into actions, one
incident at a time: a firing condition without an open alert is opened (once: at most one
open alert per key); an open alert whose first notification never went out is notified
again until it does; an open alert is re-notified every ``renotify_interval_s``; an open
alert whose condition stopped firing is resolved, and a resolve that was recorded but not
delivered is delivered. A key with a delivery in flight is left alone for this round, and
a key whose previous resolve is still undelivered is not reopened until it is, so a
receiver always sees trigger → (renotify…) → resolve in that order for each incident.

Everything takes ``now`` as an argument (the database's clock in production, so that it
agrees with the completion times) and returns values; the async shell does the I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    """PagerDuty's four severities, which are also the values the database stores."""

    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Event(StrEnum):
    """What a notification says about its alert."""

    TRIGGER = "trigger"
    RENOTIFY = "renotify"
    RESOLVE = "resolve"


class Kind(StrEnum):
    JOB_OVERDUE = "job_overdue"
    SCHEDULE_MISSED = "schedule_missed"
    CANARY_LATE = "canary_late"
    DATABASE_UNREACHABLE = "watchdog_database_unreachable"


CANARY_DEDUP_KEY = "chronoshard/canary"
DATABASE_DEDUP_KEY = "chronoshard/watchdog-database"


def job_dedup_key(tenant_id: uuid.UUID, job_id: str) -> str:
    """Stable per (tenant, job): the same key for every incident of the job, which is what
    PagerDuty's dedup_key wants (a resolved key opens a new incident when reused)."""
    return f"chronoshard/job/{tenant_id}/{job_id}"


def schedule_dedup_key(schedule_id: uuid.UUID) -> str:
    """Stable per schedule (its id, not its name: a name can be reused by a new schedule
    after a delete, which must not inherit the old one's incident)."""
    return f"chronoshard/schedule/{schedule_id}"


# --- what is wrong ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """Something wrong right now, identified by ``dedup_key``."""

    kind: Kind
    dedup_key: str
    severity: Severity
    summary: str
    tenant_id: uuid.UUID | None = None
    job_id: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Expectation:
    """A watched job: it should complete at least every ``interval_s``."""

    tenant_id: uuid.UUID
    job_id: str
    interval_s: float
    tolerance_s: float
    registered_at: datetime
    severity: Severity = Severity.CRITICAL
    description: str = ""
    tenant_name: str = ""

    @property
    def allowed_gap_s(self) -> float:
        return self.interval_s + self.tolerance_s

    @property
    def dedup_key(self) -> str:
        return job_dedup_key(self.tenant_id, self.job_id)


def seconds_since(exp: Expectation, last_completed_at: datetime | None, now: datetime) -> float:
    """Seconds since the job last completed, or since registration if it never did."""
    base = exp.registered_at if last_completed_at is None else last_completed_at
    return (now - base).total_seconds()


def overdue_after(exp: Expectation, last_completed_at: datetime | None) -> datetime:
    """The instant after which the job is overdue if nothing completes before."""
    base = exp.registered_at if last_completed_at is None else last_completed_at
    return base + timedelta(seconds=exp.allowed_gap_s)


def is_overdue(exp: Expectation, last_completed_at: datetime | None, now: datetime) -> bool:
    """``now − last_completed > interval + tolerance``, compared as instants (timestamps
    have microsecond resolution; comparing float seconds could disagree with
    :func:`overdue_after` in the last microsecond)."""
    return now > overdue_after(exp, last_completed_at)


def job_condition(
    exp: Expectation, last_completed_at: datetime | None, now: datetime
) -> Condition | None:
    """The overdue condition of ``exp`` at ``now``, or None while it is on time."""
    if not is_overdue(exp, last_completed_at, now):
        return None
    silent_s = seconds_since(exp, last_completed_at, now)
    tenant = exp.tenant_name or str(exp.tenant_id)
    since = (
        "never completed" if last_completed_at is None else f"no completion for {silent_s:.0f} s"
    )
    return Condition(
        kind=Kind.JOB_OVERDUE,
        dedup_key=exp.dedup_key,
        severity=exp.severity,
        summary=(
            f"job {exp.job_id!r} of tenant {tenant} is overdue: {since} "
            f"(expected every {exp.interval_s:g} s + {exp.tolerance_s:g} s tolerance)"
        ),
        tenant_id=exp.tenant_id,
        job_id=exp.job_id,
        details={
            "tenant_name": exp.tenant_name,
            "interval_s": exp.interval_s,
            "tolerance_s": exp.tolerance_s,
            "last_completed_at": None if last_completed_at is None else last_completed_at,
            "registered_at": exp.registered_at,
            "overdue_since": overdue_after(exp, last_completed_at),
            "description": exp.description,
        },
    )


# --- schedules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A watched schedule (``watch AND NOT paused``): every occurrence must complete by
    its logical date + ``expected_duration_s`` + ``tolerance_s``."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    job_id: str
    expected_duration_s: float
    tolerance_s: float
    severity: Severity = Severity.CRITICAL
    tenant_name: str = ""

    @property
    def slack_s(self) -> float:
        """How long after its logical date an occurrence may take to complete."""
        return self.expected_duration_s + self.tolerance_s

    @property
    def dedup_key(self) -> str:
        return schedule_dedup_key(self.id)

    def deadline(self, logical_date: datetime) -> datetime:
        return logical_date + timedelta(seconds=self.slack_s)


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of a schedule, as the watchdog sees it.

    ``created`` is False for ``schedules.next_at``: an occurrence whose time came and
    that no scheduler node created (the materialiser is not running). ``task_id`` is None
    for one created without a task (the overlap policy skipped it) and for one never
    created; ``completed_at`` is its own task's completion, if any."""

    logical_date: datetime
    created: bool = True
    task_id: uuid.UUID | None = None
    completed_at: datetime | None = None


def deadline_passed(schedule: Schedule, logical_date: datetime, now: datetime) -> bool:
    """``logical_date + slack <= now``: at the deadline itself the occurrence is due (the
    same ``<=`` as the query's probe, so the two never disagree about one instant)."""
    return schedule.deadline(logical_date) <= now


def due_occurrence(
    schedule: Schedule,
    next_at: datetime | None,
    created: Iterable[Occurrence],
    now: datetime,
) -> Occurrence | None:
    """The latest occurrence whose deadline has passed, or None (nothing to watch yet).

    ``next_at`` is the first occurrence not yet created, so when its own deadline has
    passed it is later than every created one, and it is the due occurrence: the
    schedule missed it whatever became of the earlier ones. Otherwise the newest created
    occurrence past its deadline is. Every occurrence has its own deadline, so an
    irregular cron (weekdays only, the last day of a month) needs no interval.
    """
    if next_at is not None and deadline_passed(schedule, next_at, now):
        return Occurrence(logical_date=next_at, created=False)
    past = [o for o in created if deadline_passed(schedule, o.logical_date, now)]
    if not past:
        return None
    return max(past, key=lambda o: o.logical_date)


def occurrence_satisfied(occurrence: Occurrence, last_completed_at: datetime | None) -> bool:
    """Its own task completed, or some run of the schedule's job completed at or after its
    logical date (a later occurrence, a trigger, or the run that an overlap-skipped
    occurrence waited for: that run's work covers the occurrence). The job's completions
    are the tenant's ``(tenant_id, job_id)`` ledger rows; ``last_completed_at`` is the
    newest of them."""
    if occurrence.completed_at is not None:
        return True
    return last_completed_at is not None and last_completed_at >= occurrence.logical_date


def schedule_condition(
    schedule: Schedule,
    next_at: datetime | None,
    created: Iterable[Occurrence],
    last_completed_at: datetime | None,
    now: datetime,
) -> Condition | None:
    """The missed condition of ``schedule`` at ``now``, or None while it is on time.

    The condition's key is the schedule's, whichever occurrence is due: while an
    incident lasts, later occurrences that miss too keep the one alert open (its summary
    names the first one missed), and the first run that completes ends it."""
    due = due_occurrence(schedule, next_at, created, now)
    if due is None or occurrence_satisfied(due, last_completed_at):
        return None
    tenant = schedule.tenant_name or str(schedule.tenant_id)
    # In UTC whatever the session's time zone: the summary is read by people in many.
    logical_date = due.logical_date.astimezone(UTC)
    deadline = schedule.deadline(logical_date)
    if not due.created:
        why = "no scheduler node created it (are the scheduler nodes running?)"
    elif due.task_id is None:
        why = "the overlap policy skipped it and the run before it has not completed"
    else:
        why = f"its task {due.task_id} has not completed"
    return Condition(
        kind=Kind.SCHEDULE_MISSED,
        dedup_key=schedule.dedup_key,
        severity=schedule.severity,
        summary=(
            f"schedule {schedule.name!r} of tenant {tenant} missed its run of "
            f"{logical_date.isoformat()}: nothing completed by its deadline "
            f"{deadline.isoformat()} (expected duration {schedule.expected_duration_s:g} s "
            f"+ {schedule.tolerance_s:g} s tolerance); {why}"
        ),
        tenant_id=schedule.tenant_id,
        job_id=schedule.job_id,
        details={
            "schedule_id": str(schedule.id),
            "schedule_name": schedule.name,
            "tenant_name": schedule.tenant_name,
            "job_id": schedule.job_id,
            "logical_date": logical_date,
            "deadline": deadline,
            "expected_duration_s": schedule.expected_duration_s,
            "tolerance_s": schedule.tolerance_s,
            "occurrence_created": due.created,
            "task_id": None if due.task_id is None else str(due.task_id),
            "last_completed_at": last_completed_at,
        },
    )


# --- canaries --------------------------------------------------------------------------------


class CanaryStatus(StrEnum):
    """``canary_executions.status``."""

    SUBMITTED = "SUBMITTED"
    DISPATCHED = "DISPATCHED"
    COMPLETED = "COMPLETED"
    LATE = "LATE"
    FAILED = "FAILED"


class CanaryOutcome(StrEnum):
    PENDING = "pending"
    ON_TIME = "on_time"
    LATE = "late"


@dataclass(frozen=True)
class CanaryRun:
    """One canary: when it should run and what has been seen of it so far."""

    id: uuid.UUID
    scheduled_at: datetime
    dispatched_at: datetime | None = None
    completed_at: datetime | None = None
    # The submit itself failed: nothing will ever complete it.
    submit_failed: bool = False


def canary_outcome(run: CanaryRun, now: datetime, tolerance_s: float) -> CanaryOutcome:
    """On time if it completed within ``tolerance_s`` of its scheduled time; late once that
    has passed without it; pending until one of the two is known."""
    deadline = run.scheduled_at + timedelta(seconds=tolerance_s)
    if run.completed_at is not None and run.completed_at <= deadline:
        return CanaryOutcome.ON_TIME
    if now > deadline:
        return CanaryOutcome.LATE
    return CanaryOutcome.PENDING


def canary_status(run: CanaryRun, now: datetime, tolerance_s: float) -> CanaryStatus:
    """What the run's row should say. A failed submit stays FAILED (more telling than
    LATE); a canary that completed after its deadline stays LATE."""
    outcome = canary_outcome(run, now, tolerance_s)
    if outcome is CanaryOutcome.ON_TIME:
        return CanaryStatus.COMPLETED
    if run.submit_failed:
        return CanaryStatus.FAILED
    if outcome is CanaryOutcome.LATE:
        return CanaryStatus.LATE
    return CanaryStatus.DISPATCHED if run.dispatched_at is not None else CanaryStatus.SUBMITTED


def canary_condition(
    runs: Sequence[CanaryRun],
    now: datetime,
    tolerance_s: float,
    severity: Severity = Severity.CRITICAL,
) -> Condition | None:
    """Firing while the newest canary with a known outcome was late.

    Only the newest decided canary counts: a canary lost in an outage that later canaries
    outlived is history (counted in metrics), not an open incident; and a run of late
    canaries keeps the alert open until one completes on time.
    """
    decided = [
        (run, outcome)
        for run in runs
        if (outcome := canary_outcome(run, now, tolerance_s)) is not CanaryOutcome.PENDING
    ]
    if not decided:
        return None
    newest, outcome = max(decided, key=lambda pair: pair[0].scheduled_at)
    if outcome is CanaryOutcome.ON_TIME:
        return None
    late = sum(1 for _, o in decided if o is CanaryOutcome.LATE)
    what = "could not be submitted" if newest.submit_failed else "did not complete"
    return Condition(
        kind=Kind.CANARY_LATE,
        dedup_key=CANARY_DEDUP_KEY,
        severity=severity,
        summary=(
            f"canary task {what} within {tolerance_s:g} s: tasks may not be running "
            "(scheduler, workers' path or database)"
        ),
        details={
            "canary_id": str(newest.id),
            "scheduled_at": newest.scheduled_at,
            "dispatched_at": newest.dispatched_at,
            "completed_at": newest.completed_at,
            "tolerance_s": tolerance_s,
            "late_canaries_recent": late,
        },
    )


# --- the watchdog's own database ---------------------------------------------------------------


def outage_condition(
    seconds_without_database: float, tolerance_s: float, node_id: str
) -> Condition | None:
    """Firing once the watchdog went longer than ``tolerance_s`` without a successful
    statement: silence must never look like health (docs/architecture.md#d10)."""
    if seconds_without_database <= tolerance_s:
        return None
    return Condition(
        kind=Kind.DATABASE_UNREACHABLE,
        dedup_key=DATABASE_DEDUP_KEY,
        severity=Severity.CRITICAL,
        summary=(
            f"watchdog {node_id} cannot reach its database for {seconds_without_database:.0f} s: "
            "overdue jobs and late canaries cannot be detected"
        ),
        details={"node_id": node_id, "tolerance_s": tolerance_s},
    )


# --- alerts and what to do about them ------------------------------------------------------------


@dataclass(frozen=True)
class AlertRecord:
    """An alert as recorded (a row of ``alerts``; ``id`` None for in-memory ones)."""

    id: int | None
    kind: str
    dedup_key: str
    severity: Severity
    summary: str
    opened_at: datetime
    tenant_id: uuid.UUID | None = None
    job_id: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    resolved_at: datetime | None = None
    # The last trigger or re-notification delivered; None: the trigger is still owed.
    last_notified_at: datetime | None = None
    # When the resolve was delivered; None on a resolved alert: the resolve is owed.
    resolve_notified_at: datetime | None = None
    notifications: int = 0

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


@dataclass(frozen=True)
class Open:
    """Record a new alert for ``condition`` and send its trigger."""

    condition: Condition


@dataclass(frozen=True)
class Notify:
    """Send ``event`` for an alert already recorded (a retried trigger, a re-notification,
    or a resolve that was recorded but not delivered)."""

    alert: AlertRecord
    event: Event


@dataclass(frozen=True)
class Resolve:
    """Record that ``alert`` is over and send its resolve."""

    alert: AlertRecord


Action = Open | Notify | Resolve


def plan(
    firing: Iterable[Condition],
    alerts: Iterable[AlertRecord],
    *,
    now: datetime,
    renotify_interval_s: float,
    busy: AbstractSet[str] = frozenset(),
) -> list[Action]:
    """The actions that bring the recorded alerts in line with what is firing at ``now``.

    ``alerts`` are the open alerts of the kinds the conditions were evaluated for, plus
    resolved ones whose resolve is still owed. ``busy`` holds dedup keys with a delivery in
    flight: nothing is decided for them this round. ``renotify_interval_s`` 0 disables
    re-notification.
    """
    conditions: dict[str, Condition] = {}
    for condition in firing:
        conditions.setdefault(condition.dedup_key, condition)
    actions: list[Action] = []
    open_alerts: dict[str, AlertRecord] = {}
    owed_resolve: set[str] = set()
    for alert in alerts:
        if alert.is_open:
            open_alerts.setdefault(alert.dedup_key, alert)
        elif alert.resolve_notified_at is None:
            owed_resolve.add(alert.dedup_key)
            if alert.dedup_key not in busy:
                actions.append(Notify(alert, Event.RESOLVE))
    for key, alert in open_alerts.items():
        if key in busy:
            continue
        if key not in conditions:
            actions.append(Resolve(alert))
        elif alert.last_notified_at is None:
            actions.append(Notify(alert, Event.TRIGGER))
        elif renotify_interval_s > 0 and (
            (now - alert.last_notified_at).total_seconds() >= renotify_interval_s
        ):
            actions.append(Notify(alert, Event.RENOTIFY))
    for key, condition in conditions.items():
        if key in open_alerts or key in busy or key in owed_resolve:
            continue
        actions.append(Open(condition))
    return actions


class MemoryAlerts:
    """Alert records kept in memory: for conditions that cannot be recorded in the
    database (the database being unreachable) and for tests. Pure: times passed in."""

    def __init__(self) -> None:
        self._records: list[AlertRecord] = []

    def records(self) -> list[AlertRecord]:
        """Open alerts and resolved ones whose resolve is owed (what :func:`plan` reads)."""
        return [a for a in self._records if a.is_open or a.resolve_notified_at is None]

    def history(self) -> list[AlertRecord]:
        return list(self._records)

    def open(self, condition: Condition, now: datetime) -> AlertRecord:
        if any(a.is_open and a.dedup_key == condition.dedup_key for a in self._records):
            raise ValueError(f"an alert for {condition.dedup_key} is already open")
        alert = AlertRecord(
            id=None,
            kind=condition.kind,
            dedup_key=condition.dedup_key,
            severity=condition.severity,
            summary=condition.summary,
            opened_at=now,
            tenant_id=condition.tenant_id,
            job_id=condition.job_id,
            details=condition.details,
        )
        self._records.append(alert)
        return alert

    def resolve(self, alert: AlertRecord, now: datetime) -> AlertRecord:
        return self._replace(alert, resolved_at=now)

    def notified(self, alert: AlertRecord, event: Event, now: datetime) -> AlertRecord:
        if event is Event.RESOLVE:
            return self._replace(
                alert, resolve_notified_at=now, notifications=alert.notifications + 1
            )
        return self._replace(alert, last_notified_at=now, notifications=alert.notifications + 1)

    def _replace(self, alert: AlertRecord, **changes: Any) -> AlertRecord:
        for i, record in enumerate(self._records):
            if record.dedup_key == alert.dedup_key and record.opened_at == alert.opened_at:
                updated = replace(record, **changes)
                self._records[i] = updated
                return updated
        raise KeyError(f"no alert {alert.dedup_key} opened at {alert.opened_at}")
