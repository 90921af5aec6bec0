"""Schedules: what one is, and what the materialiser does with it at one instant. Pure.

A schedule's rule (:mod:`.recurrence`) names its occurrences; the materialiser, on the
owner of the schedule's shard, decides them in order and records every decision on the
schedule row: ``cursor_at`` (every occurrence at or before it is decided), ``next_at``
(the first one after it, which the watchdog reads), ``materialise_at`` (when to look
again) and, under ``BUFFER_ONE``, the occurrence held back. :func:`step` is that
decision for one schedule at ``now``, given whether its newest occurrence task still
runs; the store applies it in one transaction under the shard's epoch, and the
occurrence key ``(schedule_id, logical_date)`` is a primary key, so a step applied twice
(a lost commit retried, two nodes in a handoff) creates nothing twice.

Overlap: under ``ALLOW`` occurrences are created ``lookahead`` ahead, as many as fall in
it. ``SKIP`` and ``BUFFER_ONE`` must know whether the previous occurrence still runs, so
they decide one occurrence at a time, ``overlap_lead`` before it is due (the decision
is made then, not at the instant itself); an explicit trigger or backfill is not subject
to them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.recurrence import Catchup, Cron, Interval, Recurrence, plan

MAX_PAST = timedelta(days=7)
"""An occurrence older than this runs with ``scheduled_at`` = now: a task may not lie
further back (task_requests.MAX_PAST_S: the partition may be gone); its logical date
keeps the occurrence's instant."""


class Overlap(StrEnum):
    ALLOW = "ALLOW"
    SKIP = "SKIP"
    BUFFER_ONE = "BUFFER_ONE"


