"""The worker SDK against a scripted scheduler double over real gRPC.

:class:`FakeScheduler` is a small, scripted implementation of ``WorkerService`` and
``AdminService`` served by a real ``grpc.aio`` server on port 0. It is a test double of the
scheduler, good for checking what the SDK sends and how it reacts to each message of
docs/worker-protocol.md; it stores nothing and decides nothing. End-to-end tests against
the real scheduler (gateway, store, fencing in PostgreSQL) live in ``tests/e2e``.

Tests wait on conditions (the fake notifies on every message it receives, handlers set
events), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    common_pb2,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from chronoshard.wire import error_info_metadata
from chronoshard.worker import (
    DrainReport,
    LeaseLost,
    NonRetryableError,
    StopReason,
    TaskContext,
    Worker,
)
from chronoshard.worker._runs import ACK_DELAY_S

pb = worker_service_pb2
WAIT_S = 5.0
STALE = common_pb2.ErrorInfo(
    code="FAILED_PRECONDITION", reason="STALE_FENCING_TOKEN", message="token 1 is stale"
)
_KIND = {
    "ack": pb.SETTLEMENT_KIND_ACK,
    "complete": pb.SETTLEMENT_KIND_COMPLETE,
    "fail": pb.SETTLEMENT_KIND_FAIL,
    "release": pb.SETTLEMENT_KIND_RELEASE,
}


class Notifier:
    """Wakes waiters whenever something changed; they re-check their condition."""

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None

    def notify(self) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)
        self._fut = None

    async def wait_for(self, condition: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
        async with asyncio.timeout(timeout_s):
            while not (value := condition()):
                if self._fut is None:
                    self._fut = asyncio.get_running_loop().create_future()
                await self._fut
            return value


class FakeSession:
    """One Connect stream as the fake sees it."""

    def __init__(self, fake: FakeScheduler, metadata: dict[str, str]) -> None:
        self.fake = fake
        self.metadata = metadata
        self.received: list[pb.WorkerMessage] = []
        self.outgoing: asyncio.Queue[pb.SchedulerMessage | None] = asyncio.Queue()
        self.credits = 0
        self.running: set[tuple[str, int]] = set()  # assigned and not settled
        self.closed = False

    def send(self, **message: Any) -> None:
        self.outgoing.put_nowait(pb.SchedulerMessage(**message))

    def close(self) -> None:
        """End the stream from the server side (the worker sees EOF)."""
        self.outgoing.put_nowait(None)

    def of(self, kind: str) -> list[Any]:
        return [getattr(m, kind) for m in self.received if m.WhichOneof("message") == kind]

    def assign(
        self,
        task_type: str = "echo",
        payload: Any = None,
        *,
        task_id: str | None = None,
        token: int = 1,
        due_in_s: float = 0.0,
        timeout_s: float | None = None,
        checkpoint: Any = None,
        force: bool = False,
        with_sent_at: bool = False,
    ) -> str:
        """Send an Assignment against one credit (``force``: even without one);
        ``with_sent_at``: stamped with the (true) time it is sent, as a node does."""
        assert force or self.credits > 0, "the fake never assigns without a credit"
        self.credits -= 1
        task_id = task_id or str(uuid.uuid4())
        scheduled = timestamp_pb2.Timestamp()
        scheduled.FromDatetime(datetime(2026, 1, 1, tzinfo=UTC))
        now = datetime.now(UTC)
        due = timestamp_pb2.Timestamp()
        due.FromDatetime(now + timedelta(seconds=due_in_s))
        assignment = pb.Assignment(
            task=common_pb2.TaskRef(id=task_id, scheduled_at=scheduled),
            type=task_type,
            payload_json=json.dumps(payload if payload is not None else {"x": 1}).encode(),
            fencing_token=token,
            attempt=1,
            max_retries=3,
            due_at=due,
            queue="default",
        )
        if timeout_s is not None:
            assignment.timeout.CopyFrom(duration_pb2.Duration(nanos=int(timeout_s * 1e9)))
        if checkpoint is not None:
            assignment.checkpoint = json.dumps(checkpoint).encode()
        if with_sent_at:
            assignment.sent_at.FromDatetime(now)
        self.running.add((task_id, token))
        if not force:  # a forced assignment is the fake's own violation, on purpose
            self.fake.check_invariant()
        self.send(assignment=assignment)
        return task_id


def _task_of(msg: Any) -> tuple[str, int]:
    return (msg.task.id, msg.fencing_token)


class FakeScheduler(
    worker_service_pb2_grpc.WorkerServiceServicer, admin_service_pb2_grpc.AdminServiceServicer
):
    """Scripted scheduler double (see the module docstring: not the real scheduler)."""

    def __init__(
        self,
        *,
        slots: int | None = None,
        heartbeat_interval_s: float = 0.1,
        lease_s: float = 30.0,
        lease_margin_s: float | None = None,
    ) -> None:
        self.address = ""
        self.node_id = "fake-node"
        self.extra_nodes: list[admin_service_pb2.Node] = []
        self.draining = False  # how GetTopology lists this node
        self.sessions: list[FakeSession] = []
        self.unary: list[tuple[str, Any]] = []
        self.topology_calls = 0
        self.heartbeat_interval_s = heartbeat_interval_s
        self.lease_s = lease_s
        self.lease_margin_s = lease_margin_s
        # False: heartbeats reach the fake but are never answered (as when the node cannot
        # commit them, or the replies cannot reach the worker).
        self.answer_heartbeats = True
        self.auto_receipts = True
        self.receipt_errors: dict[tuple[str, str], common_pb2.ErrorInfo] = {}
        self.unary_errors: dict[tuple[str, str], common_pb2.ErrorInfo] = {}
        self.revoked: set[tuple[str, int]] = set()
        self.slots = slots
        self.violations: list[str] = []
        self.changed = Notifier()
        # Say in Welcome that this node reads WorkerBatch, and count the batches read.
        self.accepts_batches = False
        self.batches_received = 0

    # ---- what the tests look at ---------------------------------------------------------

    @property
    def session(self) -> FakeSession:
        return self.sessions[-1]

    def all_of(self, kind: str) -> list[Any]:
        return [m for s in self.sessions for m in s.of(kind)]

    def settlements_for(self, task_id: str) -> list[tuple[str, Any]]:
        stream = [
            (kind, m)
            for s in self.sessions
            for kind in ("complete", "fail", "release")
            for m in s.of(kind)
            if m.task.id == task_id
        ]
        return stream + [(k, r) for k, r in self.unary if k != "ack" and _msg(r).task.id == task_id]

    async def wait_for(self, condition: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
        return await self.changed.wait_for(condition, timeout_s)

    async def session_with_credit(self, n: int = 1, timeout_s: float = WAIT_S) -> FakeSession:
        return await self.wait_for(
            lambda: self.sessions and self.session.credits >= n and self.session, timeout_s
        )

    def check_invariant(self) -> None:
        """What the worker promised: outstanding credits + running tasks <= slots."""
        if self.slots is None:
            return
        held = sum(max(0, s.credits) + len(s.running) for s in self.sessions if not s.closed)
        if held > self.slots:
            self.violations.append(f"credits + running = {held} > {self.slots} slots")

    # ---- AdminService -------------------------------------------------------------------

    async def GetTopology(
        self, request: admin_service_pb2.GetTopologyRequest, context: Any
    ) -> admin_service_pb2.GetTopologyResponse:
        self.topology_calls += 1
        self.changed.notify()
        nodes = [
            admin_service_pb2.Node(
                node_id=self.node_id, address=self.address, draining=self.draining
            )
        ]
        return admin_service_pb2.GetTopologyResponse(
            nodes=[*nodes, *self.extra_nodes], shard_count=1, node_id=self.node_id
        )

    # ---- WorkerService ------------------------------------------------------------------

    async def Connect(
        self, request_iterator: AsyncIterator[pb.WorkerMessage], context: Any
    ) -> AsyncIterator[pb.SchedulerMessage]:
        session = FakeSession(self, dict(context.invocation_metadata()))
        self.sessions.append(session)
        reader = asyncio.create_task(self._read(request_iterator, session))
        try:
            while (msg := await session.outgoing.get()) is not None:
                yield msg
        finally:
            session.closed = True
            reader.cancel()
            self.changed.notify()

    async def _read(self, requests: AsyncIterator[pb.WorkerMessage], session: FakeSession) -> None:
        async for received in requests:
            if received.WhichOneof("message") == "batch":
                assert self.accepts_batches, "a batch to a node that did not ask for them"
                self.batches_received += 1
                for msg in received.batch.messages:
                    self._on_message(msg, session)
            else:
                self._on_message(received, session)
            self.changed.notify()

    def _on_message(self, msg: pb.WorkerMessage, session: FakeSession) -> None:
        session.received.append(msg)
        which = msg.WhichOneof("message")
        if which == "hello":
            session.send(
                welcome=pb.Welcome(
                    node_id=self.node_id,
                    session_id=f"session-{len(self.sessions)}",
                    heartbeat_interval=duration_pb2.Duration(
                        nanos=int(self.heartbeat_interval_s * 1e9)
                    ),
                    lease_duration=_duration(self.lease_s),
                    lease_margin=None
                    if self.lease_margin_s is None
                    else _duration(self.lease_margin_s),
                    accepts_batches=self.accepts_batches,
                )
            )
        elif which == "credit_grant":
            session.credits += msg.credit_grant.credits
            self.check_invariant()
        elif which == "credit_recall":
            # Like the real gateway: give back what is unused, exactly.
            returned = min(max(0, session.credits), msg.credit_recall.credits)
            session.credits -= returned
            session.send(credit_return=pb.CreditReturn(credits=returned))
        elif which == "drain_started":
            session.credits = 0
        elif which == "heartbeat" and self.answer_heartbeats:
            revoked = [
                pb.RevokedTask(task=r.task, fencing_token=r.fencing_token, reason="CANCELLED")
                for r in msg.heartbeat.running
                if _task_of(r) in self.revoked
            ]
            session.send(heartbeat_reply=pb.HeartbeatReply(revoked=revoked, seq=msg.heartbeat.seq))
        elif which in _KIND:
            settled = getattr(msg, which)
            if which != "ack":
                session.running.discard(_task_of(settled))
            error = self.receipt_errors.get((settled.task.id, which))
            if self.auto_receipts:
                session.send(
                    receipt=pb.Receipt(
                        task=settled.task,
                        fencing_token=settled.fencing_token,
                        kind=_KIND[which],
                        error=error,
                    )
                )

    async def _unary(self, kind: str, request: Any, context: Any) -> None:
        self.unary.append((kind, request))
        self.changed.notify()
        error = self.unary_errors.get((_msg(request).task.id, kind))
        if error is not None:
            await context.abort(
                grpc.StatusCode[error.code], error.message, error_info_metadata(error)
            )

    async def Complete(self, request: pb.CompleteRequest, context: Any) -> pb.CompleteResponse:
        await self._unary("complete", request, context)
        return pb.CompleteResponse()

    async def Fail(self, request: pb.FailRequest, context: Any) -> pb.FailResponse:
        await self._unary("fail", request, context)
        return pb.FailResponse()

    async def Release(self, request: pb.ReleaseRequest, context: Any) -> pb.ReleaseResponse:
        await self._unary("release", request, context)
        return pb.ReleaseResponse()


def _duration(seconds: float) -> duration_pb2.Duration:
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def _msg(request: Any) -> Any:
    for field in ("complete", "fail", "release"):
        if request.HasField(field):
            return getattr(request, field)
    raise AssertionError(request)


@asynccontextmanager
async def serve(fake: FakeScheduler) -> AsyncIterator[FakeScheduler]:
    server = grpc.aio.server()
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(fake, server)
    admin_service_pb2_grpc.add_AdminServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    fake.address = f"127.0.0.1:{port}"
    await server.start()
    try:
        yield fake
    finally:
        for session in fake.sessions:
            session.close()
        await server.stop(None)


@pytest.fixture
async def fake() -> AsyncIterator[FakeScheduler]:
    async with serve(FakeScheduler()) as f:
        yield f


class LogCapture(logging.Handler):
    """Records the SDK's log records and wakes the fake's waiters."""

    def __init__(self, notifier: Notifier) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._notifier = notifier

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._notifier.notify()

    def events(self, event: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "event", None) == event]


@pytest.fixture
def logs(fake: FakeScheduler) -> Any:
    capture = LogCapture(fake.changed)
    logger = logging.getLogger("chronoshard.worker")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(capture)
    yield capture
    logger.removeHandler(capture)
    logger.setLevel(old_level)


def make_worker(fake: FakeScheduler, **kwargs: Any) -> Worker:
    kwargs.setdefault("slots", 2)
    kwargs.setdefault("drain_grace_s", 1.0)
    return Worker([fake.address], worker_id="w-test", **kwargs)


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[DrainReport]]:
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        if not task.done():
            worker.stop(immediate=True)
        async with asyncio.timeout(WAIT_S):
            await task


# ---- the happy path ------------------------------------------------------------------


async def test_a_run_still_going_after_the_ack_delay_is_acked_then_completed(
    fake: FakeScheduler,
) -> None:
    worker = make_worker(fake)
    release = asyncio.Event()

    @worker.task("slow")
    async def slow(ctx: TaskContext) -> None:
        await release.wait()

    async with running(worker):
        session = await fake.session_with_credit()
        task_id = session.assign("slow", {}, token=3, due_in_s=0.05)
        acks = await fake.wait_for(lambda: session.of("ack"))
        assert [_task_of(a) for a in acks] == [(task_id, 3)]
        assert session.of("complete") == []
        release.set()
        complete = await fake.wait_for(lambda: session.of("complete"))
        assert _task_of(complete[0]) == (task_id, 3)
        assert len(session.of("ack")) == 1


async def test_batched_streams_carry_every_message_both_ways(fake: FakeScheduler) -> None:
    """A SchedulerBatch of assignments runs each one; with a node that reads WorkerBatch
    the worker's settlements and grants arrive all the same, each once."""
    fake.accepts_batches = True
    worker = make_worker(fake, slots=20)
    ran: list[int] = []

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> None:
        ran.append(ctx.fencing_token)

    async with running(worker):
        session = await fake.session_with_credit(20)
        assert session.of("hello")[0].accepts_batches
        ids: dict[str, int] = {}
        assignments = []
        for token in range(1, 21):
            task_id = session.assign("echo", {}, token=token)
            assignments.append(session.outgoing.get_nowait())
            ids[task_id] = token
        session.send(batch=pb.SchedulerBatch(messages=assignments))
        completes = await fake.wait_for(
            lambda: len(session.of("complete")) == 20 and session.of("complete")
        )
        assert sorted(ran) == list(range(1, 21))
        assert sorted(_task_of(c) for c in completes) == sorted(ids.items())
        await fake.wait_for(lambda: session.credits == 20)
        fake.check_invariant()
        assert fake.violations == []


