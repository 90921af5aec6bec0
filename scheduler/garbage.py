"""Full garbage collections when the node chooses, not whenever its heap grows.

CPython collects its oldest generation once enough objects survived the younger
collections (and those survivors are a quarter of the old generation): a pass over every
tracked object with the event loop stopped. A node holds about four tracked objects per
ready task, so with 200,000 ready tasks one full collection took 0.18 s on an idle core
and 0.3-0.5 s beside a flood; while a flood grows the heap such collections come again
and again, each longer than the last, and every timer due meanwhile fires that late
(critical lateness p99 390 ms under a 200,000-task bulk flood, bench/README.md "Fair
queuing under a flood").

So the scheduler process puts the oldest generation's automatic threshold out of reach (the young
generations stay automatic: cyclic garbage mostly dies young) and runs a full collection
itself every :data:`FULL_INTERVAL_S`. A full pass costs what it did, once per interval
instead of whenever the heap grows; memory held by long-lived cycles waits at most that
long.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger(__name__)

FULL_INTERVAL_S = 300.0
"""How often the node collects its oldest generation itself."""
_OUT_OF_REACH = 1_000_000
"""Young-generation collections before an automatic full one: never, in practice."""


def take_over_full_collections() -> tuple[int, int, int]:
    """Stop automatic full collections for the whole process (the scheduler's entry point
    calls it once; nodes run in tests keep the defaults); the thresholds as they were."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], _OUT_OF_REACH)
    return before


async def collect_periodically(interval_s: float = FULL_INTERVAL_S) -> None:
    """Run a full collection every ``interval_s``, logging slow ones."""
    while True:
        await asyncio.sleep(interval_s)
        started = time.perf_counter()
        found = gc.collect()
        took_s = time.perf_counter() - started
        if took_s >= 0.05:
            log.info(
                "full garbage collection",
                extra={"seconds": round(took_s, 3), "unreachable": found},
            )
