"""Translation between the generated protobuf classes and the SDK's dataclasses.

This module and ``_transport.py`` are the only places in the SDK that import ``*_pb2``
(STYLE #7). Everything here is pure: a message in, a message out. Unset optional fields
become ``None`` (``timeout``, ``heartbeat_interval``, a refused Receipt's ``error``), enum
values lose their prefix (``PRIORITY_BULK`` -> ``"BULK"``), and a ``SchedulerMessage``
whose oneof this SDK does not know yet converts to ``None`` so a newer node can add
messages without breaking older workers. Timestamps and Durations go through
:mod:`chronoshard.wire`'s codec, whose rule for a naive datetime is the SDK's: it is
UTC (``Timestamp.FromDatetime``'s rule).
"""

from __future__ import annotations

from chronoshard import wire
from chronoshard.v1 import admin_service_pb2, common_pb2, worker_service_pb2
from chronoshard.worker._models import (
    Ack,
    AssignedParent,
    Assignment,
    Backlog,
    Cancel,
    Complete,
    CreditGrant,
    CreditRecall,
    CreditReturn,
    Drain,
    DrainStarted,
    ErrorInfo,
    Fail,
    Heartbeat,
    HeartbeatReply,
    Hello,
    Inbound,
    NodeInfo,
    Outbound,
    Receipt,
    Reject,
    Release,
    ReleaseReason,
    Resume,
    RevokedTask,
    Settlement,
    SettlementKind,
    TaskRef,
    TopologyChanged,
    Welcome,
)

_RELEASE_REASONS = {
    ReleaseReason.DRAINING: worker_service_pb2.RELEASE_REASON_DRAINING,
    ReleaseReason.CANNOT_RUN: worker_service_pb2.RELEASE_REASON_CANNOT_RUN,
}
_KINDS = {
    worker_service_pb2.SETTLEMENT_KIND_ACK: SettlementKind.ACK,
    worker_service_pb2.SETTLEMENT_KIND_COMPLETE: SettlementKind.COMPLETE,
    worker_service_pb2.SETTLEMENT_KIND_FAIL: SettlementKind.FAIL,
    worker_service_pb2.SETTLEMENT_KIND_RELEASE: SettlementKind.RELEASE,
}


# ---- scalars -------------------------------------------------------------------------


def task_ref_to_pb(ref: TaskRef) -> common_pb2.TaskRef:
    return common_pb2.TaskRef(id=ref.id, scheduled_at=wire.timestamp_to_pb(ref.scheduled_at))


def task_ref_from_pb(ref: common_pb2.TaskRef) -> TaskRef:
    return TaskRef(id=ref.id, scheduled_at=wire.timestamp_from_pb(ref.scheduled_at))


def error_info_from_pb(info: common_pb2.ErrorInfo) -> ErrorInfo:
    return ErrorInfo(
        code=info.code,
        reason=info.reason,
        message=info.message,
        field=info.field,
        retryable=info.retryable,
    )


# ---- worker -> scheduler -------------------------------------------------------------


def complete_to_pb(msg: Complete) -> worker_service_pb2.Complete:
    return worker_service_pb2.Complete(
        task=task_ref_to_pb(msg.task), fencing_token=msg.fencing_token, result_json=msg.result_json
    )


def fail_to_pb(msg: Fail) -> worker_service_pb2.Fail:
    return worker_service_pb2.Fail(
        task=task_ref_to_pb(msg.task),
        fencing_token=msg.fencing_token,
        error_message=msg.error_message,
        error_type=msg.error_type,
        retryable=msg.retryable,
        timed_out=msg.timed_out,
        cancelled=msg.cancelled,
    )


def release_to_pb(msg: Release) -> worker_service_pb2.Release:
    pb = worker_service_pb2.Release(
        task=task_ref_to_pb(msg.task),
        fencing_token=msg.fencing_token,
        reason=_RELEASE_REASONS[msg.reason],
        detail=msg.detail,
    )
    if msg.checkpoint is not None:
        pb.checkpoint = msg.checkpoint
    return pb


