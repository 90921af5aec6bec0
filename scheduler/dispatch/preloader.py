"""The preloader: due tasks of owned shards move from PostgreSQL into the wheel.

Every ``preload_interval_s`` (and at once when woken: a submit or a retry due within the
lookahead, a shard just claimed) it moves SCHEDULED/RETRYING tasks of every owned shard
with ``due_at < now + lookahead`` to PRELOADED, in batches, under the shards' epochs
(one statement for all shards), and hands them to the dispatcher's wheel. The memory cap
(``max_preloaded``) bounds how many tasks wait in memory: past it, the preloader waits
for the wheel to drain; far-future tasks simply stay in the database until they come
within reach. The horizon is read from the cluster clock (``cluster/clock.py``), not the
host's wall clock: stepped an hour ahead, that pulled in an hour too much.

A preload, release or repair whose commit outcome is unknown (the connection died during
COMMIT) may have left PRELOADED rows that no wheel holds. :meth:`Preloader.resync` (the
dispatcher's ``on_preloaded_unknown``) makes the next pass read every PRELOADED row of the
owned shards back first and hand the dispatcher those it does not hold (docs/architecture.md#d12: an
unknown outcome is settled by reading the rows back).

When a burst of preloading ends (a pass that did not fill its batch, after at least
:data:`TRIM_AFTER_PRELOADED` tasks went on the wheel since the last time), the C heap's
free pages are given back to the OS (:func:`release_free_heap`). Loading a million
timers leaves ~20 MB of them behind: glibc raises its mmap threshold each time a large
block is freed (the wheel's index dict, resized as it grows), so the wheel's bucket lists
then grow by realloc inside the heap, and the blocks they leave are free but still
resident, and never returned on their own (bench/README.md, "Memory per pending timer").
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import ClassVar

from chronoshard.clock import Clock
from chronoshard.events import wait_event
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.dispatch.dispatcher import Dispatcher, ShardView
from chronoshard.scheduler.errors import CommitOutcomeUnknown, StoreUnavailable
from chronoshard.scheduler.store.runs import RunStore

log = logging.getLogger(__name__)

TRIM_AFTER_PRELOADED = 50_000
"""Tasks preloaded since the heap was last trimmed before a burst's end trims it again:
a trim stops the loop (~0.5 ms with 10^6 timers held), and a smaller load leaves little
to give back."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc (musl, macOS): nothing to call
        return None
    return trim


def release_free_heap() -> bool:
    """Give the free pages of the C heap back to the OS (glibc's ``malloc_trim(0)``, which
    also releases free pages between blocks in use); whether the C library could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class Preloader:
    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        config: SchedulerConfig,
        clock: Clock,
        runs: RunStore,
        dispatcher: Dispatcher,
        shards: ShardView,
        release_heap: Callable[[], object] = release_free_heap,
    ) -> None:
        self._scheduling = config.scheduling
        self._release_heap = release_heap
        self._clock = clock
        self._runs = runs
        self._dispatcher = dispatcher
        self._shards = shards
        self._wake = asyncio.Event()
        self._resync = False
        self._stats: dict[str, int] = {
            "passes": 0,
            "preloaded": 0,
            "store_errors": 0,
            "resyncs": 0,
        }

    def wake(self) -> None:
        self._wake.set()

    def resync(self) -> None:
        """Read the owned shards' PRELOADED rows back at the next pass (see module doc)."""
        self._resync = True
        self._wake.set()

    def wake_if_due_soon(self, due_at: datetime) -> None:
        """A task of an owned shard became due at ``due_at``: pull it now if in reach."""
        if due_at < self._clock.now() + timedelta(seconds=self._scheduling.lookahead_s):
            self._wake.set()

    async def run(self) -> None:
        untrimmed = 0  # tasks preloaded since the heap was last trimmed
        while True:
            self._wake.clear()
            before = self._stats["preloaded"]
            full_batch = await self.preload_once()
            untrimmed += self._stats["preloaded"] - before
            if full_batch:
                continue  # more due work than one batch: keep going
            if untrimmed >= TRIM_AFTER_PRELOADED:  # a burst ended (module docstring)
                untrimmed = 0
                self._release_heap()
            await wait_event(self._wake, self._scheduling.preload_interval_s)

    async def preload_once(self) -> bool:
        """One pass; True when it filled a whole batch (more may be waiting)."""
        epochs = dict(self._shards.epochs())
        if not epochs or not self._shards.dispatch_allowed():
            return False
        room = self._scheduling.max_preloaded - self._dispatcher.pending()
        if room <= 0:
            return False
        limit = min(self._scheduling.preload_batch, room)
        horizon = self._clock.now() + timedelta(seconds=self._scheduling.lookahead_s)
        self._stats["passes"] += 1
        try:
            if self._resync:
                await self._read_back_preloaded(epochs)
            timers, lost = await self._runs.load_due(epochs, horizon, limit)
        except StoreUnavailable as exc:
            self._stats["store_errors"] += 1
            if isinstance(exc, CommitOutcomeUnknown):
                self._resync = True  # the rows may be PRELOADED, and in no wheel
            log.warning("preload failed; retrying next pass", extra={"error": str(exc)})
            return False
        if lost:
            self._shards.epochs_lost(lost)
        if timers:
            self._stats["preloaded"] += len(timers)
            self._dispatcher.schedule(timers)
        return len(timers) == limit

    async def _read_back_preloaded(self, epochs: dict[int, int]) -> None:
        timers = await self._runs.read_back_preloaded(epochs)
        self._resync = False
        self._stats["resyncs"] += 1
        adopted = self._dispatcher.adopt(timers)
        log.info(
            "PRELOADED rows read back",
            extra={"shards": len(epochs), "preloaded": len(timers), "adopted": adopted},
        )

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
