"""What a failed attempt leads to: retry after backoff, dead letter, or cancelled.

Pure: the store locks the task row, hands its retry budget here with ``now``, and
writes the answer. The rules (docs/architecture.md#d4, #d7):

* a task whose cancel was requested ends CANCELLED, whatever the failure: a cancelled
  task is never retried;
* a retryable failure (an error or a timeout) with retries left goes to RETRYING, its
  ``due_at`` moved by exponential backoff with deterministic jitter (seeded by the task
  id, so re-evaluating never moves it); ``scheduled_at`` never moves;
* anything else goes to DEAD_LETTER.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from chronoshard.scheduler.core.backoff import retry_delay_s
from chronoshard.scheduler.core.states import AttemptState, TaskStatus

RETRY_JITTER_FRACTION = 0.5
"""Equal jitter: a retry waits between half and all of the exponential delay."""


@dataclass(frozen=True, slots=True)
class RetryBudget:
    task_id: uuid.UUID
    retry_count: int
    max_retries: int
    backoff_initial_s: float
    backoff_max_s: float
    backoff_multiplier: float
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class FailureReport:
    retryable: bool
    timed_out: bool
    cancelled: bool


@dataclass(frozen=True, slots=True)
class FailureDecision:
    status: TaskStatus
    attempt_state: AttemptState
    retry_count: int
    due_at: datetime | None
    """The new due time for a retry; None leaves it as it was."""


def decide(budget: RetryBudget, report: FailureReport, now: datetime) -> FailureDecision:
    if budget.cancel_requested:
        return FailureDecision(
            TaskStatus.CANCELLED, AttemptState.CANCELLED, budget.retry_count, None
        )
    attempt_state = AttemptState.TIMED_OUT if report.timed_out else AttemptState.FAILED
    if (report.retryable or report.timed_out) and budget.retry_count < budget.max_retries:
        retry = budget.retry_count + 1
        delay_s = retry_delay_s(
            retry,
            initial_s=budget.backoff_initial_s,
            max_s=budget.backoff_max_s,
            multiplier=budget.backoff_multiplier,
            jitter_fraction=RETRY_JITTER_FRACTION,
            seed=budget.task_id.bytes,
        )
        return FailureDecision(
            TaskStatus.RETRYING, attempt_state, retry, now + timedelta(seconds=delay_s)
        )
    return FailureDecision(TaskStatus.DEAD_LETTER, attempt_state, budget.retry_count, None)
