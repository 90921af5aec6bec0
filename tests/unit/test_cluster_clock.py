"""The cluster clock: readings, the estimate between them, the skew guard, and the
dispatcher's due-time conversion, all on fake clocks (no I/O, no sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
from fixtures.timers import timer_task
from fixtures.waiting import eventually
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.clock import Anchor, AnchoredClock, Clock, ClockReading, FakeClock
from chronoshard.scheduler.cluster.clock import (
    DRIFT_RATE,
    RECOVER_AFTER_S,
    ClusterClock,
    SkewGuard,
    best_reading,
    preferred_anchor,
    within_bound,
)
from chronoshard.scheduler.cluster.coordination import NodeInfo
from chronoshard.scheduler.config import ClockConfig, SchedulerConfig
from chronoshard.scheduler.core.fairness import UNLIMITED
from chronoshard.scheduler.dispatch.dispatcher import Dispatcher, ShardView
from chronoshard.scheduler.dispatch.sessions import SessionRegistry
from chronoshard.scheduler.store.runs import RunStore
from chronoshard.settings import ConfigError, load

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
# datetime keeps microseconds: each conversion may round by half of one.
ROUNDING_S = 2e-6


def _reading(sent: float, there_s: float, back_s: float, reference: datetime) -> ClockReading:
    """The reference answered ``reference`` ``there_s`` after ``sent``; back ``back_s`` later."""
    received = sent + there_s + back_s
    return ClockReading(sent, received, reference, T0)


# ---- readings and the estimate -------------------------------------------------------------


def test_a_reading_is_pinned_to_its_midpoint_within_half_the_round_trip() -> None:
    reading = ClockReading(10.0, 10.004, T0, T0 + timedelta(seconds=30.002))
    anchor = reading.anchor()
    assert anchor.monotonic == pytest.approx(10.002)
    assert anchor.error_s == pytest.approx(0.002)
    # The local wall clock read at the answer, 2 ms after the midpoint: 30 s ahead.
    assert reading.offset_s == pytest.approx(30.0)


def test_the_shortest_round_trip_wins_and_the_latest_of_equals() -> None:
    # Binary fractions, so that equal round trips are equal floats.
    slow = _reading(1.0, 0.5, 0.5, T0)
    tight = _reading(2.0, 0.125, 0.125, T0)
    tight_later = _reading(3.0, 0.1875, 0.0625, T0)
    assert best_reading([slow, tight, slow]) is tight
    assert best_reading([tight, tight_later]) is tight_later
    with pytest.raises(ValueError):
        best_reading([])


@PROPERTY_SETTINGS
@given(
    there_s=st.floats(0, 0.5),
    back_s=st.floats(0, 0.5),
    age_s=st.floats(0, 3600),
    drift=st.floats(-DRIFT_RATE, DRIFT_RATE),
)
def test_the_estimate_is_within_its_error_bound(
    there_s: float, back_s: float, age_s: float, drift: float
) -> None:
    """Whatever the asymmetry of the round trip and however the reference's rate drifts
    (within DRIFT_RATE), the reference's true time lies within the stated error."""
    sent = 100.0

    def true_reference(mono: float) -> datetime:
        return T0 + timedelta(seconds=(mono - sent) * (1 + drift))

    reading = _reading(sent, there_s, back_s, true_reference(sent + there_s))
    anchor = reading.anchor()
    at = anchor.monotonic + age_s
    off_s = abs((anchor.at(at) - true_reference(at)).total_seconds())
    assert off_s <= anchor.error_at(at, DRIFT_RATE) + ROUNDING_S


@PROPERTY_SETTINGS
@given(there_s=st.floats(0, 0.5), back_s=st.floats(0, 0.5), age_s=st.floats(0, 3600))
def test_the_earliest_estimate_is_never_ahead_of_the_reference(
    there_s: float, back_s: float, age_s: float
) -> None:
    """The cluster clock's now(): wherever in the round trip the reference read its
    clock, the earliest estimate is not ahead of it (clocks at one rate, one host: the
    e2e run that saw a handler start 17 us before due_at used the midpoint)."""
    sent = 100.0

    def true_reference(mono: float) -> datetime:
        return T0 + timedelta(seconds=mono - sent)

    anchor = _reading(sent, there_s, back_s, true_reference(sent + there_s)).anchor()
    at = anchor.monotonic + age_s
    assert anchor.earliest_at(at) <= true_reference(at)
    assert anchor.earliest_at(at) >= anchor.at(at) - timedelta(seconds=anchor.error_s + ROUNDING_S)