async def test_assignment_is_started_at_due_at_and_completed_without_an_ack(
    fake: FakeScheduler,
) -> None:
    """A run that settles within ACK_DELAY_S of its start sends its Complete alone."""
    worker = make_worker(fake, api_key="secret-key")
    started_at: list[datetime] = []

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> dict[str, Any]:
        started_at.append(datetime.now(UTC))
        return {"echo": ctx.payload, "attempt": ctx.attempt, "token": ctx.fencing_token}

    async with running(worker):
        session = await fake.session_with_credit()
        hello = session.of("hello")[0]
        assert (hello.worker_id, list(hello.task_types), hello.slots) == ("w-test", ["echo"], 2)
        assert list(hello.queues) == ["default"]
        assert session.metadata["authorization"] == "Bearer secret-key"
        assert fake.topology_calls >= 1

        task_id = session.assign("echo", {"n": 7}, token=5, due_in_s=0.3)
        due = datetime.now(UTC) + timedelta(seconds=0.3)
        complete = await fake.wait_for(lambda: session.of("complete"))
        assert started_at and started_at[0] >= due - timedelta(milliseconds=5)
        assert _task_of(complete[0]) == (task_id, 5)
        assert json.loads(complete[0].result_json) == {"echo": {"n": 7}, "attempt": 1, "token": 5}
        # The receipt confirms it: nothing is left to resend, the slot is granted again.
        await fake.wait_for(lambda: worker.stats()["outbox"]["stream"] == 0 and session.credits)
        assert fake.unary == []
        await asyncio.sleep(2 * ACK_DELAY_S)  # time for a wrongly kept ack timer to fire
        assert session.of("ack") == []


