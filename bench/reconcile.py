"""Benchmark: the reconcile pass and the preloader query while finished history grows.

The scheduler's periodic statements must cost what the *live* work costs, not what the
table holds (issue 7: "history that does not slow the scheduler down"). This keeps a
fixed live set in the database and grows the finished history around it, from 100,000
to 2,000,000 COMPLETED tasks (each with its attempt row; 1 % of them in finished
workflow runs), spread over the past 29 day partitions. At each size it measures:

* **reconcile pass**: one :meth:`Reconciler.reconcile_once` over all 64 shards, the real
  shell and SQL (scan of in-flight rows, decisions, the compare-and-set repair of the
  rows it gives back, the workflow-run scan). The live set makes every pass do the same
  work: ``held`` expired non-idempotent tasks (read and written to OUTCOME_UNKNOWN),
  ``repaired`` expired idempotent ones (read and written back to PRELOADED; both put back
  in flight between passes, outside the timing), ``running`` tasks with live leases (not
  even read), and ``runs`` active workflow runs (each probed for live tasks);
* **preload query**: the preloader's statements over all 64 shards (``RunStore.
  load_due``: epochs locked, ``limit`` due rows found among ``scheduled`` waiting ones,
  then moved), in a transaction that is rolled back, so every run moves the same rows.

A shared 2-core machine's other load moves such timings by more than the ±25 % the issue
allows, so every pass is paired with the same pass on a **control** database holding the
same live set and no history, run right before or after it. The table shows the median
and 95th percentile of the passes, and the median of the pairwise ratios pass ÷ control
pass ("÷ no history": 1.0 means history costs nothing); flatness is judged on that
ratio. Also shown: the index names from ``EXPLAIN`` (partition indexes reported as their
partitioned parent) and any sequential scan of a tasks or attempts relation that holds
rows.

Run ``python bench/reconcile.py [--sizes 100000,500000,1000000,2000000] [--passes 20]
[--dsn DSN] [--json PATH]``. Without ``--dsn`` (or ``CHRONOSHARD_TEST_DSN``) it starts an
embedded PostgreSQL; either way it works in two databases of its own, dropped afterwards.
:func:`run_benchmark` is the importable entry point (the smoke test runs it tiny).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from chronoshard.clock import SystemClock
from chronoshard.scheduler.cluster.reconciler import Reconciler
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.migrate import apply_migrations
from chronoshard.scheduler.store.repairs import RepairStore
from chronoshard.scheduler.store.runs import batch_keys
from chronoshard.services import PostgresServer

DEFAULT_SIZES = (100_000, 500_000, 1_000_000, 2_000_000)
SHARDS = 64
EPOCH = 1
NODE = "bench-node"
LIVE_WORKER = "bench-worker-alive"
GONE_WORKER = "bench-worker-gone"
HISTORY_DAYS = 29
FLAT_BOUND = 0.25  # the issue: flat within ±25 %
WARMUP_PASSES = 5


@dataclass(frozen=True)
class LiveSet:
    """The work that stays the same while history grows."""

    running: int = 2000
    held: int = 300
    repaired: int = 100
    scheduled: int = 5000
    runs: int = 100
    preload_limit: int = 5000


@dataclass
class Result:
    history_rows: int
    reconcile_median_ms: float
    reconcile_p95_ms: float
    reconcile_control_ms: float
    """Median of the same pass on the control database (the live set, no history)."""
    reconcile_ratio: float
    """Median of the pairwise ratios pass / control pass: 1.0 is "history costs nothing"."""
    preload_median_ms: float
    preload_p95_ms: float
    preload_control_ms: float
    preload_ratio: float
    reconcile_indexes: list[str]
    preload_indexes: list[str]
    sequential_scans: list[str]
    examined: int
    repaired: int
    held: int
    preloaded: int


# ---- the database ------------------------------------------------------------------------

SETUP_SQL = [
    """
SELECT chronoshard_ensure_partitions((now() AT TIME ZONE 'UTC')::date - %(days)s, %(days)s + 3)
""",
    """
INSERT INTO tenants (id, name, tier, rate_limit_rps, max_concurrent_workers, home_region,
                     api_key_hash)
