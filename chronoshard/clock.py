"""Time as an injected dependency, and a reference clock carried on the monotonic clock.

Pure cores (timing wheel, state machine, jitter, backoff) take ``now`` as an argument;
the async shells read it from a :class:`Clock`. Leases, deadlines and the wheel use
``monotonic()``; wall time (``now()``) only for what users see and for ``due_at``.
Tests drive a :class:`FakeClock` instead of sleeping.

A host's wall clock can step (an NTP step, a VM resume); its monotonic clock does not.
Where wall time decides something, Chronoshard uses the time of a *reference* clock
instead: PostgreSQL's, for a scheduler node (``scheduler/cluster/clock.py``), or the
assigning node's, for a worker waiting for ``due_at``. A :class:`ClockReading` is one
question to the reference over a round trip; an :class:`Anchor` pins the reference's
time to a point of the local monotonic clock, and :class:`AnchoredClock` reads it from
there on, so a step of the local wall clock does not move it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def now(self) -> datetime:
        """Timezone-aware wall-clock time (UTC)."""
        ...


class SystemClock:
    """The real clocks of the process."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that moves only when told to: ``advance(seconds)`` moves both clocks,
    ``step_wall(seconds)`` only the wall clock (either way), as an NTP step does."""

    def __init__(self, start: datetime | None = None, monotonic_start: float = 1000.0) -> None:
        self._wall = start if start is not None else datetime(2026, 1, 1, tzinfo=UTC)
        if self._wall.tzinfo is None:
            raise ValueError("FakeClock start must be timezone-aware")
        self._mono = monotonic_start

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._mono += seconds
        self._wall += timedelta(seconds=seconds)

    def step_wall(self, seconds: float) -> None:
        self._wall += timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class Anchor:
    """The reference clock read ``reference`` at local monotonic time ``monotonic``,
    give or take ``error_s``."""

    reference: datetime
    monotonic: float
    error_s: float = 0.0

    def at(self, monotonic: float) -> datetime:
        """The reference's time at local monotonic time ``monotonic``."""
        return self.reference + timedelta(seconds=monotonic - self.monotonic)

    def earliest_at(self, monotonic: float) -> datetime:
        """The earliest the reference's time can be at ``monotonic``: :meth:`at` less the
        reading's own error (its clock rate is taken as ours), rounded down to the
        microsecond (``timedelta(seconds=...)`` rounds to the nearest, up half the time)."""
        elapsed_us = math.floor((monotonic - self.monotonic - self.error_s) * 1e6)
        return self.reference + timedelta(microseconds=elapsed_us)

    def error_at(self, monotonic: float, drift_rate: float) -> float:
        """How far :meth:`at` may be off if the two clocks' rates differ by up to
        ``drift_rate`` seconds per second: the reading's own error, plus the drift since
        the reading (counted from the far end of the reading's own window)."""
        return self.error_s + drift_rate * (abs(monotonic - self.monotonic) + self.error_s)


@dataclass(frozen=True, slots=True)
class ClockReading:
    """One reading of a reference clock over a round trip.

    ``sent`` and ``received`` are the local monotonic clock when the question left and
    when the answer was back; the reference read its clock (``reference``) somewhere in
    between, so pinning it to the midpoint is off by at most half the round trip.
    ``local_wall`` is the local wall clock when the answer was back.
    """

    sent: float
    received: float
    reference: datetime
    local_wall: datetime

    @property
    def round_trip_s(self) -> float:
        return self.received - self.sent

    def anchor(self) -> Anchor:
        return Anchor(
            self.reference, self.sent + self.round_trip_s / 2, error_s=self.round_trip_s / 2
        )

    @property
    def offset_s(self) -> float:
        """Local wall clock minus the reference's, both at the midpoint (positive: the
        local clock is ahead), within ``round_trip_s / 2``."""
        local_at_midpoint = self.local_wall - timedelta(seconds=self.round_trip_s / 2)
        return (local_at_midpoint - self.reference).total_seconds()


class AnchoredClock:
    """A :class:`Clock` whose ``now()`` is a reference's time, advanced from an anchor
    by the local monotonic clock; ``monotonic()`` is the local one."""

    def __init__(self, local: Clock, anchor: Anchor) -> None:
        self._local = local
        self.anchor = anchor

    def monotonic(self) -> float:
        return self._local.monotonic()

    def now(self) -> datetime:
        return self.anchor.at(self._local.monotonic())