async def test_failures_carry_error_type_message_and_retryability(fake: FakeScheduler) -> None:
    worker = make_worker(fake)

    @worker.task("boom")
    async def boom(ctx: TaskContext) -> None:
        if ctx.payload["permanent"]:
            raise NonRetryableError("bad input")
        raise ValueError("kaboom")

    @worker.task("weird")
    async def weird(ctx: TaskContext) -> set[int]:
        return {1, 2}

    async with running(worker):
        session = await fake.session_with_credit()
        a = session.assign("boom", {"permanent": False})
        session = await fake.session_with_credit()
        b = session.assign("boom", {"permanent": True})
        session = await fake.session_with_credit()
        c = session.assign("weird")
        fails = await fake.wait_for(lambda: len(fake.all_of("fail")) == 3 and fake.all_of("fail"))
    by_id = {f.task.id: f for f in fails}
    assert by_id[a].error_type == "ValueError" and by_id[a].retryable
    assert by_id[a].error_message.startswith("kaboom")
    assert "Traceback" in by_id[a].error_message
    assert by_id[b].error_type == "chronoshard.worker._errors.NonRetryableError"
    assert not by_id[b].retryable
    assert by_id[c].error_type == "chronoshard.worker.ResultNotSerializable"
    assert "not JSON-serialisable" in by_id[c].error_message
    assert not any(f.timed_out or f.cancelled for f in fails)


