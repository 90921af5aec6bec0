"""The reconciler's decision core (pure, time passed in) and its shell over fakes."""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.clock import FakeClock
from chronoshard.scheduler.cluster.reconciler import Reconciler, plan_repairs
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.core.repairs import (
    ACK_DEADLINE_SLACK_S,
    MIN_PASS_GAP_S,
    Cause,
    Decision,
    InFlight,
    Repair,
    RepairResult,
    RunCandidate,
    RunOutcome,
    RunState,
    Scan,
    Verdict,
    decide,
    next_pass_in_s,
    workflow_outcome,
)
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.core.states import AttemptState, TaskStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ACK_S = 10.0
LEASE_S = 30.0
MARGIN_S = 2.0


def _row(
    *,
    status: TaskStatus = TaskStatus.DISPATCHED,
    lease_in_s: float | None = 20.0,
    untouched_s: float = 0.0,
    idempotent: bool = False,
    cancel_requested: bool = False,
    shard: int = 1,
    task_id: uuid.UUID | None = None,
) -> InFlight:
    task_id = task_id or uuid.uuid4()
    return InFlight(
        timer=TimerTask(
            id=task_id,
            scheduled_at=NOW,
            shard=shard,
            tenant_id=uuid.UUID(int=1),
            priority=Priority.STANDARD,
            queue="default",
            type="t",
            due_at=NOW,
            strict_timing=False,
        ),
        status=status,
        fencing_token=3,
        attempt=3,
        worker_id="w-1",
        idempotent=idempotent,
        cancel_requested=cancel_requested,
        lease_expires_at=None if lease_in_s is None else NOW + timedelta(seconds=lease_in_s),
        updated_at=NOW - timedelta(seconds=untouched_s),
    )


def _decision(
    row: InFlight, knows: bool | None = None, now: datetime = NOW, steady_s: float = math.inf
) -> Decision:
    return decide(
        row, now, ack_timeout_s=ACK_S, lease_margin_s=MARGIN_S, knows=knows, steady_s=steady_s
    )


def _decide(
    row: InFlight, knows: bool | None = None, now: datetime = NOW, steady_s: float = math.inf
) -> Verdict:
    return _decision(row, knows, now, steady_s).verdict


def _past_margin(row: InFlight, now: datetime = NOW) -> bool:
    """The lease ran out at least the margin ago (or there is none)."""
    return row.lease_expires_at is None or row.lease_expires_at + timedelta(seconds=MARGIN_S) <= now


# ---- examples: one per rule of docs/architecture.md#d8 (as issue 12 amended it) ---------


def test_unacknowledged_dispatch_unknown_to_the_session_is_given_back() -> None:
    row = _row(untouched_s=ACK_S + 1)
    decision = _decision(row, knows=False)
    assert decision.verdict is Verdict.REDISPATCH
    assert decision.target is TaskStatus.PRELOADED
    assert decision.attempt_state is AttemptState.ABANDONED
    assert decision.cause is Cause.UNACKNOWLEDGED


def test_unacknowledged_dispatch_the_session_knows_waits_for_its_lease() -> None:
    assert _decide(_row(untouched_s=ACK_S + 1), knows=True) is Verdict.KEEP


def test_unacknowledged_dispatch_with_no_session_here_waits_for_its_lease() -> None:
    # No session here is no evidence: the worker may hold it behind a partition.
    assert _decide(_row(untouched_s=ACK_S + 1), knows=None) is Verdict.KEEP


def test_a_young_dispatch_is_left_alone_even_if_the_session_does_not_know_it() -> None:
    # Between the intent commit and the send, the session does not know it yet.
    assert _decide(_row(untouched_s=ACK_S - 1), knows=False) is Verdict.KEEP


