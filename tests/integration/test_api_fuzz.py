"""Bad input against one real node (gRPC on port 0, real PostgreSQL and etcd), drawn by
hypothesis: raw bytes to every unary method of every service the node hosts, fields past
every size limit, and the numbers JSON can say in payloads and results.

What every answer must be, whatever was sent:

- a status a caller can act on: OK, or a refusal that names the input or the state
  (INVALID_ARGUMENT, RESOURCE_EXHAUSTED for an over-size message, UNAUTHENTICATED,
  NOT_FOUND, ...), never UNKNOWN or INTERNAL;
- a readable message of at most 1 KiB and trailers far under gRPC's 8 KiB header limit,
  with the ``ErrorInfo`` every Chronoshard refusal carries;
- for a refusal: nothing written (every row of the tables a call can touch is compared
  before and after);
- for an accepted payload or result: the same numbers read back, compared as Decimals;
- and the node logs no ERROR (no traceback) for any of it.

The examples are derandomized, so CI runs the same ones every time.
"""

from __future__ import annotations

import asyncio
import decimal
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import grpc
import psycopg
import pytest
import uvloop
from google.protobuf import duration_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from chronoshard import exact_json
from chronoshard._convert import decode_json
from chronoshard.scheduler.api.payloads import MAX_DEPTH, MAX_NUMBER_DIGITS
from chronoshard.scheduler.config import (
    DatabaseConfig,
    EtcdConfig,
    GrpcConfig,
    LimitsConfig,
    SchedulerConfig,
)
from chronoshard.scheduler.errors import UNAUTHENTICATED_MESSAGE
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess
from chronoshard.v1 import (
    admin_service_pb2,
    common_pb2,
    task_service_pb2,
    watchdog_service_pb2,
    worker_service_pb2,
)
from chronoshard.wire import error_info_from_metadata

PAYLOAD_LIMIT = 16 * 1024
MAX_MESSAGE = 2 * 1024 * 1024
"""Over the 1 MiB fields below, so those reach the servicers."""
CLIENT_WRITE_AFTER_END = "Internal error from Core"
MESSAGE_BOUND = 1024
TRAILER_BOUND = 4096
"""Half of gRPC's default 8 KiB header limit."""

Metadata = tuple[tuple[str, str], ...]

# Refusals about the input, and about the state it names (a Complete for a task that is
# not running, a DrainNode with a tenant key): a caller learns what to do from each.
ACCEPTABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
}


# The numbers JSON can say, as text: what a double holds and what it does not.
JSON_NUMBER = st.from_regex(
    r"-?(0|[1-9][0-9]{0,60})(\.[0-9]{1,60})?([eE][-+]?[0-9]{1,4})?", fullmatch=True
)
NUMBERS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),  # subnormals, -0.0, 1e308
    st.integers(min_value=-(2**200), max_value=2**200).map(str),  # past 2**53 and 2**64
    st.decimals(allow_nan=False, allow_infinity=False).map(str),
    JSON_NUMBER,
)


def _unary_methods() -> dict[str, type[Message]]:
    """Every unary method of every service the node hosts, with its request type."""
    methods = {}
    for module, name in (
        (task_service_pb2, "TaskService"),
        (worker_service_pb2, "WorkerService"),
        (admin_service_pb2, "AdminService"),
        (watchdog_service_pb2, "WatchdogService"),
        (health_pb2, "Health"),
    ):
        service = module.DESCRIPTOR.services_by_name[name]
        for m in service.methods:
            if not m.client_streaming and not m.server_streaming:
                methods[f"/{service.full_name}/{m.name}"] = GetMessageClass(m.input_type)
    return methods


UNARY_METHODS = _unary_methods()
OUR_SERVICES = ("/chronoshard.v1.",)


