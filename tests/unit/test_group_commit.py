"""Group commit batches concurrent callers and answers each with its own result."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from fixtures.loop import one_loop_turn

from chronoshard.scheduler.dispatch.group_commit import GroupCommitter
from chronoshard.scheduler.errors import CommitOutcomeUnknown, CommitterStopped


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


def _recording_committer(*, linger_s: float) -> tuple[GroupCommitter[int, int], list[list[int]]]:
    """A started committer that answers each request with itself, and its batches."""
    batches: list[list[int]] = []

    async def flush(requests: Sequence[int]) -> list[int]:
        batches.append(list(requests))
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=linger_s)
    committer.start()
    return committer, batches


async def test_a_lone_caller_after_a_lone_batch_does_not_linger() -> None:
    """One producer, one request at a time: each is flushed at once, however long the
    linger (an hour here: a linger spent would hang the test until its timeout)."""
    committer, batches = _recording_committer(linger_s=3600)
    async with asyncio.timeout(10):
        for n in range(5):
            assert await committer.submit(n) == n
    assert batches == [[n] for n in range(5)]
    await committer.stop()


async def test_after_a_batch_with_company_the_next_one_lingers() -> None:
    committer, batches = _recording_committer(linger_s=3600)
    async with asyncio.timeout(10):
        # Queued before the flusher first runs: one batch of three, without a linger.
        assert await asyncio.gather(*(committer.submit(n) for n in range(3))) == [0, 1, 2]
    late = asyncio.create_task(committer.submit(9))
    for _ in range(5):
        await one_loop_turn()
    assert batches == [[0, 1, 2]]  # other callers were about: it waits for company
    await committer.stop()  # a stop ends the linger and flushes it
    assert await late == 9
    assert batches == [[0, 1, 2], [9]]


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
    assert committer.get_stats()["failures"] == 1
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


async def test_stop_gives_up_on_a_flush_that_hangs_and_answers_every_caller() -> None:
    started = asyncio.Event()

    async def flush(requests: Sequence[int]) -> list[int]:
        started.set()
        await asyncio.Event().wait()
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    committer.start()
    in_flight = asyncio.create_task(committer.submit(1))
    await started.wait()
    queued = asyncio.create_task(committer.submit(2))
    await one_loop_turn()
    async with asyncio.timeout(5):  # a stop that waited for the hung flush fails here
        await committer.stop(stop_timeout_s=0.05)
    # Both callers are answered (before, they waited for ever): the cut-short batch may
    # have committed; the queued request was never written.
    async with asyncio.timeout(5):
        with pytest.raises(CommitOutcomeUnknown):
            await in_flight
        with pytest.raises(CommitterStopped):
            await queued


async def test_a_stopped_committer_refuses_at_once() -> None:
    flushed: list[int] = []

    async def flush(requests: Sequence[int]) -> list[int]:
        flushed.extend(requests)
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    committer.start()
    assert committer.accepting
    await committer.stop()
    assert not committer.accepting
    # Raised from the call itself (bounded here: before, the call waited for ever).
    async with asyncio.timeout(5):
        with pytest.raises(CommitterStopped) as refused:
            await committer.submit(1)
        with pytest.raises(CommitterStopped):
            await committer.submit_many([2, 3])
    assert flushed == []
    assert refused.value.reason == "NODE_STOPPING" and refused.value.retryable
    assert refused.value.grpc_code_name == "UNAVAILABLE"
    # A second stop, and a start after the stop, change nothing.
    await committer.stop()
    committer.start()
    with pytest.raises(CommitterStopped):
        await committer.submit(4)


async def test_requests_queued_before_a_start_that_never_came_fail_at_stop() -> None:
    async def flush(requests: Sequence[int]) -> list[int]:
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    waiting = asyncio.create_task(committer.submit(1))
    await one_loop_turn()
    assert not waiting.done()
    await committer.stop()
    async with asyncio.timeout(5):
        with pytest.raises(CommitterStopped):
            await waiting


async def test_a_flusher_that_is_gone_fails_the_queued_and_refuses_the_rest() -> None:
    started = asyncio.Event()

    async def flush(requests: Sequence[int]) -> list[int]:
        started.set()
        await asyncio.Event().wait()
        return list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("gone", flush, linger_s=0)
    committer.start()
    in_flight = asyncio.create_task(committer.submit(1))
    await started.wait()
    queued = asyncio.create_task(committer.submit(2))
    await one_loop_turn()
    [flusher] = [t for t in asyncio.all_tasks() if t.get_name() == "group-commit-gone"]
    flusher.cancel()  # ended without a stop, as a crash would end it
    async with asyncio.timeout(5):
        with pytest.raises(CommitOutcomeUnknown):
            await in_flight
        with pytest.raises(CommitterStopped):
            await queued
        assert not committer.accepting
        with pytest.raises(CommitterStopped):
            await committer.submit(3)
    await committer.stop()


async def test_a_flush_that_answers_the_wrong_count_fails_its_batch_only() -> None:
    # Raised out of the flusher, the error ended it: this batch and every later request
    # waited for ever.
    calls = 0

    async def flush(requests: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        return [] if calls == 1 else list(requests)

    committer: GroupCommitter[int, int] = GroupCommitter("t", flush, linger_s=0)
    committer.start()
    async with asyncio.timeout(5):
        with pytest.raises(RuntimeError, match="flush returned 0 for 1"):
            await committer.submit(1)
        assert await committer.submit(2) == 2
    assert committer.get_stats()["failures"] == 1
    await committer.stop()
