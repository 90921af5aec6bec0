"""The task state machine matches docs/architecture.md#d4 exactly and behaves as a closed system."""

from __future__ import annotations

import re
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.states import (
    TERMINAL,
    TRANSITIONS,
    AttemptState,
    TaskEvent,
    TaskStatus,
    allowed_events,
    sources,
    transition,
)
from chronoshard.scheduler.errors import InvalidTransition
from chronoshard.scheduler.store import queries

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)

# docs/architecture.md#d4, written out again by hand (as strings, the way PostgreSQL stores them) so
# that changing the module's table or the design without the other fails this test.
DESIGN_TABLE: dict[tuple[str, str], str] = {
    # SCHEDULED  -> PRELOADED (preloader, due within lookahead) | CANCELLED
    ("SCHEDULED", "PRELOAD"): "PRELOADED",
    ("SCHEDULED", "CANCEL"): "CANCELLED",
    # blocked by a failed parent: SCHEDULED -> UPSTREAM_FAILED
    ("SCHEDULED", "UPSTREAM_FAIL"): "UPSTREAM_FAILED",
    # PRELOADED  -> DISPATCHED (intent written) | CANCELLED | SCHEDULED (shard handed off)
    ("PRELOADED", "DISPATCH"): "DISPATCHED",
    ("PRELOADED", "CANCEL"): "CANCELLED",
    ("PRELOADED", "HANDOFF"): "SCHEDULED",
    # DISPATCHED -> RUNNING (worker ack) | PRELOADED (lease expired / worker lost /
    #               drained) | CANCELLED
    ("DISPATCHED", "ACK"): "RUNNING",
    ("DISPATCHED", "LEASE_EXPIRED"): "PRELOADED",
    ("DISPATCHED", "RELEASE"): "PRELOADED",
    ("DISPATCHED", "CANCEL"): "CANCELLED",
    # RUNNING -> COMPLETED | RETRYING (error, timeout) | PRELOADED (lease expired, drained
    #            with checkpoint) | CANCELLED (cooperative cancel acknowledged)
    ("RUNNING", "COMPLETE"): "COMPLETED",
    ("RUNNING", "FAIL"): "RETRYING",
    ("RUNNING", "LEASE_EXPIRED"): "PRELOADED",
    ("RUNNING", "RELEASE"): "PRELOADED",
    ("RUNNING", "CANCEL"): "CANCELLED",
    # RETRYING -> PRELOADED (backoff elapsed) | DEAD_LETTER (retries exhausted) | CANCELLED
    ("RETRYING", "BACKOFF_ELAPSED"): "PRELOADED",
    ("RETRYING", "EXHAUST"): "DEAD_LETTER",
    ("RETRYING", "CANCEL"): "CANCELLED",
    # DEAD_LETTER-> SCHEDULED (operator retry, new attempt)
    ("DEAD_LETTER", "OPERATOR_RETRY"): "SCHEDULED",
    # Issue 12 (docs/architecture.md, Decisions): a non-idempotent attempt whose lease ran
    # out unsettled -> OUTCOME_UNKNOWN, left by its own late settlement or an operator.
    ("DISPATCHED", "ATTEMPT_LOST"): "OUTCOME_UNKNOWN",
    ("RUNNING", "ATTEMPT_LOST"): "OUTCOME_UNKNOWN",
    ("OUTCOME_UNKNOWN", "COMPLETE"): "COMPLETED",
    ("OUTCOME_UNKNOWN", "FAIL"): "RETRYING",
    ("OUTCOME_UNKNOWN", "RELEASE"): "PRELOADED",
    ("OUTCOME_UNKNOWN", "OPERATOR_RETRY"): "SCHEDULED",
    ("OUTCOME_UNKNOWN", "OPERATOR_FAIL"): "DEAD_LETTER",
    ("OUTCOME_UNKNOWN", "CANCEL"): "CANCELLED",
    # Issue 16 (docs/architecture.md#d9): RetryWorkflow reopens a finished run's failures.
    ("DEAD_LETTER", "WORKFLOW_RETRY"): "SCHEDULED",
    ("CANCELLED", "WORKFLOW_RETRY"): "SCHEDULED",
    ("UPSTREAM_FAILED", "WORKFLOW_RETRY"): "SCHEDULED",
}
DESIGN_TERMINAL = {"COMPLETED", "CANCELLED", "DEAD_LETTER", "UPSTREAM_FAILED"}

statuses = st.sampled_from(list(TaskStatus))
events = st.sampled_from(list(TaskEvent))


def test_table_is_design_section_4() -> None:
    as_strings = {(str(s), str(e)): str(t) for (s, e), t in TRANSITIONS.items()}
    assert as_strings == DESIGN_TABLE


def test_terminal_states_are_design_section_4() -> None:
    assert {str(s) for s in TERMINAL} == DESIGN_TERMINAL


