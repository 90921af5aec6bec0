"""Jitter: fixed per task, inside its window, never before submit, exact in UTC."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.jitter import (
    MAX_WINDOW_S,
    JitterMode,
    jitter_offset_ms,
    jittered_due,
)
from chronoshard.scheduler.errors import InvalidArgument

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
TENANT = uuid.UUID("0190a7d2-0000-7000-8000-000000000001")
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LONG_AGO = AT - timedelta(hours=1)

# Computed once from the documented recipe (BLAKE2b-64 over tenant bytes + task bytes,
# mod 240 000 ms) and frozen: a change here would move every stored due_at on recompute.
FIXED_VECTORS = [
    # task id, offset ms, symmetric due_at, delay-only due_at
    ("00000000-0000-0000-0000-000000000000", 34236, "11:58:34.236", "12:00:34.236"),
    ("00000000-0000-0000-0000-000000000001", 163754, "12:00:43.754", "12:02:43.754"),
    ("0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f", 43578, "11:58:43.578", "12:00:43.578"),
    ("ffffffff-ffff-ffff-ffff-ffffffffffff", 39386, "11:58:39.386", "12:00:39.386"),
    ("123e4567-e89b-42d3-a456-426614174000", 228366, "12:01:48.366", "12:03:48.366"),
]


def _on_march_1(clock: str) -> datetime:
    return datetime.fromisoformat(f"2026-03-01T{clock}+00:00")


@pytest.mark.parametrize(("task_id", "offset_ms", "symmetric", "delay_only"), FIXED_VECTORS)
def test_fixed_vectors(task_id: str, offset_ms: int, symmetric: str, delay_only: str) -> None:
    task = uuid.UUID(task_id)
    assert jitter_offset_ms(TENANT, task, 240_000) == offset_ms
    due = jittered_due(AT, TENANT, task, mode=JitterMode.SYMMETRIC, submitted_at=LONG_AGO)
    assert due == _on_march_1(symmetric)
    due = jittered_due(AT, TENANT, task, mode=JitterMode.DELAY_ONLY, submitted_at=LONG_AGO)
    assert due == _on_march_1(delay_only)


def test_the_tenant_is_part_of_the_hash() -> None:
    task = uuid.UUID("0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f")
    other_tenant = uuid.UUID(int=TENANT.int + 1)
    assert jitter_offset_ms(TENANT, task, 240_000) != jitter_offset_ms(other_tenant, task, 240_000)


def test_none_leaves_scheduled_at_alone_even_in_the_past() -> None:
    due = jittered_due(AT, TENANT, uuid.UUID(int=7), mode=JitterMode.NONE, submitted_at=AT)
    assert due == AT
    past = jittered_due(LONG_AGO, TENANT, uuid.UUID(int=7), mode=JitterMode.NONE, submitted_at=AT)
    assert past == LONG_AGO


def test_clamped_to_submit_time() -> None:
    # This task's symmetric offset is -85.764 s; submitted 10 s before its time, it must
    # not be due before it was submitted.
    task = uuid.UUID(int=0)
    submitted = AT - timedelta(seconds=10)
    due = jittered_due(AT, TENANT, task, mode=JitterMode.SYMMETRIC, submitted_at=submitted)
    assert due == submitted


def test_zero_window_means_no_jitter() -> None:
    due = jittered_due(
        AT, TENANT, uuid.UUID(int=0), window_s=0, mode=JitterMode.SYMMETRIC, submitted_at=LONG_AGO
    )
    assert due == AT


def test_window_is_counted_in_whole_milliseconds() -> None:
    # 0.0004 s rounds to a zero-ms window; 0.0016 s to 2 ms, so symmetric offsets are -1, 0.
    task = uuid.UUID(int=0)
    tiny = jittered_due(
        AT, TENANT, task, window_s=0.0004, mode=JitterMode.SYMMETRIC, submitted_at=LONG_AGO
    )
    assert tiny == AT
    small = jittered_due(
        AT, TENANT, task, window_s=0.0016, mode=JitterMode.SYMMETRIC, submitted_at=LONG_AGO
    )
    assert small - AT in (timedelta(milliseconds=-1), timedelta(0))


def test_arithmetic_is_in_elapsed_time_across_a_dst_change() -> None:
    # 01:59 EDT on 2026-11-01 is one minute before New York falls back to 01:00 EST.
    # Adding the offset as wall-clock time would land an hour late; in UTC it is exact.
    new_york = ZoneInfo("America/New_York")
    scheduled = datetime(2026, 11, 1, 1, 59, tzinfo=new_york)
    task = uuid.UUID("123e4567-e89b-42d3-a456-426614174000")  # delay-only offset 228.366 s
    due = jittered_due(scheduled, TENANT, task, mode=JitterMode.DELAY_ONLY, submitted_at=LONG_AGO)
    assert due.tzinfo is UTC
    assert due == datetime(2026, 11, 1, 6, 2, 48, 366_000, tzinfo=UTC)


def test_result_is_utc_whatever_zone_came_in() -> None:
    plus_two = timezone(timedelta(hours=2))
    scheduled = AT.astimezone(plus_two)
    for mode in JitterMode:
        due = jittered_due(scheduled, TENANT, uuid.UUID(int=3), mode=mode, submitted_at=LONG_AGO)
        assert due.tzinfo is UTC


def test_mode_given_as_a_string_is_honoured() -> None:
    task = uuid.UUID(int=0)
    as_str = jittered_due(
        AT,
        TENANT,
        task,
        mode="SYMMETRIC",
        submitted_at=LONG_AGO,  # type: ignore[arg-type]
    )
    assert as_str == jittered_due(
        AT, TENANT, task, mode=JitterMode.SYMMETRIC, submitted_at=LONG_AGO
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"scheduled_at": datetime(2026, 3, 1, 12)}, "scheduled_at"),
        ({"submitted_at": datetime(2026, 3, 1, 11)}, "submitted_at"),
        ({"window_s": -0.001}, "jitter_window_s"),
        ({"window_s": float("nan")}, "jitter_window_s"),
        ({"window_s": float("inf")}, "jitter_window_s"),
        ({"window_s": MAX_WINDOW_S + 1}, "jitter_window_s"),
        ({"mode": "EARLY_ONLY"}, "jitter_mode"),
    ],
)
def test_rejects_invalid_arguments(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {
        "scheduled_at": AT,
        "tenant_id": TENANT,
        "task_id": uuid.UUID(int=1),
        "window_s": 240.0,
        "mode": JitterMode.SYMMETRIC,
        "submitted_at": LONG_AGO,
        **kwargs,
    }
    with pytest.raises(InvalidArgument) as raised:
        jittered_due(**args)  # type: ignore[arg-type]
    assert raised.value.field == field


instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
windows_s = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False)
jittered_modes = st.sampled_from([JitterMode.SYMMETRIC, JitterMode.DELAY_ONLY])


def _offsets(window_s: float, mode: JitterMode) -> tuple[timedelta, timedelta]:
    """The documented offset range, both ends included, before the submit clamp."""
    window_ms = round(window_s * 1000)
    low = -(window_ms // 2) if mode is JitterMode.SYMMETRIC else 0
    high = low + max(window_ms - 1, 0)
    return timedelta(milliseconds=low), timedelta(milliseconds=high)


@PROPERTY_SETTINGS
@given(instants, st.uuids(), st.uuids(), windows_s, st.timedeltas(timedelta(0), timedelta(days=30)))
def test_symmetric_stays_within_half_a_window_and_after_submit(
    scheduled: datetime,
    tenant: uuid.UUID,
    task: uuid.UUID,
    window_s: float,
    lead: timedelta,
) -> None:
    submitted = scheduled - lead
    due = jittered_due(
        scheduled,
        tenant,
        task,
        window_s=window_s,
        mode=JitterMode.SYMMETRIC,
        submitted_at=submitted,
    )
    low, high = _offsets(window_s, JitterMode.SYMMETRIC)
    assert due >= submitted
    assert max(scheduled + low, submitted) <= due <= scheduled + high
    # Half the requested window, give or take rounding the window to whole milliseconds.
    half = timedelta(seconds=window_s / 2, microseconds=500)
    assert -half <= low <= high <= half


@PROPERTY_SETTINGS
@given(
    instants,
    st.uuids(),
    st.uuids(),
    windows_s,
    st.timedeltas(-timedelta(days=1), timedelta(days=1)),
)
def test_delay_only_never_runs_early(
    scheduled: datetime,
    tenant: uuid.UUID,
    task: uuid.UUID,
    window_s: float,
    lead: timedelta,
) -> None:
    submitted = scheduled - lead
    due = jittered_due(
        scheduled,
        tenant,
        task,
        window_s=window_s,
        mode=JitterMode.DELAY_ONLY,
        submitted_at=submitted,
    )
    _, high = _offsets(window_s, JitterMode.DELAY_ONLY)
    assert due >= scheduled
    assert due >= submitted
    # Only the submit-time clamp may push it past the window.
    assert due <= max(scheduled + high, submitted)


@PROPERTY_SETTINGS
@given(
    instants,
    st.uuids(),
    st.uuids(),
    windows_s,
    st.timedeltas(-timedelta(days=1), timedelta(days=1)),
)
def test_strict_is_unchanged(
    scheduled: datetime,
    tenant: uuid.UUID,
    task: uuid.UUID,
    window_s: float,
    lead: timedelta,
) -> None:
    due = jittered_due(
        scheduled,
        tenant,
        task,
        window_s=window_s,
        mode=JitterMode.NONE,
        submitted_at=scheduled - lead,
    )
    assert due == scheduled


@PROPERTY_SETTINGS
@given(
    instants,
    st.uuids(),
    st.uuids(),
    jittered_modes,
    st.timedeltas(-timedelta(days=1), timedelta(days=1)),
)
def test_never_before_submit_and_repeatable(
    scheduled: datetime,
    tenant: uuid.UUID,
    task: uuid.UUID,
    mode: JitterMode,
    lead: timedelta,
) -> None:
    submitted = scheduled - lead
    first = jittered_due(scheduled, tenant, task, mode=mode, submitted_at=submitted)
    assert first >= submitted
    assert first == jittered_due(scheduled, tenant, task, mode=mode, submitted_at=submitted)
