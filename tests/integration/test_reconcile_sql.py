"""The reconciler against a real PostgreSQL: every repair of docs/architecture.md#d8, the races it
must lose (a completion or heartbeat between its read and its write, a newer shard
owner), attempt history, workflow runs, and the partial indexes its queries read.

The worker gateway and the dispatcher's wheel are in-process fakes (they answer
``knows`` and collect the tasks handed back); the SQL is real. Time is moved by
backdating rows, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fixtures.rows import session_reports
from fixtures.stores import EPOCH, OWNER, SHARD, submit
from fixtures.waiting import eventually
from psycopg.rows import dict_row

from chronoshard.clock import SystemClock
from chronoshard.scheduler.cluster.reconciler import Reconciler
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.models import Task, Tenant
from chronoshard.scheduler.core.repairs import Repair, decide
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.runs import (
    Beat,
    Completion,
    Failure,
    Intent,
    Release,
    SettleOutcome,
    TimerTask,
)
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.core.states import AttemptState
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.repairs import RepairStore
from chronoshard.scheduler.store.runs import RunStore, batch_keys
from chronoshard.scheduler.store.sessions import WorkerSessionStore

SHARD_COUNT = 8
CONFIG = SchedulerConfig()
ACK_S = CONFIG.workers.ack_timeout_s
MARGIN_S = CONFIG.workers.lease_margin_s

# Repairs write under the shard's epoch, and tests here claim every shard.
pytestmark = pytest.mark.store(own_database=True, owns_shard=True)


class Sessions:
    def __init__(self) -> None:
        self.known: dict[uuid.UUID, bool | None] = {}
        self.superseded: list[tuple[uuid.UUID, int]] = []

    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None:
        return self.known.get(task_id)

    def attempt_superseded(self, task_id: uuid.UUID, token: int) -> None:
        self.superseded.append((task_id, token))


class Wheel:
    def __init__(self) -> None:
        self.ready: list[TimerTask] = []

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None:
        self.ready.extend(tasks)


class Shards:
    def __init__(self, epochs: dict[int, int]) -> None:
        self._epochs = epochs
        self.lost: set[int] = set()

    def epochs(self) -> Mapping[int, int]:
        return self._epochs

    def dispatch_allowed(self) -> bool:
        return True

    def epochs_lost(self, shards: Collection[int]) -> None:
        self.lost.update(shards)


def _reconciler(
    store: Store, sessions: Sessions, wheel: Wheel, epochs: dict[int, int] | None = None
) -> tuple[Reconciler, Shards]:
    shards = Shards(epochs if epochs is not None else {SHARD: EPOCH})
    reconciler = Reconciler(
        CONFIG,
        SystemClock(),
        RepairStore(store),
        shards,
        sessions,
        wheel,
        shard_count=SHARD_COUNT,
    )
    return reconciler, shards


async def _dispatch(runs: RunStore, worker: str = "w1", lease_s: float = 30) -> list[Task]:
    horizon = datetime.now(UTC) + timedelta(seconds=60)
    timers, _ = await runs.load_due({SHARD: EPOCH}, horizon, 100)
    timers += await runs.load_preloaded({SHARD: EPOCH})
    unique = {t.id: t for t in timers}
    result = await runs.write_intents(
        {SHARD: EPOCH}, [Intent(t, worker) for t in unique.values()], lease_s=lease_s
    )
    return result.dispatched


async def _sql(store: Store, query: str, *params: Any) -> list[dict[str, Any]]:
    async with store.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query.encode(), params)  # type: ignore[arg-type]
        return await cur.fetchall() if cur.description else []


async def _row(store: Store, task_id: uuid.UUID) -> dict[str, Any]:
    [row] = await _sql(store, "SELECT * FROM tasks WHERE id = %s", task_id)
    return row


async def _backdate(store: Store, task_id: uuid.UUID, seconds: float) -> None:
    """Move the row's clocks back by ``seconds``: as if that much time had passed since it
    was last touched (the intent or a heartbeat set both)."""
    await _sql(
        store,
        "UPDATE tasks SET updated_at = updated_at - make_interval(secs => %s),"
        " lease_expires_at = lease_expires_at - make_interval(secs => %s) WHERE id = %s",
        seconds,
        seconds,
        task_id,
    )


async def _steady_for_the_ack_timeout(store: Store) -> None:
    """Wait until PostgreSQL has been up for the ack timeout: before that no row counts
    as untouched for it (core/repairs.py, ``Scan.steady_s``), and a row's clocks can be
    moved back (:func:`_backdate`) but not the server's start. A server started for this
    test session is that old after a few seconds."""

    async def up_s() -> bool:
        [row] = await _sql(
            store, "SELECT extract(epoch FROM now() - pg_postmaster_start_time()) AS up_s"
        )
        return float(row["up_s"]) > ACK_S + 0.5

    await eventually(up_s, timeout_s=ACK_S + 5, what="PostgreSQL up for the ack timeout")


async def _expire_lease(store: Store, task_id: uuid.UUID, ago_s: float = MARGIN_S + 1) -> None:
    """The lease ran out ``ago_s`` ago (by default: longer ago than the margin)."""
    await _sql(
        store,
        "UPDATE tasks SET lease_expires_at = now() - make_interval(secs => %s) WHERE id = %s",
        ago_s,
        task_id,
    )


async def test_unacknowledged_dispatch_the_session_never_got_is_redispatched(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    # Not idempotent: the node knows the attempt never ran, so it runs again all the same
    # (a crash between intent and send must not need an operator).
    await _steady_for_the_ack_timeout(store)
    new = await submit(store, tenant)
    [first] = await _dispatch(runs)
    sessions, wheel = Sessions(), Wheel()
    reconciler, _ = _reconciler(store, sessions, wheel)

    sessions.known[new.id] = False
    report = await reconciler.reconcile_once()
    assert report.redispatched == 0, "a fresh intent is not touched (the send may follow)"

    await _backdate(store, new.id, ACK_S + 1)
    sessions.known[new.id] = True
    assert (await reconciler.reconcile_once()).redispatched == 0, "the session has it"

    sessions.known[new.id] = False
    report = await reconciler.reconcile_once()
    assert report.redispatched == 1 and [t.id for t in wheel.ready] == [new.id]
    assert sessions.superseded == [(new.id, first.fencing_token)]
    row = await _row(store, new.id)
    assert (row["status"], row["worker_id"], row["lease_expires_at"]) == ("PRELOADED", None, None)
    assert reconciler.get_stats()["abandoned_unacknowledged"] == 1

    # The next intent gives it a new token and a new attempt; history shows both.
    [second] = await _dispatch(runs, "w2")
    assert (second.fencing_token, second.attempt) == (2, 2)
    attempts = await store.get_attempts(new.id)
    assert [(a.attempt, a.fencing_token, a.state) for a in attempts] == [
        (1, 1, AttemptState.ABANDONED),
        (2, 2, AttemptState.DISPATCHED),
    ]
    assert attempts[0].finished_at is not None and "not acknowledged" in (attempts[0].error or "")


async def test_expired_lease_idempotent_redispatched_non_idempotent_outcome_unknown(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    idem = await submit(store, tenant, idempotent=True)
    plain = await submit(store, tenant)
    young = await submit(store, tenant, idempotent=True)
    await _dispatch(runs)
    for task_id in (idem.id, plain.id):
        await _expire_lease(store, task_id)
    # Expired, but not yet by the margin: its worker may still be stopping it.
    await _expire_lease(store, young.id, ago_s=MARGIN_S / 2)
    sessions, wheel = Sessions(), Wheel()
    sessions.known[plain.id] = True  # its worker's live session here holds it: no matter
    reconciler, _ = _reconciler(store, sessions, wheel)

    report = await reconciler.reconcile_once()
    assert [t.id for t in wheel.ready] == [idem.id]
    assert (report.redispatched, report.outcome_unknown) == (1, 1)
    assert reconciler.outcome_unknown == 1
    assert reconciler.get_stats()["outcome_unknown"] == 1
    # The next pass is due when the young lease's margin is over (about half a margin).
    assert report.next_pass_in_s <= MARGIN_S / 2 + 0.1
    row = await _row(store, plain.id)
    assert (row["status"], row["worker_id"], row["fencing_token"]) == ("OUTCOME_UNKNOWN", "w1", 1)
    assert row["lease_expires_at"] is None and "outcome unknown" in row["last_error"]
    [attempt] = await store.get_attempts(plain.id)
    assert attempt.state is AttemptState.OUTCOME_UNKNOWN and attempt.finished_at is not None
    assert "not idempotent" in (attempt.error or "")
    assert (await _row(store, young.id))["status"] == "DISPATCHED"

    # Held across passes (counted by the gauge), never dispatched again on its own.
    report = await reconciler.reconcile_once()
    assert report.outcome_unknown == 0 and reconciler.outcome_unknown == 1
    assert plain.id not in {t.id for t in wheel.ready}


@pytest.mark.parametrize("settlement", ["complete", "fail", "release"])
async def test_a_late_settlement_of_the_same_attempt_makes_the_outcome_known(
    store: Store, runs: RunStore, tenant: Tenant, settlement: str
) -> None:
    new = await submit(store, tenant, max_retries=1)
    [task] = await _dispatch(runs)
    await _expire_lease(store, new.id)
    reconciler, _ = _reconciler(store, Sessions(), Wheel())
    assert (await reconciler.reconcile_once()).outcome_unknown == 1
    # A stale token is still refused, and changes nothing.
    assert (await runs.complete([Completion(task.ref, 2, None)])).outcomes == {
        new.id: SettleOutcome.STALE_FENCING_TOKEN
    }
    # A late ack says nothing about the outcome: OK, and the row stays held.
    assert await runs.ack([Beat(task.ref, 1, None)]) == {new.id: SettleOutcome.OK}
    assert (await _row(store, new.id))["status"] == "OUTCOME_UNKNOWN"
    if settlement == "complete":
        outcome = (await runs.complete([Completion(task.ref, 1, '{"done": true}')])).outcomes
        expected = ("COMPLETED", AttemptState.SUCCEEDED)
    elif settlement == "fail":
        report = FailureReport(retryable=True, timed_out=False, cancelled=False)
        failed = await runs.fail([Failure(task.ref, 1, "boom", report)], datetime.now(UTC))
        outcome = failed.outcomes
        expected = ("RETRYING", AttemptState.FAILED)
    else:
        outcome, ready = await runs.release(
            [Release(task.ref, 1, None, AttemptState.ABANDONED, "never started")]
        )
        assert [t.id for t in ready] == [new.id]
        expected = ("PRELOADED", AttemptState.ABANDONED)
    assert outcome == {new.id: SettleOutcome.OK}
    row = await _row(store, new.id)
    [attempt] = await store.get_attempts(new.id)
    assert (row["status"], attempt.state) == expected
    # Its repeat is an idempotent OK, as for any settlement.
    if settlement == "complete":
        assert (await runs.complete([Completion(task.ref, 1, None)])).outcomes == {
            new.id: SettleOutcome.OK
        }


async def test_a_heartbeat_for_a_lease_past_its_margin_is_refused(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    """Once lease + margin passed the attempt is the reconciler's, even before a pass ran:
    a worker that did not fence itself is told to stop, the lease is not revived."""
    late = await submit(store, tenant)
    inside = await submit(store, tenant)
    tasks = {t.id: t for t in await _dispatch(runs)}
    await _expire_lease(store, late.id)
    await _expire_lease(store, inside.id, ago_s=MARGIN_S / 2)
    beats = [Beat(tasks[i].ref, 1, None) for i in (late.id, inside.id)]
    update = await runs.extend_leases(beats, lease_s=30, margin_s=MARGIN_S)
    assert update.extended == {inside.id}
    assert (await _row(store, late.id))["lease_expires_at"] < datetime.now(UTC)


async def test_expired_lease_with_a_cancel_request_ends_cancelled(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant)
    [task] = await _dispatch(runs)
    assert (await runs.ack([Beat(task.ref, 1, None)])) == {new.id: SettleOutcome.OK}
    await _sql(
        store,
        "UPDATE tasks SET cancel_requested_at = now(), cancel_reason = 'operator' WHERE id = %s",
        new.id,
    )
    await _expire_lease(store, new.id)
    wheel = Wheel()
    reconciler, _ = _reconciler(store, Sessions(), wheel)
    report = await reconciler.reconcile_once()
    assert report.cancelled == 1 and wheel.ready == []
    row = await _row(store, new.id)
    assert (row["status"], row["last_error"]) == ("CANCELLED", "operator")
    assert row["finished_at"] is not None
    [attempt] = await store.get_attempts(new.id)
    assert attempt.state is AttemptState.CANCELLED


async def test_a_completion_between_the_read_and_the_write_wins(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant, idempotent=True)
    [task] = await _dispatch(runs)
    await _expire_lease(store, new.id)
    wheel = Wheel()
    reconciler, _ = _reconciler(store, Sessions(), wheel)
    repair_store = RepairStore(store)
    real_repair = repair_store.repair

    async def complete_first(epochs: Mapping[int, int], repairs: Sequence[Any]) -> Any:
        # The worker's completion commits after the scan, before the compare-and-set.
        outcome = (
            await runs.complete([Completion(task.ref, task.fencing_token, '{"ok": 1}')])
        ).outcomes
        assert outcome == {new.id: SettleOutcome.OK}
        return await real_repair(epochs, repairs)

    repair_store.repair = complete_first  # type: ignore[method-assign]
    reconciler._runs = repair_store
    report = await reconciler.reconcile_once()
    assert (report.redispatched, report.lost_races) == (0, 1) and wheel.ready == []
    row = await _row(store, new.id)
    assert (row["status"], row["fencing_token"]) == ("COMPLETED", 1)
    [attempt] = await store.get_attempts(new.id)
    assert attempt.state is AttemptState.SUCCEEDED


async def test_a_heartbeat_between_the_read_and_the_write_wins(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant)
    [task] = await _dispatch(runs)
    await _backdate(store, new.id, ACK_S + 1)
    repair_store = RepairStore(store)
    scan = await repair_store.scan_inflight(
        [SHARD], ack_timeout_s=ACK_S, lease_s=30, lease_margin_s=MARGIN_S, limit=10
    )
    [row] = scan.rows
    decision = decide(
        row,
        scan.now,
        ack_timeout_s=ACK_S,
        lease_margin_s=MARGIN_S,
        knows=False,
        steady_s=scan.steady_s,
    )
    assert decision.target is not None, "never delivered, as far as the session knows"
    # The worker had it after all (through a stream this node does not see): its
    # heartbeat lands before the reconciler's write.
    update = await runs.extend_leases([Beat(task.ref, task.fencing_token, None)], lease_s=30)
    assert update.extended == {new.id}
    result = await repair_store.repair({SHARD: EPOCH}, [Repair(row, decision)])
    assert result.applied == frozenset() and result.ready == []
    assert (await _row(store, new.id))["status"] == "DISPATCHED"


async def test_a_newer_shard_owner_fences_the_old_reconciler(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant, idempotent=True)
    await _dispatch(runs)
    await _expire_lease(store, new.id)
    assert await store.claim_shard_epoch(SHARD, EPOCH + 1, "node-b")
    wheel = Wheel()
    reconciler, shards = _reconciler(store, Sessions(), wheel)
    report = await reconciler.reconcile_once()
    assert report.redispatched == 0 and wheel.ready == []
    assert shards.lost == {SHARD}
    assert (await _row(store, new.id))["status"] == "DISPATCHED"


async def test_a_stale_completion_after_redispatch_marks_the_attempt_fenced(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant, idempotent=True)
    [zombie] = await _dispatch(runs, "w-zombie")
    await _expire_lease(store, new.id)
    reconciler, _ = _reconciler(store, Sessions(), Wheel())
    assert (await reconciler.reconcile_once()).redispatched == 1
    [winner] = await _dispatch(runs, "w-winner")
    assert (await runs.complete([Completion(winner.ref, 2, None)])).outcomes == {
        new.id: SettleOutcome.OK
    }
    # The paused worker wakes up and reports under its superseded token.
    assert (await runs.complete([Completion(zombie.ref, 1, None)])).outcomes == {
        new.id: SettleOutcome.STALE_FENCING_TOKEN
    }
    states = [(a.fencing_token, a.state) for a in await store.get_attempts(new.id)]
    assert states == [(1, AttemptState.FENCED), (2, AttemptState.SUCCEEDED)]


async def test_a_revoked_heartbeat_marks_the_abandoned_attempt_fenced(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant, idempotent=True)
    [zombie] = await _dispatch(runs, "w-zombie")
    await _expire_lease(store, new.id)
    reconciler, _ = _reconciler(store, Sessions(), Wheel())
    await reconciler.reconcile_once()
    update = await runs.extend_leases([Beat(zombie.ref, 1, None)], lease_s=30)
    assert update.extended == frozenset()
    assert zombie.fencing_token == 1
    [attempt] = await store.get_attempts(new.id)
    assert attempt.state is AttemptState.FENCED
    assert "lease expired" in (attempt.error or "") and "superseded" in (attempt.error or "")


async def _workflow(store: Store, tenant: Tenant, statuses: list[str]) -> uuid.UUID:
    """A run still marked RUNNING whose tasks are in ``statuses`` (a lost update); its
    tasks at the run's instant, as CreateWorkflow writes them."""
    run_id = uuid.uuid4()
    at = datetime.now(UTC)
    await _sql(
        store,
        "INSERT INTO workflow_runs (id, tenant_id, state, scheduled_at, task_count, edge_count)"
        " VALUES (%s, %s, 'RUNNING', %s, 1, 0)",
        run_id,
        tenant.id,
        at,
    )
    for status in statuses:
        new = await submit(store, tenant, workflow_id=run_id, scheduled_at=at, due_at=at)
        await _sql(store, "UPDATE tasks SET status = %s WHERE id = %s", status, new.id)
    return run_id


