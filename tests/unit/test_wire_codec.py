"""The Timestamp/Duration codec of ``chronoshard.wire``, against protobuf's own conversions
and exact arithmetic, and the policy each of the three converters keeps around it."""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chronoshard import _convert as client_convert
from chronoshard import wire
from chronoshard.scheduler.api import convert as scheduler_convert
from chronoshard.scheduler.api.task_requests import MAX_DELAY_S
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.v1 import common_pb2
from chronoshard.worker import _convert as worker_convert
from chronoshard.worker._models import TaskRef

OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
AWARE = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=OFFSETS
)
NAIVE = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31))
# Wall times within a day of the ends of datetime's range, in any zone: their instant may
# lie before 0001-01-01Z or after 9999-12-31Z, which no Timestamp holds.
AT_THE_ENDS = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(1, 1, 2), timezones=OFFSETS),
    st.datetimes(
        min_value=datetime(9999, 12, 30),
        max_value=datetime(9999, 12, 31, 23, 59, 59, 999999),
        timezones=OFFSETS,
    ),
)
NANOS = st.integers(0, 999_999_999)
# 2**22 s (48 days): below it a float resolves a nanosecond (half an ulp < 0.5 ns).
NANOSECOND_EXACT_S = 2**22
# 2**23 s (97 days): below it the scheduler's answers for values stored from whole
# microseconds are the very Durations its microsecond writer sent.
AS_BEFORE_S = 2**23


def from_datetime(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def from_nanoseconds(nanos: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(nanos)
    return d


def outcome(convert: Callable[[], Any]) -> object:
    """What a call returns, or the type and text of what it raises."""
    try:
        return convert()
    except (ValueError, OverflowError, TypeError) as exc:
        return (type(exc), str(exc))


def at_the_edges_of_a_timestamp(test: Callable[..., None]) -> Callable[..., None]:
    """Examples on both sides of every bound of a Timestamp that a datetime holds."""
    for seconds, nanos in [
        (wire.MIN_TIMESTAMP_SECONDS, 0),  # 0001-01-01T00:00:00Z
        (wire.MIN_TIMESTAMP_SECONDS - 1, 999_999_999),
        (wire.MAX_TIMESTAMP_SECONDS, 999_999_999),  # 9999-12-31T23:59:59.999999999Z
        (wire.MAX_TIMESTAMP_SECONDS + 1, 0),
        (0, -1),
        (0, 1_000_000_000),
    ]:
        test = example(seconds=seconds, nanos=nanos)(test)
    return test


# --- timestamps --------------------------------------------------------------------------


@settings(max_examples=300)
@given(AWARE)
def test_an_aware_instant_is_written_as_from_datetime_writes_it(value: datetime) -> None:
    assert wire.timestamp_to_pb(value) == from_datetime(value.astimezone(UTC))


@settings(max_examples=200)
@given(NAIVE)
def test_a_naive_datetime_is_written_as_utc_like_from_datetime(value: datetime) -> None:
    assert wire.timestamp_to_pb(value) == from_datetime(value)
    assert wire.timestamp_to_pb(value) == wire.timestamp_to_pb(value.replace(tzinfo=UTC))


@settings(max_examples=300)
@given(AT_THE_ENDS)
def test_an_instant_at_the_ends_is_written_or_refused_as_protobuf_does(value: datetime) -> None:
    assert outcome(lambda: wire.timestamp_to_pb(value)) == outcome(lambda: from_datetime(value))


@pytest.mark.parametrize(
    "value",
    [
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),  # 10000-01-01Z
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),  # 0000-12-31Z
    ],
)
def test_an_instant_no_timestamp_holds_raises_protobufs_error(value: datetime) -> None:
    with pytest.raises((OverflowError, ValueError)) as raised:
        from_datetime(value)
    with pytest.raises(type(raised.value), match=re.escape(str(raised.value))):
        wire.timestamp_to_pb(value)


@settings(max_examples=300)
@at_the_edges_of_a_timestamp
@given(
    seconds=st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.integers(wire.MIN_TIMESTAMP_SECONDS - 10, wire.MAX_TIMESTAMP_SECONDS + 10),
    ),
    nanos=st.one_of(NANOS, st.integers(-(2**31), 2**31 - 1)),
)
def test_a_timestamp_is_read_as_to_datetime_reads_it(seconds: int, nanos: int) -> None:
    ts = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    assert outcome(lambda: wire.timestamp_from_pb(ts)) == outcome(lambda: ts.ToDatetime(tzinfo=UTC))


