"""Operation histories and the invariant checker for fault tests.

Clients record each operation they attempt (invoke, then ok / fail / unknown, with
monotonic timestamps); task handlers append their side effects to an ``effects`` ledger
that has no unique constraint, so a task run twice shows twice. After the faults heal,
:func:`check` reads the database and verifies what matters:

* **I1** every acknowledged submit ends with exactly one accepted completion: the task is
  COMPLETED, exactly one of its attempts SUCCEEDED, the completion ledger has it once;
* **I2** no stale-token completion was accepted, and the winning token produced exactly
  one successful side effect;
* **I3** per shard, attempts were written under non-decreasing epochs (a write under a
  superseded epoch would show an older epoch after a newer one): :func:`epoch_regressions`;
* **I4** failover times, reported by the tests from the same data (see
  :func:`first_dispatch_after`).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import psycopg

Outcome = Literal["ok", "fail", "unknown"]

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS effects (
    task_id uuid NOT NULL,
    attempt integer NOT NULL,
    token bigint NOT NULL,
    worker_id text NOT NULL,
    started_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
    outcome text NOT NULL,
    -- PostgreSQL's clock when the handler wrote its effect, the first thing it does.
    recorded_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass
class Operation:
    kind: str
    invoked_at: float
    outcome: Outcome | None = None
    finished_at: float | None = None
    task_ids: list[uuid.UUID] = field(default_factory=list)
    error: str | None = None


@dataclass
class History:
    operations: list[Operation] = field(default_factory=list)

    def invoke(self, kind: str) -> Operation:
        op = Operation(kind, time.monotonic())
        self.operations.append(op)
        return op

    @staticmethod
    def finish(
        op: Operation, outcome: Outcome, task_ids: list[uuid.UUID] | None = None, error: str = ""
    ) -> None:
        op.outcome = outcome
        op.finished_at = time.monotonic()
        op.task_ids = task_ids or []
        op.error = error or None

    def acknowledged(self) -> list[uuid.UUID]:
        return [t for op in self.operations if op.outcome == "ok" for t in op.task_ids]


@dataclass
class Violations:
    missing: list[uuid.UUID] = field(default_factory=list)
    not_completed: dict[uuid.UUID, str] = field(default_factory=dict)
    success_attempts: dict[uuid.UUID, int] = field(default_factory=dict)
    ledger_rows: dict[uuid.UUID, int] = field(default_factory=dict)
    winning_effects: dict[uuid.UUID, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(
            (
                self.missing,
                self.not_completed,
                self.success_attempts,
                self.ledger_rows,
                self.winning_effects,
            )
        )

    def summary(self) -> str:
        parts = []
        for name in (
            "missing",
            "not_completed",
            "success_attempts",
            "ledger_rows",
            "winning_effects",
        ):
            value: Any = getattr(self, name)
            if value:
                sample = list(value.items())[:5] if isinstance(value, dict) else value[:5]
                parts.append(f"{name}: {len(value)} e.g. {sample}")
        return "; ".join(parts) or "none"


def check(
    dsn: str,
    task_ids: list[uuid.UUID],
    *,
    job_ledger: bool = True,
    effects_dsn: str | None = None,
) -> Violations:
    """I1 and I2 over ``task_ids`` (acknowledged submits).

    ``effects_dsn``: where the handlers' ``effects`` ledger lives when it is not the
    scheduler's database (a test that takes the scheduler's PostgreSQL down keeps the
    ledger on a server that stays up).
    """
    found = Violations()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id, status, fencing_token FROM tasks WHERE id = ANY(%s)", (task_ids,)
        ).fetchall()
        status = {r[0]: (r[1], r[2]) for r in rows}
        successes = Counter(
            r[0]
            for r in conn.execute(
                "SELECT task_id FROM task_attempts WHERE task_id = ANY(%s) AND state = 'SUCCEEDED'",
                (task_ids,),
            ).fetchall()
        )
        ledger = Counter(
            r[0]
            for r in conn.execute(
                "SELECT task_id FROM task_completions WHERE task_id = ANY(%s)", (task_ids,)
            ).fetchall()
        )
    effects = committed_effects(effects_dsn or dsn, task_ids)
    winning = Counter(t for t, token in effects if status.get(t, (None, -1))[1] == token)
    for task_id in task_ids:
        if task_id not in status:
            found.missing.append(task_id)
            continue
        if status[task_id][0] != "COMPLETED":
            found.not_completed[task_id] = status[task_id][0]
        if successes[task_id] != 1:
            found.success_attempts[task_id] = successes[task_id]
        if job_ledger and ledger[task_id] != 1:
            found.ledger_rows[task_id] = ledger[task_id]
        if winning[task_id] != 1:
            found.winning_effects[task_id] = winning[task_id]
    return found


def committed_effects(dsn: str, task_ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, int]]:
    """(task, token) of every successful side effect the handlers committed."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT task_id, token FROM effects WHERE task_id = ANY(%s) AND outcome = 'ok'",
            (task_ids,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def epoch_regressions(dsn: str, task_ids: list[uuid.UUID]) -> list[tuple[int, int, int]]:
    """I3: (shard, earlier epoch, later epoch) wherever a shard's attempts, in the order
    they were written, went back to an older epoch — a dispatch under a superseded owner."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT t.shard, a.epoch FROM task_attempts a JOIN tasks t ON t.id = a.task_id"
            " WHERE a.task_id = ANY(%s) AND a.epoch IS NOT NULL"
            " ORDER BY t.shard, a.entered_at, a.epoch",
            (task_ids,),
        ).fetchall()
    found = []
    last: dict[int, int] = {}
    for shard, epoch in rows:
        if shard in last and epoch < last[shard]:
            found.append((shard, last[shard], epoch))
        last[shard] = max(epoch, last.get(shard, epoch))
    return found


def first_dispatch_after(dsn: str, shards: set[int], after: datetime) -> datetime | None:
    """When the first attempt of a task of ``shards`` was written after ``after``."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT min(a.entered_at) FROM task_attempts a JOIN tasks t ON t.id = a.task_id"
            " WHERE t.shard = ANY(%s) AND a.entered_at > %s",
            (sorted(shards), after),
        ).fetchone()
    return None if row is None else row[0]


