"""Recurring schedules at scale (issue 15): what 10,000 schedules of one tenant cost a node.

One scheduler process on a fresh database (PostgreSQL as the rest of the suite: fsync on)
and two worker processes running ``bench.occurrence`` (``bench/bench_workers.py``: a
no-op that notes its start, the schedule and the occurrence's logical date in
``bench_occurrence_runs``, a buffered COPY like ``bench.record``). ``--schedules``
schedules are created through the public client (``Client.create_schedule``,
``--concurrency`` calls in flight; creates/s and call latency), each with overlap ALLOW,
the defaults otherwise, and a strict-timing ``bench.occurrence`` template (without
``strict_timing`` every occurrence would be jittered by up to ±120 s and lateness would
measure the jitter). Two variants, each on its own node and database:

* ``minute``: every schedule ``* * * * *``: all of them fall due at :00 of every minute,
  a stampede of ``--schedules`` occurrences every minute;
* ``seconds``: 6-field crons ``S * * * * *``, schedule i at second ``i mod 60``: the same
  number of occurrences per minute, spread evenly over the minute's 60 seconds.

The materialiser creates each occurrence ``schedules.lookahead_s`` (``--lookahead-s``,
default the node's, 60 s) before it is due, so every occurrence created at or before the
last create plus the lookahead came from the creation burst, not the steady state. The
*window* is the ``--minutes`` whole minutes from the first minute boundary after that.
Over the window the run reads:

1. the CPU seconds (``/proc/<pid>/stat``) of the node, the workers and PostgreSQL (every
   process of the server), per minute and per 1,000 occurrences created; the node's CPU
   each second (to see where in the minute it goes); the materialiser's counters from the
   node's ``/metrics`` (``chronoshard_materialiser_*``) at the start and end of the
   window. In the window the node both materialises (the occurrences due one lookahead
   later) and dispatches (the occurrences due in the window) ``--schedules`` occurrences
   per minute, so its CPU is the two together; they are not separable from outside the
   process, but a lookahead that is not a whole number of minutes (``--lookahead-s 90``)
   puts the materialiser's passes 30 s away from the dispatch of ``minute`` and the CPU
   per second shows each;
2. the node's RSS before the schedules were created, after, and at the end of the
   window (with the window's maximum); ``pg_total_relation_size`` of ``schedules`` and
   ``schedule_occurrences`` at the end;
3. the lateness of every occurrence whose logical date is in the window (handler start −
   logical date, both stamped on this machine) p50/p95/p99/max, and that each of them
   ran exactly once: one handler start per expected ``(schedule, logical date)``, none
   missing, none doubled, none unexpected.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import uvloop

from bench._cluster import Infrastructure, Node, cpu_used, node, process_cpu_s, process_rss_mib
from bench._report import Report, Target, ms, percentile
from chronoshard import Client, OverlapPolicy, ScheduleSpec, TaskSpec
from chronoshard.scheduler.config import SchedulesConfig

VARIANTS = ("minute", "seconds")
WORKERS = 2
TASK_TYPE = "bench.occurrence"
SAMPLE_INTERVAL_S = 1.0
# After the window: how long the last occurrences are given to start and reach the ledger.
DRAIN_TIMEOUT_S = 90.0
OCCURRENCE_RUNS_DDL = """
CREATE UNLOGGED TABLE IF NOT EXISTS bench_occurrence_runs (
    schedule_id  uuid,
    logical_date timestamptz,
    task_id      uuid NOT NULL,
    attempt      integer NOT NULL,
    worker_id    text NOT NULL,
    started_at   timestamptz NOT NULL,
    due_at       timestamptz NOT NULL
)
"""
_METRIC_LINE = re.compile(r"^(chronoshard_materialiser_\w+?)(?:_total)?(?:\{[^}]*\})? (\S+)$")


def cron_of(variant: str, index: int) -> str:
    """Schedule ``index``'s cron in ``variant``."""
    if variant == "minute":
        return "* * * * *"
    if variant == "seconds":
        return f"{index % 60} * * * * *"
    raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def expected_dates(variant: str, index: int, start: datetime, end: datetime) -> list[datetime]:
    """Schedule ``index``'s occurrences with ``start <= logical date < end``."""
    second = 0 if variant == "minute" else index % 60
    found, at = [], start.replace(second=second, microsecond=0)
    if at < start:
        at += timedelta(minutes=1)
    while at < end:
        found.append(at)
        at += timedelta(minutes=1)
    return found