class Origin(StrEnum):
    """How an occurrence came to run (``schedule_occurrences.origin``)."""

    SCHEDULE = "SCHEDULE"
    CATCHUP = "CATCHUP"
    TRIGGER = "TRIGGER"
    BACKFILL = "BACKFILL"
    BUFFERED = "BUFFERED"


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a client sets, validated (``api.schedule_requests``)."""

    name: str
    cron: str | None
    interval_s: float | None
    timezone: str
    start_at: datetime | None
    end_at: datetime | None
    template: bytes
    """What every occurrence creates, serialised: a ``SubmitTaskRequest``, or a
    ``CreateWorkflowRequest`` when :attr:`creates_workflow`."""
    catchup: Catchup
    catchup_limit: int
    misfire_grace_s: float
    overlap: Overlap
    job_id: str
    watch: bool
    expected_duration_s: float
    tolerance_s: float
    severity: str
    creates_workflow: bool = False
    """Each occurrence creates a workflow run (docs/architecture.md#d9), not one task."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """One row of ``schedules``."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    shard: int
    spec: ScheduleSpec
    anchor_at: datetime
    paused: bool
    cursor_at: datetime
    next_at: datetime | None
    materialise_at: datetime | None
    buffered_at: datetime | None
    last_task: TaskRef | None
    created_at: datetime
    updated_at: datetime


def rule_of(spec: ScheduleSpec, anchor_at: datetime, now: datetime) -> Recurrence:
    """The recurrence ``spec`` names (a validated spec: the rule is known to be good)."""
    if spec.cron is not None:
        return Cron(spec.cron, spec.timezone, now=now)
    assert spec.interval_s is not None
    return Interval(anchor_at, timedelta(seconds=spec.interval_s))


def next_within(rule: Recurrence, after: datetime, end_at: datetime | None) -> datetime | None:
    """The rule's first occurrence after ``after``, or None past ``end_at``."""
    at = rule.next_after(after)
    if at is None or (end_at is not None and at > end_at):
        return None
    return at


def upcoming(
    rule: Recurrence, after: datetime, end_at: datetime | None, count: int
) -> list[datetime]:
    """The next ``count`` occurrences after ``after`` (fewer once the schedule ends)."""
    found: list[datetime] = []
    at = after
    while len(found) < count:
        nxt = next_within(rule, at, end_at)
        if nxt is None:
            break
        found.append(nxt)
        at = nxt
    return found


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One decided occurrence: run (a task at ``scheduled_at``) or, ``run`` False,
    skipped by the overlap policy (recorded, no task)."""

    logical_date: datetime
    scheduled_at: datetime
    origin: Origin
    run: bool = True


@dataclass(frozen=True, slots=True)
class Step:
    """What the materialiser writes for one schedule: the occurrences decided and the
    schedule's new instants."""

    occurrences: tuple[Occurrence, ...]
    cursor_at: datetime
    next_at: datetime | None
    materialise_at: datetime | None
    buffered_at: datetime | None
    missed: int
    """Occurrences missed and not run (catchup ``SKIP``/``LATEST``/the bound of ``ALL``)."""


@dataclass(frozen=True, slots=True)
class Pacing:
    """How far ahead the materialiser works (``[schedules]`` in the node's config)."""

    lookahead: timedelta
    overlap_lead: timedelta
    buffer_poll: timedelta
    max_create: int


SPREAD_SLOTS = 1000


def lead(schedule_id: uuid.UUID, overlap: Overlap, pacing: Pacing) -> timedelta:
    """How long before an occurrence the materialiser decides it.

    ``SKIP`` and ``BUFFER_ONE``: ``overlap_lead``. ``ALLOW``: ``lookahead`` plus a share
    of half a lookahead fixed by the schedule's id, so that many schedules of one rule
    (10,000 ``* * * * *``) are materialised over 30 s rather than in one pass, which
    with a lookahead of exactly one period fell on the very second their previous
    occurrence was dispatched (issue 15's bench: max lateness 5.7 s against 2.2 s)."""
    if overlap is not Overlap.ALLOW:
        return pacing.overlap_lead
    share = (schedule_id.int % SPREAD_SLOTS) / SPREAD_SLOTS
    return pacing.lookahead + pacing.lookahead * share / 2


def run_at(logical_date: datetime, now: datetime) -> datetime:
    """``scheduled_at`` of an occurrence: its own instant, unless older than MAX_PAST."""
    return logical_date if logical_date >= now - MAX_PAST else now


def step(
    schedule: Schedule,
    rule: Recurrence,
    now: datetime,
    pacing: Pacing,
    *,
    previous_running: bool,
) -> Step:
    """Decide ``schedule``'s occurrences that are due for a decision at ``now``.

    ``previous_running``: its newest occurrence task is not terminal (read by the store
    with the row). Occurrences later than ``now - misfire_grace`` are on time; older
    ones were missed and the catchup policy says which run (:func:`.recurrence.plan`).
    """
    spec = schedule.spec
    decided: list[Occurrence] = []
    buffered = schedule.buffered_at
    running = previous_running
    if buffered is not None and not running:
        decided.append(Occurrence(buffered, now, Origin.BUFFERED))
        buffered = None
        running = True
    one_at_a_time = spec.overlap is not Overlap.ALLOW
    ahead = lead(schedule.id, spec.overlap, pacing)
    grace = timedelta(seconds=spec.misfire_grace_s)
    planned = plan(
        rule,
        schedule.cursor_at,
        now,
        lookahead=ahead,
        misfire_grace=grace,
        catchup=spec.catchup,
        catchup_limit=spec.catchup_limit,
        end_at=spec.end_at,
        max_create=1 if one_at_a_time else pacing.max_create,
    )
    cursor = planned.cursor
    for at in planned.create:
        origin = Origin.CATCHUP if at < now - grace else Origin.SCHEDULE
        if not running or spec.overlap is Overlap.ALLOW:
            decided.append(Occurrence(at, run_at(at, now), origin))
            running = True
        elif spec.overlap is Overlap.BUFFER_ONE and buffered is None:
            buffered = at  # recorded when it runs, with origin BUFFERED
        else:
            decided.append(Occurrence(at, run_at(at, now), origin, run=False))
    next_at = planned.following
    return Step(
        occurrences=tuple(decided),
        cursor_at=cursor,
        next_at=next_at,
        materialise_at=_look_again(next_at, buffered, now, pacing, ahead),
        buffered_at=buffered,
        missed=planned.missed,
    )


def _look_again(
    next_at: datetime | None,
    buffered: datetime | None,
    now: datetime,
    pacing: Pacing,
    ahead: timedelta,
) -> datetime | None:
    """When the schedule next needs the materialiser: its next occurrence minus the
    lead it is decided at (:func:`lead`), sooner while an occurrence waits for its
    predecessor, never once it has ended with nothing buffered."""
    candidates: list[datetime] = []
    if next_at is not None:
        candidates.append(next_at - ahead)
    if buffered is not None:
        candidates.append(now + pacing.buffer_poll)
    return min(candidates) if candidates else None


def first_instants(
    schedule_id: uuid.UUID, spec: ScheduleSpec, rule: Recurrence, now: datetime, pacing: Pacing
) -> tuple[datetime, datetime | None, datetime | None]:
    """``(cursor_at, next_at, materialise_at)`` of a new schedule: its first occurrence
    is the rule's first at or after ``start_at``, else after ``now``. A start in the
    past leaves the occurrences since then to the catchup policy."""
    cursor = now if spec.start_at is None else spec.start_at - timedelta(microseconds=1)
    return restart(schedule_id, spec, rule, cursor, now, pacing)


def restart(
    schedule_id: uuid.UUID,
    spec: ScheduleSpec,
    rule: Recurrence,
    cursor: datetime,
    now: datetime,
    pacing: Pacing,
) -> tuple[datetime, datetime | None, datetime | None]:
    """``(cursor_at, next_at, materialise_at)`` of a schedule going on from ``cursor``
    (updated, paused or resumed: what lies before ``cursor`` is not caught up)."""
    next_at = next_within(rule, cursor, spec.end_at)
    ahead = lead(schedule_id, spec.overlap, pacing)
    return cursor, next_at, _look_again(next_at, None, now, pacing, ahead)


def backfill_dates(rule: Recurrence, start: datetime, end: datetime, limit: int) -> list[datetime]:
    """The occurrences with ``start <= logical date <= end``, at most ``limit + 1`` (one
    more than allowed tells the caller the range is too large)."""
    return rule.between(start - timedelta(microseconds=1), end, limit + 1)
