"""Two reconcilers over one shard at the same moment never dispatch a task twice.

Hypothesis draws interleavings of everything that touches a shard's in-flight rows, and
runs each against a real PostgreSQL:

* two reconcilers, A and B, each a real :class:`Reconciler` whose pass is split in two
  steps — *begin* (scan and decide, then stop just before its compare-and-set) and
  *end* (write) — so another actor's step can land in the gap. B is either a second
  pass of the same owner (same epoch: a pass that overran its interval) or the old
  owner in a handoff (a superseded epoch);
* each node's dispatcher writing intents for what its reconciler handed back;
* a worker acknowledging or completing the live attempt, and a zombie completing with
  a superseded token;
* time passing (every in-flight lease expires).

After every step: no task has two live attempts (DISPATCHED/RUNNING), the live attempt
is the one holding the task's token, attempts and tokens count up one by one, a
completed task has exactly one SUCCEEDED attempt (its last), no attempt was given up
(ABANDONED) unless its lease had run out — a reconciler writing on a stale read would
abandon the attempt the other one just dispatched, which then runs twice — and the
superseded owner never wrote or dispatched anything.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import uvloop
from fixtures.stores import insert_tasks, new_tenant
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chronoshard.clock import SystemClock
from chronoshard.scheduler.cluster.reconciler import Reconciler
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import NewTask, TaskRef, Tenant
from chronoshard.scheduler.core.repairs import Repair, RepairResult, RunCandidate, RunOutcome, Scan
from chronoshard.scheduler.core.runs import Completion, Intent, Settle, TimerTask
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.repairs import RepairStore
from chronoshard.scheduler.store.runs import RunStore

SHARD = 5
EPOCH = 40
TASKS = 3
CONFIG = SchedulerConfig()


class GatedRuns:
    """The real store, with the pass held between its scan and its write."""

    def __init__(self, inner: RepairStore) -> None:
        self._inner = inner
        self.at_gate = asyncio.Event()
        self.gate = asyncio.Event()

    async def scan_inflight(self, shards: Collection[int], **kwargs: Any) -> Scan:
        return await self._inner.scan_inflight(shards, **kwargs)

    async def repair(self, epochs: Mapping[int, int], repairs: Sequence[Repair]) -> RepairResult:
        self.at_gate.set()
        await self.gate.wait()
        return await self._inner.repair(epochs, repairs)

    async def scan_runs(
        self, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[RunCandidate]:
        return []

    async def finish_runs(
        self, epochs: Mapping[int, int], outcomes: Sequence[RunOutcome]
    ) -> tuple[list[uuid.UUID], frozenset[int]]:
        raise AssertionError("no workflow runs here")


class NoSessions:
    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None:
        return None

    def attempt_superseded(self, task_id: uuid.UUID, token: int) -> None:
        pass


@dataclass
class Node:
    """A node's reconciler and dispatcher, over one shard at ``epoch``."""

    name: str
    epoch: int
    runs: GatedRuns
    reconciler: Reconciler
    ready: list[TimerTask] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)
    dispatched: int = 0
    pass_task: asyncio.Task[Any] | None = None

    # Shards
    def epochs(self) -> Mapping[int, int]:
        return {SHARD: self.epoch}

    def dispatch_allowed(self) -> bool:
        return True

    def epochs_lost(self, shards: Collection[int]) -> None:
        self.lost.update(shards)

    # Wheel
    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None:
        self.ready.extend(tasks)


def _node(store: Store, name: str, epoch: int) -> Node:
    runs = GatedRuns(RepairStore(store))
    node = Node(name, epoch, runs, reconciler=None)  # type: ignore[arg-type]
    node.reconciler = Reconciler(
        CONFIG, SystemClock(), runs, node, NoSessions(), node, shard_count=SHARD + 1
    )
    return node


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as opened:
        yield opened


@dataclass
class World:
    store: Store
    runs: RunStore
    tenant: Tenant