def test_an_unacknowledged_dispatch_waits_for_the_ack_timeout_after_a_break_of_the_database() -> (
    None
):
    # PostgreSQL restarted (or refused this node) 9 s ago: every ack, heartbeat and
    # settlement of the attempt before then failed, so "untouched for 30 s" says nothing
    # about whether it was delivered. A whole ack timeout of a steady database must pass.
    row = _row(untouched_s=ACK_S + 20)
    assert _decide(row, knows=False, steady_s=ACK_S - 1) is Verdict.KEEP
    assert _decide(row, knows=False, steady_s=ACK_S) is Verdict.REDISPATCH
    # The lease rules do not hang on touches the worker makes: a break changes none.
    expired = _row(status=TaskStatus.RUNNING, lease_in_s=-MARGIN_S - 1, idempotent=True)
    assert _decide(expired, knows=True, steady_s=0.0) is Verdict.REDISPATCH


def test_expired_lease_of_an_idempotent_task_is_redispatched_after_the_margin() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=-MARGIN_S, idempotent=True)
    decision = _decision(row, knows=True)
    assert decision.verdict is Verdict.REDISPATCH
    assert decision.cause is Cause.LEASE_EXPIRED
    assert decision.target is TaskStatus.PRELOADED


def test_a_lease_inside_its_margin_is_left_alone() -> None:
    # The worker stops the attempt the margin before its lease runs out; the node waits
    # the margin after, so the two never overlap.
    for idempotent in (True, False):
        row = _row(status=TaskStatus.RUNNING, lease_in_s=-MARGIN_S + 0.01, idempotent=idempotent)
        assert _decide(row, knows=None) is Verdict.KEEP


def test_expired_lease_of_a_non_idempotent_task_becomes_outcome_unknown() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=-MARGIN_S - 1)
    for knows in (True, False, None):
        decision = _decision(row, knows=knows)
        assert decision.verdict is Verdict.OUTCOME_UNKNOWN
        assert decision.target is TaskStatus.OUTCOME_UNKNOWN
        assert decision.attempt_state is AttemptState.OUTCOME_UNKNOWN
        assert decision.cause is Cause.LEASE_EXPIRED
        assert "outcome unknown" in decision.reason and "w-1" in decision.reason
    # Never acknowledged, but with no session here that could say it was never sent.
    unacked = _row(lease_in_s=-MARGIN_S - 1, untouched_s=LEASE_S)
    assert _decide(unacked, knows=None) is Verdict.OUTCOME_UNKNOWN


def test_expired_lease_with_a_cancel_request_ends_cancelled() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=-MARGIN_S, cancel_requested=True)
    decision = _decision(row, knows=True)
    assert decision.verdict is Verdict.CANCEL
    assert decision.target is TaskStatus.CANCELLED
    assert decision.attempt_state is AttemptState.CANCELLED


def test_lease_plus_margin_reached_exactly_now_counts_as_expired() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=-MARGIN_S, idempotent=True)
    assert _decide(row) is Verdict.REDISPATCH


def test_rows_that_are_not_in_flight_are_never_touched() -> None:
    for status in set(TaskStatus) - {TaskStatus.DISPATCHED, TaskStatus.RUNNING}:
        row = _row(status=status, lease_in_s=-100, idempotent=True)
        assert _decide(row, knows=False) is Verdict.KEEP


# ---- properties -----------------------------------------------------------------------------

rows = st.builds(
    _row,
    status=st.sampled_from([TaskStatus.DISPATCHED, TaskStatus.RUNNING]),
    lease_in_s=st.one_of(st.none(), st.floats(-100, 100)),
    untouched_s=st.floats(0, 100),
    idempotent=st.booleans(),
    cancel_requested=st.booleans(),
)
knowledge = st.sampled_from([True, False, None])
steadiness = st.one_of(st.just(math.inf), st.floats(0, 100))


@st.composite
def written_rows(draw: st.DrawFn) -> InFlight:
    """Rows as the writers leave them: the intent and every heartbeat set the lease to
    ``now + lease`` and touch the row, an ack or a cancel request touches it later, so a
    lease runs out at most ``LEASE_S`` after the row was last touched, exactly then for a
    DISPATCHED row nobody asked to cancel."""
    status = draw(st.sampled_from([TaskStatus.DISPATCHED, TaskStatus.RUNNING]))
    untouched_s = draw(st.floats(0, 100))
    cancel_requested = draw(st.booleans())
    latest_lease_s = LEASE_S - untouched_s
    if status is TaskStatus.DISPATCHED and not cancel_requested:
        lease_in_s = latest_lease_s
    else:
        lease_in_s = draw(st.floats(-100, latest_lease_s))
    return _row(
        status=status,
        lease_in_s=lease_in_s,
        untouched_s=untouched_s,
        idempotent=draw(st.booleans()),
        cancel_requested=cancel_requested,
    )


