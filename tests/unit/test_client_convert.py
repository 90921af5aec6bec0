"""The client's edge: protobuf <-> user types, request building, validation, error classes.

Pure functions only; the calls over a real gRPC channel are in ``test_client_rpc.py``.
The full-message tests walk the proto descriptors, so a field added to ``Task``,
``TaskAttempt`` or ``SubmitTaskRequest`` fails here until the client maps it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import grpc
import pytest
from google.protobuf import duration_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard import _convert as convert
from chronoshard.errors import (
    AbortedError,
    AlreadyExistsError,
    ChronoshardError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    ResourceExhaustedError,
    StaleFencingTokenError,
    UnauthenticatedError,
    UnavailableError,
    error_for,
    from_rpc_error,
)
from chronoshard.types import (
    AttemptState,
    JitterMode,
    Priority,
    Resolution,
    RetryPolicy,
    SubmitResult,
    Task,
    TaskAttempt,
    TaskSpec,
    TaskStatus,
)
from chronoshard.v1 import common_pb2, task_service_pb2

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
T0 = datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=UTC)
TASK_ID = "0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f"


def _ts(dt: datetime) -> common_pb2.Task:
    return convert.timestamp(dt, "test")


def full_task_pb() -> common_pb2.Task:
    """A Task message with every field set to a non-default value."""
    msg = common_pb2.Task(
        id=TASK_ID,
        tenant_id="0190a7d2-0000-7000-8000-000000000001",
        type="email.send",
        status=common_pb2.TASK_STATUS_DEAD_LETTER,
        priority=common_pb2.PRIORITY_BULK,
        queue="mail",
        payload_json=b'{"to":"a@example.com","n":12345678901234567890}',
        result_json=b'{"ok":true}',
        last_error="smtp timeout",
        attempt=4,
        fencing_token=9,
        retry_count=3,
        max_retries=3,
        strict_timing=True,
        idempotent=True,
        idempotency_key="order-42",
        job_id="nightly-report",
        worker_id="host-1-abc",
        checkpoint=b"\x00\x01opaque",
        shard=17,
        trace_context={"traceparent": "00-abc-def-01", "tracestate": "k=v"},
        workflow_id="wf-1",
        unresolved_dependencies=2,
        schedule_id="sched-1",
        waiting_reason="TENANT_RATE_LIMIT",
    )
    msg.retry_backoff.initial.CopyFrom(duration_pb2.Duration(seconds=1, nanos=500_000_000))
    msg.retry_backoff.max.CopyFrom(duration_pb2.Duration(seconds=60))
    msg.retry_backoff.multiplier = 2.5
    msg.timeout.CopyFrom(duration_pb2.Duration(seconds=30, nanos=250_000_000))
    for offset, name in enumerate(
        (
            "scheduled_at",
            "due_at",
            "lease_expires_at",
            "created_at",
            "updated_at",
            "finished_at",
            "logical_date",
        )
    ):
        getattr(msg, name).CopyFrom(_ts(T0 + timedelta(seconds=offset, microseconds=offset)))
    return msg


def full_attempt_pb() -> common_pb2.TaskAttempt:
    msg = common_pb2.TaskAttempt(
        attempt=2,
        fencing_token=5,
        state=common_pb2.ATTEMPT_STATE_OUTCOME_UNKNOWN,
        worker_id="w-1",
        error="lease expired with no settlement",
        resolution=common_pb2.RESOLUTION_RETRY,
    )
    msg.entered_at.CopyFrom(_ts(T0))
    msg.finished_at.CopyFrom(_ts(T0 + timedelta(seconds=30)))
    return msg


def _unset_fields(msg: object) -> list[str]:
    descriptor = msg.DESCRIPTOR  # type: ignore[attr-defined]
    unset = []
    for field in descriptor.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if not field.is_repeated and not msg.HasField(field.name):  # type: ignore[attr-defined]
                unset.append(field.name)
        elif not value:
            unset.append(field.name)
    return unset


# --- pb <-> types --------------------------------------------------------------------------


def test_sample_sets_every_task_field() -> None:
    # Guards the round-trip tests below: a new proto field must be added to the sample.
    assert _unset_fields(full_task_pb()) == []
    assert _unset_fields(full_attempt_pb()) == []


def test_task_round_trip_pb_types_pb_keeps_every_field() -> None:
    msg = full_task_pb()
    assert convert.task_to_pb(convert.task_from_pb(msg)) == msg


def test_attempt_round_trip_keeps_every_field() -> None:
    msg = full_attempt_pb()
    assert convert.attempt_to_pb(convert.attempt_from_pb(msg)) == msg


def test_task_from_pb_reads_values_as_python_types() -> None:
    task = convert.task_from_pb(full_task_pb(), [full_attempt_pb()])
    assert task.status is TaskStatus.DEAD_LETTER
    assert task.priority is Priority.BULK
    # Integers stay exact: JSON bytes, not a protobuf Struct of doubles.
    assert task.payload == {"to": "a@example.com", "n": 12345678901234567890}
    assert task.result == {"ok": True}
    assert task.scheduled_at == T0 and task.scheduled_at.tzinfo is UTC
    assert task.lease_expires_at == T0 + timedelta(seconds=2, microseconds=2)
    assert task.timeout_s == 30.25
    assert task.retry_policy == RetryPolicy(
        max_retries=3, initial_backoff_s=1.5, max_backoff_s=60.0, multiplier=2.5
    )
    assert task.max_retries == 3
    assert task.trace_context == {"traceparent": "00-abc-def-01", "tracestate": "k=v"}
    assert task.checkpoint == b"\x00\x01opaque"
    assert task.attempts == (
        TaskAttempt(
            attempt=2,
            fencing_token=5,
            state=AttemptState.OUTCOME_UNKNOWN,
            worker_id="w-1",
            entered_at=T0,
            finished_at=T0 + timedelta(seconds=30),
            error="lease expired with no settlement",
            resolution=Resolution.RETRY,
        ),
    )


def test_task_round_trip_types_pb_types() -> None:
    task = convert.task_from_pb(full_task_pb())
    assert convert.task_from_pb(convert.task_to_pb(task)) == task


def test_minimal_task_reads_absent_values_as_none() -> None:
    task = convert.task_from_pb(
        common_pb2.Task(id=TASK_ID, type="t", status=common_pb2.TASK_STATUS_SCHEDULED)
    )
    assert task.payload is None  # a list page without include_payloads
    assert task.result is None
    assert task.scheduled_at is None and task.finished_at is None
    assert task.timeout_s is None
    assert task.idempotency_key is None and task.job_id is None and task.worker_id is None
    assert task.last_error is None and task.checkpoint is None
    assert task.retry_policy == RetryPolicy(max_retries=0)
    # The proto says an unspecified priority means the server applied STANDARD.
    assert task.priority is Priority.STANDARD
    assert task.attempts == ()


@pytest.mark.parametrize(
    ("user_enum", "pb_enum", "prefix", "lower"),
    [
        (TaskStatus, common_pb2.TaskStatus, "TASK_STATUS_", False),
        (Priority, common_pb2.Priority, "PRIORITY_", True),
        (JitterMode, common_pb2.JitterMode, "JITTER_MODE_", True),
        (AttemptState, common_pb2.AttemptState, "ATTEMPT_STATE_", False),
        (Resolution, common_pb2.Resolution, "RESOLUTION_", False),
    ],
)
def test_enums_match_the_proto_one_to_one(
    user_enum: type, pb_enum: object, prefix: str, lower: bool
) -> None:
    proto_names = {
        name.removeprefix(prefix)
        for name in (v.name for v in pb_enum.DESCRIPTOR.values)  # type: ignore[attr-defined]
        if name != prefix + "UNSPECIFIED"
    }
    expected = {n.lower() for n in proto_names} if lower else proto_names
    assert {m.value for m in user_enum} == expected


def test_task_status_matches_design_names() -> None:
    assert [s.value for s in TaskStatus] == [
        "SCHEDULED",
        "PRELOADED",
        "DISPATCHED",
        "RUNNING",
        "COMPLETED",
        "RETRYING",
        "DEAD_LETTER",
        "CANCELLED",
        "UPSTREAM_FAILED",
        "OUTCOME_UNKNOWN",
    ]
    assert {s for s in TaskStatus if s.is_terminal} == {
        TaskStatus.COMPLETED,
        TaskStatus.CANCELLED,
        TaskStatus.DEAD_LETTER,
        TaskStatus.UPSTREAM_FAILED,
    }


@pytest.mark.parametrize("status", [0, 99])
def test_unknown_or_missing_status_is_a_protocol_error(status: int) -> None:
    with pytest.raises(ProtocolError, match="TaskStatus value"):
        convert.task_from_pb(common_pb2.Task(id=TASK_ID, status=status))  # type: ignore[arg-type]


def test_payload_that_is_not_json_is_a_protocol_error() -> None:
    msg = common_pb2.Task(id=TASK_ID, status=common_pb2.TASK_STATUS_SCHEDULED, payload_json=b"{x")
    with pytest.raises(ProtocolError, match="payload_json"):
        convert.task_from_pb(msg)


@PROPERTY_SETTINGS
@given(
    st.datetimes(
        min_value=datetime(1970, 1, 2),
        max_value=datetime(9998, 12, 31),
        timezones=st.sampled_from([UTC, ZoneInfo("Europe/Paris"), timezone(timedelta(hours=-7))]),
    )
)
def test_datetimes_round_trip_exactly_as_utc(value: datetime) -> None:
    back = convert._datetime(common_pb2.TaskAttempt(entered_at=_ts(value)), "entered_at")
    # Compared in UTC: PEP 495 makes == across zones False for wall times in a DST gap/fold.
    assert back == value.astimezone(UTC)
    assert back is not None and back.utcoffset() == timedelta(0)


@PROPERTY_SETTINGS
@given(st.floats(min_value=-1e6, max_value=1e9, allow_nan=False))
def test_durations_round_trip_to_the_nanosecond(seconds: float) -> None:
    msg = common_pb2.Task(timeout=convert.duration(seconds, "timeout_s"))
    back = convert._seconds(msg, "timeout")
    assert back is not None
    assert math.isclose(back, seconds, rel_tol=0, abs_tol=1e-9 + abs(seconds) * 1e-15)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_duration_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="delay_s must be finite"):
        convert.duration(bad, "delay_s")


# --- requests ------------------------------------------------------------------------------


def full_spec(**overrides: object) -> TaskSpec:
    values: dict[str, object] = {
        "type": "email.send",
        "payload": {"to": "é@example.com", "n": [1, 2]},
        "at": datetime(2026, 5, 1, 12, 0, tzinfo=ZoneInfo("Europe/Paris")),
        "priority": Priority.CRITICAL,
        "queue": "mail",
        "max_retries": 5,
        "retry": RetryPolicy(initial_backoff_s=0.5, max_backoff_s=30.0, multiplier=3.0),
        "timeout_s": 90.5,
        "strict_timing": True,
        "jitter": JitterMode.DELAY_ONLY,
        "jitter_window_s": 60.0,
        "idempotent": True,
        "idempotency_key": "k-1",
        "job_id": "job-1",
    }
    values.update(overrides)
    return TaskSpec(**values)  # type: ignore[arg-type]


def test_submit_request_sets_every_field() -> None:
    req = convert.submit_request(full_spec())
    # `delay` is the other branch of the `when` oneof; checked separately below.
    assert _unset_fields(req) == ["delay"]
    assert req.type == "email.send"
    assert req.payload_json == '{"to":"é@example.com","n":[1,2]}'.encode()
    assert req.scheduled_at.ToDatetime(tzinfo=UTC) == datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
    assert req.priority == common_pb2.PRIORITY_CRITICAL
    assert req.queue == "mail"
    assert req.HasField("max_retries") and req.max_retries == 5
    assert req.retry_backoff.initial.ToNanoseconds() == 500_000_000
    assert req.retry_backoff.max.ToNanoseconds() == 30_000_000_000
    assert req.retry_backoff.multiplier == 3.0
    assert req.timeout.ToNanoseconds() == 90_500_000_000
    assert req.strict_timing and req.idempotent
    assert req.jitter_mode == common_pb2.JITTER_MODE_DELAY_ONLY
    assert req.jitter_window.ToNanoseconds() == 60_000_000_000
    assert req.idempotency_key == "k-1" and req.job_id == "job-1"


def test_submit_request_defaults_leave_choices_to_the_server() -> None:
    req = convert.submit_request(TaskSpec(type="t"))
    assert req.payload_json == b""
    assert req.WhichOneof("when") is None
    assert not req.HasField("max_retries")  # unset, not 0: 0 means "never retry"
    assert not req.HasField("retry_backoff") and not req.HasField("timeout")
    assert req.priority == common_pb2.PRIORITY_UNSPECIFIED
    assert req.jitter_mode == common_pb2.JITTER_MODE_UNSPECIFIED


def test_submit_request_with_delay_and_zero_retries() -> None:
    req = convert.submit_request(TaskSpec(type="t", delay_s=2.5, max_retries=0))
    assert req.WhichOneof("when") == "delay"
    assert req.delay.ToNanoseconds() == 2_500_000_000
    assert req.HasField("max_retries") and req.max_retries == 0


def test_retry_policy_max_retries_is_used_when_alone() -> None:
    req = convert.submit_request(TaskSpec(type="t", retry=RetryPolicy(max_retries=7)))
    assert req.max_retries == 7


def test_strings_are_accepted_for_enums() -> None:
    spec = TaskSpec(type="t", priority="bulk", jitter="none")  # type: ignore[arg-type]
    assert spec.priority is Priority.BULK and spec.jitter is JitterMode.NONE


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"at": datetime(2026, 1, 1)}, ValueError, "at must be a timezone-aware"),
        ({"delay_s": 5.0}, ValueError, "at most one of at and delay_s"),
        ({"priority": "urgent"}, ValueError, "priority must be one of 'critical'"),
        ({"jitter": "wide"}, ValueError, "jitter must be one of"),
        ({"retry": RetryPolicy(max_retries=2)}, ValueError, "contradicts"),
        ({"payload": [1, 2]}, TypeError, "payload must be a dict"),
        ({"type": 42}, TypeError, "type must be a str"),
    ],
)
def test_spec_refuses_what_cannot_be_right(
    overrides: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        full_spec(**overrides)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"x": {1, 2}}, "not JSON-serialisable"),
        ({"x": math.nan}, "not JSON-serialisable"),
        ({"x": "\ud800"}, "not JSON-serialisable"),
    ],
)
def test_payload_that_cannot_be_json_is_a_type_error(
    payload: dict[str, object], match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        convert.submit_request(TaskSpec(type="t", payload=payload))


def test_negative_max_retries_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="max_retries must be an int >= 0"):
        convert.submit_request(TaskSpec(type="t", max_retries=-1))


def test_list_request_maps_filters() -> None:
    req = convert.list_request(
        statuses=["RUNNING", TaskStatus.RETRYING],
        type="t",
        queue="q",
        job_id="j",
        scheduled_from=T0,
        scheduled_before=T0 + timedelta(hours=1),
        due_from=None,
        due_before=T0,
        page_size=50,
        page_token="tok",
        include_payloads=True,
    )
    assert list(req.statuses) == [common_pb2.TASK_STATUS_RUNNING, common_pb2.TASK_STATUS_RETRYING]
    assert (req.type, req.queue, req.job_id, req.page_size, req.page_token) == (
        "t",
        "q",
        "j",
        50,
        "tok",
    )
    assert req.scheduled_at.start.ToDatetime(tzinfo=UTC) == T0
    assert req.scheduled_at.end.ToDatetime(tzinfo=UTC) == T0 + timedelta(hours=1)
    assert not req.due_at.HasField("start") and req.due_at.HasField("end")
    assert req.include_payloads


def test_list_request_takes_a_single_status_as_one_status() -> None:
    req = _list(statuses=TaskStatus.DEAD_LETTER)
    assert list(req.statuses) == [common_pb2.TASK_STATUS_DEAD_LETTER]


def test_list_request_refuses_naive_bounds_by_name() -> None:
    with pytest.raises(ValueError, match="due_from must be a timezone-aware"):
        _list(due_from=datetime(2026, 1, 1))


def _list(**kw: object) -> task_service_pb2.ListTasksRequest:
    args: dict[str, object] = dict.fromkeys(
        (
            "statuses",
            "type",
            "queue",
            "job_id",
            "scheduled_from",
            "scheduled_before",
            "due_from",
            "due_before",
            "page_token",
        )
    )
    args.update(page_size=0, include_payloads=False)
    args.update(kw)
    return convert.list_request(**args)  # type: ignore[arg-type]


def test_batch_results_keep_order_and_map_item_errors() -> None:
    ok = task_service_pb2.SubmitTaskResponse(task=full_task_pb(), created=False)
    refused = common_pb2.ErrorInfo(
        code="INVALID_ARGUMENT", reason="PAYLOAD_TOO_LARGE", message="too big", field="payload_json"
    )
    response = task_service_pb2.SubmitBatchResponse(
        results=[
            task_service_pb2.SubmitBatchResult(submitted=ok),
            task_service_pb2.SubmitBatchResult(error=refused),
        ]
    )
    first, second = convert.batch_results_from_pb(response, 2)
    assert not isinstance(first, ChronoshardError) and first.created is False
    assert isinstance(second, InvalidArgumentError)
    assert (second.reason, second.field, second.details) == (
        "PAYLOAD_TOO_LARGE",
        "payload_json",
        "too big",
    )
    with pytest.raises(ProtocolError, match="2 results for 3 items"):
        convert.batch_results_from_pb(response, 3)


def test_chunks_respect_item_and_byte_limits_in_order() -> None:
    requests = [
        task_service_pb2.SubmitTaskRequest(type=f"t{i}", payload_json=b"x" * 100) for i in range(25)
    ]
    by_count = convert.chunk_requests(requests, max_items=10, max_bytes=1 << 30)
    assert [len(c) for c in by_count] == [10, 10, 5]
    by_bytes = convert.chunk_requests(requests, max_items=1000, max_bytes=500)
    assert all(sum(r.ByteSize() for r in c) <= 500 for c in by_bytes)
    assert len(by_bytes) > 1
    assert [r.type for c in by_bytes for r in c] == [r.type for r in requests]
    huge = [task_service_pb2.SubmitTaskRequest(type="big", payload_json=b"x" * 5000)]
    assert convert.chunk_requests(requests[:1] + huge, max_items=10, max_bytes=500) == [
        requests[:1],
        huge,
    ]


def test_payload_encoding_is_compact_utf8() -> None:
    data = convert.encode_payload({"a": "é", "b": [1, {"c": None}]})
    assert data == '{"a":"é","b":[1,{"c":null}]}'.encode()
    assert json.loads(data) == {"a": "é", "b": [1, {"c": None}]}


def test_numbers_a_float_cannot_hold_travel_exactly_both_ways() -> None:
    # What the server sends back for a payload of such numbers: Decimals, never rounded.
    sent = b'{"p":-0.46211904005971607552,"big":1E+400,"i":18446744073709551617,"f":0.1}'
    task = convert.task_from_pb(common_pb2.Task(status="TASK_STATUS_SCHEDULED", payload_json=sent))
    assert task.payload == {
        "p": Decimal("-0.46211904005971607552"),
        "big": Decimal("1E+400"),
        "i": 18446744073709551617,
        "f": 0.1,  # a float where the float is the number
    }
    assert isinstance(task.payload["f"], float)
    # And a Decimal in a payload goes out as it is.
    assert convert.encode_payload(task.payload) == sent
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        convert.encode_payload({"x": Decimal("NaN")})


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "cls", "retryable"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError, False),
        (grpc.StatusCode.NOT_FOUND, NotFoundError, False),
        (grpc.StatusCode.ALREADY_EXISTS, AlreadyExistsError, False),
        (grpc.StatusCode.FAILED_PRECONDITION, FailedPreconditionError, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhaustedError, True),
        (grpc.StatusCode.UNAVAILABLE, UnavailableError, True),
        (grpc.StatusCode.UNAUTHENTICATED, UnauthenticatedError, False),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDeniedError, False),
        (grpc.StatusCode.ABORTED, AbortedError, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceededError, True),
        (grpc.StatusCode.INTERNAL, InternalError, False),
        (grpc.StatusCode.UNKNOWN, InternalError, False),
        (grpc.StatusCode.UNIMPLEMENTED, ChronoshardError, False),
    ],
)
def test_error_for_picks_the_class_and_default_retryable(
    code: grpc.StatusCode, cls: type[ChronoshardError], retryable: bool
) -> None:
    error = error_for(code, "text")
    assert type(error) is cls
    assert (error.code, error.reason, error.retryable, error.field) == (
        code,
        code.name,
        retryable,
        None,
    )
    assert error_for(code, "text", retryable=not retryable).retryable is not retryable


def test_stale_fencing_token_has_its_own_class() -> None:
    error = error_for(grpc.StatusCode.FAILED_PRECONDITION, "stale", reason="STALE_FENCING_TOKEN")
    assert isinstance(error, StaleFencingTokenError)
    assert isinstance(error, FailedPreconditionError)


def test_already_exists_names_the_original_task() -> None:
    error = error_for(
        grpc.StatusCode.ALREADY_EXISTS,
        f"idempotency key 'k' was already used by task {TASK_ID.upper()} with a different request",
    )
    assert isinstance(error, AlreadyExistsError)
    assert error.original_task_id == TASK_ID
    assert error_for(grpc.StatusCode.ALREADY_EXISTS, "no id").original_task_id is None  # type: ignore[attr-defined]


def test_bare_rpc_error_maps_to_internal_with_cause() -> None:
    cause = grpc.RpcError()
    error = from_rpc_error(cause)
    assert isinstance(error, InternalError)
    assert error.code is grpc.StatusCode.UNKNOWN
    assert error.__cause__ is cause


def test_error_text_shows_code_reason_and_field() -> None:
    error = error_for(grpc.StatusCode.INVALID_ARGUMENT, "empty", reason="X", field="type")
    assert str(error) == "INVALID_ARGUMENT/X (field type): empty"


def test_importing_the_package_does_not_import_grpc() -> None:
    # Every process imports `chronoshard`; the client's grpc import must wait for first use.
    code = (
        "import sys, chronoshard\n"
        "assert 'grpc' not in sys.modules and 'google.protobuf' not in sys.modules\n"
        "from chronoshard import Client, Task, NotFoundError, __version__\n"
        "assert 'grpc' in sys.modules and Client.__module__ == 'chronoshard.client'\n"
        "try:\n    chronoshard.Nope\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit('no AttributeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_every_public_name_resolves() -> None:
    import chronoshard

    for name in chronoshard.__all__:
        assert getattr(chronoshard, name) is not None
    assert isinstance(Task, type)


def test_an_incident_comes_back_as_the_server_sent_it() -> None:
    from chronoshard.v1 import watchdog_service_pb2

    opened = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
    message = watchdog_service_pb2.Incident(
        id=7,
        kind="job_overdue",
        job_id="nightly",
        severity=watchdog_service_pb2.SEVERITY_WARNING,
        summary="nightly is overdue",
    )
    message.opened_at.FromDatetime(opened)
    incident = convert.incident_from_pb(message)
    assert (incident.id, incident.kind, incident.job_id, incident.severity) == (
        7,
        "job_overdue",
        "nightly",
        "warning",
    )
    assert incident.opened_at == opened and incident.resolved_at is None
    message.resolved_at.FromDatetime(opened + timedelta(hours=1))
    message.job_id = ""
    again = convert.incident_from_pb(message)
    assert again.resolved_at == opened + timedelta(hours=1) and again.job_id is None


def test_a_submit_result_decodes_its_task_once_when_first_read() -> None:
    decoded: list[Task] = []
    task = convert.task_from_pb(full_task_pb())

    def decode() -> Task:
        decoded.append(task)
        return task

    result = SubmitResult.decoded_later(decode, created=True)
    assert decoded == [] and result.created is True
    assert result.task is task and result.task is task
    assert decoded == [task]
    assert result == SubmitResult(task, created=True)
    assert result != SubmitResult(task, created=False)
    with pytest.raises(AttributeError, match="immutable"):
        result.created = False  # type: ignore[misc]
