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
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
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


class Entry(NamedTuple, Generic[K, V]):
    """One timer. Tuples compare field by field and ``seq`` is unique per wheel, so
    entries sort by (deadline, insertion order) and never compare keys or items."""

    deadline: float
    seq: int
    key: K
    item: V


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
        self._near: list[Entry[K, V]] = []  # a heap
        # (bucket, entries scanned, their earliest deadline): see _earliest_in.
        self._hint: tuple[list[Entry[K, V]], int, float] | None = None
        # _levels[L][slot] is a bucket (list of entries) or None when empty; bit `slot`
        # of _occupied[L] is set exactly when that bucket is not None.
        self._levels: list[list[list[Entry[K, V]] | None]] = []
        self._occupied: list[int] = []
        # The live entry of each pending key. An entry found in a bucket or in _near that
        # is not `_index[entry.key]` is dead (cancelled or replaced).
        self._index: dict[K, Entry[K, V]] = {}
        self._seq = 0
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
        seq = self._seq
        self._seq = seq + 1
        # tuple.__new__ skips the NamedTuple's Python-level __new__, a good part of the
        # cost of add. The overloads let item be None only when V is None.
        entry: Entry[K, V] = _new_tuple(Entry, (deadline, seq, key, item))
        index = self._index
        size = len(index)
        index[key] = entry  # one hash of the key, not two: UUID hashing runs Python code
        self._added += 1
        # _place, inlined: this is the hot path of the preloader.
        cur = self._cur
        if tick <= cur:
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
                buckets[slot] = [entry]
                self._occupied[level] |= 1 << slot
            else:
                bucket.append(entry)
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
                self._collect(near, fired)
            self._run_buckets(target, fired)
            self._cur = target
        near = self._near
        index = self._index
        while near and near[0].deadline <= now:
            entry = heapq.heappop(near)
            live = index.pop(entry.key, None)
            if live is entry:
                fired.append(entry)
            else:
                self._garbage -= 1
                if live is not None:
                    index[entry.key] = live
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
            head = near[0]
            if index.get(head.key) is head:
                return head.deadline
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

    def get(self, key: K) -> Entry[K, V] | None:
        """The pending timer of ``key``, or None."""
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

    def _earliest_in(self, bucket: list[Entry[K, V]]) -> float:
        """The smallest deadline in a level-0 bucket, dead entries included.

        A bucket only grows until it is reached, so the scan resumes where the previous
        call stopped: a driver asking after every add pays O(1) per add, not O(bucket).
        """
        hint = self._hint
        if hint is not None and hint[0] is bucket:
            _, seen, earliest = hint
            if seen < len(bucket):
                earliest = min(earliest, min(bucket[seen:]).deadline)
        else:
            earliest = min(bucket).deadline  # tuple order: by deadline first
        self._hint = (bucket, len(bucket), earliest)
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

    def _place(self, entry: Entry[K, V], tick: int) -> None:
        cur = self._cur
        if tick <= cur:
            heapq.heappush(self._near, entry)
            return
        # The highest base-`slots` digit in which tick differs from cur picks the level.
        level = ((tick ^ cur).bit_length() - 1) // self._bits
        if level >= len(self._levels):
            self._grow(level)
        slot = (tick >> (self._bits * level)) & self._mask
        buckets = self._levels[level]
        bucket = buckets[slot]
        if bucket is None:
            buckets[slot] = [entry]
            self._occupied[level] |= 1 << slot
        else:
            bucket.append(entry)

    def _grow(self, level: int) -> None:
        """Allocate levels up to ``level``: a bucket array of None, no buckets yet."""
        while level >= len(self._levels):
            self._levels.append([None] * self._slots)
            self._occupied.append(0)

    def _run_buckets(self, target: int, fired: list[Entry[K, V]]) -> None:
        """Reach, in order, every bucket that starts at or before tick ``target``."""
        # _first_bucket and _bucket_start, inlined: this loop runs on every wake-up.
        levels = self._levels
        occupied = self._occupied
        index = self._index
        start = self._start
        tick_s = self._tick_s
        digit = self._bits
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
                current = []
                for entry in bucket:
                    if index.get(entry.key) is not entry:
                        self._garbage -= 1
                        continue
                    tick = math.floor((entry.deadline - start) / tick_s)
                    if tick == begin:
                        current.append(entry)
                    else:
                        self._place(entry, tick)  # a lower level: tick > begin
            if begin < target:
                due: list[Entry[K, V]] = []
                self._collect(current, due)
                due.sort()
                fired.extend(due)
            else:
                # The bucket of tick `target` becomes the current tick: only the part due
                # by `now` fires, in advance(). _near was emptied by the caller.
                current.sort()  # a sorted list is a heap
                self._near = current

    def _collect(self, entries: list[Entry[K, V]], out: list[Entry[K, V]]) -> None:
        """Move the live ``entries`` out of the index into ``out``; drop the dead."""
        index = self._index
        for entry in entries:
            # pop-and-check hashes the key once in the common (live) case.
            live = index.pop(entry.key, None)
            if live is entry:
                out.append(entry)
            else:
                self._garbage -= 1
                if live is not None:
                    index[entry.key] = live

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
                live = [entry for entry in bucket if index.get(entry.key) is entry]
                if live:
                    buckets[slot] = live
                else:
                    buckets[slot] = None
                    bits ^= low
            self._occupied[level] = bits
        self._near = [entry for entry in self._near if index.get(entry.key) is entry]
        heapq.heapify(self._near)
        self._garbage = 0