@settings(max_examples=300)
@given(rows, knowledge, steadiness)
def test_a_non_idempotent_task_never_runs_again_unless_it_never_ran(
    row: InFlight, knows: bool | None, steady_s: float
) -> None:
    """The one way to double-run a side effect: re-dispatching an attempt that may have
    run. Only an unacknowledged dispatch its worker's live session never got may be given
    back, once the row stayed untouched for the ack timeout while touches could land (the
    database steady); a lost lease leaves the outcome unknown, however the worker looks."""
    verdict = _decide(row, knows, steady_s=steady_s)
    if verdict is Verdict.REDISPATCH and not row.idempotent:
        assert row.status is TaskStatus.DISPATCHED and knows is False
        assert (NOW - row.updated_at).total_seconds() >= ACK_S
        assert steady_s >= ACK_S


@settings(max_examples=300)
@given(rows, knowledge)
def test_nothing_is_given_up_before_lease_plus_margin_unless_it_was_never_delivered(
    row: InFlight, knows: bool | None
) -> None:
    """Worker self-fencing relies on it: the node acts on a lease only the margin after it
    ran out, by which time the worker stopped the attempt on its own."""
    if _decide(row, knows) is not Verdict.KEEP and not _past_margin(row):
        assert row.status is TaskStatus.DISPATCHED and knows is False


@settings(max_examples=300)
@given(rows, knowledge)
def test_an_unknown_outcome_is_declared_only_for_a_non_idempotent_lost_lease(
    row: InFlight, knows: bool | None
) -> None:
    if _decide(row, knows) is Verdict.OUTCOME_UNKNOWN:
        assert not row.idempotent and not row.cancel_requested and _past_margin(row)


@settings(max_examples=300)
@given(rows, knowledge)
def test_a_cancel_request_is_never_followed_by_another_run(
    row: InFlight, knows: bool | None
) -> None:
    if row.cancel_requested:
        assert _decide(row, knows) not in (Verdict.REDISPATCH, Verdict.OUTCOME_UNKNOWN) or (
            row.status is TaskStatus.DISPATCHED and knows is False
        )


@settings(max_examples=300)
@given(rows, knowledge)
def test_a_running_attempt_with_a_live_lease_is_never_touched(
    row: InFlight, knows: bool | None
) -> None:
    if row.status is TaskStatus.RUNNING and not _past_margin(row):
        assert _decide(row, knows) is Verdict.KEEP


@settings(max_examples=300)
@given(written_rows(), knowledge, st.floats(0, 1000))
def test_a_decision_to_act_does_not_go_away_with_time(
    row: InFlight, knows: bool | None, later_s: float
) -> None:
    """Time only makes things more overdue: what needed repair still does later, the
    same way. (With the ack timeout shorter than the lease, as the configuration
    requires: a never-delivered dispatch is recognised before its lease runs out.)"""
    now = _decide(row, knows)
    later = _decide(row, knows, NOW + timedelta(seconds=later_s))
    if now is not Verdict.KEEP:
        assert later is now


@settings(max_examples=300)
@given(rows, knowledge)
def test_every_action_is_a_legal_move_with_a_matching_attempt_state(
    row: InFlight, knows: bool | None
) -> None:
    decision = _decision(row, knows)
    expected = {
        Verdict.REDISPATCH: (TaskStatus.PRELOADED, AttemptState.ABANDONED),
        Verdict.CANCEL: (TaskStatus.CANCELLED, AttemptState.CANCELLED),
        Verdict.OUTCOME_UNKNOWN: (TaskStatus.OUTCOME_UNKNOWN, AttemptState.OUTCOME_UNKNOWN),
        Verdict.KEEP: (None, None),
    }
    assert (decision.target, decision.attempt_state) == expected[decision.verdict]
    assert (decision.cause is None) == (decision.verdict is Verdict.KEEP)


