"""The materialiser's decision for one schedule (core/schedules.step), as a sequence of
passes over a simulated store: random pass times, outages and task lifetimes."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.recurrence import Catchup, Cron, Interval
from chronoshard.scheduler.core.schedules import (
    MAX_PAST,
    Origin,
    Overlap,
    Pacing,
    Schedule,
    ScheduleSpec,
    first_instants,
    lead,
    run_at,
    step,
    upcoming,
)

START = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)  # Berlin's spring change is 01:00 UTC next day
PACING = Pacing(
    lookahead=timedelta(seconds=30),
    overlap_lead=timedelta(seconds=2),
    buffer_poll=timedelta(seconds=1),
    max_create=7,
)
GRACE_S = 20.0


def _spec(overlap: Overlap, catchup: Catchup, limit: int, every_s: float) -> ScheduleSpec:
    return ScheduleSpec(
        name="s",
        cron=None,
        interval_s=every_s,
        timezone="UTC",
        start_at=None,
        end_at=None,
        template=b"",
        catchup=catchup,
        catchup_limit=limit,
        misfire_grace_s=GRACE_S,
        overlap=overlap,
        job_id="s",
        watch=True,
        expected_duration_s=60,
        tolerance_s=60,
        severity="critical",
    )


def _schedule(spec: ScheduleSpec) -> Schedule:
    rule = Interval(START, timedelta(seconds=spec.interval_s or 1))
    schedule_id = uuid.uuid4()
    cursor, next_at, materialise_at = first_instants(schedule_id, spec, rule, START, PACING)
    return Schedule(
        id=schedule_id,
        tenant_id=uuid.uuid4(),
        shard=0,
        spec=spec,
        anchor_at=START,
        paused=False,
        cursor_at=cursor,
        next_at=next_at,
        materialise_at=materialise_at,
        buffered_at=None,
        last_task=None,
        created_at=START,
        updated_at=START,
    )


@dataclass
class Run:
    logical_date: datetime
    origin: Origin
    created: datetime
    ends: datetime


@settings(max_examples=300, deadline=None)
@given(
    overlap=st.sampled_from(list(Overlap)),
    catchup=st.sampled_from(list(Catchup)),
    limit=st.integers(1, 5),
    every_s=st.sampled_from([1.0, 5.0, 60.0]),
    gaps=st.lists(st.floats(0.1, 200.0), min_size=1, max_size=40),
    durations=st.lists(st.floats(0.1, 30.0), min_size=1, max_size=10),
)
def test_passes_create_each_occurrence_once_and_respect_overlap(
    overlap: Overlap,
    catchup: Catchup,
    limit: int,
    every_s: float,
    gaps: list[float],
    durations: list[float],
) -> None:
    """Passes at random instants (long gaps are outages): no occurrence is decided twice,
    every occurrence passed over is accounted for (run, skipped, buffered or missed),
    the cursor only moves forward, materialise_at is never later than the next decision
    needs, and under SKIP/BUFFER_ONE no run starts while an earlier one runs."""
    spec = _spec(overlap, catchup, limit, every_s)
    rule = Interval(START, timedelta(seconds=every_s))
    schedule = _schedule(spec)
    now = START
    decided: dict[datetime, bool] = {}
    runs: list[Run] = []
    missed = 0
    for n, gap in enumerate(gaps):
        now += timedelta(seconds=gap)
        if schedule.materialise_at is None or schedule.materialise_at > now:
            continue  # the store would not hand it over yet
        running = bool(runs) and runs[-1].ends > now
        result = step(schedule, rule, now, PACING, previous_running=running)
        assert result.cursor_at >= schedule.cursor_at
        missed += result.missed
        for occurrence in result.occurrences:
            assert occurrence.logical_date not in decided, "decided twice"
            decided[occurrence.logical_date] = occurrence.run
            if occurrence.run:
                started = max(now, occurrence.scheduled_at)
                ends = started + timedelta(seconds=durations[n % len(durations)])
                runs.append(Run(occurrence.logical_date, occurrence.origin, now, ends))
        if overlap is not Overlap.ALLOW:
            assert sum(o.run for o in result.occurrences) <= 1
        # What is left to decide is after the cursor, and next_at is its first.
        assert result.next_at == rule.next_after(result.cursor_at)
        if result.materialise_at is not None and result.next_at is not None:
            ahead = lead(schedule.id, overlap, PACING)
            assert result.materialise_at <= result.next_at - ahead
            assert ahead <= PACING.lookahead * 1.5
        last = schedule.last_task
        if any(o.run for o in result.occurrences):
            last = TaskRef(now, uuid.uuid4())
        schedule = replace(
            schedule,
            cursor_at=result.cursor_at,
            next_at=result.next_at,
            materialise_at=result.materialise_at,
            buffered_at=result.buffered_at,
            last_task=last,
        )
    # Every occurrence up to the cursor was decided (run or skipped), is the one held
    # back by BUFFER_ONE, or was counted missed: none vanishes unaccounted.
    passed = rule.between(START, schedule.cursor_at, 100_000)
    held = {schedule.buffered_at} if schedule.buffered_at is not None else set()
    undecided = [at for at in passed if at not in decided and at not in held]
    assert len(undecided) == missed
    assert all(at <= schedule.cursor_at for at in decided)
    if overlap is not Overlap.ALLOW:
        # No run is created while the one before it has not ended.
        for before, after in itertools.pairwise(runs):
            assert before.ends <= after.created


def test_an_on_time_occurrence_keeps_its_instant_and_an_ancient_one_runs_now() -> None:
    now = START + timedelta(days=30)
    assert run_at(now - timedelta(seconds=5), now) == now - timedelta(seconds=5)
    assert run_at(now - MAX_PAST - timedelta(seconds=1), now) == now


def test_a_skipped_berlin_hour_is_one_occurrence_at_the_change() -> None:
    # 02:30 Berlin does not exist on 2026-03-29: the daily 02:30 fires once, at 03:00 CEST.
    rule = Cron("30 2 * * *", "Europe/Berlin", now=START)
    nexts = upcoming(rule, START, None, 3)
    assert nexts[0] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST, the change
    assert nexts[1] == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)  # 02:30 CEST


def test_end_at_ends_the_schedule() -> None:
    spec = replace(_spec(Overlap.ALLOW, Catchup.SKIP, 1, 60.0), end_at=START + timedelta(minutes=2))
    rule = Interval(START, timedelta(seconds=60))
    schedule = _schedule(spec)
    first = step(schedule, rule, START + timedelta(seconds=65), PACING, previous_running=False)
    assert [o.logical_date for o in first.occurrences] == [START + timedelta(minutes=1)]
    assert first.next_at == START + timedelta(minutes=2)
    schedule = replace(schedule, cursor_at=first.cursor_at)
    last = step(schedule, rule, START + timedelta(seconds=100), PACING, previous_running=False)
    assert [o.logical_date for o in last.occurrences] == [START + timedelta(minutes=2)]
    assert last.next_at is None and last.materialise_at is None