def test_stored_strings_are_the_member_names() -> None:
    assert [s.value for s in TaskStatus] == [
        "SCHEDULED", "PRELOADED", "DISPATCHED", "RUNNING", "COMPLETED",
        "RETRYING", "DEAD_LETTER", "CANCELLED", "UPSTREAM_FAILED", "OUTCOME_UNKNOWN",
    ]  # fmt: skip
    assert [a.value for a in AttemptState] == [
        "DISPATCHED", "RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT",
        "ABANDONED", "RELEASED", "FENCED", "CANCELLED", "OUTCOME_UNKNOWN",
    ]  # fmt: skip
    assert all(e.value == e.name for e in TaskEvent)


def test_every_event_is_used_by_the_table() -> None:
    assert {e for _, e in TRANSITIONS} == set(TaskEvent)


def test_the_table_cannot_be_modified() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[(TaskStatus.COMPLETED, TaskEvent.CANCEL)] = TaskStatus.SCHEDULED  # type: ignore[index]


@pytest.mark.parametrize(
    ("current", "event"),
    [
        (TaskStatus.SCHEDULED, TaskEvent.DISPATCH),  # must pass through the wheel
        (TaskStatus.PRELOADED, TaskEvent.ACK),
        (TaskStatus.DISPATCHED, TaskEvent.COMPLETE),  # only with implied_ack
        (TaskStatus.DISPATCHED, TaskEvent.HANDOFF),  # in flight: the reconciler owns it
        (TaskStatus.RUNNING, TaskEvent.DISPATCH),
        (TaskStatus.RETRYING, TaskEvent.DISPATCH),
        (TaskStatus.COMPLETED, TaskEvent.CANCEL),
        (TaskStatus.CANCELLED, TaskEvent.OPERATOR_RETRY),
        (TaskStatus.DEAD_LETTER, TaskEvent.CANCEL),
        (TaskStatus.UPSTREAM_FAILED, TaskEvent.OPERATOR_RETRY),
        (TaskStatus.PRELOADED, TaskEvent.UPSTREAM_FAIL),
        (TaskStatus.OUTCOME_UNKNOWN, TaskEvent.ACK),  # a late ack settles nothing
        (TaskStatus.OUTCOME_UNKNOWN, TaskEvent.LEASE_EXPIRED),  # never re-run on its own
        (TaskStatus.PRELOADED, TaskEvent.ATTEMPT_LOST),  # only an attempt can be lost
        (TaskStatus.DEAD_LETTER, TaskEvent.OPERATOR_FAIL),
    ],
)
def test_invalid_moves_raise(current: TaskStatus, event: TaskEvent) -> None:
    with pytest.raises(InvalidTransition) as raised:
        transition(current, event)
    assert raised.value.current == current.value
    assert raised.value.event == event.value


def test_valid_moves_follow_the_table() -> None:
    assert transition(TaskStatus.SCHEDULED, TaskEvent.PRELOAD) is TaskStatus.PRELOADED
    assert transition(TaskStatus.RUNNING, TaskEvent.CANCEL) is TaskStatus.CANCELLED
    assert transition(TaskStatus.DISPATCHED, TaskEvent.LEASE_EXPIRED) is TaskStatus.PRELOADED
    assert transition(TaskStatus.DEAD_LETTER, TaskEvent.OPERATOR_RETRY) is TaskStatus.SCHEDULED


def test_every_status_is_reachable_from_scheduled() -> None:
    seen = {TaskStatus.SCHEDULED}
    queue = deque(seen)
    while queue:
        current = queue.popleft()
        for event in allowed_events(current):
            target = transition(current, event)
            if target not in seen:
                seen.add(target)
                queue.append(target)
    assert seen == set(TaskStatus)


def test_store_sources_for_the_hot_path_writes() -> None:
    assert sources(TaskEvent.DISPATCH) == {TaskStatus.PRELOADED}
    assert sources(TaskEvent.ACK) == {TaskStatus.DISPATCHED}
    # A late Release of an attempt whose outcome became unknown says it never ran (or
    # resumes from its checkpoint): accepted like any other.
    assert sources(TaskEvent.RELEASE) == {
        TaskStatus.DISPATCHED,
        TaskStatus.RUNNING,
        TaskStatus.OUTCOME_UNKNOWN,
    }
    assert sources(TaskEvent.CANCEL) == {
        TaskStatus.SCHEDULED,
        TaskStatus.PRELOADED,
        TaskStatus.DISPATCHED,
        TaskStatus.RUNNING,
        TaskStatus.RETRYING,
        TaskStatus.OUTCOME_UNKNOWN,
    }
    assert sources(TaskEvent.ATTEMPT_LOST) == {TaskStatus.DISPATCHED, TaskStatus.RUNNING}
    assert sources(TaskEvent.OPERATOR_RETRY) == {
        TaskStatus.DEAD_LETTER,
        TaskStatus.OUTCOME_UNKNOWN,
    }
    # The preloader's batch moves both kinds the partial index holds.
    assert sources(TaskEvent.PRELOAD) | sources(TaskEvent.BACKOFF_ELAPSED) == {
        TaskStatus.SCHEDULED,
        TaskStatus.RETRYING,
    }


