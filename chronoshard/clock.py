"""Time as an injected dependency.

Pure cores (timing wheel, state machine, jitter, backoff) take ``now`` as an argument;
the async shells read it from a :class:`Clock`. Leases, deadlines and the wheel use
``monotonic()``; wall time (``now()``) only for what users see and for ``due_at``.
Tests drive a :class:`FakeClock` instead of sleeping.
"""

from __future__ import annotations

import time
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
    """A clock that moves only when told to: ``advance(seconds)`` moves both clocks."""

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
