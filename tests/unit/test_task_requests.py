"""Submit validation at the wire (``api.task_requests.submit_from_pb``), pure: the one
validation a submit gets, each refusal naming the request's field (with the batch
prefix). The same rules through a real server, with nothing written, are in
tests/integration/test_api.py; the rules here were the models' own re-check before the
wire became the only validator, and are asserted on the request that can break them."""

from __future__ import annotations

import dataclasses
import sys
import unicodedata
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard.scheduler.api import convert
from chronoshard.scheduler.api.task_requests import SubmitLimits, submit_from_pb
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import MAX_RETRIES_LIMIT, PreparedTask, Priority
from chronoshard.scheduler.errors import InvalidArgument, PayloadTooLarge
from chronoshard.settings import ConfigError, load
from chronoshard.v1 import common_pb2, task_service_pb2
from chronoshard.wire import DEFAULT_QUEUE

NOW = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
TENANT = uuid.UUID(int=7)
LIMITS = SubmitLimits.from_config(SchedulerConfig())
Req = task_service_pb2.SubmitTaskRequest


def _submit(req: Req, limits: SubmitLimits = LIMITS, prefix: str = "") -> PreparedTask:
    return submit_from_pb(
        req, tenant_id=TENANT, task_id=new_task_id(), now=NOW, limits=limits, prefix=prefix
    )


def _dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def _payload(data: bytes) -> Callable[[Req], None]:
    return lambda r: setattr(r, "payload_json", data)


def _set(name: str, value: object) -> Callable[[Req], None]:
    return lambda r: setattr(r, name, value)


def _backoff(**fields: object) -> Callable[[Req], None]:
    return lambda r: r.retry_backoff.CopyFrom(common_pb2.RetryBackoff(**fields))  # type: ignore[arg-type]


# Each rule as the request breaks it; the field is the request's (not a model's) name.
INVALID: list[tuple[str, Callable[[Req], None], str]] = [
    ("payload an array", _payload(b'["not", "an", "object"]'), "payload_json"),
    ("payload a JSON string", _payload(b'"{}"'), "payload_json"),
    ("payload NaN", _payload(b'{"x": NaN}'), "payload_json"),
    ("type blank", _set("type", "   "), "type"),
    ("type too long", _set("type", "x" * 201), "type"),
    ("unknown priority", _set("priority", 99), "priority"),
    ("queue with a space", _set("queue", "has space"), "queue"),
    ("queue too long", _set("queue", "q" * 101), "queue"),
    ("max_retries over the node's limit", _set("max_retries", 101), "max_retries"),
    ("zero timeout", lambda r: r.timeout.CopyFrom(_dur(0)), "timeout"),
    ("negative timeout", lambda r: r.timeout.CopyFrom(_dur(-5)), "timeout"),
    ("unknown jitter mode", _set("jitter_mode", 42), "jitter_mode"),
    ("idempotency key too long", _set("idempotency_key", "k" * 201), "idempotency_key"),
    ("idempotency key blank", _set("idempotency_key", "   "), "idempotency_key"),
    ("job_id blank", _set("job_id", "  "), "job_id"),
    ("zero initial backoff", _backoff(initial=_dur(0)), "retry_backoff.initial"),
    ("backoff max below initial", _backoff(initial=_dur(10), max=_dur(5)), "retry_backoff.max"),
    ("backoff multiplier below 1", _backoff(multiplier=0.5), "retry_backoff.multiplier"),
]