_LEASE_EXPIRED = re.compile(r"lease expired at (\S+?)[ ;,]")


def lease_expired_at(attempt_error: str | None) -> datetime:
    """I4's reference point: when an attempt's lease ran out, as the reconciler recorded
    it giving the attempt up ("lease expired at <ISO time>" in the attempt's error; the
    database's clock, which wrote the lease)."""
    found = _LEASE_EXPIRED.search((attempt_error or "") + " ")
    if found is None:
        raise AssertionError(f"no lease expiry recorded in {attempt_error!r}")
    return datetime.fromisoformat(found.group(1))


@dataclass(frozen=True)
class Lateness:
    """I4 for one set of tasks, in seconds after ``due_at``, all by PostgreSQL's clock."""

    started: list[float]
    """To the first effect a handler of the task recorded (``effects.recorded_at``, the
    first thing an e2e handler does): when it really started."""
    dispatched: list[float]
    """To the first attempt's intent (``task_attempts.entered_at``); negative when the
    intent was written ahead of ``due_at`` (lead dispatch)."""
    settled: list[float]
    """To ``tasks.started_at``: the ack or, for a run too short to be acked, the commit of
    its completion (so it includes how long the settlement took to land)."""
    redispatched: int = 0
    """Tasks that needed more than one dispatch (an attempt given up and run again)."""


def lateness(
    dsn: str, task_ids: list[uuid.UUID], shards: set[int], due_from: datetime, due_to: datetime
) -> Lateness:
    """How late the tasks of ``shards`` due in ``[due_from, due_to)`` started."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM (SELECT min(e.recorded_at) FROM effects e"
            "                           WHERE e.task_id = t.id) - t.due_at)::float8,"
            "       extract(epoch FROM a.entered_at - t.due_at)::float8,"
            "       extract(epoch FROM t.started_at - t.due_at)::float8,"
            "       t.attempt > 1"
            " FROM tasks t JOIN task_attempts a ON a.task_id = t.id AND a.attempt = 1"
            " WHERE t.id = ANY(%s) AND t.shard = ANY(%s) AND t.due_at >= %s AND t.due_at < %s",
            (task_ids, sorted(shards), due_from, due_to),
        ).fetchall()
    return Lateness(
        [r[0] for r in rows if r[0] is not None],
        [r[1] for r in rows],
        [r[2] for r in rows if r[2] is not None],
        sum(1 for r in rows if r[3]),
    )