VALUES (%(tenant)s, 'bench', 'standard', 1e6, 1000000, 'local', 'bench-' || %(tenant)s::text)
""",
    """
INSERT INTO shard_owners (shard, epoch, node_id)
SELECT s, %(epoch)s, %(node)s FROM generate_series(0, %(shards)s - 1) AS s
""",
]

# One statement per kind of live row; every one is named "bench-live-<kind>" in its type.
LIVE_SQL = """
INSERT INTO tasks (id, tenant_id, type, scheduled_at, due_at, status, max_retries,
                   backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload,
                   shard, priority, queue, idempotent, lease_expires_at, worker_id,
                   fencing_token, attempt, workflow_id)
SELECT gen_random_uuid(), %(tenant)s, 'bench-live-' || %(kind)s,
       now() + make_interval(secs => %(due_in_s)s + (g %% 3600)),
       now() + make_interval(secs => %(due_in_s)s + (g %% 3600)),
       %(status)s, 3, 1, 60, 2, 'NONE', '{}', g %% %(shards)s, 'standard', 'default',
       %(idempotent)s, now() + make_interval(secs => %(lease_in_s)s), %(worker)s,
       %(token)s, %(token)s, NULL
FROM generate_series(1, %(count)s) AS g;
"""

LIVE_ATTEMPTS_SQL = """
INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state, worker_id)
SELECT id, attempt, scheduled_at, fencing_token, status, worker_id
FROM tasks WHERE type LIKE 'bench-live-%%' AND status IN ('DISPATCHED', 'RUNNING');
"""

# Active workflow runs, three live tasks each (due in two days: outside the preloader's
# hour, not in flight, but the run scan must look at them).
RUNS_SQL = """
WITH runs AS (
    INSERT INTO workflow_runs (id, tenant_id, state, scheduled_at, task_count, edge_count)
    SELECT gen_random_uuid(), %(tenant)s, 'RUNNING', now() + interval '2 days', 3, 0
    FROM generate_series(1, %(runs)s)
    RETURNING id
)
INSERT INTO tasks (id, tenant_id, type, scheduled_at, due_at, status, max_retries,
                   backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload,
                   shard, priority, queue, workflow_id)
SELECT gen_random_uuid(), %(tenant)s, 'bench-live-workflow', now() + interval '2 days',
       now() + interval '2 days', 'SCHEDULED', 3, 1, 60, 2, 'NONE', '{}',
       (random() * (%(shards)s - 1))::int, 'standard', 'default', runs.id
FROM runs CROSS JOIN generate_series(1, 3);
"""

# Finished history: COMPLETED tasks over the past days (today's partition excluded, so the
# live rows' partition stays small as it would be), each with its SUCCEEDED attempt, 1 %
# in finished workflow runs (one run per 100 such tasks).
HISTORY_SQL = """
WITH runs AS (
    INSERT INTO workflow_runs (id, tenant_id, state, finished_at, scheduled_at, task_count,
                               edge_count)
    SELECT gen_random_uuid(), %(tenant)s, 'SUCCEEDED', now(), now(), 100, 0
    FROM generate_series(1, greatest(1, %(count)s / 10000))
    RETURNING id
), run_list AS (
    SELECT array_agg(id) AS ids FROM runs
), inserted AS (
    INSERT INTO tasks (id, tenant_id, type, scheduled_at, due_at, status, max_retries,
                       backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode,
                       payload, result_payload, shard, priority, queue, fencing_token,
                       attempt, worker_id, started_at, finished_at, workflow_id)
    SELECT gen_random_uuid(), %(tenant)s, 'bench-history', h.at, h.at, 'COMPLETED', 3, 1,
           60, 2, 'NONE', '{"n": 1}', '{"ok": true}', g %% %(shards)s, 'standard',
           'default', 1, 1, 'w-history', h.at, h.at + interval '1 second',
           CASE WHEN g %% 100 = 0
                THEN (SELECT ids[1 + (g / 100) %% cardinality(ids)] FROM run_list) END
    FROM generate_series(1, %(count)s) AS g
    CROSS JOIN LATERAL (
        SELECT date_trunc('day', now()) - make_interval(days => 1 + g %% %(days)s)
               + make_interval(secs => (g * 7919) %% 86400) AS at
    ) AS h
    RETURNING id, scheduled_at
)
INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state, worker_id,
                           finished_at)
