"""What the hot path passes around: timers, intents, settlements and their outcomes.

Plain values, no I/O. The dispatcher, the gateway, the shard manager and the reconciler
build and read them; :mod:`chronoshard.scheduler.store.runs` turns them into statements.
A settlement (:class:`Settle` and its kinds) names its row by ``(scheduled_at, id)`` and
carries the attempt's fencing token; :class:`SettleOutcome` is what became of one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from chronoshard.scheduler.core.models import Priority, Task, TaskRef
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.states import AttemptState, TaskStatus


@dataclass(frozen=True, slots=True)
class TimerTask:
    """What the wheel and the ready queues hold for a PRELOADED task: enough to choose a
    worker, not the payload (fetched by the intent write)."""

    id: uuid.UUID
    scheduled_at: datetime
    shard: int
    tenant_id: uuid.UUID
    priority: Priority
    queue: str
    type: str
    due_at: datetime
    strict_timing: bool

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.scheduled_at, self.id)


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
class FailureResult:
    outcomes: dict[uuid.UUID, SettleOutcome]
    retrying: list[tuple[int, datetime]]
    """(shard, due_at) of tasks that went to RETRYING: the preloader must see them."""


@dataclass(frozen=True, slots=True)
class IntentResult:
    dispatched: list[Task]
    lost_shards: frozenset[int]
    unwritten: frozenset[uuid.UUID] = frozenset()
    """Read back after an unknown commit: intents that did not commit (still PRELOADED),
    to be chosen again. Every other intent not in ``dispatched`` moved on."""


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
