"""Long item loops give the event loop back: a node's timers must not wait behind them.

A node runs its timing wheel, dispatch rounds, worker streams and every API call on one
event loop. Preparing a ``SubmitBatch`` of 1,000 tasks (validation, ids, fingerprints),
building its answer, and turning a preload of 5,000 rows into timers are pure CPU: done
in one go they held the loop for up to ~250 ms on the test machine, and every critical
task due meanwhile started that late (the fair-queuing flood test, bench/README.md "Fair
queuing under a flood"). :func:`in_turns` maps a function over the items and yields to
the loop whenever it has run for ``TURN_S``, so what is due runs between slices; the
total work is the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

TURN_S = 0.002
"""The longest stretch a request's item loop runs without yielding: the dispatch path's
own granularity (a wheel tick is 10 ms, the group commit interval 2 ms)."""


async def in_turns(items: Iterable[T], apply: Callable[[int, T], R]) -> list[R]:
    """``[apply(i, item) for i, item in enumerate(items)]``, yielding to the event loop
    every ``TURN_S`` of work. An exception from ``apply`` propagates as from the loop."""
    results: list[R] = []
    turn_ends = time.perf_counter() + TURN_S
    for index, item in enumerate(items):
        results.append(apply(index, item))
        if time.perf_counter() >= turn_ends:
            await asyncio.sleep(0)
            turn_ends = time.perf_counter() + TURN_S
    return results
