import datetime

from chronoshard.v1 import common_pb2 as _common_pb2
from chronoshard.v1 import task_service_pb2 as _task_service_pb2
from chronoshard.v1 import workflow_service_pb2 as _workflow_service_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CatchupPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CATCHUP_POLICY_UNSPECIFIED: _ClassVar[CatchupPolicy]
    CATCHUP_POLICY_SKIP: _ClassVar[CatchupPolicy]
    CATCHUP_POLICY_LATEST: _ClassVar[CatchupPolicy]
    CATCHUP_POLICY_ALL: _ClassVar[CatchupPolicy]

class OverlapPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERLAP_POLICY_UNSPECIFIED: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_ALLOW: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_SKIP: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_BUFFER_ONE: _ClassVar[OverlapPolicy]
CATCHUP_POLICY_UNSPECIFIED: CatchupPolicy
CATCHUP_POLICY_SKIP: CatchupPolicy
CATCHUP_POLICY_LATEST: CatchupPolicy
CATCHUP_POLICY_ALL: CatchupPolicy
OVERLAP_POLICY_UNSPECIFIED: OverlapPolicy
OVERLAP_POLICY_ALLOW: OverlapPolicy
OVERLAP_POLICY_SKIP: OverlapPolicy
OVERLAP_POLICY_BUFFER_ONE: OverlapPolicy

class ScheduleWatch(_message.Message):
    __slots__ = ("disabled", "expected_duration", "tolerance", "severity")
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_DURATION_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    disabled: bool
    expected_duration: _duration_pb2.Duration
    tolerance: _duration_pb2.Duration
    severity: str
    def __init__(self, disabled: _Optional[bool] = ..., expected_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tolerance: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., severity: _Optional[str] = ...) -> None: ...

class ScheduleSpec(_message.Message):
    __slots__ = ("name", "cron", "interval", "timezone", "start_at", "end_at", "task_template", "catchup_policy", "catchup_limit", "overlap_policy", "job_id", "watch", "misfire_grace", "workflow_template")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    END_AT_FIELD_NUMBER: _ClassVar[int]
    TASK_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CATCHUP_POLICY_FIELD_NUMBER: _ClassVar[int]
    CATCHUP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_POLICY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_GRACE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: str
    interval: _duration_pb2.Duration
    timezone: str
    start_at: _timestamp_pb2.Timestamp
    end_at: _timestamp_pb2.Timestamp
    task_template: _task_service_pb2.SubmitTaskRequest
    catchup_policy: CatchupPolicy
    catchup_limit: int
    overlap_policy: OverlapPolicy
    job_id: str
    watch: ScheduleWatch
    misfire_grace: _duration_pb2.Duration
    workflow_template: _workflow_service_pb2.CreateWorkflowRequest
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timezone: _Optional[str] = ..., start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., task_template: _Optional[_Union[_task_service_pb2.SubmitTaskRequest, _Mapping]] = ..., catchup_policy: _Optional[_Union[CatchupPolicy, str]] = ..., catchup_limit: _Optional[int] = ..., overlap_policy: _Optional[_Union[OverlapPolicy, str]] = ..., job_id: _Optional[str] = ..., watch: _Optional[_Union[ScheduleWatch, _Mapping]] = ..., misfire_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., workflow_template: _Optional[_Union[_workflow_service_pb2.CreateWorkflowRequest, _Mapping]] = ...) -> None: ...

class ScheduleRun(_message.Message):
    __slots__ = ("logical_date", "origin", "task_id", "status", "finished_at", "workflow_id")
    LOGICAL_DATE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    logical_date: _timestamp_pb2.Timestamp
    origin: str
    task_id: str
    status: _common_pb2.TaskStatus
    finished_at: _timestamp_pb2.Timestamp
    workflow_id: str
    def __init__(self, logical_date: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin: _Optional[str] = ..., task_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.TaskStatus, str]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., workflow_id: _Optional[str] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("id", "tenant_id", "spec", "paused", "next_occurrence", "created_at", "updated_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant_id: str
    spec: ScheduleSpec
    paused: bool
    next_occurrence: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ..., paused: _Optional[bool] = ..., next_occurrence: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: ScheduleSpec
    def __init__(self, spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ...) -> None: ...

class CreateScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("id", "next_count", "runs_count")
    ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_COUNT_FIELD_NUMBER: _ClassVar[int]
    RUNS_COUNT_FIELD_NUMBER: _ClassVar[int]
    id: str
    next_count: int
    runs_count: int
    def __init__(self, id: _Optional[str] = ..., next_count: _Optional[int] = ..., runs_count: _Optional[int] = ...) -> None: ...

class GetScheduleResponse(_message.Message):
    __slots__ = ("schedule", "next_occurrences", "runs")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    NEXT_OCCURRENCES_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    next_occurrences: _containers.RepeatedCompositeFieldContainer[_timestamp_pb2.Timestamp]
    runs: _containers.RepeatedCompositeFieldContainer[ScheduleRun]
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., next_occurrences: _Optional[_Iterable[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[ScheduleRun, _Mapping]]] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateScheduleRequest(_message.Message):
    __slots__ = ("id", "spec")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: ScheduleSpec
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ...) -> None: ...

class UpdateScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class PauseScheduleRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class PauseScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class ResumeScheduleRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ResumeScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class DeleteScheduleRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ("withdrawn",)
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    withdrawn: int
    def __init__(self, withdrawn: _Optional[int] = ...) -> None: ...

class TriggerScheduleRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class TriggerScheduleResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: ScheduleRun
    def __init__(self, run: _Optional[_Union[ScheduleRun, _Mapping]] = ...) -> None: ...

class BackfillScheduleRequest(_message.Message):
    __slots__ = ("id", "start", "end")
    ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    id: str
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BackfillScheduleResponse(_message.Message):
    __slots__ = ("runs", "existing")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[ScheduleRun]
    existing: int
    def __init__(self, runs: _Optional[_Iterable[_Union[ScheduleRun, _Mapping]]] = ..., existing: _Optional[int] = ...) -> None: ...
