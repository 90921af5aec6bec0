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
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from harness.history import EFFECTS_DDL, History, check  # noqa: E402
from harness.processes import ProcessGroup  # noqa: E402

from chronoshard import Client, SubmitResult, TaskSpec  # noqa: E402
from chronoshard.scheduler.store.migrate import apply_migrations  # noqa: E402
from chronoshard.scheduler.store.tenants import create_tenant  # noqa: E402
from chronoshard.services import EtcdProcess, PostgresServer  # noqa: E402

SHARDS = 32


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


async def run_once(
    dsn: str, etcd: EtcdProcess, ttl_s: float, tasks: int, spread_s: float, log_dir: Path
) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
    api_key = create_tenant(dsn, f"bench-{uuid.uuid4().hex[:8]}").api_key
    group = ProcessGroup(
        log_dir=log_dir,
        dsn=dsn,
        etcd_endpoint=etcd.endpoint,
        cluster=f"bench-{uuid.uuid4().hex[:8]}",
        shard_count=SHARDS,
        scheduler_env={
            "CHRONOSHARD_ETCD__LEASE_TTL_S": str(ttl_s),
            "CHRONOSHARD_ETCD__SELF_FENCE_MARGIN_S": "1",
            "CHRONOSHARD_WORKERS__TASK_LEASE_S": "10",
            "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "2",
            "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": "3",
        },
    )
    try:
        nodes = [group.start_scheduler(f"node-{i + 1}") for i in range(3)]
        targets = [n.address for n in nodes]
        for i in range(2):
            group.start_worker(
                f"worker-{i + 1}",
                "e2e_workers:worker",
                targets,
                pythonpath=REPO / "tests" / "e2e",
                E2E_DSN=dsn,
                CHRONOSHARD_API_KEY=api_key,
            )
        await _wait_spread(dsn)
        history = History()
        start = datetime.now(UTC) + timedelta(seconds=4)
        ids: list[uuid.UUID] = []
        async with Client(targets, api_key=api_key) as client:
            specs = [
                TaskSpec(
                    type="e2e.record",
                    payload={"i": i},
                    at=start + timedelta(seconds=spread_s * i / tasks),
                    strict_timing=True,
                    idempotent=True,
                )
                for i in range(tasks)
            ]
            for chunk in range(0, tasks, 1000):
                op = history.invoke("submit_batch")
                results = await client.submit_batch(specs[chunk : chunk + 1000])
                batch = [uuid.UUID(r.task.id) for r in results if isinstance(r, SubmitResult)]
                History.finish(op, "ok", batch)
                ids += batch
        await asyncio.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + spread_s / 3)
        # Who owns what right now, not at start-up: shards may have moved since.
        by_node: dict[str, set[int]] = {}
        for shard, node in (await _wait_spread(dsn)).items():
            by_node.setdefault(node, set()).add(shard)
        victim = max(by_node, key=lambda n: len(by_node[n]))
        orphaned = sorted(by_node[victim])
        killed_at = datetime.now(UTC)
        next(n for n in nodes if n.process.name == victim).process.kill()
        deadline = time.monotonic() + spread_s + 120
        while time.monotonic() < deadline:
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'COMPLETED'",
                    (ids,),
                ).fetchone()
            if row and row[0] == len(ids):
                break
            await asyncio.sleep(0.5)
        with psycopg.connect(dsn) as conn:
            first, caught_up = conn.execute(
                """
                SELECT min(a.entered_at),
                       max(a.entered_at)
                           FILTER (WHERE t.due_at <= %(k)s + make_interval(secs => %(ttl)s))
                FROM task_attempts a JOIN tasks t ON t.id = a.task_id
                WHERE t.shard = ANY(%(shards)s) AND t.id = ANY(%(ids)s) AND a.entered_at > %(k)s
                """,
                {"k": killed_at, "ttl": ttl_s, "shards": orphaned, "ids": ids},
            ).fetchone()
        violations = check(dsn, history.acknowledged(), job_ledger=False)
        return {
            "ttl_s": ttl_s,
            "tasks": tasks,
            "orphaned_shards": len(orphaned),
            "first_dispatch_s": (first - killed_at).total_seconds() if first else None,
            "catch_up_s": (caught_up - killed_at).total_seconds() if caught_up else None,
            "exactly_once": not violations,
            "violations": violations.summary(),
        }
    finally:
        group.close()


async def _wait_spread(dsn: str) -> dict[int, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with psycopg.connect(dsn) as conn:
            owners = dict(conn.execute("SELECT shard, node_id FROM shard_owners").fetchall())
        load = [list(owners.values()).count(n) for n in set(owners.values())]
        if len(owners) == SHARDS and len(load) == 3 and min(load) >= SHARDS // 3 - 1:
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
    dsn_env = os.environ.get("CHRONOSHARD_TEST_DSN")
    with PostgresServer(dsn=dsn_env or None, fsync=False) as server, EtcdProcess() as etcd:
        for ttl in args.ttl:
            name = f"bench_failover_{uuid.uuid4().hex[:8]}"
            server.create_database(name)
            try:
                dsn = server.dsn_for(name)
                apply_migrations(dsn)
                with tempfile.TemporaryDirectory() as logs:
                    results.append(
                        await run_once(dsn, etcd, ttl, args.tasks, args.spread, Path(logs))
                    )
            finally:
                server.drop_database(name)
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
    print(f"machine: {machine()}")
    print(f"command: python -m bench.failover {' '.join(sys.argv[1:])}")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "results": results}, indent=2))
    return 0 if all(r["exactly_once"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