def to_pb(msg: Outbound) -> worker_service_pb2.WorkerMessage:
    """One outbound message wrapped in the stream's ``WorkerMessage`` envelope."""
    w = worker_service_pb2
    match msg:
        case Hello():
            return w.WorkerMessage(
                hello=w.Hello(
                    worker_id=msg.worker_id,
                    queues=list(msg.queues),
                    task_types=list(msg.task_types),
                    slots=msg.slots,
                    sdk_version=msg.sdk_version,
                    accepts_batches=msg.accepts_batches,
                )
            )
        case CreditGrant():
            return w.WorkerMessage(credit_grant=w.CreditGrant(credits=msg.credits))
        case CreditRecall():
            return w.WorkerMessage(credit_recall=w.CreditRecall(credits=msg.credits))
        case Ack():
            return w.WorkerMessage(
                ack=w.Ack(task=task_ref_to_pb(msg.task), fencing_token=msg.fencing_token)
            )
        case Heartbeat():
            running = []
            for item in msg.running:
                pb = w.RunningTask(task=task_ref_to_pb(item.task), fencing_token=item.fencing_token)
                if item.checkpoint is not None:
                    pb.checkpoint = item.checkpoint
                running.append(pb)
            return w.WorkerMessage(heartbeat=w.Heartbeat(running=running, seq=msg.seq))
        case Complete():
            return w.WorkerMessage(complete=complete_to_pb(msg))
        case Fail():
            return w.WorkerMessage(fail=fail_to_pb(msg))
        case Release():
            return w.WorkerMessage(release=release_to_pb(msg))
        case DrainStarted():
            return w.WorkerMessage(
                drain_started=w.DrainStarted(grace=wire.duration_to_pb(msg.grace_s))
            )


def batch_to_pb(
    messages: list[worker_service_pb2.WorkerMessage],
) -> worker_service_pb2.WorkerMessage:
    """Several encoded messages as one ``WorkerBatch`` (for a node that reads them)."""
    w = worker_service_pb2
    return w.WorkerMessage(batch=w.WorkerBatch(messages=messages))


# ---- scheduler -> worker -------------------------------------------------------------


def from_pb_many(msg: worker_service_pb2.SchedulerMessage) -> list[Inbound]:
    """The messages one stream message carries: several for a ``SchedulerBatch``, none
    for a kind newer than this SDK (or one a batch may not hold)."""
    if msg.WhichOneof("message") != "batch":
        one = from_pb(msg)
        return [] if one is None else [one]
    out: list[Inbound] = []
    for inner in msg.batch.messages:
        if inner.WhichOneof("message") in ("batch", "welcome", "reject"):
            continue
        decoded = from_pb(inner)
        if decoded is not None:
            out.append(decoded)
    return out


def _task_status_name(value: int) -> str:
    """A TaskStatus without its prefix. A value newer than this SDK's enum is kept as
    its number ("11"): a status added by a newer node must not fail the assignment."""
    try:
        return common_pb2.TaskStatus.Name(value).removeprefix("TASK_STATUS_")
    except ValueError:
        return str(value)


def _parent(pb: worker_service_pb2.ParentResult) -> AssignedParent:
    return AssignedParent(
        ref=pb.ref,
        task_id=pb.task_id,
        status=_task_status_name(pb.status),
        result_json=pb.result_json,
        omitted=pb.omitted,
    )


def _assignment(pb: worker_service_pb2.Assignment) -> Assignment:
    priority = common_pb2.Priority.Name(pb.priority).removeprefix("PRIORITY_")
    return Assignment(
        task=task_ref_from_pb(pb.task),
        type=pb.type,
        payload_json=pb.payload_json,
        fencing_token=pb.fencing_token,
        attempt=pb.attempt,
        max_retries=pb.max_retries,
        due_at=wire.timestamp_from_pb(pb.due_at),
        lease_expires_at=wire.timestamp_from_pb(pb.lease_expires_at)
        if pb.HasField("lease_expires_at")
        else None,
        timeout_s=wire.duration_seconds(pb.timeout) if pb.HasField("timeout") else None,
        checkpoint=pb.checkpoint,
        trace_context=dict(pb.trace_context),
        queue=pb.queue,
        priority="STANDARD" if priority == "UNSPECIFIED" else priority,
        idempotent=pb.idempotent,
        sent_at=wire.timestamp_from_pb(pb.sent_at) if pb.HasField("sent_at") else None,
        logical_date=wire.timestamp_from_pb(pb.logical_date)
        if pb.HasField("logical_date")
        else None,
        schedule_id=pb.schedule_id or None,
        workflow_id=pb.workflow_id or None,
        workflow_ref=pb.workflow_ref or None,
        parent_results=tuple(_parent(p) for p in pb.parent_results),
        tenant_id=pb.tenant_id,
    )


