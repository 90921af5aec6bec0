"""The cluster-wide quota check of the dispatch rounds against a real PostgreSQL: two
"nodes" (two stores and run stores, each owning a shard of its own) write intents for one
tenant at once, and between them never take it past its concurrency or its rate; what
is in flight is counted from the rows, so settling frees a slot and a limit changed in
the tenants table applies at the next round. The e2e test (tests/e2e/test_quotas.py)
checks the same with three scheduler processes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from fixtures.cli_runs import run
from fixtures.stores import EPOCH, SHARD, insert_tasks, new_task, new_tenant

from chronoshard import cli
from chronoshard.scheduler.cluster.signals import CHANNEL, TENANTS_CHANGED
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.core.quotas import HeldBy
from chronoshard.scheduler.core.runs import Completion, Intent, IntentResult, TimerTask
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.quotas import DispatchQuotaStore
from chronoshard.scheduler.store.runs import RunStore

pytestmark = pytest.mark.store(own_database=True, owns_shard=True)

OTHER_SHARD = SHARD + 1
OTHER_EPOCH = EPOCH + 7


async def _tenant(store: Store, rate: float, concurrency: int) -> Tenant:
    return await new_tenant(store, rate_limit_rps=rate, max_concurrent_workers=concurrency)


@dataclass(frozen=True)
class Node:
    """One node's dispatch path: its pool, its run store (with quotas), its shard."""

    store: Store
    runs: RunStore
    shard: int
    epoch: int

    async def preloaded(self, tenant: Tenant, n: int) -> list[TimerTask]:
        """``n`` new tasks of ``tenant`` on this node's shard, PRELOADED."""
        await insert_tasks(self.store, tenant.id, [new_task(shard=self.shard) for _ in range(n)])
        horizon = datetime.now(UTC) + timedelta(seconds=60)
        timers, lost = await self.runs.load_due({self.shard: self.epoch}, horizon, 1000)
        assert not lost
        return [t for t in timers if t.tenant_id == tenant.id]

    async def write(self, timers: list[TimerTask]) -> IntentResult:
        return await self.runs.write_intents(
            {self.shard: self.epoch}, [Intent(t, "w") for t in timers], 30
        )


async def _in_flight(store: Store, tenant: Tenant) -> int:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM tasks"
            " WHERE tenant_id = %s AND status IN ('DISPATCHED', 'RUNNING')",
            (tenant.id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
async def second_node(store: Store, fresh_db_dsn: str) -> AsyncIterator[Node]:
    """Another node's dispatch path: its own pool, owning OTHER_SHARD."""
    async with await Store.open(fresh_db_dsn, min_size=1, max_size=2) as other:
        assert await other.claim_shard_epoch(OTHER_SHARD, OTHER_EPOCH, "node-b")
        yield Node(other, RunStore(other, DispatchQuotaStore(other)), OTHER_SHARD, OTHER_EPOCH)


@pytest.fixture
def first_node(store: Store) -> Node:
    """The store fixture's node: it owns SHARD."""
    return Node(store, RunStore(store, DispatchQuotaStore(store)), SHARD, EPOCH)


async def test_two_nodes_rounds_at_once_never_exceed_the_tenants_concurrency(
    store: Store, first_node: Node, second_node: Node
) -> None:
    tenant = await _tenant(store, rate=1000.0, concurrency=3)
    mine = await first_node.preloaded(tenant, 5)
    theirs = await second_node.preloaded(tenant, 5)

    a, b = await asyncio.gather(
        first_node.write(mine),
        second_node.write(theirs),
    )

    assert len(a.dispatched) + len(b.dispatched) == 3
    assert await _in_flight(store, tenant) == 3
    # Whoever went second was told the cluster-wide count, and the refused are unwritten.
    assert max(a.quotas[tenant.id].in_flight, b.quotas[tenant.id].in_flight) == 3
    for result, chosen in ((a, mine), (b, theirs)):
        assert result.unwritten == {t.id for t in chosen} - {t.id for t in result.dispatched}


async def test_settling_frees_a_slot_whichever_node_dispatched_it(
    store: Store, first_node: Node, second_node: Node
) -> None:
    tenant = await _tenant(store, rate=1000.0, concurrency=2)
    mine = await first_node.preloaded(tenant, 2)
    theirs = await second_node.preloaded(tenant, 2)
    dispatched = (await first_node.write(mine)).dispatched
    assert len(dispatched) == 2
    refused = await second_node.write(theirs)
    assert refused.dispatched == [] and refused.quotas[tenant.id].held_by is HeldBy.CONCURRENCY

    # Settled through any node (here the second's store): the rows say the slot is free.
    done = dispatched[0]
    await second_node.runs.complete([Completion(done.ref, done.fencing_token, None)])
    again = await second_node.write(theirs)
    assert len(again.dispatched) == 1 and again.quotas[tenant.id].in_flight == 2


async def test_the_rate_is_one_bucket_for_every_node(
    store: Store, first_node: Node, second_node: Node
) -> None:
    tenant = await _tenant(store, rate=4.0, concurrency=100)
    mine = await first_node.preloaded(tenant, 6)
    theirs = await second_node.preloaded(tenant, 6)

    a = await first_node.write(mine)
    b = await second_node.write(theirs)

    # A full bucket holds one second's worth (4), shared by both nodes.
    assert len(a.dispatched) + len(b.dispatched) <= 4 + 1
    answer = b.quotas[tenant.id]
    assert answer.held_by is HeldBy.RATE and 0 < answer.wait_s <= 1 / 4 + 0.05


async def test_a_changed_limit_applies_at_the_next_round(store: Store, first_node: Node) -> None:
    tenant = await _tenant(store, rate=1000.0, concurrency=1)
    timers = await first_node.preloaded(tenant, 4)
    assert len((await first_node.write(timers)).dispatched) == 1
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE tenants SET max_concurrent_workers = 3 WHERE id = %s", (tenant.id,)
        )
    left = [t for t in timers if t.id not in await _dispatched_ids(store, tenant)]
    assert len((await first_node.write(left)).dispatched) == 2