# ---- when the next pass runs ------------------------------------------------------------------


def _scan(next_expiry_in_s: float | None) -> Scan:
    expiry = None if next_expiry_in_s is None else NOW + timedelta(seconds=next_expiry_in_s)
    return Scan(NOW, [], next_expiry=expiry)


def _gap(scan: Scan | None, *, since_start_s: float = 0.0, since_scan_s: float = 0.0) -> float:
    return next_pass_in_s(
        scan,
        interval_s=5.0,
        lease_s=LEASE_S,
        lease_margin_s=MARGIN_S,
        since_start_s=since_start_s,
        since_scan_s=since_scan_s,
        ack_timeout_s=ACK_S,
    )


def test_the_next_pass_is_at_the_next_expiry_plus_the_margin_when_that_is_sooner() -> None:
    assert _gap(_scan(1.5)) == pytest.approx(3.5)
    assert _gap(_scan(1.5), since_start_s=0.2, since_scan_s=0.1) == pytest.approx(3.4)
    # Later than the interval: the interval wins, counted from the pass's start.
    assert _gap(_scan(20.0), since_start_s=0.5) == pytest.approx(4.5)
    assert _gap(_scan(None), since_start_s=0.5) == pytest.approx(4.5)
    assert _gap(None) == pytest.approx(5.0)


def test_the_gap_is_never_negative_nor_a_busy_loop() -> None:
    # A lease already inside its margin (expired a moment ago), and an overrun pass.
    assert _gap(_scan(-MARGIN_S)) == MIN_PASS_GAP_S
    assert _gap(_scan(None), since_start_s=60.0) == MIN_PASS_GAP_S


def test_a_lease_shorter_than_the_interval_caps_the_gap() -> None:
    # A task dispatched right after this pass expires one lease later: the next pass
    # must see it before then.
    gap = next_pass_in_s(
        None,
        interval_s=5.0,
        lease_s=4.0,
        lease_margin_s=1.0,
        since_start_s=0.0,
        ack_timeout_s=ACK_S,
    )
    assert gap == pytest.approx(4.0)


@settings(max_examples=300)
@given(
    st.one_of(st.none(), st.floats(-10, 100)),
    st.floats(0, 10),
    st.floats(0, 10),
)
def test_a_pass_is_never_late_for_an_expiry_it_saw(
    expiry_in_s: float | None, since_start_s: float, since_scan_s: float
) -> None:
    gap = _gap(_scan(expiry_in_s), since_start_s=since_start_s, since_scan_s=since_scan_s)
    assert MIN_PASS_GAP_S <= gap <= 5.0
    if expiry_in_s is not None:
        due_in_s = expiry_in_s + MARGIN_S - since_scan_s
        assert gap <= max(MIN_PASS_GAP_S, due_in_s) + 1e-6  # timedelta: microseconds


@settings(max_examples=300)
@given(
    st.one_of(st.none(), st.floats(-10, 100)),
    st.floats(0, 10),
    st.floats(0, 10),
)
def test_a_pass_wakes_for_an_ack_deadline_it_saw_but_not_before_it(
    ack_due_in_s: float | None, since_start_s: float, since_scan_s: float
) -> None:
    """An intent never delivered (its owner crashed after the commit) is given back at
    its ack deadline: the loop wakes then, not at the next regular pass — and not
    earlier, or the row would still be inside its ack timeout and be kept."""
    due = None if ack_due_in_s is None else NOW + timedelta(seconds=ack_due_in_s)
    scan = Scan(NOW, [], next_ack_due=due)
    gap = _gap(scan, since_start_s=since_start_s, since_scan_s=since_scan_s)
    regular = _gap(None, since_start_s=since_start_s)
    assert MIN_PASS_GAP_S <= gap <= regular
    if ack_due_in_s is not None and gap < regular and gap > MIN_PASS_GAP_S:
        assert gap >= ack_due_in_s - since_scan_s - 1e-6


def test_an_undelivered_intent_is_looked_at_just_after_its_ack_timeout_runs_out() -> None:
    scan = Scan(NOW, [], next_ack_due=NOW + timedelta(seconds=1.5))
    assert _gap(scan) == pytest.approx(1.5 + ACK_DEADLINE_SLACK_S)
    assert _gap(Scan(NOW, [])) == pytest.approx(5.0)


