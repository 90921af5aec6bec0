"""The watchdog's rule for schedules, pure: which occurrence is due, when it is satisfied,
and one alert per incident across any sequence of checks.

The property tests build a random irregular schedule (occurrences at random gaps, some
skipped by the overlap policy, runs of random length, some never finishing, extra
triggered runs, a materialiser that may die, pauses) and check it every ``check_s``
seconds the way the check loop does, reducing what it passes to what the SQL returns (the
newest created occurrence past its deadline). An oracle written from the rule's
statement says whether the schedule missed an occurrence at each check; the alert must
be open exactly then, and every incident must be triggered once and resolved once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from chronoshard.watchdog.canary import CanaryStats
from chronoshard.watchdog.checker import CheckStats
from chronoshard.watchdog.incidents import (
    Event,
    Kind,
    MemoryAlerts,
    Notify,
    Occurrence,
    Open,
    Resolve,
    Schedule,
    Severity,
    deadline_passed,
    due_occurrence,
    occurrence_satisfied,
    plan,
    schedule_condition,
    schedule_dedup_key,
)
from chronoshard.watchdog.metrics import Sources, WatchdogMetrics
from chronoshard.watchdog.notifier import DeliveryStats

T0 = datetime(2030, 1, 7, tzinfo=UTC)  # a Monday
TENANT = uuid.UUID("0190a5c2-7b7e-7cde-8f00-000000000001")
SCHEDULE_ID = uuid.UUID("0190a5c2-7b7e-7cde-8f00-0000000000aa")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def schedule(expected_s: float = 60.0, tolerance_s: float = 30.0) -> Schedule:
    return Schedule(
        id=SCHEDULE_ID,
        tenant_id=TENANT,
        name="nightly-report",
        job_id="report",
        expected_duration_s=expected_s,
        tolerance_s=tolerance_s,
        severity=Severity.ERROR,
        tenant_name="acme",
    )


# --- the due occurrence ---------------------------------------------------------------------


def test_an_occurrence_is_due_at_its_deadline_not_before() -> None:
    s = schedule(60, 30)
    occ = Occurrence(at(0), task_id=uuid.uuid4())
    assert due_occurrence(s, at(3600), [occ], at(89.999)) is None
    assert due_occurrence(s, at(3600), [occ], at(90)) == occ
    assert deadline_passed(s, at(0), at(90)) and not deadline_passed(s, at(0), at(89.999))


def test_the_newest_occurrence_past_its_deadline_is_due() -> None:
    s = schedule(60, 30)
    old, newer, running = Occurrence(at(0)), Occurrence(at(100)), Occurrence(at(200))
    assert due_occurrence(s, at(300), [running, old, newer], at(250)) == newer


def test_a_next_at_past_its_deadline_is_due_even_with_created_ones() -> None:
    s = schedule(60, 30)
    created = [Occurrence(at(0), completed_at=at(10))]
    due = due_occurrence(s, at(100), created, at(190))
    assert due == Occurrence(at(100), created=False)
    # next_at within its slack: the created one is judged.
    assert due_occurrence(s, at(100), created, at(189)) == created[0]
    # An ended schedule (next_at NULL) is judged on its last occurrences only.
    assert due_occurrence(s, None, created, at(1e6)) == created[0]
    assert due_occurrence(s, None, [], at(1e6)) is None


def test_satisfied_by_its_own_task_or_a_run_since_its_logical_date() -> None:
    occ = Occurrence(at(100), task_id=uuid.uuid4())
    assert not occurrence_satisfied(occ, None)
    assert not occurrence_satisfied(occ, at(99.999))  # a run before it: not this one's
    assert occurrence_satisfied(occ, at(100))
    # Its own task may have started early and finished before its logical date.
    assert occurrence_satisfied(Occurrence(at(100), completed_at=at(95)), None)


def test_an_irregular_cron_is_judged_per_occurrence() -> None:
    """Weekdays at 02:00: Friday's run completed, so the weekend is quiet however long
    since it; Monday's run is due by Monday 02:00 + slack."""
    s = schedule(600, 300)
    day = 86_400.0
    friday = Occurrence(at(4 * day + 7200), task_id=uuid.uuid4(), completed_at=at(4 * day + 7500))
    monday = at(7 * day + 7200)
    for now in (at(5 * day), at(6 * day + 80_000), monday + timedelta(seconds=899)):
        assert schedule_condition(s, monday, [friday], friday.completed_at, now) is None
    missed = schedule_condition(
        s, monday, [friday], friday.completed_at, monday + timedelta(seconds=900)
    )
    assert missed is not None and missed.details["logical_date"] == monday


