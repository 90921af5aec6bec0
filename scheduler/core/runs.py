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

# A timer packed into one int (TimerTask.pack): bit fields from the lowest,
#   the number of its traits in _TRAITS (or _UNNUMBERED)         17 bits
#   scheduled_at, epoch microseconds + _INSTANT_BIAS              59 bits
#   due_at - scheduled_at, microseconds + _DELAY_BIAS             60 bits
#   the shard                                                     the rest
# Any datetime is within 2**58 microseconds of the epoch (years 1 to 9999), so the
# biased fields are never negative and never overflow, and two of them differ by less
# than 2**59. The shard, highest, may be any int. A shard below 2**15 (the most a
# cluster has, config.py) makes 151 bits: six 30-bit digits, a 48-byte int.
_NUMBER_BITS = 17
_UNNUMBERED = (1 << _NUMBER_BITS) - 1
_INSTANT_SHIFT = _NUMBER_BITS
_INSTANT_MASK = (1 << 59) - 1
_INSTANT_BIAS = 1 << 58
_DELAY_SHIFT = _INSTANT_SHIFT + 59
_DELAY_MASK = (1 << 60) - 1
_DELAY_BIAS = 1 << 59
_SHARD_SHIFT = _DELAY_SHIFT + 60


def epoch_us(instant: datetime) -> int:
    """``instant`` (aware) in integer microseconds since the Unix epoch, exactly."""
    return (instant - UNIX_EPOCH) // _MICROSECOND


class TimerTask:
    """What the wheel and the ready queues hold for a PRELOADED task: enough to choose a
    worker, not the payload (fetched by the intent write). Immutable.

    A node holds a million pending tasks an hour ahead (issue 14, target 7), so a
    timer is stored in two ints: its id as its 128-bit int (``id_int``, the wheel's
    key) and every other per-task field packed into one int (:meth:`pack`: the shard,
    the instants as epoch microseconds, and the number of its traits). The fields a
    million timers repeat (tenant, priority, queue, type, strict timing) are one tuple
    shared by every timer with the same values (:data:`_TRAITS`), which the packed int
    holds by its number. The dispatcher's wheel holds only the two ints, 96 bytes, and
    builds the TimerTask again when the timer fires (:meth:`unpack`); the slotted
    object with its own ints cost 160. Fields are built when read; instants read back
    are UTC datetimes, equal to those given.
    """

    # Every field is read through a property, so none can be assigned.
    __slots__ = ("_id", "_packed", "_traits")

    _id: int
    _packed: int
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
        scheduled_us = epoch_us(scheduled_at)
        delay_us = (due_at - scheduled_at) // _MICROSECOND
        traits = (tenant_id, priority, queue, type, strict_timing)
        number = _TRAITS.number(traits)
        if number is None:  # past the table's bound: this timer keeps its own tuple
            number = _UNNUMBERED
        else:
            traits = _TRAITS.value(number)
        self._id = id.int
        self._packed = (
            (((shard << 60) | (delay_us + _DELAY_BIAS)) << 59) | (scheduled_us + _INSTANT_BIAS)
        ) << _NUMBER_BITS | number
        self._traits = traits

    def pack(self) -> PackedTimer:
        """What a wheel holds for this timer beside its ``id_int``: the int packing its
        fields, which :meth:`unpack` turns back into an equal TimerTask; or the
        TimerTask itself when its traits have no number (more distinct ones than
        :data:`_TRAITS` keeps), as the int could not name them."""
        packed = self._packed
        return self if packed & _UNNUMBERED == _UNNUMBERED else packed

    @staticmethod
    def unpack(id_int: int, packed: PackedTimer) -> TimerTask:
        """The TimerTask of ``id_int`` that :meth:`pack` gave ``packed`` for."""
        if type(packed) is TimerTask:
            return packed
        assert isinstance(packed, int)
        timer: TimerTask = _new_object(TimerTask)
        timer._id = id_int
        timer._packed = packed
        timer._traits = _TRAITS.value(packed & _UNNUMBERED)
        return timer

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
        return self._packed >> _SHARD_SHIFT

    @property
    def scheduled_at(self) -> datetime:
        return UNIX_EPOCH + timedelta(0, 0, self._scheduled_us())

    @property
    def due_at(self) -> datetime:
        return UNIX_EPOCH + timedelta(0, 0, self.due_at_us)

    @property
    def due_at_us(self) -> int:
        """``due_at`` in integer microseconds since the Unix epoch, without building a
        datetime: ``(due_at_us - epoch_us(t)) / 1_000_000`` is
        ``(due_at - t).total_seconds()`` and ``due_at_us / 1_000_000`` is
        ``due_at.timestamp()``, to the bit (each divides the exact int once, correctly
        rounded; dividing by the float 1e6 rounds the int first past 2**53)."""
        delay_us = ((self._packed >> _DELAY_SHIFT) & _DELAY_MASK) - _DELAY_BIAS
        return self._scheduled_us() + delay_us

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

    def _scheduled_us(self) -> int:
        return ((self._packed >> _INSTANT_SHIFT) & _INSTANT_MASK) - _INSTANT_BIAS

    def _fields(self) -> tuple[object, ...]:
        # Not the traits' number: a timer built past the table's bound has none.
        return (self._id, self._packed >> _NUMBER_BITS, self._traits)

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


