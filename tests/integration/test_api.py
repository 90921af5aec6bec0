"""TaskService end to end on one process: a real grpc.aio server on port 0 hosting the
servicer, called through the generated stub over a real channel, against a real
PostgreSQL. Rows are counted in the database to prove that a refused call wrote nothing;
states a worker would cause (DISPATCHED, RUNNING, DEAD_LETTER) are made with plain SQL."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.stores import tenant_with_key
from fixtures.waiting import eventually
from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard.clock import FakeClock
from chronoshard.scheduler.api import tasks as task_servicer
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.quotas import SubmitQuotas
from chronoshard.scheduler.api.tasks import TaskServiceServicer
from chronoshard.scheduler.config import LimitsConfig, SchedulerConfig, SchedulingConfig
from chronoshard.scheduler.core.models import Task, Tenant
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.tenants import TenantStore
from chronoshard.v1 import common_pb2, task_service_pb2, task_service_pb2_grpc
from chronoshard.wire import error_info_from_metadata

PAYLOAD_LIMIT = 2048
MAX_MESSAGE_BYTES = 64 * 1024
MAX_PAGE = 10
CONFIG = SchedulerConfig(
    scheduling=SchedulingConfig(shard_count=16, jitter_window_s=240.0),
    limits=LimitsConfig(
        payload_limit_bytes=PAYLOAD_LIMIT,
        max_batch_tasks=20,
        default_max_retries=3,
        max_retries_limit=100,
        default_timeout_s=600.0,
        max_list_page_size=MAX_PAGE,
    ),
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
Stub = task_service_pb2_grpc.TaskServiceStub
Req = task_service_pb2.SubmitTaskRequest


@dataclass
class Recorder:
    """The node's side of SubmitListener: remembers what it was told."""

    submitted: list[Task] = field(default_factory=list)
    cancels: list[tuple[Task, str]] = field(default_factory=list)

    def tasks_submitted(self, tasks: Sequence[Task]) -> None:
        self.submitted.extend(tasks)

    def cancel_requested(self, task: Task, reason: str) -> None:
        self.cancels.append((task, reason))


