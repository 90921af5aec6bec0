"""The settlements' group commits (``dispatch/settlements.py``): each kind goes to its own
statement, a batch of heartbeats is one statement answered to each, and what a flush
frees reaches the dispatcher. The store is an in-memory stand-in recording the batches
(the statements themselves are tested against PostgreSQL in tests/integration)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from fixtures.timers import timer_task

from chronoshard.clock import FakeClock
from chronoshard.scheduler.config import WorkersConfig
from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.runs import (
    Beat,
    Completion,
    Failure,
    LeaseUpdate,
    Release,
    Settle,
    SettleOutcome,
    SettleResult,
    TimerTask,
)
from chronoshard.scheduler.core.states import AttemptState
from chronoshard.scheduler.dispatch.settlements import Settlements
from chronoshard.scheduler.errors import CommitOutcomeUnknown, CommitterStopped
from chronoshard.scheduler.store.runs import RunStore

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _ref() -> TaskRef:
    return TaskRef(AT, uuid.uuid4())


class Store:
    """Answers like RunStore and records each statement's batch."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any]]] = []
        self.release_unknown = False

    async def ack(self, acks: Sequence[Settle]) -> dict[uuid.UUID, SettleOutcome]:
        self.calls.append(("ack", list(acks)))
        return {a.ref.id: SettleOutcome.OK for a in acks}

    async def complete(self, done: Sequence[Completion]) -> SettleResult:
        self.calls.append(("complete", list(done)))
        return SettleResult({c.ref.id: SettleOutcome.STALE_FENCING_TOKEN for c in done}, [])

    async def fail(self, failures: Sequence[Failure], now: datetime) -> SettleResult:
        self.calls.append(("fail", list(failures)))
        return SettleResult(
            outcomes={f.ref.id: SettleOutcome.OK for f in failures},
            due=[(3, now)],
        )

    async def release(
        self, releases: Sequence[Release]
    ) -> tuple[dict[uuid.UUID, SettleOutcome], list[TimerTask]]:
        self.calls.append(("release", list(releases)))
        if self.release_unknown:
            raise CommitOutcomeUnknown("the connection died during COMMIT")
        ready = [
            timer_task(id=r.ref.id, scheduled_at=r.ref.scheduled_at, shard=3, strict_timing=False)
            for r in releases
        ]
        return {r.ref.id: SettleOutcome.OK for r in releases}, ready

    async def extend_leases(
        self, beats: Sequence[Beat], lease_s: float, margin_s: float
    ) -> LeaseUpdate:
        self.calls.append(("extend_leases", list(beats)))
        return LeaseUpdate(extended=frozenset(b.ref.id for b in beats), cancel_requested={})


class Listener:
    def __init__(self) -> None:
        self.ready_again: list[TimerTask] = []
        self.retries: list[tuple[int, datetime]] = []
        self.unknown = 0

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None:
        self.ready_again.extend(tasks)

    def task_due(self, shard: int, due_at: datetime) -> None:
        self.retries.append((shard, due_at))

    def preloaded_unknown(self) -> None:
        self.unknown += 1


def _settlements() -> tuple[Settlements, Store, Listener]:
    store, listener = Store(), Listener()
    settlements = Settlements(WorkersConfig(), cast(RunStore, store), FakeClock(AT), listener)
    settlements.start()
    return settlements, store, listener


async def test_each_kind_has_its_statement_and_what_it_frees_reaches_the_dispatcher() -> None:
    settlements, store, listener = _settlements()
    ack, done, failed, released = _ref(), _ref(), _ref(), _ref()
    report = FailureReport(retryable=True, timed_out=False, cancelled=False)

    outcomes = await asyncio.gather(
        settlements.submit(Settle(ack, 1)),
        settlements.submit(Completion(done, 1, None)),
        settlements.submit(Failure(failed, 1, "boom", report)),
        settlements.submit(Release(released, 1, None, AttemptState.RELEASED)),
    )
    await settlements.stop()

    assert outcomes == [
        SettleOutcome.OK,
        SettleOutcome.STALE_FENCING_TOKEN,
        SettleOutcome.OK,
        SettleOutcome.OK,
    ]
    assert sorted((kind, [s.ref for s in batch]) for kind, batch in store.calls) == sorted(
        [
            ("ack", [ack]),
            ("complete", [done]),
            ("fail", [failed]),
            ("release", [released]),
        ]
    )
    assert listener.retries == [(3, AT)]
    assert [t.id for t in listener.ready_again] == [released.id]


async def test_concurrent_heartbeats_share_one_statement_and_each_gets_the_answer() -> None:
    settlements, store, _ = _settlements()
    first, second = [Beat(_ref(), 1, None)], [Beat(_ref(), 1, None), Beat(_ref(), 2, None)]

    updates = await asyncio.gather(settlements.heartbeat(first), settlements.heartbeat(second))
    await settlements.stop()

    assert [kind for kind, _ in store.calls] == ["extend_leases"]
    assert store.calls[0][1] == first + second
    assert updates[0] == updates[1]
    assert settlements.get_stats() == {
        "heartbeats": 2,
        "heartbeat_statements": 1,
        "leases_extended": 3,
    }


async def test_a_release_of_unknown_outcome_has_the_preloaded_rows_read_back() -> None:
    settlements, store, listener = _settlements()
    store.release_unknown = True

    with pytest.raises(CommitOutcomeUnknown):
        await settlements.submit(Release(_ref(), 1, None, AttemptState.RELEASED))
    await settlements.stop()

    assert listener.unknown == 1
    assert listener.ready_again == []


async def test_once_stopped_every_kind_refuses_at_once() -> None:
    settlements, store, _ = _settlements()
    assert settlements.accepting
    await settlements.stop()

    assert not settlements.accepting
    with pytest.raises(CommitterStopped):
        await settlements.submit(Settle(_ref(), 1))
    with pytest.raises(CommitterStopped):
        await settlements.heartbeat([Beat(_ref(), 1, None)])
    assert store.calls == []