def test_implied_ack_matches_the_completion_write_of_design_section_5() -> None:
    # docs/architecture.md#d5: "... AND status IN ('DISPATCHED','RUNNING')", plus the late
    # settlement of an attempt whose outcome had become unknown (sql/runs.sql, `complete`).
    assert sources(TaskEvent.COMPLETE) == {TaskStatus.RUNNING, TaskStatus.OUTCOME_UNKNOWN}
    assert sources(TaskEvent.COMPLETE, implied_ack=True) == {
        TaskStatus.DISPATCHED,
        TaskStatus.RUNNING,
        TaskStatus.OUTCOME_UNKNOWN,
    }
    assert sources(TaskEvent.FAIL, implied_ack=True) == {
        TaskStatus.DISPATCHED,
        TaskStatus.RUNNING,
        TaskStatus.OUTCOME_UNKNOWN,
    }
    assert (
        transition(TaskStatus.DISPATCHED, TaskEvent.COMPLETE, implied_ack=True)
        is TaskStatus.COMPLETED
    )
    assert (
        transition(TaskStatus.DISPATCHED, TaskEvent.FAIL, implied_ack=True) is TaskStatus.RETRYING
    )
    # It only composes ACK: nothing else widens.
    assert sources(TaskEvent.DISPATCH, implied_ack=True) == {TaskStatus.PRELOADED}
    with pytest.raises(InvalidTransition):
        transition(TaskStatus.PRELOADED, TaskEvent.COMPLETE, implied_ack=True)


def test_allowed_events_of_terminal_states() -> None:
    assert allowed_events(TaskStatus.COMPLETED) == frozenset()
    assert allowed_events(TaskStatus.CANCELLED) == {TaskEvent.WORKFLOW_RETRY}
    assert allowed_events(TaskStatus.UPSTREAM_FAILED) == {TaskEvent.WORKFLOW_RETRY}
    assert allowed_events(TaskStatus.DEAD_LETTER) == {
        TaskEvent.OPERATOR_RETRY,
        TaskEvent.WORKFLOW_RETRY,
    }


@PROPERTY_SETTINGS
@given(st.lists(events, max_size=60))
def test_random_event_sequences_stay_inside_the_declared_states(
    sequence: list[TaskEvent],
) -> None:
    current = TaskStatus.SCHEDULED
    for event in sequence:
        try:
            after = transition(current, event)
        except InvalidTransition:
            assert event not in allowed_events(current)
            continue
        assert isinstance(after, TaskStatus)
        assert TRANSITIONS[(current, event)] is after
        current = after


@PROPERTY_SETTINGS
@given(st.sampled_from(sorted(TERMINAL)), events, st.booleans())
def test_terminal_states_never_change_except_by_an_operators_retry(
    current: TaskStatus, event: TaskEvent, implied_ack: bool
) -> None:
    reopens = (current, event) == (TaskStatus.DEAD_LETTER, TaskEvent.OPERATOR_RETRY) or (
        event is TaskEvent.WORKFLOW_RETRY and current is not TaskStatus.COMPLETED
    )
    if reopens:
        assert transition(current, event, implied_ack=implied_ack) is TaskStatus.SCHEDULED
    else:
        with pytest.raises(InvalidTransition):
            transition(current, event, implied_ack=implied_ack)


@PROPERTY_SETTINGS
@given(events, st.booleans())
def test_sources_are_exactly_the_states_the_event_leaves(
    event: TaskEvent, implied_ack: bool
) -> None:
    succeeds = set()
    for status in TaskStatus:
        try:
            transition(status, event, implied_ack=implied_ack)
        except InvalidTransition:
            continue
        succeeds.add(status)
    assert sources(event, implied_ack=implied_ack) == succeeds


@PROPERTY_SETTINGS
@given(statuses)
def test_allowed_events_agree_with_transition(status: TaskStatus) -> None:
    for event in TaskEvent:
        allowed = event in allowed_events(status)
        assert allowed == (status in sources(event))


@pytest.mark.parametrize(
    ("statement", "event"),
    [
        ("complete", TaskEvent.COMPLETE),
        ("lock_for_failure", TaskEvent.FAIL),
        ("apply_failures", TaskEvent.FAIL),
        ("release", TaskEvent.RELEASE),
    ],
)
def test_the_settlement_statements_start_from_the_states_the_table_allows(
    statement: str, event: TaskEvent
) -> None:
    """sql/runs.sql spells each settlement's source states out (a partial index needs
    literals): they are the state machine's, with the worker's ack taken as read."""
    text = queries.load("runs.sql")[statement]
    found = re.findall(r"t\.status IN \(([^)]*)\)", text)
    assert found, statement
    listed = {s.strip().strip("'") for s in found[-1].split(",")}
    assert listed == {str(s) for s in sources(event, implied_ack=True)}
