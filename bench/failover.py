"""Failover benchmark: SIGKILL a scheduler and time how long its shards stay dark.

Three scheduler processes and two worker processes on this machine, real etcd and
PostgreSQL. Tasks are due at a steady rate; a third of the way in, the node owning the
most shards is SIGKILLed. Reported, per etcd lease TTL:

* **first dispatch** — SIGKILL to the first attempt written for a task of an orphaned
  shard (the takeover: lease expiry + claim + epoch + reload + dispatch);
* **catch-up** — SIGKILL to the moment every task due before the takeover on those
  shards has been dispatched (the backlog drained);
* whether every task completed exactly once.

Usage: ``python -m bench.failover [--ttl 5 10] [--tasks 3000] [--spread 20] [--json PATH]``
(from the repository root, with the dev extra installed). Uses ``CHRONOSHARD_TEST_DSN``
when set, else an embedded PostgreSQL; starts its own etcd.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from harness.history import History, Violations, check
from harness.processes import ProcessGroup, SchedulerHandle

from bench._standalone import (
    bench_tenant,
    local_infrastructure,
    print_results,
    process_group,
    scratch,
)
from chronoshard import Client, SubmitResult, TaskSpec

REPO = Path(__file__).resolve().parent.parent
SHARDS = 32
NODES = 3
WORKERS = 2
SUBMIT_BATCH = 1000
# Submits and the nodes' preloading get this long before the first task is due.
LEAD_IN_S = 4.0
# How long past the last due time the run waits for every task to complete.
COMPLETION_GRACE_S = 120.0
SPREAD_TIMEOUT_S = 60.0


def _scheduler_env(ttl_s: float) -> dict[str, str]:
    return {
        "CHRONOSHARD_ETCD__LEASE_TTL_S": str(ttl_s),
        "CHRONOSHARD_ETCD__SELF_FENCE_MARGIN_S": "1",
        "CHRONOSHARD_WORKERS__TASK_LEASE_S": "10",
        "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "2",
        "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": "3",
    }


async def run_once(
    dsn: str, etcd_endpoint: str, ttl_s: float, tasks: int, spread_s: float, log_dir: Path
) -> dict[str, Any]:
    """One run at lease TTL ``ttl_s``, on a migrated database with the effects ledger
    (:meth:`bench._cluster.Infrastructure.database`); the row of the table."""
    api_key = bench_tenant(dsn)
    group = process_group(log_dir, dsn, etcd_endpoint, _scheduler_env(ttl_s), shard_count=SHARDS)
    try:
        nodes = _start_cluster(group, dsn, api_key)
        await _wait_spread(dsn)
        history = History()
        start = datetime.now(UTC) + timedelta(seconds=LEAD_IN_S)
        specs = _spread_specs(start, tasks, spread_s)
        ids = await _submit(specs, [n.address for n in nodes], api_key, history)
        await asyncio.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + spread_s / 3)
        # Who owns what right now, not at start-up: shards may have moved since.
        victim, orphaned = _busiest(await _wait_spread(dsn))
        killed_at = datetime.now(UTC)
        next(n for n in nodes if n.process.name == victim).process.kill()
        await _wait_completed(dsn, ids, timeout_s=spread_s + COMPLETION_GRACE_S)
        first, caught_up = _takeover_times(dsn, killed_at, ttl_s, orphaned, ids)
        violations = check(dsn, history.acknowledged(), job_ledger=False)
        return _row(ttl_s, tasks, orphaned, killed_at, first, caught_up, violations)
    finally:
        group.close()


def _start_cluster(group: ProcessGroup, dsn: str, api_key: str) -> list[SchedulerHandle]:
    """The scheduler nodes, and the workers (``e2e_workers``) connected to all of them."""
    nodes = [group.start_scheduler(f"node-{i + 1}") for i in range(NODES)]
    targets = [n.address for n in nodes]
    for i in range(WORKERS):
        group.start_worker(
            f"worker-{i + 1}",
            "e2e_workers:worker",
            targets,
            pythonpath=REPO / "tests" / "e2e",
            E2E_DSN=dsn,
            CHRONOSHARD_API_KEY=api_key,
        )
    return nodes


def _spread_specs(start: datetime, tasks: int, spread_s: float) -> list[TaskSpec]:
    """``tasks`` strict, idempotent recording tasks due evenly over ``spread_s`` from
    ``start``."""
    return [
        TaskSpec(
            type="e2e.record",
            payload={"i": i},
            at=start + timedelta(seconds=spread_s * i / tasks),
            strict_timing=True,
            idempotent=True,
        )
        for i in range(tasks)
    ]


async def _submit(
    specs: list[TaskSpec], targets: list[str], api_key: str, history: History
) -> list[uuid.UUID]:
    """Submit in batches, each recorded in ``history``; the ids accepted."""
    ids: list[uuid.UUID] = []
    async with Client(targets, api_key=api_key) as client:
        for chunk in range(0, len(specs), SUBMIT_BATCH):
            op = history.invoke("submit_batch")
            results = await client.submit_batch(specs[chunk : chunk + SUBMIT_BATCH])
            batch = [uuid.UUID(r.task.id) for r in results if isinstance(r, SubmitResult)]
            History.finish(op, "ok", batch)
            ids += batch
    return ids


def _busiest(owners: dict[int, str]) -> tuple[str, list[int]]:
    """The node owning the most shards, and those shards in order."""
    by_node: dict[str, set[int]] = {}
    for shard, node in owners.items():
        by_node.setdefault(node, set()).add(shard)
    victim = max(by_node, key=lambda n: len(by_node[n]))
    return victim, sorted(by_node[victim])


async def _wait_completed(dsn: str, ids: list[uuid.UUID], timeout_s: float) -> None:
    """Until every task completed or ``timeout_s`` passed (the check reports the rest)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'COMPLETED'",
                (ids,),
            ).fetchone()
        if row and row[0] == len(ids):
            break
        await asyncio.sleep(0.5)