async def test_timeout_cancels_the_handler_and_fails_timed_out(fake: FakeScheduler) -> None:
    worker = make_worker(fake)
    cancelled = asyncio.Event()

    @worker.task("slow")
    async def slow(ctx: TaskContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with running(worker):
        session = await fake.session_with_credit()
        session.assign("slow", timeout_s=0.2)
        fail = (await fake.wait_for(lambda: session.of("fail")))[0]
        await asyncio.wait_for(cancelled.wait(), WAIT_S)
    assert fail.timed_out and fail.retryable and not fail.cancelled
    assert fail.error_type == "chronoshard.worker.TaskTimedOut"


async def test_cancel_is_cooperative_fail_cancelled_or_complete_if_finished(
    fake: FakeScheduler,
) -> None:
    worker = make_worker(fake)
    waiting = asyncio.Event()

    @worker.task("obedient")
    async def obedient(ctx: TaskContext) -> None:
        waiting.set()
        await ctx.wait_cancelled()
        ctx.raise_if_cancelled()

    @worker.task("stubborn")
    async def stubborn(ctx: TaskContext) -> str:
        await ctx.wait_cancelled()
        return "done anyway"

    async with running(worker):
        session = await fake.session_with_credit()
        a = session.assign("obedient", token=3)
        await asyncio.wait_for(waiting.wait(), WAIT_S)
        session = await fake.session_with_credit()
        b = session.assign("stubborn", token=4)
        acks = await fake.wait_for(lambda: len(session.of("ack")) == 2 and session.of("ack"))
        for ack in acks:
            session.send(cancel=pb.Cancel(task=ack.task, fencing_token=ack.fencing_token))
        await fake.wait_for(lambda: fake.settlements_for(a) and fake.settlements_for(b))
    (kind_a, msg_a), (kind_b, msg_b) = fake.settlements_for(a)[0], fake.settlements_for(b)[0]
    assert kind_a == "fail" and msg_a.cancelled and not msg_a.timed_out
    assert kind_b == "complete" and json.loads(msg_b.result_json) == "done anyway"


async def test_revoked_token_stops_the_handler_and_settles_nothing(
    fake: FakeScheduler, logs: LogCapture
) -> None:
    worker = make_worker(fake)
    stopped = asyncio.Event()
    saw_cancelled: list[bool] = []

    @worker.task("long")
    async def long(ctx: TaskContext) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            saw_cancelled.append(ctx.cancelled)
            stopped.set()

    async with running(worker):
        session = await fake.session_with_credit()
        task_id = session.assign("long", token=9)
        # The task shows up in heartbeats while it runs...
        await fake.wait_for(
            lambda: any(
                _task_of(r) == (task_id, 9) for h in session.of("heartbeat") for r in h.running
            )
        )
        fake.revoked.add((task_id, 9))
        await asyncio.wait_for(stopped.wait(), WAIT_S)
        zombie = await fake.wait_for(lambda: logs.events("zombie"))
        # ...and after the revocation it is gone from them, with nothing settled.
        beats = len(session.of("heartbeat"))
        await fake.wait_for(lambda: len(session.of("heartbeat")) >= beats + 2)
        assert all(r.task.id != task_id for r in session.of("heartbeat")[-1].running)
        assert fake.settlements_for(task_id) == []
    assert saw_cancelled == [True]
    assert (zombie[0].task_id, zombie[0].token) == (task_id, 9)
    assert worker.stats()["outcomes"]["abandoned"] == 1


# ---- worker self-fencing --------------------------------------------------------------

LEASE_S = 0.8
MARGIN_S = 0.3
# A run's lease lapses lease - margin after its assignment arrives, unless renewed; the
# worker notices within its timer's precision plus the loop's scheduling on a busy host.
FENCE_SLACK_S = 1.0


async def test_a_run_no_node_renews_is_stopped_at_lease_minus_margin_and_settles_nothing(
    logs: LogCapture,
) -> None:
    """Worker self-fencing: heartbeats go out but no reply comes (as behind a partition).
    At lease - margin the worker cancels the handler, its writes are refused, and it sends
    nothing about the attempt: the node decides after lease + margin."""
    async with serve(FakeScheduler(lease_s=LEASE_S, lease_margin_s=MARGIN_S)) as fake:
        fake.answer_heartbeats = False
        worker = make_worker(fake)
        seen: list[tuple[StopReason | None, bool, float]] = []

        @worker.task("long")
        async def long(ctx: TaskContext) -> str:
            try:
                await asyncio.Event().wait()
            finally:
                seen.append((ctx.cancel_reason, ctx.holds_lease, time.monotonic()))
            return "unreachable"

        async with running(worker):
            session = await fake.session_with_credit()
            assigned_at = time.monotonic()
            task_id = session.assign("long", token=3)
            await fake.wait_for(lambda: seen, timeout_s=LEASE_S + 5)
            lost = await fake.wait_for(lambda: logs.events("lease_lost"))
            # Still heartbeating the node for other runs, never for this one again.
            beats = len(session.of("heartbeat"))
            await fake.wait_for(lambda: len(session.of("heartbeat")) >= beats + 2)
            assert all(r.task.id != task_id for r in session.of("heartbeat")[-1].running)
            await fake.wait_for(lambda: worker.running == 0)
            assert fake.settlements_for(task_id) == []
        [(reason, held, stopped_at)] = seen
        assert (reason, held) == (StopReason.LEASE_LOST, False)
        fenced_after_s = stopped_at - assigned_at
        assert LEASE_S - MARGIN_S - 0.05 <= fenced_after_s <= LEASE_S - MARGIN_S + FENCE_SLACK_S
        assert (lost[0].task_id, lost[0].token) == (task_id, 3)
        assert worker.stats()["outcomes"]["lease_lost"] == 1


async def test_heartbeat_replies_keep_a_long_run_s_lease() -> None:
    async with serve(FakeScheduler(lease_s=LEASE_S, lease_margin_s=MARGIN_S)) as fake:
        worker = make_worker(fake)

        @worker.task("long")
        async def long(ctx: TaskContext) -> float:
            await asyncio.sleep(3 * LEASE_S)
            ctx.check_lease()
            remaining = ctx.lease_remaining_s
            assert remaining is not None
            return remaining

        async with running(worker):
            session = await fake.session_with_credit()
            task_id = session.assign("long")
            settled = await fake.wait_for(lambda: fake.settlements_for(task_id), 4 * LEASE_S + 5)
        [(kind, complete)] = settled
        assert kind == "complete"
        assert 0 < json.loads(complete.result_json) <= LEASE_S - MARGIN_S


async def test_a_sync_handler_past_its_lease_is_refused_its_write_and_keeps_its_slot() -> None:
    async with serve(FakeScheduler(lease_s=LEASE_S, lease_margin_s=MARGIN_S)) as fake:
        fake.answer_heartbeats = False
        worker = make_worker(fake, slots=1)
        refused = threading.Event()
        go_on = threading.Event()

        @worker.task("blocking")
        def blocking(ctx: TaskContext) -> str:
            go_on.wait(10)  # a blocking call that ignores ctx.cancelled
            try:
                ctx.check_lease()
            except LeaseLost:
                refused.set()
                raise
            return "wrote"

        async with running(worker):
            session = await fake.session_with_credit()
            task_id = session.assign("blocking")
            await asyncio.sleep(LEASE_S)  # past lease - margin, the thread still blocked
            # The thread cannot be stopped: it keeps the worker's only slot meanwhile.
            assert worker.running == 1 and session.credits == 0
            go_on.set()
            await fake.wait_for(lambda: refused.is_set() and worker.running == 0)
            assert fake.settlements_for(task_id) == []


async def test_a_lease_lost_before_the_start_gives_the_task_back_unrun() -> None:
    async with serve(FakeScheduler(lease_s=LEASE_S, lease_margin_s=MARGIN_S)) as fake:
        fake.answer_heartbeats = False
        worker = make_worker(fake)
        ran: list[bool] = []

        @worker.task("later")
        async def later(ctx: TaskContext) -> None:
            ran.append(True)

        async with running(worker):
            session = await fake.session_with_credit()
            # Due beyond the lease (a worker clock behind the node's): it lapses first.
            task_id = session.assign("later", due_in_s=3 * LEASE_S)
            settled = await fake.wait_for(lambda: fake.settlements_for(task_id), LEASE_S + 5)
        [(kind, release)] = settled
        assert kind == "release" and release.reason == pb.RELEASE_REASON_CANNOT_RUN
        assert "lease lost before the handler started" in release.detail and ran == []


async def test_stale_receipt_is_dropped_with_a_zombie_warning(
    fake: FakeScheduler, logs: LogCapture
) -> None:
    worker = make_worker(fake)

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> int:
        return 1

    async with running(worker):
        session = await fake.session_with_credit()
        task_id = str(uuid.uuid4())
        fake.receipt_errors[(task_id, "complete")] = STALE
        session.assign("echo", task_id=task_id, token=2)
        zombie = await fake.wait_for(lambda: logs.events("zombie"))
        assert (zombie[0].task_id, zombie[0].token) == (task_id, 2)
        await fake.wait_for(lambda: not any(worker.stats()["outbox"].values()))
        # Refused means refused: no unary retry of a stale settlement.
        assert fake.unary == []
        assert len(session.of("complete")) == 1


async def test_broken_stream_before_receipt_resends_through_unary(fake: FakeScheduler) -> None:
    worker = make_worker(fake)

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> str:
        return "result"

    async with running(worker):
        session = await fake.session_with_credit()
        fake.auto_receipts = False
        task_id = session.assign("echo", token=4)
        await fake.wait_for(lambda: session.of("complete"))
        session.close()  # the stream ends before any Receipt
        kind, request = await fake.wait_for(lambda: fake.unary and fake.unary[0])
        assert kind == "complete" and request.worker_id == "w-test"
        assert _task_of(request.complete) == (task_id, 4)
        assert json.loads(request.complete.result_json) == "result"
        await fake.wait_for(lambda: not any(worker.stats()["outbox"].values()))
        # The worker also came back with a new session.
        await fake.wait_for(lambda: len(fake.sessions) == 2 and fake.session.of("hello"))


async def test_unary_resend_retries_until_accepted_then_stale_is_dropped(
    fake: FakeScheduler, logs: LogCapture
) -> None:
    worker = make_worker(fake)

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> str:
        return "r"

    async with running(worker):
        session = await fake.session_with_credit()
        fake.auto_receipts = False
        task_id = str(uuid.uuid4())
        fake.unary_errors[(task_id, "complete")] = common_pb2.ErrorInfo(
            code="UNAVAILABLE", reason="SHARD_IN_HANDOFF", retryable=True
        )
        session.assign("echo", task_id=task_id)
        await fake.wait_for(lambda: session.of("complete"))
        session.close()
        await fake.wait_for(lambda: len(fake.unary) >= 2)  # retried after UNAVAILABLE
        fake.unary_errors[(task_id, "complete")] = STALE
        await fake.wait_for(lambda: logs.events("zombie"))
        tries = len(fake.unary)
        await fake.wait_for(lambda: not any(worker.stats()["outbox"].values()))
    assert len(fake.unary) == tries  # dropped after the refusal, never retried


async def test_unknown_type_is_released_cannot_run_and_the_credit_comes_back(
    fake: FakeScheduler,
) -> None:
    worker = make_worker(fake, slots=1)

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> None:
        raise AssertionError("must not run")

    async with running(worker):
        session = await fake.session_with_credit()
        task_id = session.assign("nobody-handles-this")
        release = (await fake.wait_for(lambda: session.of("release")))[0]
        assert release.task.id == task_id and release.reason == pb.RELEASE_REASON_CANNOT_RUN
        assert "no handler" in release.detail
        assert session.of("ack") == [] and session.of("fail") == []
        await fake.wait_for(lambda: session.credits == 1)


async def test_credits_never_exceed_free_slots(fake: FakeScheduler) -> None:
    fake.slots = 3
    worker = make_worker(fake, slots=3)
    gates: dict[str, asyncio.Event] = {}
    started = Notifier()

    @worker.task("gated")
    async def gated(ctx: TaskContext) -> None:
        gates[ctx.payload["id"]] = gate = asyncio.Event()
        started.notify()
        await gate.wait()

    async with running(worker):
        session = await fake.session_with_credit()
        # One node: every free slot is granted at once.
        await fake.wait_for(lambda: session.credits == 3)
        for i in range(3):
            session.assign("gated", {"id": str(i)})
        await started.wait_for(lambda: len(gates) == 3)
        # A fourth assignment without a credit: refused, the running three are untouched.
        session.assign("gated", {"id": "extra"}, force=True)
        release = (await fake.wait_for(lambda: session.of("release")))[0]
        assert release.reason == pb.RELEASE_REASON_CANNOT_RUN and "slot" in release.detail
        assert session.credits == -1  # the fake sent it without a credit
        session.credits = 0
        # Each finished task gives exactly one slot back.
        gates["0"].set()
        await fake.wait_for(lambda: session.credits == 1)
        gates["1"].set()
        gates["2"].set()
        await fake.wait_for(lambda: session.credits == 3)
        assert len(session.of("complete")) == 3
    assert fake.violations == []
    granted = sum(g.credits for g in session.of("credit_grant"))
    assert granted == 3 + 1 + 2  # initial, then one per freed slot


async def test_prefetch_holds_more_assignments_than_handlers_and_starts_each_in_turn(
    fake: FakeScheduler,
) -> None:
    """slots=2, prefetch=2: the node may send four, two handlers run, the other two
    start in order as soon as a handler ends, with no round trip to the node between."""
    fake.slots = 4
    worker = make_worker(fake, slots=2, prefetch=2)
    gates: dict[str, asyncio.Event] = {}
    started: list[str] = []
    changed = Notifier()

    @worker.task("gated")
    async def gated(ctx: TaskContext) -> None:
        name = ctx.payload["id"]
        started.append(name)
        gates[name] = gate = asyncio.Event()
        changed.notify()
        await gate.wait()

    async with running(worker):
        session = await fake.session_with_credit()
        assert session.of("hello")[0].slots == 4
        await fake.wait_for(lambda: session.credits == 4)
        for i in range(4):
            session.assign("gated", {"id": str(i)})
        await changed.wait_for(lambda: len(started) == 2)
        # Held, not refused: all four are acknowledged as this worker's once their ack
        # delay passes, and none is given back.
        await fake.wait_for(lambda: len(session.of("ack")) == 4, timeout_s=ACK_DELAY_S + WAIT_S)
        assert started == ["0", "1"] and not session.of("release")
        gates["0"].set()
        await changed.wait_for(lambda: len(started) == 3)
        assert started == ["0", "1", "2"]
        gates["2"].set()
        await changed.wait_for(lambda: len(started) == 4)
        gates["1"].set()
        gates["3"].set()
        await fake.wait_for(lambda: len(session.of("complete")) == 4)
    assert fake.violations == []


async def test_a_prefetched_assignment_is_released_unrun_at_drain(fake: FakeScheduler) -> None:
    worker = make_worker(fake, slots=1, prefetch=1, drain_grace_s=WAIT_S, drain_stop_s=1.0)
    gate = asyncio.Event()
    started: list[str] = []
    changed = Notifier()

    @worker.task("gated")
    async def gated(ctx: TaskContext) -> str:
        started.append(ctx.payload["id"])
        changed.notify()
        await gate.wait()
        return "done"

    async with running(worker) as run:
        session = await fake.session_with_credit()
        await fake.wait_for(lambda: session.credits == 2)
        first = session.assign("gated", {"id": "first"})
        held = session.assign("gated", {"id": "held"})
        await changed.wait_for(lambda: started == ["first"])
        # Both are this worker's (acknowledged after the ack delay) before it drains.
        await fake.wait_for(lambda: len(session.of("ack")) == 2, timeout_s=ACK_DELAY_S + WAIT_S)
        worker.stop()
        [(kind, release)] = await fake.wait_for(lambda: fake.settlements_for(held))
        assert kind == "release" and release.reason == pb.RELEASE_REASON_DRAINING
        gate.set()
        report = await asyncio.wait_for(run, WAIT_S)
    assert started == ["first"]
    [(kind, _)] = fake.settlements_for(first)
    assert kind == "complete"
    assert report.finished == 1 and report.released == 1 and report.clean


async def test_sync_handler_runs_in_a_thread_and_checkpoints_with_heartbeats(
    fake: FakeScheduler,
) -> None:
    worker = make_worker(fake)
    loop_thread = threading.get_ident()
    threads: list[int] = []
    release = threading.Event()

    @worker.task("sync")
    def sync_handler(ctx: TaskContext) -> dict[str, int]:
        threads.append(threading.get_ident())
        ctx.heartbeat_sync(checkpoint={"step": 1}, progress=0.5)
        release.wait(WAIT_S)
        return {"from": "thread"}

    async with running(worker):
        session = await fake.session_with_credit()
        task_id = session.assign("sync")
        running_items = await fake.wait_for(
            lambda: [
                r
                for h in session.of("heartbeat")
                for r in h.running
                if r.task.id == task_id and r.HasField("checkpoint")
            ]
        )
        release.set()
        complete = (await fake.wait_for(lambda: session.of("complete")))[0]
    assert threads and threads[0] != loop_thread
    assert json.loads(running_items[0].checkpoint) == {"step": 1}
    assert json.loads(complete.result_json) == {"from": "thread"}
    # Once stored (heartbeat answered) the checkpoint is not sent again.
    with_checkpoint = [
        r for h in session.of("heartbeat") for r in h.running if r.HasField("checkpoint")
    ]
    assert len(with_checkpoint) == 1


async def test_drain_lets_short_tasks_finish_and_releases_long_ones_with_checkpoint(
    fake: FakeScheduler,
) -> None:
    worker = make_worker(fake, slots=2, drain_grace_s=1.0, drain_stop_s=2.0)
    both_running = Notifier()
    running_ids: set[str] = set()
    short_gate = asyncio.Event()
    flags: list[tuple[bool, bool]] = []

    @worker.task("short")
    async def short(ctx: TaskContext) -> str:
        running_ids.add("short")
        both_running.notify()
        await short_gate.wait()
        return "finished in grace"

    @worker.task("long")
    async def long(ctx: TaskContext) -> None:
        step = ctx.checkpoint["step"] if ctx.checkpoint else 0
        running_ids.add("long")
        both_running.notify()
        while not ctx.cancelled:
            step += 1
            await ctx.heartbeat(checkpoint={"step": step})
            await asyncio.sleep(0.02)
        flags.append((ctx.draining, ctx.cancelled))
        await ctx.heartbeat(checkpoint={"step": step, "final": True})
        ctx.raise_if_cancelled()

    async with running(worker) as run:
        session = await fake.session_with_credit()
        session.send(backlog=pb.Backlog(ready=2))
        await fake.wait_for(lambda: session.credits == 2)
        short_id = session.assign("short")
        long_id = session.assign("long", checkpoint={"step": 100})
        await both_running.wait_for(lambda: len(running_ids) == 2)
        worker.stop()
        short_gate.set()
        drain_started = await fake.wait_for(lambda: session.of("drain_started"))
        assert drain_started[0].grace.ToMilliseconds() == 1000
        report = await asyncio.wait_for(run, WAIT_S)
    assert report == DrainReport(finished=1, released=1, unsettled=0, stuck=0, forced=False)
    assert report.clean
    [(kind, complete)] = fake.settlements_for(short_id)
    assert kind == "complete" and json.loads(complete.result_json) == "finished in grace"
    [(kind, release)] = fake.settlements_for(long_id)
    assert kind == "release" and release.reason == pb.RELEASE_REASON_DRAINING
    checkpoint = json.loads(release.checkpoint)
    assert checkpoint["final"] is True and checkpoint["step"] > 100
    assert flags == [(True, True)]
    # No credit was granted after DrainStarted.
    messages = [m.WhichOneof("message") for m in session.received]
    assert "credit_grant" not in messages[messages.index("drain_started") :]


async def test_assignments_during_drain_are_released(fake: FakeScheduler) -> None:
    worker = make_worker(fake, drain_grace_s=2.0)
    gate = asyncio.Event()

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> None:
        await gate.wait()

    async with running(worker) as run:
        session = await fake.session_with_credit()
        session.assign("echo")
        await fake.wait_for(lambda: session.of("ack"))
        drain = asyncio.create_task(worker.drain())
        await fake.wait_for(lambda: session.of("drain_started"))
        late = session.assign("echo", force=True)  # was in flight when the drain began
        release = (await fake.wait_for(lambda: session.of("release")))[0]
        assert release.task.id == late and release.reason == pb.RELEASE_REASON_CANNOT_RUN
        assert "draining" in release.detail
        gate.set()
        report = await asyncio.wait_for(drain, WAIT_S)
        assert await run == report
    assert report.clean and report.finished == 1


async def test_connects_to_every_node_in_the_topology() -> None:
    async with serve(FakeScheduler()) as a, serve(FakeScheduler()) as b:
        b.node_id = "node-b"
        a.extra_nodes = [admin_service_pb2.Node(node_id="node-b", address=b.address)]
        worker = make_worker(a)

        @worker.task("echo")
        async def echo(ctx: TaskContext) -> str:
            return ctx.queue

        async with running(worker):
            on_b = await b.session_with_credit()
            on_b.assign("echo")
            complete = (await b.wait_for(lambda: on_b.of("complete")))[0]
            await a.session_with_credit()
        assert json.loads(complete.result_json) == "default"


async def test_topology_changed_connects_to_a_joining_node_at_once() -> None:
    """Without TopologyChanged the worker would find node b only at its next periodic
    refresh (30 s); told, it asks again and has a session with credits in well under a
    second, before b takes any shard over."""
    async with serve(FakeScheduler()) as a, serve(FakeScheduler()) as b:
        b.node_id = "node-b"
        worker = make_worker(a)

        @worker.task("echo")
        async def echo(ctx: TaskContext) -> str:
            return "ok"

        async with running(worker):
            on_a = await a.session_with_credit()
            await a.wait_for(lambda: a.topology_calls >= 1)
            a.extra_nodes = [admin_service_pb2.Node(node_id="node-b", address=b.address)]
            on_a.send(topology_changed=pb.TopologyChanged())
            on_b = await b.session_with_credit(timeout_s=WAIT_S)
            on_b.assign("echo")
            await b.wait_for(lambda: on_b.of("complete"))
        assert a.topology_calls == 2


async def test_node_drain_moves_settlement_to_unary_and_stops_credits(
    fake: FakeScheduler,
) -> None:
    worker = make_worker(fake)
    gate = asyncio.Event()

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> str:
        await gate.wait()
        return "ok"

    async with running(worker):
        session = await fake.session_with_credit()
        task_id = session.assign("echo")
        await fake.wait_for(lambda: session.of("ack") and session.credits == 1)
        grants = len(session.of("credit_grant"))
        session.send(drain=pb.Drain(reason="handing shards over"))
        topology_calls = fake.topology_calls
        await fake.wait_for(lambda: fake.topology_calls > topology_calls)
        gate.set()
        kind, request = await fake.wait_for(lambda: fake.unary and fake.unary[0])
        assert kind == "complete" and request.complete.task.id == task_id
        assert session.of("complete") == []
        assert len(session.of("credit_grant")) == grants
        # The credit the node still held was asked back, and its answer freed it.
        [recall] = await fake.wait_for(lambda: session.of("credit_recall"))
        assert recall.credits == 1 and session.credits == 0


async def test_a_node_shutting_down_is_not_reconnected_to(fake: FakeScheduler) -> None:
    """Drain{shutting_down} then the stream ends: the worker opens no new stream to the
    node, not even when a topology read still lists it (draining, about to leave)."""
    worker = make_worker(fake)

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> str:
        return "ok"

    async with running(worker):
        session = await fake.session_with_credit()
        fake.draining = True
        calls = fake.topology_calls
        session.send(drain=pb.Drain(reason="stopping", shutting_down=True))
        await fake.wait_for(lambda: fake.topology_calls > calls)
        calls = fake.topology_calls
        session.close()
        # The stream's end asks for the topology again; the node is still listed.
        await fake.wait_for(lambda: fake.topology_calls > calls)
        assert len(fake.sessions) == 1, "reconnected to a node that said it was stopping"


async def test_a_resumed_node_is_granted_credits_again(fake: FakeScheduler) -> None:
    worker = make_worker(fake, slots=3)

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> str:
        return "ok"

    async with running(worker):
        session = await fake.session_with_credit()
        await fake.wait_for(lambda: session.credits == 3)
        session.send(drain=pb.Drain(reason="operator drain"))
        await fake.wait_for(lambda: session.of("credit_recall") and session.credits == 0)
        grants = len(session.of("credit_grant"))
        session.send(resume=pb.Resume())
        await fake.wait_for(lambda: session.credits == 3)
        assert len(session.of("credit_grant")) > grants
        session.assign("echo")
        complete = (await fake.wait_for(lambda: session.of("complete")))[0]
        assert json.loads(complete.result_json) == "ok"


# ---- the runner as a process -----------------------------------------------------------

WORKER_MODULE = """
import asyncio
from chronoshard.worker import Worker

worker = Worker([], worker_id="proc-worker", drain_grace_s=10.0)

@worker.task("nap")
async def nap(ctx):
    await asyncio.sleep(ctx.payload["s"])
    return "rested"
"""


async def test_sigterm_drains_the_running_task_and_exits_zero(
    fake: FakeScheduler, tmp_path: Path
) -> None:
    (tmp_path / "napper.py").write_text(WORKER_MODULE)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "chronoshard.worker",
        "napper:worker",
        "--target",
        fake.address,
        cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        session = await fake.session_with_credit(timeout_s=20)
        assert session.of("hello")[0].worker_id == "proc-worker"
        task_id = session.assign("nap", {"s": 0.5})
        await fake.wait_for(lambda: session.of("ack"))
        proc.send_signal(signal.SIGTERM)
        await fake.wait_for(lambda: session.of("drain_started"))
        async with asyncio.timeout(20):
            _, stderr = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()
    [(kind, complete)] = fake.settlements_for(task_id)
    assert kind == "complete" and json.loads(complete.result_json) == "rested"
    log = stderr.decode()
    assert "SIGTERM received" in log and "event=drain_end" in log
    assert "worker_id=proc-worker" in log


async def test_a_lost_node_s_tasks_are_heartbeated_and_settled_through_another() -> None:
    async with serve(FakeScheduler()) as a:
        stack = AsyncExitStack()
        b = await stack.enter_async_context(serve(FakeScheduler()))
        b.node_id = "node-b"
        a.extra_nodes = [admin_service_pb2.Node(node_id="node-b", address=b.address)]
        worker = make_worker(a)
        gate = asyncio.Event()

        @worker.task("gated")
        async def gated(ctx: TaskContext) -> str:
            await gate.wait()
            return "done"

        async with running(worker):
            await a.session_with_credit()
            on_b = await b.session_with_credit()
            task_id = on_b.assign("gated", token=6)
            await b.wait_for(lambda: on_b.of("ack"))
            await stack.aclose()  # node b is gone; the task keeps running
            await a.wait_for(
                lambda: any(
                    _task_of(r) == (task_id, 6)
                    for h in a.session.of("heartbeat")
                    for r in h.running
                )
            )
            gate.set()
            kind, request = await a.wait_for(lambda: a.unary and a.unary[0])
        assert kind == "complete" and _task_of(request.complete) == (task_id, 6)


class _WrongClock:
    """This host's clocks with a wall clock ``off_s`` ahead (negative: behind)."""

    def __init__(self, off_s: float) -> None:
        self._off = timedelta(seconds=off_s)

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC) + self._off


