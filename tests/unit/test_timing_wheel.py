"""The timing wheel fires exactly what is due, in order, and a driver never busy-wakes.

Example tests pin the documented behaviour; a stateful property test runs random
add/cancel/advance sequences against a heapq-with-lazy-deletion reference model, with
deadlines from a millisecond to a year and awkward float starts and tick sizes.
"""

from __future__ import annotations

import heapq
import math
import operator
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from chronoshard.scheduler.core.timing_wheel import Entry, TimingWheel

YEAR_S = 365 * 24 * 3600.0


def drive(wheel: TimingWheel[str, None], limit: int) -> tuple[list[tuple[str, float]], int]:
    """Run the wheel the way the dispatcher does: sleep until next_deadline, advance.

    Returns (key, lateness) per fired timer and the number of wake-ups; fails if the
    driver needs more than `limit` wake-ups (a busy-waking driver never stops)."""
    fired: list[tuple[str, float]] = []
    wakes = 0
    while (due := wheel.next_deadline()) is not None:
        wakes += 1
        assert wakes <= limit, "driver busy-wakes"
        fired.extend((entry.key, due - entry.deadline) for entry in wheel.advance(due))
    return fired, wakes


def keys(entries: list[Entry[str, None]]) -> list[str]:
    return [entry.key for entry in entries]


def keys_of(entries: list[Entry[int, None]]) -> list[int]:
    return [entry.key for entry in entries]


# ---------------------------------------------------------------------- examples


def test_fires_in_deadline_order_ties_in_insertion_order() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=0.01, slots=8)
    wheel.add("late", 0.5)
    wheel.add("tie-first", 0.3)  # 30 ticks away: level 1, cascaded down later
    wheel.add("early", 0.011)
    wheel.add("same-tick-earlier", 0.0301)
    assert wheel.advance(0.29) == [
        Entry(0.011, "early", None),
        Entry(0.0301, "same-tick-earlier", None),
    ]
    # Added directly into level 0 now, after "tie-first" was armed at a higher level:
    # the tie must still break by insertion order.
    wheel.add("tie-second", 0.3)
    assert keys(wheel.advance(1.0)) == ["tie-first", "tie-second", "late"]


def test_nothing_fires_before_its_deadline_even_inside_the_current_tick() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=1.0)
    wheel.add("a", 5.25)
    wheel.add("b", 5.75)
    assert wheel.advance(5.0) == []
    assert keys(wheel.advance(5.5)) == ["a"]
    assert keys(wheel.advance(5.74)) == []
    assert keys(wheel.advance(5.75)) == ["b"]  # deadline == now is due


def test_past_and_current_tick_deadlines_fire_on_the_next_advance() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(100.0)
    wheel.advance(200.0)
    wheel.add("long-past", 50.0)
    wheel.add("before-start", 99.0)
    wheel.add("just-now", 200.0)
    assert wheel.next_deadline() == 50.0
    assert keys(wheel.advance(200.0)) == ["long-past", "before-start", "just-now"]
    assert wheel.next_deadline() is None


def test_cancel_reports_whether_pending_and_always_wins() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, slots=4)
    wheel.add("near", 0.02)
    wheel.add("far", 1000.0)
    assert wheel.cancel("far") is True
    assert wheel.cancel("far") is False
    assert wheel.cancel("never-added") is False
    assert "far" not in wheel
    assert len(wheel) == 1
    assert keys(wheel.advance(5000.0)) == ["near"]
    assert wheel.cancel("near") is False  # already fired
    assert wheel.next_deadline() is None


def test_cancel_in_the_current_tick_wins() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=1.0)
    wheel.add("a", 3.5)
    wheel.advance(3.1)  # tick 3 is now the current tick; "a" waits in it
    wheel.add("b", 3.7)
    wheel.add("c", 3.95)
    assert wheel.cancel("a") is True
    assert wheel.cancel("c") is True
    assert keys(wheel.advance(3.9)) == ["b"]  # within the same tick
    assert wheel.get_stats()["garbage"] == 1  # "c" is dead but not yet met
    assert wheel.advance(10.0) == []
    assert wheel.next_deadline() is None
    assert wheel.get_stats()["garbage"] == 0


