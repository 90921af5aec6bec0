"""Task ids: UUIDv7 (RFC 9562), time-ordered so new rows land at the right of the index.

Layout, most significant bit first: 48 bits of Unix time in milliseconds, the 4-bit
version ``0111``, 12 random bits (``rand_a``), the 2-bit variant ``10``, 62 random bits
(``rand_b``). :func:`uuid7` is the pure layout: given the millisecond and 74 random bits it
always builds the same id.

:class:`UUIDv7Generator` adds the one piece of state: ids made by one generator sort in
the order they were made (RFC 9562 §6.2, "monotonic random"). When the clock has not
moved past the last id's millisecond (same millisecond, or the wall clock stepped back),
the new id reuses that millisecond and the previous 74-bit random value plus one; when
those bits run out, the id borrows the next millisecond. Time and randomness are
injected. :func:`new_task_id` uses one generator per process, guarded by a lock, and
forgets its state in a forked child so parent and child never continue the same sequence.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.wire import UNIX_EPOCH

RAND_BYTES = 10
""":func:`uuid7` takes 10 bytes and uses their low-order 74 bits."""
_RAND_BITS = 74
_RAND_MASK = (1 << _RAND_BITS) - 1
_RAND_B_BITS = 62
_MAX_UNIX_MS = (1 << 48) - 1


def uuid7(unix_ms: int, rand: bytes) -> uuid.UUID:
    """The UUIDv7 for millisecond ``unix_ms`` with the low 74 bits of ``rand`` (10 bytes).

    Raises:
        InvalidArgument: ``unix_ms`` does not fit 48 bits or ``rand`` is not 10 bytes.
    """
    if not 0 <= unix_ms <= _MAX_UNIX_MS:
        raise InvalidArgument("unix_ms", f"must fit in 48 bits, got {unix_ms}")
    if len(rand) != RAND_BYTES:
        raise InvalidArgument("rand", f"must be {RAND_BYTES} bytes, got {len(rand)}")
    bits = int.from_bytes(rand, "big") & _RAND_MASK
    rand_a = bits >> _RAND_B_BITS
    rand_b = bits & ((1 << _RAND_B_BITS) - 1)
    value = (unix_ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return uuid.UUID(int=value)


def uuid7_time(u: uuid.UUID) -> datetime:
    """The millisecond (UTC) embedded in a UUIDv7.

    Raises:
        InvalidArgument: ``u`` is not an RFC 9562 version-7 UUID, or its time is after
            the year 9999.
    """
    if u.version != 7:
        raise InvalidArgument("id", f"{u} is not a UUIDv7")
    try:
        # timedelta keeps this exact; a float timestamp would round some milliseconds.
        return UNIX_EPOCH + timedelta(milliseconds=u.int >> 80)
    except OverflowError:
        # 48 bits of milliseconds reach the year 10889; datetime stops at 9999.
        raise InvalidArgument("id", f"{u} has a timestamp past datetime.max") from None


def wall_clock_ms() -> int:
    """Unix time in whole milliseconds, read from the system's wall clock."""
    return time.time_ns() // 1_000_000


def unix_ms(instant: datetime) -> int:
    """``instant`` (timezone-aware) as Unix time in whole milliseconds, exactly."""
    return (instant - UNIX_EPOCH) // timedelta(milliseconds=1)


class UUIDv7Generator:
    """Makes UUIDv7s that sort in creation order, with injected clock and randomness.

    Thread-safe. ``clock_ms`` returns Unix milliseconds; ``randbytes(n)`` returns ``n``
    random bytes (``os.urandom`` in production, a seeded source in tests).
    """

    def __init__(
        self,
        clock_ms: Callable[[], int] = wall_clock_ms,
        randbytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._clock_ms = clock_ms
        self._randbytes = randbytes
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def new(self, unix_ms: int | None = None) -> uuid.UUID:
        """A new id at ``unix_ms`` (default: the injected clock), after every earlier one.

        The id's millisecond is never before the previous id's, so a clock that steps back
        yields ids stamped with the last millisecond seen rather than out-of-order ids.
        """
        now_ms = self._clock_ms() if unix_ms is None else unix_ms
        with self._lock:
            if now_ms > self._last_ms:
                ms, rand = now_ms, self._fresh_rand()
            else:
                ms, rand = self._last_ms, self._last_rand + 1
                if rand > _RAND_MASK:
                    # 2**74 ids in one millisecond cannot happen by rate; it takes a fresh
                    # value drawn near the top. Borrow the next millisecond, as RFC 9562
                    # allows, rather than wrap and sort backwards.
                    ms, rand = ms + 1, self._fresh_rand()
            made = uuid7(ms, rand.to_bytes(RAND_BYTES, "big"))
            self._last_ms, self._last_rand = ms, rand
            return made

    def _fresh_rand(self) -> int:
        return int.from_bytes(self._randbytes(RAND_BYTES), "big") & _RAND_MASK

    def _forget_after_fork(self) -> None:
        # The child inherits the parent's last value; continuing from it would make the
        # same ids as the parent within a millisecond. A lock held by another parent
        # thread at fork time would never be released in the child, so replace it too.
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0


_PROCESS_GENERATOR = UUIDv7Generator()
os.register_at_fork(after_in_child=_PROCESS_GENERATOR._forget_after_fork)


def new_task_id(clock_ms: Callable[[], int] | None = None) -> uuid.UUID:
    """A new task id from this process's generator, after every id it made before.

    ``clock_ms`` replaces the wall clock for this call's timestamp only; the ordering
    guarantee still holds across calls (an earlier clock gets the last millisecond seen).
    """
    return _PROCESS_GENERATOR.new(None if clock_ms is None else clock_ms())
