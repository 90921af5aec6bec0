"""What ``api/workers.py`` makes of a worker's messages before anything is committed: the
Hello it accepts, the settlement values the store gets, and a heartbeat's beats with
their task refs converted once per task. Pure parsing: no stream, no database."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest

from chronoshard.scheduler.api import convert, workers
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.runs import Completion, Failure, Release, Settle
from chronoshard.scheduler.core.states import AttemptState
from chronoshard.scheduler.dispatch.sessions import WorkerSession
from chronoshard.scheduler.errors import InvalidArgument, PayloadTooLarge
from chronoshard.v1 import common_pb2
from chronoshard.v1 import worker_service_pb2 as pb

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LIMIT = 1024


def _ref() -> TaskRef:
    return TaskRef(AT, uuid.uuid4())


def _hello(**fields: object) -> pb.WorkerMessage:
    values: dict[str, object] = {"worker_id": "w1", "slots": 4, "task_types": ["t"]}
    values.update(fields)
    return pb.WorkerMessage(hello=pb.Hello(**values))  # type: ignore[arg-type]


def test_a_hello_the_node_can_serve_is_accepted() -> None:
    hello = workers._hello(_hello(queues=["q1", "q2"]))
    assert (hello.worker_id, hello.slots, list(hello.queues)) == ("w1", 4, ["q1", "q2"])


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (pb.WorkerMessage(heartbeat=pb.Heartbeat()), "hello"),
        (_hello(worker_id=""), "hello.worker_id"),
        (_hello(worker_id="w\x00"), "hello.worker_id"),
        (_hello(worker_id="w" * (workers.MAX_NAME_CHARS + 1)), "hello.worker_id"),
        (_hello(slots=0), "hello.slots"),
        (_hello(slots=workers.MAX_WORKER_SLOTS + 1), "hello.slots"),
        (_hello(task_types=[]), "hello.task_types"),
        (_hello(queues=["ok", "bad\n"]), "hello.queues[1]"),
        (_hello(task_types=["t"] * (workers.MAX_HELLO_NAMES + 1)), "hello.task_types"),
    ],
)
def test_a_hello_the_node_cannot_serve_names_its_field(
    message: pb.WorkerMessage, field: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        workers._hello(message)
    assert raised.value.field == field


def test_each_settlement_kind_becomes_its_store_value() -> None:
    ref = _ref()
    task = convert.ref_to_pb(ref)

    ack = workers._settlement("ack", pb.Ack(task=task, fencing_token=3), LIMIT)
    complete = workers._settlement(
        "complete", pb.Complete(task=task, fencing_token=3, result_json=b'{"n": 1}'), LIMIT
    )
    fail = workers._settlement(
        "fail",
        pb.Fail(
            task=task,
            fencing_token=3,
            error_type="ValueError",
            error_message="bad\x00input",
            retryable=True,
        ),
        LIMIT,
    )
    release = workers._settlement(
        "release",
        pb.Release(
            task=task,
            fencing_token=3,
            reason=pb.RELEASE_REASON_CANNOT_RUN,
            checkpoint=b"cp",
            detail="no handler",
        ),
        LIMIT,
    )

    assert type(ack) is Settle and (ack.ref, ack.token) == (ref, 3)
    assert isinstance(complete, Completion) and complete.result_json == '{"n":1}'
    assert isinstance(fail, Failure)
    assert fail.error == "ValueError: bad\ufffdinput"
    assert fail.report.retryable and not fail.report.timed_out
    assert isinstance(release, Release)
    assert (release.attempt_state, release.checkpoint, release.detail) == (
        AttemptState.ABANDONED,
        b"cp",
        "no handler",
    )


def test_a_settlement_the_database_would_refuse_is_refused_before_the_group_commit() -> None:
    task = convert.ref_to_pb(_ref())
    with pytest.raises(InvalidArgument) as token:
        workers._settlement("ack", pb.Ack(task=task, fencing_token=workers.MAX_TOKEN + 1), LIMIT)
    assert token.value.field == "ack.fencing_token"
    with pytest.raises(PayloadTooLarge) as checkpoint:
        workers._settlement(
            "release", pb.Release(task=task, fencing_token=1, checkpoint=b"x" * (LIMIT + 1)), LIMIT
        )
    assert checkpoint.value.field == "release.checkpoint"


def _session() -> WorkerSession:
    return WorkerSession("s", "w1", frozenset(), frozenset({"t"}), 4, asyncio.Queue())


def _running(ref: TaskRef, token: int = 1, **fields: object) -> pb.RunningTask:
    return pb.RunningTask(task=convert.ref_to_pb(ref), fencing_token=token, **fields)  # type: ignore[arg-type]


def test_a_heartbeat_reuses_the_refs_its_predecessor_converted() -> None:
    session = _session()
    kept, gone, new = _ref(), _ref(), _ref()
    first = workers._beats(session, pb.Heartbeat(running=[_running(kept), _running(gone)]), LIMIT)
    second = workers._beats(
        session, pb.Heartbeat(running=[_running(kept, 2), _running(new)]), LIMIT
    )

    assert [b.ref for b in first] == [kept, gone]
    assert [(b.ref, b.token) for b in second] == [(kept, 2), (new, 1)]
    assert second[0].ref is first[0].ref  # not converted again
    # The cache holds exactly the last heartbeat's tasks.
    assert set(session.heartbeat_refs) == {str(kept.id), str(new.id)}


def test_one_bad_heartbeat_entry_costs_only_its_own_lease() -> None:
    session = _session()
    good, bad_token, big_checkpoint = _ref(), _ref(), _ref()
    heartbeat = pb.Heartbeat(
        running=[
            _running(bad_token, workers.MAX_TOKEN + 1),
            _running(good, checkpoint=b"cp"),
            _running(big_checkpoint, checkpoint=b"x" * (LIMIT + 1)),
            pb.RunningTask(task=common_pb2.TaskRef(id="not-a-uuid"), fencing_token=1),
        ]
    )

    beats = workers._beats(session, heartbeat, LIMIT)

    assert [(b.ref, b.checkpoint) for b in beats] == [(good, b"cp")]


# ---- the stream's own messages ------------------------------------------------------------


def test_a_hello_that_names_no_queue_serves_default() -> None:
    assert workers._served_queues(_hello().hello) == frozenset({"default"})
    assert workers._served_queues(_hello(queues=["a", "b"]).hello) == frozenset({"a", "b"})


def test_the_welcome_tells_the_session_and_the_timing() -> None:
    config = SchedulerConfig()
    welcome = workers._welcome(config, _session()).welcome
    assert (welcome.node_id, welcome.session_id) == (config.node_id, "s")
    assert welcome.heartbeat_interval.ToTimedelta().total_seconds() == (
        config.workers.heartbeat_interval_s
    )
    assert welcome.lease_duration.ToTimedelta().total_seconds() == config.workers.task_lease_s
    assert welcome.lease_margin.ToTimedelta().total_seconds() == config.workers.lease_margin_s
    assert welcome.accepts_batches


def _queued(session: WorkerSession, count: int) -> pb.SchedulerMessage:
    for seq in range(1, count):
        session.outbox.put_nowait(pb.SchedulerMessage(heartbeat_reply=pb.HeartbeatReply(seq=seq)))
    return pb.SchedulerMessage(heartbeat_reply=pb.HeartbeatReply(seq=0))


def test_a_worker_that_reads_batches_gets_what_is_queued_in_one_write() -> None:
    session = _session()
    session.accepts_batches = True
    first = _queued(session, 3)

    (write,) = workers._one_write(session, first)

    assert [m.heartbeat_reply.seq for m in write.batch.messages] == [0, 1, 2]
    assert session.outbox.empty()


def test_a_worker_that_does_not_read_batches_gets_one_message_a_write() -> None:
    session = _session()
    first = _queued(session, 3)

    assert workers._one_write(session, first) == [first]
    assert session.outbox.qsize() == 2


def test_a_lone_message_goes_out_unwrapped() -> None:
    session = _session()
    session.accepts_batches = True
    first = _queued(session, 1)
    assert workers._one_write(session, first) == [first]
