"""The worker protocol's messages as frozen dataclasses: what the SDK's logic works with.

Only ``_convert.py`` and ``_transport.py`` know the generated protobuf classes (STYLE #7);
they translate each ``WorkerMessage``/``SchedulerMessage`` to and from the types here at
the edge. Durations are floats in seconds (``*_s``), instants timezone-aware datetimes,
JSON documents and checkpoints stay ``bytes`` until the execution layer decodes them.
``docs/worker-protocol.md`` says what each side does with every message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class TaskRef:
    """Names one task row: the id (canonical UUID text) and its partition key."""

    id: str
    scheduled_at: datetime


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Machine-readable error detail (``common.proto`` ErrorInfo)."""

    code: str
    reason: str = ""
    message: str = ""
    field: str = ""
    retryable: bool = False


class SettlementKind(enum.Enum):
    ACK = "ACK"
    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    RELEASE = "RELEASE"


class ReleaseReason(enum.Enum):
    DRAINING = "DRAINING"
    CANNOT_RUN = "CANNOT_RUN"


RunKey = tuple[str, int]
"""(task id, fencing token): one attempt of one task, the unit the worker tracks."""

SettlementKey = tuple[str, int, SettlementKind]
"""What a Receipt names: (task id, fencing token, kind)."""


# ---- worker -> scheduler -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    worker_id: str
    queues: tuple[str, ...]
    task_types: tuple[str, ...]
    slots: int
    sdk_version: str
    # This SDK reads SchedulerBatch.
    accepts_batches: bool = True


@dataclass(frozen=True, slots=True)
class CreditGrant:
    credits: int


@dataclass(frozen=True, slots=True)
class CreditRecall:
    """Ask a node to give back unused credits (answered by :class:`CreditReturn`)."""

    credits: int


@dataclass(frozen=True, slots=True)
class RunningTask:
    task: TaskRef
    fencing_token: int
    # A checkpoint to store with this heartbeat; None: keep the stored one.
    checkpoint: bytes | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    running: tuple[RunningTask, ...]
    # Numbered per stream by the session; the reply echoes it (0: not numbered).
    seq: int = 0


@dataclass(frozen=True, slots=True)
class DrainStarted:
    grace_s: float


@dataclass(frozen=True, slots=True)
class Ack:
    kind: ClassVar[SettlementKind] = SettlementKind.ACK
    task: TaskRef
    fencing_token: int

    @property
    def key(self) -> SettlementKey:
        return (self.task.id, self.fencing_token, self.kind)


@dataclass(frozen=True, slots=True)
class Complete:
    kind: ClassVar[SettlementKind] = SettlementKind.COMPLETE
    task: TaskRef
    fencing_token: int
    result_json: bytes

    @property
    def key(self) -> SettlementKey:
        return (self.task.id, self.fencing_token, self.kind)


@dataclass(frozen=True, slots=True)
class Fail:
    kind: ClassVar[SettlementKind] = SettlementKind.FAIL
    task: TaskRef
    fencing_token: int
    error_message: str
    error_type: str
    retryable: bool
    timed_out: bool = False
    cancelled: bool = False

    @property
    def key(self) -> SettlementKey:
        return (self.task.id, self.fencing_token, self.kind)


@dataclass(frozen=True, slots=True)
class Release:
    kind: ClassVar[SettlementKind] = SettlementKind.RELEASE
    task: TaskRef
    fencing_token: int
    reason: ReleaseReason
    # Stored and handed to the next attempt; None: keep the stored one.
    checkpoint: bytes | None = None
    detail: str = ""

    @property
    def key(self) -> SettlementKey:
        return (self.task.id, self.fencing_token, self.kind)


Settlement = Ack | Complete | Fail | Release
Outbound = Hello | CreditGrant | CreditRecall | Heartbeat | DrainStarted | Settlement


# ---- scheduler -> worker -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Welcome:
    node_id: str
    session_id: str
    # None when the node left it unset: the SDK's default applies.
    heartbeat_interval_s: float | None
    lease_duration_s: float | None
    # The node reads WorkerBatch: queued messages may go out as one.
    accepts_batches: bool = False
    # Worker self-fencing: stop an attempt this long before its lease runs out. None:
    # the node did not say (the SDK's default applies).
    lease_margin_s: float | None = None


@dataclass(frozen=True, slots=True)
class AssignedParent:
    """One workflow parent as the Assignment carries it (still undecoded: build_context
    turns it into the public ``ParentResult``, refusing a malformed one)."""

    ref: str
    task_id: str
    # The TaskStatus name without its prefix ("COMPLETED", "DEAD_LETTER", ...).
    status: str
    result_json: bytes = b""
    omitted: bool = False


@dataclass(frozen=True, slots=True)
class Assignment:
    task: TaskRef
    type: str
    payload_json: bytes
    fencing_token: int
    attempt: int
    max_retries: int
    due_at: datetime
    lease_expires_at: datetime | None
    timeout_s: float | None
    checkpoint: bytes
    trace_context: Mapping[str, str] = field(default_factory=dict)
    queue: str = ""
    priority: str = "STANDARD"
    idempotent: bool = False
    # The node's cluster clock when it sent this (None from an older node).
    sent_at: datetime | None = None
    # Set when a schedule created the task: its occurrence's logical date, and which.
    logical_date: datetime | None = None
    schedule_id: str | None = None
    # Set when the task belongs to a workflow: which, its ref there, and what its
    # parents returned (in the workflow's order; empty for a root).
    workflow_id: str | None = None
    workflow_ref: str | None = None
    parent_results: tuple[AssignedParent, ...] = ()
    # The task's tenant (UUID text; empty from an older node): for the run's trace.
    tenant_id: str = ""

    @property
    def run_key(self) -> RunKey:
        return (self.task.id, self.fencing_token)


@dataclass(frozen=True, slots=True)
class RevokedTask:
    task: TaskRef
    fencing_token: int
    reason: str


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    revoked: tuple[RevokedTask, ...]
    # The Heartbeat.seq it answers; 0 from a node that does not echo it.
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Cancel:
    task: TaskRef
    fencing_token: int
    reason: str


@dataclass(frozen=True, slots=True)
class Drain:
    reason: str
    shutting_down: bool = False  # the node is stopping: do not reconnect


@dataclass(frozen=True, slots=True)
class Resume:
    """The node was undrained: it takes work (and credits) again."""


@dataclass(frozen=True, slots=True)
class TopologyChanged:
    """The node saw the cluster's membership change: ask GetTopology now."""


@dataclass(frozen=True, slots=True)
class CreditReturn:
    """The node dropped ``credits`` unused credits, as a CreditRecall asked."""

    credits: int


@dataclass(frozen=True, slots=True)
class Backlog:
    ready: int
    ready_by_queue: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Receipt:
    task: TaskRef
    fencing_token: int
    kind: SettlementKind
    # None: committed. Set: refused.
    error: ErrorInfo | None

    @property
    def key(self) -> SettlementKey:
        return (self.task.id, self.fencing_token, self.kind)


@dataclass(frozen=True, slots=True)
class Reject:
    error: ErrorInfo


Inbound = (
    Welcome
    | Assignment
    | HeartbeatReply
    | Cancel
    | Drain
    | Resume
    | TopologyChanged
    | Backlog
    | CreditReturn
    | Receipt
    | Reject
)


# ---- AdminService --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A scheduler node the worker should hold a stream to."""

    node_id: str
    address: str
    draining: bool = False
