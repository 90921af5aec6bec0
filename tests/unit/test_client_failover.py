"""The client's failover policy (chronoshard._failover): which target a call goes to, and
which failed calls go on to another target."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoshard._failover import (
    Hold,
    Send,
    TargetState,
    choose,
    may_try_another,
    repeatable,
    state_of,
)

R, C, F, X = TargetState.READY, TargetState.CONNECTING, TargetState.FAILING, TargetState.CLOSED

states_lists = st.lists(st.sampled_from(list(TargetState)), min_size=1, max_size=6)


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[TargetState], int, set[int]]:
    states = draw(states_lists)
    start = draw(st.integers(0, len(states) - 1))
    tried = draw(st.sets(st.integers(0, len(states) - 1)))
    return states, start, tried


@given(situations())
def test_choose_follows_its_rules(situation: tuple[list[TargetState], int, set[int]]) -> None:
    states, start, tried = situation
    choice = choose(states, start, tried)
    untried = [i for i in range(len(states)) if i not in tried]
    ready = [i for i in untried if states[i] is R]
    if ready:
        # The first connected untried target counting round from start.
        assert isinstance(choice, Send)
        assert choice.index == min(ready, key=lambda i: (i - start) % len(states))
    elif any(states[i] is C for i in untried):
        assert choice is Hold.WAIT
    else:
        assert choice is Hold.GIVE_UP


@given(states_lists)
def test_a_call_tries_each_target_at_most_once(states: list[TargetState]) -> None:
    tried: set[int] = set()
    while isinstance(choice := choose(states, 0, tried), Send):
        assert choice.index not in tried and states[choice.index] is R
        tried.add(choice.index)
    assert tried == {i for i, s in enumerate(states) if s is R}


def test_round_robin_over_connected_targets_skips_the_dead() -> None:
    states = [R, F, R]
    picks = [choose(states, start % 3, set()) for start in range(6)]
    assert picks == [Send(0), Send(2), Send(2), Send(0), Send(2), Send(2)]


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([F, F, F], Hold.GIVE_UP),  # every node down: fail at once, nothing sent
        ([F, C, F], Hold.WAIT),  # one may be connecting: wait for it
        ([C, C], Hold.WAIT),  # a new client
        ([X], Hold.GIVE_UP),
    ],
)
def test_without_a_connected_target(states: list[TargetState], expected: Hold) -> None:
    assert choose(states, 0, set()) is expected


def test_channel_states() -> None:
    conn = grpc.ChannelConnectivity
    assert [
        state_of(s)
        for s in (conn.IDLE, conn.CONNECTING, conn.READY, conn.TRANSIENT_FAILURE, conn.SHUTDOWN)
    ] == [C, C, R, F, X]


@pytest.mark.parametrize(
    ("method", "keyed", "expected"),
    [
        ("GetTask", False, True),
        ("ListTasks", False, True),
        ("CancelTask", False, True),
        ("SubmitTask", True, True),
        ("SubmitTask", False, False),
        ("SubmitBatch", True, True),
        ("SubmitBatch", False, False),
        ("RetryTask", True, False),
        ("GetSchedule", False, True),
        ("ListSchedules", False, True),
        ("PauseSchedule", False, True),
        ("CreateSchedule", True, False),
        ("UpdateSchedule", True, False),
        ("ResumeSchedule", True, False),
        ("DeleteSchedule", True, False),
        ("TriggerSchedule", True, False),
        ("BackfillSchedule", True, False),
        ("SomethingNew", True, False),
    ],
)
def test_which_calls_may_be_repeated(method: str, keyed: bool, expected: bool) -> None:
    assert repeatable(method, keyed=keyed) is expected


@given(st.sampled_from(list(grpc.StatusCode)), st.booleans())
def test_only_unavailable_goes_on_and_only_when_repeatable(
    code: grpc.StatusCode, may_repeat: bool
) -> None:
    assert may_try_another(code, repeatable=may_repeat) is (
        code is grpc.StatusCode.UNAVAILABLE and may_repeat
    )
