import datetime

from chronoshard.v1 import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitTaskRequest(_message.Message):
    __slots__ = ("type", "payload_json", "scheduled_at", "delay", "priority", "queue", "max_retries", "retry_backoff", "timeout", "strict_timing", "jitter_mode", "jitter_window", "idempotent", "idempotency_key", "job_id")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    RETRY_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    STRICT_TIMING_FIELD_NUMBER: _ClassVar[int]
    JITTER_MODE_FIELD_NUMBER: _ClassVar[int]
    JITTER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    type: str
    payload_json: bytes
    scheduled_at: _timestamp_pb2.Timestamp
    delay: _duration_pb2.Duration
    priority: _common_pb2.Priority
    queue: str
    max_retries: int
    retry_backoff: _common_pb2.RetryBackoff
    timeout: _duration_pb2.Duration
    strict_timing: bool
    jitter_mode: _common_pb2.JitterMode
    jitter_window: _duration_pb2.Duration
    idempotent: bool
    idempotency_key: str
    job_id: str
    def __init__(self, type: _Optional[str] = ..., payload_json: _Optional[bytes] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., queue: _Optional[str] = ..., max_retries: _Optional[int] = ..., retry_backoff: _Optional[_Union[_common_pb2.RetryBackoff, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., strict_timing: _Optional[bool] = ..., jitter_mode: _Optional[_Union[_common_pb2.JitterMode, str]] = ..., jitter_window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idempotent: _Optional[bool] = ..., idempotency_key: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class SubmitTaskResponse(_message.Message):
    __slots__ = ("task", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.Task
    created: bool
    def __init__(self, task: _Optional[_Union[_common_pb2.Task, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class SubmitStreamRequest(_message.Message):
    __slots__ = ("task", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    task: SubmitTaskRequest
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, task: _Optional[_Union[SubmitTaskRequest, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SubmitStreamReply(_message.Message):
    __slots__ = ("submitted", "error", "retry_after_s")
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    submitted: SubmitTaskResponse
    error: _common_pb2.ErrorInfo
    retry_after_s: float
    def __init__(self, submitted: _Optional[_Union[SubmitTaskResponse, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorInfo, _Mapping]] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[SubmitTaskRequest]
    def __init__(self, tasks: _Optional[_Iterable[_Union[SubmitTaskRequest, _Mapping]]] = ...) -> None: ...

class SubmitBatchResult(_message.Message):
    __slots__ = ("submitted", "error")
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    submitted: SubmitTaskResponse
    error: _common_pb2.ErrorInfo
    def __init__(self, submitted: _Optional[_Union[SubmitTaskResponse, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorInfo, _Mapping]] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SubmitBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SubmitBatchResult, _Mapping]]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("id", "include_attempts")
    ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    include_attempts: bool
    def __init__(self, id: _Optional[str] = ..., include_attempts: _Optional[bool] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task", "attempts")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.Task
    attempts: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskAttempt]
    def __init__(self, task: _Optional[_Union[_common_pb2.Task, _Mapping]] = ..., attempts: _Optional[_Iterable[_Union[_common_pb2.TaskAttempt, _Mapping]]] = ...) -> None: ...

class TimeRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    def __init__(self, start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("statuses", "type", "queue", "job_id", "scheduled_at", "due_at", "page_size", "page_token", "include_payloads")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[_common_pb2.TaskStatus]
    type: str
    queue: str
    job_id: str
    scheduled_at: TimeRange
    due_at: TimeRange
    page_size: int
    page_token: str
    include_payloads: bool
    def __init__(self, statuses: _Optional[_Iterable[_Union[_common_pb2.TaskStatus, str]]] = ..., type: _Optional[str] = ..., queue: _Optional[str] = ..., job_id: _Optional[str] = ..., scheduled_at: _Optional[_Union[TimeRange, _Mapping]] = ..., due_at: _Optional[_Union[TimeRange, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_payloads: _Optional[bool] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[_common_pb2.Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.Task
    def __init__(self, task: _Optional[_Union[_common_pb2.Task, _Mapping]] = ...) -> None: ...

class RetryTaskRequest(_message.Message):
    __slots__ = ("id", "delay")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    id: str
    delay: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RetryTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.Task
    def __init__(self, task: _Optional[_Union[_common_pb2.Task, _Mapping]] = ...) -> None: ...

class ResolveTaskRequest(_message.Message):
    __slots__ = ("id", "resolution", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    resolution: _common_pb2.Resolution
    reason: str
    def __init__(self, id: _Optional[str] = ..., resolution: _Optional[_Union[_common_pb2.Resolution, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ResolveTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.Task
    def __init__(self, task: _Optional[_Union[_common_pb2.Task, _Mapping]] = ...) -> None: ...