def test_after_a_break_of_the_database_a_pass_comes_once_it_was_steady_for_the_ack_timeout() -> (
    None
):
    # Rows the break held back are due then, not at the next regular pass.
    assert _gap(Scan(NOW, [], steady_s=ACK_S - 2.0)) == pytest.approx(2.0 + ACK_DEADLINE_SLACK_S)
    assert _gap(Scan(NOW, [], steady_s=ACK_S - 2.0), since_scan_s=0.5) == pytest.approx(
        1.5 + ACK_DEADLINE_SLACK_S
    )
    # Steady long enough (or a break longer ago than the interval matters): the interval.
    assert _gap(Scan(NOW, [], steady_s=ACK_S)) == pytest.approx(5.0)
    assert _gap(Scan(NOW, [], steady_s=1.0)) == pytest.approx(5.0)


# ---- workflow runs --------------------------------------------------------------------------


def test_workflow_outcome() -> None:
    S = TaskStatus
    assert workflow_outcome({S.COMPLETED}) is RunState.SUCCEEDED
    assert workflow_outcome(set()) is RunState.SUCCEEDED
    assert workflow_outcome({S.COMPLETED, S.CANCELLED}) is RunState.CANCELLED
    assert workflow_outcome({S.CANCELLED, S.DEAD_LETTER}) is RunState.FAILED
    assert workflow_outcome({S.COMPLETED, S.UPSTREAM_FAILED}) is RunState.FAILED


@given(st.sets(st.sampled_from(list(TaskStatus))))
def test_a_run_with_a_live_task_is_never_finished(statuses: set[TaskStatus]) -> None:
    live = statuses - {
        TaskStatus.COMPLETED,
        TaskStatus.CANCELLED,
        TaskStatus.DEAD_LETTER,
        TaskStatus.UPSTREAM_FAILED,
    }
    assert (workflow_outcome(statuses) is None) == bool(live)


# ---- the shell, over fakes ------------------------------------------------------------------