def test_a_slow_reading_does_not_replace_a_tight_anchor_but_a_jump_is_taken() -> None:
    tight = _reading(10.0, 0.0005, 0.0005, T0).anchor()
    at = 11.0
    slow = _reading(at - 0.2, 0.1, 0.1, tight.at(at - 0.1))
    assert preferred_anchor(tight, slow, at).anchor is tight
    fresher = _reading(at - 0.001, 0.0005, 0.0005, tight.at(at - 0.0005))
    assert preferred_anchor(tight, fresher, at).anchor == fresher.anchor()
    # The reference says 10 minutes later than the anchor allows: it (or our monotonic
    # clock) jumped. The new reading is the truth from now on, however slow.
    jumped = _reading(at - 0.2, 0.1, 0.1, tight.at(at - 0.1) + timedelta(minutes=10))
    adoption = preferred_anchor(tight, jumped, at)
    assert adoption.anchor == jumped.anchor()
    assert adoption.jump_s == pytest.approx(600, abs=0.01)


def test_an_anchored_clock_follows_the_monotonic_clock_not_the_wall_clock() -> None:
    local = FakeClock(T0)
    clock = AnchoredClock(local, Anchor(T0 + timedelta(seconds=5), local.monotonic()))
    local.step_wall(-600)
    local.advance(1.5)
    assert clock.now() == T0 + timedelta(seconds=6.5)
    assert clock.monotonic() == local.monotonic()


# ---- the bound and the guard ---------------------------------------------------------------


def test_within_bound_is_sure_either_way_or_undecided() -> None:
    assert within_bound(0.5, 0.01, 1.0) is True
    assert within_bound(-1.5, 0.01, 1.0) is False
    assert within_bound(0.995, 0.01, 1.0) is None  # could be either side
    assert within_bound(0.0, 1.5, 1.0) is False  # too uncertain to vouch for


Check = tuple[float, float, float]  # offset, error, seconds since the previous check
checks = st.lists(
    st.tuples(
        st.one_of(st.floats(-3, 3), st.sampled_from([-600.0, 3600.0, 0.0, 0.999, 1.001])),
        st.floats(0, 0.05),
        st.floats(0.05, 1.5),
    ),
    max_size=60,
)


@PROPERTY_SETTINGS
@given(checks)
def test_the_guard_enters_at_once_and_recovers_only_after_a_clean_stretch(
    sequence: list[Check],
) -> None:
    guard = SkewGuard(1.0)
    at = 0.0
    history: list[tuple[float, bool | None]] = []
    for offset_s, error_s, gap_s in sequence:
        at += gap_s
        was = guard.skewed
        changed = guard.observe(offset_s, error_s, at)
        verdict = within_bound(offset_s, error_s, 1.0)
        history.append((at, verdict))
        assert changed == (guard.skewed != was)
        if verdict is False:
            assert guard.skewed  # one check beyond the bound is enough
        if not any(v is False for _, v in history):
            assert not guard.skewed  # never skewed without a check beyond the bound
        if changed and not guard.skewed:
            # Trusted again: every check of the last RECOVER_AFTER_S was surely in bound.
            streak = []
            for t, v in reversed(history):
                if v is not True:
                    break
                streak.append(t)
            assert at - streak[-1] >= RECOVER_AFTER_S


# ---- the cluster clock on a fake host ------------------------------------------------------


class FakeDatabase:
    """PostgreSQL on a host whose clock is right: its time is the fake monotonic clock
    shifted to T0, read halfway through a round trip of ``rtt_s``."""

    def __init__(self, local: FakeClock, rtt_s: float = 0.002) -> None:
        self._local = local
        self._start = local.monotonic()
        self.rtt_s = rtt_s
        self.up = True

    def time(self) -> datetime:
        return T0 + timedelta(seconds=self._local.monotonic() - self._start)

    async def read(self, count: int) -> Sequence[ClockReading]:
        if not self.up:
            from chronoshard.scheduler.errors import StoreUnavailable

            raise StoreUnavailable("database down")
        readings = []
        for _ in range(count):
            sent = self._local.monotonic()
            self._local.advance(self.rtt_s / 2)
            reference = self.time()
            self._local.advance(self.rtt_s / 2)
            readings.append(
                ClockReading(sent, self._local.monotonic(), reference, self._local.now())
            )
        return readings


def _cluster_clock(
    max_offset_s: float = 1.0,
) -> tuple[FakeClock, FakeDatabase, ClusterClock, list[bool]]:
    local = FakeClock(T0)
    database = FakeDatabase(local)
    clock = ClusterClock(local, ClockConfig(max_offset_s=max_offset_s), database.read)
    told: list[bool] = []
    clock.on_skew_changed = told.append
    return local, database, clock, told


async def test_a_stepped_wall_clock_moves_the_cluster_clock_not_and_is_reported() -> None:
    local, database, clock, told = _cluster_clock()
    assert clock.now() == local.now()  # no reading yet: the host's own
    await clock.sample()
    assert not clock.check() and not clock.skewed
    for step_s in (-600.0, 3600.0):
        local.step_wall(step_s)
        assert abs((clock.now() - database.time()).total_seconds()) < 0.002
        assert clock.check() and clock.skewed
        assert clock.offset_s == pytest.approx(step_s, abs=0.002)
        local.step_wall(-step_s)
        # Back within bound, but trusted only after RECOVER_AFTER_S of clean checks.
        for _ in range(int(RECOVER_AFTER_S / 0.2)):
            await clock.sample()
            assert not clock.check() and clock.skewed
            local.advance(0.2)
        await clock.sample()
        assert clock.check() and not clock.skewed
    assert told == [True, False, True, False]
    assert clock.get_stats()["skew_episodes"] == 2


