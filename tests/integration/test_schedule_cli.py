"""``chronoshard schedules`` and the client's schedule methods (async and sync) against
one real node (a scheduler process of ``harness.cluster``, real PostgreSQL and etcd),
with an in-process worker where occurrences must run.

What the node did is read back with plain SQL (rows in ``schedules``,
``schedule_occurrences`` and ``tasks``), not only from what the CLI printed; a refused
spec must print the server's message naming the field, exit non-zero, and write nothing.
A schedule of a workflow (``--workflow FILE``) is read back through ``workflows get``
as well: its runs need no worker to exist.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from fixtures.cli_runs import run
from fixtures.waiting import eventually
from harness.cluster import Cluster, running_cluster

from chronoshard import (
    AlreadyExistsError,
    CatchupPolicy,
    Client,
    InvalidArgumentError,
    NotFoundError,
    OverlapPolicy,
    RunOrigin,
    ScheduleSpec,
    ScheduleWatch,
    SyncClient,
    TaskSpec,
    TaskStatus,
    cli,
)
from chronoshard.services import EtcdProcess
from chronoshard.worker import TaskContext, Worker

SHARDS = 4
NODE = "node-1"
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def cluster(
    fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path, no_cli_env: None
) -> Iterator[Cluster]:
    """One scheduler node (``NODE``) owning every shard, and no worker process. The
    materialiser passes every 0.2 s and creates occurrences 2 s ahead, so that a
    schedule of every second runs within a test's patience."""
    with running_cluster(
        fresh_db_dsn,
        etcd.endpoint,
        tmp_path,
        nodes=1,
        workers=0,
        shard_count=SHARDS,
        scheduler_env={
            "CHRONOSHARD_ETCD__LEASE_TTL_S": "5",
            "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
            "CHRONOSHARD_SCHEDULES__INTERVAL_S": "0.2",
            "CHRONOSHARD_SCHEDULES__LOOKAHEAD_S": "2",
            "CHRONOSHARD_SCHEDULES__OVERLAP_LEAD_S": "1",
        },
    ) as running:
        yield running


@dataclass
class Seen:
    """What the in-process worker ran: (schedule id, logical date) per attempt."""

    runs: list[tuple[str | None, datetime | None]] = dataclasses.field(default_factory=list)


@pytest.fixture
async def worker(cluster: Cluster) -> AsyncIterator[Seen]:
    """Serves sched.tick (records ctx.schedule_id and ctx.logical_date, completes)."""
    seen = Seen()
    made = Worker(cluster.targets(), api_key=cluster.api_key, worker_id="sched-worker", slots=4)

    @made.task("sched.tick")
    async def tick(ctx: TaskContext) -> dict[str, Any]:
        schedule_id = None if ctx.schedule_id is None else str(ctx.schedule_id)
        seen.runs.append((schedule_id, ctx.logical_date))
        return {"logical_date": None if ctx.logical_date is None else ctx.logical_date.isoformat()}

    running = asyncio.create_task(made.run())
    try:
        yield seen
    finally:
        made.stop()
        await running


DIAMOND = """\
name: diamond
tasks:
  - {ref: fetch, type: records.fetch, payload: {day: today}, timeout: 10m}
  - {ref: left, type: records.left, after: fetch}
  - {ref: right, type: records.right, after: [fetch], priority: bulk}
  - {ref: join, type: records.join, after: [left, right], trigger_rule: all_done}
"""


def _common(cluster: Cluster, key: str | None = None) -> list[str]:
    return ["--target", cluster.nodes[NODE].address, "--api-key", key or cluster.api_key]


def sql(cluster: Cluster, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]  # a test's literal SQL
        return cur.fetchall() if cur.description else []


def schedule_rows(cluster: Cluster) -> list[tuple[Any, ...]]:
    """(name, cron, interval_s, timezone, catchup, limit, overlap, job_id, watch, paused),
    by name."""
    return sql(
        cluster,
        "SELECT name, cron, interval_s, timezone, catchup_policy, catchup_limit,"
        " overlap_policy, job_id, watch, paused FROM schedules ORDER BY name",
    )