def test_add_of_a_pending_key_replaces_deadline_and_item() -> None:
    wheel: TimingWheel[str, str] = TimingWheel(0.0)
    wheel.add("k", 50.0, "first")
    wheel.add("k", 10.0, "second")
    assert len(wheel) == 1
    assert wheel.deadline_of("k") == 10.0
    assert wheel.advance(10.0) == [Entry(10.0, "k", "second")]
    assert wheel.advance(100.0) == []  # the replaced timer at 50 s is dead
    wheel.add("k", 120.0, "third")  # a fired key can be armed again
    assert wheel.cancel("k") is True
    wheel.add("k", 130.0, "fourth")  # and re-armed after a cancel
    assert wheel.advance(200.0) == [Entry(130.0, "k", "fourth")]
    stats = wheel.get_stats()
    assert (stats["added"], stats["replaced"], stats["cancelled"], stats["expired"]) == (4, 1, 1, 2)


def test_timer_a_year_away_grows_levels_on_demand_and_fires_on_time() -> None:
    wheel: TimingWheel[uuid.UUID, str] = TimingWheel(1000.0, tick_s=0.01, slots=512)
    assert wheel.get_stats()["levels"] == 0
    task_id = uuid.UUID("0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f")
    wheel.add(task_id, 1000.0 + YEAR_S, "payload")
    # 3.15e9 ticks need four base-512 digits: four levels, not 3e9 slots.
    assert wheel.get_stats()["levels"] == 4
    assert wheel.advance(1000.0 + YEAR_S - 0.001) == []
    assert wheel.advance(1000.0 + YEAR_S) == [Entry(1000.0 + YEAR_S, task_id, "payload")]


def test_big_jumps_skip_empty_ticks() -> None:
    # 1e13 ticks of 1 ms: walking them one by one would never finish.
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=0.001, slots=512)
    deadlines = {f"t{i}": 10.0 ** (i % 11) * (1 + i / 7) for i in range(300)}
    for key, deadline in deadlines.items():
        wheel.add(key, deadline)
    # Ties (none expected) would go in insertion order, the order of `deadlines`.
    assert wheel.advance(1e12) == sorted(
        (Entry(d, k, None) for k, d in deadlines.items()), key=lambda entry: entry.deadline
    )
    assert len(wheel) == 0


def test_driver_wakes_a_bounded_number_of_times_and_never_late() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=0.01, slots=16)
    for i in range(200):
        wheel.add(f"t{i}", (i * 7919 % 1000) * 37.1 + i * 1e-3)
    levels = wheel.get_stats()["levels"]
    fired, wakes = drive(wheel, limit=200 * (levels + 2))
    assert len(fired) == 200
    assert all(lateness == 0.0 for _, lateness in fired)  # woken at the exact deadline
    assert wakes <= 200 * (levels + 1)


@pytest.mark.parametrize(("start", "tick_s"), [(0.1, 0.1), (1e6 + 0.3, 0.01), (-7.7, 0.003)])
def test_next_deadline_on_inexact_float_tick_boundaries(start: float, tick_s: float) -> None:
    # Deadlines on tick boundaries, computed the naive way and as the decimal a user
    # would type (0.1 * 17 is 1.7000000000000002, yet 1.7 is in tick 17): the wheel's
    # bucket start times must neither wake the driver early forever nor late.
    wheel: TimingWheel[str, None] = TimingWheel(start, tick_s=tick_s, slots=4)
    for k in range(1, 400, 3):
        wheel.add(f"b{k}", start + k * tick_s)
        wheel.add(f"r{k}", round(start + k * tick_s, 9))
        wheel.add(f"m{k}", start + k * tick_s * 1.5)
    fired, _ = drive(wheel, limit=10_000)
    assert len(fired) == 3 * len(range(1, 400, 3))
    assert all(lateness == 0.0 for _, lateness in fired)


