"""The arithmetic timestamp and duration conversions (scheduler, worker SDK, client) give
exactly what protobuf's own FromDatetime / ToDatetime / FromTimedelta give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chronoshard import _convert as client_convert
from chronoshard.scheduler.api import convert as scheduler_convert
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.v1 import common_pb2
from chronoshard.worker import _convert as worker_convert

OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
AWARE = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=OFFSETS
)


def reference(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value.astimezone(UTC))
    return ts


@settings(max_examples=200)
@given(AWARE)
def test_writers_match_from_datetime(value: datetime) -> None:
    expected = reference(value)
    assert scheduler_convert.ts_to_pb(value) == expected
    assert worker_convert._timestamp(value) == expected
    assert worker_convert._timestamp(value.astimezone(UTC).replace(tzinfo=None)) == expected
    assert client_convert.timestamp(value, "at") == expected


@settings(max_examples=200)
@given(AWARE)
def test_readers_match_to_datetime(value: datetime) -> None:
    ts = reference(value)
    expected = ts.ToDatetime(tzinfo=UTC)
    assert worker_convert._datetime(ts) == expected
    task = common_pb2.Task(due_at=ts)
    assert client_convert._datetime(task, "due_at") == expected


@settings(max_examples=200)
@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_durations_match_from_timedelta(seconds: float) -> None:
    expected = duration_pb2.Duration()
    expected.FromTimedelta(timedelta(seconds=seconds))
    assert scheduler_convert.duration_to_pb(seconds) == expected


@settings(max_examples=200)
@given(AWARE)
def test_the_scheduler_reads_requests_as_to_datetime_does(value: datetime) -> None:
    ts = reference(value)
    assert scheduler_convert.ts_from_pb(ts, "scheduled_at") == ts.ToDatetime(tzinfo=UTC)


@settings(max_examples=200)
@example(seconds=-62_135_596_800, nanos=0)  # 0001-01-01T00:00:00Z
@example(seconds=-62_135_596_801, nanos=999_999_999)
@example(seconds=253_402_300_799, nanos=999_999_999)  # 9999-12-31T23:59:59.999999999Z
@example(seconds=253_402_300_800, nanos=0)
@example(seconds=0, nanos=-1)
@example(seconds=0, nanos=1_000_000_000)
@given(
    seconds=st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**36), 2**38)),
    nanos=st.integers(-(2**31), 2**31 - 1),
)
def test_the_scheduler_refuses_what_no_datetime_holds_in_its_own_words(
    seconds: int, nanos: int
) -> None:
    ts = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    try:
        expected = ts.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        expected = None
    if expected is not None:
        assert scheduler_convert.ts_from_pb(ts, "scheduled_at") == expected
        return
    with pytest.raises(InvalidArgument) as raised:
        scheduler_convert.ts_from_pb(ts, "scheduled_at")
    assert raised.value.field == "scheduled_at"
    # Never protobuf's "Nanos -1 must be in a range [0, 999999]".
    assert raised.value.message in (
        "is not a valid timestamp: nanos must be 0..999999999",
        "is not a valid timestamp: it must lie between years 0001 and 9999",
    )