class ErrorRecords(logging.Handler):
    """Every ERROR (or worse) any logger of the process emits."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        """What was logged since the last take, with the start of any traceback."""
        formatter = logging.Formatter()
        taken = [
            f"{r.name}: {r.getMessage()}"
            + (f" {formatter.formatException(r.exc_info)[-600:]}" if r.exc_info else "")
            for r in self.records
        ]
        self.records.clear()
        return taken


@dataclass
class Node:
    runner: asyncio.Runner
    node: SchedulerNode
    channel: grpc.aio.Channel
    db: psycopg.AsyncConnection[Any]
    tenant_key: Metadata
    operator_key: Metadata
    errors: ErrorRecords

    def call(self, method: str, request: bytes, metadata: Metadata) -> Answer:
        return self.runner.run(self._call(method, request, metadata))

    async def _call(self, method: str, request: bytes, metadata: Metadata) -> Answer:
        # Identity serializers: the bytes go out exactly as drawn.
        stub = self.channel.unary_unary(method)
        try:
            response = await stub(request, metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return Answer(method, exc.code(), exc.details() or "", exc.trailing_metadata(), b"")
        return Answer(method, grpc.StatusCode.OK, "", (), response)

    def sql(self, statement: str, *args: Any) -> None:
        self.runner.run(self.db.execute(statement, args))

    def state(self) -> tuple[Any, ...]:
        """What a call could write, digested by PostgreSQL: every row, and of tasks every
        column but those the node's own preloader moves (status, updated_at: tasks
        submitted here are due at once, and the node preloads them while the test runs).
        Worker sessions are left out: the node records them in the background
        (cluster/liveness.py), so an earlier example's row may land at any time; a stream
        looks at its own worker's rows (:meth:`session_rows`)."""
        return self.runner.run(self._state())

    def session_rows(self, worker_id: str) -> int:
        """The worker_sessions rows of ``worker_id`` (none for a name with a NUL, which
        PostgreSQL cannot store, nor be asked about)."""
        if "\x00" in worker_id:
            return 0

        async def count() -> int:
            cursor = await self.db.execute(
                "SELECT count(*) FROM worker_sessions WHERE worker_id = %s", (worker_id,)
            )
            row = await cursor.fetchone()
            assert row is not None
            return int(row[0])

        return self.runner.run(count())

    async def _state(self) -> tuple[Any, ...]:
        cursor = await self.db.execute(
            "SELECT (SELECT md5(coalesce(string_agg(row(id, tenant_id, type, payload,"
            "   result_payload, checkpoint, fencing_token, attempt, retry_count, last_error,"
            "   cancel_requested_at, cancel_reason, finished_at, idempotency_key)::text,"
            "   ',' ORDER BY id), '')) FROM tasks),"
            " (SELECT md5(coalesce(string_agg(a::text, ',' ORDER BY task_id, attempt), ''))"
            "    FROM task_attempts a),"
            " (SELECT count(*) FROM idempotency_keys),"
            " (SELECT md5(coalesce(string_agg(e::text, ',' ORDER BY job_id), ''))"
            "    FROM expectations e),"
            " (SELECT count(*) FROM task_completions)"
        )
        row = await cursor.fetchone()
        assert row is not None
        return tuple(row)


@dataclass
class Answer:
    method: str
    code: grpc.StatusCode
    details: str
    trailers: Sequence[Any] | None
    body: bytes

    def check(self) -> common_pb2.ErrorInfo | None:
        """The properties every answer has; the ErrorInfo of a Chronoshard refusal."""
        assert self.code in ACCEPTABLE, (self.method, self.code, self.details[:200])
        if self.code is grpc.StatusCode.OK:
            return None
        assert len(self.details.encode("utf-8")) <= MESSAGE_BOUND, (self.method, self.details)
        if self.code is grpc.StatusCode.UNAUTHENTICATED:
            # One message, whatever was wrong with the key: no oracle of which keys exist.
            assert self.details == UNAUTHENTICATED_MESSAGE
        trailer_bytes = sum(len(k) + len(v) for k, v in self.trailers or ())
        assert trailer_bytes <= TRAILER_BOUND, (self.method, trailer_bytes)
        info = error_info_from_metadata(self.trailers)
        # Over-size messages are refused by gRPC itself, and Health is grpc's own service;
        # every other refusal is Chronoshard's, with its ErrorInfo.
        if self.code is not grpc.StatusCode.RESOURCE_EXHAUSTED and self.method.startswith(
            OUR_SERVICES
        ):
            assert info is not None, (self.method, self.code, self.details)
            assert info.code == self.code.name and info.message == self.details
        return info