def test_next_deadline() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=0.01, slots=512)
    assert wheel.next_deadline() is None  # idle: the driver sleeps without a timeout
    wheel.add("far", 100.004)
    # Level-1 bucket [97.28 s, 102.4 s): the driver wakes at its start to cascade.
    first = wheel.next_deadline()
    assert first is not None
    assert math.isclose(first, 97.28)
    assert wheel.advance(first) == []
    # Now in a level-0 bucket: the exact deadline.
    assert wheel.next_deadline() == 100.004
    wheel.add("sooner", 100.002)  # same tick, earlier
    assert wheel.next_deadline() == 100.002
    wheel.add("later", 100.008)  # same tick, later: still the earlier one
    assert wheel.next_deadline() == 100.002
    wheel.add("soonest", 99.5)  # an earlier tick
    assert wheel.next_deadline() == 99.5
    wheel.advance(100.0)  # tick 10000 becomes the current tick
    assert wheel.next_deadline() == 100.002
    wheel.cancel("sooner")
    assert wheel.next_deadline() == 100.004
    wheel.cancel("far")
    assert wheel.next_deadline() == 100.008
    wheel.cancel("later")
    assert wheel.next_deadline() is None  # everything cancelled is idle too


def test_next_deadline_with_a_cancelled_earliest_timer_is_early_once() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=0.01, slots=512)
    wheel.add("a", 1.234)
    wheel.add("b", 1.236)
    assert wheel.next_deadline() == 1.234
    wheel.cancel("a")
    early = wheel.next_deadline()
    assert early is not None
    assert early <= 1.236  # a lower bound: the cancelled timer still sits in the bucket
    assert wheel.advance(early) == []
    assert wheel.next_deadline() == 1.236  # one spurious wake-up, then exact


def test_advance_to_an_earlier_now_fires_only_what_is_due_by_it() -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0, tick_s=1.0)
    wheel.advance(100.0)
    wheel.add("a", 60.0)
    wheel.add("b", 40.0)
    assert keys(wheel.advance(50.0)) == ["b"]
    assert keys(wheel.advance(100.0)) == ["a"]


def test_a_sweep_frees_buckets_that_held_only_cancelled_timers() -> None:
    wheel: TimingWheel[int, None] = TimingWheel(0.0, tick_s=0.01, slots=64)
    for i in range(2100):
        wheel.add(i, 1.0 + i * 0.37)
    for i in range(1051):  # the 1051st cancel outnumbers the live timers: a sweep
        wheel.cancel(i)
    assert wheel.get_stats()["garbage"] == 0
    # The first live timer (389.87 s, tick 38987) is in the level-2 bucket of ticks
    # 36864..40959; an emptied bucket left behind would wake the driver at 0.64 s.
    assert wheel.next_deadline() == pytest.approx(368.64)


def test_a_sweep_also_cleans_the_current_tick() -> None:
    wheel: TimingWheel[int, None] = TimingWheel(0.0, tick_s=1.0)
    for i in range(3000):
        wheel.add(i, 0.5 + i * 1e-4)  # all in tick 0, the current tick
    for i in range(2000):
        wheel.cancel(i)  # the 1501st sweeps
    assert wheel.get_stats()["garbage"] == 499
    assert keys_of(wheel.advance(1.0)) == list(range(2000, 3000))
    assert wheel.get_stats()["garbage"] == 0


