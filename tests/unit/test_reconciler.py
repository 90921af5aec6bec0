"""The reconciler's decision core (pure, time passed in) and its shell over fakes."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.clock import FakeClock
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.dispatch_store import TimerTask
from chronoshard.scheduler.models import Priority
from chronoshard.scheduler.reconciler import (
    Cause,
    InFlight,
    Reconciler,
    Repair,
    RepairResult,
    RunCandidate,
    RunOutcome,
    RunState,
    Scan,
    Verdict,
    decide,
    next_pass_in,
    workflow_outcome,
)
from chronoshard.scheduler.sharding import shard_of
from chronoshard.scheduler.states import AttemptState, TaskStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ACK_S = 10.0
LEASE_S = 30.0


def _row(
    *,
    status: TaskStatus = TaskStatus.DISPATCHED,
    lease_in_s: float | None = 20.0,
    untouched_s: float = 0.0,
    idempotent: bool = False,
    cancel_requested: bool = False,
    worker_gone: bool = False,
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
        worker_gone=worker_gone,
    )


def _decide(row: InFlight, knows: bool | None = None, now: datetime = NOW) -> Verdict:
    return decide(row, now, ack_timeout_s=ACK_S, knows=knows).verdict


# ---- examples: one per rule of DESIGN §8 ---------------------------------------------------


def test_unacknowledged_dispatch_unknown_to_the_session_is_given_back() -> None:
    row = _row(untouched_s=ACK_S + 1)
    decision = decide(row, NOW, ack_timeout_s=ACK_S, knows=False)
    assert decision.verdict is Verdict.REDISPATCH
    assert decision.target is TaskStatus.PRELOADED
    assert decision.attempt_state is AttemptState.ABANDONED
    assert decision.cause is Cause.UNACKNOWLEDGED


def test_unacknowledged_dispatch_the_session_knows_waits_for_its_lease() -> None:
    assert _decide(_row(untouched_s=ACK_S + 1), knows=True) is Verdict.KEEP


def test_unacknowledged_dispatch_with_no_session_here_waits_unless_the_worker_is_gone() -> None:
    assert _decide(_row(untouched_s=ACK_S + 1), knows=None) is Verdict.KEEP
    gone = _row(untouched_s=ACK_S + 1, worker_gone=True)
    assert _decide(gone, knows=None) is Verdict.REDISPATCH


def test_a_young_dispatch_is_left_alone_even_if_the_session_does_not_know_it() -> None:
    # Between the intent commit and the send, the session does not know it yet.
    assert _decide(_row(untouched_s=ACK_S - 1), knows=False) is Verdict.KEEP


def test_expired_lease_of_an_idempotent_task_is_redispatched() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=-1, idempotent=True)
    decision = decide(row, NOW, ack_timeout_s=ACK_S, knows=True)
    assert decision.verdict is Verdict.REDISPATCH
    assert decision.cause is Cause.LEASE_EXPIRED
    assert decision.target is TaskStatus.PRELOADED


def test_expired_lease_of_a_non_idempotent_task_is_held_until_the_worker_is_gone() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=-1)
    assert _decide(row, knows=True) is Verdict.HOLD
    assert _decide(row, knows=None) is Verdict.HOLD
    assert _decide(replace(row, worker_gone=True), knows=None) is Verdict.REDISPATCH


def test_expired_lease_with_a_cancel_request_ends_cancelled() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=-1, cancel_requested=True)
    decision = decide(row, NOW, ack_timeout_s=ACK_S, knows=True)
    assert decision.verdict is Verdict.CANCEL
    assert decision.target is TaskStatus.CANCELLED
    assert decision.attempt_state is AttemptState.CANCELLED


def test_lease_expiring_exactly_now_counts_as_expired() -> None:
    row = _row(status=TaskStatus.RUNNING, lease_in_s=0, idempotent=True)
    assert _decide(row) is Verdict.REDISPATCH


def test_rows_that_are_not_in_flight_are_never_touched() -> None:
    for status in set(TaskStatus) - {TaskStatus.DISPATCHED, TaskStatus.RUNNING}:
        row = _row(status=status, lease_in_s=-100, idempotent=True, worker_gone=True)
        assert _decide(row, knows=False) is Verdict.KEEP


# ---- properties -----------------------------------------------------------------------------

rows = st.builds(
    _row,
    status=st.sampled_from([TaskStatus.DISPATCHED, TaskStatus.RUNNING]),
    lease_in_s=st.one_of(st.none(), st.floats(-100, 100)),
    untouched_s=st.floats(0, 100),
    idempotent=st.booleans(),
    cancel_requested=st.booleans(),
    worker_gone=st.booleans(),
)
knowledge = st.sampled_from([True, False, None])


@settings(max_examples=300)
@given(rows, knowledge)
def test_a_non_idempotent_task_never_runs_again_while_its_worker_may_hold_it(
    row: InFlight, knows: bool | None
) -> None:
    """The one way to double-run a side effect: re-dispatching an attempt a live worker
    may be executing. Only an unacknowledged dispatch its session never got, or a worker
    gone everywhere, may be given back."""
    verdict = _decide(row, knows)
    if verdict is Verdict.REDISPATCH and not row.idempotent:
        never_delivered = row.status is TaskStatus.DISPATCHED and knows is False
        assert never_delivered or row.worker_gone


@settings(max_examples=300)
@given(rows, knowledge)
def test_a_cancel_request_is_never_followed_by_another_run(
    row: InFlight, knows: bool | None
) -> None:
    if row.cancel_requested:
        assert _decide(row, knows) is not Verdict.REDISPATCH


@settings(max_examples=300)
@given(rows, knowledge)
def test_a_running_attempt_with_a_live_lease_is_never_touched(
    row: InFlight, knows: bool | None
) -> None:
    live = row.lease_expires_at is not None and row.lease_expires_at > NOW
    if row.status is TaskStatus.RUNNING and live:
        assert _decide(row, knows) is Verdict.KEEP


@settings(max_examples=300)
@given(rows, knowledge, st.floats(0, 1000))
def test_a_decision_to_act_does_not_go_away_with_time(
    row: InFlight, knows: bool | None, later_s: float
) -> None:
    """Time only makes things more overdue: what needed repair still does later."""
    now = _decide(row, knows)
    later = _decide(row, knows, NOW + timedelta(seconds=later_s))
    if now is not Verdict.KEEP:
        assert later is not Verdict.KEEP
    if now is Verdict.REDISPATCH or now is Verdict.CANCEL:
        assert later is now


@settings(max_examples=300)
@given(rows, knowledge)
def test_every_action_is_a_legal_move_with_a_matching_attempt_state(
    row: InFlight, knows: bool | None
) -> None:
    decision = decide(row, NOW, ack_timeout_s=ACK_S, knows=knows)
    expected = {
        Verdict.REDISPATCH: (TaskStatus.PRELOADED, AttemptState.ABANDONED),
        Verdict.CANCEL: (TaskStatus.CANCELLED, AttemptState.CANCELLED),
        Verdict.HOLD: (None, None),
        Verdict.KEEP: (None, None),
    }
    assert (decision.target, decision.attempt_state) == expected[decision.verdict]
    assert (decision.cause is None) == (decision.verdict is Verdict.KEEP)


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
        session_timeout_s: float,
        limit: int,
    ) -> Scan:
        self.scanned_shards = sorted(shards)
        return Scan(NOW, [r for r in self.rows if r.timer.shard in shards][:limit])

    async def repair(self, epochs: Mapping[int, int], repairs: Sequence[Repair]) -> RepairResult:
        self.repaired.extend(repairs)
        applied = [
            r for r in repairs if self.applied_only is None or r.row.timer.id in self.applied_only
        ]
        return RepairResult(
            ready=[r.row.timer for r in applied if r.decision.verdict is Verdict.REDISPATCH],
            cancelled=[r.row.timer.id for r in applied if r.decision.verdict is Verdict.CANCEL],
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


async def test_a_pass_repairs_what_it_decided_and_feeds_the_wheel() -> None:
    unacked = _row(untouched_s=ACK_S + 1)
    expired = _row(status=TaskStatus.RUNNING, lease_in_s=-5, idempotent=True)
    stalled = _row(status=TaskStatus.RUNNING, lease_in_s=-5)
    cancelled = _row(status=TaskStatus.RUNNING, lease_in_s=-5, cancel_requested=True)
    healthy = _row(status=TaskStatus.RUNNING, lease_in_s=25)
    runs = FakeRuns([unacked, expired, stalled, cancelled, healthy])
    sessions = FakeSessions({unacked.timer.id: False})
    reconciler, wheel, _ = _reconciler(runs, sessions)

    report = await reconciler.reconcile_once()

    assert {r.row.timer.id for r in runs.repaired} == {
        unacked.timer.id,
        expired.timer.id,
        cancelled.timer.id,
    }
    assert {t.id for t in wheel.ready} == {unacked.timer.id, expired.timer.id}
    assert (report.redispatched, report.cancelled, report.held) == (2, 1, 1)
    assert reconciler.stalled == 1
    assert reconciler.stats["abandoned_unacknowledged"] == 1
    assert reconciler.stats["abandoned_lease_expired"] == 1
    assert reconciler.stats["cancelled"] == 1
    assert {t for t, _ in sessions.superseded} == {
        unacked.timer.id,
        expired.timer.id,
        cancelled.timer.id,
    }


async def test_a_lost_compare_and_set_feeds_nothing_to_the_wheel() -> None:
    expired = _row(status=TaskStatus.RUNNING, lease_in_s=-5, idempotent=True)
    runs = FakeRuns([expired])
    runs.applied_only = set()  # a completion landed between the read and the write
    sessions = FakeSessions({})
    reconciler, wheel, _ = _reconciler(runs, sessions)
    report = await reconciler.reconcile_once()
    assert wheel.ready == [] and sessions.superseded == []
    assert report.lost_races == 1 and reconciler.stats["lost_races"] == 1


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


@given(
    st.floats(0.1, 60),
    st.floats(0, 120),
    st.one_of(st.none(), st.floats(0, 120)),
)
def test_the_next_pass_comes_at_the_interval_or_when_an_ack_is_first_overdue(
    interval_s: float, elapsed_s: float, ack_due_in_s: float | None
) -> None:
    delay = next_pass_in(interval_s, elapsed_s, ack_due_in_s)
    assert 0 <= delay <= max(0.0, interval_s - elapsed_s)
    if ack_due_in_s is not None and delay < interval_s - elapsed_s:
        assert delay >= ack_due_in_s, "woken before the row is overdue: it would be kept"


def test_an_undelivered_intent_is_looked_at_when_its_ack_timeout_runs_out() -> None:
    assert next_pass_in(5.0, 0.5, None) == 4.5
    assert next_pass_in(5.0, 0.5, 1.5) == pytest.approx(1.55)
    assert next_pass_in(5.0, 6.0, 1.0) == 0.0  # an overrun pass is followed at once
