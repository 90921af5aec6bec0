"""Punctuality under load: a stampede of tasks due in one second, and a steady rate.

Both submit strict-timing ``bench.record`` tasks through the public client (SubmitBatch),
wait until the scheduler preloaded all of them into its wheel, and then let them fall
due, with two worker processes (``bench/bench_workers.py``) running the handlers. Every
time reported comes from the database afterwards, all stamped by one machine's clock:

* the intent: ``task_attempts.entered_at`` (the dispatch transaction's start, just
  before its commit and the send);
* the handler start: ``effects.started_at``, taken by the handler on the worker;
* the completion: ``tasks.finished_at`` (the settling transaction).

*Lateness* is handler start − ``due_at``. With lead dispatch (docs/architecture.md#d6) the node
sends a task ``scheduling.lead_dispatch_s`` early and the SDK starts it at ``due_at``, so on an
unloaded system lateness is the worker's timer precision.

* ``stampede N``: N tasks due evenly within one second starting at T. *All dispatched* is
  T → the last intent; *all started* is T → the last handler start (each handler starts
  after its assignment arrived, so this bounds "sent" from above); *all completed* is
  T → the last completion. Lost or doubled tasks are checked with the fault tests'
  history checker (every acknowledged task completed once, one successful attempt, one
  winning effect). ``--handler-ms`` makes each handler hold its slot that long, so
  concurrency matters; *runs per worker* (from ``effects.worker_id``) shows how the node
  spread the work over the worker processes (issue 14).
* ``steady RATE``: tasks due every 1/RATE s for ``--duration-s``; the lateness
  distribution (p50/p99/max).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import uvloop
from harness.history import History, Violations, check

from bench._cluster import Infrastructure, Node, cpu_used, node
from bench._report import Report, Target, ms, percentile
from chronoshard import Client, SubmitResult, TaskSpec

WORKERS = 2
SUBMIT_BATCH = 1000
SUBMIT_CONCURRENCY = 2
# How long before the first due time submits and preloading are given: a fixed margin
# plus a pessimistic submit rate. A run whose tasks were not all in the wheel by then is
# flagged in its notes, since its timings would include preloading.
LEAD_IN_FIXED_S = 2.0
LEAD_IN_RATE = 1000.0
STAMPEDE_DISPATCH_TARGET_S = 5.0
STAMPEDE_COMPLETE_TARGET_S = 10.0
ROUNDS_FLOOR = 0.8
"""Stampedes in a row on one database: none may fall below this share of the best (issue
14: with statistics older than the stampede, a plan that walked the instant made 3 of 22
runs fall to 30-330 tasks/s)."""
STEADY_P50_TARGET_S = 0.002
STEADY_P99_TARGET_S = 0.010


@dataclass
class Timings:
    first_due: datetime
    lateness_s: list[float]
    last_intent_s: float
    last_start_s: float
    last_completion_s: float
    first_intent_s: float
    preloaded_in_time: bool
    violations: str
    exactly_once: bool  # none lost, none doubled (an incomplete run may still hold)
    completed: int
    per_worker: list[int]  # successful handler runs of each worker process, most first
    cpu_s: dict[str, float]  # from the first due time until all completed
    wall_s: float

    def completion_rate(self, tasks: int) -> float:
        """Tasks per second from the first intent to the last completion."""
        return tasks / max(self.last_completion_s - self.first_intent_s, 1e-3)

    def per_worker_cell(self) -> str:
        """Runs per worker, most first, and the busiest one's share of them."""
        total = sum(self.per_worker)
        counts = " / ".join(f"{c:,}" for c in self.per_worker) or "-"
        share = max(self.per_worker, default=0) / total if total else float("nan")
        return f"{counts} (busiest {share:.0%})"

    def cpu_cell(self) -> str:
        """CPU seconds of scheduler / workers / PostgreSQL over the wall seconds."""
        c = self.cpu_s
        return (
            f"{c['scheduler']:.1f} / {c['workers']:.1f} / {c['postgres']:.1f}"
            f" in {self.wall_s:.1f} s"
        )


def _count(dsn: str, sql: str, params: Any = None) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


async def _submit(
    n: Node, dues: list[datetime], history: History, handler_ms: float
) -> list[uuid.UUID]:
    specs = [
        TaskSpec(
            type="bench.record", payload={"i": i, "ms": handler_ms}, at=due, strict_timing=True
        )
        for i, due in enumerate(dues)
    ]
    chunks = [specs[i : i + SUBMIT_BATCH] for i in range(0, len(specs), SUBMIT_BATCH)]
    chunks.reverse()
    ids: list[uuid.UUID] = []
    async with Client(n.address, api_key=n.api_key) as client:

        async def caller() -> None:
            while chunks:
                chunk = chunks.pop()
                op = history.invoke("submit_batch")
                results = await client.submit_batch(chunk)
                accepted = [uuid.UUID(r.task.id) for r in results if isinstance(r, SubmitResult)]
                if len(accepted) != len(chunk):
                    History.finish(op, "fail", accepted, error="some items refused")
                    raise RuntimeError(f"{len(chunk) - len(accepted)} submits refused")
                History.finish(op, "ok", accepted)
                ids.extend(accepted)

        await asyncio.gather(*(caller() for _ in range(SUBMIT_CONCURRENCY)))
    return ids


