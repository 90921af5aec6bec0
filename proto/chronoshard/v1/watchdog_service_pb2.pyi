import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_CRITICAL: _ClassVar[Severity]
    SEVERITY_ERROR: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_INFO: _ClassVar[Severity]
SEVERITY_UNSPECIFIED: Severity
SEVERITY_CRITICAL: Severity
SEVERITY_ERROR: Severity
SEVERITY_WARNING: Severity
SEVERITY_INFO: Severity

class Expectation(_message.Message):
    __slots__ = ("job_id", "interval", "tolerance", "severity", "enabled", "description", "created_at", "updated_at", "from_config")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FROM_CONFIG_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    interval: _duration_pb2.Duration
    tolerance: _duration_pb2.Duration
    severity: Severity
    enabled: bool
    description: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    from_config: bool
    def __init__(self, job_id: _Optional[str] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tolerance: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., severity: _Optional[_Union[Severity, str]] = ..., enabled: _Optional[bool] = ..., description: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., from_config: _Optional[bool] = ...) -> None: ...

class CreateExpectationRequest(_message.Message):
    __slots__ = ("job_id", "interval", "tolerance", "severity", "enabled", "description")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    interval: _duration_pb2.Duration
    tolerance: _duration_pb2.Duration
    severity: Severity
    enabled: bool
    description: str
    def __init__(self, job_id: _Optional[str] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tolerance: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., severity: _Optional[_Union[Severity, str]] = ..., enabled: _Optional[bool] = ..., description: _Optional[str] = ...) -> None: ...

class CreateExpectationResponse(_message.Message):
    __slots__ = ("expectation", "created")
    EXPECTATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    expectation: Expectation
    created: bool
    def __init__(self, expectation: _Optional[_Union[Expectation, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListExpectationsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListExpectationsResponse(_message.Message):
    __slots__ = ("expectations", "next_page_token")
    EXPECTATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    expectations: _containers.RepeatedCompositeFieldContainer[Expectation]
    next_page_token: str
    def __init__(self, expectations: _Optional[_Iterable[_Union[Expectation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteExpectationRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteExpectationResponse(_message.Message):
    __slots__ = ("expectation",)
    EXPECTATION_FIELD_NUMBER: _ClassVar[int]
    expectation: Expectation
    def __init__(self, expectation: _Optional[_Union[Expectation, _Mapping]] = ...) -> None: ...

class Incident(_message.Message):
    __slots__ = ("id", "kind", "job_id", "severity", "summary", "opened_at", "resolved_at", "tenant_id", "tenant_name")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_NAME_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: str
    job_id: str
    severity: Severity
    summary: str
    opened_at: _timestamp_pb2.Timestamp
    resolved_at: _timestamp_pb2.Timestamp
    tenant_id: str
    tenant_name: str
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[str] = ..., job_id: _Optional[str] = ..., severity: _Optional[_Union[Severity, str]] = ..., summary: _Optional[str] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resolved_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tenant_id: _Optional[str] = ..., tenant_name: _Optional[str] = ...) -> None: ...

class ListIncidentsRequest(_message.Message):
    __slots__ = ("include_resolved", "page_size", "all_tenants")
    INCLUDE_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    include_resolved: bool
    page_size: int
    all_tenants: bool
    def __init__(self, include_resolved: _Optional[bool] = ..., page_size: _Optional[int] = ..., all_tenants: _Optional[bool] = ...) -> None: ...

class ListIncidentsResponse(_message.Message):
    __slots__ = ("incidents",)
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[Incident]
    def __init__(self, incidents: _Optional[_Iterable[_Union[Incident, _Mapping]]] = ...) -> None: ...