def test_cancelled_entries_are_swept_and_garbage_stays_bounded() -> None:
    wheel: TimingWheel[int, None] = TimingWheel(0.0, tick_s=0.01, slots=64)
    for i in range(6000):
        wheel.add(i, 1.0 + i * 0.37)
    for i in range(6000):
        if i % 5:
            assert wheel.cancel(i)
        stats = wheel.get_stats()
        assert stats["garbage"] <= max(1024, stats["timers"]) + 1
    assert wheel.get_stats()["garbage"] < 4800  # swept, not all held until their buckets
    assert keys_of(wheel.advance(1e9)) == list(range(0, 6000, 5))
    assert wheel.get_stats() == {
        "timers": 0,
        "added": 6000,
        "replaced": 0,
        "cancelled": 4800,
        "expired": 1200,
        "levels": 3,
        "garbage": 0,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slots": 500}, "power of two"),
        ({"slots": 1}, "power of two"),
        ({"slots": 0}, "power of two"),
        ({"tick_s": 0.0}, "tick_s"),
        ({"tick_s": -0.01}, "tick_s"),
        ({"tick_s": math.nan}, "tick_s"),
        ({"start": math.inf}, "start"),
    ],
)
def test_rejects_bad_construction(kwargs: dict[str, float], message: str) -> None:
    args: dict[str, float] = {"start": 0.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        TimingWheel(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e308])
def test_rejects_non_finite_times(bad: float) -> None:
    wheel: TimingWheel[str, None] = TimingWheel(0.0)
    with pytest.raises(ValueError, match="deadline"):
        wheel.add("k", bad)
    with pytest.raises(ValueError, match="now"):
        wheel.advance(bad)
    assert len(wheel) == 0
    assert wheel.get_stats()["added"] == 0


# ------------------------------------------------------------ property: heapq model

KEYS = [f"k{i}" for i in range(10)]
SCALES_S = [1e-4, 1e-2, 1.0, 60.0, 3600.0, 86400.0, YEAR_S]
# Deadline offsets from "now", from a tenth of a scale in the past to one scale ahead.
OFFSETS = st.builds(operator.mul, st.floats(-0.1, 1.0), st.sampled_from(SCALES_S))
STEPS = st.one_of(
    st.just(0.0),
    st.builds(operator.mul, st.floats(0.0, 1.0), st.sampled_from([0.0, *SCALES_S])),
)


