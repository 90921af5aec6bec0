"""HandlerSlots (worker/_slots.py) against a model: never more holders than slots, turns
given in the order they were asked for, a withdrawn turn never given, none once closed."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.worker._slots import HandlerSlots

OPS = st.lists(
    st.sampled_from(["enter", "enter", "leave", "withdraw", "close"]).flatmap(
        lambda op: st.tuples(st.just(op), st.integers(0, 1000))
    ),
    max_size=60,
)


@given(slots=st.integers(1, 4), ops=OPS)
def test_turns_match_the_model(slots: int, ops: list[tuple[str, int]]) -> None:
    asyncio.run(_play(slots, ops))


async def _play(slots: int, ops: list[tuple[str, int]]) -> None:
    real = HandlerSlots(slots)
    turns: list[asyncio.Future[None]] = []
    # The model: what each turn should be ("waiting", "given", "cancelled").
    state: list[str] = []
    queue: deque[int] = deque()
    holders: list[int] = []
    free, closed = slots, False
    for op, pick in ops:
        if op == "enter":
            turns.append(real.enter())
            if closed:
                state.append("cancelled")
            elif free > 0:
                free -= 1
                state.append("given")
                holders.append(len(turns) - 1)
            else:
                state.append("waiting")
                queue.append(len(turns) - 1)
        elif op == "leave" and holders:
            holders.pop(pick % len(holders))
            real.leave()
            if queue:
                nxt = queue.popleft()
                state[nxt] = "given"
                holders.append(nxt)
            else:
                free += 1
        elif op == "withdraw" and queue:
            i = queue[pick % len(queue)]
            queue.remove(i)
            real.withdraw(turns[i])
            state[i] = "cancelled"
        elif op == "close":
            real.close()
            closed = True
            for i in queue:
                state[i] = "cancelled"
            queue.clear()
        assert [_state(t) for t in turns] == state
        assert real.in_use == slots - free <= slots
        assert real.waiting == len(queue)


def _state(turn: asyncio.Future[None]) -> str:
    if turn.cancelled():
        return "cancelled"
    return "given" if turn.done() else "waiting"


def test_a_withdrawn_turn_that_was_given_gives_its_slot_to_the_next() -> None:
    async def play() -> None:
        slots = HandlerSlots(1)
        first, second = slots.enter(), slots.enter()
        slots.withdraw(first)
        assert second.done() and slots.in_use == 1

    asyncio.run(play())


def test_giving_back_a_slot_not_taken_is_an_error() -> None:
    async def leave_unheld() -> None:
        HandlerSlots(1).leave()

    with pytest.raises(RuntimeError, match="not taken"):
        asyncio.run(leave_unheld())