PackedTimer = int | TimerTask
"""What :meth:`TimerTask.pack` gives a wheel to hold: an int, or the TimerTask itself."""


def packed_shard(packed: PackedTimer) -> int:
    """The shard of a packed timer, without unpacking it (a shard release looks at every
    timer held)."""
    if type(packed) is TimerTask:
        return packed.shard
    assert isinstance(packed, int)
    return packed >> _SHARD_SHIFT


T = TypeVar("T")


class Interner(Generic[T]):
    """One shared object per distinct value, for the fields a million timers repeat.

    A node holding a million pending timers held a million copies of a few tenant ids,
    queue names and task types (each row read from PostgreSQL is new objects): ~100
    bytes for a UUID, ~55 for a short string, per timer and per field (issue 14, target
    7). :meth:`get` returns the first object seen equal to ``value``. Values are
    numbered 0, 1, ... in the order first seen (:meth:`number`, and :meth:`value` back),
    so an int can hold one by its number (:meth:`TimerTask.pack`). At most ``max_size``
    distinct values are kept, never dropped, so a number names its value for the life
    of the process; past that a value is returned as it is, without a number, so a
    field that is unique per row (by mistake or by design) costs a bounded table, not
    one that grows with the rows.
    """

    __slots__ = ("_max_size", "_numbers", "_values")

    def __init__(self, max_size: int) -> None:
        if max_size < 0:
            raise ValueError("max_size must not be negative")
        self._max_size = max_size
        self._numbers: dict[T, int] = {}
        self._values: list[T] = []

    def number(self, value: T) -> int | None:
        """The number of ``value`` (given it now if it is new and there is room), or
        None past the bound."""
        number = self._numbers.get(value)
        if number is None and len(self._values) < self._max_size:
            number = len(self._values)
            self._numbers[value] = number
            self._values.append(value)
        return number

    def value(self, number: int) -> T:
        """The shared value numbered ``number``."""
        return self._values[number]

    def get(self, value: T) -> T:
        number = self.number(value)
        return value if number is None else self._values[number]

    def __len__(self) -> int:
        return len(self._values)


_TRAITS: Interner[tuple[uuid.UUID, Priority, str, str, bool]] = Interner(100_000)
"""The (tenant, priority, queue, type, strict timing) of timers, shared and numbered (see
:class:`TimerTask`). A node's timers repeat few combinations; past 100,000 a timer keeps
its own tuple and is held by a wheel as itself, not as an int (~120 bytes more), so the
table stays bounded whatever the rows hold."""
assert _TRAITS._max_size < _UNNUMBERED, "a traits number must fit its bit field"


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