@pytest.fixture(scope="module")
def api(db_dsn: str, etcd: EtcdProcess) -> Iterator[Node]:
    config = SchedulerConfig(
        node_id=f"fuzz-{uuid.uuid4().hex[:6]}",
        metrics_listen="127.0.0.1:0",
        etcd=EtcdConfig(endpoints=(etcd.endpoint,), cluster=f"c{uuid.uuid4().hex[:8]}"),
        database=DatabaseConfig(dsn=db_dsn, pool_min_size=1, pool_max_size=4),
        grpc=GrpcConfig(listen="127.0.0.1:0", max_message_bytes=MAX_MESSAGE),
        limits=LimitsConfig(payload_limit_bytes=PAYLOAD_LIMIT),
    )
    config = replace(config, scheduling=replace(config.scheduling, shard_count=4))
    tenant = create_tenant(db_dsn, f"fuzz-{uuid.uuid4().hex}")
    operator = create_tenant(db_dsn, f"fuzz-op-{uuid.uuid4().hex}", operator=True)
    errors = ErrorRecords()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        node = SchedulerNode(config)
        runner.run(node.start())
        assert node.addresses is not None
        address = node.addresses.grpc

        async def open_channel() -> grpc.aio.Channel:  # on the runner's loop, as it must be
            return grpc.aio.insecure_channel(
                address, options=[("grpc.max_send_message_length", -1)]
            )

        channel = runner.run(open_channel())
        db = runner.run(psycopg.AsyncConnection.connect(db_dsn, autocommit=True))
        KNOWN_TASKS[:] = runner.run(_known_tasks(channel, db, tenant.api_key))
        logging.getLogger().addHandler(errors)
        try:
            yield Node(
                runner,
                node,
                channel,
                db,
                (("authorization", f"Bearer {tenant.api_key}"),),
                (("authorization", f"Bearer {operator.api_key}"),),
                errors,
            )
        finally:
            logging.getLogger().removeHandler(errors)
            runner.run(db.close())
            runner.run(channel.close())
            runner.run(node.stop())


async def _known_tasks(
    channel: grpc.aio.Channel, db: psycopg.AsyncConnection[Any], api_key: str
) -> list[common_pb2.TaskRef]:
    """Four tasks: one due in an hour, one dispatched (token 1, leased), one completed,
    one in the dead letters."""
    submit = channel.unary_unary(
        "/chronoshard.v1.TaskService/SubmitTask",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=task_service_pb2.SubmitTaskResponse.FromString,
    )
    refs = []
    for _ in range(4):
        request = task_service_pb2.SubmitTaskRequest(
            type="known", delay=duration_pb2.Duration(seconds=3600)
        )
        task = (await submit(request, metadata=(("authorization", f"Bearer {api_key}"),))).task
        refs.append(common_pb2.TaskRef(id=task.id, scheduled_at=task.scheduled_at))
    for ref, status in zip(refs[1:], ("DISPATCHED", "COMPLETED", "DEAD_LETTER"), strict=True):
        await db.execute(
            "UPDATE tasks SET status = %s, fencing_token = 1, attempt = 1,"
            " lease_expires_at = CASE WHEN %s = 'DISPATCHED' THEN now() + interval '1 hour' END,"
            " finished_at = CASE WHEN %s <> 'DISPATCHED' THEN now() END WHERE id = %s",
            (status, status, status, uuid.UUID(ref.id)),
        )
    return refs


SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _refused_writes_nothing(api: Node, method: str, request: bytes, metadata: Metadata) -> Answer:
    before = api.state()
    answer = api.call(method, request, metadata)
    answer.check()
    if answer.code is not grpc.StatusCode.OK:
        assert api.state() == before, f"{method} refused with {answer.code} but wrote"
    assert api.errors.take() == []
    return answer


# --- raw bytes ---------------------------------------------------------------------------


@settings(SETTINGS, max_examples=600)
@example(method="/chronoshard.v1.TaskService/SubmitTask", data=b"\xff\xff\xff", key="tenant")
@example(method="/chronoshard.v1.WorkerService/Complete", data=b"\x0a\x05hello", key="tenant")
@given(
    method=st.sampled_from(sorted(UNARY_METHODS)),
    data=st.binary(max_size=300),
    key=st.sampled_from(["none", "tenant"]),
)
def test_raw_bytes_to_every_unary_method(api: Node, method: str, data: bytes, key: str) -> None:
    metadata = api.tenant_key if key == "tenant" else ()
    answer = _refused_writes_nothing(api, method, data, metadata)
    try:
        UNARY_METHODS[method].FromString(data)
    except DecodeError:
        assert answer.code is grpc.StatusCode.INVALID_ARGUMENT, (method, answer.details)
        info = error_info_from_metadata(answer.trailers)
        assert info is not None and info.reason == "MALFORMED_REQUEST"