def window_start(after: datetime, minutes: float) -> datetime:
    """The first minute boundary after ``after``, or, for a window that is not whole
    minutes (the smoke test's), the first second."""
    if minutes == int(minutes):
        return after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return after.replace(microsecond=0) + timedelta(seconds=1)


@dataclass
class Sample:
    at: datetime
    cpu_s: float
    rss_mib: float


@dataclass
class Sampler:
    """The node's CPU seconds and RSS every ``interval_s``, in a thread (reading /proc
    costs the node nothing)."""

    pid: int
    interval_s: float = SAMPLE_INTERVAL_S
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.samples.append(
                Sample(datetime.now(UTC), process_cpu_s(self.pid), process_rss_mib(self.pid))
            )
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def materialiser_stats(n: Node) -> dict[str, float]:
    """The node's ``chronoshard_materialiser_*`` metrics, by name without the prefix and
    ``_total``."""
    url = f"http://{n.scheduler.metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    stats: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC_LINE.match(line)
        if match is not None:
            name = match.group(1).removeprefix("chronoshard_materialiser_")
            stats[name] = stats.get(name, 0.0) + float(match.group(2))
    return stats


@dataclass
class Created:
    ids: list[uuid.UUID]  # by schedule index
    seconds: float
    latencies_s: list[float]
    last_at: datetime


async def create_schedules(n: Node, variant: str, count: int, concurrency: int) -> Created:
    """``count`` schedules through the client, ``concurrency`` calls in flight."""
    template = TaskSpec(type=TASK_TYPE, payload={}, strict_timing=True)
    ids: list[uuid.UUID | None] = [None] * count
    latencies: list[float] = []
    pending = list(range(count - 1, -1, -1))
    async with Client(n.address, api_key=n.api_key, max_in_flight=max(concurrency, 1)) as client:

        async def caller() -> None:
            while pending:
                i = pending.pop()
                spec = ScheduleSpec(
                    name=f"bench-{i:06d}",
                    task=template,
                    cron=cron_of(variant, i),
                    overlap=OverlapPolicy.ALLOW,
                )
                started = time.perf_counter()
                schedule = await client.create_schedule(spec)
                latencies.append(time.perf_counter() - started)
                ids[i] = uuid.UUID(schedule.id)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
    assert all(i is not None for i in ids)
    return Created([i for i in ids if i is not None], seconds, latencies, datetime.now(UTC))


def _sleep_until(at: datetime) -> None:
    time.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()))


def _one(dsn: str, sql: str, params: Any = None) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def _wait_runs(dsn: str, expected: int, start: datetime, end: datetime) -> int:
    """Handler starts of the window's occurrences, once all expected arrived or at the
    drain timeout."""
    sql = (
        "SELECT count(*) FROM bench_occurrence_runs WHERE logical_date >= %s AND logical_date < %s"
    )
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    found = 0
    while time.monotonic() < deadline:
        found = int(_one(dsn, sql, (start, end)) or 0)
        if found >= expected:
            break
        time.sleep(0.5)
    return found


@dataclass
class Runs:
    lateness_s: list[float]
    intent_s: list[float]  # intent committed − logical date (negative: lead dispatch)
    missing: int
    doubled: int  # (schedule, logical date) pairs whose handler started more than once
    unexpected: int  # starts of pairs no schedule's rule names in the window
    occurrence_rows: int  # schedule_occurrences rows in the window