def from_pb(msg: worker_service_pb2.SchedulerMessage) -> Inbound | None:
    """The message inside the envelope; None for a kind this SDK does not know."""
    which = msg.WhichOneof("message")
    if which == "welcome":
        pb = msg.welcome
        return Welcome(
            node_id=pb.node_id,
            session_id=pb.session_id,
            heartbeat_interval_s=(
                wire.duration_seconds(pb.heartbeat_interval)
                if pb.HasField("heartbeat_interval")
                else None
            ),
            lease_duration_s=(
                wire.duration_seconds(pb.lease_duration) if pb.HasField("lease_duration") else None
            ),
            accepts_batches=pb.accepts_batches,
            lease_margin_s=wire.duration_seconds(pb.lease_margin)
            if pb.HasField("lease_margin")
            else None,
        )
    if which == "assignment":
        return _assignment(msg.assignment)
    if which == "heartbeat_reply":
        return HeartbeatReply(
            revoked=tuple(
                RevokedTask(
                    task=task_ref_from_pb(r.task), fencing_token=r.fencing_token, reason=r.reason
                )
                for r in msg.heartbeat_reply.revoked
            ),
            seq=msg.heartbeat_reply.seq,
        )
    if which == "cancel":
        c = msg.cancel
        return Cancel(task=task_ref_from_pb(c.task), fencing_token=c.fencing_token, reason=c.reason)
    if which == "drain":
        return Drain(reason=msg.drain.reason, shutting_down=msg.drain.shutting_down)
    if which == "resume":
        return Resume()
    if which == "topology_changed":
        return TopologyChanged()
    if which == "credit_return":
        return CreditReturn(credits=msg.credit_return.credits)
    if which == "backlog":
        return Backlog(ready=msg.backlog.ready, ready_by_queue=dict(msg.backlog.ready_by_queue))
    if which == "receipt":
        r = msg.receipt
        kind = _KINDS.get(r.kind)
        if kind is None:
            return None
        return Receipt(
            task=task_ref_from_pb(r.task),
            fencing_token=r.fencing_token,
            kind=kind,
            error=error_info_from_pb(r.error) if r.HasField("error") else None,
        )
    if which == "reject":
        return Reject(error=error_info_from_pb(msg.reject.error))
    return None


# ---- unary settlement and topology ---------------------------------------------------


def settlement_request(
    worker_id: str, msg: Settlement
) -> (
    tuple[str, worker_service_pb2.CompleteRequest]
    | tuple[str, worker_service_pb2.FailRequest]
    | tuple[str, worker_service_pb2.ReleaseRequest]
):
    """The unary RPC name and request that carry ``msg``; an Ack has none (ValueError)."""
    w = worker_service_pb2
    match msg:
        case Complete():
            return "Complete", w.CompleteRequest(worker_id=worker_id, complete=complete_to_pb(msg))
        case Fail():
            return "Fail", w.FailRequest(worker_id=worker_id, fail=fail_to_pb(msg))
        case Release():
            return "Release", w.ReleaseRequest(worker_id=worker_id, release=release_to_pb(msg))
        case Ack():
            raise ValueError("an Ack travels only on the stream")


def topology_from_pb(resp: admin_service_pb2.GetTopologyResponse) -> tuple[NodeInfo, ...]:
    return tuple(
        NodeInfo(node_id=n.node_id, address=n.address, draining=n.draining) for n in resp.nodes
    )