async def test_waiting_reason_reads_what_holds_the_tenant(store: Store, first_node: Node) -> None:
    quotas = DispatchQuotaStore(store)
    full = await _tenant(store, rate=1000.0, concurrency=1)
    assert await quotas.held_by(full.id) is None  # never dispatched
    await first_node.write(await first_node.preloaded(full, 1))
    assert await quotas.held_by(full.id) is HeldBy.CONCURRENCY

    # A round refused for it is remembered for a while, whatever the count says since.
    busy = await _tenant(store, rate=1000.0, concurrency=1)
    [done] = (await first_node.write(await first_node.preloaded(busy, 2))).dispatched
    await first_node.runs.complete([Completion(done.ref, done.fencing_token, None)])
    assert await _in_flight(store, busy) == 0
    assert await quotas.held_by(busy.id) is HeldBy.CONCURRENCY

    slow = await _tenant(store, rate=0.5, concurrency=100)
    await first_node.write(await first_node.preloaded(slow, 3))
    assert await quotas.held_by(slow.id) is HeldBy.RATE
    assert await quotas.held_by(uuid.uuid4()) is None


async def test_tenants_update_changes_the_quotas_and_signals_the_nodes(
    fresh_db_dsn: str, capsys: pytest.CaptureFixture[str], no_cli_env: None
) -> None:
    db = ("--dsn", fresh_db_dsn)
    made = await run(capsys, "tenants", "create", "acme", "--rate-limit-rps", "5", *db)
    assert made.code == 0
    with psycopg.connect(fresh_db_dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        updated = await run(
            capsys,
            "tenants",
            "update",
            "acme",
            "--max-concurrent",
            "7",
            "--submit-rate-limit-rps",
            "50",
            *db,
            "-o",
            "json",
        )
        assert updated.code == 0, updated.err
        assert updated.json()["rate_limit_rps"] == 5.0  # not named: kept
        assert updated.json()["max_concurrent_workers"] == 7
        assert updated.json()["submit_rate_limit_rps"] == 50.0
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [TENANTS_CHANGED]

    # --rotate with limit flags sets them (it used to ignore them silently).
    rotated = await run(
        capsys, "tenants", "create", "acme", "--rotate", "--rate-limit-rps", "9", *db
    )
    assert rotated.code == 0
    cleared = await run(capsys, "tenants", "update", "acme", "--no-submit-rate-limit", *db)
    assert cleared.code == 0 and "submits/s unlimited" in cleared.out
    listed = await run(capsys, "tenants", "ls", *db, "-o", "json")
    [acme] = [t for t in listed.json() if t["name"] == "acme"]
    assert (acme["rate_limit_rps"], acme["max_concurrent_workers"]) == (9.0, 7)
    assert acme["submit_rate_limit_rps"] is None

    nothing = await run(capsys, "tenants", "update", "acme", *db)
    assert nothing.code == cli.EXIT_USAGE and "nothing to change" in nothing.err
    with pytest.raises(SystemExit) as zero:  # argparse refuses it, as every bad argument
        await run(capsys, "tenants", "update", "acme", "--rate-limit-rps", "0", *db)
    assert zero.value.code == cli.EXIT_USAGE
    missing = await run(capsys, "tenants", "update", "nobody", "--max-concurrent", "1", *db)
    assert missing.code == cli.EXIT_NOT_FOUND and "does not exist" in missing.err


async def _dispatched_ids(store: Store, tenant: Tenant) -> set[uuid.UUID]:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM tasks WHERE tenant_id = %s AND status = 'DISPATCHED'", (tenant.id,)
        )
        return {row[0] for row in await cur.fetchall()}