def read_runs(dsn: str, variant: str, ids: list[uuid.UUID], start: datetime, end: datetime) -> Runs:
    expected = {
        (sid, at) for i, sid in enumerate(ids) for at in expected_dates(variant, i, start, end)
    }
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT schedule_id, logical_date, extract(epoch FROM started_at - logical_date)"
            " FROM bench_occurrence_runs WHERE logical_date >= %s AND logical_date < %s",
            (start, end),
        ).fetchall()
        occurrence_rows = conn.execute(
            "SELECT count(*) FROM schedule_occurrences WHERE logical_date >= %s"
            " AND logical_date < %s",
            (start, end),
        ).fetchone()
        # The intent (the dispatch transaction, just before its commit and the send),
        # relative to the logical date: where the lateness was spent.
        intents = conn.execute(
            "SELECT extract(epoch FROM a.entered_at - r.logical_date)"
            " FROM bench_occurrence_runs AS r"
            " JOIN task_attempts AS a ON a.task_id = r.task_id AND a.attempt = r.attempt"
            " WHERE r.logical_date >= %s AND r.logical_date < %s",
            (start, end),
        ).fetchall()
    starts = Counter((sid, at) for sid, at, _ in rows)
    return Runs(
        lateness_s=[float(late) for _, _, late in rows],
        intent_s=[float(i) for (i,) in intents],
        missing=sum(1 for key in expected if key not in starts),
        doubled=sum(1 for key, c in starts.items() if c > 1 and key in expected),
        unexpected=sum(c for key, c in starts.items() if key not in expected),
        occurrence_rows=0 if occurrence_rows is None else int(occurrence_rows[0]),
    )


def relation_mib(dsn: str, table: str) -> float:
    return int(_one(dsn, "SELECT pg_total_relation_size(%s::regclass)", (table,))) / 2**20


def compact_mib(dsn: str) -> tuple[int, float, float]:
    """``schedules``' dead row versions (every pass updates each stepped row, never as a
    HOT update: ``materialise_at`` is indexed), then both tables' size once rewritten
    without them (VACUUM FULL, after the measurements: where autovacuum keeps them)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'schedules'"
        ).fetchone()
        conn.execute("VACUUM FULL schedules, schedule_occurrences")
    return (
        0 if row is None else int(row[0]),
        relation_mib(dsn, "schedules"),
        relation_mib(dsn, "schedule_occurrences"),
    )


def cpu_by_ten_seconds(samples: list[Sample], start: datetime, end: datetime) -> list[float]:
    """The node's CPU seconds per minute of the window in each 10 s of the minute (:00–:09,
    :10–:19, ...), from the per-second samples."""
    bins = [0.0] * 6
    minutes = (end - start).total_seconds() / 60
    for a, b in itertools.pairwise(samples):
        if start <= a.at and b.at <= end + timedelta(seconds=SAMPLE_INTERVAL_S):
            bins[min(a.at.second // 10, 5)] += b.cpu_s - a.cpu_s
    return [x / minutes for x in bins]


def busiest_second(samples: list[Sample], start: datetime, end: datetime) -> float:
    """The node's highest CPU use over one sample interval in the window, % of one core."""
    best = 0.0
    for a, b in itertools.pairwise(samples):
        if start <= a.at and b.at <= end + timedelta(seconds=SAMPLE_INTERVAL_S):
            span = (b.at - a.at).total_seconds()
            if span > 0:
                best = max(best, (b.cpu_s - a.cpu_s) / span)
    return 100 * best


def _env(lookahead_s: float | None) -> dict[str, str]:
    env = {"CHRONOSHARD_WORKERS__TASK_LEASE_S": "60"}
    if lookahead_s is not None:
        env["CHRONOSHARD_SCHEDULES__LOOKAHEAD_S"] = str(lookahead_s)
        # It must not exceed the lookahead (unused here: every schedule is ALLOW).
        lead = min(SchedulesConfig().overlap_lead_s, lookahead_s)
        env["CHRONOSHARD_SCHEDULES__OVERLAP_LEAD_S"] = str(lead)
    return env


