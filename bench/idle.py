"""Idle cost: the scheduler's CPU while a million timers wait in its wheel.

One scheduler process (no workers) on a fresh database; ``--timers`` strict tasks due
between 45 and 55 minutes from now, inside the preloader's one-hour lookahead. They are
written either by COPY straight into ``tasks`` (``--via copy``, the default: fast, with
the ids, shards and columns the API would write) or through the public client's
SubmitBatch (``--via api``). The run waits until the node's wheel holds them all
(its ``chronoshard_wheel_timers`` gauge), lets it settle, and then reads the process's CPU
(``utime + stime`` from ``/proc``) over ``--window-s``. Nothing falls due in the window,
so what is measured is the cost of waiting: the wheel's driver (which sleeps until the
next non-empty bucket), the preloader's periodic pass, etcd keep-alives, reconcile and
maintenance passes, and the garbage collector walking a million timers.

It also reads what the timers cost in memory (issue 14, target 7): the process's RSS
once it owns its shards, before any task is written, and again after the window; the
growth divided by ``--timers`` is the whole process's bytes per pending timer (the
preloader's reads and the wheel together).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import psycopg
import uvloop

from bench._cluster import SHARDS, Infrastructure, Node, node, process_rss_mib
from bench._report import Report, Target
from chronoshard import Client, SubmitResult, TaskSpec
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.sharding import shard_of

DUE_FROM = timedelta(minutes=45)
DUE_SPREAD = timedelta(minutes=10)
SETTLE_S = 5.0
TARGET_PERCENT = 2.0
TARGET_BYTES_PER_TIMER = 250
# Below this many timers the node's own growth while it runs (connections, caches)
# outweighs the timers': no bytes-per-timer target.
BYTES_TARGET_MIN_TIMERS = 100_000
COPY_COLUMNS = (
    "id, tenant_id, type, scheduled_at, due_at, status, max_retries, backoff_initial_s,"
    " backoff_max_s, backoff_multiplier, jitter_mode, payload, shard, priority, queue,"
    " strict_timing"
)


def _tenant_id(dsn: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT id FROM tenants LIMIT 1").fetchone()
    assert row is not None
    return row[0]


def _copy(n: Node, timers: int) -> None:
    tenant = _tenant_id(n.dsn)
    start = datetime.now(UTC) + DUE_FROM
    step = DUE_SPREAD / timers
    with (
        psycopg.connect(n.dsn) as conn,
        conn.cursor() as cur,
        cur.copy(f"COPY tasks ({COPY_COLUMNS}) FROM STDIN") as copy,
    ):
        for i in range(timers):
            task_id = new_task_id()
            due = start + step * i
            copy.write_row(
                (
                    task_id,
                    tenant,
                    "bench.noop",
                    due,
                    due,
                    "SCHEDULED",
                    3,
                    1.0,
                    300.0,
                    2.0,
                    "NONE",
                    "{}",
                    shard_of(task_id, SHARDS),
                    "standard",
                    "default",
                    True,
                )
            )
    # Nothing wakes the preloader for rows written behind the API: its periodic pass
    # (every second) finds them.


async def _submit(n: Node, timers: int) -> None:
    start = datetime.now(UTC) + DUE_FROM
    step = DUE_SPREAD / timers
    specs = [
        TaskSpec(type="bench.noop", at=start + step * i, strict_timing=True) for i in range(timers)
    ]
    chunks = [specs[i : i + 1000] for i in range(0, timers, 1000)]
    chunks.reverse()
    async with Client(n.address, api_key=n.api_key) as client:

        async def caller() -> None:
            while chunks:
                results = await client.submit_batch(chunks.pop())
                if not all(isinstance(r, SubmitResult) for r in results):
                    raise RuntimeError("a submit was refused")

        await asyncio.gather(caller(), caller())


def idle(
    infra: Infrastructure, timers: int, window_s: float, via: str, settle_s: float = SETTLE_S
) -> Report:
    env = {"CHRONOSHARD_SCHEDULING__MAX_PRELOADED": str(max(timers + 1000, 1_000_000))}
    with node(infra, "idle", env=env) as n:
        rss_start = process_rss_mib(n.pid)
        t0 = time.monotonic()
        if via == "copy":
            _copy(n, timers)
        else:
            uvloop.run(_submit(n, timers))
        written_s = time.monotonic() - t0
        deadline = time.monotonic() + 600
        while (n.scheduler.metric("chronoshard_wheel_timers") or 0) < timers:
            if time.monotonic() > deadline:
                raise TimeoutError("the wheel never held every timer")
            time.sleep(0.5)
        loaded_s = time.monotonic() - t0
        time.sleep(settle_s)
        cpu0, w0 = n.cpu_s(), time.monotonic()
        time.sleep(window_s)
        cpu, elapsed = n.cpu_s() - cpu0, time.monotonic() - w0
        in_wheel = int(n.scheduler.metric("chronoshard_wheel_timers") or 0)
        rss = process_rss_mib(n.pid)
    percent = 100 * cpu / elapsed
    bytes_per_timer = (rss - rss_start) * 2**20 / timers
    row = {
        "timers": timers,
        "written by": via,
        "write s": written_s,
        "in wheel after s": loaded_s,
        "window s": elapsed,
        "scheduler CPU s": cpu,
        "% of one core": percent,
        "RSS at start MiB": rss_start,
        "RSS MiB": rss,
        "bytes per pending timer": bytes_per_timer,
        "timers in wheel": in_wheel,
    }
    targets = [
        Target(
            f"idle with {timers:,} timers < 2% of one core",
            percent < TARGET_PERCENT,
            f"{percent:.2f} %",
        )
    ]
    if timers >= BYTES_TARGET_MIN_TIMERS:
        targets.append(
            Target(
                f"RSS growth ≤ {TARGET_BYTES_PER_TIMER} bytes per pending timer",
                bytes_per_timer <= TARGET_BYTES_PER_TIMER,
                f"{bytes_per_timer:.0f} B",
            )
        )
    return Report(
        workload="idle",
        command="",
        parameters={
            "timers": timers,
            "due": "45-55 min ahead (strict)",
            "via": via,
            "window_s": window_s,
            "settle_s": settle_s,
        },
        columns=list(row),
        rows=[row],
        targets=targets,
        notes=[
            "CPU: user + system time of every thread, from /proc/<pid>/stat.",
            "RSS at start: once the node owns its shards, before any task is written; "
            "bytes per pending timer = (RSS - RSS at start) / timers.",
        ],
    )