def _takeover_times(
    dsn: str, killed_at: datetime, ttl_s: float, orphaned: list[int], ids: list[uuid.UUID]
) -> tuple[datetime | None, datetime | None]:
    """The first attempt on an orphaned shard after the kill, and the last one for a
    task due before the takeover could have happened (kill + TTL)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            """
            SELECT min(a.entered_at),
                   max(a.entered_at)
                       FILTER (WHERE t.due_at <= %(k)s + make_interval(secs => %(ttl)s))
            FROM task_attempts a JOIN tasks t ON t.id = a.task_id
            WHERE t.shard = ANY(%(shards)s) AND t.id = ANY(%(ids)s) AND a.entered_at > %(k)s
            """,
            {"k": killed_at, "ttl": ttl_s, "shards": orphaned, "ids": ids},
        ).fetchone()
    assert row is not None  # an aggregate without GROUP BY: always one row
    return row[0], row[1]


def _row(
    ttl_s: float,
    tasks: int,
    orphaned: list[int],
    killed_at: datetime,
    first: datetime | None,
    caught_up: datetime | None,
    violations: Violations,
) -> dict[str, Any]:
    return {
        "ttl_s": ttl_s,
        "tasks": tasks,
        "orphaned_shards": len(orphaned),
        "first_dispatch_s": (first - killed_at).total_seconds() if first else None,
        "catch_up_s": (caught_up - killed_at).total_seconds() if caught_up else None,
        "exactly_once": not violations,
        "violations": violations.summary(),
    }


async def _wait_spread(dsn: str) -> dict[int, str]:
    """Shard → node once every shard is owned and each node holds about a third."""
    deadline = time.monotonic() + SPREAD_TIMEOUT_S
    while time.monotonic() < deadline:
        with psycopg.connect(dsn) as conn:
            owners: dict[int, str] = dict(
                conn.execute("SELECT shard, node_id FROM shard_owners").fetchall()
            )
        load = [list(owners.values()).count(n) for n in set(owners.values())]
        if len(owners) == SHARDS and len(load) == NODES and min(load) >= SHARDS // NODES - 1:
            return owners
        await asyncio.sleep(0.2)
    raise TimeoutError("shards never spread over three nodes")


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| lease TTL | tasks | orphaned shards | SIGKILL → first dispatch "
        "| SIGKILL → catch-up | exactly once |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        first = f"{r['first_dispatch_s']:.2f} s" if r["first_dispatch_s"] is not None else "—"
        catch = f"{r['catch_up_s']:.2f} s" if r["catch_up_s"] is not None else "—"
        lines.append(
            f"| {r['ttl_s']:g} s | {r['tasks']} | {r['orphaned_shards']} | {first} | {catch} | "
            f"{'yes' if r['exactly_once'] else 'NO: ' + r['violations']} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with local_infrastructure() as infra:
        for ttl in args.ttl:
            with scratch(infra, "failover") as (dsn, logs):
                results.append(
                    await run_once(dsn, infra.etcd_endpoint, ttl, args.tasks, args.spread, logs)
                )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ttl", type=float, nargs="+", default=[5.0, 10.0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--spread", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = asyncio.run(main_async(args))
    print_results("bench.failover", results, table(results), args.json)
    return 0 if all(r["exactly_once"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
