"""Protobuf <-> dataclass conversion at the SDK's edge."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard.v1 import common_pb2, worker_service_pb2
from chronoshard.worker._convert import from_pb, settlement_request, to_pb
from chronoshard.worker._models import (
    Ack,
    Assignment,
    Complete,
    DrainStarted,
    ErrorInfo,
    Fail,
    Heartbeat,
    Receipt,
    Release,
    ReleaseReason,
    RunningTask,
    SettlementKind,
    TaskRef,
    Welcome,
)

pb = worker_service_pb2
AT = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
REF = TaskRef("0190a5e2-0000-7000-8000-000000000001", AT)


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def test_task_ref_survives_the_round_trip_to_the_microsecond() -> None:
    msg = to_pb(Ack(REF, 3))
    assert msg.ack.task.scheduled_at.nanos == 123456000
    back = from_pb(
        pb.SchedulerMessage(cancel=pb.Cancel(task=msg.ack.task, fencing_token=3, reason="r"))
    )
    assert back is not None and back.task == REF  # type: ignore[union-attr]


def test_optional_checkpoints_are_absent_not_empty() -> None:
    without = to_pb(Release(REF, 1, ReleaseReason.DRAINING))
    assert not without.release.HasField("checkpoint")
    assert without.release.reason == pb.RELEASE_REASON_DRAINING
    empty = to_pb(Release(REF, 1, ReleaseReason.CANNOT_RUN, b"", "x"))
    assert empty.release.HasField("checkpoint") and empty.release.checkpoint == b""
    beat = to_pb(Heartbeat((RunningTask(REF, 1), RunningTask(REF, 2, b"[1]"))))
    assert [r.HasField("checkpoint") for r in beat.heartbeat.running] == [False, True]


def test_fail_and_drain_started() -> None:
    fail = to_pb(Fail(REF, 2, "boom", "ValueError", True, timed_out=True)).fail
    assert (fail.error_message, fail.error_type, fail.retryable, fail.timed_out) == (
        "boom",
        "ValueError",
        True,
        True,
    )
    assert not fail.cancelled
    assert to_pb(DrainStarted(2.5)).drain_started.grace.ToMilliseconds() == 2500


def test_assignment_with_and_without_optional_fields() -> None:
    full = pb.Assignment(
        task=common_pb2.TaskRef(id=REF.id, scheduled_at=_ts(AT)),
        type="t",
        payload_json=b"{}",
        fencing_token=9,
        attempt=1,
        max_retries=2,
        due_at=_ts(AT),
        lease_expires_at=_ts(AT),
        timeout=duration_pb2.Duration(seconds=1, nanos=500_000_000),
        checkpoint=b"[]",
        trace_context={"traceparent": "x"},
        queue="q",
        priority=common_pb2.PRIORITY_BULK,
        idempotent=True,
        logical_date=_ts(AT),
        schedule_id=REF.id,
    )
    a = from_pb(pb.SchedulerMessage(assignment=full))
    assert isinstance(a, Assignment)
    assert (a.timeout_s, a.lease_expires_at, a.priority, a.queue) == (1.5, AT, "BULK", "q")
    assert a.trace_context == {"traceparent": "x"} and a.idempotent
    assert (a.logical_date, a.schedule_id) == (AT, REF.id)
    bare = from_pb(pb.SchedulerMessage(assignment=pb.Assignment(task=full.task, due_at=_ts(AT))))
    assert isinstance(bare, Assignment)
    assert (bare.timeout_s, bare.lease_expires_at, bare.priority) == (None, None, "STANDARD")
    assert (bare.logical_date, bare.schedule_id) == (None, None)


def test_welcome_receipt_and_unknown_messages() -> None:
    welcome = from_pb(
        pb.SchedulerMessage(
            welcome=pb.Welcome(node_id="n", heartbeat_interval=duration_pb2.Duration(seconds=5))
        )
    )
    assert welcome == Welcome("n", "", 5.0, None)
    task = common_pb2.TaskRef(id=REF.id, scheduled_at=_ts(AT))
    ok = from_pb(
        pb.SchedulerMessage(
            receipt=pb.Receipt(task=task, fencing_token=1, kind=pb.SETTLEMENT_KIND_COMPLETE)
        )
    )
    assert ok == Receipt(REF, 1, SettlementKind.COMPLETE, None)
    refused = from_pb(
        pb.SchedulerMessage(
            receipt=pb.Receipt(
                task=task,
                fencing_token=1,
                kind=pb.SETTLEMENT_KIND_FAIL,
                error=common_pb2.ErrorInfo(
                    code="FAILED_PRECONDITION", reason="STALE_FENCING_TOKEN"
                ),
            )
        )
    )
    assert isinstance(refused, Receipt)
    assert refused.error == ErrorInfo("FAILED_PRECONDITION", "STALE_FENCING_TOKEN")
    assert from_pb(pb.SchedulerMessage()) is None


def test_unary_requests_carry_the_worker_id() -> None:
    method, request = settlement_request("w1", Complete(REF, 2, b"1"))
    assert method == "Complete" and request.worker_id == "w1"
    assert request.complete.result_json == b"1"  # type: ignore[union-attr]
    method, _ = settlement_request("w1", Release(REF, 2, ReleaseReason.DRAINING))
    assert method == "Release"