@dataclass
class Api:
    stub: Stub
    store: Store
    dsn: str
    tenant: Tenant
    key: str
    listener: Recorder

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.key}"),)

    async def submit(
        self, req: Req, metadata: Sequence[tuple[str, str]] | None = None
    ) -> task_service_pb2.SubmitTaskResponse:
        return await self.stub.SubmitTask(req, metadata=metadata or self.auth, timeout=10)

    async def counts(self, tenant: Tenant | None = None) -> tuple[int, int]:
        """(tasks, idempotency keys) of the tenant."""
        tenant_id = (tenant or self.tenant).id
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM tasks WHERE tenant_id = %(t)s),"
                " (SELECT count(*) FROM idempotency_keys WHERE tenant_id = %(t)s)",
                {"t": tenant_id},
            )
            row = await cur.fetchone()
        assert row is not None
        return row[0], row[1]

    async def sql(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute(query, params)  # type: ignore[arg-type]
            return await cur.fetchall() if cur.description else []


async def _serve(
    store: Store,
    authenticator: Authenticator,
    listener: Recorder,
    submit_quotas: SubmitQuotas | None = None,
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    servicer = TaskServiceServicer(
        config=CONFIG,
        store=store,
        authenticator=authenticator,
        listener=listener,
        submit_quotas=submit_quotas,
    )
    task_service_pb2_grpc.add_TaskServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.fixture
async def api(store: Store, db_dsn: str) -> AsyncIterator[Api]:
    tenant, key = await tenant_with_key(store)
    listener = Recorder()
    server, port = await _serve(store, Authenticator(TenantStore(store)), listener)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Api(Stub(channel), store, db_dsn, tenant, key, listener)
    await server.stop(grace=None)


async def _refused(call: Awaitable[Any], code: grpc.StatusCode) -> common_pb2.ErrorInfo:
    """Await ``call``, expect it to fail with ``code``; the ErrorInfo trailer it carried."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()
    info = error_info_from_metadata(raised.value.trailing_metadata())
    assert info is not None, "no ErrorInfo trailer"
    assert info.code == code.name
    return info


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def _dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d


def _at(task: common_pb2.Task, name: str) -> datetime:
    return getattr(task, name).ToDatetime(tzinfo=UTC)  # type: ignore[no-any-return]


# --- submit ---------------------------------------------------------------------------


async def test_submit_applies_defaults_and_reads_back(api: Api) -> None:
    before = datetime.now(UTC)
    response = await api.submit(
        Req(type="send_report", payload_json=b'{"to": "ops", "n": 3}'),
        metadata=(*api.auth, ("traceparent", TRACEPARENT), ("tracestate", "vendor=1")),
    )
    task = response.task
    assert response.created
    assert task.status == common_pb2.TASK_STATUS_SCHEDULED
    assert task.tenant_id == str(api.tenant.id)
    assert task.queue == "default"
    assert task.priority == common_pb2.PRIORITY_STANDARD
    assert task.max_retries == 3
    assert task.timeout.ToTimedelta() == timedelta(seconds=600)
    assert task.retry_backoff.multiplier == 2.0
    assert task.shard == shard_of(uuid.UUID(task.id), 16)
    assert dict(task.trace_context) == {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
    # No time given: now; symmetric jitter never makes it earlier than the submit.
    scheduled, due = _at(task, "scheduled_at"), _at(task, "due_at")
    assert before <= scheduled <= datetime.now(UTC)
    assert scheduled <= due < scheduled + timedelta(seconds=120)
    assert [t.id for t in api.listener.submitted] == [uuid.UUID(task.id)]

    got = await api.stub.GetTask(task_service_pb2.GetTaskRequest(id=task.id), metadata=api.auth)
    assert got.task == task
    assert json.loads(got.task.payload_json) == {"to": "ops", "n": 3}


async def test_jitter_modes_and_windows(api: Api) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    strict = await api.submit(
        Req(type="t", scheduled_at=_ts(at), strict_timing=True, jitter_window=_dur(600))
    )
    assert _at(strict.task, "due_at") == _at(strict.task, "scheduled_at") == at
    zero = await api.submit(Req(type="t", scheduled_at=_ts(at), jitter_window=_dur(0)))
    assert _at(zero.task, "due_at") == at
    late = await api.submit(
        Req(
            type="t",
            scheduled_at=_ts(at),
            jitter_mode=common_pb2.JITTER_MODE_DELAY_ONLY,
            jitter_window=_dur(60),
        )
    )
    assert at <= _at(late.task, "due_at") < at + timedelta(seconds=60)
    # A past time is allowed (within a week) and runs at once: due_at is the submit time.
    past = await api.submit(Req(type="t", scheduled_at=_ts(at - timedelta(days=3))))
    assert _at(past.task, "scheduled_at") == at - timedelta(days=3)
    assert _at(past.task, "due_at") > at - timedelta(hours=2)


def _long(n: int) -> str:
    return "x" * n


INVALID: list[tuple[str, Callable[[Req], None], str]] = [
    ("missing type", lambda r: setattr(r, "type", ""), "type"),
    ("long type", lambda r: setattr(r, "type", _long(201)), "type"),
    ("control char in type", lambda r: setattr(r, "type", "a\nb"), "type"),
    ("payload not JSON", lambda r: setattr(r, "payload_json", b"{"), "payload_json"),
    ("payload an array", lambda r: setattr(r, "payload_json", b"[1]"), "payload_json"),
    ("payload not UTF-8", lambda r: setattr(r, "payload_json", b'{"a":"\xff"}'), "payload_json"),
    ("payload NaN", lambda r: setattr(r, "payload_json", b'{"a": NaN}'), "payload_json"),
    ("payload NUL", lambda r: setattr(r, "payload_json", b'{"a": "\\u0000"}'), "payload_json"),
    (
        "payload lone surrogate",
        lambda r: setattr(r, "payload_json", b'{"a": "\\ud800"}'),
        "payload_json",
    ),
    (
        "scheduled_at over a week ago",
        lambda r: r.scheduled_at.CopyFrom(_ts(datetime.now(UTC) - timedelta(days=8))),
        "scheduled_at",
    ),
    (
        "scheduled_at over 10 years ahead",
        lambda r: r.scheduled_at.CopyFrom(_ts(datetime.now(UTC) + timedelta(days=3700))),
        "scheduled_at",
    ),
    (
        "scheduled_at with bad nanos",
        lambda r: r.scheduled_at.CopyFrom(timestamp_pb2.Timestamp(seconds=2_000_000_000, nanos=-1)),
        "scheduled_at",
    ),
    ("negative delay", lambda r: r.delay.CopyFrom(_dur(-1)), "delay"),
    ("delay over 10 years", lambda r: r.delay.CopyFrom(_dur(11 * 365 * 86400)), "delay"),
    (
        "delay with mixed signs",
        lambda r: r.delay.CopyFrom(duration_pb2.Duration(seconds=5, nanos=-1)),
        "delay",
    ),
    ("unknown priority", lambda r: setattr(r, "priority", 99), "priority"),
    ("bad queue", lambda r: setattr(r, "queue", "no spaces allowed"), "queue"),
    ("max_retries over the limit", lambda r: setattr(r, "max_retries", 101), "max_retries"),
    (
        "zero backoff",
        lambda r: r.retry_backoff.initial.CopyFrom(_dur(0)),
        "retry_backoff.initial",
    ),
    (
        "backoff max below initial",
        lambda r: r.retry_backoff.CopyFrom(common_pb2.RetryBackoff(initial=_dur(10), max=_dur(5))),
        "retry_backoff.max",
    ),
    (
        "backoff multiplier below 1",
        lambda r: r.retry_backoff.CopyFrom(common_pb2.RetryBackoff(multiplier=0.5)),
        "retry_backoff.multiplier",
    ),
    (
        "backoff multiplier NaN",
        lambda r: r.retry_backoff.CopyFrom(common_pb2.RetryBackoff(multiplier=float("nan"))),
        "retry_backoff.multiplier",
    ),
    ("zero timeout", lambda r: r.timeout.CopyFrom(_dur(0)), "timeout"),
    ("negative timeout", lambda r: r.timeout.CopyFrom(_dur(-5)), "timeout"),
    ("unknown jitter mode", lambda r: setattr(r, "jitter_mode", 42), "jitter_mode"),
    (
        "jitter window over a day",
        lambda r: r.jitter_window.CopyFrom(_dur(2 * 86400)),
        "jitter_window",
    ),
    ("negative jitter window", lambda r: r.jitter_window.CopyFrom(_dur(-1)), "jitter_window"),
    (
        "long idempotency key",
        lambda r: setattr(r, "idempotency_key", _long(201)),
        "idempotency_key",
    ),
    ("blank idempotency key", lambda r: setattr(r, "idempotency_key", "   "), "idempotency_key"),
    ("long job_id", lambda r: setattr(r, "job_id", _long(201)), "job_id"),
    ("control char in job_id", lambda r: setattr(r, "job_id", "a\x00b"), "job_id"),
]


@pytest.mark.parametrize(("case", "mutate", "field"), INVALID, ids=[c[0] for c in INVALID])
async def test_each_invalid_field_is_refused_and_nothing_written(
    api: Api, case: str, mutate: Callable[[Req], None], field: str
) -> None:
    req = Req(type="ok", payload_json=b'{"a": 1}', idempotency_key=f"k-{uuid.uuid4()}")
    mutate(req)
    info = await _refused(api.submit(req), grpc.StatusCode.INVALID_ARGUMENT)
    assert info.field == field, info.message
    assert info.reason == "INVALID_ARGUMENT"
    assert not info.retryable
    assert await api.counts() == (0, 0)
    assert api.listener.submitted == []


async def test_oversized_payload_is_payload_too_large(api: Api) -> None:
    payload = b'{"blob": "' + b"x" * PAYLOAD_LIMIT + b'"}'
    info = await _refused(
        api.submit(Req(type="t", payload_json=payload)), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert (info.reason, info.field) == ("PAYLOAD_TOO_LARGE", "payload_json")
    # Under the limit as sent, over it once canonicalised ("1e5" is stored as 100000.0).
    numbers = b'{"n":[' + b",".join([b"1e5"] * 450) + b"]}"
    assert len(numbers) < PAYLOAD_LIMIT
    info = await _refused(
        api.submit(Req(type="t", payload_json=numbers)), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert (info.reason, info.field) == ("PAYLOAD_TOO_LARGE", "payload_json")
    assert await api.counts() == (0, 0)


async def test_oversized_message_is_refused_and_the_server_keeps_serving(api: Api) -> None:
    huge = Req(type="t", payload_json=b'{"a": "' + b"x" * MAX_MESSAGE_BYTES + b'"}')
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await api.submit(huge)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    response = await api.submit(Req(type="after"))
    assert response.created
    assert await api.counts() == (1, 0)


# --- batch ----------------------------------------------------------------------------


async def test_batch_with_one_bad_item_writes_nothing(api: Api) -> None:
    items = [Req(type="a"), Req(type="b", timeout=_dur(-1)), Req(type="c")]
    info = await _refused(
        api.stub.SubmitBatch(task_service_pb2.SubmitBatchRequest(tasks=items), metadata=api.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "tasks[1].timeout"
    assert await api.counts() == (0, 0)

    too_many = [Req(type="a")] * (CONFIG.limits.max_batch_tasks + 1)
    info = await _refused(
        api.stub.SubmitBatch(
            task_service_pb2.SubmitBatchRequest(tasks=too_many), metadata=api.auth
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "tasks"
    assert await api.counts() == (0, 0)


async def test_a_batch_of_several_chunks_is_written_whole_or_not_at_all(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Keyless batches are validated and written a chunk at a time in one transaction
    # (SubmitStore.insert_streamed): a bad item in the last chunk, after the first chunks'
    # rows went to PostgreSQL, must still leave nothing behind. Chunks of 4 here: this
    # servicer takes batches of at most 20.
    monkeypatch.setattr(task_servicer, "SUBMIT_CHUNK", 4)
    size = 2 * 4 + 3
    bad = [Req(type=f"t{i}") for i in range(size - 1)] + [Req(type="x", timeout=_dur(-1))]
    info = await _refused(
        api.stub.SubmitBatch(task_service_pb2.SubmitBatchRequest(tasks=bad), metadata=api.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == f"tasks[{size - 1}].timeout"
    assert await api.counts() == (0, 0)
    assert api.listener.submitted == []

    good = [Req(type=f"t{i}", payload_json=f'{{"i": {i}}}'.encode()) for i in range(size)]
    response = await api.stub.SubmitBatch(
        task_service_pb2.SubmitBatchRequest(tasks=good), metadata=api.auth
    )
    results = [r.submitted for r in response.results]
    assert [r.task.type for r in results] == [f"t{i}" for i in range(size)]
    assert [json.loads(r.task.payload_json) for r in results] == [{"i": i} for i in range(size)]
    assert all(r.created for r in results)
    assert len({r.task.id for r in results}) == size
    assert await api.counts() == (size, 0)
    assert [str(t.id) for t in api.listener.submitted] == [r.task.id for r in results]


@dataclass
class CallCounter:
    """A store's DatabaseTimings: counts the pooled connections it handed out."""

    acquired_count: int = 0

    def acquired(self, wait_s: float) -> None:
        self.acquired_count += 1

    def released(self, kind: str, held_s: float) -> None:
        pass


async def test_a_batch_over_the_submit_rate_is_refused_before_it_reaches_postgresql(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A keyless batch is written chunk by chunk as it is validated; over the submit rate
    # it must still be refused without any database work (api/quotas.py), and after
    # validation: an invalid batch hears of its invalid item, not of the rate.
    monkeypatch.setattr(task_servicer, "SUBMIT_CHUNK", 4)
    counter = CallCounter()
    quotas = SubmitQuotas("node-1", FakeClock(), lambda _: 10.0, lambda: ["node-1"])
    async with await Store.open(api.dsn, min_size=1, max_size=2, timings=counter) as watched:
        # Authentication reads through the fixture's store: the watched one serves
        # only the submits.
        server, port = await _serve(
            watched, Authenticator(TenantStore(api.store)), Recorder(), quotas
        )
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = Stub(channel)
                # The bucket is full (10 tokens): a batch of 15 goes, and leaves a debt.
                batch = task_service_pb2.SubmitBatchRequest(
                    tasks=[Req(type=f"t{i}") for i in range(15)]
                )
                assert len((await stub.SubmitBatch(batch, metadata=api.auth)).results) == 15
                calls = counter.acquired_count
                info = await _refused(
                    stub.SubmitBatch(batch, metadata=api.auth), grpc.StatusCode.RESOURCE_EXHAUSTED
                )
                assert info.reason == "QUOTA_EXCEEDED"
                invalid = task_service_pb2.SubmitBatchRequest(
                    tasks=[Req(type="a"), Req(type="b", timeout=_dur(-1))]
                )
                info = await _refused(
                    stub.SubmitBatch(invalid, metadata=api.auth), grpc.StatusCode.INVALID_ARGUMENT
                )
                assert info.field == "tasks[1].timeout"
                assert counter.acquired_count == calls, "a refused batch reached PostgreSQL"
        finally:
            await server.stop(grace=None)
    assert await api.counts() == (15, 0)


# --- submit stream -----------------------------------------------------------------------


def _streamed(req: Req, **trace: str) -> task_service_pb2.SubmitStreamRequest:
    return task_service_pb2.SubmitStreamRequest(task=req, trace_context=trace)


async def _stream(
    stub: Stub, metadata: Sequence[tuple[str, str]], requests: Sequence[Any]
) -> list[task_service_pb2.SubmitStreamReply]:
    """Every request written before any answer is read (the node reads ahead), then the
    answers."""
    call = stub.SubmitStream(metadata=metadata, timeout=20)
    for request in requests:
        await call.write(request)
    await call.done_writing()
    return [reply async for reply in call]


async def test_a_stream_answers_each_submit_in_order_and_a_refusal_leaves_it_open(
    api: Api,
) -> None:
    requests = [
        _streamed(Req(type="a", payload_json='{"s": "é", "n": 1.5}'.encode())),
        _streamed(Req(type="b", timeout=_dur(-1))),
        _streamed(Req(type="c", idempotency_key="k1")),
        _streamed(Req(type="d", idempotency_key="k1")),
        _streamed(Req(type="c", idempotency_key="k1")),
        _streamed(Req(type="e"), traceparent=TRACEPARENT, tracestate="vendor=1"),
        _streamed(Req(type="f"), traceparent="not a traceparent"),
    ]
    replies = await _stream(api.stub, api.auth, requests)
    outcomes = [r.WhichOneof("outcome") for r in replies]
    assert outcomes == ["submitted", "error", "submitted", "error", "submitted"] + ["submitted"] * 2
    a, bad, c, clash, repeat, e, f = replies
    assert [r.submitted.task.type for r in (a, c, repeat, e, f)] == ["a", "c", "c", "e", "f"]
    assert bad.error.code == "INVALID_ARGUMENT"
    assert bad.error.field == "task.timeout"
    assert clash.error.code == "ALREADY_EXISTS"
    assert clash.error.field == "task.idempotency_key"
    assert not bad.error.retryable and not clash.error.retryable
    assert (c.submitted.created, repeat.submitted.created) == (True, False)
    assert repeat.submitted.task.id == c.submitted.task.id
    assert dict(e.submitted.task.trace_context) == {
        "traceparent": TRACEPARENT,
        "tracestate": "vendor=1",
    }
    assert not f.submitted.task.trace_context
    # Each answer is the committed row, exactly as sent.
    for reply in (a, c, e, f):
        got = await api.stub.GetTask(
            task_service_pb2.GetTaskRequest(id=reply.submitted.task.id), metadata=api.auth
        )
        assert got.task == reply.submitted.task
    # Stored as every payload is: compact, keys sorted, characters kept.
    assert a.submitted.task.payload_json == '{"n":1.5,"s":"é"}'.encode()
    assert await api.counts() == (4, 1)
    assert len(api.listener.submitted) == 4


async def test_a_stream_holds_more_requests_than_it_reads_ahead(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past STREAM_IN_FLIGHT the node stops reading until an answer goes out; the caller
    # that wrote everything first still gets every answer, in order.
    monkeypatch.setattr(task_servicer, "STREAM_IN_FLIGHT", 2)
    requests = [_streamed(Req(type=f"t{i}", payload_json=b'{"i": %d}' % i)) for i in range(25)]
    replies = await _stream(api.stub, api.auth, requests)
    assert [json.loads(r.submitted.task.payload_json) for r in replies] == [
        {"i": i} for i in range(25)
    ]
    assert await api.counts() == (25, 0)


async def test_a_stream_without_a_valid_key_is_refused_and_writes_nothing(api: Api) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _stream(api.stub, (("authorization", "Bearer nope"),), [_streamed(Req(type="a"))])
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    info = error_info_from_metadata(raised.value.trailing_metadata())
    assert info is not None and info.code == "UNAUTHENTICATED"
    assert await api.counts() == (0, 0)


async def test_a_stream_over_the_submit_rate_refuses_the_excess_with_its_delay(
    api: Api,
) -> None:
    # A bucket of 3 on a clock that does not move: the fourth and fifth submits are
    # refused with the wait they need, and the stream goes on.
    quotas = SubmitQuotas("node-1", FakeClock(), lambda _: 3.0, lambda: ["node-1"])
    server, port = await _serve(
        api.store, Authenticator(TenantStore(api.store)), Recorder(), quotas
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            requests = [_streamed(Req(type=f"t{i}")) for i in range(5)]
            replies = await _stream(Stub(channel), api.auth, requests)
    finally:
        await server.stop(grace=None)
    assert [r.WhichOneof("outcome") for r in replies] == ["submitted"] * 3 + ["error"] * 2
    for refused in replies[3:]:
        assert refused.error.code == "RESOURCE_EXHAUSTED"
        assert refused.error.retryable
        assert refused.retry_after_s > 0
    assert await api.counts() == (3, 0)


async def test_batch_answers_in_order_and_dedupes_keys(api: Api) -> None:
    original = await api.submit(Req(type="first", idempotency_key="k-old"))
    items = [
        Req(type="a", payload_json=b'{"i": 0}'),
        Req(type="first", idempotency_key="k-old"),
        Req(type="b", idempotency_key="k-new"),
        Req(type="b", idempotency_key="k-new"),
    ]
    response = await api.stub.SubmitBatch(
        task_service_pb2.SubmitBatchRequest(tasks=items), metadata=api.auth
    )
    results = [r.submitted for r in response.results]
    assert all(r.WhichOneof("outcome") == "submitted" for r in response.results)
    assert [r.task.type for r in results] == ["a", "first", "b", "b"]
    assert [r.created for r in results] == [True, False, True, False]
    assert results[1].task.id == original.task.id
    assert results[3].task.id == results[2].task.id
    assert await api.counts() == (3, 2)

    clash = [Req(type="c", idempotency_key="k-x"), Req(type="d", idempotency_key="k-x")]
    info = await _refused(
        api.stub.SubmitBatch(task_service_pb2.SubmitBatchRequest(tasks=clash), metadata=api.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "tasks[1].idempotency_key"
    conflict = [Req(type="e"), Req(type="other", idempotency_key="k-old")]
    info = await _refused(
        api.stub.SubmitBatch(
            task_service_pb2.SubmitBatchRequest(tasks=conflict), metadata=api.auth
        ),
        grpc.StatusCode.ALREADY_EXISTS,
    )
    assert info.field == "tasks[1].idempotency_key"
    assert await api.counts() == (3, 2)


# --- authentication and tenant isolation ----------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("authorization", "Bearer cs_not-a-key-anyone-has"),),
        (("authorization", "Basic dXNlcjpwYXNz"),),
    ],
    ids=["missing", "unknown", "malformed"],
)
async def test_calls_without_a_valid_key_are_unauthenticated(
    api: Api, metadata: tuple[tuple[str, str], ...]
) -> None:
    info = await _refused(
        api.stub.SubmitTask(Req(type="t"), metadata=metadata), grpc.StatusCode.UNAUTHENTICATED
    )
    assert info.reason == "UNAUTHENTICATED"
    await _refused(
        api.stub.ListTasks(task_service_pb2.ListTasksRequest(), metadata=metadata),
        grpc.StatusCode.UNAUTHENTICATED,
    )
    assert await api.counts() == (0, 0)


async def test_another_tenants_task_is_not_found_and_invisible(api: Api) -> None:
    other, other_key = await tenant_with_key(api.store)
    theirs = await api.stub.SubmitTask(
        Req(type="secret"), metadata=(("authorization", f"Bearer {other_key}"),)
    )
    mine = await api.submit(Req(type="mine"))
    task_id = theirs.task.id

    for call in (
        api.stub.GetTask(task_service_pb2.GetTaskRequest(id=task_id), metadata=api.auth),
        api.stub.CancelTask(task_service_pb2.CancelTaskRequest(id=task_id), metadata=api.auth),
        api.stub.RetryTask(task_service_pb2.RetryTaskRequest(id=task_id), metadata=api.auth),
    ):
        info = await _refused(call, grpc.StatusCode.NOT_FOUND)
        assert info.reason == "TASK_NOT_FOUND"
    # Exactly what a task that never existed answers.
    missing = await _refused(
        api.stub.GetTask(task_service_pb2.GetTaskRequest(id=str(uuid.uuid4())), metadata=api.auth),
        grpc.StatusCode.NOT_FOUND,
    )
    assert missing.reason == "TASK_NOT_FOUND"

    listed = await api.stub.ListTasks(task_service_pb2.ListTasksRequest(), metadata=api.auth)
    assert [t.id for t in listed.tasks] == [mine.task.id]
    rows = await api.sql("SELECT status FROM tasks WHERE id = %(id)s", {"id": task_id})
    assert rows == [("SCHEDULED",)]
    assert await api.counts(other) == (1, 0)


async def test_unexpected_errors_are_internal_and_logged(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        async def get_tenant_by_key_hash(self, api_key_hash: str) -> Tenant | None:
            raise RuntimeError("bug: secret detail")

    server, port = await _serve(store, Authenticator(Broken()), Recorder())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with caplog.at_level(logging.ERROR, logger="chronoshard.scheduler.api.boundary"):
                info = await _refused(
                    Stub(channel).SubmitTask(
                        Req(type="t"), metadata=(("authorization", "Bearer cs_x"),)
                    ),
                    grpc.StatusCode.INTERNAL,
                )
    finally:
        await server.stop(grace=None)
    assert "secret" not in info.message
    # The servicers' one error boundary (boundary.serve) logs it, naming the RPC.
    [record] = [r for r in caplog.records if r.name == "chronoshard.scheduler.api.boundary"]
    assert record.getMessage() == "TaskService.SubmitTask failed"
    assert record.exc_info is not None and "secret detail" in str(record.exc_info[1])


# --- idempotency ----------------------------------------------------------------------


async def test_concurrent_repeats_create_one_task(api: Api) -> None:
    # No time in the request: "now". Each repeat resolves to a later instant, and must
    # still be recognised as the same request.
    req = Req(type="charge", payload_json=b'{"amount": 5}', idempotency_key="pay-1")
    responses = await asyncio.gather(*(api.submit(req) for _ in range(20)))
    assert len({r.task.id for r in responses}) == 1
    assert sorted(r.created for r in responses) == [False] * 19 + [True]
    assert await api.counts() == (1, 1)
    assert len(api.listener.submitted) == 1


async def test_a_delayed_submit_repeated_later_is_the_same_request(api: Api) -> None:
    req = Req(type="remind", delay=_dur(3600), idempotency_key="remind-1")
    first = await api.submit(req)
    again = await api.submit(req)
    assert (first.created, again.created) == (True, False)
    assert again.task == first.task
    changed = Req(type="remind", delay=_dur(60), idempotency_key="remind-1")
    info = await _refused(api.submit(changed), grpc.StatusCode.ALREADY_EXISTS)
    assert info.field == "idempotency_key"


async def test_same_key_with_another_payload_is_already_exists(api: Api) -> None:
    first = await api.submit(Req(type="t", payload_json=b'{"v": 1}', idempotency_key="k"))
    # The same JSON spelled differently is the same request.
    same = await api.submit(Req(type="t", payload_json=b'{ "v" : 1 }', idempotency_key="k"))
    assert same.task.id == first.task.id and not same.created
    info = await _refused(
        api.submit(Req(type="t", payload_json=b'{"v": 2}', idempotency_key="k")),
        grpc.StatusCode.ALREADY_EXISTS,
    )
    assert info.reason == "IDEMPOTENCY_KEY_REUSED"
    assert info.field == "idempotency_key"
    assert first.task.id in info.message
    assert await api.counts() == (1, 1)


# --- list -----------------------------------------------------------------------------


async def _walk(api: Api, req: task_service_pb2.ListTasksRequest) -> list[common_pb2.Task]:
    seen: list[common_pb2.Task] = []
    pages = 0
    while True:
        page = await api.stub.ListTasks(req, metadata=api.auth)
        pages += 1
        assert len(page.tasks) <= (req.page_size or MAX_PAGE)
        seen.extend(page.tasks)
        if not page.next_page_token:
            return seen
        assert pages < 100, "paging does not end"
        req.page_token = page.next_page_token


async def test_list_pages_walk_every_match_exactly_once(api: Api) -> None:
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    items = [
        # Pairs share a scheduled_at: the id breaks the tie across page boundaries.
        Req(
            type="even" if i % 2 == 0 else "odd",
            scheduled_at=_ts(base + timedelta(minutes=i // 2)),
            queue="q1" if i % 3 == 0 else "q2",
            job_id="nightly" if i < 10 else "",
            payload_json=b'{"i": %d}' % i,
            strict_timing=True,
        )
        for i in range(20)
    ]
    response = await api.stub.SubmitBatch(
        task_service_pb2.SubmitBatchRequest(tasks=items), metadata=api.auth
    )
    tasks = [r.submitted.task for r in response.results]
    await api.sql(
        "UPDATE tasks SET status = 'CANCELLED' WHERE id = ANY(%(ids)s)",
        {"ids": [uuid.UUID(t.id) for t in tasks[:5]]},
    )

    def order(ts: Sequence[common_pb2.Task]) -> list[str]:
        return [t.id for t in sorted(ts, key=lambda t: (_at(t, "scheduled_at"), t.id))]

    everything = await _walk(api, task_service_pb2.ListTasksRequest(page_size=3))
    assert [t.id for t in everything] == order(tasks)
    assert all(t.payload_json == b"" for t in everything)

    cases = [
        (task_service_pb2.ListTasksRequest(type="even"), lambda i: i % 2 == 0),
        (
            task_service_pb2.ListTasksRequest(queue="q1", job_id="nightly"),
            lambda i: i % 3 == 0 and i < 10,
        ),
        (
            task_service_pb2.ListTasksRequest(statuses=[common_pb2.TASK_STATUS_CANCELLED]),
            lambda i: i < 5,
        ),
        (
            task_service_pb2.ListTasksRequest(
                scheduled_at=task_service_pb2.TimeRange(
                    start=_ts(base + timedelta(minutes=2)), end=_ts(base + timedelta(minutes=7))
                )
            ),
            lambda i: 4 <= i < 14,
        ),
        (
            task_service_pb2.ListTasksRequest(
                due_at=task_service_pb2.TimeRange(start=_ts(base + timedelta(minutes=8)))
            ),
            lambda i: i >= 16,
        ),
    ]
    for req, wanted in cases:
        req.page_size = 2
        req.include_payloads = True
        found = await _walk(api, req)
        assert [t.id for t in found] == order([t for i, t in enumerate(tasks) if wanted(i)]), req
        assert all(t.payload_json for t in found)

    # page_size above the cap is capped; 0 means the default (100, capped here as well).
    for size in (0, 1000):
        page = await api.stub.ListTasks(
            task_service_pb2.ListTasksRequest(page_size=size), metadata=api.auth
        )
        assert len(page.tasks) == MAX_PAGE and page.next_page_token


async def test_list_refuses_bad_tokens_and_filters(api: Api) -> None:
    for i in range(3):
        await api.submit(Req(type="t", delay=_dur(i)))
    page = await api.stub.ListTasks(
        task_service_pb2.ListTasksRequest(page_size=1, type="t"), metadata=api.auth
    )
    token = page.next_page_token
    assert token
    bad_requests = [
        (task_service_pb2.ListTasksRequest(page_token="not a token!"), "page_token"),
        (task_service_pb2.ListTasksRequest(page_token=token[:-3]), "page_token"),
        # A token only works with the filters it was issued for.
        (task_service_pb2.ListTasksRequest(page_token=token, type="u"), "page_token"),
        (task_service_pb2.ListTasksRequest(statuses=[0]), "statuses[0]"),
        (
            task_service_pb2.ListTasksRequest(
                due_at=task_service_pb2.TimeRange(
                    start=_ts(datetime.now(UTC)), end=_ts(datetime.now(UTC) - timedelta(hours=1))
                )
            ),
            "due_at.end",
        ),
    ]
    for req, wanted_field in bad_requests:
        info = await _refused(
            api.stub.ListTasks(req, metadata=api.auth), grpc.StatusCode.INVALID_ARGUMENT
        )
        assert info.field == wanted_field
    rest = await api.stub.ListTasks(
        task_service_pb2.ListTasksRequest(page_token=token, type="t"), metadata=api.auth
    )
    assert len(rest.tasks) == 2 and not rest.next_page_token


# --- get, cancel, retry ---------------------------------------------------------------


async def _make_state(api: Api, task_id: str, status: str, attempt_state: str | None) -> None:
    """Put a task where a worker would have: one attempt in ``attempt_state``."""
    await api.sql(
        "UPDATE tasks SET status = %(s)s, attempt = 1, fencing_token = 1, worker_id = 'w1',"
        " lease_expires_at = now() + interval '30 s' WHERE id = %(id)s",
        {"s": status, "id": task_id},
    )
    if attempt_state is not None:
        await api.sql(
            "INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state,"
            " worker_id) SELECT id, 1, scheduled_at, 1, %(s)s, 'w1' FROM tasks WHERE id = %(id)s",
            {"s": attempt_state, "id": task_id},
        )


async def test_get_with_attempts_and_a_malformed_id(api: Api) -> None:
    task = (await api.submit(Req(type="t"))).task
    await _make_state(api, task.id, "RUNNING", "RUNNING")
    got = await api.stub.GetTask(
        task_service_pb2.GetTaskRequest(id=task.id, include_attempts=True), metadata=api.auth
    )
    assert got.task.status == common_pb2.TASK_STATUS_RUNNING
    assert [(a.attempt, a.state, a.worker_id) for a in got.attempts] == [
        (1, common_pb2.ATTEMPT_STATE_RUNNING, "w1")
    ]
    plain = await api.stub.GetTask(task_service_pb2.GetTaskRequest(id=task.id), metadata=api.auth)
    assert list(plain.attempts) == []
    info = await _refused(
        api.stub.GetTask(task_service_pb2.GetTaskRequest(id="nope"), metadata=api.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "id"


async def test_cancel_pending_is_immediate_and_idempotent(api: Api) -> None:
    task = (await api.submit(Req(type="t", delay=_dur(600)))).task
    cancelled = await api.stub.CancelTask(
        task_service_pb2.CancelTaskRequest(id=task.id, reason="not needed"), metadata=api.auth
    )
    assert cancelled.task.status == common_pb2.TASK_STATUS_CANCELLED
    assert cancelled.task.last_error == "not needed"
    assert cancelled.task.HasField("finished_at")
    assert [(t.id, r) for t, r in api.listener.cancels] == [(uuid.UUID(task.id), "not needed")]

    again = await api.stub.CancelTask(
        task_service_pb2.CancelTaskRequest(id=task.id, reason="other"), metadata=api.auth
    )
    assert again.task == cancelled.task
    assert len(api.listener.cancels) == 1


async def test_cancel_dispatched_cancels_its_attempt(api: Api) -> None:
    task = (await api.submit(Req(type="t"))).task
    await _make_state(api, task.id, "DISPATCHED", "DISPATCHED")
    cancelled = await api.stub.CancelTask(
        task_service_pb2.CancelTaskRequest(id=task.id), metadata=api.auth
    )
    assert cancelled.task.status == common_pb2.TASK_STATUS_CANCELLED
    assert cancelled.task.last_error == "cancelled by client"
    assert not cancelled.task.HasField("lease_expires_at")
    rows = await api.sql(
        "SELECT state, finished_at IS NOT NULL FROM task_attempts WHERE task_id = %(id)s",
        {"id": task.id},
    )
    assert rows == [("CANCELLED", True)]


async def test_cancel_running_records_the_request(api: Api) -> None:
    task = (await api.submit(Req(type="t"))).task
    await _make_state(api, task.id, "RUNNING", "RUNNING")
    response = await api.stub.CancelTask(
        task_service_pb2.CancelTaskRequest(id=task.id, reason="stop it"), metadata=api.auth
    )
    assert response.task.status == common_pb2.TASK_STATUS_RUNNING
    rows = await api.sql(
        "SELECT t.status, t.cancel_requested_at IS NOT NULL, t.cancel_reason, a.state"
        " FROM tasks t JOIN task_attempts a ON a.task_id = t.id WHERE t.id = %(id)s",
        {"id": task.id},
    )
    assert rows == [("RUNNING", True, "stop it", "RUNNING")]
    [(told, reason)] = api.listener.cancels
    assert (told.id, told.status, reason) == (uuid.UUID(task.id), "RUNNING", "stop it")


async def test_cancel_of_a_finished_task_fails_precondition(api: Api) -> None:
    task = (await api.submit(Req(type="t"))).task
    await api.sql("UPDATE tasks SET status = 'COMPLETED' WHERE id = %(id)s", {"id": task.id})
    info = await _refused(
        api.stub.CancelTask(task_service_pb2.CancelTaskRequest(id=task.id), metadata=api.auth),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert info.reason == "TASK_ALREADY_FINISHED"
    info = await _refused(
        api.stub.CancelTask(
            task_service_pb2.CancelTaskRequest(id=task.id, reason="x" * 1001), metadata=api.auth
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "reason"
    assert api.listener.cancels == []


async def test_cancel_racing_a_completion_is_aborted(api: Api) -> None:
    task = (await api.submit(Req(type="t"))).task
    # Another transaction holds the row, about to complete it; the cancel reads the old
    # state, then waits on the row lock, and finds COMPLETED once it gets it.
    async with await psycopg.AsyncConnection.connect(api.dsn) as racer:
        await racer.execute(
            "UPDATE tasks SET status = 'COMPLETED' WHERE id = %(id)s", {"id": task.id}
        )
        cancel = asyncio.ensure_future(
            api.stub.CancelTask(task_service_pb2.CancelTaskRequest(id=task.id), metadata=api.auth)
        )

        async def cancel_waits_on_the_lock() -> bool:
            rows = await api.sql(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
                " AND query LIKE '%%UPDATE tasks AS t%%'",
                {},
            )
            return bool(rows)

        await eventually(cancel_waits_on_the_lock, timeout_s=10, what="the cancel to block")
        await racer.commit()
        info = await _refused(cancel, grpc.StatusCode.ABORTED)
    assert info.reason == "COMPARE_AND_SET_LOST" and info.retryable
    # Sent again, the cancel sees the new state.
    info = await _refused(
        api.stub.CancelTask(task_service_pb2.CancelTaskRequest(id=task.id), metadata=api.auth),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert info.reason == "TASK_ALREADY_FINISHED"


async def test_retry_of_a_dead_lettered_task(api: Api) -> None:
    task = (await api.submit(Req(type="t", max_retries=2))).task
    await api.sql(
        "UPDATE tasks SET status = 'DEAD_LETTER', attempt = 3, fencing_token = 3,"
        " retry_count = 2, finished_at = now(), last_error = 'boom' WHERE id = %(id)s",
        {"id": task.id},
    )
    api.listener.submitted.clear()
    before = datetime.now(UTC)
    retried = await api.stub.RetryTask(
        task_service_pb2.RetryTaskRequest(id=task.id, delay=_dur(30)), metadata=api.auth
    )
    t = retried.task
    assert t.status == common_pb2.TASK_STATUS_SCHEDULED
    assert (t.retry_count, t.attempt, t.fencing_token, t.last_error) == (0, 3, 3, "boom")
    assert not t.HasField("finished_at")
    assert (
        before + timedelta(seconds=30)
        <= _at(t, "due_at")
        <= datetime.now(UTC) + timedelta(seconds=30)
    )
    assert _at(t, "scheduled_at") == _at(task, "scheduled_at")
    assert [x.id for x in api.listener.submitted] == [uuid.UUID(task.id)]

    # SCHEDULED now: not retryable, and neither is any other state but DEAD_LETTER.
    info = await _refused(
        api.stub.RetryTask(task_service_pb2.RetryTaskRequest(id=task.id), metadata=api.auth),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert info.reason == "INVALID_TRANSITION"
    info = await _refused(
        api.stub.RetryTask(
            task_service_pb2.RetryTaskRequest(id=task.id, delay=_dur(-1)), metadata=api.auth
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "delay"


async def _outcome_unknown(api: Api, task: common_pb2.Task) -> None:
    """As the reconciler leaves a lost non-idempotent attempt (migration 0008)."""
    await api.sql(
        "UPDATE tasks SET status = 'OUTCOME_UNKNOWN', attempt = 1, fencing_token = 1,"
        " worker_id = 'w-lost', last_error = 'lease expired' WHERE id = %(id)s",
        {"id": task.id},
    )
    await api.sql(
        "INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state,"
        " worker_id, finished_at, error) SELECT id, 1, scheduled_at, 1, 'OUTCOME_UNKNOWN',"
        " 'w-lost', now(), 'lease expired' FROM tasks WHERE id = %(id)s",
        {"id": task.id},
    )


def _resolve(task_id: str, resolution: int, reason: str = "") -> Any:
    return task_service_pb2.ResolveTaskRequest(id=task_id, resolution=resolution, reason=reason)  # type: ignore[arg-type]


async def test_resolve_of_an_outcome_unknown_task(api: Api) -> None:
    retry, fail = common_pb2.RESOLUTION_RETRY, common_pb2.RESOLUTION_MARK_FAILED
    again = (await api.submit(Req(type="t", max_retries=2))).task
    failed = (await api.submit(Req(type="t"))).task
    for task in (again, failed):
        await _outcome_unknown(api, task)
    api.listener.submitted.clear()

    # Bad requests first: nothing is written.
    info = await _refused(
        api.stub.ResolveTask(_resolve(again.id, 0), metadata=api.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert (info.field, info.message) == ("resolution", "resolution: must be RETRY or MARK_FAILED")
    info = await _refused(
        api.stub.ResolveTask(_resolve(again.id, retry, "x" * 1001), metadata=api.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "reason"
    _, other_key = await tenant_with_key(api.store)
    await _refused(
        api.stub.ResolveTask(
            _resolve(again.id, retry), metadata=(("authorization", f"Bearer {other_key}"),)
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    assert (await api.sql("SELECT status FROM tasks WHERE id = %(id)s", {"id": again.id})) == [
        ("OUTCOME_UNKNOWN",)
    ]

    # RETRY: back to SCHEDULED, due now, token and retries kept; the node is told.
    resolved = await api.stub.ResolveTask(
        _resolve(again.id, retry, "no charge row"), metadata=api.auth
    )
    t = resolved.task
    assert (t.status, t.fencing_token, t.retry_count) == (common_pb2.TASK_STATUS_SCHEDULED, 1, 0)
    assert "run again (no charge row)" in t.last_error
    assert [x.id for x in api.listener.submitted] == [uuid.UUID(again.id)]
    # A repeat is answered with the task as it is, writing nothing, telling nobody.
    repeat = await api.stub.ResolveTask(_resolve(again.id, retry), metadata=api.auth)
    assert repeat.task.status == common_pb2.TASK_STATUS_SCHEDULED
    assert len(api.listener.submitted) == 1
    info = await _refused(
        api.stub.ResolveTask(_resolve(again.id, fail), metadata=api.auth),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert info.reason == "NOTHING_TO_RESOLVE"

    # MARK_FAILED: DEAD_LETTER with the reason; the attempt records the resolution.
    marked = await api.stub.ResolveTask(
        _resolve(failed.id, fail, "charged twice already"), metadata=api.auth
    )
    assert marked.task.status == common_pb2.TASK_STATUS_DEAD_LETTER
    assert marked.task.last_error == "marked failed by an operator: charged twice already"
    got = await api.stub.GetTask(
        task_service_pb2.GetTaskRequest(id=failed.id, include_attempts=True), metadata=api.auth
    )
    [attempt] = got.attempts
    assert attempt.state == common_pb2.ATTEMPT_STATE_OUTCOME_UNKNOWN
    assert attempt.resolution == common_pb2.RESOLUTION_MARK_FAILED
    assert "charged twice already" in attempt.error

    # A task that was never unknown has nothing to resolve.
    plain = (await api.submit(Req(type="t"))).task
    info = await _refused(
        api.stub.ResolveTask(_resolve(plain.id, retry), metadata=api.auth),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert info.reason == "NOTHING_TO_RESOLVE" and "SCHEDULED" in info.message


async def test_retry_and_cancel_of_an_outcome_unknown_task(api: Api) -> None:
    retried = (await api.submit(Req(type="t"))).task
    cancelled = (await api.submit(Req(type="t"))).task
    for task in (retried, cancelled):
        await _outcome_unknown(api, task)
    # RetryTask on it is a RETRY resolution, recorded as such.
    t = (
        await api.stub.RetryTask(
            task_service_pb2.RetryTaskRequest(id=retried.id), metadata=api.auth
        )
    ).task
    assert t.status == common_pb2.TASK_STATUS_SCHEDULED
    got = await api.stub.GetTask(
        task_service_pb2.GetTaskRequest(id=retried.id, include_attempts=True), metadata=api.auth
    )
    assert [a.resolution for a in got.attempts] == [common_pb2.RESOLUTION_RETRY]
    # CancelTask ends it at once (nothing runs it).
    c = (
        await api.stub.CancelTask(
            task_service_pb2.CancelTaskRequest(id=cancelled.id, reason="not needed"),
            metadata=api.auth,
        )
    ).task
    assert c.status == common_pb2.TASK_STATUS_CANCELLED and c.last_error == "not needed"