# --- well-formed messages with drawn field values ----------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_TEXT = st.one_of(
    st.text(max_size=12),  # NUL, control characters, astral planes
    st.uuids().map(str),
    st.sampled_from(["", " ", "default", "t", "cs_x", "\x00", "a" * 201]),
)
_JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS.map(Decimal) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
).map(lambda value: exact_json.dumps(value).encode())


KNOWN_TASKS: list[common_pb2.TaskRef] = []
"""Tasks of the fuzzing tenant (the fixture makes them), so drawn requests also name
tasks that exist, in every state the fixture leaves them, and reach past the id checks."""
_TOKENS = st.sampled_from([0, 1, 2, 2**63 - 1, 2**63, 2**64 - 1])


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.name == "fencing_token":
        return st.one_of(_TOKENS, st.integers(0, 2**64 - 1))
    if field.type == FieldDescriptor.TYPE_STRING and (
        field.name == "id" or field.name.endswith("_id")
    ):
        known = st.sampled_from([ref.id for ref in KNOWN_TASKS] or [""])
        return st.one_of(known, st.uuids().map(str), _TEXT)
    if field.type in _INT_RANGES:
        low, high = _INT_RANGES[field.type]
        if field.type == FieldDescriptor.TYPE_ENUM:
            known = [v.number for v in field.enum_type.values]
            return st.one_of(st.sampled_from(known), st.integers(low, high))
        return st.one_of(
            st.sampled_from([low, high, 0, -1 if low else 2]),
            st.integers(1, 10),  # what counts (slots, page sizes, attempts) mostly are
            st.integers(low, high),
        )
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=64 if field.type == FieldDescriptor.TYPE_DOUBLE else 32)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        return _TEXT
    assert field.type == FieldDescriptor.TYPE_BYTES
    if field.name.endswith("_json") or field.name == "checkpoint":
        return st.one_of(_JSON, st.binary(max_size=16))
    return st.binary(max_size=16)