@settings(max_examples=200)
@given(AWARE)
def test_an_instant_comes_back_as_itself_in_utc(value: datetime) -> None:
    back = wire.timestamp_from_pb(wire.timestamp_to_pb(value))
    # Compared in UTC: == across zones is False for wall times in a DST gap or fold.
    assert back == value.astimezone(UTC)
    assert back.tzinfo is UTC


def test_the_epoch_is_where_timestamps_count_from() -> None:
    assert wire.timestamp_to_pb(wire.UNIX_EPOCH) == timestamp_pb2.Timestamp()
    assert from_datetime(datetime(1970, 1, 1)).ToDatetime(tzinfo=UTC) == wire.UNIX_EPOCH


# --- durations ---------------------------------------------------------------------------


FINITE_SECONDS = st.floats(
    min_value=-float(wire.MAX_DURATION_SECONDS),
    max_value=float(wire.MAX_DURATION_SECONDS),
    allow_nan=False,
)


@settings(max_examples=500)
@example(0.0)
@example(-0.5)
@example(1.5e-9)
@example(315_360_000.000001)
@given(st.one_of(FINITE_SECONDS, st.floats(-1e9, 1e9), st.floats(-10.0, 10.0)))
def test_a_duration_is_the_nanosecond_nearest_the_float(seconds: float) -> None:
    written = wire.duration_to_pb(seconds)
    nanos = written.ToNanoseconds()
    # Exact arithmetic: the float's own value, not seconds * 1e9 (rounded at 2**53).
    assert abs(Decimal(nanos) - Decimal(seconds) * 1_000_000_000) <= Decimal("0.500001")
    assert written == from_nanoseconds(nanos)  # protobuf's sign rule for negatives


