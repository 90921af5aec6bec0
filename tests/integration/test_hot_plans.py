"""The hot path's statements find a batch's rows by their whole key, whatever the
statistics say.

Every task of a stampede shares one ``scheduled_at`` (every ``:00`` is one). While the
primary key was ``(scheduled_at, id)``, a plan that used only its ``scheduled_at`` walked
the whole stampede for every batch: one settlement of 200 tasks read 100,000 rows, and a
stampede that ran at thousands of tasks per second fell to hundreds (issue 14). PostgreSQL
chose such a plan when its statistics were taken before the stampede's rows existed (the
one ANALYZE of a new day partition) and autovacuum is off, which is how this test sets
the partition up: 100,000 tasks at one instant (the issue's size: with a few thousand, a
scan of the partition is honestly cheaper than 200 probes, and PostgreSQL takes it). It
runs each statement under ``EXPLAIN ANALYZE`` (rolled back) and counts the rows its scans
of ``tasks`` looked at: a few per key, never the stampede. Each runs twice: planned for
the values given (a custom plan, as psycopg's first executions of a statement are), and
prepared with a generic plan, made without the values, as the dispatch path's
transactions run them once prepared (``database.GENERIC_PLANS``): a generic plan cannot
lean on a value's statistics, and must find the keys all the same.

What keeps them there (``runs.sql``'s header, migration 0010; ``repairs.sql``'s repair is
written the same way): the key leads with ``id``, so no index reads an instant; every
batch statement locks its rows key by key (``CROSS JOIN LATERAL (... LIMIT 1 FOR
UPDATE)``) and checks token and state on the row as locked, outside the lookup, so its
``UPDATE`` names rows by key alone and no partial index of a state (believed by stale
statistics to hold 3 rows) can drive it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fixtures.stores import SHARD, insert_tasks, new_task
from psycopg import sql

from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import GENERIC_PLANS, Store

pytestmark = pytest.mark.store(own_database=True, owns_shard=True)

STAMPEDE = 100_000
BATCH = 200
SCANS_PER_KEY = 3
"""A statement may read a key's row more than once (lock it, then update it)."""

KEY_STATEMENTS = {
    ("runs.sql", "load_due"): "SCHEDULED",
    ("runs.sql", "write_intents"): "PRELOADED",
    ("runs.sql", "intent_outcomes"): "DISPATCHED",
    ("runs.sql", "ack"): "DISPATCHED",
    ("runs.sql", "extend_leases"): "RUNNING",
    ("runs.sql", "complete"): "RUNNING",
    ("runs.sql", "lock_for_failure"): "RUNNING",
    ("runs.sql", "apply_failures"): "RUNNING",
    ("runs.sql", "release"): "RUNNING",
    ("runs.sql", "settlement_state"): "RUNNING",
    ("runs.sql", "load_preloaded_refs"): "PRELOADED",
    ("repairs.sql", "repair"): "RUNNING",
}
"""Every statement of ``runs.sql`` that is handed a batch of task keys, and the
reconciler's repair: (file, name) -> the state the whole stampede is in when it runs
(partial indexes hold the rows of some states only)."""


def _params(instant: datetime, ids: list[uuid.UUID]) -> dict[str, Any]:
    """A value for every parameter the key statements take, one per key where it is an
    array: a batch as the node sends it."""
    n = len(ids)
    return {
        "scheduled_ats": [instant] * n,
        "ids": ids,
        "instants": [instant],
        "tokens": [1] * n,
        "worker_ids": ["w"] * n,
        "results": ["{}"] * n,
        "checkpoints": [b""] * n,
        "attempt_states": ["FAILED"] * n,
        "due_ats": [instant] * n,
        "errors": ["e"] * n,
        "retry_counts": [1] * n,
        "statuses": ["SCHEDULED"] * n,
        "updated_ats": [instant] * n,
        "targets": ["PRELOADED"] * n,
        "reasons": ["r"] * n,
        "details": ["d"] * n,
        "shards": [SHARD],
        "lease_s": 30.0,
        "margin_s": 5.0,
    }


def _tasks_scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if str(plan.get("Relation Name", "")).startswith("tasks"):
        yield plan
    for child in plan.get("Plans", []):
        yield from _tasks_scans(child)