def _run(
    n: Node, dues: list[datetime], settle_timeout_s: float, handler_ms: float = 0.0
) -> Timings:
    """Submit tasks due at ``dues``, let them run, and read what happened."""
    history = History()
    ids = uvloop.run(_submit(n, dues, history, handler_ms))
    first_due = min(dues)
    last_due = max(dues)
    preloaded_in_time = _wait_preloaded(n.dsn, len(ids), first_due, last_due)
    time.sleep(max(0.0, (first_due - datetime.now(UTC)).total_seconds()))
    cpu_before, wall_before = n.cpu_snapshot(), time.monotonic()
    deadline = time.monotonic() + (max(dues) - datetime.now(UTC)).total_seconds()
    completed = _wait_completed(n.dsn, len(ids), deadline + settle_timeout_s, first_due, last_due)
    cpu_after, wall = n.cpu_snapshot(), time.monotonic() - wall_before
    _wait_ledger(n.dsn, completed, first_due)
    lateness = _lateness(n.dsn, first_due)
    first_intent, last_intent, last_start, last_completion = _last_times(n.dsn, first_due)
    violations = check(n.dsn, history.acknowledged(), job_ledger=False)
    return Timings(
        first_due=first_due,
        lateness_s=lateness,
        last_intent_s=last_intent,
        last_start_s=last_start,
        last_completion_s=last_completion,
        first_intent_s=first_intent,
        preloaded_in_time=preloaded_in_time,
        violations=violations.summary(),
        exactly_once=_none_lost_or_doubled(violations),
        completed=completed,
        per_worker=_per_worker(n.dsn, first_due),
        cpu_s={k: cpu_used(cpu_before[k], cpu_after[k]) for k in cpu_before},
        wall_s=wall,
    )


ROUND_TASKS = """
SELECT count(*) FROM tasks
WHERE tenant_id = (SELECT id FROM tenants LIMIT 1)
  AND scheduled_at BETWEEN %(first)s AND %(last)s
"""
"""The round's tasks (strict: scheduled at their due instants), read through
tasks_tenant_idx (the bench database has one tenant): a range of this round's rows
only. A filter on due_at alone scanned every round's rows of the day's partition, four
times a second while the stampede ran: by round 5 of `--rounds 5` that was 2 million
rows a second of PostgreSQL CPU taken from the stampede being measured."""


def _wait_preloaded(dsn: str, total: int, first_due: datetime, last_due: datetime) -> bool:
    """Whether every task was in the wheel before the first fell due (else the run is
    flagged); returns at the latest when it falls due."""
    sql = ROUND_TASKS + " AND status <> 'SCHEDULED'"
    while True:
        preloaded = _count(dsn, sql, {"first": first_due, "last": last_due})
        if preloaded >= total or datetime.now(UTC) >= first_due:
            return preloaded >= total
        time.sleep(0.1)


def _wait_completed(
    dsn: str, total: int, deadline: float, first_due: datetime, last_due: datetime
) -> int:
    """How many of the round's tasks completed, once all did or at the monotonic
    ``deadline``."""
    completed = 0
    while time.monotonic() < deadline:
        completed = _count(
            dsn, ROUND_TASKS + " AND status = 'COMPLETED'", {"first": first_due, "last": last_due}
        )
        if completed >= total:
            break
        time.sleep(0.25)
    return completed


def _wait_ledger(dsn: str, completed: int, first_due: datetime) -> None:
    # The workers write the effects ledger in batches a few milliseconds behind.
    ledger_deadline = time.monotonic() + 10
    sql = "SELECT count(*) FROM effects WHERE due_at >= %s"
    while _count(dsn, sql, (first_due,)) < completed:
        if time.monotonic() > ledger_deadline:
            break
        time.sleep(0.1)


def _lateness(dsn: str, first_due: datetime) -> list[float]:
    """Handler start − due time of every successful handler run of the round, in seconds."""
    with psycopg.connect(dsn) as conn:
        return [
            float(r[0])
            for r in conn.execute(
                "SELECT extract(epoch FROM started_at - due_at) FROM effects"
                " WHERE outcome = 'ok' AND due_at >= %s",
                (first_due,),
            ).fetchall()
        ]


