"""Planned shard handoff, the pure decisions: when the old owner lets a shard go, what the
incoming owner reads and holds, and the keyset paging both sides use."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.handoff import (
    Cursor,
    IncomingHandoffs,
    OutgoingHandoffs,
    next_cursor,
    workers_ready,
)

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)
T0 = datetime(2026, 5, 1, tzinfo=UTC)
NODES = ["a", "b", "c"]


@dataclass(frozen=True)
class FakeRow:
    id: uuid.UUID
    due_at: datetime


def _rows(offsets: list[int]) -> list[FakeRow]:
    """Rows as the database returns them: ordered by (due_at, id)."""
    rows = [FakeRow(uuid.UUID(int=i + 1), T0 + timedelta(seconds=o)) for i, o in enumerate(offsets)]
    return sorted(rows, key=lambda r: (r.due_at, r.id))


def _page(rows: list[FakeRow], after: Cursor | None, limit: int) -> list[FakeRow]:
    """What a keyset-paged statement answers (sql/runs.sql, read_warm)."""
    return [r for r in rows if after is None or (r.due_at, r.id) > after][:limit]


# ---- paging -----------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(st.lists(st.integers(0, 20), max_size=60), st.integers(1, 10))
def test_paging_by_cursor_reads_every_row_once_nearest_first(
    offsets: list[int], limit: int
) -> None:
    rows = _rows(offsets)  # equal due times are common: the id breaks the tie
    read: list[FakeRow] = []
    cursor: Cursor | None = None
    for _ in range(len(rows) + 2):
        page = _page(rows, cursor, limit)
        read += page
        cursor = next_cursor(page, limit)
        if cursor is None:
            break
    assert read == rows


def test_a_short_or_empty_chunk_is_the_last() -> None:
    rows = _rows([1, 2, 3])
    assert next_cursor(rows, 4) is None
    assert next_cursor([], 1) is None
    assert next_cursor(rows, 3) == (rows[-1].due_at, rows[-1].id)


def test_workers_ready_when_every_worker_the_cluster_sees_is_here() -> None:
    assert workers_ready(set(), set())
    assert workers_ready({"w1"}, {"w1", "w2"})
    assert not workers_ready({"w1", "w2"}, {"w2"})


# ---- the old owner ----------------------------------------------------------------------

steps = st.lists(
    st.tuples(
        st.floats(0, 4, allow_nan=False),  # time passing
        st.dictionaries(st.integers(0, 5), st.sampled_from([*NODES, None]), max_size=6),
        st.dictionaries(st.integers(0, 5), st.sampled_from(NODES), max_size=6),  # ready marks
    ),
    max_size=25,
)


@PROPERTY_SETTINGS
@given(steps, st.floats(0, 6, allow_nan=False))
def test_a_shard_goes_warm_only_to_its_ready_successor_and_never_waits_past_the_bound(
    script: list[tuple[float, dict[int, str | None], dict[int, str]]], wait_s: float
) -> None:
    outgoing = OutgoingHandoffs(wait_s)
    now = 0.0
    # What the model knows: since when each leaving shard has had its current successor.
    since: dict[int, tuple[str | None, float]] = {}
    for dt, leaving, ready in script:
        now += dt
        since = {
            s: since[s] if s in since and since[s][0] == succ else (succ, now)
            for s, succ in leaving.items()
        }
        outgoing.update(leaving, now)
        warm, cold = outgoing.decide(ready, now)
        assert set(warm).isdisjoint(cold)
        assert set(warm) | set(cold) <= set(leaving)
        for shard in warm:
            assert leaving[shard] is not None and ready.get(shard) == leaving[shard]
        for shard in cold:
            assert since[shard][0] is None or now - since[shard][1] >= wait_s
        for shard, (succ, first) in since.items():
            if shard in warm or shard in cold:
                continue
            assert succ is not None, "nobody can warm up: the shard goes at once"
            assert now - first < wait_s, "a shard waited past handoff.wait_s"
            assert ready.get(shard) != succ, "a ready successor was ignored"
        for shard in (*warm, *cold):
            del since[shard]  # let go: the shard manager releases it
            leaving.pop(shard)
        deadline = outgoing.next_deadline()
        if since:
            assert deadline == min(first + wait_s for _, first in since.values())
        else:
            assert deadline is None


def test_a_new_successor_restarts_the_wait_and_an_old_mark_means_nothing() -> None:
    outgoing = OutgoingHandoffs(wait_s=5.0)
    outgoing.update({7: "b"}, now=0.0)
    assert outgoing.decide({}, now=4.0) == ([], [])
    outgoing.update({7: "c"}, now=4.0)  # another node joined and is the target now
    assert outgoing.decide({7: "b"}, now=6.0) == ([], [])  # b's mark is stale
    assert outgoing.decide({}, now=9.0) == ([], [7])
    outgoing.update({3: "b"}, now=10.0)
    assert outgoing.all_now() == [3] and len(outgoing) == 0


def test_a_shard_whose_target_came_back_is_kept() -> None:
    outgoing = OutgoingHandoffs(wait_s=1.0)
    outgoing.update({1: "b"}, now=0.0)
    outgoing.update({}, now=0.5)
    assert 1 not in outgoing
    assert outgoing.decide({1: "b"}, now=2.0) == ([], [])


# ---- the incoming owner -----------------------------------------------------------------


@PROPERTY_SETTINGS
@given(
    st.dictionaries(st.integers(0, 3), st.lists(st.integers(0, 30), max_size=25), max_size=4),
    st.integers(1, 7),
)
def test_warm_up_reads_each_shard_to_the_end_once_then_asks_for_its_mark(
    shards: dict[int, list[int]], limit: int
) -> None:
    tables = {shard: _rows(offsets) for shard, offsets in shards.items()}
    incoming: IncomingHandoffs[FakeRow] = IncomingHandoffs()
    assert incoming.update(tables) == []
    rounds = 0
    while incoming.to_load():
        rounds += 1
        assert rounds <= max((len(t) // limit for t in tables.values()), default=0) + 1
        for shard in incoming.to_load():
            incoming.stage(shard, _page(tables[shard], incoming.cursor(shard), limit), limit)
    assert incoming.to_mark() == sorted(tables)
    for shard in incoming.to_mark():
        incoming.marked(shard)
    assert incoming.to_mark() == []
    for shard, rows in tables.items():
        staged = incoming.take(shard)
        assert list(staged.values()) == rows
        assert shard not in incoming
    assert len(incoming) == 0


def test_dropping_a_marked_shard_says_its_mark_must_go() -> None:
    incoming: IncomingHandoffs[FakeRow] = IncomingHandoffs()
    incoming.update([1, 2, 3])
    incoming.stage(1, [], limit=10)
    incoming.marked(1)
    incoming.stage(2, [], limit=10)
    assert incoming.update([2, 3]) == [1]
    incoming.marked(2)
    assert incoming.clear() == [2]
    incoming.stage(2, _rows([1]), limit=10)  # a chunk that arrives after the drop
    assert incoming.take(2) == {}