@pytest.mark.parametrize("off_s", [30.0, -30.0])
async def test_a_worker_with_a_wrong_clock_starts_by_the_nodes_clock(
    fake: FakeScheduler, logs: LogCapture, off_s: float
) -> None:
    """The assignment's sent_at is the node's cluster time: the worker waits due_at -
    sent_at on its monotonic clock. By its own wall clock it would have started at once
    (30 s ahead: 0.5 s early) or 30 s late."""
    worker = make_worker(fake, clock=_WrongClock(off_s))
    started: list[float] = []

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> None:
        started.append(time.monotonic())

    async with running(worker):
        session = await fake.session_with_credit()
        sent = time.monotonic()
        session.assign("echo", due_in_s=0.5, with_sent_at=True)
        await fake.wait_for(lambda: started)
        skew = await fake.wait_for(lambda: logs.events("clock_skew"))
    waited_s = started[0] - sent
    assert 0.5 <= waited_s < 0.5 + 1.0, waited_s
    assert ("ahead of" if off_s > 0 else "behind") in skew[0].getMessage()


async def test_an_assignment_due_far_ahead_is_held_and_logged_as_clock_skew(
    fake: FakeScheduler, logs: LogCapture
) -> None:
    worker = make_worker(fake)
    started: list[str] = []

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> None:
        started.append(str(ctx.task_id))

    async with running(worker):
        session = await fake.session_with_credit()
        task_id = session.assign("echo", due_in_s=60)
        skew = await fake.wait_for(lambda: logs.events("clock_skew"))
        assert skew[0].task_id == task_id
        await fake.wait_for(lambda: session.of("ack"))
        assert worker.running == 1  # it holds its slot while it waits
    assert started == []


