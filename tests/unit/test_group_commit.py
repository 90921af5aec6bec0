"""Group commit batches concurrent callers and answers each with its own result."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from fixtures.loop import one_loop_turn

from chronoshard.scheduler.dispatch.group_commit import GroupCommitter


async def test_concurrent_submits_share_batches_and_get_their_own_answers() -> None:
    batches: list[list[int]] = []
    entered = asyncio.Event()
    release = asyncio.Event()

    async def flush(requests: Sequence[int]) -> list[int]:
        batches.append(list(requests))
        entered.set()
        await release.wait()
        return [r * 10 for r in requests]

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    committer.start()
    first = asyncio.create_task(committer.submit(1))
    # The first flush blocks; everything submitted meanwhile must form one next batch.
    await entered.wait()
    rest = [asyncio.create_task(committer.submit(n)) for n in range(2, 52)]
    await one_loop_turn()
    release.set()
    assert await first == 10
    assert [await t for t in rest] == [n * 10 for n in range(2, 52)]
    assert batches == [[1], list(range(2, 52))]
    await committer.stop()


async def test_batches_respect_max_batch() -> None:
    sizes: list[int] = []

    async def flush(requests: Sequence[int]) -> list[int]:
        sizes.append(len(requests))
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, max_batch=7, linger_s=0)
    committer.start()
    assert await committer.submit_many(list(range(30))) == list(range(30))
    assert max(sizes) <= 7 and sum(sizes) == 30
    await committer.stop()


async def test_a_failed_flush_fails_its_callers_and_the_loop_survives() -> None:
    calls = 0

    async def flush(requests: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database went away")
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    committer.start()
    with pytest.raises(ConnectionError):
        await committer.submit(1)
    assert await committer.submit(2) == 2
    assert committer.failures == 1
    await committer.stop()


async def test_stop_flushes_what_is_queued() -> None:
    seen: list[int] = []

    async def flush(requests: Sequence[int]) -> list[int]:
        seen.extend(requests)
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=10)
    committer.start()
    pending = asyncio.create_task(committer.submit(5))
    await one_loop_turn()
    await committer.stop()
    assert await pending == 5
    assert seen == [5]


async def test_stop_lets_the_flush_under_way_answer_its_callers() -> None:
    # Cancelling a flush midway left its callers without an answer: a settlement whose
    # batch committed got no Receipt at a node's shutdown.
    started = asyncio.Event()
    release = asyncio.Event()

    async def flush(requests: Sequence[int]) -> list[int]:
        started.set()
        await release.wait()
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    committer.start()
    in_flight = asyncio.create_task(committer.submit(1))
    await started.wait()
    queued = asyncio.create_task(committer.submit(2))
    stopping = asyncio.create_task(committer.stop())
    await one_loop_turn()
    assert not stopping.done()
    release.set()
    await stopping
    assert await in_flight == 1
    assert await queued == 2


async def test_stop_gives_up_on_a_flush_that_hangs() -> None:
    async def flush(requests: Sequence[int]) -> list[int]:
        await asyncio.Event().wait()
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    committer.start()
    caller = asyncio.create_task(committer.submit(1))
    await one_loop_turn()
    async with asyncio.timeout(5):  # a stop that waited for the hung flush fails here
        await committer.stop(stop_timeout_s=0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