@settings(max_examples=300)
@given(st.integers(0, NANOSECOND_EXACT_S * 10**9 - 1), st.integers(0, 9))
def test_a_duration_written_with_nine_decimals_goes_as_that_nanosecond(
    nanos: int, places: int
) -> None:
    """What people write (``1.5``, ``0.25``, ``86400.000001``) is sent exactly, as the
    client and the SDK sent it before (``round(seconds * 1e9)`` nanoseconds)."""
    unit = 10 ** (9 - places)
    nanos -= nanos % unit
    seconds = (nanos // unit) / 10**places
    assert wire.duration_to_pb(seconds) == from_nanoseconds(nanos)
    assert from_nanoseconds(round(seconds * 1e9)) == from_nanoseconds(nanos)


@settings(max_examples=500)
@example(seconds=int(MAX_DELAY_S), nanos=999_999_999)
@example(seconds=315_360_000, nanos=1000)
@given(st.integers(0, int(MAX_DELAY_S)), NANOS)
def test_a_stored_duration_is_answered_as_the_float_it_is(seconds: int, nanos: int) -> None:
    """The scheduler stores ``duration_seconds`` of what a request sent (and fingerprints
    it): every Duration it answers reads back as that very float, and below 2**22 s is
    the request's own Duration."""
    request = duration_pb2.Duration(seconds=seconds, nanos=nanos)
    stored = wire.duration_seconds(request)
    answer = wire.duration_to_pb(stored)
    assert wire.duration_seconds(answer) == stored
    if stored < NANOSECOND_EXACT_S:
        assert answer == request


@settings(max_examples=300)
@given(st.integers(0, AS_BEFORE_S - 1), st.integers(0, 999_999))
def test_a_stored_whole_microsecond_is_answered_as_before(seconds: int, micros: int) -> None:
    """The scheduler answered through timedelta (microseconds) before the codec: for a
    value stored from whole microseconds (every default, every configured or µs-precise
    duration) the nanosecond answer is the same Duration, below 97 days. Above, it reads
    back as the same float (the test above) where the microsecond one may not."""
    stored = wire.duration_seconds(duration_pb2.Duration(seconds=seconds, nanos=micros * 1000))
    before = duration_pb2.Duration()
    before.FromTimedelta(timedelta(seconds=stored))
    assert wire.duration_to_pb(stored) == before


@settings(max_examples=300)
@given(st.integers(-wire.MAX_DURATION_SECONDS, wire.MAX_DURATION_SECONDS), NANOS)
def test_reading_a_duration_is_within_an_ulp_of_its_nanoseconds(seconds: int, nanos: int) -> None:
    """``seconds + nanos / 1e9`` is the float the scheduler always stored; the client and
    the SDK read ``ToNanoseconds() / 1e9`` before, which differs by one ulp at most."""
    d = from_nanoseconds(seconds * 10**9 + (nanos if seconds >= 0 else -nanos))
    read = wire.duration_seconds(d)
    assert read == d.seconds + d.nanos / 1e9
    assert abs(read - d.ToNanoseconds() / 1e9) <= math.ulp(read)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_duration_that_is_no_number_fails_as_round_fails(bad: float) -> None:
    with pytest.raises((OverflowError, ValueError)) as raised:
        round(bad)
    with pytest.raises(type(raised.value), match=re.escape(str(raised.value))):
        wire.duration_to_pb(bad)


@pytest.mark.parametrize("huge", [1e300, -1e300, 2.0**63])
def test_a_duration_past_protobufs_range_raises_protobufs_error(huge: float) -> None:
    with pytest.raises(ValueError) as raised:
        from_nanoseconds(int(huge) * 10**9)
    with pytest.raises(ValueError, match=re.escape(str(raised.value))):
        wire.duration_to_pb(huge)


# --- each converter's policy around the codec --------------------------------------------


@pytest.fixture
def local_time_kolkata() -> Iterator[None]:
    """The host's local time zone set to UTC+05:30 (POSIX TZ, no tz database needed)."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "IST-5:30"
    time.tzset()
    yield
    if saved is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = saved
    time.tzset()


@settings(max_examples=200)
@given(AWARE)
def test_the_scheduler_writes_its_instants_with_the_codec(value: datetime) -> None:
    assert scheduler_convert.ts_to_pb(value) == wire.timestamp_to_pb(value)


def test_the_scheduler_reads_a_naive_datetime_as_local_time(local_time_kolkata: None) -> None:
    naive = datetime(2026, 12, 1, 12, 0)
    assert scheduler_convert.ts_to_pb(naive) == from_datetime(datetime(2026, 12, 1, 6, 30))


@settings(max_examples=200)
@given(AWARE)
def test_the_scheduler_reads_requests_as_to_datetime_does(value: datetime) -> None:
    ts = from_datetime(value.astimezone(UTC))
    assert scheduler_convert.ts_from_pb(ts, "scheduled_at") == ts.ToDatetime(tzinfo=UTC)


@settings(max_examples=200)
@at_the_edges_of_a_timestamp
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


@settings(max_examples=200)
@given(st.integers(0, int(MAX_DELAY_S)), NANOS)
def test_the_scheduler_stores_request_durations_as_the_codec_reads_them(
    seconds: int, nanos: int
) -> None:
    d = duration_pb2.Duration(seconds=seconds, nanos=nanos)
    assert scheduler_convert.duration_from_pb(d, "timeout") == seconds + nanos / 1e9
    assert scheduler_convert.duration_to_pb(seconds + nanos / 1e9) == wire.duration_to_pb(
        wire.duration_seconds(d)
    )


@settings(max_examples=200)
@given(AWARE)
def test_the_client_writes_and_reads_with_the_codec(value: datetime) -> None:
    assert client_convert.timestamp(value, "at") == wire.timestamp_to_pb(value)
    task = common_pb2.Task(due_at=wire.timestamp_to_pb(value))
    assert client_convert._datetime(task, "due_at") == wire.timestamp_from_pb(task.due_at)


@settings(max_examples=50)
@given(NAIVE)
def test_the_client_refuses_a_naive_datetime_naming_the_argument(value: datetime) -> None:
    with pytest.raises(ValueError, match=r"^at must be a timezone-aware datetime"):
        client_convert.timestamp(value, "at")


@settings(max_examples=200)
@given(FINITE_SECONDS)
def test_the_client_sends_and_reads_durations_with_the_codec(seconds: float) -> None:
    written = client_convert.duration(seconds, "timeout_s")
    assert written == wire.duration_to_pb(seconds)
    task = common_pb2.Task(timeout=written)
    assert client_convert._seconds(task, "timeout") == wire.duration_seconds(written)


@settings(max_examples=200)
@given(st.one_of(AWARE, NAIVE))
def test_the_sdk_writes_a_naive_datetime_as_utc(value: datetime) -> None:
    ref = TaskRef(id=str(uuid.uuid4()), scheduled_at=value)
    sent = worker_convert.task_ref_to_pb(ref)
    assert sent.scheduled_at == wire.timestamp_to_pb(value)
    utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    assert worker_convert.task_ref_from_pb(sent).scheduled_at == utc
