"""The cluster clock: PostgreSQL's time as this node knows it, and the clock-skew guard.

Due times are instants of one clock, PostgreSQL's: leases, attempt rows and the
reconciler's decisions use its ``now()``, and a submit's "now" must agree with them. A
node that judged ``due_at`` by its own wall clock fired every task as early or as late as
that clock was off (issue 12: stepped back 10 minutes, tasks loaded after the step went
onto the wheel 10 minutes late; stepped forward an hour, everything within the lookahead
was dispatched at once, up to 30 s early). So every "now" that decides something on a
node comes from :class:`ClusterClock`:

* **Readings.** Every ``clock.sample_interval_s`` the node reads ``clock_timestamp()``
  ``clock.readings_per_sample`` times back to back on one connection and keeps the
  reading with the shortest round trip: the database read its clock somewhere inside the
  round trip, so the midpoint estimate is off by at most half of it (:func:`best_reading`).
* **Between readings** the estimate is advanced by the monotonic clock
  (:class:`~chronoshard.clock.Anchor`), so a step of the local wall clock does not move
  it. Clock rates differ (NTP slews either clock by up to 500 ppm), so the error bound
  grows by :data:`DRIFT_RATE` per second since the reading, and a new reading replaces
  the anchor only when it is at least as certain (:func:`preferred_anchor`); one that
  contradicts the anchor beyond both error bounds means PostgreSQL's clock (or this
  host's monotonic clock) jumped, and it is taken at once.
* **The offset** (local wall clock minus cluster clock) reveals a local step at the next
  check (every :data:`CHECK_INTERVAL_S`: no reading is needed for that). :class:`SkewGuard`
  judges it against ``clock.max_offset_s``: beyond the bound for sure (or too uncertain
  to tell) and the node is *skewed*; surely back within it for :data:`RECOVER_AFTER_S`
  and it is trusted again.

A skewed node dispatches nothing, gives its shards to its peers and claims none until it
recovers (``shards.py``); it says so once in the log on entering and once on leaving, in
the ``chronoshard_clock_offset_seconds`` and ``chronoshard_clock_skewed`` gauges, and in
gRPC health (``node.py``). Its API keeps serving: submit times come from the cluster clock.

The estimation and the judgement are pure (time passed in) and property-tested; the
async shell reads the database through an injected reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from chronoshard.clock import Anchor, Clock, ClockReading
from chronoshard.scheduler.config import ClockConfig
from chronoshard.scheduler.errors import StoreUnavailable

log = logging.getLogger(__name__)

DRIFT_RATE = 1e-3
"""Seconds per second two clocks' rates may differ: NTP slews each by up to 500 ppm."""
CHECK_INTERVAL_S = 0.2
"""How often the offset is checked against the anchor held: two clock reads, no I/O, so a
step is seen within this, whatever the sample interval."""
RECOVER_AFTER_S = 2.0
"""A skewed node is trusted again once its clock has been surely within bound for this
long, so a clock that keeps stepping (a broken NTP setup) does not flap it in and out."""

MIN_READ_TIMEOUT_S = 1.0
"""The shortest a sample may take before it counts as failed (else the interval)."""

Reader = Callable[[int], Awaitable[Sequence[ClockReading]]]
"""Takes ``n`` readings of the database's clock, back to back (``Store.read_clock``)."""


# ---- pure estimation ---------------------------------------------------------------------


def best_reading(readings: Sequence[ClockReading]) -> ClockReading:
    """The reading with the shortest round trip (the latest of equals): the tightest."""
    if not readings:
        raise ValueError("no readings")
    best = readings[0]
    for reading in readings[1:]:
        if reading.round_trip_s <= best.round_trip_s:
            best = reading
    return best


@dataclass(frozen=True, slots=True)
class Adoption:
    """What :func:`preferred_anchor` decided: the anchor to use from now on, and the
    jump (new minus held estimate, seconds) when the reading contradicted the anchor."""

    anchor: Anchor
    jump_s: float | None = None


def preferred_anchor(held: Anchor | None, reading: ClockReading, at: float) -> Adoption:
    """The better of the anchor held and ``reading``'s, judged at monotonic time ``at``.

    The more certain one wins (a reading slowed by a busy event loop does not replace a
    tight one). When the two disagree by more than both error bounds together, one of
    the clocks jumped: the new reading is the truth from now on.
    """
    fresh = reading.anchor()
    if held is None:
        return Adoption(fresh)
    held_error = held.error_at(at, DRIFT_RATE)
    fresh_error = fresh.error_at(at, DRIFT_RATE)
    disagreement = (fresh.at(at) - held.at(at)).total_seconds()
    if abs(disagreement) > held_error + fresh_error:
        return Adoption(fresh, jump_s=disagreement)
    return Adoption(fresh if fresh_error <= held_error else held)


def within_bound(offset_s: float, error_s: float, max_offset_s: float) -> bool | None:
    """True: the offset is surely within ``max_offset_s``; False: surely beyond it, or
    the estimate is too uncertain to tell (``error_s`` over the bound); None: either."""
    if error_s > max_offset_s or abs(offset_s) - error_s > max_offset_s:
        return False
    if abs(offset_s) + error_s <= max_offset_s:
        return True
    return None