async def test_offsets_under_the_bound_are_tolerated() -> None:
    local, _, clock, told = _cluster_clock(max_offset_s=1.0)
    local.step_wall(0.7)
    await clock.sample()
    clock.check()
    assert not clock.skewed and clock.offset_s == pytest.approx(0.7, abs=0.002)
    assert told == []


async def test_without_readings_the_step_is_still_seen_and_long_silence_is_not_trusted() -> None:
    local, database, clock, told = _cluster_clock()
    await clock.sample()
    database.up = False
    local.advance(30)
    local.step_wall(-5)
    assert clock.check() and clock.skewed  # against the anchor held
    local.step_wall(5)
    assert not clock.check()  # surely within bound from here on
    local.advance(RECOVER_AFTER_S)
    assert clock.check() and not clock.skewed
    # After ~1000 s without a reading the drift bound alone exceeds the offset bound.
    local.advance(1.0 / DRIFT_RATE)
    assert clock.check() and clock.skewed and clock.error_s > 1.0
    assert told == [True, False, True]


async def test_the_loop_checks_and_reads_on_its_own_schedule() -> None:
    local = FakeClock(T0)
    database = FakeDatabase(local)
    clock = ClusterClock(local, ClockConfig(sample_interval_s=0.05), database.read)
    runner = asyncio.create_task(clock.run())
    try:
        # The loop sleeps on the real event loop; the fake host clock stands still.
        await eventually(lambda: clock.get_stats()["samples"] >= 2, timeout_s=5, what="readings")
        local.step_wall(-600)
        await eventually(lambda: clock.skewed, timeout_s=5, what="the step seen")
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner


# ---- the dispatcher's conversion of due_at -------------------------------------------------


class _Shards:
    def epochs(self) -> dict[int, int]:
        return {0: 1}

    def dispatch_allowed(self) -> bool:
        return True

    def epochs_lost(self, shards: object) -> None: ...

    def retry_due(self, shard: int, due_at: datetime) -> None: ...


def _wheel_deadline(clock: Clock, due_at: datetime) -> float:
    config = SchedulerConfig()
    store = cast(RunStore, None)  # schedule() touches neither store nor workers
    dispatcher = Dispatcher(
        config,
        clock,
        store,
        SessionRegistry(config.node_id, clock, send_queue=config.grpc.worker_send_queue),
        cast(ShardView, _Shards()),
        lambda tenant: UNLIMITED,
    )
    timer = timer_task(scheduled_at=due_at, due_at=due_at)
    dispatcher.schedule([timer])
    deadline = dispatcher._wheel.deadline_of(timer.id_int)
    assert deadline is not None
    return deadline


@pytest.mark.parametrize("step_s", [-600.0, 3600.0, 0.0])
async def test_the_wheel_deadline_follows_the_cluster_clock_whatever_the_host_clock(
    step_s: float,
) -> None:
    local, database, clock, _ = _cluster_clock()
    await clock.sample()
    local.step_wall(step_s)
    lead_s = SchedulerConfig().scheduling.lead_dispatch_s
    due_at = database.time() + timedelta(seconds=5)
    deadline = _wheel_deadline(clock, due_at)
    assert deadline == pytest.approx(local.monotonic() + 5 - lead_s, abs=0.002)
    # The host's wall clock would have moved it by the step (the filed bug).
    on_host_clock = _wheel_deadline(local, due_at)
    assert on_host_clock == pytest.approx(local.monotonic() + 5 - lead_s - step_s, abs=0.002)


# ---- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("MAX_OFFSET_S", "0"), ("SAMPLE_INTERVAL_S", "0.001"), ("READINGS_PER_SAMPLE", "0")],
)
def test_clock_settings_out_of_range_are_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"clock.{key.lower()}"):
        load(SchedulerConfig, env={f"CHRONOSHARD_CLOCK__{key}": value})


def test_clock_settings_load_from_the_environment() -> None:
    config = load(SchedulerConfig, env={"CHRONOSHARD_CLOCK__MAX_OFFSET_S": "0.25"})
    assert config.clock == ClockConfig(max_offset_s=0.25)


# ---- what peers are told -------------------------------------------------------------------


def test_a_skewed_node_is_published_and_left_out_of_the_shard_map() -> None:
    info = NodeInfo("a", "127.0.0.1:1", "", "2026-01-01T00:00:00Z", clock_skewed=True)
    again = NodeInfo.from_json(info.to_json())
    assert again == info and not again.takes_shards
    # A node of an older version publishes no flag: it takes shards.
    older = NodeInfo.from_json(b'{"node_id": "b", "address": "127.0.0.1:2"}')
    assert not older.clock_skewed and older.takes_shards
    assert not NodeInfo("c", "", "", "", draining=True).takes_shards