def test_the_condition_names_the_schedule_the_date_and_the_deadline() -> None:
    s = schedule(60, 30)
    task = uuid.uuid4()
    berlin = timezone(timedelta(hours=1))
    logical = datetime(2030, 1, 7, 3, 0, tzinfo=berlin)  # 02:00 UTC
    condition = schedule_condition(
        s, None, [Occurrence(logical, task_id=task)], None, logical + timedelta(seconds=95)
    )
    assert condition is not None
    assert condition.kind is Kind.SCHEDULE_MISSED
    assert condition.dedup_key == schedule_dedup_key(SCHEDULE_ID)
    assert condition.severity is Severity.ERROR
    assert (condition.tenant_id, condition.job_id) == (TENANT, "report")
    summary = condition.summary
    assert "'nightly-report'" in summary and "tenant acme" in summary
    assert "2030-01-07T02:00:00+00:00" in summary and "2030-01-07T02:01:30+00:00" in summary
    assert str(task) in summary
    assert condition.details["schedule_id"] == str(SCHEDULE_ID)
    assert condition.details["job_id"] == "report"
    assert condition.details["logical_date"] == datetime(2030, 1, 7, 2, 0, tzinfo=UTC)
    assert condition.details["deadline"] == datetime(2030, 1, 7, 2, 1, 30, tzinfo=UTC)
    never = schedule_condition(s, at(0), [], None, at(1000))
    assert never is not None and "no scheduler node created it" in never.summary
    assert never.details["occurrence_created"] is False
    skipped = schedule_condition(s, None, [Occurrence(at(0))], None, at(1000))
    assert skipped is not None and "overlap policy skipped it" in skipped.summary
    # One key per schedule, whichever occurrence is due.
    assert never.dedup_key == skipped.dedup_key == condition.dedup_key


# --- any sequence of checks (properties) ----------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One occurrence of the rule, with what will become of it."""

    logical_s: float
    has_task: bool
    # Seconds after the logical date its task completes; None: never.
    run_s: float | None


@dataclass
class History:
    expected_s: float
    tolerance_s: float
    occurrences: list[Planned]
    # The materialiser creates occurrences this far ahead, until it dies.
    lookahead_s: float
    dies_at_s: float | None
    triggered_runs_s: list[float]
    check_s: float
    checks: int
    paused_checks: frozenset[int]

    def created(self, t: float) -> int:
        """How many occurrences exist at ``t`` (a prefix: the materialiser goes in
        order); the next one is ``next_at``."""
        horizon = t if self.dies_at_s is None else min(t, self.dies_at_s)
        return sum(1 for o in self.occurrences if o.logical_s <= horizon + self.lookahead_s)

    def completions(self, t: float) -> list[datetime]:
        """Every run of the job completed by ``t``: the occurrences' and triggered ones.
        Compared as instants, as the watchdog does (floats would disagree with them in
        the last microsecond)."""
        runs = [
            at(o.logical_s + o.run_s)
            for o in self.occurrences
            if o.has_task and o.run_s is not None
        ]
        return [c for c in runs + [at(r) for r in self.triggered_runs_s] if c <= at(t)]


@st.composite
def histories(draw: st.DrawFn) -> History:
    gaps = draw(st.lists(st.floats(1, 500), min_size=1, max_size=25))
    occurrences: list[Planned] = []
    t = draw(st.floats(0, 200))
    for gap in gaps:
        occurrences.append(
            Planned(
                logical_s=t,
                has_task=draw(st.booleans()),
                run_s=draw(st.none() | st.floats(-5, 400)),
            )
        )
        t += gap
    end = t + 500
    checks = draw(st.integers(5, 80))
    check_s = end / checks
    return History(
        expected_s=draw(st.floats(0, 150)),
        tolerance_s=draw(st.floats(0, 150)),
        occurrences=occurrences,
        lookahead_s=draw(st.floats(0, 60)),
        dies_at_s=draw(st.none() | st.floats(0, end)),
        triggered_runs_s=draw(st.lists(st.floats(0, end), max_size=4)),
        check_s=check_s,
        checks=checks,
        paused_checks=frozenset(draw(st.lists(st.integers(0, checks - 1), max_size=8))),
    )


def missed_by_the_rule(h: History, t: float) -> bool:
    """The rule as stated, by index into the rule's occurrences: of the created ones and
    next_at, the latest whose deadline passed must have its task or a run since its
    logical date completed by ``t``."""
    slack = h.expected_s + h.tolerance_s
    n = h.created(t)
    candidates = h.occurrences[: n + 1]  # the created ones and next_at (if any)
    past = [
        i for i, o in enumerate(candidates) if at(o.logical_s) + timedelta(seconds=slack) <= at(t)
    ]
    if not past:
        return False
    i = past[-1]
    occ = candidates[i]
    own_run_done = (
        i < n and occ.has_task and occ.run_s is not None and at(occ.logical_s + occ.run_s) <= at(t)
    )
    if own_run_done:
        return False
    return not any(c >= at(occ.logical_s) for c in h.completions(t))