class WheelAgainstHeapModel(RuleBasedStateMachine):
    """The wheel must behave exactly like a heapq with lazy deletion."""

    @initialize(
        start=st.one_of(st.just(0.0), st.floats(-1e5, 1e7)),
        tick_s=st.sampled_from([0.001, 0.01, 0.1, 0.3, 1.0]),
        slots=st.sampled_from([2, 4, 16, 512]),
    )
    def setup(self, start: float, tick_s: float, slots: int) -> None:
        self.wheel: TimingWheel[str, int] = TimingWheel(start, tick_s=tick_s, slots=slots)
        self.start = start
        self.tick_s = tick_s
        self.now = start
        self.seq = 0
        self.heap: list[tuple[float, int, str, int]] = []
        self.live: dict[str, int] = {}  # key -> seq of its pending timer
        self.deadline_of: dict[str, float] = {}
        self.item_of: dict[str, int] = {}
        self.used: list[float] = []  # every deadline object handed to the wheel
        self.added = self.cancelled = self.replaced = self.expired = 0

    def _model_add(self, key: str, deadline: float, item: int) -> None:
        self.replaced += key in self.live
        heapq.heappush(self.heap, (deadline, self.seq, key, item))
        self.live[key] = self.seq
        self.deadline_of[key] = deadline
        self.item_of[key] = item
        self.used.append(deadline)
        self.seq += 1
        self.added += 1

    def _model_due(self, now: float) -> list[tuple[float, int, str, int]]:
        due = []
        while self.heap and self.heap[0][0] <= now:
            deadline, seq, key, item = heapq.heappop(self.heap)
            if self.live.get(key) == seq:
                del self.live[key]
                due.append((deadline, seq, key, item))
        return due

    def _check_advance(self, now: float) -> list[Entry[str, int]]:
        fired = self.wheel.advance(now)
        expected = self._model_due(now)
        # The model's order is (deadline, insertion order): the wheel, which keeps no
        # sequence numbers in its buckets, must break ties the same way.
        assert [tuple(entry) for entry in fired] == [(d, k, item) for d, _, k, item in expected]
        # Implied by the equality, stated for the reader: none early, none left due.
        assert all(entry.deadline <= now for entry in fired)
        assert all(d > now for k, d in self.deadline_of.items() if k in self.live)
        self.expired += len(fired)
        return fired

    @rule(key=st.sampled_from(KEYS), offset=OFFSETS, item=st.integers(0, 99))
    def add(self, key: str, offset: float, item: int) -> None:
        deadline = self.now + offset
        self.wheel.add(key, deadline, item)
        self._model_add(key, deadline, item)

    @rule(key=st.sampled_from(KEYS), ticks=st.integers(-3, 3000), item=st.integers(0, 99))
    def add_on_tick_boundary(self, key: str, ticks: int, item: int) -> None:
        current = math.floor((self.now - self.start) / self.tick_s)
        deadline = self.start + (current + ticks) * self.tick_s
        self.wheel.add(key, deadline, item)
        self._model_add(key, deadline, item)

    @precondition(lambda self: bool(self.used))
    @rule(data=st.data(), key=st.sampled_from(KEYS), item=st.integers(0, 99))
    def add_with_a_deadline_object_used_before(
        self, data: st.DataObject, key: str, item: int
    ) -> None:
        # The very float object of an earlier timer, live or dead, of this key or
        # another: a tie in deadline (which must break by insertion order at every
        # level), and no help to the wheel in telling its entries apart.
        deadline = data.draw(st.sampled_from(self.used))
        self.wheel.add(key, deadline, item)
        self._model_add(key, deadline, item)

    @rule(divisor=st.integers(1, 4), remainder=st.integers(0, 3))
    def cancel_where(self, divisor: int, remainder: int) -> None:
        def doomed(item: int) -> bool:
            return item % divisor == remainder % divisor

        expected = [key for key in self.live if doomed(self.item_of[key])]
        for key in expected:
            del self.live[key]
        self.cancelled += len(expected)
        assert self.wheel.cancel_where(doomed) == len(expected)

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        pending = self.live.pop(key, None) is not None
        self.cancelled += pending
        assert self.wheel.cancel(key) is pending

    @rule(step=STEPS)
    def advance(self, step: float) -> None:
        self.now += step
        self._check_advance(self.now)

    @rule(back=st.floats(0.0, 100.0))
    def advance_to_an_earlier_now(self, back: float) -> None:
        self._check_advance(self.now - back)

    @rule()
    def advance_past_everything(self) -> None:
        self.now = max([self.now, *(entry[0] for entry in self.heap)]) + 1.0
        self._check_advance(self.now)
        assert len(self.wheel) == 0
        assert self.wheel.get_stats()["garbage"] == 0  # every dead entry was met and dropped

    @precondition(lambda self: bool(self.live))
    @rule()
    def sleep_until_next_deadline(self) -> None:
        due = self.wheel.next_deadline()
        assert due is not None
        assert due <= min(self.deadline_of[key] for key in self.live)
        self.now = max(self.now, due)
        fired = self._check_advance(self.now)
        after = self.wheel.next_deadline()
        # Progress: a wake-up fires something or moves the next wake-up later.
        assert fired or after is None or after > due

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "wheel"):
            return
        assert len(self.wheel) == len(self.live)
        for key in KEYS:
            assert (key in self.wheel) == (key in self.live)
        assert (self.wheel.next_deadline() is None) == (not self.live)
        stats = self.wheel.get_stats()
        keys = ("timers", "added", "cancelled", "replaced", "expired")
        assert tuple(stats[k] for k in keys) == (
            len(self.live),
            self.added,
            self.cancelled,
            self.replaced,
            self.expired,
        )
        assert stats["garbage"] >= 0


WheelAgainstHeapModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWheelAgainstHeapModel = WheelAgainstHeapModel.TestCase