def run_variant(
    infra: Infrastructure,
    variant: str,
    count: int,
    minutes: float,
    concurrency: int,
    slots: int,
    lookahead_s: float | None,
) -> tuple[dict[str, Any], list[str]]:
    """One variant on its own node: its row of the table, and its notes."""
    lookahead = timedelta(
        seconds=SchedulesConfig().lookahead_s if lookahead_s is None else lookahead_s
    )
    notes: list[str] = []
    with node(
        infra, f"schedules_{variant}", env=_env(lookahead_s), workers=WORKERS, slots=slots
    ) as n:
        with psycopg.connect(n.dsn, autocommit=True) as conn:
            conn.execute(OCCURRENCE_RUNS_DDL)
        rss_before = process_rss_mib(n.pid)
        stats_before_create = materialiser_stats(n)
        cpu_before_create = process_cpu_s(n.pid)
        created = uvloop.run(create_schedules(n, variant, count, concurrency))
        cpu_create = process_cpu_s(n.pid) - cpu_before_create
        stats_after_create = materialiser_stats(n)
        rss_after = process_rss_mib(n.pid)
        # Every occurrence up to the last create + the lookahead came from the burst.
        start = window_start(created.last_at + lookahead, minutes)
        end = start + timedelta(minutes=minutes)
        sampler = Sampler(n.pid)
        sampler.start()
        try:
            _sleep_until(start)
            cpu0, stats0 = n.cpu_snapshot(), materialiser_stats(n)
            _sleep_until(end)
            cpu1, stats1 = n.cpu_snapshot(), materialiser_stats(n)
        finally:
            sampler.stop()
        window_s = (end - start).total_seconds()
        rss_steady = process_rss_mib(n.pid)
        expected = sum(len(expected_dates(variant, i, start, end)) for i in range(count))
        started = _wait_runs(n.dsn, expected, start, end)
        runs = read_runs(n.dsn, variant, created.ids, start, end)
        schedules_mib = relation_mib(n.dsn, "schedules")
        occurrences_mib = relation_mib(n.dsn, "schedule_occurrences")
        dead = compact_mib(n.dsn)
        occurrence_rows = int(_one(n.dsn, "SELECT count(*) FROM schedule_occurrences") or 0)
        logs = n.group.logs() if started < expected else ""
    cpu = {k: cpu_used(cpu0[k], cpu1[k]) for k in cpu0}
    delta = {k: stats1.get(k, 0.0) - stats0.get(k, 0.0) for k in stats1}
    during_create = {
        k: stats_after_create.get(k, 0.0) - stats_before_create.get(k, 0.0)
        for k in ("passes", "occurrences_created")
    }
    made = delta.get("occurrences_created", 0.0)
    per_min = 60 / window_s
    in_window = [s for s in sampler.samples if start <= s.at <= end]
    rss_max = max((s.rss_mib for s in in_window), default=math.nan)
    bins = cpu_by_ten_seconds(sampler.samples, start, end)
    late = runs.lateness_s
    row: dict[str, Any] = {
        "variant": variant,
        "schedules": count,
        "creates/s": count / created.seconds,
        "create p50": ms(percentile(created.latencies_s, 50)),
        "create p99": ms(percentile(created.latencies_s, 99)),
        "window min": minutes,
        "passes/min": delta.get("passes", 0.0) * per_min,
        "occurrences created/min": made * per_min,
        "node CPU s/min": cpu["scheduler"] * per_min,
        "node CPU s per 1,000 occurrences": cpu["scheduler"] / (made / 1000) if made else math.nan,
        "node busiest 1 s, % of a core": busiest_second(sampler.samples, start, end),
        "workers CPU s/min": cpu["workers"] * per_min,
        "PG CPU s/min": cpu["postgres"] * per_min,
        "RSS MiB before / after create / steady (max)": (
            f"{rss_before:.0f} / {rss_after:.0f} / {rss_steady:.0f} ({rss_max:.0f})"
        ),
        "schedules MiB": schedules_mib,
        "schedule_occurrences MiB": occurrences_mib,
        "schedules dead rows": dead[0],
        "MiB after VACUUM FULL (schedules / occurrences)": f"{dead[1]:.2f} / {dead[2]:.2f}",
        "occurrences in window": expected,
        "started": len(late),
        "lateness p50": ms(percentile(late, 50)),
        "lateness p95": ms(percentile(late, 95)),
        "lateness p99": ms(percentile(late, 99)),
        "lateness max": ms(max(late, default=math.nan)),
        "early": sum(1 for x in late if x < 0),
        "intent − logical p50 / p99 / max": " / ".join(
            ms(v)
            for v in (
                percentile(runs.intent_s, 50),
                percentile(runs.intent_s, 99),
                max(runs.intent_s, default=math.nan),
            )
        ),
        "missing / doubled / unexpected": f"{runs.missing} / {runs.doubled} / {runs.unexpected}",
        "exactly once": runs.missing == 0 and runs.doubled == 0 and runs.unexpected == 0,
    }
    notes.append(
        f"{variant}: window {start:%H:%M:%S}–{end:%H:%M:%S} UTC; materialiser over the "
        "window: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(delta.items()))
        + f"; creating the schedules took {cpu_create:.1f} CPU s of the node and "
        f"{during_create['passes']:,.0f} passes creating "
        f"{during_create['occurrences_created']:,.0f} occurrences while they were created "
        f"(materialiser totals at the window's start: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(stats0.items()))
        + f"); schedule_occurrences rows at the end {occurrence_rows:,}, in the window "
        f"{runs.occurrence_rows:,}; node CPU s per minute by 10 s of the minute "
        "(:00 :10 :20 :30 :40 :50): " + " ".join(f"{x:.2f}" for x in bins)
    )
    if started < expected:
        notes.append(
            f"{variant}: only {started:,} of {expected:,} occurrences of the window started "
            f"within {DRAIN_TIMEOUT_S:.0f} s after it; node log tail: {logs[-1500:]}"
        )
    return row, notes