@pytest.fixture(scope="module")
def world(runner: asyncio.Runner, db_dsn: str) -> Iterator[World]:
    async def open_world() -> World:
        store = await Store.open(db_dsn, min_size=2, max_size=6)
        assert await store.claim_shard_epoch(SHARD, EPOCH, "node-a")
        tenant = await new_tenant(store, rate_limit_rps=1e6, max_concurrent_workers=1000)
        return World(store, RunStore(store), tenant)

    opened = runner.run(open_world())
    try:
        yield opened
    finally:
        runner.run(opened.store.close())


# Reconciler and dispatcher steps are the interesting ones: weighted up.
_NODE_STEPS = ["A.begin", "A.end", "B.begin", "B.end", "A.dispatch", "B.dispatch"] * 3
_WORKER_STEPS = [(kind, i) for kind in ("ack", "complete", "zombie") for i in range(TASKS)]
STEPS = st.lists(
    st.sampled_from([*_NODE_STEPS, "expire", "expire", "expire", *_WORKER_STEPS]),
    min_size=4,
    max_size=24,
)
# The race the compare-and-set exists for, spelled out: B reads an expired attempt, A
# gives it up and dispatches it again, then B writes what it decided on its stale read.
STALE_WRITE = ["expire", "B.begin", "A.begin", "A.end", "A.dispatch", "B.end"]


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(steps=STALE_WRITE, b_superseded=False, idempotent=[True] * TASKS)
@example(steps=STALE_WRITE, b_superseded=True, idempotent=[True] * TASKS)
@given(
    steps=STEPS,
    b_superseded=st.booleans(),
    idempotent=st.lists(st.booleans(), min_size=TASKS, max_size=TASKS),
)
def test_two_reconcilers_never_dispatch_a_task_twice(
    runner: asyncio.Runner,
    world: World,
    steps: list[Any],
    b_superseded: bool,
    idempotent: list[bool],
) -> None:
    runner.run(_play(world, steps, b_superseded, idempotent))


async def _play(world: World, steps: list[Any], b_superseded: bool, idempotent: list[bool]) -> None:
    store = world.store
    a = _node(store, "A", EPOCH)
    b = _node(store, "B", EPOCH - 1 if b_superseded else EPOCH)
    nodes = {"A": a, "B": b}
    ids = await _in_flight_tasks(world, idempotent)
    expired: set[tuple[uuid.UUID, int]] = set()
    try:
        for step in steps:
            if step == "expire":
                expired |= await _live_attempts(store, ids)
            await _step(world, nodes, ids, step)
            await _check(store, ids, expired)
    finally:
        for node in nodes.values():
            node.runs.gate.set()
            if node.pass_task is not None:
                await node.pass_task
    await _check(store, ids, expired)
    if b_superseded:
        # The old owner wrote nothing and dispatched nothing.
        assert b.ready == [] and b.dispatched == 0
        assert b.reconciler.get_stats()["redispatched"] == 0


async def _in_flight_tasks(world: World, idempotent: list[bool]) -> list[uuid.UUID]:
    """TASKS new tasks of the shard, dispatched once (token 1) to worker w1."""
    now = datetime.now(UTC)
    news = [
        NewTask(
            id=new_task_id(),
            type="t",
            scheduled_at=now,
            due_at=now - timedelta(seconds=1),
            shard=SHARD,
            payload={},
            jitter_mode=JitterMode.NONE,
            idempotent=flag,
        )
        for flag in idempotent
    ]
    await insert_tasks(world.store, world.tenant.id, news)
    ids = [n.id for n in news]
    timers = [t for t in await _preload(world) if t.id in set(ids)]
    result = await world.runs.write_intents(
        {SHARD: EPOCH}, [Intent(t, "w1") for t in timers], lease_s=30
    )
    assert len(result.dispatched) == TASKS
    return ids


async def _preload(world: World) -> list[TimerTask]:
    horizon = datetime.now(UTC) + timedelta(seconds=60)
    timers, _ = await world.runs.load_due({SHARD: EPOCH}, horizon, 1000)
    return timers


