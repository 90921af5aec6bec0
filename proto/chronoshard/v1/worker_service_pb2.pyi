import datetime

from chronoshard.v1 import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReleaseReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_REASON_UNSPECIFIED: _ClassVar[ReleaseReason]
    RELEASE_REASON_DRAINING: _ClassVar[ReleaseReason]
    RELEASE_REASON_CANNOT_RUN: _ClassVar[ReleaseReason]

class SettlementKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETTLEMENT_KIND_UNSPECIFIED: _ClassVar[SettlementKind]
    SETTLEMENT_KIND_ACK: _ClassVar[SettlementKind]
    SETTLEMENT_KIND_COMPLETE: _ClassVar[SettlementKind]
    SETTLEMENT_KIND_FAIL: _ClassVar[SettlementKind]
    SETTLEMENT_KIND_RELEASE: _ClassVar[SettlementKind]
RELEASE_REASON_UNSPECIFIED: ReleaseReason
RELEASE_REASON_DRAINING: ReleaseReason
RELEASE_REASON_CANNOT_RUN: ReleaseReason
SETTLEMENT_KIND_UNSPECIFIED: SettlementKind
SETTLEMENT_KIND_ACK: SettlementKind
SETTLEMENT_KIND_COMPLETE: SettlementKind
SETTLEMENT_KIND_FAIL: SettlementKind
SETTLEMENT_KIND_RELEASE: SettlementKind

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "credit_grant", "ack", "heartbeat", "complete", "fail", "release", "drain_started", "credit_recall", "batch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREDIT_GRANT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_STARTED_FIELD_NUMBER: _ClassVar[int]
    CREDIT_RECALL_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    credit_grant: CreditGrant
    ack: Ack
    heartbeat: Heartbeat
    complete: Complete
    fail: Fail
    release: Release
    drain_started: DrainStarted
    credit_recall: CreditRecall
    batch: WorkerBatch
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., credit_grant: _Optional[_Union[CreditGrant, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., complete: _Optional[_Union[Complete, _Mapping]] = ..., fail: _Optional[_Union[Fail, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., drain_started: _Optional[_Union[DrainStarted, _Mapping]] = ..., credit_recall: _Optional[_Union[CreditRecall, _Mapping]] = ..., batch: _Optional[_Union[WorkerBatch, _Mapping]] = ...) -> None: ...

class WorkerBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[WorkerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[WorkerMessage, _Mapping]]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "queues", "task_types", "slots", "sdk_version", "accepts_batches")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    task_types: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    sdk_version: str
    accepts_batches: bool
    def __init__(self, worker_id: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., task_types: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., sdk_version: _Optional[str] = ..., accepts_batches: _Optional[bool] = ...) -> None: ...

class CreditGrant(_message.Message):
    __slots__ = ("credits",)
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    credits: int
    def __init__(self, credits: _Optional[int] = ...) -> None: ...

class CreditRecall(_message.Message):
    __slots__ = ("credits",)
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    credits: int
    def __init__(self, credits: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("task", "fencing_token")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("running", "seq")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    running: _containers.RepeatedCompositeFieldContainer[RunningTask]
    seq: int
    def __init__(self, running: _Optional[_Iterable[_Union[RunningTask, _Mapping]]] = ..., seq: _Optional[int] = ...) -> None: ...

class RunningTask(_message.Message):
    __slots__ = ("task", "fencing_token", "checkpoint")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    checkpoint: bytes
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ..., checkpoint: _Optional[bytes] = ...) -> None: ...

class Complete(_message.Message):
    __slots__ = ("task", "fencing_token", "result_json")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    result_json: bytes
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ..., result_json: _Optional[bytes] = ...) -> None: ...

class Fail(_message.Message):
    __slots__ = ("task", "fencing_token", "error_message", "error_type", "retryable", "timed_out", "cancelled")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    error_message: str
    error_type: str
    retryable: bool
    timed_out: bool
    cancelled: bool
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ..., error_message: _Optional[str] = ..., error_type: _Optional[str] = ..., retryable: _Optional[bool] = ..., timed_out: _Optional[bool] = ..., cancelled: _Optional[bool] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("task", "fencing_token", "checkpoint", "reason", "detail")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    checkpoint: bytes
    reason: ReleaseReason
    detail: str
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ..., checkpoint: _Optional[bytes] = ..., reason: _Optional[_Union[ReleaseReason, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class DrainStarted(_message.Message):
    __slots__ = ("grace",)
    GRACE_FIELD_NUMBER: _ClassVar[int]
    grace: _duration_pb2.Duration
    def __init__(self, grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SchedulerMessage(_message.Message):
    __slots__ = ("welcome", "assignment", "heartbeat_reply", "cancel", "drain", "backlog", "receipt", "reject", "credit_return", "batch", "resume", "topology_changed")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_REPLY_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_RETURN_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_CHANGED_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    assignment: Assignment
    heartbeat_reply: HeartbeatReply
    cancel: Cancel
    drain: Drain
    backlog: Backlog
    receipt: Receipt
    reject: Reject
    credit_return: CreditReturn
    batch: SchedulerBatch
    resume: Resume
    topology_changed: TopologyChanged
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., heartbeat_reply: _Optional[_Union[HeartbeatReply, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., backlog: _Optional[_Union[Backlog, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ..., credit_return: _Optional[_Union[CreditReturn, _Mapping]] = ..., batch: _Optional[_Union[SchedulerBatch, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., topology_changed: _Optional[_Union[TopologyChanged, _Mapping]] = ...) -> None: ...

class SchedulerBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[SchedulerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[SchedulerMessage, _Mapping]]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("node_id", "session_id", "heartbeat_interval", "lease_duration", "accepts_batches", "lease_margin")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    LEASE_MARGIN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session_id: str
    heartbeat_interval: _duration_pb2.Duration
    lease_duration: _duration_pb2.Duration
    accepts_batches: bool
    lease_margin: _duration_pb2.Duration
    def __init__(self, node_id: _Optional[str] = ..., session_id: _Optional[str] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., accepts_batches: _Optional[bool] = ..., lease_margin: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("task", "type", "payload_json", "fencing_token", "attempt", "max_retries", "due_at", "lease_expires_at", "timeout", "checkpoint", "trace_context", "queue", "priority", "idempotent", "sent_at", "logical_date", "schedule_id", "workflow_id", "workflow_ref", "parent_results", "tenant_id")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_DATE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_REF_FIELD_NUMBER: _ClassVar[int]
    PARENT_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    type: str
    payload_json: bytes
    fencing_token: int
    attempt: int
    max_retries: int
    due_at: _timestamp_pb2.Timestamp
    lease_expires_at: _timestamp_pb2.Timestamp
    timeout: _duration_pb2.Duration
    checkpoint: bytes
    trace_context: _containers.ScalarMap[str, str]
    queue: str
    priority: _common_pb2.Priority
    idempotent: bool
    sent_at: _timestamp_pb2.Timestamp
    logical_date: _timestamp_pb2.Timestamp
    schedule_id: str
    workflow_id: str
    workflow_ref: str
    parent_results: _containers.RepeatedCompositeFieldContainer[ParentResult]
    tenant_id: str
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., type: _Optional[str] = ..., payload_json: _Optional[bytes] = ..., fencing_token: _Optional[int] = ..., attempt: _Optional[int] = ..., max_retries: _Optional[int] = ..., due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., checkpoint: _Optional[bytes] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., queue: _Optional[str] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., idempotent: _Optional[bool] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., logical_date: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., schedule_id: _Optional[str] = ..., workflow_id: _Optional[str] = ..., workflow_ref: _Optional[str] = ..., parent_results: _Optional[_Iterable[_Union[ParentResult, _Mapping]]] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ParentResult(_message.Message):
    __slots__ = ("ref", "task_id", "status", "result_json", "omitted")
    REF_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    OMITTED_FIELD_NUMBER: _ClassVar[int]
    ref: str
    task_id: str
    status: _common_pb2.TaskStatus
    result_json: bytes
    omitted: bool
    def __init__(self, ref: _Optional[str] = ..., task_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.TaskStatus, str]] = ..., result_json: _Optional[bytes] = ..., omitted: _Optional[bool] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("revoked", "seq")
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    revoked: _containers.RepeatedCompositeFieldContainer[RevokedTask]
    seq: int
    def __init__(self, revoked: _Optional[_Iterable[_Union[RevokedTask, _Mapping]]] = ..., seq: _Optional[int] = ...) -> None: ...

class RevokedTask(_message.Message):
    __slots__ = ("task", "fencing_token", "reason")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    reason: str
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("task", "fencing_token", "reason")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    reason: str
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason", "shutting_down")
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHUTTING_DOWN_FIELD_NUMBER: _ClassVar[int]
    reason: str
    shutting_down: bool
    def __init__(self, reason: _Optional[str] = ..., shutting_down: _Optional[bool] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TopologyChanged(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreditReturn(_message.Message):
    __slots__ = ("credits",)
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    credits: int
    def __init__(self, credits: _Optional[int] = ...) -> None: ...

class Backlog(_message.Message):
    __slots__ = ("ready", "ready_by_queue")
    class ReadyByQueueEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    READY_FIELD_NUMBER: _ClassVar[int]
    READY_BY_QUEUE_FIELD_NUMBER: _ClassVar[int]
    ready: int
    ready_by_queue: _containers.ScalarMap[str, int]
    def __init__(self, ready: _Optional[int] = ..., ready_by_queue: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("task", "fencing_token", "kind", "error")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskRef
    fencing_token: int
    kind: SettlementKind
    error: _common_pb2.ErrorInfo
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskRef, _Mapping]] = ..., fencing_token: _Optional[int] = ..., kind: _Optional[_Union[SettlementKind, str]] = ..., error: _Optional[_Union[_common_pb2.ErrorInfo, _Mapping]] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.ErrorInfo
    def __init__(self, error: _Optional[_Union[_common_pb2.ErrorInfo, _Mapping]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("worker_id", "complete")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    complete: Complete
    def __init__(self, worker_id: _Optional[str] = ..., complete: _Optional[_Union[Complete, _Mapping]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("worker_id", "fail")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    fail: Fail
    def __init__(self, worker_id: _Optional[str] = ..., fail: _Optional[_Union[Fail, _Mapping]] = ...) -> None: ...

class FailResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("worker_id", "release")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    release: Release
    def __init__(self, worker_id: _Optional[str] = ..., release: _Optional[_Union[Release, _Mapping]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
