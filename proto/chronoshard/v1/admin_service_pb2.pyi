import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Node(_message.Message):
    __slots__ = ("node_id", "address", "metrics_address", "started_at", "shards", "draining", "clock_skewed")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SKEWED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    metrics_address: str
    started_at: _timestamp_pb2.Timestamp
    shards: _containers.RepeatedScalarFieldContainer[int]
    draining: bool
    clock_skewed: bool
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., metrics_address: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., shards: _Optional[_Iterable[int]] = ..., draining: _Optional[bool] = ..., clock_skewed: _Optional[bool] = ...) -> None: ...

class ShardOwner(_message.Message):
    __slots__ = ("shard", "node_id", "epoch")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    shard: int
    node_id: str
    epoch: int
    def __init__(self, shard: _Optional[int] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class GetTopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTopologyResponse(_message.Message):
    __slots__ = ("nodes", "shards", "shard_count", "node_id", "restricted")
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESTRICTED_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    shards: _containers.RepeatedCompositeFieldContainer[ShardOwner]
    shard_count: int
    node_id: str
    restricted: bool
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ShardOwner, _Mapping]]] = ..., shard_count: _Optional[int] = ..., node_id: _Optional[str] = ..., restricted: _Optional[bool] = ...) -> None: ...

class ListShardsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardState(_message.Message):
    __slots__ = ("owner", "target_node_id")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    owner: ShardOwner
    target_node_id: str
    def __init__(self, owner: _Optional[_Union[ShardOwner, _Mapping]] = ..., target_node_id: _Optional[str] = ...) -> None: ...

class ListShardsResponse(_message.Message):
    __slots__ = ("shards", "shard_count")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardState]
    shard_count: int
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardState, _Mapping]]] = ..., shard_count: _Optional[int] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class UndrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class UndrainNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class ListWorkerSessionsRequest(_message.Message):
    __slots__ = ("worker_id", "node_id", "page_size", "page_token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    node_id: str
    page_size: int
    page_token: str
    def __init__(self, worker_id: _Optional[str] = ..., node_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class WorkerSession(_message.Message):
    __slots__ = ("worker_id", "node_id", "session_id", "tenant_id", "tenant_name", "queues", "task_types", "slots", "credits", "running", "draining", "connected_at", "reported_at")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    node_id: str
    session_id: str
    tenant_id: str
    tenant_name: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    task_types: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    credits: int
    running: int
    draining: bool
    connected_at: _timestamp_pb2.Timestamp
    reported_at: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., node_id: _Optional[str] = ..., session_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., tenant_name: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., task_types: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., credits: _Optional[int] = ..., running: _Optional[int] = ..., draining: _Optional[bool] = ..., connected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListWorkerSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token", "node_id", "restricted")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESTRICTED_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[WorkerSession]
    next_page_token: str
    node_id: str
    restricted: bool
    def __init__(self, sessions: _Optional[_Iterable[_Union[WorkerSession, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., node_id: _Optional[str] = ..., restricted: _Optional[bool] = ...) -> None: ...