@pytest.mark.parametrize("prefix", ["", "tasks[3]."])
@pytest.mark.parametrize(("case", "mutate", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_each_invalid_field_is_refused_by_its_request_name(
    case: str, mutate: Callable[[Req], None], field: str, prefix: str
) -> None:
    req = Req(type="ok", payload_json=b'{"a": 1}')
    mutate(req)
    with pytest.raises(InvalidArgument) as caught:
        _submit(req, prefix=prefix)
    assert type(caught.value) is InvalidArgument
    assert caught.value.field == prefix + field, caught.value.message


def test_payload_text_is_canonical_and_bounded_in_bytes_as_sent_and_as_stored() -> None:
    prepared = _submit(Req(type="t", payload_json='{"b": 1, "a": "é"}'.encode()))
    assert prepared.payload_json == '{"a":"é","b":1}'
    assert prepared.new.payload == {"a": "é", "b": 1}
    assert _submit(Req(type="t")).payload_json == "{}"
    small = dataclasses.replace(LIMITS, payload_limit_bytes=64)
    fits = b'{"x":"' + b"a" * 50 + b'"}'  # 58 bytes
    assert _submit(Req(type="t", payload_json=fits), small).payload_json == fits.decode()
    over = ('{"x":"' + "é" * 30 + '"}').encode()  # 68 bytes
    with pytest.raises(PayloadTooLarge) as caught:
        _submit(Req(type="t", payload_json=over), small, prefix="tasks[1].")
    assert caught.value.field == "tasks[1].payload_json"
    assert (caught.value.size_bytes, caught.value.limit_bytes) == (68, 64)
    # 9 bytes as sent, 18 as stored ({"a":1000000000.0}): the stored text is bounded too.
    with pytest.raises(PayloadTooLarge) as caught:
        _submit(
            Req(type="t", payload_json=b'{"a":1e9}'),
            dataclasses.replace(LIMITS, payload_limit_bytes=12),
            prefix="tasks[2].",
        )
    assert caught.value.field == "tasks[2].payload_json"
    assert (caught.value.size_bytes, caught.value.limit_bytes) == (18, 12)


def test_default_payload_limit_is_256_kib() -> None:
    assert LIMITS.payload_limit_bytes == 256 * 1024
    with pytest.raises(PayloadTooLarge) as caught:
        _submit(Req(type="t", payload_json=b'{"x": "' + b"a" * 256 * 1024 + b'"}'))
    assert caught.value.field == "payload_json"


def test_enum_values_map_to_the_models_members_and_unknown_ones_are_refused() -> None:
    new = _submit(
        Req(
            type="t",
            priority=common_pb2.PRIORITY_CRITICAL,
            jitter_mode=common_pb2.JITTER_MODE_DELAY_ONLY,
        )
    ).new
    assert (new.priority, new.jitter_mode) == (Priority.CRITICAL, JitterMode.DELAY_ONLY)
    assert _submit(Req(type="t")).new.priority is Priority.STANDARD
    for name, value in (("priority", 99), ("jitter_mode", 42)):
        with pytest.raises(InvalidArgument) as caught:
            _submit(Req(type="t", **{name: value}))  # type: ignore[arg-type]
        assert caught.value.field == name


def test_max_retries_over_the_node_limit_is_refused() -> None:
    limit = LIMITS.max_retries_limit
    assert _submit(Req(type="t", max_retries=limit)).new.max_retries == limit
    with pytest.raises(InvalidArgument) as caught:
        _submit(Req(type="t", max_retries=limit + 1), prefix="tasks[0].")
    assert caught.value.field == "tasks[0].max_retries"
    assert _submit(Req(type="t")).new.max_retries == LIMITS.default_max_retries


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DEFAULT_MAX_RETRIES", str(MAX_RETRIES_LIMIT + 1)),
        ("MAX_RETRIES_LIMIT", str(MAX_RETRIES_LIMIT + 1)),
        ("DEFAULT_TIMEOUT_S", "inf"),
        ("DEFAULT_TIMEOUT_S", "0"),
    ],
)
def test_submit_defaults_out_of_range_are_refused_at_start_naming_the_key(
    key: str, value: str
) -> None:
    # Checked once, when the node loads its configuration, not on every submit.
    with pytest.raises(ConfigError, match=f"limits.{key.lower()}"):
        load(SchedulerConfig, env={f"CHRONOSHARD_LIMITS__{key}": value})


def test_the_default_timeout_applies_unless_the_request_sets_one() -> None:
    assert _submit(Req(type="t", timeout=_dur(30))).new.timeout_s == 30.0
    assert _submit(Req(type="t")).new.timeout_s == LIMITS.default_timeout_s


def test_empty_strings_mean_unset() -> None:
    new = _submit(Req(type="t", queue="", idempotency_key="", job_id="")).new
    assert (new.queue, new.idempotency_key, new.job_id) == (DEFAULT_QUEUE, None, None)


def test_what_the_wire_builds_needs_no_second_check() -> None:
    # The values the models used to re-check and a request cannot get wrong (see
    # task_requests._prepared): aware instants, a shard within a smallint, enum members,
    # a string-to-string trace context, no workflow fields.
    widest = dataclasses.replace(LIMITS, shard_count=32767)
    trace = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    for req in (
        Req(type="t"),
        Req(type="t", delay=_dur(90), jitter_window=_dur(60)),
        Req(type="t", scheduled_at=_ts(NOW + timedelta(days=30)), strict_timing=True),
    ):
        prepared = submit_from_pb(
            req,
            tenant_id=TENANT,
            task_id=new_task_id(),
            now=NOW,
            limits=widest,
            trace_context=trace,
        )
        new = prepared.new
        assert new.scheduled_at.utcoffset() is not None and new.due_at.utcoffset() is not None
        assert 0 <= new.shard < 32767
        assert isinstance(new.priority, Priority) and isinstance(new.jitter_mode, JitterMode)
        assert isinstance(new.id, uuid.UUID) and new.trace_context == trace
        assert (new.workflow_id, new.schedule_id, new.logical_date) == (None, None, None)
        assert (new.unresolved_dependencies, new.submitted_by) == (0, None)


def test_control_characters_are_unicode_category_cc_exactly() -> None:
    # Every code point, not a sample: the regular expression must agree with Unicode's
    # own table (a NUL let through fails the statement that writes it later).
    for code_point in range(sys.maxunicode + 1):
        char = chr(code_point)
        expected = unicodedata.category(char) == "Cc"
        assert convert.has_control_character(f"ab{char}c") is expected, hex(code_point)
