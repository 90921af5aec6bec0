"""The preloader gives the C heap's free pages back when a big burst of preloading ends,
and only then (issue 14, target 7: loading a million timers left ~20 MB of free heap
pages resident)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import pytest

from chronoshard.clock import FakeClock
from chronoshard.scheduler.config import SchedulerConfig, SchedulingConfig
from chronoshard.scheduler.dispatch import preloader as preloader_module
from chronoshard.scheduler.dispatch.dispatcher import Dispatcher, ShardView
from chronoshard.scheduler.dispatch.preloader import (
    TRIM_AFTER_PRELOADED,
    Preloader,
    release_free_heap,
)
from chronoshard.scheduler.store.runs import RunStore

BATCH = 5000


class _ScriptEnded(Exception):
    pass


async def _trims_after(passes: list[int]) -> list[int]:
    """Run the preloader's loop over passes that each load that many tasks (a full batch
    means more is waiting); the indexes of the passes after which the heap was trimmed."""
    config = SchedulerConfig(scheduling=SchedulingConfig(preload_interval_s=1e-6))
    trims: list[int] = []
    done: list[int] = []
    preloader = Preloader(
        config,
        FakeClock(datetime(2030, 1, 1, tzinfo=UTC)),
        cast(RunStore, None),
        cast(Dispatcher, None),
        cast(ShardView, None),
        release_heap=lambda: trims.append(len(done) - 1),
    )

    async def preload_once() -> bool:  # the pass itself, scripted: no database
        if len(done) == len(passes):
            raise _ScriptEnded
        loaded = passes[len(done)]
        done.append(loaded)
        preloader._stats["preloaded"] += loaded
        return loaded == BATCH

    preloader.preload_once = preload_once  # type: ignore[method-assign]
    with pytest.raises(_ScriptEnded):
        await preloader.run()
    return trims


async def test_the_heap_is_trimmed_once_when_a_big_burst_ends() -> None:
    burst = [BATCH] * (TRIM_AFTER_PRELOADED // BATCH)
    # Not during the burst (the heap is still growing), but at its end; quiet passes
    # after it trim nothing more.
    assert await _trims_after([*burst, 0, 0, 3]) == [len(burst)]
    # Two bursts, two trims; the end of a burst counts the tasks of its last pass.
    assert await _trims_after([*burst, 7, 1, *burst, 0]) == [len(burst), 2 * len(burst) + 2]


async def test_small_loads_add_up_to_a_trim_and_no_sooner() -> None:
    just_short = [BATCH - 1] * ((TRIM_AFTER_PRELOADED - 1) // (BATCH - 1))
    assert sum(just_short) < TRIM_AFTER_PRELOADED
    assert await _trims_after(just_short) == []
    assert await _trims_after([*just_short, BATCH - 1, 0]) == [len(just_short)]


def test_release_free_heap_runs_where_the_c_library_has_malloc_trim() -> None:
    # glibc here; elsewhere it must answer False rather than fail.
    assert release_free_heap() is (preloader_module._malloc_trim() is not None)