def occurrences(cluster: Cluster, schedule_id: str) -> list[tuple[datetime, str, str | None]]:
    """(logical date, origin, its task's status) of every occurrence, oldest first."""
    rows = sql(
        cluster,
        "SELECT o.logical_date, o.origin, t.status FROM schedule_occurrences o"
        " LEFT JOIN tasks t ON t.id = o.task_id WHERE o.schedule_id = %s"
        " ORDER BY o.logical_date",
        schedule_id,
    )
    return [(r[0], r[1], r[2]) for r in rows]


def counts(cluster: Cluster) -> tuple[int, int, int]:
    """Rows in schedules, schedule_occurrences, and tasks of a schedule."""
    [row] = sql(
        cluster,
        "SELECT (SELECT count(*) FROM schedules), (SELECT count(*) FROM schedule_occurrences),"
        " (SELECT count(*) FROM tasks WHERE schedule_id IS NOT NULL)",
    )
    return (row[0], row[1], row[2])


def berlin_dailies(after: datetime, hour: int, minute: int, n: int) -> list[datetime]:
    """The next ``n`` instants after ``after`` whose Berlin wall time is hour:minute."""
    found: list[datetime] = []
    day = after.astimezone(BERLIN).date()
    while len(found) < n:
        at = datetime(day.year, day.month, day.day, hour, minute, tzinfo=BERLIN)
        if at > after:
            found.append(at.astimezone(UTC))
        day += timedelta(days=1)
    return found


