"""The arithmetic timestamp and duration conversions (scheduler, worker SDK, client) give
exactly what protobuf's own FromDatetime / ToDatetime / FromTimedelta give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf import duration_pb2, timestamp_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard import _convert as client_convert
from chronoshard.scheduler import convert as scheduler_convert
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