@dataclass
class Run:
    alerts: MemoryAlerts = field(default_factory=MemoryAlerts)
    events: list[tuple[int, Event]] = field(default_factory=list)
    open_after: list[bool] = field(default_factory=list)


def run_checks(h: History) -> Run:
    s = schedule(h.expected_s, h.tolerance_s)
    run = Run()
    for k in range(h.checks):
        t = k * h.check_s
        now = at(t)
        n = h.created(t)
        next_at = at(h.occurrences[n].logical_s) if n < len(h.occurrences) else None
        created = [
            Occurrence(
                at(o.logical_s),
                task_id=uuid.UUID(int=i + 1) if o.has_task else None,
                completed_at=(
                    at(o.logical_s + o.run_s)
                    if o.has_task and o.run_s is not None and at(o.logical_s + o.run_s) <= now
                    else None
                ),
            )
            for i, o in enumerate(h.occurrences[:n])
        ]
        completions = h.completions(t)
        last = max(completions) if completions else None
        # What the query returns: only the newest created occurrence past its deadline.
        newest = [o for o in created if deadline_passed(s, o.logical_date, now)][-1:]
        assert due_occurrence(s, next_at, newest, now) == due_occurrence(s, next_at, created, now)
        firing = []
        if k not in h.paused_checks:  # a paused schedule is not read at all
            condition = schedule_condition(s, next_at, newest, last, now)
            if condition is not None:
                firing.append(condition)
        for action in plan(firing, run.alerts.records(), now=now, renotify_interval_s=0):
            # Deliveries succeed at once here; tests/unit/test_watchdog_incidents.py covers
            # failing and slow ones for every kind of condition alike.
            if isinstance(action, Open):
                alert = run.alerts.open(action.condition, now)
                run.alerts.notified(alert, Event.TRIGGER, now)
                run.events.append((k, Event.TRIGGER))
            elif isinstance(action, Resolve):
                resolved = run.alerts.resolve(action.alert, now)
                run.alerts.notified(resolved, Event.RESOLVE, now)
                run.events.append((k, Event.RESOLVE))
            elif isinstance(action, Notify):  # pragma: no cover - nothing is ever owed here
                raise AssertionError(f"unexpected {action}")
        open_alerts = [a for a in run.alerts.history() if a.is_open]
        assert len(open_alerts) <= 1
        run.open_after.append(bool(open_alerts))
    return run


@settings(max_examples=300, deadline=None)
@given(histories())
def test_an_alert_is_open_exactly_while_an_occurrence_is_missed(h: History) -> None:
    run = run_checks(h)
    for k, is_open in enumerate(run.open_after):
        expected = k not in h.paused_checks and missed_by_the_rule(h, k * h.check_s)
        assert is_open == expected, f"check {k} at {k * h.check_s:.1f} s"


@settings(max_examples=300, deadline=None)
@given(histories())
def test_each_incident_is_one_trigger_then_one_resolve(h: History) -> None:
    run = run_checks(h)
    events = [e for _, e in run.events]
    # Strictly alternating, starting with a trigger: one alert per incident.
    assert events == [Event.TRIGGER, Event.RESOLVE] * (len(events) // 2) + (
        [Event.TRIGGER] if len(events) % 2 else []
    )
    # An incident opens only at a check where it was not open before, and vice versa.
    for k, event in run.events:
        before = run.open_after[k - 1] if k > 0 else False
        assert before == (event is Event.RESOLVE)
    opened = sum(1 for e in events if e is Event.TRIGGER)
    stretches = sum(
        1 for k, o in enumerate(run.open_after) if o and (k == 0 or not run.open_after[k - 1])
    )
    assert opened == stretches


# --- metrics -----------------------------------------------------------------------------------


def test_schedule_counts_are_exported() -> None:
    checks = CheckStats(schedules=3, missed_schedules=1)
    metrics = WatchdogMetrics(
        Sources(checks, DeliveryStats(), CanaryStats(), lambda: True, lambda: True, lambda: 0.0)
    )
    lines = generate_latest(metrics.registry).decode().splitlines()
    assert "chronoshard_watchdog_schedules 3.0" in lines
    assert "chronoshard_watchdog_missed_schedules 1.0" in lines
    checks.clear_gauges()  # a replica that stops leading reports nothing of its own
    lines = generate_latest(metrics.registry).decode().splitlines()
    assert "chronoshard_watchdog_missed_schedules 0.0" in lines
