"""Reconnect and resend backoff: exponential, capped, with "equal jitter".

After ``failures`` consecutive failures the base wait is ``initial_s * 2**(failures-1)``
capped at ``max_s`` (0.1 s doubling to 5 s, docs/worker-protocol.md), and the wait is
``base/2 + base/2 * unit``: never shorter than half the base, so a flapping node is not
hammered, and spread over the other half so many workers that lost the same node do not
come back in lockstep. ``unit`` in ``[0, 1)`` is passed in (the shell draws it from
``random``), which keeps this function pure and testable.
"""

from __future__ import annotations

import math

RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0


def backoff_s(
    failures: int,
    unit: float,
    *,
    initial_s: float = RECONNECT_INITIAL_S,
    max_s: float = RECONNECT_MAX_S,
) -> float:
    """Seconds to wait after ``failures`` (>= 1) consecutive failures."""
    if failures < 1:
        raise ValueError(f"failures must be at least 1, got {failures}")
    if not 0.0 <= unit < 1.0:
        raise ValueError(f"unit must be in [0, 1), got {unit}")
    # 2**n overflows a float only far beyond any cap; min() first keeps it finite.
    exponent = min(failures - 1, 64)
    base = min(max_s, initial_s * math.ldexp(1.0, exponent))
    return base / 2 + base / 2 * unit