class SkewGuard:
    """Whether the node's clock is trusted, from one offset check after another."""

    def __init__(self, max_offset_s: float, recover_after_s: float = RECOVER_AFTER_S) -> None:
        if recover_after_s < 0:
            raise ValueError("recover_after_s must not be negative")
        self.max_offset_s = max_offset_s
        self._recover_after_s = recover_after_s
        # Since when (monotonic) every check was surely within bound; None: the last not.
        self._in_bound_since: float | None = None
        self.skewed = False

    def observe(self, offset_s: float, error_s: float, at: float) -> bool:
        """Judge the check made at monotonic time ``at``; True when it changed
        :attr:`skewed`."""
        verdict = within_bound(offset_s, error_s, self.max_offset_s)
        if verdict is not True:
            self._in_bound_since = None
        elif self._in_bound_since is None:
            self._in_bound_since = at
        if verdict is False and not self.skewed:
            self.skewed = True
            return True
        if (
            self.skewed
            and self._in_bound_since is not None
            and at - self._in_bound_since >= self._recover_after_s
        ):
            self.skewed = False
            return True
        return False


# ---- the clock ---------------------------------------------------------------------------


class ClusterClock:
    """A :class:`~chronoshard.clock.Clock`: ``now()`` is the earliest PostgreSQL's time
    can be as estimated here (never ahead of it but for drift since the last reading),
    ``monotonic()`` the host's. Before the first reading ``now()`` is the host's."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset({"skewed"})

    def __init__(self, local: Clock, config: ClockConfig, read: Reader) -> None:
        self._local = local
        self._config = config
        self._read = read
        self._anchor: Anchor | None = None
        self._guard = SkewGuard(config.max_offset_s)
        self._skewed_at = 0.0
        self._read_failing = False
        # Last check: local wall clock minus cluster clock, and how far that may be off.
        self.offset_s = 0.0
        self.error_s = 0.0
        # Called with the new state when the node becomes skewed or trusted again.
        self.on_skew_changed: Callable[[bool], None] | None = None
        self._stats: dict[str, int] = {
            "samples": 0,
            "sample_failures": 0,
            "skew_episodes": 0,
            "jumps": 0,
        }

    # Clock

    def monotonic(self) -> float:
        return self._local.monotonic()

    def now(self) -> datetime:
        # The earliest PostgreSQL's clock can read now, not the midpoint estimate: a
        # worker waits due_at - now() from the assignment's sent_at, and the midpoint
        # may be ahead by up to half the reading's round trip (a handler started 17 us
        # before due_at that way). Starting that much later is the price of never early.
        if self._anchor is None:
            return self._local.now()
        return self._anchor.earliest_at(self._local.monotonic())

    @property
    def skewed(self) -> bool:
        """The local wall clock is beyond the bound (or cannot be vouched for)."""
        return self._guard.skewed

    # ---- readings and checks ---------------------------------------------------------

    async def sample(self) -> None:
        """Read the database's clock and adopt the reading if it is better.

        Raises:
            StoreUnavailable: the database could not be read.
        """
        readings = await self._read(self._config.readings_per_sample)
        self.adopt(readings)

    def adopt(self, readings: Sequence[ClockReading]) -> None:
        adoption = preferred_anchor(self._anchor, best_reading(readings), self.monotonic())
        self._stats["samples"] += 1
        if adoption.jump_s is not None:
            self._stats["jumps"] += 1
            log.warning(
                "cluster clock moved: PostgreSQL's clock or this host's monotonic clock jumped",
                extra={"jump_s": round(adoption.jump_s, 6)},
            )
        self._anchor = adoption.anchor

    def check(self) -> bool:
        """Measure the offset now and judge it; True when the node became skewed or
        trusted again (``on_skew_changed`` has been told)."""
        if self._anchor is None:
            return False
        at = self._local.monotonic()
        wall = self._local.now()
        self.offset_s = (wall - self._anchor.at(at)).total_seconds()
        self.error_s = self._anchor.error_at(at, DRIFT_RATE)
        if not self._guard.observe(self.offset_s, self.error_s, at):
            return False
        fields = {
            "offset_s": round(self.offset_s, 6),
            "error_s": round(self.error_s, 6),
            "max_offset_s": self._config.max_offset_s,
        }
        if self.skewed:
            self._skewed_at = at
            self._stats["skew_episodes"] += 1
            log.warning(
                "clock out of bound: this node stops dispatching and hands its shards off",
                extra=fields,
            )
        else:
            log.info(
                "clock back within bound: this node takes shards again",
                extra={**fields, "skewed_for_s": round(at - self._skewed_at, 3)},
            )
        if self.on_skew_changed is not None:
            self.on_skew_changed(self.skewed)
        return True

    async def run(self) -> None:
        """Check every :data:`CHECK_INTERVAL_S`, read every ``sample_interval_s``; never
        returns. The checks run on their own, so neither a slow reading nor a database
        that cannot be read delays them: they go on against the anchor held, its error
        bound growing, and a local step is still seen at once."""
        sampler = asyncio.create_task(self._sample_loop(), name="cluster-clock-readings")
        try:
            while True:
                await asyncio.sleep(min(CHECK_INTERVAL_S, self._config.sample_interval_s))
                if sampler.done():
                    # Readings fail only as StoreUnavailable; anything else is a bug, and
                    # the node's supervisor stops the node on it, as for any loop.
                    sampler.result()
                self.check()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampler

    async def _sample_loop(self) -> None:
        interval_s = self._config.sample_interval_s
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.wait_for(self.sample(), timeout=max(interval_s, MIN_READ_TIMEOUT_S))
            except (StoreUnavailable, TimeoutError) as exc:
                self._stats["sample_failures"] += 1
                if not self._read_failing:
                    self._read_failing = True
                    log.warning(
                        "cannot read PostgreSQL's clock; checking against the last reading",
                        extra={"error": str(exc) or "timed out"},
                    )
            else:
                if self._read_failing:
                    self._read_failing = False
                    log.info("reading PostgreSQL's clock again")

    def get_stats(self) -> dict[str, int]:
        return {**self._stats, "skewed": 1 if self.skewed else 0}