async def test_finished_workflow_runs_are_repaired_in_one_pass(
    store: Store, tenant: Tenant
) -> None:
    done = await _workflow(store, tenant, ["COMPLETED", "COMPLETED"])
    failed = await _workflow(store, tenant, ["COMPLETED", "DEAD_LETTER", "UPSTREAM_FAILED"])
    live = await _workflow(store, tenant, ["COMPLETED", "RUNNING"])
    await _sql(store, "UPDATE workflow_runs SET job_id = 'nightly' WHERE id = %s", done)
    epochs = {s: 1 for s in range(SHARD_COUNT)}
    for shard in epochs:
        assert await store.claim_shard_epoch(shard, 1 if shard != SHARD else EPOCH, OWNER)
    epochs[SHARD] = EPOCH
    reconciler, _ = _reconciler(store, Sessions(), Wheel(), epochs)
    report = await reconciler.reconcile_once()
    assert report.runs_finished == 2
    states = {
        r["id"]: (r["state"], r["finished_at"] is not None)
        for r in await _sql(store, "SELECT id, state, finished_at FROM workflow_runs")
    }
    assert states == {
        done: ("SUCCEEDED", True),
        failed: ("FAILED", True),
        live: ("RUNNING", False),
    }
    # Finished by the repair as by a settlement: the succeeded run completed its job.
    ledger = await _sql(store, "SELECT job_id, task_id FROM task_completions")
    assert [(r["job_id"], r["task_id"]) for r in ledger] == [("nightly", done)]