def rows_looked_at(explained: list[dict[str, Any]]) -> int:
    """Rows the plan's scans of ``tasks`` (its partitions) returned or threw away."""
    total = 0
    for scan in _tasks_scans(explained[0]["Plan"]):
        per_loop = (
            scan.get("Actual Rows", 0)
            + scan.get("Rows Removed by Filter", 0)
            + scan.get("Rows Removed by Index Recheck", 0)
        )
        total += per_loop * scan.get("Actual Loops", 1)
    return int(total)


async def _stampede(store: Store, tenant: Tenant) -> tuple[datetime, list[uuid.UUID]]:
    """STAMPEDE tasks sharing one instant, in a partition analyzed before they existed."""
    instant = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    first = new_task(scheduled_at=instant, due_at=instant)
    await insert_tasks(store, tenant.id, [first])
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT tableoid::regclass::text FROM tasks WHERE id = %s", (first.id,)
        )
        row = await cur.fetchone()
        assert row is not None
        partition = row[0]
        await conn.execute(f"ALTER TABLE {partition} SET (autovacuum_enabled = false)")
        await conn.execute(f"ANALYZE {partition}")
    ids = [first.id]
    for _ in range(0, STAMPEDE - 1, 5_000):
        news = [new_task(scheduled_at=instant, due_at=instant) for _ in range(5_000)]
        await insert_tasks(store, tenant.id, news)
        ids += [n.id for n in news]
    return instant, ids


def _prepared(sql: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """``sql`` with its ``%(name)s`` (and ``%(name)b``) placeholders as ``$n`` (for
    PREPARE), and the values in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)[sbt]", number, sql), [params[n] for n in names]


@pytest.mark.parametrize("plans", ["custom", "generic"])
async def test_key_lookups_read_a_few_rows_per_key_of_a_stampede(
    store: Store, tenant: Tenant, plans: str
) -> None:
    """With ``generic``, each statement runs as a prepared statement whose plan was made
    without its parameters' values: what the dispatch path's transactions use
    (``database.GENERIC_PLANS``)."""
    instant, ids = await _stampede(store, tenant)
    batch = ids[:: len(ids) // BATCH][:BATCH]
    statements = {
        (file, name): sql
        for file in {f for f, _ in KEY_STATEMENTS}
        for name, sql in queries.load(file).items()
    }
    looked_at = {}
    async with store.connection() as conn:
        await conn.execute("BEGIN")
        try:
            status = None
            for key, wanted in sorted(KEY_STATEMENTS.items(), key=lambda item: item[1]):
                if wanted != status:
                    # One pass over the stampede per state, not per statement.
                    status = wanted
                    await conn.execute(
                        "UPDATE tasks SET status = %s, fencing_token = 1, attempt = 1,"
                        " lease_expires_at = now() + interval '1 minute'"
                        " WHERE scheduled_at = %s",
                        (status, instant),
                    )
                await conn.execute("SAVEPOINT explained")
                if plans == "generic":
                    await conn.execute(GENERIC_PLANS)
                    text, values = _prepared(statements[key], _params(instant, batch))
                    await conn.execute(f"PREPARE explained AS {text}".encode())  # test SQL
                    # EXECUTE's arguments cannot be bound: they are literals (test SQL).
                    cur = await conn.execute(
                        sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE explained ({})").format(
                            sql.SQL(", ").join(sql.Literal(v) for v in values)
                        )
                    )
                else:
                    cur = await conn.execute(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + statements[key],  # type: ignore[operator]
                        _params(instant, batch),
                    )
                row = await cur.fetchone()
                if plans == "generic":
                    await conn.execute("DEALLOCATE explained")
                await conn.execute("ROLLBACK TO SAVEPOINT explained")
                assert row is not None
                explained = row[0] if isinstance(row[0], list) else json.loads(row[0])
                looked_at[key[1]] = rows_looked_at(explained)
        finally:
            await conn.execute("ROLLBACK")
    walking = {name for name, n in looked_at.items() if n > SCANS_PER_KEY * BATCH}
    assert walking == set(), f"of {STAMPEDE} tasks at one instant, {BATCH} keys: {looked_at}"
