"""What a user reads when a request is refused: plain words, plain units, request values
quoted only in part, and every status message and ErrorInfo bounded (``boundary``)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import duration_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.api import boundary, convert, task_requests
from chronoshard.scheduler.api.auth import bearer_key
from chronoshard.scheduler.api.expectations import spec_from_pb
from chronoshard.scheduler.errors import (
    UNAUTHENTICATED_MESSAGE,
    InvalidArgument,
    Unauthenticated,
    seconds_text,
    shown,
)
from chronoshard.v1 import common_pb2, watchdog_service_pb2
from chronoshard.wire import error_info_from_metadata, error_info_metadata


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (315_360_000, "315360000 s (10 years)"),
        (31_622_400, "31622400 s (366 days)"),
        (86_400, "86400 s (1 day)"),
        (300, "300 s (5 minutes)"),
        (1.5, "1.5 s"),
        (0.000001, "0.000001 s"),
        (90, "90 s"),
    ],
)
def test_durations_read_as_people_write_them(seconds: float, text: str) -> None:
    assert seconds_text(seconds) == text


def _refused(call: Any) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as raised:
        call()
    return raised.value


def test_limits_print_in_plain_units() -> None:
    error = _refused(
        lambda: task_requests.duration_arg_from_pb(duration_pb2.Duration(seconds=10**10), "delay")
    )
    assert str(error) == "delay: must be at most 315360000 s (10 years)"
    request = watchdog_service_pb2.CreateExpectationRequest(
        job_id="j", interval=duration_pb2.Duration(seconds=10**9)
    )
    assert str(_refused(lambda: spec_from_pb(request))) == (
        "interval: must be at most 31622400 s (366 days)"
    )
    assert "e+" not in str(error)


def test_a_request_value_is_quoted_only_in_part() -> None:
    error = _refused(lambda: convert.uuid_from_pb("x" * (1 << 20), "id"))
    assert str(error) == (
        f"id: is not a UUID in canonical text (8-4-4-4-12 hex digits): {'x' * 40!r}... "
        "(1048576 characters)"
    )
    assert shown("short") == "'short'"


@settings(max_examples=100, deadline=None)
@given(message=st.text(min_size=0, max_size=5000), field=st.text(max_size=1000))
def test_every_error_info_is_bounded(message: str, field: str) -> None:
    error = InvalidArgument(field, message)
    info = boundary.error_info(error)
    assert len(info.message.encode("utf-8")) <= boundary.MAX_MESSAGE_BYTES
    assert len(info.field.encode("utf-8")) <= boundary.MAX_FIELD_CHARS
    if len(str(error).encode("utf-8")) <= boundary.MAX_MESSAGE_BYTES:
        assert info.message == str(error)  # short messages are left whole
    # What travels in the trailer parses back, and stays far under the 8 KiB header limit.
    [(key, value)] = error_info_metadata(info)
    assert len(key) + len(value) * 4 // 3 < 2048
    assert error_info_from_metadata([(key, value)]) == info


def test_clip_cuts_at_a_character_boundary() -> None:
    clipped = boundary.clip("é" * 400, 101)
    assert clipped.endswith("...") and len(clipped.encode("utf-8")) <= 101
    assert boundary.clip("plain", 10) == "plain"


def test_undecodable_bytes_name_the_method() -> None:
    info = boundary.malformed("/chronoshard.v1.TaskService/SubmitTask")
    assert info.code == "INVALID_ARGUMENT" and info.reason == "MALFORMED_REQUEST"
    assert "SubmitTask" in info.message


@pytest.mark.parametrize(
    "metadata",
    [(), [("authorization", "Bearer nope")], [("authorization", "Basic x")]],
)
def test_unauthenticated_always_says_the_same(metadata: Any) -> None:
    with pytest.raises(Unauthenticated) as raised:
        bearer_key(metadata)
    assert str(raised.value) == UNAUTHENTICATED_MESSAGE
    assert boundary.error_info(raised.value) == common_pb2.ErrorInfo(
        code="UNAUTHENTICATED", reason="UNAUTHENTICATED", message=UNAUTHENTICATED_MESSAGE
    )