async def test_a_run_is_repaired_only_by_the_owner_of_its_shard(
    store: Store, tenant: Tenant
) -> None:
    run_id = await _workflow(store, tenant, ["COMPLETED"])
    run_shard = shard_of(run_id, SHARD_COUNT)
    others = {s: 1 for s in range(SHARD_COUNT) if s != run_shard}
    for shard in others:
        await store.claim_shard_epoch(shard, 1, OWNER)
    reconciler, _ = _reconciler(store, Sessions(), Wheel(), others)
    assert (await reconciler.reconcile_once()).runs_finished == 0
    [row] = await _sql(store, "SELECT state FROM workflow_runs WHERE id = %s", run_id)
    assert row["state"] == "RUNNING"


# ---- history does not slow the hot queries down: they read only partial indexes -------------


def _scans(plan: Any) -> list[dict[str, Any]]:
    """Every scan node of an EXPLAIN (FORMAT JSON) plan."""
    found = []
    stack = [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        if node["Node Type"].endswith("Scan"):
            found.append(node)
        stack.extend(node.get("Plans", []))
    return found


async def _parent_index(conn: psycopg.AsyncConnection[Any], index: str) -> str:
    """The partitioned index a partition's index belongs to (itself if none)."""
    cur = await conn.execute(
        "SELECT p.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_class p ON p.oid = i.inhparent WHERE c.relname = %s",
        (index,),
    )
    row = await cur.fetchone()
    return str(row[0]) if row else index


async def _rows_in(conn: psycopg.AsyncConnection[Any], relation: str) -> float:
    cur = await conn.execute("SELECT reltuples FROM pg_class WHERE relname = %s", (relation,))
    row = await cur.fetchone()
    return float(row[0]) if row else 0.0


async def test_preloader_and_reconciler_queries_read_only_live_rows(
    store: Store, tenant: Tenant
) -> None:
    """Finding work reads a partial index; writing it back reads only the batch's day
    partitions, however much finished history the others hold."""
    await _sql(store, "SELECT chronoshard_ensure_partitions(current_date - 3, 3)")
    # 80,000 finished tasks over today and the three days before, a few live ones today.
    await _sql(
        store,
        """
        INSERT INTO tasks (id, tenant_id, type, scheduled_at, due_at, status, max_retries,
                           backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode,
                           payload, shard, priority, queue, fencing_token, attempt)
        SELECT gen_random_uuid(), %s, 't', h.at, h.at, 'COMPLETED', 3, 1, 60, 2, 'NONE', '{}',
               g %% 8, 'standard', 'default', 1, 1
        FROM generate_series(1, 80000) AS g
        CROSS JOIN LATERAL (
            SELECT least(now(), date_trunc('day', now()) - make_interval(days => g %% 4)
                                + make_interval(secs => g %% 86400)) AS at
        ) AS h
        """,
        tenant.id,
    )
    live = [await submit(store, tenant, idempotent=True) for _ in range(5)]
    await _sql(store, "ANALYZE tasks")
    refs = batch_keys([n.scheduled_at for n in live], [n.id for n in live])
    dispatch_sql = queries.load("runs.sql")
    reconcile_sql = queries.load("repairs.sql")
    shards = list(range(8))
    finding = {
        "due_refs": (
            dispatch_sql["due_refs"],
            {"shards": shards, "horizon": datetime.now(UTC), "limit": 5000},
            "tasks_preload_idx",
        ),
        "scan_inflight": (
            reconcile_sql["scan_inflight"],
            {"shards": shards, "horizon_s": 20.0, "margin_s": 2.0, "limit": 1000},
            "tasks_inflight_idx",
        ),
        "pass_state": (
            reconcile_sql["pass_state"],
            {"shards": shards, "margin_s": 2.0, "ack_timeout_s": 10.0},
            "tasks_inflight_idx",
        ),
    }
    n = len(live)
    writing = {
        "load_due": (dispatch_sql["load_due"], refs),
        "write_intents": (
            dispatch_sql["write_intents"],
            {**refs, "worker_ids": ["w"] * n, "lease_s": 30, "shards": shards},
        ),
        "complete": (
            dispatch_sql["complete"],
            {**refs, "tokens": [1] * n, "results": [None] * n},
        ),
        "repair": (
            reconcile_sql["repair"],
            {
                **refs,
                "statuses": ["RUNNING"] * n,
                "tokens": [1] * n,
                "updated_ats": [datetime.now(UTC)] * n,
                "targets": ["PRELOADED"] * n,
                "attempt_states": ["ABANDONED"] * n,
                "reasons": ["x"] * n,
                "shards": shards,
            },
        ),
    }
    today = _partition_of(live[0].scheduled_at)
    async with store.connection() as conn:
        for name, (query, bound, index) in finding.items():
            scans = await _plan(conn, query, bound)
            # Empty partitions (future days, DEFAULT) may be read sequentially: nothing there.
            for scan in scans:
                if scan["Node Type"] == "Seq Scan":
                    relation = scan["Relation Name"]
                    assert await _rows_in(conn, relation) <= 0, f"{name} reads {relation} whole"
            indexes = {
                await _parent_index(conn, s["Index Name"]) for s in scans if "Index Name" in s
            }
            used = {i for i in indexes if i.startswith("tasks")}
            assert index in used, f"{name} uses {used}"
            # Row lookups by key may use the primary key or the id index; the gauge's
            # count reads the (empty here) partial index of held tasks.
            allowed = {index, "tasks_pkey", "tasks_id_idx", "tasks_outcome_unknown_idx"}
            assert used <= allowed, f"{name} uses {used}"
        for name, (query, bound) in writing.items():
            # Run (and rolled back): an UPDATE that joins its locked rows by key is pruned
            # per key at run time, so its plan lists every partition and reads one.
            async with conn.transaction(force_rollback=True):
                scans = await _plan(conn, query, bound, analyze=True)
            touched = {
                s["Relation Name"]
                for s in scans
                if "Relation Name" in s and s.get("Actual Loops", 1) > 0
            }
            partitions = {r for r in touched if r.startswith("tasks_")}
            assert partitions == {today}, f"{name} reads {sorted(partitions)}"


def _partition_of(at: datetime) -> str:
    return "tasks_p" + at.astimezone(UTC).strftime("%Y%m%d")


async def _plan(
    conn: psycopg.AsyncConnection[Any],
    query: str,
    params: Mapping[str, Any],
    *,
    analyze: bool = False,
) -> list[dict[str, Any]]:
    explain = b"EXPLAIN (ANALYZE, FORMAT JSON) " if analyze else b"EXPLAIN (FORMAT JSON) "
    cur = await conn.execute(explain + query.encode(), params)
    row = await cur.fetchone()
    assert row is not None
    return _scans(row[0] if not isinstance(row[0], str) else json.loads(row[0]))


async def _ack_due_in(reconcile: RepairStore, shards: list[int]) -> float | None:
    scan = await reconcile.scan_inflight(
        shards, ack_timeout_s=ACK_S, lease_s=30, lease_margin_s=MARGIN_S, limit=10
    )
    return None if scan.next_ack_due is None else (scan.next_ack_due - scan.now).total_seconds()


async def test_the_pass_learns_when_the_oldest_untouched_dispatch_turns_overdue(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    reconcile = RepairStore(store)
    assert await _ack_due_in(reconcile, [SHARD]) is None
    first, second = await submit(store, tenant), await submit(store, tenant)
    await _dispatch(runs)
    await _backdate(store, first.id, 4)
    due_in = await _ack_due_in(reconcile, [SHARD])
    assert due_in is not None and ACK_S - 4 - 1 < due_in <= ACK_S - 4
    await _backdate(store, first.id, ACK_S)  # overdue: the regular passes look at it
    due_in = await _ack_due_in(reconcile, [SHARD])
    assert due_in is not None and ACK_S - 1 < due_in <= ACK_S  # the second one's
    assert await _ack_due_in(reconcile, [SHARD + 1]) is None
    await _sql(store, "UPDATE tasks SET status = 'RUNNING' WHERE id = %s", second.id)
    assert await _ack_due_in(reconcile, [SHARD]) is None


async def test_an_undelivered_intent_is_not_given_back_across_a_failed_call_of_the_store(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    """A call of this node that failed for the database's reasons (here its backend was
    ended under it) may have been an ack or heartbeat of the attempt: the ack timeout
    counts again from then."""
    await _steady_for_the_ack_timeout(store)
    new = await submit(store, tenant)
    await _dispatch(runs)
    await _backdate(store, new.id, ACK_S + 5)
    sessions, wheel = Sessions(), Wheel()
    sessions.known[new.id] = False
    reconciler, _ = _reconciler(store, sessions, wheel)

    with pytest.raises(StoreUnavailable):
        async with store.connection() as conn:
            await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    report = await reconciler.reconcile_once()
    assert report.redispatched == 0 and wheel.ready == []

    # The same row once the failure is an ack timeout old (moved back, as _backdate
    # moves rows): given back.
    store.last_failure_at -= ACK_S
    assert (await reconciler.reconcile_once()).redispatched == 1
    assert [t.id for t in wheel.ready] == [new.id]


async def test_the_loop_wakes_when_an_undelivered_intent_turns_overdue_not_at_the_interval(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    """An intent a crashed owner committed and never sent is given back at intent + ack
    timeout: the loop sleeps until then rather than to its next regular pass (5 s)."""
    await _steady_for_the_ack_timeout(store)
    new = await submit(store, tenant)
    await _dispatch(runs)
    await _backdate(store, new.id, ACK_S - 0.5)
    sessions, wheel = Sessions(), Wheel()
    sessions.known[new.id] = False
    reconciler, _ = _reconciler(store, sessions, wheel)
    assert CONFIG.reconcile.interval_s >= 5
    loop = asyncio.create_task(reconciler.run())
    try:
        await eventually(
            lambda: [t.id for t in wheel.ready] == [new.id],
            timeout_s=3,
            what="the intent given back once its ack timeout ran out",
        )
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    assert reconciler.get_stats()["passes"] == 2


async def test_workers_seen_are_those_with_an_open_session_on_the_given_nodes(
    store: Store,
) -> None:
    sessions = WorkerSessionStore(store)
    await sessions.touch_worker_sessions("node-a", session_reports("w1", "w2"))
    await sessions.touch_worker_sessions("node-b", session_reports("w3"))
    assert await sessions.workers_seen(["node-a", "node-b"], 10) == {"w1", "w2", "w3"}
    assert await sessions.workers_seen(["node-b"], 10) == {"w3"}
    # w2 stopped
    await sessions.touch_worker_sessions("node-a", session_reports("w1"), closed=["w2"])
    assert await sessions.workers_seen(["node-a"], 10) == {"w1"}
    await sessions.touch_worker_sessions("node-a", session_reports("w1", "w2"))  # and came back
    assert await sessions.workers_seen(["node-a"], 10) == {"w1", "w2"}
    await _sql(store, "UPDATE worker_sessions SET last_seen_at = now() - interval '11 s'")
    assert await sessions.workers_seen(["node-a"], 10) == set()  # node-a died: rows aged
    assert await sessions.workers_seen([], 10) == set()
