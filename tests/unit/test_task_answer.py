"""The scheduler's Task message (``api/convert.py``, ``write_task``): written field by
field into a message being built, it must be the very message the generated constructor
makes from every field spelled out (the form it replaced, kept here as the reference),
whatever the task holds. Serialised bytes are compared too: a field set to its default
is not the same message on the wire as one left unset in every case (maps, sub-messages)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.api import convert
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import Priority, Task
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.v1 import common_pb2

_instants = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
_seconds = st.floats(min_value=0, max_value=10**6, allow_nan=False)


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    def maybe(strategy: st.SearchStrategy[Any]) -> Any:
        return draw(st.none() | strategy)

    return Task(
        id=draw(st.uuids()),
        tenant_id=draw(st.uuids()),
        type=draw(_text),
        scheduled_at=draw(_instants),
        due_at=draw(_instants),
        status=draw(st.sampled_from(TaskStatus)),
        fencing_token=draw(st.integers(0, 2**63 - 1)),
        idempotency_key=maybe(_text),
        retry_count=draw(st.integers(0, 1000)),
        max_retries=draw(st.integers(0, 1000)),
        backoff_initial_s=draw(_seconds),
        backoff_max_s=draw(_seconds),
        backoff_multiplier=draw(st.floats(min_value=0, max_value=100, allow_nan=False)),
        jitter_mode=draw(st.sampled_from(JitterMode)),
        payload=draw(st.dictionaries(_text, st.integers() | _text, max_size=3)),
        result_payload=maybe(st.integers() | st.lists(_text, max_size=3)),
        shard=draw(st.integers(0, 32767)),
        priority=draw(st.sampled_from(Priority)),
        queue=draw(_text),
        strict_timing=draw(st.booleans()),
        idempotent=draw(st.booleans()),
        timeout_s=maybe(_seconds),
        lease_expires_at=maybe(_instants),
        worker_id=maybe(_text),
        attempt=draw(st.integers(0, 1000)),
        checkpoint=maybe(st.binary(max_size=8)),
        job_id=maybe(_text),
        workflow_id=maybe(st.uuids()),
        unresolved_dependencies=draw(st.integers(0, 1000)),
        schedule_id=maybe(st.uuids()),
        logical_date=maybe(_instants),
        trace_context=maybe(st.dictionaries(_text, _text, max_size=2)),
        last_error=maybe(_text),
        submitted_by=maybe(_text),
        created_at=draw(_instants),
        updated_at=draw(_instants),
        started_at=maybe(_instants),
        finished_at=maybe(_instants),
        cancel_requested_at=maybe(_instants),
        cancel_reason=maybe(_text),
        upstream_cause=maybe(st.uuids()),
    )


def _spelled_out(task: Task, *, include_payload: bool) -> common_pb2.Task:
    """Every field given to the generated constructor, sub-messages copied in."""
    msg = common_pb2.Task(
        id=str(task.id),
        tenant_id=str(task.tenant_id),
        type=task.type,
        status=convert.status_to_pb(task.status),
        scheduled_at=convert.ts_to_pb(task.scheduled_at),
        due_at=convert.ts_to_pb(task.due_at),
        priority=convert.priority_to_pb(task.priority),
        queue=task.queue,
        last_error=task.last_error or "",
        attempt=task.attempt,
        fencing_token=task.fencing_token,
        retry_count=task.retry_count,
        max_retries=task.max_retries,
        retry_backoff=common_pb2.RetryBackoff(
            initial=convert.duration_to_pb(task.backoff_initial_s),
            max=convert.duration_to_pb(task.backoff_max_s),
            multiplier=task.backoff_multiplier,
        ),
        strict_timing=task.strict_timing,
        idempotent=task.idempotent,
        idempotency_key=task.idempotency_key or "",
        job_id=task.job_id or "",
        worker_id=task.worker_id or "",
        shard=task.shard,
        trace_context=task.trace_context or {},
        unresolved_dependencies=task.unresolved_dependencies,
        workflow_id=str(task.workflow_id) if task.workflow_id else "",
        schedule_id=str(task.schedule_id) if task.schedule_id else "",
    )
    if include_payload:
        msg.payload_json = convert.json_bytes(task.payload)
        msg.result_json = convert.json_bytes(task.result_payload)
        if task.checkpoint is not None:
            msg.checkpoint = bytes(task.checkpoint)
    if task.timeout_s is not None:
        msg.timeout.CopyFrom(convert.duration_to_pb(task.timeout_s))
    for name in ("lease_expires_at", "created_at", "updated_at", "finished_at", "logical_date"):
        value = getattr(task, name)
        if value is not None:
            getattr(msg, name).CopyFrom(convert.ts_to_pb(value))
    return msg


@given(task=tasks(), include_payload=st.booleans())
def test_write_task_is_the_task_spelled_out(task: Task, include_payload: bool) -> None:
    written = common_pb2.Task()
    convert.write_task(written, task, include_payload=include_payload)
    expected = _spelled_out(task, include_payload=include_payload)
    assert written == expected
    assert written.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )
    assert convert.task_to_pb(task, include_payload=include_payload) == expected


def test_a_naive_instant_is_read_as_local_time() -> None:
    # write_ts keeps ts_to_pb's rule for the rare naive value the scheduler holds.
    naive = datetime(2026, 12, 7, 6, 0)
    written = common_pb2.Task()
    convert.write_ts(written.created_at, naive)
    assert written.created_at == convert.ts_to_pb(naive.astimezone(UTC))
