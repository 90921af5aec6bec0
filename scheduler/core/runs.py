"""What the hot path passes around: timers, intents, settlements and their outcomes.

Plain values, no I/O. The dispatcher, the gateway, the shard manager and the reconciler
build and read them; :mod:`chronoshard.scheduler.store.runs` turns them into statements.
A settlement (:class:`Settle` and its kinds) names its row by ``(scheduled_at, id)`` and
carries the attempt's fencing token; :class:`SettleOutcome` is what became of one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, TypeVar

from chronoshard.scheduler.core.models import Priority, Task, TaskRef
from chronoshard.scheduler.core.quotas import Admission
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.states import AttemptState, TaskStatus
from chronoshard.scheduler.core.workflows import Place
from chronoshard.wire import UNIX_EPOCH

_MICROSECOND = timedelta(microseconds=1)
# TimerTask.id builds its UUID without UUID.__init__ (its checks took ~0.7 us, the most
# of a read on the dispatch path): the two slots CPython's UUID has, set directly.
_new_object = object.__new__
_set_uuid_int = uuid.UUID.__dict__["int"].__set__
_set_uuid_safety = uuid.UUID.__dict__["is_safe"].__set__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown


class TimerTask:
    """What the wheel and the ready queues hold for a PRELOADED task: enough to choose a
    worker, not the payload (fetched by the intent write). Immutable.

    A node holds one per pending task, a million of them an hour ahead (issue 14, target
    7), so it is stored compactly and its fields are built when read: the id as its
    128-bit int (``id_int``, the wheel's key; 48 bytes, where a ``uuid.UUID`` with its int
    is ~104), the two instants as integer microseconds since the Unix epoch (32 bytes,
    one object when equal, where a datetime is 48), and the fields a million timers
    repeat (tenant, priority, queue, type, strict timing) as one tuple shared by every
    timer with the same values (:data:`_TRAITS`). 72 bytes for the object itself, 152
    with what it alone holds, where the slotted dataclass with its own UUID and
    datetime cost ~256. Instants read back are UTC datetimes, equal to those given.
    """

    # Every field is read through a property, so none can be assigned.
    __slots__ = ("_due_us", "_id", "_scheduled_us", "_shard", "_traits")

    _id: int
    _shard: int
    _scheduled_us: int
    _due_us: int
    _traits: tuple[uuid.UUID, Priority, str, str, bool]

    def __init__(
        self,
        id: uuid.UUID,
        scheduled_at: datetime,
        shard: int,
        tenant_id: uuid.UUID,
        priority: Priority,
        queue: str,
        type: str,
        due_at: datetime,
        strict_timing: bool,
    ) -> None:
        self._id = id.int
        self._shard = shard
        scheduled_us = (scheduled_at - UNIX_EPOCH) // _MICROSECOND
        due_us = (due_at - UNIX_EPOCH) // _MICROSECOND
        # Without jitter the two are equal: one object, not two.
        self._scheduled_us = scheduled_us
        self._due_us = scheduled_us if due_us == scheduled_us else due_us
        self._traits = _TRAITS.get((tenant_id, priority, queue, type, strict_timing))

    @property
    def id(self) -> uuid.UUID:
        task_id: uuid.UUID = _new_object(uuid.UUID)
        _set_uuid_int(task_id, self._id)
        _set_uuid_safety(task_id, _UNKNOWN_SAFETY)
        return task_id

    @property
    def id_int(self) -> int:
        """The id's 128-bit int: the wheel's key, stored, where ``id`` builds a UUID."""
        return self._id

    @property
    def shard(self) -> int:
        return self._shard

    @property
    def scheduled_at(self) -> datetime:
        return UNIX_EPOCH + timedelta(0, 0, self._scheduled_us)

    @property
    def due_at(self) -> datetime:
        return UNIX_EPOCH + timedelta(0, 0, self._due_us)

    @property
    def tenant_id(self) -> uuid.UUID:
        return self._traits[0]

    @property
    def priority(self) -> Priority:
        return self._traits[1]

    @property
    def queue(self) -> str:
        return self._traits[2]

    @property
    def type(self) -> str:
        return self._traits[3]

    @property
    def strict_timing(self) -> bool:
        return self._traits[4]

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.scheduled_at, self.id)

    def _fields(self) -> tuple[object, ...]:
        return (self._id, self._scheduled_us, self._shard, self._traits, self._due_us)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimerTask):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        # For sets and dicts in this process, as the frozen dataclass it replaced; never
        # a shard or a jitter (those are blake2b, core.sharding and core.jitter).
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"TimerTask(id={self.id!r}, scheduled_at={self.scheduled_at!r}, "
            f"shard={self.shard!r}, tenant_id={self.tenant_id!r}, "
            f"priority={self.priority!r}, queue={self.queue!r}, type={self.type!r}, "
            f"due_at={self.due_at!r}, strict_timing={self.strict_timing!r})"
        )


T = TypeVar("T")
_UNSEEN = object()


class Interner(Generic[T]):
    """One shared object per distinct value, for the fields a million timers repeat.

    A node holding a million pending timers held a million copies of a few tenant ids,
    queue names and task types (each row read from PostgreSQL is new objects): ~100
    bytes for a UUID, ~55 for a short string, per timer and per field (issue 14, target
    7). :meth:`get` returns the first object seen equal to ``value``. At most
    ``max_size`` distinct values are kept; past that a value is returned as it is, so a
    field that is unique per row (by mistake or by design) costs a bounded dict, not one
    that grows with the rows.
    """

    __slots__ = ("_max_size", "_seen")

    def __init__(self, max_size: int) -> None:
        if max_size < 0:
            raise ValueError("max_size must not be negative")
        self._max_size = max_size
        self._seen: dict[T, T] = {}

    def get(self, value: T) -> T:
        shared = self._seen.get(value, _UNSEEN)
        if shared is not _UNSEEN:
            return shared  # type: ignore[return-value]
        if len(self._seen) < self._max_size:
            self._seen[value] = value
        return value

    def __len__(self) -> int:
        return len(self._seen)


_TRAITS: Interner[tuple[uuid.UUID, Priority, str, str, bool]] = Interner(100_000)
"""The (tenant, priority, queue, type, strict timing) of timers, shared (see
:class:`TimerTask`). A node's timers repeat few combinations; past 100,000 a timer keeps
its own tuple (56 bytes more), so the cache stays bounded whatever the rows hold."""


@dataclass(frozen=True, slots=True)
class Intent:
    task: TimerTask
    worker_id: str


class SettleOutcome(StrEnum):
    """What became of one settlement."""

    OK = "OK"
    STALE_FENCING_TOKEN = "STALE_FENCING_TOKEN"
    TASK_CANCELLED = "TASK_CANCELLED"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"


@dataclass(frozen=True, slots=True)
class Settle:
    """A worker message about one attempt: the row and the token it holds."""

    ref: TaskRef
    token: int


@dataclass(frozen=True, slots=True)
class Completion(Settle):
    result_json: str | None


@dataclass(frozen=True, slots=True)
class Failure(Settle):
    error: str
    report: FailureReport


@dataclass(frozen=True, slots=True)
class Release(Settle):
    checkpoint: bytes | None
    attempt_state: AttemptState
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Beat(Settle):
    checkpoint: bytes | None


@dataclass(frozen=True, slots=True)
class LeaseUpdate:
    extended: frozenset[uuid.UUID]
    cancel_requested: Mapping[uuid.UUID, str]
    """Extended tasks whose cancel was requested, with the reason: the node tells the
    worker to stop them cooperatively."""


@dataclass(frozen=True, slots=True)
class SettleResult:
    """What a batch of completions or failures did."""

    outcomes: dict[uuid.UUID, SettleOutcome]
    due: list[tuple[int, datetime]]
    """(shard, due_at) of tasks that became due: failures that went to RETRYING, and
    workflow children their parents' outcomes released. Their shard's owner must hear."""


@dataclass(frozen=True, slots=True)
class IntentResult:
    dispatched: list[Task]
    lost_shards: frozenset[int]
    unwritten: frozenset[uuid.UUID] = frozenset()
    """Read back after an unknown commit: intents that did not commit (still PRELOADED),
    to be chosen again. Every other intent not in ``dispatched`` moved on."""
    places: Mapping[uuid.UUID, Place] = field(default_factory=dict)
    """The dispatched workflow tasks' refs and parents (their assignments carry them)."""
    quotas: Mapping[uuid.UUID, Admission] = field(default_factory=dict)
    """Per tenant, what the cluster-wide quota check admitted (empty without one, and
    for a read-back). Intents it refused are in ``unwritten``: still PRELOADED."""


def intent_committed(row: Mapping[str, Any], worker_id: str, epoch: int) -> bool | None:
    """Whether an intent whose commit outcome was unknown committed, from its row read back
    under the shard's fence: True (DISPATCHED to that worker under this epoch: send it),
    False (still PRELOADED: choose it again) or None (the task moved on: drop it).

    Sound because only the shard's owner writes intents, under its epoch, and the task was
    PRELOADED and in this node's hands when the intent was written: DISPATCHED under the
    same epoch can only be that intent.
    """
    status = TaskStatus(row["status"])
    if status is TaskStatus.PRELOADED:
        return False
    if (
        status is TaskStatus.DISPATCHED
        and row["worker_id"] == worker_id
        and row["attempt_epoch"] == epoch
    ):
        return True
    return None