async def _step(world: World, nodes: dict[str, Node], ids: list[uuid.UUID], step: Any) -> None:
    store, runs = world.store, world.runs
    if isinstance(step, tuple):
        kind, index = step
        row = await _task(store, ids[index])
        ref = TaskRef(row["scheduled_at"], row["id"])
        if kind == "ack":
            await runs.ack([Settle(ref, row["fencing_token"])])
        elif kind == "complete":
            await runs.complete([Completion(ref, row["fencing_token"], None)])
        elif row["fencing_token"] > 1:
            await runs.complete([Completion(ref, row["fencing_token"] - 1, None)])
        return
    if step == "expire":
        async with store.connection() as conn:
            await conn.execute(
                "UPDATE tasks SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = ANY(%s) AND status IN ('DISPATCHED', 'RUNNING')",
                (ids,),
            )
        return
    name, action = step.split(".")
    node = nodes[name]
    if action == "begin" and node.pass_task is None:
        node.runs.at_gate.clear()
        node.runs.gate.clear()
        node.pass_task = asyncio.create_task(node.reconciler.reconcile_once())
        at_gate = asyncio.create_task(node.runs.at_gate.wait())
        await asyncio.wait({node.pass_task, at_gate}, return_when=asyncio.FIRST_COMPLETED)
        at_gate.cancel()
        if node.pass_task.done():  # nothing to repair: the pass is over
            node.pass_task.result()
            node.pass_task = None
    elif action == "end" and node.pass_task is not None:
        node.runs.gate.set()
        await node.pass_task
        node.pass_task = None
    elif action == "dispatch" and node.ready:
        timers, node.ready = node.ready, []
        result = await runs.write_intents(
            {SHARD: node.epoch}, [Intent(t, f"w-{node.name}") for t in timers], lease_s=30
        )
        node.dispatched += len(result.dispatched)


async def _task(store: Store, task_id: uuid.UUID) -> dict[str, Any]:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT id, scheduled_at, status, fencing_token FROM tasks WHERE id = %s", (task_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return dict(zip(("id", "scheduled_at", "status", "fencing_token"), row, strict=True))


async def _live_attempts(store: Store, ids: list[uuid.UUID]) -> set[tuple[uuid.UUID, int]]:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT task_id, fencing_token FROM task_attempts"
            " WHERE task_id = ANY(%s) AND state IN ('DISPATCHED', 'RUNNING')",
            (ids,),
        )
        return {(task_id, token) for task_id, token in await cur.fetchall()}


async def _check(store: Store, ids: list[uuid.UUID], expired: set[tuple[uuid.UUID, int]]) -> None:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT t.id, t.status, t.fencing_token,"
            " array_agg(a.attempt ORDER BY a.attempt),"
            " array_agg(a.fencing_token ORDER BY a.attempt),"
            " array_agg(a.state ORDER BY a.attempt)"
            " FROM tasks t JOIN task_attempts a ON a.task_id = t.id"
            " WHERE t.id = ANY(%s) GROUP BY t.id, t.status, t.fencing_token",
            (ids,),
        )
        rows = await cur.fetchall()
    assert len(rows) == len(ids)
    for task_id, status, token, attempts, tokens, states in rows:
        n = len(attempts)
        assert attempts == list(range(1, n + 1)), (task_id, attempts)
        assert tokens == attempts and token == n, (task_id, token, tokens)
        live = [i for i, s in enumerate(states) if s in ("DISPATCHED", "RUNNING")]
        if status in ("DISPATCHED", "RUNNING"):
            assert live == [n - 1], f"{task_id} {status}: live attempts {states}"
        else:
            assert live == [], f"{task_id} {status}: live attempts {states}"
        if status == "COMPLETED":
            assert states.count("SUCCEEDED") == 1 and states[-1] == "SUCCEEDED", states
        # Only an attempt whose lease ran out is ever given up: a reconciler acting on
        # a stale read must not abandon the attempt another one dispatched meanwhile.
        for attempt_token, state in zip(tokens, states, strict=True):
            if state == "ABANDONED":
                assert (task_id, attempt_token) in expired, (
                    f"{task_id}: attempt {attempt_token} abandoned with a live lease {states}"
                )