class FakeRuns:
    def __init__(self, rows: list[InFlight], runs: list[RunCandidate] | None = None) -> None:
        self.rows = rows
        self.runs = runs or []
        self.repaired: list[Repair] = []
        self.finished: list[RunOutcome] = []
        self.applied_only: set[uuid.UUID] | None = None
        self.scanned_shards: list[int] = []

    async def scan_inflight(
        self,
        shards: Collection[int],
        *,
        ack_timeout_s: float,
        lease_s: float,
        lease_margin_s: float,
        limit: int,
    ) -> Scan:
        self.scanned_shards = sorted(shards)
        mine = [r for r in self.rows if r.timer.shard in shards]
        live = [
            r.lease_expires_at
            for r in mine
            if r.lease_expires_at is not None
            and r.lease_expires_at > NOW - timedelta(seconds=lease_margin_s)
        ]
        return Scan(NOW, mine[:limit], next_expiry=min(live, default=None), outcome_unknown=4)

    async def repair(self, epochs: Mapping[int, int], repairs: Sequence[Repair]) -> RepairResult:
        self.repaired.extend(repairs)
        applied = [
            r for r in repairs if self.applied_only is None or r.row.timer.id in self.applied_only
        ]
        return RepairResult(
            ready=[r.row.timer for r in applied if r.decision.verdict is Verdict.REDISPATCH],
            cancelled=[r.row.timer.id for r in applied if r.decision.verdict is Verdict.CANCEL],
            unknown=[
                r.row.timer.id for r in applied if r.decision.verdict is Verdict.OUTCOME_UNKNOWN
            ],
            applied=frozenset(r.row.timer.id for r in applied),
            lost_shards=frozenset(),
        )

    async def scan_runs(
        self, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[RunCandidate]:
        return self.runs

    async def finish_runs(
        self, epochs: Mapping[int, int], outcomes: Sequence[RunOutcome]
    ) -> tuple[list[uuid.UUID], frozenset[int]]:
        self.finished.extend(outcomes)
        return [o.id for o in outcomes], frozenset()


class FakeShards:
    def __init__(self, epochs: dict[int, int]) -> None:
        self._epochs = epochs
        self.lost: list[int] = []

    def epochs(self) -> Mapping[int, int]:
        return self._epochs

    def dispatch_allowed(self) -> bool:
        return True

    def epochs_lost(self, shards: Collection[int]) -> None:
        self.lost.extend(shards)


class FakeSessions:
    def __init__(self, known: dict[uuid.UUID, bool | None]) -> None:
        self.known = known
        self.superseded: list[tuple[uuid.UUID, int]] = []

    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None:
        return self.known.get(task_id)

    def attempt_superseded(self, task_id: uuid.UUID, token: int) -> None:
        self.superseded.append((task_id, token))


class FakeWheel:
    def __init__(self) -> None:
        self.ready: list[TimerTask] = []

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None:
        self.ready.extend(tasks)


SHARDS = 4


def _reconciler(
    runs: FakeRuns, sessions: FakeSessions, epochs: dict[int, int] | None = None
) -> tuple[Reconciler, FakeWheel, FakeShards]:
    wheel = FakeWheel()
    shards = FakeShards(epochs if epochs is not None else {s: 7 for s in range(SHARDS)})
    reconciler = Reconciler(
        SchedulerConfig(), FakeClock(NOW), runs, shards, sessions, wheel, shard_count=SHARDS
    )
    return reconciler, wheel, shards


class AskedSessions(FakeSessions):
    """Sessions that also record how they were asked."""

    def __init__(self, known: dict[uuid.UUID, bool | None]) -> None:
        super().__init__(known)
        self.asked: list[tuple[str, uuid.UUID, int, float]] = []

    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None:
        self.asked.append((worker_id, task_id, token, min_age_s))
        return super().knows(worker_id, task_id, token, min_age_s=min_age_s)


def test_a_plan_asks_the_sessions_only_with_the_ack_timeout_as_the_age_to_vouch() -> None:
    never_sent = _row(untouched_s=ACK_S + 1)
    held = _row(untouched_s=ACK_S + 1)
    unowned = replace(_row(untouched_s=ACK_S + 1), worker_id=None)
    healthy = _row(status=TaskStatus.RUNNING, lease_in_s=25)
    sessions = AskedSessions({never_sent.timer.id: False, held.timer.id: True})
    scan = Scan(NOW, [never_sent, held, unowned, healthy])

    repairs = plan_repairs(scan, sessions, ack_timeout_s=ACK_S, lease_margin_s=MARGIN_S)

    # Only the attempt a session vouches was never sent is given back; the rest wait for
    # their leases.
    assert [(r.row, r.decision) for r in repairs] == [
        (never_sent, _decision(never_sent, knows=False))
    ]
    assert [(worker, task) for worker, task, _, _ in sessions.asked] == [
        ("w-1", never_sent.timer.id),
        ("w-1", held.timer.id),
        ("w-1", healthy.timer.id),
    ]
    assert {(token, age) for _, _, token, age in sessions.asked} == {(3, ACK_S)}


async def test_a_pass_repairs_what_it_decided_and_feeds_the_wheel() -> None:
    unacked = _row(untouched_s=ACK_S + 1)
    expired = _row(status=TaskStatus.RUNNING, lease_in_s=-5, idempotent=True)
    lost = _row(status=TaskStatus.RUNNING, lease_in_s=-5)
    cancelled = _row(status=TaskStatus.RUNNING, lease_in_s=-5, cancel_requested=True)
    inside_margin = _row(status=TaskStatus.RUNNING, lease_in_s=-1, idempotent=True)
    healthy = _row(status=TaskStatus.RUNNING, lease_in_s=25)
    runs = FakeRuns([unacked, expired, lost, cancelled, inside_margin, healthy])
    sessions = FakeSessions({unacked.timer.id: False})
    reconciler, wheel, _ = _reconciler(runs, sessions)

    report = await reconciler.reconcile_once()

    acted = {unacked.timer.id, expired.timer.id, lost.timer.id, cancelled.timer.id}
    assert {r.row.timer.id for r in runs.repaired} == acted
    assert {t.id for t in wheel.ready} == {unacked.timer.id, expired.timer.id}
    assert (report.redispatched, report.cancelled, report.outcome_unknown) == (2, 1, 1)
    # The gauge: what the scan counted (4) plus what this pass added.
    assert reconciler.outcome_unknown == 5
    assert reconciler.get_stats()["abandoned_unacknowledged"] == 1
    assert reconciler.get_stats()["abandoned_lease_expired"] == 1
    assert reconciler.get_stats()["cancelled"] == 1
    assert reconciler.get_stats()["outcome_unknown"] == 1
    assert {t for t, _ in sessions.superseded} == acted
    # The lease inside its margin (expired 1 s ago) is due in 1 s: the next pass then.
    assert report.next_pass_in_s == pytest.approx(MARGIN_S - 1, abs=0.05)


async def test_a_lost_compare_and_set_feeds_nothing_to_the_wheel() -> None:
    expired = _row(status=TaskStatus.RUNNING, lease_in_s=-5, idempotent=True)
    runs = FakeRuns([expired])
    runs.applied_only = set()  # a completion landed between the read and the write
    sessions = FakeSessions({})
    reconciler, wheel, _ = _reconciler(runs, sessions)
    report = await reconciler.reconcile_once()
    assert wheel.ready == [] and sessions.superseded == []
    assert report.lost_races == 1 and reconciler.get_stats()["lost_races"] == 1


async def test_only_owned_shards_are_scanned_and_no_shards_means_no_work() -> None:
    runs = FakeRuns([_row(lease_in_s=-5, idempotent=True, shard=2)])
    reconciler, wheel, _ = _reconciler(runs, FakeSessions({}), epochs={1: 5, 3: 5})
    await reconciler.reconcile_once()
    assert runs.scanned_shards == [1, 3] and runs.repaired == [] and wheel.ready == []
    idle, _, _ = _reconciler(runs, FakeSessions({}), epochs={})
    assert (await idle.reconcile_once()).examined == 0


async def test_finished_runs_of_owned_shards_are_made_terminal() -> None:
    ids = [uuid.uuid4() for _ in range(40)]
    mine = {i for i in ids if shard_of(i, SHARDS) in (0, 1)}
    candidates = [
        RunCandidate(i, NOW, frozenset({TaskStatus.COMPLETED, TaskStatus.DEAD_LETTER})) for i in ids
    ]
    live = uuid.uuid4()
    candidates.append(RunCandidate(live, NOW, None))
    runs = FakeRuns([], candidates)
    reconciler, _, _ = _reconciler(runs, FakeSessions({}), epochs={0: 1, 1: 1})
    report = await reconciler.reconcile_once()
    assert {o.id for o in runs.finished} == mine
    assert {o.state for o in runs.finished} <= {RunState.FAILED}
    assert all(o.shard in (0, 1) for o in runs.finished)
    assert report.runs_finished == len(mine)


@pytest.mark.parametrize("knows", [True, None])
async def test_an_unacknowledged_dispatch_is_kept_while_it_may_be_delivered(
    knows: bool | None,
) -> None:
    row = _row(untouched_s=ACK_S + 1)
    runs = FakeRuns([row])
    reconciler, wheel, _ = _reconciler(runs, FakeSessions({row.timer.id: knows}))
    await reconciler.reconcile_once()
    assert runs.repaired == [] and wheel.ready == []


async def test_a_full_batch_is_followed_by_the_next_pass_at_once() -> None:
    rows = [_row(status=TaskStatus.RUNNING, lease_in_s=-5, idempotent=True) for _ in range(3)]
    runs = FakeRuns(rows)
    config = SchedulerConfig()
    config = replace(config, reconcile=replace(config.reconcile, batch_limit=2))
    reconciler = Reconciler(
        config,
        FakeClock(NOW),
        runs,
        FakeShards({s: 7 for s in range(SHARDS)}),
        FakeSessions({}),
        FakeWheel(),
        shard_count=SHARDS,
    )
    report = await reconciler.reconcile_once()
    assert report.examined == 2 and report.next_pass_in_s == MIN_PASS_GAP_S
