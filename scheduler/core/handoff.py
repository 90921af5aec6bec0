"""Planned shard handoff, the pure part: per-shard state of both sides and the decisions.

A move the cluster plans (a node joins, a node drains) is made in two phases, so nothing
due on the shard waits for the move (docs/architecture.md, "Shard handoff"):

1. **Warm-up.** The incoming node, the shard's target in the rendezvous map every node
   computes while another node still holds its claim, waits until every live worker has
   a session with it (:func:`workers_ready`), then reads the shard's rows due within
   ``handoff.horizon_s`` (PRELOADED by the old owner, SCHEDULED/RETRYING not preloaded
   yet), nearest due first, in bounded chunks (:func:`next_cursor`), *without changing
   them*, and says it is ready (``/{cluster}/handoff/{shard}`` = its node id, under its
   lease). :class:`IncomingHandoffs` holds what it read until it owns the shard.
2. **Switch.** The old owner keeps dispatching the shard until it sees its successor
   ready, or ``handoff.wait_s`` passed (a dead or slow successor cannot pin the shard):
   :class:`OutgoingHandoffs`. Then it stops the shard and deletes its claim; after a
   warm handoff its PRELOADED rows stay PRELOADED. The successor claims (a new epoch),
   puts what it read on its wheel and loads the remaining PRELOADED rows. Rows the old
   owner dispatched meanwhile are no longer PRELOADED, so the successor's epoch-guarded
   intent skips them; nothing is dispatched twice and nothing is left behind.

No I/O and no clock here: times are monotonic seconds passed in by the shard manager.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, NamedTuple, Protocol, TypeVar

Cursor = tuple[datetime, uuid.UUID]
"""``(due_at, id)`` of the last row read: the next chunk starts after it (keyset paging)."""


class Row(Protocol):
    @property
    def id(self) -> uuid.UUID: ...

    @property
    def due_at(self) -> datetime: ...


R = TypeVar("R", bound=Row)


def next_cursor(rows: Sequence[Row], limit: int) -> Cursor | None:
    """Where the next chunk starts, or None when this chunk was the last (short).

    Chunks are read in ``(due_at, id)`` order, so the last row of a full chunk is the
    cursor and a chunk shorter than ``limit`` means nothing is left.
    """
    if len(rows) < limit or not rows:
        return None
    last = rows[-1]
    return (last.due_at, last.id)


def workers_ready(expected: Collection[str], connected: Collection[str]) -> bool:
    """Whether every worker the cluster sees (``expected``) has a session here.

    A node that owns shards before the workers reach it has nowhere to send their tasks:
    a joining node is unknown to workers until they refresh their topology.
    """
    return set(expected) <= set(connected)


# ---- the old owner --------------------------------------------------------------------


@dataclass(slots=True)
class _Outgoing:
    successor: str | None
    since: float


class LetGo(NamedTuple):
    warm: list[int]
    """Shards whose successor is ready: stop them and delete the claim, rows untouched."""
    cold: list[int]
    """Shards that waited ``wait_s``, or have no successor at all: released as before,
    PRELOADED rows back to SCHEDULED for whoever claims next."""


class OutgoingHandoffs:
    """The owned shards whose target is another node, and when to let each go."""

    def __init__(self, wait_s: float) -> None:
        self._wait_s = wait_s
        self._shards: dict[int, _Outgoing] = {}

    def __len__(self) -> int:
        return len(self._shards)

    def __contains__(self, shard: object) -> bool:
        return shard in self._shards

    def successor(self, shard: int) -> str | None:
        entry = self._shards.get(shard)
        return None if entry is None else entry.successor

    def update(self, leaving: Mapping[int, str | None], now: float) -> None:
        """``leaving``: every owned shard whose target is not this node, with its target
        (None when no node may own it). The wait restarts when a shard's successor
        changes: the new one has to warm up from the start."""
        for shard in [s for s in self._shards if s not in leaving]:
            del self._shards[shard]  # the target came back to us, or we let it go
        for shard, successor in leaving.items():
            entry = self._shards.get(shard)
            if entry is None or entry.successor != successor:
                self._shards[shard] = _Outgoing(successor, now)

    def decide(self, ready: Mapping[int, str], now: float) -> LetGo:
        """Which shards to let go now, given the ready marks (shard -> node) seen in etcd.

        A shard goes warm only when the mark names its current successor (a mark left by
        an earlier target means nothing), cold once it has waited ``wait_s`` or at once
        when no node may own it (every other node is draining: nobody will warm up).
        Shards let go are forgotten: each is returned once.
        """
        warm = [
            shard
            for shard, entry in sorted(self._shards.items())
            if entry.successor is not None and ready.get(shard) == entry.successor
        ]
        cold = [
            shard
            for shard, entry in sorted(self._shards.items())
            if shard not in warm and (entry.successor is None or now - entry.since >= self._wait_s)
        ]
        for shard in (*warm, *cold):
            del self._shards[shard]
        return LetGo(warm, cold)

    def all_now(self) -> list[int]:
        """Every shard still waiting, forgotten (the node stops: no more waiting)."""
        shards = sorted(self._shards)
        self._shards.clear()
        return shards

    def next_deadline(self) -> float | None:
        """When the earliest wait runs out (the loop wakes up for it), None if none."""
        if not self._shards:
            return None
        return min(
            entry.since + (0.0 if entry.successor is None else self._wait_s)
            for entry in self._shards.values()
        )


# ---- the incoming owner ---------------------------------------------------------------


@dataclass(slots=True)
class Warmup(Generic[R]):
    """What the incoming node holds of one shard it does not own yet."""

    staged: dict[uuid.UUID, R] = field(default_factory=dict)
    """Rows read so far, by task id (a row read twice is kept once)."""
    cursor: Cursor | None = None
    loaded: bool = False
    """Every row due within the horizon has been read."""
    marked: bool = False
    """The ready mark is written in etcd."""


class IncomingHandoffs(Generic[R]):
    """Shards this node is the target of while another node still holds them."""

    def __init__(self) -> None:
        self._shards: dict[int, Warmup[R]] = {}

    def __len__(self) -> int:
        return len(self._shards)

    def __contains__(self, shard: object) -> bool:
        return shard in self._shards

    def update(self, held_elsewhere: Iterable[int]) -> list[int]:
        """Track exactly ``held_elsewhere``; returns the shards dropped whose ready mark
        was written (it must be deleted: the shard is no longer coming here)."""
        wanted = set(held_elsewhere)
        dropped = [s for s in sorted(self._shards) if s not in wanted]
        marked = [s for s in dropped if self._shards[s].marked]
        for shard in dropped:
            del self._shards[shard]
        for shard in wanted:
            self._shards.setdefault(shard, Warmup[R]())
        return marked

    def waiting(self) -> list[int]:
        """Every shard tracked: held elsewhere, coming here."""
        return sorted(self._shards)

    def staged_count(self, shard: int) -> int:
        warmup = self._shards.get(shard)
        return 0 if warmup is None else len(warmup.staged)

    def to_load(self) -> list[int]:
        """Shards still being read, in shard order."""
        return sorted(s for s, w in self._shards.items() if not w.loaded)

    def to_mark(self) -> list[int]:
        """Shards read up to the horizon whose ready mark is not written yet."""
        return sorted(s for s, w in self._shards.items() if w.loaded and not w.marked)

    def cursor(self, shard: int) -> Cursor | None:
        warmup = self._shards.get(shard)
        return None if warmup is None else warmup.cursor

    def stage(self, shard: int, rows: Sequence[R], limit: int) -> None:
        """One chunk of ``shard`` read (``limit`` asked): keep it, move the cursor on.
        Ignored when the shard is no longer tracked (claimed or dropped meanwhile)."""
        warmup = self._shards.get(shard)
        if warmup is None:
            return
        for row in rows:
            warmup.staged[row.id] = row
        warmup.cursor = next_cursor(rows, limit) or warmup.cursor
        warmup.loaded = len(rows) < limit

    def marked(self, shard: int) -> None:
        warmup = self._shards.get(shard)
        if warmup is not None:
            warmup.marked = True

    def take(self, shard: int) -> dict[uuid.UUID, R]:
        """The shard was claimed: what was read for it (and stop tracking it)."""
        warmup = self._shards.pop(shard, None)
        return {} if warmup is None else warmup.staged

    def clear(self) -> list[int]:
        """Forget everything (lease lost, node stopping); the shards that were marked."""
        return self.update(())
