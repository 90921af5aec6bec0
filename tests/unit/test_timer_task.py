"""TimerTask stores its fields compactly (issue 14, target 7) and reads them back as given:
the id as its int, the shard and the instants packed into one int with the number of
the repeated fields' shared tuple; a wheel holds the two ints and gets the timer back."""

from __future__ import annotations

import sys
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from fixtures.timers import AT, timer_task
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.core import runs
from chronoshard.scheduler.core.models import Priority, TaskRef
from chronoshard.scheduler.core.runs import Interner, TimerTask, epoch_us, packed_shard

# Every instant a datetime can hold and read back: from the first day of year 1 to the
# last of 9999 (a UTC-7:30 instant late on 9999-12-31 is in year 10000 in UTC).
INSTANTS = st.datetimes(
    min_value=datetime(1, 1, 1),
    max_value=datetime(9999, 12, 31, 16, 29, 59, 999999),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30))]),
)


@given(
    task_id=st.uuids(),
    scheduled_at=INSTANTS,
    # None: due_at is scheduled_at (no jitter); else any other instant, before or after
    # (a jitter, or a retry due long after the scheduled instant).
    due_at=st.one_of(st.none(), INSTANTS),
    now=INSTANTS,
    shard=st.one_of(st.integers(0, 32767), st.integers(-(2**70), 2**70)),
    priority=st.sampled_from(list(Priority)),
    strict=st.booleans(),
)
def test_fields_read_back_equal_to_those_given_and_survive_packing(
    task_id: uuid.UUID,
    scheduled_at: datetime,
    due_at: datetime | None,
    now: datetime,
    shard: int,
    priority: Priority,
    strict: bool,
) -> None:
    tenant = uuid.UUID(int=abs(shard) % 1000)
    due = scheduled_at if due_at is None else due_at
    timer = TimerTask(task_id, scheduled_at, shard, tenant, priority, "q", "t", due, strict)
    packed = timer.pack()
    assert isinstance(packed, int)  # the traits have a number: the wheel holds an int
    assert packed_shard(packed) == shard
    for read in (timer, TimerTask.unpack(timer.id_int, packed)):
        assert (read.id, read.id_int, read.shard) == (task_id, task_id.int, shard)
        # Built without UUID.__init__: a UUID in every respect.
        rebuilt = uuid.UUID(int=task_id.int)
        assert type(read.id) is uuid.UUID and hash(read.id) == hash(rebuilt)
        assert (str(read.id), read.id.is_safe, read.id.version) == (
            str(rebuilt),
            rebuilt.is_safe,
            rebuilt.version,
        )
        assert read.scheduled_at == scheduled_at and read.scheduled_at.tzinfo is UTC
        assert read.due_at == due and read.due_at.tzinfo is UTC
        # What the dispatcher computes from due_at_us instead of datetimes, to the bit.
        assert read.due_at_us / 1_000_000 == due.timestamp()
        assert (read.due_at_us - epoch_us(now)) / 1_000_000 == (due - now).total_seconds()
        assert (read.tenant_id, read.priority, read.queue, read.type) == (
            tenant,
            priority,
            "q",
            "t",
        )
        assert read.strict_timing is strict
        assert read.ref == TaskRef(scheduled_at, task_id)
        assert read == timer and hash(read) == hash(timer)
    same = TimerTask(
        uuid.UUID(str(task_id)), scheduled_at, shard, tenant, priority, "q", "t", due, strict
    )
    assert same == timer and hash(same) == hash(timer)
    assert repr(task_id) in repr(timer) and f"shard={shard}," in repr(timer)


def test_timers_differing_in_any_field_are_not_equal() -> None:
    timer = timer_task()
    others = [
        timer_task(id=uuid.uuid4(), tenant_id=timer.tenant_id),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, shard=1),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, scheduled_at=AT + timedelta(1)),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, due_at=AT + timedelta(seconds=1)),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, due_at=AT - timedelta(seconds=1)),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, priority=Priority.BULK),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, queue="other"),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, type="other"),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, strict_timing=False),
    ]
    assert timer == timer_task(id=timer.id, tenant_id=timer.tenant_id)
    assert all(other != timer for other in others)
    assert all(TimerTask.unpack(other.id_int, other.pack()) != timer for other in others)


def test_timers_share_what_they_repeat_and_cannot_be_changed() -> None:
    tenant = uuid.uuid4()
    first = timer_task(tenant_id=tenant, queue="".join(["de", "fault"]))
    second = timer_task(tenant_id=uuid.UUID(str(tenant)), queue="".join(["defa", "ult"]))
    assert first._traits is second._traits  # one tuple for both
    assert TimerTask.unpack(second.id_int, second.pack())._traits is first._traits
    with pytest.raises(AttributeError):
        first.shard = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        first.extra = 1  # type: ignore[attr-defined]


def test_a_pending_timer_costs_a_wheel_two_ints_of_48_bytes() -> None:
    # What a node holding a million timers pays per timer beside the wheel's own
    # entry (bench/README.md, "Memory per pending timer"): the id's int and the packed
    # int, each within pymalloc's 48-byte class, for any instant and any shard a
    # cluster may have (config: at most 32,767).
    for at, shard in [(AT, 0), (datetime(1, 1, 1, tzinfo=UTC), 32767)]:
        timer = timer_task(scheduled_at=at, due_at=datetime(9999, 12, 31, tzinfo=UTC), shard=shard)
        packed = timer.pack()
        assert isinstance(packed, int)
        assert sys.getsizeof(packed) <= 48 and sys.getsizeof(timer.id_int) <= 48


def test_past_the_traits_bound_a_timer_is_held_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    numbered = timer_task()
    # A table already full: the next combination of traits gets no number.
    full: Interner[object] = Interner(1)
    full.get(("someone else's traits",))
    monkeypatch.setattr(runs, "_TRAITS", full)
    unnumbered = timer_task(id=numbered.id, tenant_id=numbered.tenant_id)
    assert unnumbered.pack() is unnumbered  # an int could not name its traits
    assert TimerTask.unpack(unnumbered.id_int, unnumbered.pack()) is unnumbered
    assert packed_shard(unnumbered.pack()) == unnumbered.shard
    # The same fields, with or without a number: equal timers.
    assert unnumbered == numbered and hash(unnumbered) == hash(numbered)
    assert (unnumbered.tenant_id, unnumbered.queue, unnumbered.type) == (
        numbered.tenant_id,
        numbered.queue,
        numbered.type,
    )


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(TypeError):
        timer_task(scheduled_at=datetime(2030, 1, 1))