# ---- results the scheduler does not store --------------------------------------------


async def test_a_result_the_scheduler_would_refuse_fails_at_once_and_a_refused_one_too(
    fake: FakeScheduler, logs: LogCapture
) -> None:
    # A result breaking the document rules never goes out as a Complete: it is a Fail
    # (ResultRefused, not retryable). A result the node refuses all the same (its size
    # limit, which the worker cannot know) is replaced by that Fail, once.
    worker = make_worker(fake)

    @worker.task("nul")
    async def nul(ctx: TaskContext) -> dict[str, str]:
        return {"x": "\u0000"}

    @worker.task("big")
    async def big(ctx: TaskContext) -> str:
        return "x" * 1000

    async with running(worker):
        session = await fake.session_with_credit()
        refused_here = session.assign("nul")
        session = await fake.session_with_credit()
        refused_there = str(uuid.uuid4())
        fake.receipt_errors[(refused_there, "complete")] = common_pb2.ErrorInfo(
            code="INVALID_ARGUMENT",
            reason="PAYLOAD_TOO_LARGE",
            message="complete.result_json: 1002 bytes is over the limit of 1000 bytes",
            field="complete.result_json",
        )
        session.assign("big", task_id=refused_there)
        fails = await fake.wait_for(lambda: len(fake.all_of("fail")) == 2 and fake.all_of("fail"))
        await fake.wait_for(lambda: not any(worker.stats()["outbox"].values()))
    by_id = {f.task.id: f for f in fails}
    assert [kind for kind, _ in fake.settlements_for(refused_here)] == ["fail"]
    here = by_id[refused_here]
    assert here.error_type == "chronoshard.worker.ResultRefused" and not here.retryable
    assert "a string at $.x contains a NUL character" in here.error_message
    assert [kind for kind, _ in fake.settlements_for(refused_there)] == ["complete", "fail"]
    there = by_id[refused_there]
    assert there.error_type == "chronoshard.worker.ResultRefused" and not there.retryable
    assert (
        "PAYLOAD_TOO_LARGE" in there.error_message and "limit of 1000 bytes" in there.error_message
    )
    assert len(logs.events("result_refused")) == 1
    assert not logs.events("settlement_refused")