SELECT id, 1, scheduled_at, 1, 'SUCCEEDED', 'w-history', scheduled_at + interval '1 second'
FROM inserted;
"""

# Put the tasks a pass gave back in flight again (outside the timing).
RESET_REPAIRED_SQL = """
WITH reset AS (
    UPDATE tasks
    SET status = CASE WHEN type = 'bench-live-held' THEN 'RUNNING' ELSE 'DISPATCHED' END,
        lease_expires_at = now() - interval '1 minute',
        worker_id = %(gone)s, updated_at = now()
    WHERE (type = 'bench-live-repaired' AND status = 'PRELOADED')
       OR (type = 'bench-live-held' AND status = 'OUTCOME_UNKNOWN')
    RETURNING id, attempt, status
)
UPDATE task_attempts AS a
SET state = reset.status, finished_at = NULL, error = NULL
FROM reset
WHERE a.task_id = reset.id AND a.attempt = reset.attempt;
"""

PARENT_INDEX_SQL = """
SELECT coalesce(p.relname, c.relname)
FROM pg_class c
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
LEFT JOIN pg_class p ON p.oid = i.inhparent
WHERE c.relname = %s
"""


def _live(conn: psycopg.Connection[Any], tenant: uuid.UUID, live: LiveSet) -> None:
    kinds = [
        # kind, count, status, idempotent, lease in s, worker, due in s
        ("running", live.running, "RUNNING", False, 3600, LIVE_WORKER, -60),
        ("held", live.held, "RUNNING", False, -60, LIVE_WORKER, -60),
        ("repaired", live.repaired, "DISPATCHED", True, -60, GONE_WORKER, -60),
        ("scheduled", live.scheduled, "SCHEDULED", False, 0, None, 0),
    ]
    for kind, count, status, idempotent, lease_in_s, worker, due_in_s in kinds:
        conn.execute(
            LIVE_SQL,
            {
                "tenant": tenant,
                "kind": kind,
                "count": count,
                "status": status,
                "idempotent": idempotent,
                "lease_in_s": lease_in_s,
                "worker": worker,
                "due_in_s": due_in_s,
                "token": 0 if status == "SCHEDULED" else 1,
                "shards": SHARDS,
            },
        )
    # Scheduled rows have no lease and no worker.
    conn.execute(
        "UPDATE tasks SET lease_expires_at = NULL, worker_id = NULL"
        " WHERE type = 'bench-live-scheduled'"
    )
    conn.execute(LIVE_ATTEMPTS_SQL)
    conn.execute(RUNS_SQL, {"tenant": tenant, "runs": live.runs, "shards": SHARDS})


def _grow_history(conn: psycopg.Connection[Any], tenant: uuid.UUID, count: int) -> None:
    # In chunks: one huge statement would hold a multi-gigabyte transaction for minutes.
    chunk = 250_000
    for start in range(0, count, chunk):
        conn.execute(
            HISTORY_SQL,
            {
                "tenant": tenant,
                "count": min(chunk, count - start),
                "shards": SHARDS,
                "days": HISTORY_DAYS,
            },
        )
    conn.execute("VACUUM (ANALYZE) tasks")
    conn.execute("VACUUM (ANALYZE) task_attempts")
    conn.execute("VACUUM (ANALYZE) workflow_runs")


def _plan_indexes(
    conn: psycopg.Connection[Any], query: str, params: Mapping[str, Any]
) -> tuple[list[str], list[str]]:
    """(parent index names, relations with rows read sequentially) of ``query``'s plan."""
    row = conn.execute(
        ("EXPLAIN (FORMAT JSON) " + query).encode(),
        params,  # type: ignore[arg-type]
    ).fetchone()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    indexes: set[str] = set()
    sequential: set[str] = set()
    stack = [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        if "Index Name" in node:
            parent = conn.execute(PARENT_INDEX_SQL, (node["Index Name"],)).fetchone()
            indexes.add(str(parent[0]) if parent else node["Index Name"])
        if node["Node Type"] == "Seq Scan":
            relation = node["Relation Name"]
            tuples = conn.execute(
                "SELECT reltuples FROM pg_class WHERE relname = %s", (relation,)
            ).fetchone()
            if tuples is not None and tuples[0] > 0:
                sequential.add(relation)
    return sorted(indexes), sorted(sequential)


def _plans(
    conn: psycopg.Connection[Any], statements: Sequence[tuple[str, Mapping[str, Any]]]
) -> tuple[list[str], list[str]]:
    indexes: set[str] = set()
    sequential: set[str] = set()
    for query, params in statements:
        found, seq = _plan_indexes(conn, query, params)
        indexes.update(found)
        sequential.update(seq)
    # History lives in tasks and task_attempts: a sequential read of those is the finding.
    return (
        sorted(i for i in indexes if i.startswith("tasks")),
        sorted(s for s in sequential if s.startswith("task")),
    )


def _refs(conn: psycopg.Connection[Any], kind: str, limit: int) -> dict[str, list[Any]]:
    rows = conn.execute(
        "SELECT scheduled_at, id, updated_at FROM tasks WHERE type = %s LIMIT %s",
        (f"bench-live-{kind}", limit),
    ).fetchall()
    return {
        **batch_keys([r[0] for r in rows], [r[1] for r in rows]),
        "updated_ats": [r[2] for r in rows],
    }


def _reconcile_statements(conn: psycopg.Connection[Any]) -> list[tuple[str, Mapping[str, Any]]]:
    sql = queries.load("repairs.sql")
    refs = _refs(conn, "held", 100)
    n = len(refs["ids"])
    return [
        (
            sql["scan_inflight"],
            {
                "shards": list(range(SHARDS)),
                "horizon_s": 20.0,
                "margin_s": 2.0,
                "limit": 1000,
            },
        ),
        (
            sql["repair"],
            {
                **refs,
                "statuses": ["RUNNING"] * n,
                "tokens": [1] * n,
                "targets": ["PRELOADED"] * n,
                "attempt_states": ["ABANDONED"] * n,
                "reasons": ["bench"] * n,
                "shards": list(range(SHARDS)),
            },
        ),
    ]


def _preload_statements(
    conn: psycopg.Connection[Any], live: LiveSet
) -> list[tuple[str, Mapping[str, Any]]]:
    sql = queries.load("runs.sql")
    refs = _refs(conn, "scheduled", live.preload_limit)
    return [
        (sql["due_refs"], _due_params(live)),
        (sql["load_due"], batch_keys(refs["scheduled_ats"], refs["ids"])),
    ]


# ---- the reconciler's surroundings ----------------------------------------------------------


class _Shards:
    def epochs(self) -> Mapping[int, int]:
        return {s: EPOCH for s in range(SHARDS)}

    def dispatch_allowed(self) -> bool:
        return True

    def epochs_lost(self, shards: Collection[int]) -> None:
        raise AssertionError(f"the bench owns every shard, lost {sorted(shards)}")


class _Sessions:
    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None:
        return None

    def attempt_superseded(self, task_id: uuid.UUID, token: int) -> None:
        pass


class _Wheel:
    def __init__(self) -> None:
        self.ready = 0

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None:
        self.ready += len(tasks)


def _due_params(live: LiveSet) -> dict[str, Any]:
    return {
        "shards": list(range(SHARDS)),
        "horizon": datetime.now(UTC) + timedelta(hours=1),
        "limit": live.preload_limit,
    }


def _p95(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


@dataclass
class _Target:
    """One database the passes run against: the one whose history grows, or the control."""

    store: Store
    reconciler: Reconciler
    live: LiveSet
    examined: int = 0
    repaired: int = 0
    held: int = 0
    preloaded: int = 0

    async def reconcile_pass(self) -> float:
        started = time.perf_counter()
        report = await self.reconciler.reconcile_once()
        elapsed = time.perf_counter() - started
        self.examined, self.repaired = report.examined, report.redispatched
        self.held = report.outcome_unknown
        async with self.store.connection() as conn:
            await conn.execute(RESET_REPAIRED_SQL, {"gone": GONE_WORKER})
        return elapsed

    async def preload_pass(self) -> float:
        sql = queries.load("runs.sql")
        async with self.store.connection() as conn, conn.transaction(force_rollback=True):
            # RunStore.load_due's transaction, rolled back so every run moves the
            # same rows: epochs locked, due rows found and locked, then moved.
            started = time.perf_counter()
            await self.store.owned_shards(conn, dict.fromkeys(range(SHARDS), EPOCH))
            cur = await conn.execute(sql["due_refs"], _due_params(self.live))
            due = await cur.fetchall()
            cur = await conn.execute(
                sql["load_due"],
                batch_keys([r[0] for r in due], [r[1] for r in due]),
            )
            self.preloaded = len(await cur.fetchall())
            return time.perf_counter() - started


@asynccontextmanager
async def _target(dsn: str, live: LiveSet) -> AsyncIterator[_Target]:
    async with await Store.open(dsn, min_size=1, max_size=2) as store:
        reconciler = Reconciler(
            SchedulerConfig(),
            SystemClock(),
            RepairStore(store),
            _Shards(),
            _Sessions(),
            _Wheel(),
            shard_count=SHARDS,
        )
        yield _Target(store, reconciler, live)


@dataclass
class _Samples:
    history: list[float]
    control: list[float]

    @property
    def ratio(self) -> float:
        """Median of the pairwise ratios history/control: each pair ran back to back, so
        whatever else loads the machine weighs on both alike."""
        return statistics.median(h / c for h, c in zip(self.history, self.control, strict=True))


async def _measure(
    dsn: str, control_dsn: str, passes: int, live: LiveSet
) -> tuple[_Samples, _Samples, _Target]:
    reconcile = _Samples([], [])
    preload = _Samples([], [])
    async with _target(dsn, live) as history, _target(control_dsn, live) as control:
        for kind, samples in (("reconcile", reconcile), ("preload", preload)):
            # The first passes of a fresh pool prepare statements and warm caches.
            for i in range(WARMUP_PASSES + passes):
                # Alternate which goes first, so neither always runs on a warmer cache.
                order = (history, control) if i % 2 == 0 else (control, history)
                times = {}
                for target in order:
                    run = target.reconcile_pass if kind == "reconcile" else target.preload_pass
                    times[id(target)] = await run()
                if i >= WARMUP_PASSES:
                    samples.history.append(times[id(history)])
                    samples.control.append(times[id(control)])
    return reconcile, preload, history


def _prepare(conn: psycopg.Connection[Any], live: LiveSet) -> uuid.UUID:
    tenant = uuid.uuid4()
    setup = {
        "days": HISTORY_DAYS + 1,
        "tenant": tenant,
        "epoch": EPOCH,
        "node": NODE,
        "shards": SHARDS,
    }
    for statement in SETUP_SQL:
        conn.execute(statement.encode(), setup)  # type: ignore[arg-type]
    _live(conn, tenant, live)
    conn.execute("VACUUM (ANALYZE) tasks")
    return tenant


def run_benchmark(
    dsn: str,
    control_dsn: str,
    sizes: Sequence[int],
    *,
    passes: int = 20,
    live: LiveSet | None = None,
) -> list[Result]:
    """Grow the history of the (migrated, empty) database at ``dsn`` through ``sizes``
    and measure at each, alternating every pass with the same pass on ``control_dsn``
    (another migrated, empty database, given the same live set and no history)."""
    live = live or LiveSet()
    results: list[Result] = []
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(control_dsn, autocommit=True) as control,
    ):
        tenant = _prepare(conn, live)
        _prepare(control, live)
        grown = 0
        for size in sorted(sizes):
            _grow_history(conn, tenant, size - grown)
            grown = size
            reconcile, preload, target = asyncio.run(_measure(dsn, control_dsn, passes, live))
            reconcile_indexes, seq_a = _plans(conn, _reconcile_statements(conn))
            preload_indexes, seq_b = _plans(conn, _preload_statements(conn, live))
            history = conn.execute(
                "SELECT count(*) FROM tasks WHERE status = 'COMPLETED'"
            ).fetchone()
            results.append(
                Result(
                    history_rows=int(history[0]) if history else 0,
                    reconcile_median_ms=statistics.median(reconcile.history) * 1000,
                    reconcile_p95_ms=_p95(reconcile.history) * 1000,
                    reconcile_control_ms=statistics.median(reconcile.control) * 1000,
                    reconcile_ratio=reconcile.ratio,
                    preload_median_ms=statistics.median(preload.history) * 1000,
                    preload_p95_ms=_p95(preload.history) * 1000,
                    preload_control_ms=statistics.median(preload.control) * 1000,
                    preload_ratio=preload.ratio,
                    reconcile_indexes=reconcile_indexes,
                    preload_indexes=preload_indexes,
                    sequential_scans=sorted(set(seq_a) | set(seq_b)),
                    examined=target.examined,
                    repaired=target.repaired,
                    held=target.held,
                    preloaded=target.preloaded,
                )
            )
            print(_row(results[-1]), flush=True, file=sys.stderr)
    return results


# ---- reporting ---------------------------------------------------------------------------

HEADER = (
    "| finished rows | reconcile pass median (p95) | ÷ no history "
    "| rows read / repaired / held | reconcile plan | preload query median (p95) "
    "| ÷ no history | rows preloaded | preload plan | seq scans of non-empty tables |\n"
    "|---:|---:|---:|---:|---|---:|---:|---:|---|---|"
)


def _row(r: Result) -> str:
    return (
        f"| {r.history_rows:,} | {r.reconcile_median_ms:.1f} ms ({r.reconcile_p95_ms:.1f}) "
        f"| {r.reconcile_ratio:.2f} | {r.examined} / {r.repaired} / {r.held} "
        f"| {', '.join(r.reconcile_indexes)} "
        f"| {r.preload_median_ms:.1f} ms ({r.preload_p95_ms:.1f}) | {r.preload_ratio:.2f} "
        f"| {r.preloaded} | {', '.join(r.preload_indexes)} "
        f"| {', '.join(r.sequential_scans) or 'none'} |"
    )


def flatness(results: Sequence[Result]) -> dict[str, float]:
    """Largest relative change of the cost ratio (pass ÷ the same pass without history)
    from the smallest size's: the growth that history itself adds, with the machine's
    other load divided out."""
    first = results[0]
    return {
        "reconcile": max(abs(r.reconcile_ratio / first.reconcile_ratio - 1) for r in results),
        "preload": max(abs(r.preload_ratio / first.preload_ratio - 1) for r in results),
    }


def render(results: Sequence[Result], command: str, live: LiveSet, passes: int) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {platform.platform()}; {os.cpu_count()} cores; "
        f"CPython {platform.python_version()}.",
        f"Live set: {live.running} running (lease valid), {live.held} held, "
        f"{live.repaired} repaired per pass, {live.scheduled} scheduled "
        f"(preload limit {live.preload_limit}), {live.runs} active workflow runs; "
        f"{SHARDS} shards; {passes} passes per size.",
        "",
        HEADER,
        *(_row(r) for r in results),
    ]
    if len(results) > 1:
        spread = flatness(results)
        verdict = {k: "flat" if v <= FLAT_BOUND else "NOT flat" for k, v in spread.items()}
        lines += [
            "",
            f"Largest change of the ratio to no history from the smallest size's: "
            f"reconcile {spread['reconcile']:.0%} "
            f"({verdict['reconcile']}), preload {spread['preload']:.0%} "
            f"({verdict['preload']}); bound ±{FLAT_BOUND:.0%}.",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(s) for s in text.split(",")],
        default=list(DEFAULT_SIZES),
        help="finished-history sizes, comma separated",
    )
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--dsn", default=os.environ.get("CHRONOSHARD_TEST_DSN"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "bench/reconcile.py", *(argv or sys.argv[1:])])
    live = LiveSet()
    names = [f"chronoshard_bench_reconcile_{k}_{secrets.token_hex(4)}" for k in ("h", "c")]
    with PostgresServer(dsn=args.dsn or None) as server:
        for name in names:
            server.create_database(name)
        try:
            dsns = [server.dsn_for(name) for name in names]
            for dsn in dsns:
                apply_migrations(dsn)
            results = run_benchmark(dsns[0], dsns[1], args.sizes, passes=args.passes, live=live)
        finally:
            for name in names:
                server.drop_database(name)
    print(render(results, command, live, args.passes))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "reconcile",
                    "command": command,
                    "live": asdict(live),
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
