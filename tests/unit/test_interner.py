"""The interner behind the timers' shared fields (core.runs.Interner) and what
timer_from_row shares with it: equal values come back as one object, up to a bound."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.core.runs import Interner
from chronoshard.scheduler.store.runs import timer_from_row


@given(st.lists(st.text(max_size=3)), st.integers(0, 8))
def test_an_interned_value_is_equal_and_shared_while_under_the_bound(
    values: list[str], max_size: int
) -> None:
    interner: Interner[str] = Interner(max_size)
    first_kept: dict[str, str] = {}
    for value in values:
        # A copy, as a row read from the database is a new object each time.
        fresh = "".join(list(value))
        got = interner.get(fresh)
        assert got == value
        if value in first_kept:
            assert got is first_kept[value]
        elif len(first_kept) < max_size:
            first_kept[value] = got
    assert len(interner) == min(len(set(values)), max_size)


@given(st.lists(st.text(max_size=3)), st.integers(0, 8))
def test_kept_values_are_numbered_in_the_order_first_seen(values: list[str], max_size: int) -> None:
    interner: Interner[str] = Interner(max_size)
    numbers = [interner.number("".join(list(value))) for value in values]
    first_seen = list(dict.fromkeys(values))
    kept = first_seen[:max_size]
    assert numbers == [kept.index(v) if v in kept else None for v in values]
    # A number names its value for good, and it is the object get() shares.
    for number, value in enumerate(kept):
        assert interner.value(number) == value
        assert interner.get("".join(list(value))) is interner.value(number)


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        Interner(-1)


def _row(**overrides: object) -> dict[str, object]:
    at = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    row: dict[str, object] = {
        "id": uuid.uuid4(),
        "scheduled_at": at,
        "due_at": datetime.fromisoformat(at.isoformat()),  # equal, another object
        "shard": int("3" + "00"),
        "tenant_id": uuid.UUID(int=7),
        "priority": "standard",
        "queue": "".join(["de", "fault"]),
        "type": "".join(["report.", "daily"]),
        "strict_timing": True,
    }
    row.update(overrides)
    return row


def test_timers_from_rows_share_their_repeated_fields_and_keep_their_values() -> None:
    first, second = timer_from_row(_row()), timer_from_row(_row(tenant_id=uuid.UUID(int=7)))
    assert first.tenant_id is second.tenant_id
    assert first.queue is second.queue and first.type is second.type
    assert first._traits is second._traits
    assert first.due_at == first.scheduled_at
    assert first.priority is Priority.STANDARD
    assert (first.queue, first.type, first.shard) == ("default", "report.daily", 300)
    jittered = timer_from_row(_row(due_at=datetime(2026, 12, 2, 2, 0, 3, 17, tzinfo=UTC)))
    assert jittered.due_at - jittered.scheduled_at == timedelta(seconds=3, microseconds=17)
    assert jittered.scheduled_at == first.scheduled_at == datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    assert first.id != second.id
