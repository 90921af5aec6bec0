"""The watchdog's pure core: when a job is overdue, and one alert per incident.

The property tests run the planner the way the check loop does — a check every
``check_s`` seconds over a random history of completions, applying every action to an
in-memory record — and check the whole history of notifications against the rules:
an alert is open exactly while the job is overdue, each incident is triggered once and
resolved once in that order, re-notifications keep their cadence, and deliveries that
fail are retried without ever duplicating one that succeeded.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.watchdog.incidents import (
    CANARY_DEDUP_KEY,
    AlertRecord,
    CanaryOutcome,
    CanaryRun,
    CanaryStatus,
    Condition,
    Event,
    Expectation,
    Kind,
    MemoryAlerts,
    Notify,
    Open,
    Resolve,
    Severity,
    canary_condition,
    canary_outcome,
    canary_status,
    is_overdue,
    job_condition,
    job_dedup_key,
    outage_condition,
    overdue_after,
    plan,
    seconds_since,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TENANT = uuid.UUID("0190a5c2-7b7e-7cde-8f00-000000000001")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def expectation(interval_s: float = 60.0, tolerance_s: float = 10.0) -> Expectation:
    return Expectation(
        tenant_id=TENANT,
        job_id="nightly",
        interval_s=interval_s,
        tolerance_s=tolerance_s,
        registered_at=T0,
        tenant_name="acme",
    )


# --- overdue -----------------------------------------------------------------------------------


def test_overdue_is_strictly_after_interval_plus_tolerance() -> None:
    exp = expectation(60, 10)
    last = at(100)
    assert not is_overdue(exp, last, at(170))  # exactly interval + tolerance: on time
    assert is_overdue(exp, last, at(170.001))
    assert overdue_after(exp, last) == at(170)


def test_never_completed_counts_from_registration() -> None:
    exp = expectation(60, 10)
    assert seconds_since(exp, None, at(30)) == 30
    assert not is_overdue(exp, None, at(70))
    assert is_overdue(exp, None, at(70.5))
    condition = job_condition(exp, None, at(71))
    assert condition is not None
    assert "never completed" in condition.summary
    assert condition.details["last_completed_at"] is None
    assert condition.details["overdue_since"] == at(70)


def test_job_condition_identifies_the_job_stably() -> None:
    exp = expectation()
    first = job_condition(exp, at(0), at(1000))
    later = job_condition(exp, at(0), at(5000))
    assert first is not None and later is not None
    assert first.dedup_key == later.dedup_key == job_dedup_key(TENANT, "nightly")
    assert first.kind is Kind.JOB_OVERDUE
    assert (first.tenant_id, first.job_id) == (TENANT, "nightly")
    assert "acme" in first.summary and "'nightly'" in first.summary
    other_tenant = job_dedup_key(uuid.uuid4(), "nightly")
    assert other_tenant != first.dedup_key


@given(
    interval=st.floats(0.001, 1e6),
    tolerance=st.floats(0, 1e6),
    last=st.floats(-1e6, 1e6),
    gap=st.floats(0, 3e6),
    later=st.floats(0, 1e6),
)
def test_once_overdue_a_job_stays_overdue_until_it_completes(
    interval: float, tolerance: float, last: float, gap: float, later: float
) -> None:
    exp = expectation(interval, tolerance)
    now = at(last + gap)
    if is_overdue(exp, at(last), now):
        assert is_overdue(exp, at(last), now + timedelta(seconds=later))
        assert now > overdue_after(exp, at(last))
    else:
        assert now <= overdue_after(exp, at(last)) + timedelta(microseconds=1)
    # A completion at `now` always puts the job back on time.
    assert not is_overdue(exp, now, now)


# --- the planner, one step at a time --------------------------------------------------------------


def condition(key: str = "k") -> Condition:
    return Condition(Kind.JOB_OVERDUE, key, Severity.CRITICAL, f"{key} is overdue")


def record(key: str = "k", **changes: object) -> AlertRecord:
    base = AlertRecord(
        id=1, kind="job_overdue", dedup_key=key, severity=Severity.CRITICAL, summary="s",
        opened_at=at(0), last_notified_at=at(0),
    )  # fmt: skip
    return AlertRecord(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_plan_opens_a_firing_condition_once() -> None:
    assert plan([condition()], [], now=at(5), renotify_interval_s=0) == [Open(condition())]
    assert plan([condition()], [record()], now=at(5), renotify_interval_s=0) == []


def test_plan_resolves_an_open_alert_whose_condition_stopped() -> None:
    alert = record()
    assert plan([], [alert], now=at(5), renotify_interval_s=0) == [Resolve(alert)]


def test_plan_retries_an_undelivered_trigger_and_renotifies_on_cadence() -> None:
    undelivered = record(last_notified_at=None)
    assert plan([condition()], [undelivered], now=at(1), renotify_interval_s=0) == [
        Notify(undelivered, Event.TRIGGER)
    ]
    delivered = record(last_notified_at=at(0))
    assert plan([condition()], [delivered], now=at(59.9), renotify_interval_s=60) == []
    assert plan([condition()], [delivered], now=at(60), renotify_interval_s=60) == [
        Notify(delivered, Event.RENOTIFY)
    ]
    assert plan([condition()], [delivered], now=at(1e6), renotify_interval_s=0) == []


def test_plan_delivers_an_owed_resolve_before_reopening_the_key() -> None:
    owed = record(resolved_at=at(10), resolve_notified_at=None)
    actions = plan([condition()], [owed], now=at(20), renotify_interval_s=0)
    assert actions == [Notify(owed, Event.RESOLVE)]
    done = record(resolved_at=at(10), resolve_notified_at=at(11))
    assert plan([condition()], [done], now=at(20), renotify_interval_s=0) == [Open(condition())]


def test_plan_leaves_busy_keys_alone() -> None:
    busy = frozenset({"k"})
    assert plan([condition()], [], now=at(1), renotify_interval_s=0, busy=busy) == []
    assert plan([], [record()], now=at(1), renotify_interval_s=0, busy=busy) == []
    owed = record(resolved_at=at(1), resolve_notified_at=None)
    assert plan([], [owed], now=at(2), renotify_interval_s=0, busy=busy) == []
    # Other keys are decided as usual.
    assert plan([condition("j")], [], now=at(1), renotify_interval_s=0, busy=busy) == [
        Open(condition("j"))
    ]


def test_memory_alerts_refuse_a_second_open_alert_per_key() -> None:
    alerts = MemoryAlerts()
    first = alerts.open(condition(), at(0))
    with pytest.raises(ValueError, match="already open"):
        alerts.open(condition(), at(1))
    alerts.resolve(first, at(2))
    assert [a.is_open for a in alerts.records()] == [False]  # resolve still owed
    resolved = alerts.records()[0]
    alerts.notified(resolved, Event.RESOLVE, at(3))
    assert alerts.records() == []
    alerts.open(condition(), at(4))
    assert len(alerts.history()) == 2


# --- the planner over whole histories (properties) -------------------------------------------


@dataclass
class Sent:
    at_s: float
    event: Event
    opened_at: datetime
    delivered: bool


@dataclass
class Simulation:
    """The check loop over one job, with an in-memory alert record and deliveries that
    succeed or fail as the test says."""

    exp: Expectation
    check_s: float
    renotify_s: float
    alerts: MemoryAlerts = field(default_factory=MemoryAlerts)
    sent: list[Sent] = field(default_factory=list)
    open_after_check: list[tuple[float, bool, bool]] = field(default_factory=list)

    def run(
        self, completions: list[float], horizon_s: float, phase_s: float, outcomes: list[bool]
    ) -> None:
        delivery = iter(outcomes)
        t = phase_s
        while t <= horizon_s:
            now = at(t)
            done = [c for c in completions if c <= t]
            last = at(max(done)) if done else None
            firing = [c] if (c := job_condition(self.exp, last, now)) else []
            for action in plan(
                firing, self.alerts.records(), now=now, renotify_interval_s=self.renotify_s
            ):
                if isinstance(action, Open):
                    self._send(self.alerts.open(action.condition, now), Event.TRIGGER, t, delivery)
                elif isinstance(action, Resolve):
                    self._send(self.alerts.resolve(action.alert, now), Event.RESOLVE, t, delivery)
                else:
                    self._send(action.alert, action.event, t, delivery)
            is_open = any(a.is_open for a in self.alerts.records())
            self.open_after_check.append((t, is_overdue(self.exp, last, now), is_open))
            t += self.check_s

    def _send(self, alert: AlertRecord, event: Event, t: float, delivery: object) -> None:
        ok = next(delivery, True)  # type: ignore[call-overload]
        self.sent.append(Sent(t, event, alert.opened_at, ok))
        if ok:
            self.alerts.notified(alert, event, at(t))


histories = st.fixed_dictionaries(
    {
        "interval": st.sampled_from([1.0, 2.0, 5.0, 60.0]),
        "tolerance": st.sampled_from([0.0, 1.0, 3.0]),
        "check": st.sampled_from([0.5, 1.0, 2.5]),
        "renotify": st.sampled_from([0.0, 4.0, 10.0]),
        "phase": st.floats(0, 1),
        "completions": st.lists(st.floats(0, 110), max_size=25),
        "outcomes": st.lists(st.booleans(), max_size=60),
    }
)


def simulate(h: dict[str, object], *, failing: bool) -> Simulation:
    sim = Simulation(
        expectation(h["interval"], h["tolerance"]),  # type: ignore[arg-type]
        check_s=h["check"],  # type: ignore[arg-type]
        renotify_s=h["renotify"],  # type: ignore[arg-type]
    )
    sim.run(
        sorted(h["completions"]),  # type: ignore[type-var]
        horizon_s=120,
        phase_s=h["phase"],  # type: ignore[arg-type]
        outcomes=h["outcomes"] if failing else [],  # type: ignore[arg-type]
    )
    return sim


@settings(max_examples=150, deadline=None)
@given(histories)
def test_an_alert_is_open_exactly_while_the_job_is_overdue(h: dict[str, object]) -> None:
    sim = simulate(h, failing=False)
    for t, overdue, is_open in sim.open_after_check:
        assert overdue == is_open, f"at {t}: overdue={overdue} open={is_open}"


@settings(max_examples=150, deadline=None)
@given(histories)
def test_each_incident_is_triggered_once_and_resolved_once_in_order(h: dict[str, object]) -> None:
    sim = simulate(h, failing=False)
    incidents = sorted({s.opened_at for s in sim.sent})
    # One incident per maximal run of overdue checks.
    runs = sum(
        1
        for i, (_, overdue, _) in enumerate(sim.open_after_check)
        if overdue and (i == 0 or not sim.open_after_check[i - 1][1])
    )
    assert len(incidents) == runs
    for opened in incidents:
        events = [s.event for s in sim.sent if s.opened_at == opened]
        assert events[0] is Event.TRIGGER
        assert events.count(Event.TRIGGER) == 1
        assert events.count(Event.RESOLVE) <= 1
        if Event.RESOLVE in events:
            assert events[-1] is Event.RESOLVE
        assert set(events[1:-1]) <= {Event.RENOTIFY}


@settings(max_examples=150, deadline=None)
@given(histories)
def test_renotifications_keep_their_cadence(h: dict[str, object]) -> None:
    sim = simulate(h, failing=False)
    renotify = float(h["renotify"])  # type: ignore[arg-type]
    check = float(h["check"])  # type: ignore[arg-type]
    for opened in {s.opened_at for s in sim.sent}:
        times = [s.at_s for s in sim.sent if s.opened_at == opened and s.event != Event.RESOLVE]
        if renotify == 0:
            assert len(times) == 1
            continue
        for earlier, later in itertools.pairwise(times):
            assert renotify <= later - earlier + 1e-9 < renotify + check + 1e-9


@settings(max_examples=150, deadline=None)
@given(histories)
def test_failed_deliveries_are_retried_and_never_duplicate_a_delivered_one(
    h: dict[str, object],
) -> None:
    sim = simulate(h, failing=True)
    for opened in {s.opened_at for s in sim.sent}:
        sent = [s for s in sim.sent if s.opened_at == opened]
        triggers = [s for s in sent if s.event is Event.TRIGGER]
        resolves = [s for s in sent if s.event is Event.RESOLVE]
        # A trigger is retried only until one gets through; the same for the resolve.
        assert sum(s.delivered for s in triggers) <= 1
        assert all(not s.delivered for s in triggers[:-1])
        assert sum(s.delivered for s in resolves) <= 1
        assert all(not s.delivered for s in resolves[:-1])
        # A resolve never goes out before the incident's first trigger attempt.
        if resolves:
            assert triggers and triggers[0].at_s <= resolves[0].at_s
    # A new incident of the key opens only after the previous resolve was delivered.
    incidents = sorted({s.opened_at for s in sim.sent})
    for earlier, later in itertools.pairwise(incidents):
        delivered_resolves = [
            s.at_s
            for s in sim.sent
            if s.opened_at == earlier and s.event is Event.RESOLVE and s.delivered
        ]
        assert delivered_resolves and delivered_resolves[0] <= (later - T0).total_seconds()


# --- canaries -----------------------------------------------------------------------------------


def canary(
    scheduled_s: float, completed_s: float | None = None, *, failed: bool = False
) -> CanaryRun:
    return CanaryRun(
        id=uuid.uuid4(),
        scheduled_at=at(scheduled_s),
        completed_at=None if completed_s is None else at(completed_s),
        submit_failed=failed,
    )


def test_canary_outcome_and_status() -> None:
    assert canary_outcome(canary(0, 2), at(3), 5) is CanaryOutcome.ON_TIME
    assert canary_outcome(canary(0, 5), at(9), 5) is CanaryOutcome.ON_TIME  # on the deadline
    assert canary_outcome(canary(0), at(4), 5) is CanaryOutcome.PENDING
    assert canary_outcome(canary(0), at(5.1), 5) is CanaryOutcome.LATE
    assert canary_outcome(canary(0, 7), at(9), 5) is CanaryOutcome.LATE
    assert canary_status(canary(0, 2), at(3), 5) is CanaryStatus.COMPLETED
    assert canary_status(canary(0, 7), at(9), 5) is CanaryStatus.LATE
    assert canary_status(canary(0), at(1), 5) is CanaryStatus.SUBMITTED
    dispatched = CanaryRun(uuid.uuid4(), at(0), dispatched_at=at(0.1))
    assert canary_status(dispatched, at(1), 5) is CanaryStatus.DISPATCHED
    assert canary_status(canary(0, failed=True), at(1), 5) is CanaryStatus.FAILED
    assert canary_status(canary(0, failed=True), at(60), 5) is CanaryStatus.FAILED


def test_canary_condition_follows_the_newest_decided_canary() -> None:
    assert canary_condition([], at(100), 5) is None
    assert canary_condition([canary(99)], at(100), 5) is None  # still pending
    late = canary_condition([canary(0, 1), canary(10)], at(16), 5)
    assert late is not None and late.dedup_key == CANARY_DEDUP_KEY
    assert late.kind is Kind.CANARY_LATE and "did not complete" in late.summary
    # A newer on-time canary ends it; an older late one does not matter any more.
    assert canary_condition([canary(10), canary(20, 21)], at(30), 5) is None
    # A pending newer canary does not end it.
    assert canary_condition([canary(10), canary(20)], at(21), 5) is not None
    failed = canary_condition([canary(0, failed=True)], at(6), 5)
    assert failed is not None and "could not be submitted" in failed.summary
    assert canary_condition([canary(0, failed=True)], at(4), 5) is None


@given(
    st.lists(st.tuples(st.floats(0, 100), st.one_of(st.none(), st.floats(0, 20))), max_size=15),
    st.floats(0, 30),
    st.floats(0.5, 10),
)
def test_a_newer_on_time_canary_always_clears_the_condition(
    runs: list[tuple[float, float | None]], extra: float, tolerance: float
) -> None:
    history = [canary(s, None if d is None else s + d) for s, d in runs]
    newest = max((s for s, _ in runs), default=0.0) + 1
    on_time = CanaryRun(
        uuid.uuid4(), at(newest), completed_at=at(newest) + timedelta(seconds=min(extra, tolerance))
    )
    history.append(on_time)
    assert canary_condition(history, at(newest + 1000), tolerance) is None
    # Every canary lost (none completed): firing once the newest is past its deadline.
    lost = [canary(s) for s, _ in runs] + [canary(newest)]
    assert canary_condition(lost, at(newest + tolerance + 0.5), tolerance) is not None


def test_outage_condition_fires_only_past_the_tolerance() -> None:
    assert outage_condition(30, 30, "wd-1") is None
    fired = outage_condition(31, 30, "wd-1")
    assert fired is not None and fired.kind is Kind.DATABASE_UNREACHABLE
    assert "wd-1" in fired.summary