def iso(value: datetime) -> str:
    """As ``-o json`` writes an instant: UTC, milliseconds, ``Z``."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def test_create_ls_get_update_rm(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    common = _common(cluster)
    before = datetime.now(UTC)
    made = await run(
        capsys, "schedules", "create", "nightly", "report.build", "--cron", "30 2 * * *",
        "--tz", "Europe/Berlin", "--payload", '{"format": "pdf"}', "--timeout", "20m",
        "--overlap", "skip", "--catchup", "all", "--catchup-limit", "3", "--priority", "bulk",
        "--max-retries", "2", "--severity", "warning", "--tolerance", "5m", "-o", "json",
        *common,
    )  # fmt: skip
    assert made.code == cli.EXIT_OK, made.err
    nightly = made.json()
    spec = nightly["spec"]
    assert (spec["name"], spec["cron"], spec["timezone"]) == (
        "nightly",
        "30 2 * * *",
        "Europe/Berlin",
    )
    assert (spec["catchup"], spec["catchup_limit"], spec["overlap"]) == ("all", 3, "skip")
    task = spec["task"]
    assert (task["type"], task["payload"], task["timeout_s"], task["priority"]) == (
        "report.build", {"format": "pdf"}, 1200.0, "bulk",
    )  # fmt: skip
    assert task["max_retries"] == 2
    assert (spec["watch"]["severity"], spec["watch"]["tolerance_s"]) == ("warning", 300.0)
    assert nightly["paused"] is False
    [first] = berlin_dailies(before, 2, 30, 1)
    assert nightly["next_occurrence"] == iso(first)
    assert schedule_rows(cluster) == [
        ("nightly", "30 2 * * *", None, "Europe/Berlin", "ALL", 3, "SKIP", "nightly", True, False)
    ]

    start = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    end = start + timedelta(days=1)
    text = await run(
        capsys, "schedules", "create", "heartbeat", "sched.tick", "--every", "90s", "--strict",
        "--no-watch", "--start", iso(start), "--end", iso(end), *common,
    )  # fmt: skip
    assert text.code == cli.EXIT_OK, text.err
    assert text.out.startswith("created heartbeat (") and "every 90s, active" in text.out
    heartbeat_query = "SELECT interval_s, watch, start_at, end_at FROM schedules WHERE name = %s"
    assert sql(cluster, heartbeat_query, "heartbeat") == [(90.0, False, start, end)]

    taken = await run(capsys, "schedules", "create", "nightly", "x", "--every", "1h", *common)
    assert taken.code == cli.EXIT_FAILURE and "ALREADY_EXISTS" in taken.err
    assert len(schedule_rows(cluster)) == 2

    listed = await run(capsys, "schedules", "ls", "-o", "json", *common)
    assert listed.code == cli.EXIT_OK, listed.err
    assert [s["spec"]["name"] for s in listed.json()["schedules"]] == ["heartbeat", "nightly"]
    assert listed.json()["more"] is False
    page = await run(capsys, "schedules", "ls", "--limit", "1", "-o", "json", *common)
    assert [s["spec"]["name"] for s in page.json()["schedules"]] == ["heartbeat"]
    assert page.json()["more"] is True
    table = await run(capsys, "schedules", "ls", *common)
    lines = table.out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "RULE", "ZONE"]
    assert "heartbeat" in lines[1] and "every 90s" in lines[1] and "UTC" in lines[1]
    assert "nightly" in lines[2] and "cron 30 2 * * *" in lines[2] and "Europe/Berlin" in lines[2]

    # get: the next five occurrences in the zone (wall time 02:30, its offset) and in UTC.
    now = datetime.now(UTC)
    expected = berlin_dailies(now, 2, 30, 5)
    got = await run(capsys, "schedules", "get", "nightly", "-o", "json", *common)
    assert got.code == cli.EXIT_OK, got.err
    assert got.json()["next_occurrences"] == [iso(t) for t in expected]
    assert got.json()["runs"] == [] and got.json()["schedule"]["id"] == nightly["id"]
    shown = await run(capsys, "schedules", "get", nightly["id"], *common)
    assert shown.code == cli.EXIT_OK, shown.err
    assert "next occurrences:" in shown.out and "IN Europe/Berlin" in shown.out
    assert "no runs yet" in shown.out and "catchup:" in shown.out
    rows = [line for line in shown.out.splitlines() if " 02:30:00.000 +0" in line]
    assert len(rows) == 5
    for i, (line, at) in enumerate(zip(rows, expected, strict=True), 1):
        local = at.astimezone(BERLIN)
        assert line.split()[0] == str(i)
        assert f"{local:%Y-%m-%d} 02:30:00.000 {local:%z}"[:-2] in line  # +01 / +02
        assert local.tzname() in line  # CET or CEST
        assert at.strftime("%Y-%m-%d %H:%M:%S") in line  # the UTC column
    fewer = await run(capsys, "schedules", "get", "nightly", "--next", "2", "-o", "json", *common)
    assert len(fewer.json()["next_occurrences"]) == 2

    # update: the options given change, the rest is kept (the spec is read, then sent whole).
    changed = await run(
        capsys, "schedules", "update", "nightly", "--cron", "0 3 * * *", "--name", "nightly-pdf",
        "--payload", '{"format": "png"}', "-o", "json", *common,
    )  # fmt: skip
    assert changed.code == cli.EXIT_OK, changed.err
    after = changed.json()
    assert after["id"] == nightly["id"]
    assert (after["spec"]["name"], after["spec"]["cron"]) == ("nightly-pdf", "0 3 * * *")
    assert after["spec"]["task"]["payload"] == {"format": "png"}
    assert after["spec"]["task"]["timeout_s"] == 1200.0
    assert after["spec"]["watch"]["severity"] == "warning"
    assert [r[:7] for r in schedule_rows(cluster)] == [
        ("heartbeat", None, 90.0, "UTC", "SKIP", 1, "ALLOW"),
        ("nightly-pdf", "0 3 * * *", None, "Europe/Berlin", "ALL", 3, "SKIP"),
    ]
    gone = await run(capsys, "schedules", "get", "nightly", *common)
    assert gone.code == cli.EXIT_NOT_FOUND and "NOT_FOUND" in gone.err
    every = await run(
        capsys, "schedules", "update", "heartbeat", "--every", "2m", "--watch", *common
    )
    assert every.code == cli.EXIT_OK and every.out.startswith("updated heartbeat")
    assert sql(cluster, "SELECT interval_s, watch FROM schedules WHERE name = 'heartbeat'") == [
        (120.0, True)
    ]

    # Another tenant sees none of them and changes nothing.
    made_key = await asyncio.to_thread(cluster.new_tenant, "theirs")
    theirs = _common(cluster, made_key.api_key)
    assert (await run(capsys, "schedules", "ls", "-o", "json", *theirs)).json()["schedules"] == []
    for command in (("get",), ("pause",), ("rm",), ("trigger",), ("update", "--every", "1h")):
        refused = await run(capsys, "schedules", command[0], "heartbeat", *command[1:], *theirs)
        assert refused.code == cli.EXIT_NOT_FOUND, (command, refused.err)
        assert "NOT_FOUND" in refused.err

    # rm: the row and its history go.
    removed = await run(capsys, "schedules", "rm", "nightly-pdf", "-o", "json", *common)
    assert removed.code == cli.EXIT_OK, removed.err
    assert removed.json() == {"schedule": "nightly-pdf", "withdrawn": 0}
    assert [r[0] for r in schedule_rows(cluster)] == ["heartbeat"]
    text_rm = await run(capsys, "schedules", "rm", "heartbeat", *common)
    assert text_rm.out == "deleted heartbeat (0 occurrences withdrawn)\n"
    again = await run(capsys, "schedules", "rm", "heartbeat", *common)
    assert again.code == cli.EXIT_NOT_FOUND
    assert (await run(capsys, "schedules", "ls", *common)).out == "no schedules\n"


BAD_SPECS = [
    # (arguments after NAME TYPE, the field the server names, words of its message)
    (["--cron", "61 * * * *"], "spec.cron", ""),
    (["--cron", "0 3 * * *", "--tz", "Mars/Olympus_Mons"], "spec.timezone", ""),
    (["--every", "1h", "--start", "2031-01-02T00:00:00Z", "--end", "2031-01-01T00:00:00Z"],
     "spec.end_at", "must be after start_at"),
    (["--cron", "@daily", "--catchup", "all"], "spec.catchup_limit", "required with catchup"),
    (["--every", "1m", "--overlap", "skip"], "spec.task_template.timeout", "is required"),
]  # fmt: skip


async def test_bad_specs_print_the_servers_field_and_write_nothing(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    common = _common(cluster)
    kept = await run(capsys, "schedules", "create", "kept", "x.y", "--every", "1h", *common)
    assert kept.code == cli.EXIT_OK, kept.err
    written = counts(cluster)
    rows = schedule_rows(cluster)
    for argv, field, words in BAD_SPECS:
        refused = await run(capsys, "schedules", "create", "bad", "x.y", *argv, *common)
        assert refused.code == cli.EXIT_FAILURE, (argv, refused)
        assert refused.out == ""
        assert f"INVALID_ARGUMENT/INVALID_ARGUMENT (field {field}): " in refused.err, (
            argv,
            refused.err,
        )
        assert words in refused.err
        # The same spec on update: refused the same way, and the schedule stays as it was.
        changed = await run(capsys, "schedules", "update", "kept", *argv, *common)
        assert changed.code == cli.EXIT_FAILURE, (argv, changed)
        assert f"(field {field}): " in changed.err, (argv, changed.err)
        assert counts(cluster) == written and schedule_rows(cluster) == rows
    # Backfill's own range: refused before any call, and by the server.
    backwards = await run(
        capsys, "schedules", "backfill", "kept", "--from", "2030-01-02T00:00:00Z",
        "--to", "2030-01-01T00:00:00Z", *common,
    )  # fmt: skip
    assert backwards.code == cli.EXIT_USAGE and "--to is before --from" in backwards.err
    ahead = await run(
        capsys, "schedules", "backfill", "kept", "--from", iso(datetime.now(UTC)),
        "--to", iso(datetime.now(UTC) + timedelta(hours=1)), *common,
    )  # fmt: skip
    assert ahead.code == cli.EXIT_FAILURE and "(field end): " in ahead.err
    assert "is in the future" in ahead.err
    assert counts(cluster) == written
    for argv in (
        ["schedules", "create", "x", "y", *common],  # no rule
        ["schedules", "create", "x", "y", "--cron", "@daily", "--every", "1h", *common],
        ["schedules", "create", "x", "y", "--every", "0s", *common],
        ["schedules", "create", "x", "y", "--every", "1h", "--start", "2030-01-01", *common],
        ["schedules", "get", "kept", "--next", "101", *common],
        ["schedules", "backfill", "kept", "--from", "2030-01-01T00:00:00Z", *common],
    ):
        with pytest.raises(SystemExit) as exited:
            await run(capsys, *argv)
        assert exited.value.code == cli.EXIT_USAGE, argv
    assert counts(cluster) == written


async def test_occurrences_run_pause_trigger_resume_backfill(
    cluster: Cluster, worker: Seen, capsys: pytest.CaptureFixture[str]
) -> None:
    common = _common(cluster)
    made = await run(
        capsys, "schedules", "create", "tick", "sched.tick", "--cron", "* * * * * *", "--strict",
        "--no-watch", "-o", "json", *common,
    )  # fmt: skip
    assert made.code == cli.EXIT_OK, made.err
    schedule_id = made.json()["id"]

    def completed() -> list[tuple[datetime, str, str | None]] | None:
        done = [o for o in occurrences(cluster, schedule_id) if o[2] == "COMPLETED"]
        return done if len(done) >= 2 else None

    done = await eventually(completed, timeout_s=20, what="two occurrences completed")
    assert {o[1] for o in done} == {"SCHEDULE"}
    # The worker saw each occurrence's logical date: whole seconds, the rule's.
    ran = [at for sid, at in worker.runs if sid == schedule_id]
    assert ran and all(at is not None and at.microsecond == 0 for at in ran)
    assert {o[0] for o in done} <= set(ran)

    shown = await run(capsys, "schedules", "get", "tick", "-o", "json", *common)
    runs = shown.json()["runs"]
    assert runs and all(r["origin"] == "SCHEDULE" for r in runs)
    assert runs == sorted(runs, key=lambda r: r["logical_date"], reverse=True)
    assert "COMPLETED" in {r["status"] for r in runs}
    text = await run(capsys, "schedules", "get", "tick", "--runs", "3", *common)
    assert "latest runs:" in text.out and "COMPLETED" in text.out and "SCHEDULE" in text.out

    paused = await run(capsys, "schedules", "pause", "tick", "-o", "json", *common)
    assert paused.code == cli.EXIT_OK, paused.err
    assert paused.json()["paused"] is True and paused.json()["next_occurrence"] is None
    assert sql(cluster, "SELECT paused FROM schedules WHERE id = %s", schedule_id) == [(True,)]
    # Nothing created ahead is left to run: each task is finished or withdrawn.
    await asyncio.sleep(1.5)
    statuses = {o[2] for o in occurrences(cluster, schedule_id)}
    assert statuses <= {"COMPLETED", "CANCELLED", "RUNNING"}, statuses
    frozen = len(occurrences(cluster, schedule_id))
    await asyncio.sleep(1.5)
    assert len(occurrences(cluster, schedule_id)) == frozen
    listed = await run(capsys, "schedules", "ls", *common)
    assert "paused" in listed.out
    text = await run(capsys, "schedules", "get", "tick", *common)
    assert "state" in text.out and "paused" in text.out
    again = await run(capsys, "schedules", "pause", "tick", *common)
    assert again.code == cli.EXIT_OK and again.out.startswith("paused tick (")

    # trigger: one occurrence now, whatever the pause; its task runs.
    triggered = await run(capsys, "schedules", "trigger", "tick", "-o", "json", *common)
    assert triggered.code == cli.EXIT_OK, triggered.err
    trig = triggered.json()
    assert trig["origin"] == "TRIGGER" and trig["task_id"]
    done_query = "SELECT 1 FROM tasks WHERE id = %s AND status = 'COMPLETED'"
    await eventually(
        lambda: sql(cluster, done_query, trig["task_id"]) or None,
        timeout_s=15,
        what="the triggered occurrence completed",
    )
    [(origin, logical)] = sql(
        cluster,
        "SELECT o.origin, o.logical_date FROM schedule_occurrences o WHERE o.task_id = %s",
        trig["task_id"],
    )
    assert origin == "TRIGGER" and iso(logical) == trig["logical_date"]
    trigger_text = await run(capsys, "schedules", "trigger", "tick", *common)
    assert trigger_text.code == cli.EXIT_OK and trigger_text.out.startswith("triggered tick: ")
    assert "TRIGGER" in trigger_text.out

    # backfill: the rule's occurrences of a past range that have none, each its own date.
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    start = end - timedelta(seconds=4)
    had = {o[0] for o in occurrences(cluster, schedule_id)}
    wanted = [start + timedelta(seconds=i) for i in range(5)]
    missing = [at for at in wanted if at not in had]
    filled = await run(
        capsys, "schedules", "backfill", "tick", "--from", iso(start), "--to", iso(end),
        "-o", "json", *common,
    )  # fmt: skip
    assert filled.code == cli.EXIT_OK, filled.err
    result = filled.json()
    assert [r["logical_date"] for r in result["runs"]] == [iso(at) for at in missing]
    assert {r["origin"] for r in result["runs"]} == ({"BACKFILL"} if missing else set())
    assert result["existing"] == len(wanted) - len(missing)
    by_date = {o[0]: o for o in occurrences(cluster, schedule_id)}
    assert all(by_date[at][1] == "BACKFILL" for at in missing)
    repeat = await run(
        capsys, "schedules", "backfill", "tick", "--from", iso(start), "--to", iso(end), *common
    )
    assert repeat.code == cli.EXIT_OK
    assert repeat.out.startswith("backfilled tick: 0 runs created, 5 already had one")

    resumed = await run(capsys, "schedules", "resume", "tick", "-o", "json", *common)
    assert resumed.code == cli.EXIT_OK, resumed.err
    assert resumed.json()["paused"] is False and resumed.json()["next_occurrence"] is not None
    resumed_at = datetime.now(UTC)

    def ran_after_resume() -> list[tuple[datetime, str, str | None]] | None:
        found = [
            o
            for o in occurrences(cluster, schedule_id)
            if o[1] == "SCHEDULE" and o[0] > resumed_at and o[2] == "COMPLETED"
        ]
        return found or None

    await eventually(
        ran_after_resume, timeout_s=15, what="an occurrence after the resume completed"
    )

    removed = await run(capsys, "schedules", "rm", "tick", "-o", "json", *common)
    assert removed.code == cli.EXIT_OK, removed.err
    assert sql(cluster, "SELECT count(*) FROM schedules") == [(0,)]
    assert sql(cluster, "SELECT count(*) FROM schedule_occurrences") == [(0,)]
    # Tasks that ran stay; none created ahead is left to run.
    left = sql(cluster, "SELECT DISTINCT status FROM tasks WHERE schedule_id = %s", schedule_id)
    assert {r[0] for r in left} <= {"COMPLETED", "CANCELLED", "RUNNING"}
    assert ("COMPLETED",) in left


def _template() -> TaskSpec:
    return TaskSpec(type="sched.tick", payload={"n": 1}, timeout_s=30, strict_timing=True)


async def test_async_client(cluster: Cluster, worker: Seen) -> None:
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        spec = ScheduleSpec(
            name="py-async",
            task=_template(),
            cron="*/2 * * * * *",
            timezone="Europe/Berlin",
            overlap=OverlapPolicy.BUFFER_ONE,
            catchup=CatchupPolicy.LATEST,
            watch=ScheduleWatch(disabled=True),
        )
        created = await client.create_schedule(spec)
        assert created.name == "py-async" and not created.paused
        assert created.spec.overlap is OverlapPolicy.BUFFER_ONE
        assert created.spec.catchup is CatchupPolicy.LATEST
        assert created.spec.task.payload == {"n": 1} and created.spec.task.timeout_s == 30
        with pytest.raises(AlreadyExistsError):
            await client.create_schedule(spec)
        with pytest.raises(InvalidArgumentError) as bad:
            await client.create_schedule(dataclasses.replace(spec, name="x", cron="not cron"))
        assert bad.value.field == "spec.cron"
        with pytest.raises(InvalidArgumentError) as bad_zone:
            await client.create_schedule(dataclasses.replace(spec, name="x", timezone="No/Where"))
        assert bad_zone.value.field == "spec.timezone"
        with pytest.raises(InvalidArgumentError) as no_timeout:
            await client.create_schedule(
                dataclasses.replace(
                    spec, name="x", task=dataclasses.replace(_template(), timeout_s=None)
                )
            )
        assert no_timeout.value.field == "spec.task_template.timeout"
        assert [r[0] for r in schedule_rows(cluster)] == ["py-async"]

        await eventually(
            lambda: [o for o in occurrences(cluster, created.id) if o[2] == "COMPLETED"] or None,
            timeout_s=20,
            what="an occurrence completed",
        )
        details = await client.get_schedule(created.id, next_count=3, runs_count=5)
        assert len(details.next_occurrences) == 3
        assert all(t.second % 2 == 0 and t.microsecond == 0 for t in details.next_occurrences)
        assert details.runs and details.runs[0].origin is RunOrigin.SCHEDULE
        assert TaskStatus.COMPLETED in {r.status for r in details.runs}
        [(_, logical)] = [r for r in worker.runs if r[0] == created.id][:1]
        assert logical is not None and logical.second % 2 == 0

        # Started 12.5 h ago: an interval's occurrences are start + k * interval, none
        # before; the half hour keeps every one out of the misfire grace (none runs now).
        started = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=12, minutes=30)
        second = await client.create_schedule(
            ScheduleSpec(name="py-b", task=_template(), interval_s=3600, start_at=started)
        )
        page = await client.list_schedules(page_size=1)
        assert [s.name for s in page.schedules] == ["py-async"] and page.next_page_token
        rest = await client.list_schedules(page_size=1, page_token=page.next_page_token)
        assert [s.name for s in rest.schedules] == ["py-b"]
        assert [s.name async for s in client.iter_schedules(page_size=1)] == ["py-async", "py-b"]

        updated = await client.update_schedule(
            second.id, dataclasses.replace(second.spec, interval_s=7200, name="py-c")
        )
        assert (updated.id, updated.name, updated.spec.interval_s) == (second.id, "py-c", 7200)
        assert sql(cluster, "SELECT name, interval_s FROM schedules WHERE id = %s", second.id) == [
            ("py-c", 7200.0)
        ]
        paused = await client.pause_schedule("py-async")
        assert paused.paused and paused.next_occurrence is None
        run_ = await client.trigger_schedule("py-async")
        assert run_.origin is RunOrigin.TRIGGER and run_.task_id is not None
        resumed = await client.resume_schedule("py-async")
        assert not resumed.paused
        end = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
        filled = await client.backfill_schedule("py-c", end - timedelta(hours=6), end)
        assert [r.logical_date for r in filled.runs] == [
            started + timedelta(hours=h) for h in (6, 8, 10)
        ]
        assert {r.origin for r in filled.runs} == {RunOrigin.BACKFILL}
        by_date = {o[0]: o[1] for o in occurrences(cluster, second.id)}
        assert [by_date[r.logical_date] for r in filled.runs] == ["BACKFILL"] * 3
        again = await client.backfill_schedule("py-c", end - timedelta(hours=6), end)
        assert (again.runs, again.existing) == ((), len(filled.runs))
        assert await client.delete_schedule("py-c") == 0
        with pytest.raises(NotFoundError):
            await client.get_schedule("py-c")
        await client.delete_schedule("py-async")
        assert schedule_rows(cluster) == []


def test_sync_client(cluster: Cluster) -> None:
    with SyncClient(cluster.targets(), api_key=cluster.api_key) as client:
        made = client.create_schedule(
            ScheduleSpec(
                name="py-sync",
                task=TaskSpec(type="sched.tick"),
                cron="0 9 * * 1-5",
                timezone="America/New_York",
                catchup=CatchupPolicy.ALL,
                catchup_limit=5,
            )
        )
        assert made.spec.catchup_limit == 5
        details = client.get_schedule("py-sync")
        assert len(details.next_occurrences) == 5 and details.runs == ()
        zone = ZoneInfo("America/New_York")
        assert all(
            t.astimezone(zone).hour == 9 and t.astimezone(zone).weekday() < 5
            for t in details.next_occurrences
        )
        assert [s.name for s in client.iter_schedules()] == ["py-sync"]
        assert client.list_schedules().next_page_token is None
        with pytest.raises(InvalidArgumentError) as bad:
            client.update_schedule("py-sync", dataclasses.replace(made.spec, catchup_limit=None))
        # What was read back says limit 5 explicitly; None with ALL is the server's error.
        assert bad.value.field == "spec.catchup_limit"
        moved = client.update_schedule("py-sync", dataclasses.replace(made.spec, cron="0 10 * * *"))
        assert moved.spec.cron == "0 10 * * *"
        assert client.pause_schedule(made.id).paused
        assert not client.resume_schedule(made.id).paused
        run_ = client.trigger_schedule("py-sync")
        assert run_.origin is RunOrigin.TRIGGER
        assert sql(
            cluster, "SELECT origin FROM schedule_occurrences WHERE schedule_id = %s", made.id
        ) == [("TRIGGER",)]
        client.delete_schedule("py-sync")
        with pytest.raises(NotFoundError):
            client.pause_schedule("py-sync")

        # A schedule past its end has no next occurrence; a trigger still runs one (the
        # contract: whatever the rule, a pause or the end).
        ends = client.create_schedule(
            ScheduleSpec(
                name="py-ends",
                task=TaskSpec(type="sched.tick"),
                interval_s=1,
                end_at=datetime.now(UTC) + timedelta(seconds=2),
                watch=ScheduleWatch(disabled=True),
            )
        )
        assert ends.spec.end_at is not None
        deadline = time.monotonic() + 20
        # "ended" (no next occurrence) comes up to the lookahead before the end: the last
        # occurrences are created ahead; the next ones listed run out at the end itself.
        while (
            client.get_schedule(ends.id).schedule.next_occurrence is not None
            or datetime.now(UTC) <= ends.spec.end_at
        ):
            assert time.monotonic() < deadline, "the schedule did not end"
            time.sleep(0.2)
        assert client.get_schedule(ends.id).next_occurrences == ()
        late = client.trigger_schedule(ends.id)
        assert late.origin is RunOrigin.TRIGGER and late.task_id is not None


async def test_a_workflow_schedule_creates_a_run_per_occurrence(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    common = _common(cluster)
    flow = tmp_path / "diamond.yaml"
    flow.write_text(DIAMOND, encoding="utf-8")
    made = await run(
        capsys, "schedules", "create", "etl", "--workflow", str(flow), "--every", "1s",
        "--no-watch", "-o", "json", *common,
    )  # fmt: skip
    assert made.code == cli.EXIT_OK, made.err
    schedule = made.json()
    assert schedule["spec"]["task"] is None
    template = schedule["spec"]["workflow"]
    assert template["name"] == "diamond"
    assert [t["ref"] for t in template["tasks"]] == ["fetch", "left", "right", "join"]
    assert len(template["edges"]) == 4

    async def workflow_runs() -> list[dict[str, Any]] | None:
        shown = await run(capsys, "schedules", "get", "etl", "-o", "json", *common)
        assert shown.code == cli.EXIT_OK, shown.err
        return [r for r in shown.json()["runs"] if r["workflow_id"]] or None

    runs = await eventually(workflow_runs, timeout_s=15, what="a run that created a workflow")
    first = runs[-1]  # newest first: the oldest shown
    assert first["task_id"] is None and first["origin"] == "SCHEDULE"
    assert first["status"] == "RUNNING"  # no worker: the run waits on its first task

    got = await run(capsys, "workflows", "get", first["workflow_id"], "-o", "json", *common)
    assert got.code == cli.EXIT_OK, got.err
    detail = got.json()
    workflow = detail["workflow"]
    assert (workflow["name"], workflow["state"], workflow["task_count"]) == (
        "diamond", "RUNNING", 4,
    )  # fmt: skip
    assert (workflow["schedule_id"], workflow["job_id"]) == (schedule["id"], "etl")
    assert workflow["logical_date"] == first["logical_date"]
    assert [t["ref"] for t in detail["tasks"]] == ["fetch", "left", "right", "join"]
    assert {t["task"]["logical_date"] for t in detail["tasks"]} == {first["logical_date"]}
    assert {t["task"]["schedule_id"] for t in detail["tasks"]} == {schedule["id"]}
    [(tasks, dates)] = sql(
        cluster,
        "SELECT count(*), count(DISTINCT logical_date) FROM tasks"
        " WHERE workflow_id = %s AND schedule_id = %s",
        first["workflow_id"],
        schedule["id"],
    )
    assert (tasks, dates) == (4, 1)

    # The text views: the workflow where a task would be.
    text = await run(capsys, "schedules", "get", "etl", "--runs", "1", *common)
    assert text.code == cli.EXIT_OK, text.err
    assert "workflow:" in text.out and "4: fetch, left, right, join" in text.out
    [header] = [line for line in text.out.splitlines() if line.startswith("LOGICAL DATE")]
    assert header.split()[4:6] == ["STATUS", "WORKFLOW"]
    listed = await run(capsys, "schedules", "ls", *common)
    assert "workflow (4 tasks)" in listed.out
    triggered = await run(capsys, "schedules", "trigger", "etl", "-o", "json", *common)
    assert triggered.code == cli.EXIT_OK, triggered.err
    assert triggered.json()["task_id"] is None and triggered.json()["workflow_id"]

    removed = await run(capsys, "schedules", "rm", "etl", *common)
    assert removed.code == cli.EXIT_OK, removed.err
    assert sql(cluster, "SELECT count(*) FROM schedules") == [(0,)]
