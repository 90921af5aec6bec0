"""The task context, the outcome table and the testing helper of the worker SDK.

Everything here runs without a scheduler: the context and the outcome functions are
pure; the helper runs handlers on the test's event loop (and a thread for sync ones).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fixtures.loop import one_loop_turn
from fixtures.waiting import eventually

from chronoshard.clock import FakeClock
from chronoshard.worker import (
    RESULT_REFUSED,
    CheckpointRefused,
    NonRetryableError,
    StopReason,
    TaskCancelled,
    TaskContext,
)
from chronoshard.worker._context import (
    UNSET,
    BadAttempt,
    HeartbeatRecord,
    build_context,
    encode_json,
)
from chronoshard.worker._execution import (
    MAX_ERROR_CHARS,
    Abandoned,
    Completed,
    Failed,
    Released,
    decide,
    effective_timeout,
    failure,
    handler_spec,
    not_started,
    result_outcome,
)
from chronoshard.worker._models import Assignment, TaskRef
from chronoshard.worker.testing import TaskEnvironment, run_task

CLOCK = FakeClock()
TASK_ID = "0190a5e2-0000-7000-8000-0000000000aa"


def assignment(**overrides: Any) -> Assignment:
    fields: dict[str, Any] = {
        "task": TaskRef(TASK_ID, datetime(2026, 1, 1, tzinfo=UTC)),
        "type": "t",
        "payload_json": b'{"n": 1}',
        "fencing_token": 4,
        "attempt": 2,
        "max_retries": 1,
        "due_at": datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC),
        "lease_expires_at": None,
        "timeout_s": None,
        "checkpoint": b"",
        "trace_context": {"traceparent": "00-abc-def-01"},
        "queue": "",
    }
    fields.update(overrides)
    return Assignment(**fields)


def context(**overrides: Any) -> TaskContext:
    return build_context(assignment(**overrides), worker_id="w", timeout_s=None, now=CLOCK.now)


# ---- the context ---------------------------------------------------------------------


def test_context_decodes_the_attempt() -> None:
    ctx = context(checkpoint=b'{"step": 3}')
    assert ctx.task_id == uuid.UUID(TASK_ID)
    assert ctx.payload == {"n": 1}
    assert ctx.checkpoint == {"step": 3}
    assert (ctx.attempt, ctx.max_retries, ctx.fencing_token) == (2, 1, 4)
    assert ctx.is_last_attempt
    assert ctx.queue == "default"
    assert ctx.scheduled_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert ctx.trace_context == {"traceparent": "00-abc-def-01"}
    with pytest.raises(TypeError):
        ctx.trace_context["x"] = "y"  # type: ignore[index]
    assert context().checkpoint is None
    assert context(payload_json=b"").payload == {}


def test_payload_and_checkpoint_numbers_are_exact() -> None:
    ctx = context(payload_json=b'{"p":-0.46211904005971607552,"f":2.5}', checkpoint=b"[1e400]")
    assert ctx.payload == {"p": Decimal("-0.46211904005971607552"), "f": 2.5}
    assert ctx.checkpoint == [Decimal("1E+400")]
    assert encode_json(ctx.checkpoint) == b"[1E+400]"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("payload_json", b"{not json", "payload"),
        ("payload_json", b"\xff\xfe", "payload"),
        ("checkpoint", b"[1,", "checkpoint"),
    ],
)
def test_undecodable_attempts_are_refused(field: str, value: bytes, message: str) -> None:
    with pytest.raises(BadAttempt, match=message):
        context(**{field: value})


def test_bad_task_id_is_refused() -> None:
    with pytest.raises(BadAttempt, match="UUID"):
        context(task=TaskRef("nope", datetime(2026, 1, 1, tzinfo=UTC)))


async def test_checkpoints_are_sent_until_a_heartbeat_reply_stores_them() -> None:
    records: list[HeartbeatRecord] = []
    ctx = build_context(
        assignment(), worker_id="w", timeout_s=None, now=CLOCK.now, on_heartbeat=records.append
    )
    assert ctx._pending_checkpoint() is None
    await ctx.heartbeat(progress=0.1)
    assert ctx._pending_checkpoint() is None  # progress alone is not a checkpoint
    await ctx.heartbeat(checkpoint={"a": 1})
    seq, data = ctx._pending_checkpoint() or (0, b"")
    assert json.loads(data) == {"a": 1}
    ctx.heartbeat_sync(checkpoint={"a": 2})  # a newer one before the reply
    ctx._checkpoint_stored(seq)
    newer = ctx._pending_checkpoint()
    assert newer is not None and json.loads(newer[1]) == {"a": 2}
    ctx._checkpoint_stored(newer[0])
    assert ctx._pending_checkpoint() is None
    assert ctx._latest_checkpoint() == b'{"a":2}'
    assert ctx.progress == 0.1
    assert [r.checkpoint for r in records] == [UNSET, {"a": 1}, {"a": 2}]
    assert all(r.at == CLOCK.now() for r in records)


async def test_a_checkpoint_json_cannot_hold_is_refused_at_once() -> None:
    ctx = context()
    with pytest.raises(TypeError):
        await ctx.heartbeat(checkpoint={1, 2})
    with pytest.raises(ValueError):
        ctx.heartbeat_sync(checkpoint=float("nan"))
    assert ctx._latest_checkpoint() is None


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("checkpoint", "rule", "where"),
    [
        ({"step": "a\u0000b"}, "string", "a string at $.step contains a NUL"),
        ({"k": _nested(200)}, "depth", "nested deeper than 100 levels"),
        ({"n": 10**1500}, "number", "the number at $.n"),
    ],
)
async def test_a_checkpoint_the_scheduler_would_not_store_raises_at_the_call(
    checkpoint: Any, rule: str, where: str
) -> None:
    ctx = context()
    await ctx.heartbeat(checkpoint={"step": 1})
    with pytest.raises(CheckpointRefused) as raised:
        await ctx.heartbeat(checkpoint=checkpoint)
    assert raised.value.rule == rule
    assert str(raised.value).startswith("checkpoint: ") and where in str(raised.value)
    with pytest.raises(ValueError):  # catchable as the ValueError it was documented as
        ctx.heartbeat_sync(checkpoint=checkpoint)
    # Nothing recorded: the previous checkpoint is the one still to send.
    assert ctx._latest_checkpoint() == b'{"step":1}'
    pending = ctx._pending_checkpoint()
    assert pending is not None and pending[1] == b'{"step":1}'


async def test_stop_requests_set_both_flags_and_revocation_wins() -> None:
    ctx = context()
    assert not ctx.cancelled and ctx.cancel_reason is None
    ctx.raise_if_cancelled()  # nothing yet
    waiter = asyncio.create_task(ctx.wait_cancelled())
    ctx._request_stop(StopReason.CANCELLED)
    assert await waiter is StopReason.CANCELLED
    assert ctx.cancelled and ctx.wait_cancelled_sync(0)
    assert not ctx.draining
    ctx._request_stop(StopReason.TIMED_OUT)  # the first reason stays...
    assert ctx.cancel_reason is StopReason.CANCELLED
    ctx._request_stop(StopReason.REVOKED)  # ...unless the token went stale
    assert ctx.cancel_reason is StopReason.REVOKED
    with pytest.raises(TaskCancelled, match="revoked"):
        ctx.raise_if_cancelled()
    drained = context()
    drained._request_stop(StopReason.DRAINING)
    assert drained.draining and drained.cancelled


async def test_a_stop_reaches_waits_begun_before_it_and_after_it() -> None:
    # The events a stop sets are made by the first wait (few handlers wait): a thread
    # already blocked is woken, and waits begun after the request return at once.
    ctx = context()
    blocked = asyncio.create_task(asyncio.to_thread(ctx.wait_cancelled_sync, 30.0))
    await eventually(lambda: ctx._cancel_flag is not None, timeout_s=5, what="the thread waiting")
    ctx._request_stop(StopReason.CANCELLED)
    assert await asyncio.wait_for(blocked, 5) is True

    late = context()
    late._request_stop(StopReason.TIMED_OUT)
    assert late.wait_cancelled_sync(30.0) is True
    assert await asyncio.wait_for(late.wait_cancelled(), 5) is StopReason.TIMED_OUT


def test_wait_cancelled_sync_times_out_when_nobody_asks() -> None:
    assert context().wait_cancelled_sync(0.001) is False


# ---- the outcome table ---------------------------------------------------------------


def test_returned_values_complete_even_after_a_cancel_or_drain() -> None:
    for reason in (None, StopReason.CANCELLED, StopReason.DRAINING):
        assert decide(reason, value={"x": [1, "é"]}) == Completed('{"x":[1,"é"]}'.encode())
    assert decide(StopReason.REVOKED, value=1) == Abandoned("fencing token revoked")


def test_raised_exceptions_by_stop_reason() -> None:
    exc = RuntimeError("boom")
    plain = decide(None, exc=exc)
    assert isinstance(plain, Failed) and plain.retryable and not plain.cancelled
    cancelled = decide(StopReason.CANCELLED, exc=exc)
    assert isinstance(cancelled, Failed) and cancelled.cancelled and not cancelled.retryable
    assert decide(StopReason.DRAINING, exc=exc, checkpoint=b"[1]") == Released(b"[1]")
    timed = decide(StopReason.TIMED_OUT, exc=exc)
    assert isinstance(timed, Failed) and timed.timed_out and timed.retryable
    assert isinstance(decide(StopReason.REVOKED, exc=exc), Abandoned)


def test_non_retryable_errors() -> None:
    class Permanent(Exception):
        retryable = False

    assert not failure(NonRetryableError("x")).retryable
    assert not failure(Permanent("x")).retryable
    assert failure(KeyError("k")).retryable
    assert failure(KeyError("k")).error_type == "KeyError"
    nameless = failure(Permanent())  # no message: the type names it
    assert nameless.error_type.endswith("test_non_retryable_errors.<locals>.Permanent")
    assert nameless.error_message.startswith(nameless.error_type)


def test_error_text_is_bounded_and_keeps_both_ends() -> None:
    try:
        raise ValueError("start " + "x" * 20_000 + " end")
    except ValueError as exc:
        failed = failure(exc)
    assert len(failed.error_message) < MAX_ERROR_CHARS + 100
    assert failed.error_message.startswith("start ")
    assert "characters cut" in failed.error_message


def test_results_json_cannot_hold_fail_without_retry() -> None:
    for value in ({1, 2}, float("inf"), object()):
        out = result_outcome(value, "t")
        assert isinstance(out, Failed) and not out.retryable
        assert out.error_type == "chronoshard.worker.ResultNotSerializable"


@pytest.mark.parametrize(
    ("value", "rule", "where"),
    [
        ({"x": "\u0000"}, "string", "a string at $.x contains a NUL character"),
        ({"ok": ["\udc00"]}, "string", "a string at $.ok[0] contains a lone surrogate"),
        ({"deep": _nested(200)}, "depth", "nested deeper than 100 levels"),
        ([Decimal("1e5000")], "number", "the number at $[0]"),
    ],
)
def test_results_the_scheduler_would_not_store_fail_without_retry(
    value: Any, rule: str, where: str
) -> None:
    out = result_outcome(value, "report")
    assert isinstance(out, Failed) and not out.retryable
    assert out.error_type == RESULT_REFUSED == "chronoshard.worker.ResultRefused"
    assert out.error_message.startswith("handler for 'report' returned a result")
    assert f"({rule} rule)" in out.error_message and where in out.error_message
    assert len(out.error_message) < 400


def test_a_result_just_inside_the_rules_completes() -> None:
    out = result_outcome({"deep": _nested(99), "n": Decimal("1e999")}, "t")
    assert isinstance(out, Completed)


async def test_a_sync_handler_returning_a_coroutine_fails_clearly() -> None:
    async def inner() -> int:
        return 1

    out = result_outcome(inner(), "t")  # closed by result_outcome: no "never awaited"
    assert isinstance(out, Failed) and "async def" in out.error_message


def test_outcome_before_start() -> None:
    assert isinstance(not_started(StopReason.REVOKED), Abandoned)
    assert not_started(StopReason.DRAINING) == Released(
        None, "worker draining before the task started"
    )
    cancelled = not_started(StopReason.CANCELLED)
    assert isinstance(cancelled, Failed) and cancelled.cancelled


def test_effective_timeout_is_the_tightest() -> None:
    assert effective_timeout(None, None) is None
    assert effective_timeout(10.0, None) == 10.0
    assert effective_timeout(10.0, 2.5) == 2.5
    assert effective_timeout(None, 0.0) is None  # 0 means "no limit" on the wire


def test_handler_kinds_are_detected() -> None:
    async def a(ctx: TaskContext) -> None: ...

    def s(ctx: TaskContext) -> None: ...

    class Callable:
        async def __call__(self, ctx: TaskContext) -> None: ...

    assert handler_spec("t", a).is_async
    assert not handler_spec("t", s).is_async
    assert handler_spec("t", Callable()).is_async
    with pytest.raises(ValueError):
        handler_spec("t", a, timeout_s=0)


# ---- the testing helper --------------------------------------------------------------


async def test_run_task_completes_with_the_decoded_result_and_checkpoints() -> None:
    async def resize(ctx: TaskContext) -> dict[str, Any]:
        done = ctx.checkpoint["done"] if ctx.checkpoint else 0
        for i in range(done, 3):
            await ctx.heartbeat(checkpoint={"done": i + 1}, progress=(i + 1) / 3)
        return {"image": ctx.payload["image"], "attempt": ctx.attempt}

    outcome = await run_task(resize, {"image": "a.png"}, attempt=2, checkpoint={"done": 1})
    assert outcome.status == "completed"
    assert outcome.result == {"image": "a.png", "attempt": 2}
    assert outcome.checkpoints == ({"done": 2}, {"done": 3})
    assert outcome.last_checkpoint == {"done": 3}
    assert outcome.progress == pytest.approx((2 / 3, 1.0))


async def test_run_task_reports_failures_and_timeouts() -> None:
    async def broken(ctx: TaskContext) -> None:
        raise NonRetryableError("no such user")

    failed = await run_task(broken)
    assert failed.status == "failed" and failed.retryable is False
    assert isinstance(failed.error, NonRetryableError)

    async def hangs(ctx: TaskContext) -> None:
        await asyncio.Event().wait()

    timed_out = await run_task(hangs, timeout_s=0.05)
    assert timed_out.status == "timed_out" and timed_out.retryable


async def test_environment_cancel_from_a_heartbeat() -> None:
    async def counts(ctx: TaskContext) -> int:
        n = 0
        while True:
            n += 1
            await ctx.heartbeat(progress=n)
            ctx.raise_if_cancelled()
            await one_loop_turn()

    env = TaskEnvironment(on_heartbeat=lambda rec, env: env.cancel() if rec.progress == 3 else None)
    outcome = await env.run(counts)
    assert outcome.status == "cancelled"
    assert outcome.progress == (1, 2, 3)
    assert isinstance(outcome.error, TaskCancelled)


async def test_environment_drain_releases_with_the_last_checkpoint() -> None:
    started = asyncio.Event()

    async def long(ctx: TaskContext) -> None:
        await ctx.heartbeat(checkpoint={"at": 1})
        started.set()
        await ctx.wait_cancelled()
        assert ctx.draining
        await ctx.heartbeat(checkpoint={"at": 2})
        ctx.raise_if_cancelled()

    env = TaskEnvironment()
    task = asyncio.create_task(env.run(long))
    await started.wait()
    env.drain()
    outcome = await task
    assert outcome.status == "released"
    assert outcome.released_checkpoint == {"at": 2}


async def test_environment_revoke_stops_an_async_handler_at_once() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def ignores(ctx: TaskContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    env = TaskEnvironment()
    task = asyncio.create_task(env.run(ignores))
    await started.wait()
    env.revoke()
    assert (await task).status == "revoked"
    assert cancelled.is_set()


async def test_cancel_before_the_run_means_it_never_starts() -> None:
    calls: list[int] = []

    async def handler(ctx: TaskContext) -> None:
        calls.append(1)

    env = TaskEnvironment()
    env.cancel()
    outcome = await env.run(handler)
    assert outcome.status == "cancelled" and calls == []


async def test_sync_handler_runs_in_a_thread_and_can_be_cancelled_from_it() -> None:
    main = threading.get_ident()

    def worker(ctx: TaskContext) -> str:
        assert threading.get_ident() != main
        ctx.heartbeat_sync(checkpoint={"x": 1})
        ctx.wait_cancelled_sync(5)
        ctx.raise_if_cancelled()
        return "unreachable"

    env = TaskEnvironment(on_heartbeat=lambda rec, env: env.cancel())
    outcome = await env.run(worker)
    assert outcome.status == "cancelled"
    assert outcome.checkpoints == ({"x": 1},)


async def test_the_handler_waits_for_due_at() -> None:
    due = datetime.now(UTC) + timedelta(milliseconds=80)
    started: list[datetime] = []

    async def handler(ctx: TaskContext) -> None:
        started.append(datetime.now(UTC))

    await TaskEnvironment(due_at=due).run(handler)
    assert started[0] >= due
