"""Retry backoff: exponential, capped, with jitter that a re-evaluation never moves.

The base delay before retry ``attempt`` (1 for the first retry) is
``min(max_s, initial_s * multiplier ** (attempt - 1))``: non-decreasing in ``attempt``
because ``multiplier >= 1``, and never above ``max_s``. Jitter then keeps a fixed share and
randomises the rest: ``delay = base * (1 - f) + base * f * u`` with ``f =
jitter_fraction``. ``f = 1`` is "full jitter" (anywhere in ``[0, base)``), ``f = 0.5`` is
"equal jitter" (``[base/2, base)``), ``f = 0`` is no jitter. Spreading retries keeps a
burst of failures, say a downstream outage, from coming back as a synchronised burst.

``u`` in ``[0, 1)`` is not drawn from a random generator: it is the top 53 bits of
BLAKE2b (``digest_size=8``) over ``seed`` followed by ``attempt`` as 8 big-endian bytes,
divided by 2**53 (exact in a float). Callers pass the task id's bytes as ``seed``, so the
delay of a given task's given attempt is the same wherever and whenever it is computed; a
store that retries a write, or a node that takes over the shard, arrives at the same
``due_at``. The attempt comes last and has a fixed width, so no two (seed, attempt) pairs
hash the same input.
"""

from __future__ import annotations

import hashlib
import math

from chronoshard.scheduler.errors import InvalidArgument

MAX_ATTEMPT = 2**31 - 1
"""Attempts are counted in a PostgreSQL ``integer``."""
_UNIT_BITS = 53


def _require_finite(field: str, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(field, f"must be finite, got {value!r}")


def base_delay_s(attempt: int, *, initial_s: float, max_s: float, multiplier: float) -> float:
    """The delay before retry ``attempt`` without jitter.

    Raises:
        InvalidArgument: ``attempt`` is not in 1..MAX_ATTEMPT, ``initial_s`` is not
            positive, ``max_s < initial_s``, ``multiplier < 1``, or a value is not finite.
    """
    if isinstance(attempt, bool) or not 1 <= attempt <= MAX_ATTEMPT:
        raise InvalidArgument("attempt", f"must be in 1..{MAX_ATTEMPT}, got {attempt!r}")
    for field, value in (("initial_s", initial_s), ("max_s", max_s), ("multiplier", multiplier)):
        _require_finite(field, value)
    if initial_s <= 0:
        raise InvalidArgument("initial_s", f"must be positive, got {initial_s!r}")
    if max_s < initial_s:
        raise InvalidArgument("max_s", f"must be at least initial_s ({initial_s}), got {max_s}")
    if multiplier < 1:
        raise InvalidArgument("multiplier", f"must be at least 1, got {multiplier!r}")
    try:
        grown = initial_s * multiplier ** (attempt - 1)
    except OverflowError:
        # float ** raises rather than returning inf; past max_s the cap applies anyway.
        grown = math.inf
    return min(max_s, grown)


def jitter_unit(seed: bytes, attempt: int) -> float:
    """A fixed value in ``[0, 1)`` for ``(seed, attempt)``, the same in every process."""
    digest = hashlib.blake2b(seed + attempt.to_bytes(8, "big"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> (64 - _UNIT_BITS)) / (1 << _UNIT_BITS)


def retry_delay_s(
    attempt: int,
    *,
    initial_s: float,
    max_s: float,
    multiplier: float,
    jitter_fraction: float,
    seed: bytes,
) -> float:
    """Seconds to wait before retry ``attempt``: in ``[base * (1 - f), base]``, never
    above ``max_s``.

    Raises:
        InvalidArgument: as :func:`base_delay_s`, or ``jitter_fraction`` is not in [0, 1].
    """
    base = base_delay_s(attempt, initial_s=initial_s, max_s=max_s, multiplier=multiplier)
    if not 0.0 <= jitter_fraction <= 1.0:  # also rejects NaN
        raise InvalidArgument(
            "jitter_fraction", f"must be between 0 and 1, got {jitter_fraction!r}"
        )
    fixed = base * (1.0 - jitter_fraction)
    # u < 1 keeps the sum below base in exact arithmetic; min() absorbs a float rounding
    # up by one ulp so the max_s bound holds literally.
    return min(base, fixed + base * jitter_fraction * jitter_unit(seed, attempt))
