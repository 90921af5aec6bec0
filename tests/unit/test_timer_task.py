"""TimerTask stores its fields compactly (issue 14, target 7) and reads them back as given:
the id as its int, the instants as microseconds, the repeated fields as one shared tuple."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from fixtures.timers import AT, timer_task
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.core.models import Priority, TaskRef
from chronoshard.scheduler.core.runs import TimerTask

INSTANTS = st.datetimes(
    min_value=datetime(1971, 1, 1),
    max_value=datetime(9000, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30))]),
)


@given(
    task_id=st.uuids(),
    scheduled_at=INSTANTS,
    jitter=st.one_of(st.just(timedelta(0)), st.timedeltas(timedelta(0), timedelta(days=1))),
    shard=st.integers(0, 100_000),
    priority=st.sampled_from(list(Priority)),
    strict=st.booleans(),
)
def test_fields_read_back_equal_to_those_given(
    task_id: uuid.UUID,
    scheduled_at: datetime,
    jitter: timedelta,
    shard: int,
    priority: Priority,
    strict: bool,
) -> None:
    tenant = uuid.UUID(int=shard)
    timer = TimerTask(
        task_id, scheduled_at, shard, tenant, priority, "q", "t", scheduled_at + jitter, strict
    )
    assert (timer.id, timer.id_int, timer.shard) == (task_id, task_id.int, shard)
    # Built without UUID.__init__: a UUID in every respect.
    rebuilt = uuid.UUID(int=task_id.int)
    assert type(timer.id) is uuid.UUID and hash(timer.id) == hash(rebuilt)
    assert (str(timer.id), timer.id.is_safe, timer.id.version) == (
        str(rebuilt),
        rebuilt.is_safe,
        rebuilt.version,
    )
    assert timer.scheduled_at == scheduled_at and timer.scheduled_at.tzinfo is UTC
    assert timer.due_at == scheduled_at + jitter
    assert (timer.tenant_id, timer.priority, timer.queue, timer.type) == (
        tenant,
        priority,
        "q",
        "t",
    )
    assert timer.strict_timing is strict
    assert timer.ref == TaskRef(scheduled_at, task_id)
    same = TimerTask(
        uuid.UUID(str(task_id)), scheduled_at, shard, tenant, priority, "q", "t",
        scheduled_at + jitter, strict,
    )  # fmt: skip
    assert same == timer and hash(same) == hash(timer)
    assert repr(task_id) in repr(timer) and f"shard={shard}," in repr(timer)


def test_timers_differing_in_any_field_are_not_equal() -> None:
    timer = timer_task()
    others = [
        timer_task(id=uuid.uuid4(), tenant_id=timer.tenant_id),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, shard=1),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, scheduled_at=AT + timedelta(1)),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, due_at=AT + timedelta(seconds=1)),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, priority=Priority.BULK),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, queue="other"),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, type="other"),
        timer_task(id=timer.id, tenant_id=timer.tenant_id, strict_timing=False),
    ]
    assert timer == timer_task(id=timer.id, tenant_id=timer.tenant_id)
    assert all(other != timer for other in others)


def test_timers_share_what_they_repeat_and_cannot_be_changed() -> None:
    tenant = uuid.uuid4()
    first = timer_task(tenant_id=tenant, queue="".join(["de", "fault"]))
    second = timer_task(tenant_id=uuid.UUID(str(tenant)), queue="".join(["defa", "ult"]))
    assert first._traits is second._traits  # one tuple for both
    assert first._due_us is first._scheduled_us  # due_at == scheduled_at: one int
    with pytest.raises(AttributeError):
        first.shard = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        first.extra = 1  # type: ignore[attr-defined]


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(TypeError):
        timer_task(scheduled_at=datetime(2030, 1, 1))
