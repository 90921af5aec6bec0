"""Bounded packing (``chronoshard.batching``): runs of items, and queued stream messages
into batches, with plain values for messages: sizes are given, a batch is a tuple."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given
from hypothesis import strategies as st

from chronoshard.batching import chunk, pack, take_queued

Message = tuple[str, int]  # (name, size in bytes)


def _size(m: object) -> int:
    return m[1] if isinstance(m, tuple) and isinstance(m[1], int) else 0


def _wrap(run: list[object]) -> object:
    return ("batch", run)


def _flatten(packed: list[object]) -> list[object]:
    out: list[object] = []
    for item in packed:
        if isinstance(item, tuple) and item[0] == "batch":
            out.extend(item[1])
        else:
            out.append(item)
    return out


messages = st.lists(st.tuples(st.text(max_size=3), st.integers(0, 500)), max_size=60)


@given(messages, st.integers(1, 10), st.integers(1, 2000))
def test_chunks_keep_every_item_in_order_in_as_few_runs_as_the_bounds_allow(
    msgs: list[Message], max_items: int, max_bytes: int
) -> None:
    runs = chunk(msgs, _size, max_items=max_items, max_bytes=max_bytes)
    assert [m for run in runs for m in run] == msgs
    for run in runs:
        assert 1 <= len(run) <= max_items
        assert len(run) == 1 or sum(_size(m) for m in run) <= max_bytes
    # Greedy: each run was closed because its successor's first item did not fit.
    for run, after in itertools.pairwise(runs):
        assert len(run) == max_items or sum(_size(m) for m in run) + _size(after[0]) > max_bytes


@given(messages, st.integers(1, 10), st.integers(1, 2000))
def test_packing_wraps_each_chunk_of_two_or_more(
    msgs: list[Message], max_messages: int, max_bytes: int
) -> None:
    runs = chunk(msgs, _size, max_items=max_messages, max_bytes=max_bytes)
    assert pack(msgs, _size, _wrap, max_messages=max_messages, max_bytes=max_bytes) == [
        run[0] if len(run) == 1 else _wrap(run) for run in runs
    ]


@given(messages, st.integers(1, 10), st.integers(1, 2000))
def test_packing_keeps_every_message_in_order_within_the_bounds(
    msgs: list[Message], max_messages: int, max_bytes: int
) -> None:
    packed = pack(msgs, _size, _wrap, max_messages=max_messages, max_bytes=max_bytes)
    assert _flatten(packed) == msgs
    for item in packed:
        if isinstance(item, tuple) and item[0] == "batch":
            run = item[1]
            assert 2 <= len(run) <= max_messages
            assert sum(_size(m) for m in run) <= max_bytes
    assert len(packed) <= max(len(msgs), 0)


@given(messages)
def test_packing_with_room_for_everything_makes_one_message(msgs: list[Message]) -> None:
    packed = pack(msgs, _size, _wrap, max_messages=1000, max_bytes=10**9)
    assert len(packed) == min(len(msgs), 1)


def test_a_run_may_fill_both_bounds_exactly() -> None:
    msgs = [("a", 40), ("b", 60), ("c", 1), ("d", 0), ("e", 0)]
    assert chunk(msgs, _size, max_items=3, max_bytes=100) == [
        [("a", 40), ("b", 60)],
        [("c", 1), ("d", 0), ("e", 0)],
    ]


def test_a_message_over_the_byte_bound_goes_alone() -> None:
    msgs = [("a", 10), ("huge", 5000), ("b", 10), ("c", 10)]
    assert pack(msgs, _size, _wrap, max_bytes=100) == [
        ("a", 10),
        ("huge", 5000),
        ("batch", [("b", 10), ("c", 10)]),
    ]


async def test_take_queued_takes_what_is_there_up_to_the_limit() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(1, 6):
        queue.put_nowait(n)
    assert take_queued(0, queue, 4) == [0, 1, 2, 3]
    assert take_queued(9, queue, 10) == [9, 4, 5]
    assert queue.empty()