@st.composite
def protobuf(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Message:
    """A well-formed message of ``descriptor`` with drawn values in some of its fields
    (every oneof at most once, nested messages three levels deep at most)."""
    message = GetMessageClass(descriptor)()
    if depth > 3:
        return message
    if descriptor.full_name == "chronoshard.v1.TaskRef" and KNOWN_TASKS and draw(st.booleans()):
        message.CopyFrom(draw(st.sampled_from(KNOWN_TASKS)))
        return message
    if descriptor.full_name == "google.protobuf.Timestamp" and draw(st.booleans()):
        message.seconds = draw(st.integers(1_700_000_000, 1_900_000_000))  # a valid instant
        message.nanos = draw(st.integers(0, 999_999_999))
        return message
    for field in descriptor.fields:
        if draw(st.integers(0, 3)) == 0:  # most fields set: requests get past the first check
            continue
        oneof = field.containing_oneof
        if oneof is not None and message.WhichOneof(oneof.name) is not None:
            continue
        target = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = field.message_type.fields
            keys = draw(st.lists(_scalar(key_field), max_size=2, unique=True))
            for key in keys:
                if value_field.message_type is not None:
                    target[key].CopyFrom(draw(protobuf(value_field.message_type, depth + 1)))
                else:
                    target[key] = draw(_scalar(value_field))
        elif field.message_type is not None:
            values = [draw(protobuf(field.message_type, depth + 1))]
            if field.is_repeated:
                values += draw(st.lists(protobuf(field.message_type, depth + 1), max_size=2))
                for value in values:
                    target.add().CopyFrom(value)
            else:
                target.CopyFrom(values[0])
        elif field.is_repeated:
            target.extend(draw(st.lists(_scalar(field), max_size=3)))
        else:
            setattr(message, field.name, draw(_scalar(field)))
    return message


@settings(SETTINGS, max_examples=1000)
@given(data=st.data())
def test_drawn_messages_to_every_unary_method(api: Node, data: st.DataObject) -> None:
    method = data.draw(st.sampled_from(sorted(UNARY_METHODS)), label="method")
    request = data.draw(protobuf(UNARY_METHODS[method].DESCRIPTOR), label="request")
    answer = _refused_writes_nothing(api, method, request.SerializeToString(), api.tenant_key)
    info = answer.check()
    event(f"{method.rsplit('/', 1)[-1]}: {answer.code.name} {info.field if info else ''}")


ADMIN_METHODS = sorted(m for m in UNARY_METHODS if m.startswith("/chronoshard.v1.AdminService/"))


@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_drawn_admin_requests_with_an_operator_key(api: Node, data: st.DataObject) -> None:
    # With a tenant key DrainNode and UndrainNode stop at the access check; an operator
    # key takes every AdminService request to its servicer, inside the error boundary.
    method = data.draw(st.sampled_from(ADMIN_METHODS), label="method")
    request = data.draw(protobuf(UNARY_METHODS[method].DESCRIPTOR), label="request")
    if getattr(request, "node_id", None) in ("", api.node.config.node_id):
        # Naming this node is no bad input: it would drain the node the other tests use.
        request.node_id = f"{api.node.config.node_id}-other"  # type: ignore[attr-defined]
    answer = _refused_writes_nothing(api, method, request.SerializeToString(), api.operator_key)
    info = answer.check()
    if method.endswith(("/DrainNode", "/UndrainNode")):
        assert answer.code is grpc.StatusCode.NOT_FOUND, (method, answer.details)
        assert info is not None and (info.reason, info.field) == ("NODE_NOT_FOUND", "node_id")
    elif method.endswith("/ListWorkerSessions") and answer.code is not grpc.StatusCode.OK:
        # Drawn filters and page tokens: refused on the field, or listed.
        assert answer.code is grpc.StatusCode.INVALID_ARGUMENT, (method, answer.details)
        assert info is not None and info.field in ("worker_id", "node_id", "page_token")
    else:
        assert answer.code is grpc.StatusCode.OK, (method, answer.details)


def _hello() -> st.SearchStrategy[Message]:
    """Mostly a Hello that opens a session, sometimes any Hello."""
    good = st.builds(
        lambda worker_id, queues, types, slots: worker_service_pb2.WorkerMessage(
            hello=worker_service_pb2.Hello(
                worker_id=worker_id, queues=queues, task_types=types, slots=slots
            )
        ),
        st.one_of(st.uuids().map(lambda u: f"fuzz-{u}"), _TEXT.filter(bool)),
        st.lists(_TEXT, max_size=2),
        st.lists(_TEXT, min_size=1, max_size=2),
        st.integers(1, 10),
    )
    drawn = protobuf(worker_service_pb2.Hello.DESCRIPTOR).map(
        lambda hello: worker_service_pb2.WorkerMessage(hello=hello)
    )
    return st.one_of(good, drawn)


@settings(SETTINGS, max_examples=120)
@given(
    first=_hello(),
    rest=st.lists(protobuf(worker_service_pb2.WorkerMessage.DESCRIPTOR), max_size=4),
)
def test_drawn_worker_streams(api: Node, first: Message, rest: list[Message]) -> None:
    """A worker stream of drawn messages (a Hello first) ends with a status a worker can
    act on, every receipt bounded, and nothing logged as an error."""

    async def connect() -> tuple[grpc.StatusCode, str, list[Any]]:
        stream = api.channel.stream_stream(
            "/chronoshard.v1.WorkerService/Connect",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=worker_service_pb2.SchedulerMessage.FromString,
        )
        call = stream(iter([first, *rest]), metadata=api.tenant_key, timeout=10)
        answers: list[Any] = []
        try:
            async for answer in call:
                answers.append(answer)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or "", answers
        return grpc.StatusCode.OK, "", answers

    hello = first.hello  # type: ignore[attr-defined]
    before = api.state(), api.session_rows(hello.worker_id)
    code, details, answers = api.runner.run(connect())
    if code is grpc.StatusCode.INTERNAL and details == CLIENT_WRITE_AFTER_END:
        # grpc/grpc#36066: the asyncio *client* replaces the server's status with this when
        # one of its writes lands after the server ended the stream (a refused Hello with
        # more messages behind it). The node's part is checked below all the same.
        assert all(a.HasField("reject") for a in answers[:1]), answers
    else:
        assert code in ACCEPTABLE, (code, details)
    assert len(details.encode()) <= MESSAGE_BOUND
    for answer in answers:
        error = answer.receipt.error if answer.HasField("receipt") else answer.reject.error
        assert len(error.message.encode()) <= MESSAGE_BOUND
    if any(a.HasField("welcome") for a in answers):
        # A session only for names PostgreSQL can store (worker_sessions, task rows).
        names = [hello.worker_id, *hello.queues, *hello.task_types]
        assert not any("\x00" in name for name in names), hello
    else:
        assert (api.state(), api.session_rows(hello.worker_id)) == before  # nothing written
    assert api.errors.take() == []


def test_garbage_ends_a_worker_stream_with_invalid_argument(api: Node) -> None:
    async def connect() -> grpc.aio.AioRpcError:
        stream = api.channel.stream_stream("/chronoshard.v1.WorkerService/Connect")
        call = stream(iter([b"\xff\xfe not a WorkerMessage"]), metadata=api.tenant_key)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call:
                pass
        return raised.value

    error = api.runner.run(connect())
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
    info = error_info_from_metadata(error.trailing_metadata())
    assert info is not None and info.reason == "MALFORMED_REQUEST"
    assert api.node.sessions.live() == []
    assert api.errors.take() == []


# --- over-size fields ---------------------------------------------------------------------

BIG = 1024 * 1024
"""The 1 MiB task id that once overflowed the error trailer."""


def _ref(task_id: str) -> common_pb2.TaskRef:
    ref = common_pb2.TaskRef(id=task_id)
    ref.scheduled_at.GetCurrentTime()
    return ref


def _oversized(field: str, size: int) -> tuple[str, Message]:
    """(method, request) with ``field`` ``size`` characters (or bytes, or items) long."""
    text = "x" * size
    depth = min(size, 100_000)  # deeper would only be a message over the size limit
    ref = _ref(str(uuid.uuid4()))
    t, w = task_service_pb2, worker_service_pb2
    wd = watchdog_service_pb2
    build: dict[str, tuple[str, Callable[[], Message]]] = {
        "task id": ("TaskService/GetTask", lambda: t.GetTaskRequest(id=text)),
        "cancel reason": (
            "TaskService/CancelTask",
            lambda: t.CancelTaskRequest(id=ref.id, reason=text),
        ),
        "type": ("TaskService/SubmitTask", lambda: t.SubmitTaskRequest(type=text)),
        "queue": ("TaskService/SubmitTask", lambda: t.SubmitTaskRequest(type="t", queue=text)),
        "idempotency_key": (
            "TaskService/SubmitTask",
            lambda: t.SubmitTaskRequest(type="t", idempotency_key=text),
        ),
        "job_id": ("TaskService/SubmitTask", lambda: t.SubmitTaskRequest(type="t", job_id=text)),
        "payload": (
            "TaskService/SubmitTask",
            lambda: t.SubmitTaskRequest(type="t", payload_json=json.dumps({"s": text}).encode()),
        ),
        # ``size`` levels of arrays inside the object: deeper than 100 levels is refused.
        "payload depth": (
            "TaskService/SubmitTask",
            lambda: t.SubmitTaskRequest(
                type="t", payload_json=b'{"s":' + b"[" * depth + b"]" * depth + b"}"
            ),
        ),
        "batch": (
            "TaskService/SubmitBatch",
            lambda: t.SubmitBatchRequest(tasks=[t.SubmitTaskRequest(type="t")] * min(size, 20_000)),
        ),
        "list filter": ("TaskService/ListTasks", lambda: t.ListTasksRequest(type=text)),
        "complete task id": (
            "WorkerService/Complete",
            lambda: w.CompleteRequest(complete=w.Complete(task=_ref(text), fencing_token=1)),
        ),
        "result": (
            "WorkerService/Complete",
            lambda: w.CompleteRequest(
                complete=w.Complete(
                    task=ref, fencing_token=1, result_json=json.dumps({"s": text}).encode()
                )
            ),
        ),
        "checkpoint": (
            "WorkerService/Release",
            lambda: w.ReleaseRequest(
                release=w.Release(task=ref, fencing_token=1, checkpoint=text.encode())
            ),
        ),
        "fail message": (
            "WorkerService/Fail",
            lambda: w.FailRequest(fail=w.Fail(task=ref, fencing_token=1, error_message=text)),
        ),
        "node id": (
            "AdminService/DrainNode",
            lambda: admin_service_pb2.DrainNodeRequest(node_id=text),
        ),
        "worker session filter": (
            "AdminService/ListWorkerSessions",
            lambda: admin_service_pb2.ListWorkerSessionsRequest(worker_id=text),
        ),
        "expectation job id": (
            "WatchdogService/DeleteExpectation",
            lambda: wd.DeleteExpectationRequest(job_id=text),
        ),
        "expectation description": (
            "WatchdogService/CreateExpectation",
            lambda: wd.CreateExpectationRequest(
                job_id="j", description=text, interval=duration_pb2.Duration(seconds=60)
            ),
        ),
        # Past grpc.max_message_bytes: refused by gRPC before any handler.
        "message": (
            "TaskService/SubmitTask",
            lambda: t.SubmitTaskRequest(type="t", payload_json=text.encode()),
        ),
    }
    method, request = build[field]
    return f"/chronoshard.v1.{method}", request()


_BAD = grpc.StatusCode.INVALID_ARGUMENT
_MISSING = grpc.StatusCode.NOT_FOUND
_JSON_OVERHEAD = len('{"s":""}')
# field -> (longest accepted, answer when longer, answer when not): ids are never valid
# at these sizes; what fits but names nothing (a task, an expectation) is NOT_FOUND.
OUTCOMES: dict[str, tuple[int, grpc.StatusCode, grpc.StatusCode]] = {
    "task id": (0, _BAD, _BAD),
    "cancel reason": (1000, _BAD, _MISSING),
    "type": (200, _BAD, grpc.StatusCode.OK),
    "queue": (100, _BAD, grpc.StatusCode.OK),
    "idempotency_key": (200, _BAD, grpc.StatusCode.OK),
    "job_id": (200, _BAD, grpc.StatusCode.OK),
    "payload": (PAYLOAD_LIMIT - _JSON_OVERHEAD, _BAD, grpc.StatusCode.OK),
    "payload depth": (MAX_DEPTH - 1, _BAD, grpc.StatusCode.OK),
    "batch": (10_000, _BAD, grpc.StatusCode.OK),
    "list filter": (200, _BAD, grpc.StatusCode.OK),
    "complete task id": (0, _BAD, _BAD),
    "result": (PAYLOAD_LIMIT - _JSON_OVERHEAD, _BAD, _MISSING),
    "checkpoint": (PAYLOAD_LIMIT, _BAD, _MISSING),
    # Free text from a worker is cut, not refused; there is no such task.
    "fail message": (0, _MISSING, _MISSING),
    # An id no live node has is NOT_FOUND (and the message quotes only 40 characters).
    "node id": (0, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
    # A worker id nobody has lists nothing.
    "worker session filter": (200, _BAD, grpc.StatusCode.OK),
    "expectation job id": (200, _BAD, _MISSING),
    "expectation description": (1000, _BAD, grpc.StatusCode.OK),
    "message": (MAX_MESSAGE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OK),
}
FIELDS = [f for f in OUTCOMES if f != "message"]


@settings(SETTINGS, max_examples=70)
@example(field="task id", size=BIG)
@example(field="node id", size=BIG)
@example(field="message", size=MAX_MESSAGE + 1)
@example(field="batch", size=10_001)
@example(field="payload depth", size=MAX_DEPTH - 1)
@example(field="payload depth", size=MAX_DEPTH)
@given(
    field=st.sampled_from(FIELDS),
    size=st.sampled_from([1001, 10_001, PAYLOAD_LIMIT + 1, BIG]),
)
def test_oversized_fields_are_refused_with_a_bounded_answer(
    api: Node, field: str, size: int
) -> None:
    method, request = _oversized(field, size)
    # DrainNode needs an operator key to get past the access check to the node id.
    metadata = api.operator_key if field == "node id" else api.tenant_key
    answer = _refused_writes_nothing(api, method, request.SerializeToString(), metadata)
    limit, over, within = OUTCOMES[field]
    expected = over if size > limit else within
    assert answer.code is expected, (field, size, answer.code, answer.details)


# --- numbers ---------------------------------------------------------------------------------


def _digits_written_out(text: str) -> int:
    """Digits of the number's value written out in full (trailing zeros of a fraction do
    not count: ``0E-2244`` is 0, one digit)."""
    number = decimal.Context(prec=100_000).normalize(Decimal(text))
    written = format(abs(number), "f")
    return len(written.replace(".", ""))


def _exact(data: bytes) -> Any:
    """A JSON document with every number a Decimal: the oracle of exactness."""
    return json.loads(data, parse_float=Decimal, parse_int=Decimal)


def _as_sent(value: Any) -> Any:
    """What the Python client decoded, every number as the Decimal it stands for."""
    if isinstance(value, dict):
        return {k: _as_sent(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_sent(v) for v in value]
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    return value


def _document(numbers: list[str]) -> bytes:
    return ('{"n":' + numbers[0] + ',"all":[' + ",".join(numbers) + "]}").encode()


def _check_numbers(api: Node, answer: Answer, numbers: list[str], field: str) -> bool:
    """Whether the server accepted; asserts accept/refuse is what the rules say."""
    fits = all(_digits_written_out(n) <= MAX_NUMBER_DIGITS for n in numbers)
    info = answer.check()
    if fits:
        assert answer.code is grpc.StatusCode.OK, (numbers, answer.details)
        return True
    assert answer.code is grpc.StatusCode.INVALID_ARGUMENT, (numbers, answer.code)
    assert info is not None and info.field == field and "digits" in info.message
    return False


@settings(SETTINGS, max_examples=250)
@example(numbers=["-0.46211904005971607552"])
@example(numbers=["1e400", "9007199254740993", "18446744073709551617", "-0.0"])
@example(numbers=["5e-324", "1.7976931348623157e308", "2.5e-324"])
@example(numbers=["1e1000"])
@given(numbers=st.lists(NUMBERS, min_size=1, max_size=5))
def test_payload_numbers_read_back_exactly_or_are_refused(api: Node, numbers: list[str]) -> None:
    payload = _document(numbers)
    request = task_service_pb2.SubmitTaskRequest(type="numbers", payload_json=payload)
    answer = _refused_writes_nothing(
        api, "/chronoshard.v1.TaskService/SubmitTask", request.SerializeToString(), api.tenant_key
    )
    if not _check_numbers(api, answer, numbers, "payload_json"):
        return
    submitted = task_service_pb2.SubmitTaskResponse.FromString(answer.body)
    got = api.call(
        "/chronoshard.v1.TaskService/GetTask",
        task_service_pb2.GetTaskRequest(id=submitted.task.id).SerializeToString(),
        api.tenant_key,
    )
    assert got.code is grpc.StatusCode.OK, got.details
    task = task_service_pb2.GetTaskResponse.FromString(got.body).task
    assert _exact(task.payload_json) == _exact(payload)
    # The Python client hands back floats only where a float is the number.
    assert _as_sent(decode_json(task.payload_json, "payload_json")) == _exact(payload)


@settings(SETTINGS, max_examples=80)
@example(numbers=["-0.46211904005971607552", "123456789012345678901234567890"])
@example(numbers=["1e1001"])
@given(numbers=st.lists(NUMBERS, min_size=1, max_size=3))
def test_worker_result_numbers_read_back_exactly_or_are_refused(
    api: Node, numbers: list[str]
) -> None:
    submitted = api.call(
        "/chronoshard.v1.TaskService/SubmitTask",
        task_service_pb2.SubmitTaskRequest(type="results").SerializeToString(),
        api.tenant_key,
    )
    assert submitted.code is grpc.StatusCode.OK, submitted.details
    task = task_service_pb2.SubmitTaskResponse.FromString(submitted.body).task
    # As a worker would hold it: dispatched, token 1, leased (the dispatch path is not
    # under test).
    task_id = uuid.UUID(task.id)
    api.sql(
        "UPDATE tasks SET status = 'DISPATCHED', fencing_token = 1, attempt = 1,"
        " lease_expires_at = now() + interval '1 hour' WHERE id = %s",
        task_id,
    )
    result = _document(numbers)
    complete = worker_service_pb2.Complete(
        task=common_pb2.TaskRef(id=task.id, scheduled_at=task.scheduled_at),
        fencing_token=1,
        result_json=result,
    )
    answer = _refused_writes_nothing(
        api,
        "/chronoshard.v1.WorkerService/Complete",
        worker_service_pb2.CompleteRequest(complete=complete).SerializeToString(),
        api.tenant_key,
    )
    if not _check_numbers(api, answer, numbers, "complete.result_json"):
        # Out of the reconciler's way, so it changes nothing under a later example.
        api.sql("UPDATE tasks SET status = 'CANCELLED', finished_at = now() WHERE id = %s", task_id)
        return
    got = api.call(
        "/chronoshard.v1.TaskService/GetTask",
        task_service_pb2.GetTaskRequest(id=task.id).SerializeToString(),
        api.tenant_key,
    )
    stored = task_service_pb2.GetTaskResponse.FromString(got.body).task
    assert stored.status == common_pb2.TASK_STATUS_COMPLETED
    assert _exact(stored.result_json) == _exact(result)
    assert _as_sent(exact_json.loads(stored.result_json)) == _exact(result)
