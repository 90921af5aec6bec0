"""Hierarchical timing wheel: O(1) insert and cancel for millions of pending timers.

Time is cut into integer ticks of ``tick_s`` seconds counted from ``start`` (tick of a
time ``x`` = ``floor((x - start) / tick_s)``). Level ``L`` has ``slots`` buckets, each
``slots**L`` ticks wide (Varghese & Lauck's hierarchical scheme, with levels created on
demand as in Kafka's purgatory, so a timer a year away costs no preallocation). Writing
ticks in base ``slots``, a timer due at tick ``t`` sits at the level of the highest digit
in which ``t`` differs from the current tick, in the slot given by that digit of ``t``:
every level therefore holds only buckets ahead of the current tick, and the lowest
non-empty level always holds the earliest bucket. Advancing jumps straight to that bucket
(a bitmap per level finds it in a few integer operations), so a jump over millions of
empty ticks costs nothing; a bucket reached at level ``L > 0`` is cascaded, its timers
re-placed at lower levels. Timers of the current tick live in a small heap, so
``advance(now)`` returns exactly the timers with ``deadline <= now`` - never one early,
never one a tick late - in deadline order, ties in insertion order. Cancelling only
forgets the key: the dead entry is skipped when its bucket is reached, and a sweep runs
once dead entries outnumber live ones, which keeps cancel O(1) amortised and garbage
bounded. The wheel never reads a clock: every time is a float on the monotonic clock,
passed in by the driver, which sleeps until :meth:`TimingWheel.next_deadline`.

Memory is what a node holding a million timers pays for (issue 14, target 7), so a
pending timer is no object of its own: a bucket is three parallel lists (deadlines,
keys, items) and the key index maps each key to its live timer's deadline, a float the
wheel made for that timer alone, so identity tells the live entry from dead ones of the
same key. That is a dict slot, one float and three list slots per timer (~95 bytes at
a million), where a tuple per timer with its sequence number cost ~190. No sequence
number is needed: a bucket's lists are in insertion order (a bucket only receives
timers added, or cascaded in order from a bucket above, after every timer already in
it), so a stable sort by deadline keeps ties in insertion order. Only the current
tick's heap numbers its entries, in the order they entered it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from operator import itemgetter
from typing import ClassVar, Generic, NamedTuple, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_TICK_S = 0.01
DEFAULT_SLOTS = 512
# Dead (cancelled or replaced) entries are swept once they outnumber live ones and this
# floor: the sweep costs O(live + dead), so it is O(1) amortised per cancel, and the
# floor keeps a small wheel from sweeping on every other cancel.
_SWEEP_FLOOR = 1024
_new_tuple = tuple.__new__
_by_deadline = itemgetter(0)


class Entry(NamedTuple, Generic[K, V]):
    """A fired timer, as :meth:`TimingWheel.advance` returns it (built when it fires: a
    pending timer is no object of its own, see the module docstring)."""

    deadline: float
    key: K
    item: V


class _Bucket(Generic[K, V]):
    """The timers of one bucket as parallel lists, in insertion order."""

    __slots__ = ("deadlines", "items", "keys")

    def __init__(self) -> None:
        self.deadlines: list[float] = []
        self.keys: list[K] = []
        self.items: list[V] = []

    def __len__(self) -> int:
        return len(self.keys)


# A timer of the current tick: (deadline, order of entry into the heap, key, item). The
# sequence number is unique, so heap order is (deadline, insertion order) and keys and
# items are never compared.
_NearEntry = tuple[float, int, K, V]


class TimingWheel(Generic[K, V]):
    """Timers keyed by ``K`` carrying an item ``V``, fired by :meth:`advance`.

    A key is unique: adding a key that is pending replaces its timer (deadline and item),
    which is what a dispatcher wants when a task is rescheduled. Not thread-safe: one
    driver owns the wheel.
    """

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset({"timers", "levels", "garbage"})

    __slots__ = (
        "_added",
        "_bits",
        "_cancelled",
        "_cur",
        "_expired",
        "_garbage",
        "_hint",
        "_index",
        "_levels",
        "_mask",
        "_near",
        "_occupied",
        "_replaced",
        "_seq",
        "_slots",
        "_start",
        "_tick_s",
    )

    def __init__(
        self, start: float, tick_s: float = DEFAULT_TICK_S, slots: int = DEFAULT_SLOTS
    ) -> None:
        if not math.isfinite(start):
            raise ValueError(f"start must be a finite time, got {start!r}")
        if not (math.isfinite(tick_s) and tick_s > 0):
            raise ValueError(f"tick_s must be a positive number of seconds, got {tick_s!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 2:
            raise ValueError(f"slots must be a power of two >= 2, got {slots!r}")
        if slots & (slots - 1):
            raise ValueError(f"slots must be a power of two >= 2, got {slots!r}")
        self._start = float(start)
        self._tick_s = float(tick_s)
        self._slots = slots
        self._bits = slots.bit_length() - 1  # one base-`slots` digit of a tick number
        self._mask = slots - 1
        # The current tick. Timers due at or before it are in _near; every bucket holds
        # timers due strictly after it. It only moves forward (see advance).
        self._cur = 0
        self._near: list[_NearEntry[K, V]] = []  # a heap
        self._seq = 0  # numbers the entries of _near
        # (bucket, entries scanned, their earliest deadline): see _earliest_in.
        self._hint: tuple[_Bucket[K, V], int, float] | None = None
        # _levels[L][slot] is a bucket or None when empty; bit `slot` of _occupied[L] is
        # set exactly when that bucket is not None.
        self._levels: list[list[_Bucket[K, V] | None]] = []
        self._occupied: list[int] = []
        # Each pending key -> the deadline object of its live timer. An entry (in a
        # bucket or in _near) whose deadline `is not` `_index.get(key)` is dead
        # (cancelled or replaced).
        self._index: dict[K, float] = {}
        self._garbage = 0
        self._added = 0
        self._replaced = 0
        self._cancelled = 0
        self._expired = 0

    # ------------------------------------------------------------------ public API

    @overload
    def add(self: TimingWheel[K, None], key: K, deadline: float) -> None: ...
    @overload
    def add(self, key: K, deadline: float, item: V) -> None: ...
    def add(self, key: K, deadline: float, item: V | None = None) -> None:
        """Arm a timer for ``key`` at ``deadline`` (monotonic seconds), replacing the
        pending timer of the same key if any. A deadline that is already past, or inside
        the current tick, is fine: it fires on the first ``advance(now)`` with
        ``now >= deadline``. O(1); O(log k) for the k timers of the current tick.
        """
        try:
            tick = math.floor((deadline - self._start) / self._tick_s)
        except (OverflowError, ValueError):  # inf or nan, or finite but beyond any tick
            raise ValueError(f"deadline must be a finite time, got {deadline!r}") from None
        # This timer's own deadline object, the identity that tells it from every other
        # entry of the key: arithmetic makes a new float (or reuses an operand only when
        # nothing else refers to it), so it is no object the wheel already holds, even
        # when the caller passes the same float again.
        deadline = deadline + 0.0
        index = self._index
        size = len(index)
        index[key] = deadline  # one hash of the key, not two: UUID hashing runs Python code
        self._added += 1
        # _place, inlined: this is the hot path of the preloader. The overloads let item
        # be None only when V is None.
        cur = self._cur
        if tick <= cur:
            seq = self._seq
            self._seq = seq + 1
            entry: _NearEntry[K, V] = (deadline, seq, key, item)  # type: ignore[assignment]
            heapq.heappush(self._near, entry)
        else:
            bits = self._bits
            level = ((tick ^ cur).bit_length() - 1) // bits
            if level >= len(self._levels):
                self._grow(level)
            slot = (tick >> (bits * level)) & self._mask
            buckets = self._levels[level]
            bucket = buckets[slot]
            if bucket is None:
                bucket = buckets[slot] = _Bucket()
                self._occupied[level] |= 1 << slot
            bucket.deadlines.append(deadline)
            bucket.keys.append(key)
            bucket.items.append(item)  # type: ignore[arg-type]
        if len(index) == size:  # the key was pending: its old entry is now dead
            self._replaced += 1
            self._garbage += 1
            self._maybe_sweep()

    def cancel(self, key: K) -> bool:
        """Disarm ``key``; True if it was pending. O(1) amortised. A cancelled timer never
        fires, whatever ``advance`` is called with afterwards."""
        if self._index.pop(key, None) is None:
            return False
        self._cancelled += 1
        self._garbage += 1
        self._maybe_sweep()
        return True

    def cancel_where(self, doomed: Callable[[V], bool]) -> int:
        """Disarm every pending timer whose item ``doomed`` accepts; how many.

        O(entries held): it looks at every timer, for what is rare (a node dropping the
        tasks of shards it no longer owns) and would otherwise need an index per timer.
        """
        index = self._index
        keys: list[K] = [
            key
            for deadline, _, key, item in self._near
            if doomed(item) and index.get(key) is deadline
        ]
        for buckets in self._levels:
            for bucket in buckets:
                if bucket is not None:
                    keys.extend(
                        [
                            key
                            for deadline, key, item in zip(
                                bucket.deadlines, bucket.keys, bucket.items, strict=True
                            )
                            if doomed(item) and index.get(key) is deadline
                        ]
                    )
        for key in keys:
            del index[key]
        self._cancelled += len(keys)
        self._garbage += len(keys)
        self._maybe_sweep()
        return len(keys)

    def advance(self, now: float) -> list[Entry[K, V]]:
        """Fire and return every pending timer with ``deadline <= now``, sorted by
        deadline, ties in insertion order. Empty buckets are skipped, not walked: the cost
        is the buckets reached and the timers moved, however far ``now`` jumps. A ``now``
        earlier than a previous one is allowed and fires only what is due by it.
        """
        target = self._tick(now, "now")
        fired: list[Entry[K, V]] = []
        if target > self._cur:
            if self._near:
                # Every timer of the old current tick is due: its tick is below target.
                near, self._near = self._near, []
                near.sort()
                for deadline, _, key, item in near:
                    self._fire(deadline, key, item, fired)
            self._run_buckets(target, fired)
            self._cur = target
        near = self._near
        while near and near[0][0] <= now:
            deadline, _, key, item = heapq.heappop(near)
            self._fire(deadline, key, item, fired)
        self._expired += len(fired)
        return fired

    def next_deadline(self) -> float | None:
        """When the driver should call :meth:`advance` next; None when nothing is pending.

        Guarantee: the returned time ``T`` is never later than the earliest pending
        deadline, and is

        - that deadline exactly, when the earliest timer is in the current tick or in the
          next non-empty tick (level 0) and was not preceded there by a cancelled timer;
        - the earliest deadline in that tick, cancelled timers included, otherwise;
        - when the earliest timer is still at a higher level, the first instant of its
          bucket, where ``advance(T)`` cascades the bucket down.

        ``advance(T)`` always makes progress: it returns a timer, or it consumes a
        bucket or a cancelled timer, after which ``next_deadline()`` is later than ``T``.
        A driver that sleeps until ``T`` therefore wakes once per deadline (timers due
        together share a wake-up), plus once per higher-level bucket it cascades and per
        cancelled timer that was the earliest of its tick: never a busy loop, and no
        wake-up at all while nothing is pending. The cost is O(levels), plus a scan of
        the timers added to the next tick since the previous call.
        """
        index = self._index
        if not index:
            return None
        near = self._near
        while near:
            deadline, _, key, _ = near[0]
            if index.get(key) is deadline:
                return deadline
            heapq.heappop(near)
            self._garbage -= 1
        first = self._first_bucket()
        if first is None:
            raise RuntimeError("timing wheel invariant broken: a pending timer is in no bucket")
        level, slot = first
        if level == 0:
            bucket = self._levels[0][slot]
            assert bucket is not None
            return self._earliest_in(bucket)
        return self._time_of_tick(self._bucket_start(level, slot))

    def deadline_of(self, key: K) -> float | None:
        """The deadline of the pending timer of ``key``, or None."""
        return self._index.get(key)

    def get_stats(self) -> dict[str, int]:
        """Totals that only grow (add calls, replacements included; replacements; cancels
        that found a timer; timers returned by advance) and the levels in
        ``STATS_GAUGES``: pending timers, levels allocated (never freed), and dead entries
        still held until their bucket or the next sweep."""
        return {
            "timers": len(self._index),
            "added": self._added,
            "replaced": self._replaced,
            "cancelled": self._cancelled,
            "expired": self._expired,
            "levels": len(self._levels),
            "garbage": self._garbage,
        }

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __repr__(self) -> str:
        return (
            f"<TimingWheel pending={len(self._index)} tick_s={self._tick_s} "
            f"slots={self._slots} levels={len(self._levels)}>"
        )

    # ------------------------------------------------------------------ internals

    def _tick(self, time: float, name: str) -> int:
        try:
            return math.floor((time - self._start) / self._tick_s)
        except (OverflowError, ValueError):
            raise ValueError(f"{name} must be a finite time, got {time!r}") from None

    def _time_of_tick(self, tick: int) -> float:
        """The smallest float ``x`` with ``_tick(x) >= tick``.

        ``start + tick * tick_s`` can land an ulp on either side of that boundary; a
        driver woken one ulp early would find nothing to do and ask again for the same
        time, forever. Nudging to the exact boundary makes ``advance`` at the returned
        time reach the bucket, and keeps the time <= every deadline in it (the tick of a
        time is monotone in the time, rounding included).
        """
        time = self._start + tick * self._tick_s
        while self._tick(time, "time") < tick:
            time = math.nextafter(time, math.inf)
        while self._tick(below := math.nextafter(time, -math.inf), "time") >= tick:
            time = below
        return time

    def _earliest_in(self, bucket: _Bucket[K, V]) -> float:
        """The smallest deadline in a level-0 bucket, dead entries included.

        A bucket only grows until it is reached, so the scan resumes where the previous
        call stopped: a driver asking after every add pays O(1) per add, not O(bucket).
        """
        deadlines = bucket.deadlines
        hint = self._hint
        if hint is not None and hint[0] is bucket:
            _, seen, earliest = hint
            if seen < len(deadlines):
                earliest = min(earliest, min(deadlines[seen:]))
        else:
            earliest = min(deadlines)
        self._hint = (bucket, len(deadlines), earliest)
        return earliest

    def _first_bucket(self) -> tuple[int, int] | None:
        """(level, slot) of the earliest non-empty bucket, or None if there is none."""
        # The lowest non-empty level holds the earliest bucket, and its lowest set bit is
        # that level's earliest slot: every occupied slot is ahead of the current tick.
        for level, bits in enumerate(self._occupied):
            if bits:
                return level, (bits & -bits).bit_length() - 1
        return None

    def _bucket_start(self, level: int, slot: int) -> int:
        # A bucket shares the current tick's digits above its level (module docstring).
        shift = self._bits * level
        high = shift + self._bits
        return ((self._cur >> high) << high) | (slot << shift)

    def _grow(self, level: int) -> None:
        """Allocate levels up to ``level``: a bucket array of None, no buckets yet."""
        while level >= len(self._levels):
            self._levels.append([None] * self._slots)
            self._occupied.append(0)

    def _fire(self, deadline: float, key: K, item: V, fired: list[Entry[K, V]]) -> None:
        """Move a due entry out of the index into ``fired`` if live; drop it if dead."""
        index = self._index
        # pop-and-check hashes the key once in the common (live) case.
        live = index.pop(key, None)
        if live is deadline:
            fired.append(_new_tuple(Entry, (deadline, key, item)))
        else:
            self._garbage -= 1
            if live is not None:
                index[key] = live

    def _run_buckets(self, target: int, fired: list[Entry[K, V]]) -> None:
        """Reach, in order, every bucket that starts at or before tick ``target``."""
        # _first_bucket and _bucket_start, inlined: this loop runs on every wake-up.
        levels = self._levels
        occupied = self._occupied
        index = self._index
        start = self._start
        tick_s = self._tick_s
        digit = self._bits
        mask = self._mask
        while True:
            level = 0
            for bits in occupied:
                if bits:
                    break
                level += 1
            else:
                return
            slot = (bits & -bits).bit_length() - 1
            shift = digit * level
            high = shift + digit
            begin = ((self._cur >> high) << high) | (slot << shift)
            if begin > target:
                return
            bucket = levels[level][slot]
            assert bucket is not None
            levels[level][slot] = None
            occupied[level] = bits ^ (1 << slot)
            self._hint = None  # it may hold on to this bucket, which leaves the wheel
            # Lower levels are empty here (their buckets all start earlier), so moving
            # the current tick to the bucket's start keeps every other bucket valid.
            self._cur = begin
            if level == 0:
                current = bucket  # a level-0 bucket is exactly one tick
            else:
                # Cascade: re-place the live timers at lower levels, in bucket order so
                # every lower bucket stays in insertion order. Those of tick `begin`
                # (the bucket's first) belong to no lower bucket: they are handled below.
                current = _Bucket()
                for deadline, key, item in zip(
                    bucket.deadlines, bucket.keys, bucket.items, strict=True
                ):
                    if index.get(key) is not deadline:
                        self._garbage -= 1
                        continue
                    tick = math.floor((deadline - start) / tick_s)
                    if tick == begin:
                        low = current
                    else:  # a lower level: tick > begin
                        low_level = ((tick ^ begin).bit_length() - 1) // digit
                        low_slot = (tick >> (digit * low_level)) & mask
                        low_buckets = levels[low_level]
                        found = low_buckets[low_slot]
                        if found is None:
                            found = low_buckets[low_slot] = _Bucket()
                            occupied[low_level] |= 1 << low_slot
                        low = found
                    low.deadlines.append(deadline)
                    low.keys.append(key)
                    low.items.append(item)
            if begin < target:
                # Every timer of the bucket is due. A stable sort by deadline keeps ties
                # in insertion order, which is the bucket's order.
                due: list[Entry[K, V]] = []
                for deadline, key, item in zip(
                    current.deadlines, current.keys, current.items, strict=True
                ):
                    self._fire(deadline, key, item, due)
                due.sort(key=_by_deadline)
                fired.extend(due)
            else:
                # The bucket of tick `target` becomes the current tick: only the part due
                # by `now` fires, in advance(). _near was emptied by the caller; its
                # entries are numbered in bucket (insertion) order, before any timer
                # added to the current tick from now on.
                near: list[_NearEntry[K, V]] = []
                seq = self._seq
                for deadline, key, item in zip(
                    current.deadlines, current.keys, current.items, strict=True
                ):
                    if index.get(key) is deadline:
                        near.append((deadline, seq, key, item))
                        seq += 1
                    else:
                        self._garbage -= 1
                self._seq = seq
                near.sort()  # a sorted list is a heap
                self._near = near

    def _maybe_sweep(self) -> None:
        if self._garbage > _SWEEP_FLOOR and self._garbage > len(self._index):
            self._sweep()

    def _sweep(self) -> None:
        """Drop every dead entry, emptying buckets that held nothing else."""
        index = self._index
        self._hint = None
        for level, buckets in enumerate(self._levels):
            bits = self._occupied[level]
            remaining = bits
            while remaining:
                low = remaining & -remaining
                remaining ^= low
                slot = low.bit_length() - 1
                bucket = buckets[slot]
                assert bucket is not None
                live = _Bucket[K, V]()
                for deadline, key, item in zip(
                    bucket.deadlines, bucket.keys, bucket.items, strict=True
                ):
                    if index.get(key) is deadline:
                        live.deadlines.append(deadline)
                        live.keys.append(key)
                        live.items.append(item)
                if len(live):
                    buckets[slot] = live
                else:
                    buckets[slot] = None
                    bits ^= low
            self._occupied[level] = bits
        self._near = [entry for entry in self._near if index.get(entry[2]) is entry[0]]
        heapq.heapify(self._near)
        self._garbage = 0