def _per_worker(dsn: str, first_due: datetime) -> list[int]:
    """Successful handler runs of the round of each worker process, most first."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM effects WHERE outcome = 'ok' AND due_at >= %s GROUP BY worker_id",
            (first_due,),
        ).fetchall()
    return sorted((int(r[0]) for r in rows), reverse=True)


def _last_times(dsn: str, first_due: datetime) -> tuple[float, float, float, float]:
    """Seconds from ``first_due`` to the first intent, the last intent, the last handler
    start and the last completion (NaN where there was none)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            """
            SELECT extract(epoch FROM (SELECT min(entered_at) FROM task_attempts
                                       WHERE scheduled_at >= %(t)s) - %(t)s),
                   extract(epoch FROM (SELECT max(entered_at) FROM task_attempts
                                       WHERE scheduled_at >= %(t)s) - %(t)s),
                   extract(epoch FROM (SELECT max(started_at) FROM effects
                                       WHERE due_at >= %(t)s) - %(t)s),
                   extract(epoch FROM (SELECT max(finished_at) FROM tasks
                                       WHERE status = 'COMPLETED' AND due_at >= %(t)s)
                                      - %(t)s)
            """,
            {"t": first_due},
        ).fetchone()
    assert row is not None
    first_intent, last_intent, last_start, last_completion = (
        float("nan") if v is None else float(v) for v in row
    )
    return first_intent, last_intent, last_start, last_completion


def _none_lost_or_doubled(violations: Violations) -> bool:
    # A task still running when the run stopped waiting is incomplete, not lost: lost is
    # a task missing, or completed without its one successful attempt and effect.
    incomplete = set(violations.not_completed)
    counts = [violations.success_attempts, violations.winning_effects]
    lost = bool(violations.missing) or any(
        c == 0 and task not in incomplete for found in counts for task, c in found.items()
    )
    doubled = any(c > 1 for found in counts for c in found.values())
    return not lost and not doubled


def _lead_in_s(tasks: int) -> float:
    return LEAD_IN_FIXED_S + tasks / LEAD_IN_RATE


def _env(lead_dispatch_s: float | None) -> dict[str, str]:
    env = {"CHRONOSHARD_WORKERS__TASK_LEASE_S": "60"}
    if lead_dispatch_s is not None:
        env["CHRONOSHARD_SCHEDULING__LEAD_DISPATCH_S"] = str(lead_dispatch_s)
    return env


def _notes(t: Timings, tasks: int) -> list[str]:
    notes = []
    if not t.preloaded_in_time:
        notes.append("NOT all tasks were preloaded before the first fell due: timings include it")
    if t.completed < tasks:
        notes.append(
            f"only {t.completed:,} of {tasks:,} tasks had completed when the run stopped "
            "waiting: the rest were still queued or running, so the history check lists "
            "them as not completed"
        )
    if t.violations != "none":
        notes.append(f"history check: {t.violations[:600]}")
    return notes


