import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_SCHEDULED: _ClassVar[TaskStatus]
    TASK_STATUS_PRELOADED: _ClassVar[TaskStatus]
    TASK_STATUS_DISPATCHED: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_COMPLETED: _ClassVar[TaskStatus]
    TASK_STATUS_RETRYING: _ClassVar[TaskStatus]
    TASK_STATUS_DEAD_LETTER: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]
    TASK_STATUS_UPSTREAM_FAILED: _ClassVar[TaskStatus]
    TASK_STATUS_OUTCOME_UNKNOWN: _ClassVar[TaskStatus]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_CRITICAL: _ClassVar[Priority]
    PRIORITY_STANDARD: _ClassVar[Priority]
    PRIORITY_BULK: _ClassVar[Priority]

class JitterMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JITTER_MODE_UNSPECIFIED: _ClassVar[JitterMode]
    JITTER_MODE_SYMMETRIC: _ClassVar[JitterMode]
    JITTER_MODE_NONE: _ClassVar[JitterMode]
    JITTER_MODE_DELAY_ONLY: _ClassVar[JitterMode]

class AttemptState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_STATE_UNSPECIFIED: _ClassVar[AttemptState]
    ATTEMPT_STATE_DISPATCHED: _ClassVar[AttemptState]
    ATTEMPT_STATE_RUNNING: _ClassVar[AttemptState]
    ATTEMPT_STATE_SUCCEEDED: _ClassVar[AttemptState]
    ATTEMPT_STATE_FAILED: _ClassVar[AttemptState]
    ATTEMPT_STATE_TIMED_OUT: _ClassVar[AttemptState]
    ATTEMPT_STATE_RELEASED: _ClassVar[AttemptState]
    ATTEMPT_STATE_ABANDONED: _ClassVar[AttemptState]
    ATTEMPT_STATE_CANCELLED: _ClassVar[AttemptState]
    ATTEMPT_STATE_FENCED: _ClassVar[AttemptState]
    ATTEMPT_STATE_OUTCOME_UNKNOWN: _ClassVar[AttemptState]

class Resolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOLUTION_UNSPECIFIED: _ClassVar[Resolution]
    RESOLUTION_RETRY: _ClassVar[Resolution]
    RESOLUTION_MARK_FAILED: _ClassVar[Resolution]
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_SCHEDULED: TaskStatus
TASK_STATUS_PRELOADED: TaskStatus
TASK_STATUS_DISPATCHED: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_COMPLETED: TaskStatus
TASK_STATUS_RETRYING: TaskStatus
TASK_STATUS_DEAD_LETTER: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_UPSTREAM_FAILED: TaskStatus
TASK_STATUS_OUTCOME_UNKNOWN: TaskStatus
PRIORITY_UNSPECIFIED: Priority
PRIORITY_CRITICAL: Priority
PRIORITY_STANDARD: Priority
PRIORITY_BULK: Priority
JITTER_MODE_UNSPECIFIED: JitterMode
JITTER_MODE_SYMMETRIC: JitterMode
JITTER_MODE_NONE: JitterMode
JITTER_MODE_DELAY_ONLY: JitterMode
ATTEMPT_STATE_UNSPECIFIED: AttemptState
ATTEMPT_STATE_DISPATCHED: AttemptState
ATTEMPT_STATE_RUNNING: AttemptState
ATTEMPT_STATE_SUCCEEDED: AttemptState
ATTEMPT_STATE_FAILED: AttemptState
ATTEMPT_STATE_TIMED_OUT: AttemptState
ATTEMPT_STATE_RELEASED: AttemptState
ATTEMPT_STATE_ABANDONED: AttemptState
ATTEMPT_STATE_CANCELLED: AttemptState
ATTEMPT_STATE_FENCED: AttemptState
ATTEMPT_STATE_OUTCOME_UNKNOWN: AttemptState
RESOLUTION_UNSPECIFIED: Resolution
RESOLUTION_RETRY: Resolution
RESOLUTION_MARK_FAILED: Resolution

class TaskRef(_message.Message):
    __slots__ = ("id", "scheduled_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    scheduled_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RetryBackoff(_message.Message):
    __slots__ = ("initial", "max", "multiplier")
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    initial: _duration_pb2.Duration
    max: _duration_pb2.Duration
    multiplier: float
    def __init__(self, initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., multiplier: _Optional[float] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "tenant_id", "type", "status", "scheduled_at", "due_at", "priority", "queue", "payload_json", "result_json", "last_error", "attempt", "fencing_token", "retry_count", "max_retries", "retry_backoff", "timeout", "strict_timing", "idempotent", "idempotency_key", "job_id", "worker_id", "lease_expires_at", "checkpoint", "shard", "trace_context", "created_at", "updated_at", "finished_at", "workflow_id", "unresolved_dependencies", "schedule_id", "logical_date", "waiting_reason")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    RETRY_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    STRICT_TIMING_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_DATE_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant_id: str
    type: str
    status: TaskStatus
    scheduled_at: _timestamp_pb2.Timestamp
    due_at: _timestamp_pb2.Timestamp
    priority: Priority
    queue: str
    payload_json: bytes
    result_json: bytes
    last_error: str
    attempt: int
    fencing_token: int
    retry_count: int
    max_retries: int
    retry_backoff: RetryBackoff
    timeout: _duration_pb2.Duration
    strict_timing: bool
    idempotent: bool
    idempotency_key: str
    job_id: str
    worker_id: str
    lease_expires_at: _timestamp_pb2.Timestamp
    checkpoint: bytes
    shard: int
    trace_context: _containers.ScalarMap[str, str]
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    workflow_id: str
    unresolved_dependencies: int
    schedule_id: str
    logical_date: _timestamp_pb2.Timestamp
    waiting_reason: str
    def __init__(self, id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., type: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[_Union[Priority, str]] = ..., queue: _Optional[str] = ..., payload_json: _Optional[bytes] = ..., result_json: _Optional[bytes] = ..., last_error: _Optional[str] = ..., attempt: _Optional[int] = ..., fencing_token: _Optional[int] = ..., retry_count: _Optional[int] = ..., max_retries: _Optional[int] = ..., retry_backoff: _Optional[_Union[RetryBackoff, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., strict_timing: _Optional[bool] = ..., idempotent: _Optional[bool] = ..., idempotency_key: _Optional[str] = ..., job_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., checkpoint: _Optional[bytes] = ..., shard: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., workflow_id: _Optional[str] = ..., unresolved_dependencies: _Optional[int] = ..., schedule_id: _Optional[str] = ..., logical_date: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., waiting_reason: _Optional[str] = ...) -> None: ...

class TaskAttempt(_message.Message):
    __slots__ = ("attempt", "fencing_token", "state", "worker_id", "entered_at", "finished_at", "error", "resolution")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTERED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    fencing_token: int
    state: AttemptState
    worker_id: str
    entered_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error: str
    resolution: Resolution
    def __init__(self, attempt: _Optional[int] = ..., fencing_token: _Optional[int] = ..., state: _Optional[_Union[AttemptState, str]] = ..., worker_id: _Optional[str] = ..., entered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., resolution: _Optional[_Union[Resolution, str]] = ...) -> None: ...

class ErrorInfo(_message.Message):
    __slots__ = ("code", "reason", "message", "field", "retryable", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: str
    reason: str
    message: str
    field: str
    retryable: bool
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., retryable: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...
