import datetime

from chronoshard.v1 import common_pb2 as _common_pb2
from chronoshard.v1 import task_service_pb2 as _task_service_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TriggerRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIGGER_RULE_UNSPECIFIED: _ClassVar[TriggerRule]
    TRIGGER_RULE_ALL_SUCCESS: _ClassVar[TriggerRule]
    TRIGGER_RULE_ALL_DONE: _ClassVar[TriggerRule]

class WorkflowState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKFLOW_STATE_UNSPECIFIED: _ClassVar[WorkflowState]
    WORKFLOW_STATE_RUNNING: _ClassVar[WorkflowState]
    WORKFLOW_STATE_SUCCEEDED: _ClassVar[WorkflowState]
    WORKFLOW_STATE_FAILED: _ClassVar[WorkflowState]
    WORKFLOW_STATE_CANCELLED: _ClassVar[WorkflowState]
TRIGGER_RULE_UNSPECIFIED: TriggerRule
TRIGGER_RULE_ALL_SUCCESS: TriggerRule
TRIGGER_RULE_ALL_DONE: TriggerRule
WORKFLOW_STATE_UNSPECIFIED: WorkflowState
WORKFLOW_STATE_RUNNING: WorkflowState
WORKFLOW_STATE_SUCCEEDED: WorkflowState
WORKFLOW_STATE_FAILED: WorkflowState
WORKFLOW_STATE_CANCELLED: WorkflowState

class WorkflowTask(_message.Message):
    __slots__ = ("ref", "task", "trigger_rule")
    REF_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_RULE_FIELD_NUMBER: _ClassVar[int]
    ref: str
    task: _task_service_pb2.SubmitTaskRequest
    trigger_rule: TriggerRule
    def __init__(self, ref: _Optional[str] = ..., task: _Optional[_Union[_task_service_pb2.SubmitTaskRequest, _Mapping]] = ..., trigger_rule: _Optional[_Union[TriggerRule, str]] = ...) -> None: ...

class WorkflowEdge(_message.Message):
    __slots__ = ("parent", "child")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    CHILD_FIELD_NUMBER: _ClassVar[int]
    parent: str
    child: str
    def __init__(self, parent: _Optional[str] = ..., child: _Optional[str] = ...) -> None: ...

class CreateWorkflowRequest(_message.Message):
    __slots__ = ("name", "tasks", "edges", "scheduled_at", "delay", "idempotency_key", "job_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    tasks: _containers.RepeatedCompositeFieldContainer[WorkflowTask]
    edges: _containers.RepeatedCompositeFieldContainer[WorkflowEdge]
    scheduled_at: _timestamp_pb2.Timestamp
    delay: _duration_pb2.Duration
    idempotency_key: str
    job_id: str
    def __init__(self, name: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[WorkflowTask, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[WorkflowEdge, _Mapping]]] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class Workflow(_message.Message):
    __slots__ = ("id", "tenant_id", "name", "state", "scheduled_at", "created_at", "finished_at", "task_count", "edge_count", "idempotency_key", "job_id", "schedule_id", "logical_date")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    EDGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_DATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant_id: str
    name: str
    state: WorkflowState
    scheduled_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    task_count: int
    edge_count: int
    idempotency_key: str
    job_id: str
    schedule_id: str
    logical_date: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[WorkflowState, str]] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., task_count: _Optional[int] = ..., edge_count: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., job_id: _Optional[str] = ..., schedule_id: _Optional[str] = ..., logical_date: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateWorkflowResponse(_message.Message):
    __slots__ = ("workflow", "task_ids", "created")
    class TaskIdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    workflow: Workflow
    task_ids: _containers.ScalarMap[str, str]
    created: bool
    def __init__(self, workflow: _Optional[_Union[Workflow, _Mapping]] = ..., task_ids: _Optional[_Mapping[str, str]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetWorkflowRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WorkflowTaskState(_message.Message):
    __slots__ = ("ref", "task", "trigger_rule", "upstream_cause")
    REF_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_RULE_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_CAUSE_FIELD_NUMBER: _ClassVar[int]
    ref: str
    task: _common_pb2.Task
    trigger_rule: TriggerRule
    upstream_cause: str
    def __init__(self, ref: _Optional[str] = ..., task: _Optional[_Union[_common_pb2.Task, _Mapping]] = ..., trigger_rule: _Optional[_Union[TriggerRule, str]] = ..., upstream_cause: _Optional[str] = ...) -> None: ...

class GetWorkflowResponse(_message.Message):
    __slots__ = ("workflow", "tasks", "edges")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    workflow: Workflow
    tasks: _containers.RepeatedCompositeFieldContainer[WorkflowTaskState]
    edges: _containers.RepeatedCompositeFieldContainer[WorkflowEdge]
    def __init__(self, workflow: _Optional[_Union[Workflow, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[WorkflowTaskState, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[WorkflowEdge, _Mapping]]] = ...) -> None: ...

class ListWorkflowsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: WorkflowState
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[WorkflowState, str]] = ...) -> None: ...

class ListWorkflowsResponse(_message.Message):
    __slots__ = ("workflows", "next_page_token")
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[Workflow]
    next_page_token: str
    def __init__(self, workflows: _Optional[_Iterable[_Union[Workflow, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelWorkflowRequest(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelWorkflowResponse(_message.Message):
    __slots__ = ("workflow", "cancelled", "stopping")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    workflow: Workflow
    cancelled: int
    stopping: int
    def __init__(self, workflow: _Optional[_Union[Workflow, _Mapping]] = ..., cancelled: _Optional[int] = ..., stopping: _Optional[int] = ...) -> None: ...

class RetryWorkflowRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RetryWorkflowResponse(_message.Message):
    __slots__ = ("workflow", "reopened")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    REOPENED_FIELD_NUMBER: _ClassVar[int]
    workflow: Workflow
    reopened: int
    def __init__(self, workflow: _Optional[_Union[Workflow, _Mapping]] = ..., reopened: _Optional[int] = ...) -> None: ...