def stampede(
    infra: Infrastructure,
    tasks: int,
    slots: int,
    lead_dispatch_s: float | None = None,
    handler_ms: float = 0.0,
    *,
    rounds: int = 1,
    one_instant: bool = False,
    prefetch: int = 0,
    nodes: int = 1,
) -> Report:
    """``rounds`` stampedes of ``tasks`` one after another on one node and one database
    (so later rounds meet the earlier ones' history and statistics), each due within one
    second, or all at one instant with ``one_instant``."""
    timings: list[Timings] = []
    rows: list[dict[str, Any]] = []
    with node(
        infra,
        "stampede",
        env=_env(lead_dispatch_s),
        workers=WORKERS,
        slots=slots,
        prefetch=prefetch,
        nodes=nodes,
    ) as n:
        for round_no in range(1, rounds + 1):
            start = datetime.now(UTC) + timedelta(seconds=_lead_in_s(tasks))
            if one_instant:
                start = start.replace(microsecond=0)
                dues = [start] * tasks
            else:
                dues = [start + timedelta(seconds=i / tasks) for i in range(tasks)]
            t = _run(n, dues, settle_timeout_s=max(60.0, tasks / 200), handler_ms=handler_ms)
            timings.append(t)
            rows.append(
                {
                    **({"round": round_no} if rounds > 1 else {}),
                    "tasks": tasks,
                    "all dispatched": f"{t.last_intent_s:.2f} s",
                    "all started": f"{t.last_start_s:.2f} s",
                    "all completed": f"{t.last_completion_s:.2f} s",
                    "dispatch rate/s": tasks / max(t.last_intent_s - t.first_intent_s, 1e-3),
                    "completion rate/s": t.completion_rate(tasks),
                    "lateness p50": ms(percentile(t.lateness_s, 50)),
                    "lateness p99": ms(percentile(t.lateness_s, 99)),
                    "lateness max": ms(max(t.lateness_s, default=float("nan"))),
                    "completed": t.completed,
                    "runs per worker": t.per_worker_cell(),
                    "none lost or doubled": t.exactly_once,
                    "CPU s sched / workers / PG": t.cpu_cell(),
                }
            )
    worst_dispatch = max(max(t.last_intent_s, t.last_start_s) for t in timings)
    worst_completion = max(t.last_completion_s for t in timings)
    exactly_once = all(t.exactly_once for t in timings)
    targets = [
        Target(
            f"stampede {tasks:,}: all dispatched ≤ 5 s",
            worst_dispatch <= STAMPEDE_DISPATCH_TARGET_S,
            f"{worst_dispatch:.2f} s",
        ),
        Target(
            f"stampede {tasks:,}: all completed ≤ 10 s",
            worst_completion <= STAMPEDE_COMPLETE_TARGET_S,
            f"{worst_completion:.2f} s",
        ),
        Target(
            f"stampede {tasks:,}: none lost or doubled",
            exactly_once,
            "none" if exactly_once else "see the history check below",
        ),
    ]
    if rounds > 1:
        rates = [t.completion_rate(tasks) for t in timings]
        worst = min(rates) / max(rates)
        targets.append(
            Target(
                f"{rounds} stampedes in a row: none below {ROUNDS_FLOOR:.0%} of the best",
                worst >= ROUNDS_FLOOR,
                f"worst {worst:.0%} of the best",
            )
        )
    return Report(
        workload="stampede",
        command="",
        parameters={
            "tasks": tasks,
            "due within": "one instant" if one_instant else "1 s",
            "rounds": rounds,
            "scheduler processes": nodes,
            "worker processes": WORKERS,
            "slots per worker": slots,
            "prefetch per worker": prefetch,
            "handler_ms": handler_ms,
            "lead_dispatch_s": "default" if lead_dispatch_s is None else lead_dispatch_s,
        },
        columns=list(rows[0]),
        rows=rows,
        targets=targets,
        notes=[
            *(note for t in timings for note in _notes(t, tasks)),
            "Times are from the start of the due second (T); dispatched = last intent "
            "committed, started = last handler start (after its assignment was received).",
        ],
    )


def steady(
    infra: Infrastructure,
    rate: float,
    duration_s: float,
    slots: int,
    lead_dispatch_s: float | None = None,
    handler_ms: float = 0.0,
    *,
    nodes: int = 1,
    prefetch: int = 0,
) -> Report:
    tasks = int(rate * duration_s)
    with node(
        infra,
        "steady",
        env=_env(lead_dispatch_s),
        workers=WORKERS,
        slots=slots,
        prefetch=prefetch,
        nodes=nodes,
    ) as n:
        start = datetime.now(UTC) + timedelta(seconds=_lead_in_s(tasks))
        dues = [start + timedelta(seconds=i / rate) for i in range(tasks)]
        t = _run(n, dues, settle_timeout_s=max(60.0, tasks / 200), handler_ms=handler_ms)
    p50, p99 = percentile(t.lateness_s, 50), percentile(t.lateness_s, 99)
    row = {
        "rate/s": rate,
        "seconds": duration_s,
        "tasks": tasks,
        "started": len(t.lateness_s),
        "lateness p50": ms(p50),
        "lateness p90": ms(percentile(t.lateness_s, 90)),
        "lateness p99": ms(p99),
        "lateness p99.9": ms(percentile(t.lateness_s, 99.9)),
        "lateness max": ms(max(t.lateness_s, default=float("nan"))),
        "early": sum(1 for x in t.lateness_s if x < 0),
        "completed": t.completed,
        "runs per worker": t.per_worker_cell(),
        "none lost or doubled": t.exactly_once,
        "CPU s sched / workers / PG": t.cpu_cell(),
    }
    return Report(
        workload="steady",
        command="",
        parameters={
            "rate_per_s": rate,
            "duration_s": duration_s,
            "strict_timing": True,
            "scheduler processes": nodes,
            "worker processes": WORKERS,
            "slots per worker": slots,
            "prefetch per worker": prefetch,
            "handler_ms": handler_ms,
            "lead_dispatch_s": "default" if lead_dispatch_s is None else lead_dispatch_s,
        },
        columns=list(row),
        rows=[row],
        targets=[
            Target(f"steady {rate:g}/s lateness p50 ≤ 2 ms", p50 <= STEADY_P50_TARGET_S, ms(p50)),
            Target(f"steady {rate:g}/s lateness p99 ≤ 10 ms", p99 <= STEADY_P99_TARGET_S, ms(p99)),
        ],
        notes=_notes(t, tasks),
    )
