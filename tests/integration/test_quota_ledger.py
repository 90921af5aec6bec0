"""The cluster-wide quota check of the dispatch rounds against a real PostgreSQL: two
"nodes" (two stores and run stores, each owning a shard of its own) write intents for one
tenant at once, and between them never take it past its concurrency or its rate; what
is in flight is counted from the rows, so settling frees a slot and a limit changed in
the tenants table applies at the next round. A tenant far from its limits is dispatched
under allowances (rounds that do not check it): the other nodes' checks hold those back,
so the concurrency still holds, and an allowance expired or replaced is refused. The e2e
test (tests/e2e/test_quotas.py) checks the same with three scheduler processes.
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
        yield Node(
            other, RunStore(other, DispatchQuotaStore(other, "node-b")), OTHER_SHARD, OTHER_EPOCH
        )


@pytest.fixture
def first_node(store: Store) -> Node:
    """The store fixture's node: it owns SHARD."""
    return Node(store, RunStore(store, DispatchQuotaStore(store, "node-a")), SHARD, EPOCH)


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


async def _allowances(store: Store, tenant: Tenant) -> dict[str, int]:
    """Each node's live allowance for ``tenant`` (attempts), as the database has it."""
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT node_id, attempts FROM tenant_dispatch_allowances"
            " WHERE tenant_id = %s AND expires_at > clock_timestamp()",
            (tenant.id,),
        )
        return {str(node): int(attempts) for node, attempts in await cur.fetchall()}


async def test_a_tenant_far_from_its_limits_is_dispatched_under_an_allowance(
    store: Store, first_node: Node, second_node: Node
) -> None:
    tenant = await _tenant(store, rate=1000.0, concurrency=1000)
    timers = await first_node.preloaded(tenant, 10)
    checked = await first_node.write(timers[:5])
    assert len(checked.dispatched) == 5 and tenant.id in checked.quotas
    # Half the headroom left (995 tasks, 995 tokens), split over the two nodes that own
    # shards here.
    assert await _allowances(store, tenant) == {"node-a": 248}
    under = await first_node.write(timers[5:])
    assert len(under.dispatched) == 5 and tenant.id not in under.quotas  # not checked
    assert await _in_flight(store, tenant) == 10


async def test_the_other_nodes_checks_hold_back_what_an_allowance_may_still_start(
    store: Store, first_node: Node, second_node: Node
) -> None:
    """Node A's first round is checked and grants A an allowance; node B's check must
    leave room for all of it, so that A's rounds under it cannot take the tenant past
    its concurrency (without counting it, B would take 59 and A then 14 more)."""
    tenant = await _tenant(store, rate=1000.0, concurrency=60)
    mine = await first_node.preloaded(tenant, 15)
    theirs = await second_node.preloaded(tenant, 60)
    assert len((await first_node.write(mine[:1])).dispatched) == 1
    granted = (await _allowances(store, tenant))["node-a"]
    assert granted == 14  # (60 - 1) / 2 halved, over two nodes
    b = await second_node.write(theirs)
    assert len(b.dispatched) == 60 - 1 - granted
    assert b.quotas[tenant.id].held_by is HeldBy.CONCURRENCY
    a = await first_node.write(mine[1:])
    assert len(a.dispatched) == granted and tenant.id not in a.quotas
    assert await _in_flight(store, tenant) == 60


async def test_rounds_of_two_nodes_under_allowances_at_once_never_exceed_the_concurrency(
    store: Store, first_node: Node, second_node: Node
) -> None:
    tenant = await _tenant(store, rate=100_000.0, concurrency=150)
    mine = await first_node.preloaded(tenant, 200)
    theirs = await second_node.preloaded(tenant, 200)

    async def rounds(node: Node, timers: list[TimerTask]) -> tuple[int, int]:
        written = checked = 0
        for i in range(0, len(timers), 5):
            result = await node.write(timers[i : i + 5])
            written += len(result.dispatched)
            checked += tenant.id in result.quotas
        return written, checked

    (a, a_checked), (b, b_checked) = await asyncio.gather(
        rounds(first_node, mine), rounds(second_node, theirs)
    )
    assert a + b == await _in_flight(store, tenant) <= 150
    assert a_checked < 40 and b_checked < 40  # most rounds went under an allowance


async def test_an_allowance_expired_or_replaced_is_refused(
    store: Store, first_node: Node, fresh_db_dsn: str
) -> None:
    tenant = await _tenant(store, rate=1000.0, concurrency=1000)
    timers = await first_node.preloaded(tenant, 8)
    await first_node.write(timers[:1])
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE tenant_dispatch_allowances SET expires_at = clock_timestamp()"
            " WHERE tenant_id = %s",
            (tenant.id,),
        )
    expired = await first_node.write(timers[1:3])
    assert expired.dispatched == [] and expired.unwritten == {t.id for t in timers[1:3]}
    # Refused once: the next round is checked, and grants anew.
    assert len((await first_node.write(timers[1:3])).dispatched) == 2
    # Another store with the same node id (a restarted node while the old one lingers)
    # replaces the grant: the old holder's next round under it is refused.
    async with await Store.open(fresh_db_dsn, min_size=1, max_size=1) as again:
        successor = Node(again, RunStore(again, DispatchQuotaStore(again, "node-a")), SHARD, EPOCH)
        assert len((await successor.write(timers[3:4])).dispatched) == 1
    replaced = await first_node.write(timers[4:6])
    assert replaced.dispatched == [] and tenant.id not in replaced.quotas
    assert len((await first_node.write(timers[4:6])).dispatched) == 2


async def test_changed_limits_are_checked_at_the_next_round_not_spent_from_an_allowance(
    store: Store, first_node: Node
) -> None:
    tenant = await _tenant(store, rate=1000.0, concurrency=1000)
    timers = await first_node.preloaded(tenant, 6)
    await first_node.write(timers[:2])
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE tenants SET max_concurrent_workers = 3 WHERE id = %s", (tenant.id,)
        )
    first_node.runs.limits_changed(tenant.id)  # what the node does when it hears of it
    after = await first_node.write(timers[2:])
    assert len(after.dispatched) == 1 and after.quotas[tenant.id].held_by is HeldBy.CONCURRENCY
