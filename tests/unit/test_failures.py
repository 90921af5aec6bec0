"""Failure decisions: retry with backoff until the budget is spent, never retry a cancel."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.retry import FailureReport, RetryBudget, decide
from chronoshard.scheduler.core.states import AttemptState, TaskStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TASK = uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057")


def budget(retry_count: int, max_retries: int, cancel: bool = False) -> RetryBudget:
    return RetryBudget(TASK, retry_count, max_retries, 1.0, 60.0, 2.0, cancel)


ERROR = FailureReport(retryable=True, timed_out=False, cancelled=False)


def test_error_with_retries_left_goes_to_retrying_with_backoff() -> None:
    decision = decide(budget(0, 2), ERROR, NOW)
    assert decision.status is TaskStatus.RETRYING
    assert decision.attempt_state is AttemptState.FAILED
    assert decision.retry_count == 1
    assert decision.due_at is not None
    # First retry: base 1 s with equal jitter, so between 0.5 s and 1 s.
    assert NOW + timedelta(seconds=0.5) <= decision.due_at <= NOW + timedelta(seconds=1)


def test_spent_budget_goes_to_dead_letter() -> None:
    decision = decide(budget(2, 2), ERROR, NOW)
    assert decision.status is TaskStatus.DEAD_LETTER
    assert decision.retry_count == 2
    assert decision.due_at is None


def test_non_retryable_error_goes_straight_to_dead_letter() -> None:
    report = FailureReport(retryable=False, timed_out=False, cancelled=False)
    assert decide(budget(0, 5), report, NOW).status is TaskStatus.DEAD_LETTER


def test_timeout_is_a_retryable_failure_recorded_as_timed_out() -> None:
    report = FailureReport(retryable=False, timed_out=True, cancelled=False)
    decision = decide(budget(0, 1), report, NOW)
    assert decision.status is TaskStatus.RETRYING
    assert decision.attempt_state is AttemptState.TIMED_OUT


def test_requested_cancel_wins_over_retry() -> None:
    decision = decide(budget(0, 5, cancel=True), ERROR, NOW)
    assert decision.status is TaskStatus.CANCELLED
    assert decision.attempt_state is AttemptState.CANCELLED


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=20))
def test_a_task_runs_exactly_max_retries_plus_one_times(max_retries: int) -> None:
    retry_count, runs, due = 0, 0, NOW
    while True:
        runs += 1
        decision = decide(budget(retry_count, max_retries), ERROR, due)
        if decision.status is TaskStatus.DEAD_LETTER:
            break
        assert decision.due_at is not None and decision.due_at > due
        retry_count, due = decision.retry_count, decision.due_at
    assert runs == max_retries + 1