def schedules(
    infra: Infrastructure,
    count: int,
    minutes: float,
    variants: list[str],
    concurrency: int,
    slots: int,
    lookahead_s: float | None,
) -> Report:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for variant in variants:
        row, variant_notes = run_variant(
            infra, variant, count, minutes, concurrency, slots, lookahead_s
        )
        rows.append(row)
        notes += variant_notes
    notes.append(
        "node CPU is the materialiser and the dispatch of the same occurrences together "
        "(see bench/schedules.py); lateness = handler start − logical date; early = "
        "handler starts before the logical date; intent − logical = the dispatch "
        "transaction's time (task_attempts.entered_at) − logical date (negative: sent "
        "ahead by lead dispatch)."
    )
    return Report(
        workload="schedules",
        command="",
        parameters={
            "schedules": count,
            "minutes": minutes,
            "variants": ",".join(variants),
            "create concurrency": concurrency,
            "worker processes": WORKERS,
            "slots per worker": slots,
            "lookahead_s": "default" if lookahead_s is None else lookahead_s,
            "template": f"{TASK_TYPE}, strict_timing, overlap ALLOW",
        },
        columns=list(rows[0]),
        rows=rows,
        targets=[
            Target(
                f"{r['variant']}: every occurrence of the window ran exactly once",
                bool(r["exactly once"]),
                r["missing / doubled / unexpected"] + " missing / doubled / unexpected",
            )
            for r in rows
        ],
        notes=notes,
    )
