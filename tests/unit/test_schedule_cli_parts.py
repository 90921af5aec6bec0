"""``chronoshard schedules``' pure parts: the options of create and update turned into a
spec (one task, or a workflow read from ``--workflow FILE``), and the rendering of
``get`` (zone-local wall times with their offsets, across daylight-saving changes; the
runs' tasks or workflow runs). No server: values in, strings out."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from chronoshard import cli
from chronoshard._cli import output
from chronoshard._cli.common import UsageError
from chronoshard._cli.schedules import _run_line, schedule_zone, spec_from_args
from chronoshard._cli.workflows import longest_chain_s
from chronoshard.types import (
    AlertSeverity,
    CatchupPolicy,
    OverlapPolicy,
    Priority,
    RetryPolicy,
    RunOrigin,
    Schedule,
    ScheduleDetails,
    ScheduleRun,
    ScheduleSpec,
    ScheduleWatch,
    TaskSpec,
    TaskStatus,
    TriggerRule,
    WorkflowEdge,
    WorkflowTask,
    WorkflowTemplate,
)

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")


def _args(*argv: str) -> object:
    return cli.build_parser().parse_args(["schedules", *argv])


def test_create_options_become_the_spec() -> None:
    args = _args(
        "create", "nightly", "--cron", "30 2 * * *", "--tz", "Europe/Berlin",
        "--start", "2030-01-01T00:00:00Z", "--end", "2031-01-01T00:00:00+01:00",
        "report.build", "--payload", '{"n": 12345678901234567890}', "--queue", "reports",
        "--priority", "bulk", "--max-retries", "2", "--timeout", "20m", "--strict",
        "--jitter-window", "30s", "--idempotent", "--catchup", "all", "--catchup-limit", "7",
        "--overlap", "buffer_one", "--misfire-grace", "2m", "--job-id", "nightly-job",
        "--expected-duration", "15m", "--tolerance", "90s", "--severity", "warning",
    )  # fmt: skip
    assert spec_from_args(args, None) == ScheduleSpec(  # type: ignore[arg-type]
        name="nightly",
        task=TaskSpec(
            type="report.build",
            payload={"n": 12345678901234567890},
            queue="reports",
            priority=Priority.BULK,
            max_retries=2,
            timeout_s=1200.0,
            strict_timing=True,
            jitter_window_s=30.0,
            idempotent=True,
        ),
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        start_at=datetime(2030, 1, 1, tzinfo=UTC),
        end_at=datetime(2030, 12, 31, 23, tzinfo=UTC),
        catchup=CatchupPolicy.ALL,
        catchup_limit=7,
        overlap=OverlapPolicy.BUFFER_ONE,
        job_id="nightly-job",
        watch=ScheduleWatch(
            expected_duration_s=900.0, tolerance_s=90.0, severity=AlertSeverity.WARNING
        ),
        misfire_grace_s=120.0,
    )


def test_create_with_an_interval_and_defaults_leaves_choices_to_the_server() -> None:
    spec = spec_from_args(_args("create", "beat", "demo.echo", "--every", "5m", "--no-watch"), None)  # type: ignore[arg-type]
    assert spec == ScheduleSpec(
        name="beat",
        task=TaskSpec(type="demo.echo"),
        interval_s=300.0,
        watch=ScheduleWatch(disabled=True),
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["create", "n", "t"],  # no rule
        ["create", "n", "t", "--cron", "@daily", "--every", "1m"],
        ["create", "n", "t", "--every", "0s"],
        ["create", "n", "t", "--cron", "@daily", "--start", "2030-01-01T00:00:00"],  # no offset
        ["create", "n", "t", "--cron", "@daily", "--catchup", "some"],
        ["backfill", "n", "--from", "2030-01-01T00:00:00Z"],  # --to is required
        ["get", "n", "--next", "101"],
        ["frobnicate"],
    ],
)
def test_bad_command_lines_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _args(*argv)
    assert exited.value.code == cli.EXIT_USAGE


def test_a_payload_that_is_no_object_is_a_usage_error() -> None:
    args = _args("create", "n", "t", "--cron", "@daily", "--payload", "[1]")
    with pytest.raises(UsageError, match="JSON object"):
        spec_from_args(args, None)  # type: ignore[arg-type]


CURRENT = ScheduleSpec(
    name="nightly",
    task=TaskSpec(
        type="report.build",
        payload={"a": 1},
        max_retries=3,
        retry=RetryPolicy(initial_backoff_s=2.0),
        timeout_s=600.0,
        strict_timing=True,
    ),
    cron="30 2 * * *",
    timezone="Europe/Berlin",
    catchup=CatchupPolicy.LATEST,
    watch=ScheduleWatch(tolerance_s=60.0),
)


def test_update_applies_only_the_options_given() -> None:
    assert spec_from_args(_args("update", "nightly"), CURRENT) == CURRENT  # type: ignore[arg-type]
    changed = spec_from_args(
        _args(
            "update", "nightly", "--every", "1h", "--name", "hourly", "--type", "report.small",
            "--no-strict", "--max-retries", "0", "--no-watch", "--overlap", "skip",
        ),  # type: ignore[arg-type]
        CURRENT,
    )  # fmt: skip
    assert changed == ScheduleSpec(
        name="hourly",
        task=TaskSpec(
            type="report.small",
            payload={"a": 1},
            max_retries=0,
            # --max-retries wins: the policy keeps only its backoff.
            retry=RetryPolicy(initial_backoff_s=2.0),
            timeout_s=600.0,
            strict_timing=False,
        ),
        interval_s=3600.0,
        timezone="Europe/Berlin",
        catchup=CatchupPolicy.LATEST,
        overlap=OverlapPolicy.SKIP,
        watch=ScheduleWatch(disabled=True, tolerance_s=60.0),
    )
    back_to_cron = spec_from_args(_args("update", "hourly", "--cron", "@daily"), changed)  # type: ignore[arg-type]
    assert (back_to_cron.cron, back_to_cron.interval_s) == ("@daily", None)


# As the server answers a spec created with none of them: its defaults filled in.
AS_STORED = ScheduleSpec(
    name="nightly",
    task=TaskSpec(type="report.build", timeout_s=600.0),
    cron="30 2 * * *",
    timezone="UTC",
    catchup=CatchupPolicy.SKIP,
    catchup_limit=1,
    overlap=OverlapPolicy.ALLOW,
    job_id="nightly",
    watch=ScheduleWatch(expected_duration_s=600.0, tolerance_s=60.0, severity="critical"),
    misfire_grace_s=60.0,
)


def test_update_to_catchup_all_asks_for_a_limit_the_server_only_defaulted() -> None:
    # The limit 1 read back is the server's default for SKIP, not a choice: sent back with
    # ALL it would pass silently; without it the server names spec.catchup_limit.
    turned = spec_from_args(_args("update", "nightly", "--catchup", "all"), AS_STORED)  # type: ignore[arg-type]
    assert (turned.catchup, turned.catchup_limit) == (CatchupPolicy.ALL, None)
    given = spec_from_args(
        _args("update", "nightly", "--catchup", "all", "--catchup-limit", "4"),  # type: ignore[arg-type]
        AS_STORED,
    )
    assert given.catchup_limit == 4
    # Already ALL: its limit was chosen, and stays.
    already = dataclasses.replace(AS_STORED, catchup=CatchupPolicy.ALL, catchup_limit=9)
    kept = spec_from_args(_args("update", "nightly", "--catchup", "all"), already)  # type: ignore[arg-type]
    assert kept.catchup_limit == 9


def test_update_of_the_timeout_moves_an_expected_duration_that_followed_it() -> None:
    followed = spec_from_args(_args("update", "nightly", "--timeout", "20m"), AS_STORED)  # type: ignore[arg-type]
    assert followed.task.timeout_s == 1200.0 and followed.watch.expected_duration_s is None
    chosen = dataclasses.replace(AS_STORED, watch=ScheduleWatch(expected_duration_s=300.0))
    kept = spec_from_args(_args("update", "nightly", "--timeout", "20m"), chosen)  # type: ignore[arg-type]
    assert kept.watch.expected_duration_s == 300.0
    explicit = spec_from_args(
        _args("update", "nightly", "--timeout", "20m", "--expected-duration", "2m"),  # type: ignore[arg-type]
        AS_STORED,
    )
    assert explicit.watch.expected_duration_s == 120.0
    untouched = spec_from_args(_args("update", "nightly", "--cron", "@daily"), AS_STORED)  # type: ignore[arg-type]
    assert untouched.watch == AS_STORED.watch


# --- rendering -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instant", "zone", "text"),
    [
        # Berlin's clocks go forward at 01:00 UTC on 2030-03-31: CET +01:00, then CEST +02:00.
        (datetime(2030, 3, 31, 0, 30, tzinfo=UTC), BERLIN, "2030-03-31 01:30:00.000 +01:00 CET"),
        (datetime(2030, 3, 31, 1, 0, tzinfo=UTC), BERLIN, "2030-03-31 03:00:00.000 +02:00 CEST"),
        # ... and back at 01:00 UTC on 2030-10-27: the wall time 02:30 happens twice, told
        # apart by the offset.
        (datetime(2030, 10, 27, 0, 30, tzinfo=UTC), BERLIN, "2030-10-27 02:30:00.000 +02:00 CEST"),
        (datetime(2030, 10, 27, 1, 30, tzinfo=UTC), BERLIN, "2030-10-27 02:30:00.000 +01:00 CET"),
        (NOW, ZoneInfo("America/New_York"), "2030-01-01 22:04:05.000 -05:00 EST"),
        (NOW, ZoneInfo("Australia/Lord_Howe"), "2030-01-02 14:04:05.000 +11:00"),
        (NOW, ZoneInfo("Asia/Kolkata"), "2030-01-02 08:34:05.000 +05:30 IST"),
        (NOW, UTC, "2030-01-02 03:04:05.000 +00:00 UTC"),
    ],
)
def test_zoned_times_show_the_wall_time_and_its_offset(
    instant: datetime, zone: ZoneInfo, text: str
) -> None:
    assert output.zoned_time(instant, zone) == text


def _schedule(spec: ScheduleSpec = CURRENT, **overrides: object) -> Schedule:
    values: dict[str, object] = {
        "id": "0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f",
        "tenant_id": "t",
        "spec": spec,
        "paused": False,
        "next_occurrence": datetime(2030, 3, 31, 0, 30, tzinfo=UTC),
        "created_at": NOW - timedelta(days=1),
        "updated_at": NOW,
    }
    values.update(overrides)
    return Schedule(**values)  # type: ignore[arg-type]


def test_get_shows_the_next_occurrences_in_the_zone_and_in_utc_across_a_dst_change() -> None:
    # 02:30 Berlin daily around the spring change: on 2030-03-31 02:30 does not exist,
    # and the occurrence is at the change itself (03:00 CEST, docs/architecture.md#d13).
    next_occurrences = (
        datetime(2030, 3, 30, 1, 30, tzinfo=UTC),
        datetime(2030, 3, 31, 1, 0, tzinfo=UTC),
        datetime(2030, 4, 1, 0, 30, tzinfo=UTC),
    )
    runs = (
        ScheduleRun(
            logical_date=datetime(2030, 3, 29, 1, 30, tzinfo=UTC),
            origin=RunOrigin.SCHEDULE,
            task_id="0190a7d2-6a3b-7c4d-8e5f-000000000002",
            status=TaskStatus.COMPLETED,
            finished_at=datetime(2030, 3, 29, 1, 31, tzinfo=UTC),
        ),
        ScheduleRun(
            logical_date=datetime(2030, 3, 28, 1, 30, tzinfo=UTC),
            origin=RunOrigin.CATCHUP,
            task_id=None,
            status=None,
            finished_at=None,
        ),
    )
    details = ScheduleDetails(_schedule(), next_occurrences, runs)
    text = output.schedule_details(details, schedule_zone("Europe/Berlin"), NOW)
    lines = text.splitlines()
    start = lines.index("next occurrences:")
    assert lines[start + 1 : start + 5] == [
        "#  IN Europe/Berlin                     UTC",
        "1  2030-03-30 02:30:00.000 +01:00 CET   2030-03-30 01:30:00.000",
        "2  2030-03-31 03:00:00.000 +02:00 CEST  2030-03-31 01:00:00.000",
        "3  2030-04-01 02:30:00.000 +02:00 CEST  2030-04-01 00:30:00.000",
    ]
    start = lines.index("latest runs:")
    assert lines[start + 1].split() == [
        "LOGICAL", "DATE", "(UTC)", "ORIGIN", "STATUS", "TASK", "FINISHED", "(UTC)",
    ]  # fmt: skip
    assert (
        "COMPLETED" in lines[start + 2]
        and "0190a7d2-6a3b-7c4d-8e5f-000000000002" in lines[start + 2]
    )
    assert lines[start + 3].split()[2:4] == ["CATCHUP", "skipped"]
    fields = dict(line.split(":", 1) for line in lines[: lines.index("")])
    assert fields["rule"].strip() == "cron 30 2 * * *"
    assert fields["timezone"].strip() == "Europe/Berlin"
    assert fields["state"].strip() == "active"
    assert fields["catchup"].strip() == "latest"
    assert fields["overlap"].strip() == "allow (default)"
    assert fields["job_id"].strip() == "nightly (the name)"
    assert fields["watch"].strip() == (
        "expected the timeout, else 1m (default), tolerance 1m, severity critical (default)"
    )


def test_get_of_a_zone_this_machine_does_not_know_shows_utc_only() -> None:
    assert schedule_zone("Mars/Olympus_Mons") is None
    assert schedule_zone(None) is UTC
    details = ScheduleDetails(_schedule(), (datetime(2030, 3, 30, 1, 30, tzinfo=UTC),), ())
    text = output.schedule_details(details, None, NOW)
    assert "#  UTC\n1  2030-03-30 01:30:00.000" in text
    assert "not in this machine's tz database" in text and "no runs yet" in text


def test_states_and_rules_in_the_list() -> None:
    interval = ScheduleSpec(name="beat", task=TaskSpec(type="demo.echo"), interval_s=90.0)
    rows = output.schedule_table(
        [
            _schedule(),
            _schedule(interval, paused=True),
            _schedule(interval, next_occurrence=None),
        ]
    ).splitlines()
    assert rows[0].split() == ["NAME", "RULE", "ZONE", "STATE", "NEXT", "(UTC)", "TYPE", "ID"]
    assert "cron 30 2 * * *" in rows[1] and "Europe/Berlin" in rows[1] and "active" in rows[1]
    assert "every 90s" in rows[2] and " UTC " in rows[2] and "paused" in rows[2]
    assert "ended" in rows[3]


def test_json_documents_use_the_client_field_names() -> None:
    run = ScheduleRun(
        logical_date=NOW, origin=RunOrigin.TRIGGER, task_id="x", status=None, finished_at=None
    )
    document = json.loads(output.dumps(ScheduleDetails(_schedule(), (NOW,), (run,))))
    assert set(document) == {"schedule", "next_occurrences", "runs"}
    assert document["next_occurrences"] == ["2030-01-02T03:04:05.000Z"]
    assert document["runs"] == [
        {
            "logical_date": "2030-01-02T03:04:05.000Z",
            "origin": "TRIGGER",
            "task_id": "x",
            "status": None,
            "finished_at": None,
            "workflow_id": None,
        }
    ]
    spec = document["schedule"]["spec"]
    assert (spec["name"], spec["cron"], spec["interval_s"], spec["catchup"]) == (
        "nightly", "30 2 * * *", None, "latest",
    )  # fmt: skip
    assert spec["task"]["type"] == "report.build" and spec["task"]["timeout_s"] == 600.0
    assert spec["watch"] == {
        "disabled": False, "expected_duration_s": None, "tolerance_s": 60.0, "severity": None,
    }  # fmt: skip


# --- a schedule of a workflow ------------------------------------------------------------------

DIAMOND_YAML = """\
name: nightly-etl
tasks:
  - {ref: fetch, type: etl.fetch, timeout: 10m}
  - {ref: left, type: etl.left, after: fetch, timeout: 5m, payload: {side: l}}
  - {ref: right, type: etl.right, after: fetch, timeout: 20m}
  - {ref: join, type: etl.join, after: [left, right], timeout: 1m, trigger_rule: all_done}
"""
DIAMOND = WorkflowTemplate(
    name="nightly-etl",
    tasks=(
        WorkflowTask("fetch", TaskSpec(type="etl.fetch", timeout_s=600.0)),
        WorkflowTask("left", TaskSpec(type="etl.left", payload={"side": "l"}, timeout_s=300.0)),
        WorkflowTask("right", TaskSpec(type="etl.right", timeout_s=1200.0)),
        WorkflowTask("join", TaskSpec(type="etl.join", timeout_s=60.0), TriggerRule.ALL_DONE),
    ),
    edges=(
        WorkflowEdge("fetch", "left"),
        WorkflowEdge("fetch", "right"),
        WorkflowEdge("left", "join"),
        WorkflowEdge("right", "join"),
    ),
)


def _file(tmp_path: Path, text: str, name: str = "flow.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_create_with_a_workflow_file_makes_a_schedule_of_that_workflow(tmp_path: Path) -> None:
    flow = _file(tmp_path, DIAMOND_YAML)
    args = _args("create", "etl", "--workflow", flow, "--cron", "0 3 * * *", "--overlap", "skip")
    assert spec_from_args(args, None) == ScheduleSpec(  # type: ignore[arg-type]
        name="etl", workflow=DIAMOND, cron="0 3 * * *", overlap=OverlapPolicy.SKIP
    )
    # The file `workflows submit` reads, JSON too; a schedule's may leave out its name.
    unnamed = _file(
        tmp_path, '{"tasks": [{"ref": "a", "type": "t.a"}]}', "flow.json"
    )  # fmt: skip
    spec = spec_from_args(_args("create", "etl", "--every", "1h", "--workflow", unnamed), None)  # type: ignore[arg-type]
    assert spec.task is None
    assert spec.workflow == WorkflowTemplate(tasks=(WorkflowTask("a", TaskSpec(type="t.a")),))


@pytest.mark.parametrize(
    ("key", "line", "why"),
    [
        ("delay", "delay: 30s", "starts its run at the occurrence's time"),
        ("scheduled_at", "scheduled_at: 2030-01-02T03:00:00Z", "the occurrence's time"),
        ("idempotency_key", "idempotency_key: k", "keyed by the schedule and its logical date"),
    ],
)
def test_a_schedules_workflow_file_may_not_decide_what_each_occurrence_does(
    tmp_path: Path, key: str, line: str, why: str
) -> None:
    flow = _file(tmp_path, line + "\n" + DIAMOND_YAML)
    with pytest.raises(UsageError) as refused:
        spec_from_args(_args("create", "etl", "--every", "1h", "--workflow", flow), None)  # type: ignore[arg-type]
    message = str(refused.value)
    assert message.startswith(f"{flow}: {key}: not allowed in a schedule's workflow: ")
    assert why in message


def test_a_schedules_workflow_file_is_checked_as_submit_checks_it(tmp_path: Path) -> None:
    flow = _file(tmp_path, "tasks:\n  - {ref: a, type: t, tiemout: 5m, after: [b]}\n")
    with pytest.raises(UsageError) as refused:
        spec_from_args(_args("create", "etl", "--every", "1h", "--workflow", flow), None)  # type: ignore[arg-type]
    assert "tasks[0].tiemout: unknown key (did you mean timeout?)" in str(refused.value)
    assert "tasks[0].after[0]: no task has the ref 'b'" in str(refused.value)
    with pytest.raises(UsageError, match="No such file"):
        spec_from_args(
            _args("create", "etl", "--every", "1h", "--workflow", str(tmp_path / "nope.yaml")),  # type: ignore[arg-type]
            None,
        )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["create", "etl", "t.x", "--every", "1h", "--workflow", "{flow}"], "not both"),
        (["create", "etl", "--every", "1h"], "give the task type each occurrence submits (TYPE)"),
        (
            ["create", "etl", "--every", "1h", "--workflow", "{flow}", "--timeout", "5m"],
            "--timeout",
        ),
        (
            ["create", "etl", "--every", "1h", "--workflow", "{flow}", "--payload", "{}"],
            "--payload",
        ),
        (["create", "etl", "--every", "1h", "--workflow", "{flow}", "--no-strict"], "--strict"),
    ],
)
def test_a_task_type_or_a_workflow_and_no_task_options_with_a_workflow(
    tmp_path: Path, argv: list[str], words: str
) -> None:
    flow = _file(tmp_path, DIAMOND_YAML)
    args = _args(*(a.replace("{flow}", flow) for a in argv))
    with pytest.raises(UsageError) as refused:
        spec_from_args(args, None)  # type: ignore[arg-type]
    assert words in str(refused.value)
    if words.startswith("--"):
        assert "take their options in its file" in str(refused.value)


# As the server answers a schedule of DIAMOND created with no watch options: the
# expected duration is its longest chain, fetch -> right -> join.
FLOW_STORED = ScheduleSpec(
    name="etl",
    workflow=DIAMOND,
    cron="0 3 * * *",
    timezone="UTC",
    catchup=CatchupPolicy.SKIP,
    catchup_limit=1,
    overlap=OverlapPolicy.ALLOW,
    job_id="etl",
    watch=ScheduleWatch(expected_duration_s=1860.0, tolerance_s=60.0, severity="critical"),  # type: ignore[arg-type]
    misfire_grace_s=60.0,
)


def test_longest_chain_is_the_servers_default_expected_duration() -> None:
    assert longest_chain_s(DIAMOND) == 600.0 + 1200.0 + 60.0
    untimed = dataclasses.replace(
        DIAMOND, tasks=(*DIAMOND.tasks[:3], WorkflowTask("join", TaskSpec(type="etl.join")))
    )
    assert longest_chain_s(untimed) is None
    assert longest_chain_s(WorkflowTemplate()) is None
    apart = WorkflowTemplate(tasks=DIAMOND.tasks)  # no edges: the longest single task
    assert longest_chain_s(apart) == 1200.0


def test_update_of_a_workflow_schedule(tmp_path: Path) -> None:
    # Options not given keep the workflow, and its expected duration.
    kept = spec_from_args(_args("update", "etl", "--cron", "0 4 * * *"), FLOW_STORED)  # type: ignore[arg-type]
    assert kept == dataclasses.replace(FLOW_STORED, cron="0 4 * * *")
    # A new file replaces the workflow; the expected duration that was the old longest
    # chain follows the new one (the server's default again).
    shorter = _file(tmp_path, "tasks:\n  - {ref: a, type: t.a, timeout: 2m}\n")
    replaced = spec_from_args(_args("update", "etl", "--workflow", shorter), FLOW_STORED)  # type: ignore[arg-type]
    assert replaced.workflow == WorkflowTemplate(
        tasks=(WorkflowTask("a", TaskSpec(type="t.a", timeout_s=120.0)),)
    )
    assert replaced.task is None and replaced.watch.expected_duration_s is None
    chosen = dataclasses.replace(FLOW_STORED, watch=ScheduleWatch(expected_duration_s=300.0))
    assert spec_from_args(
        _args("update", "etl", "--workflow", shorter), chosen  # type: ignore[arg-type]
    ).watch.expected_duration_s == 300.0  # fmt: skip
    # --type makes it one task again, with the task options given.
    single = spec_from_args(
        _args("update", "etl", "--type", "t.one", "--timeout", "1m"), FLOW_STORED
    )  # type: ignore[arg-type]
    assert (single.task, single.workflow) == (TaskSpec(type="t.one", timeout_s=60.0), None)
    assert single.watch.expected_duration_s is None  # follows the task's timeout now
    # A task option alone has no task to set.
    with pytest.raises(UsageError, match="--queue sets the task of a schedule of one task"):
        spec_from_args(_args("update", "etl", "--queue", "q"), FLOW_STORED)  # type: ignore[arg-type]


def test_update_of_a_task_schedule_to_a_workflow(tmp_path: Path) -> None:
    flow = _file(tmp_path, DIAMOND_YAML)
    turned = spec_from_args(_args("update", "nightly", "--workflow", flow), AS_STORED)  # type: ignore[arg-type]
    assert (turned.task, turned.workflow) == (None, DIAMOND)
    # The expected duration was the task's timeout: it follows the workflow's chain.
    assert turned.watch.expected_duration_s is None
    with pytest.raises(UsageError, match="not both"):
        spec_from_args(_args("update", "nightly", "--workflow", flow, "--type", "x"), AS_STORED)  # type: ignore[arg-type]


def _run(task_id: str | None, workflow_id: str | None, status: TaskStatus | None) -> ScheduleRun:
    return ScheduleRun(
        logical_date=NOW,
        origin=RunOrigin.SCHEDULE,
        task_id=task_id,
        status=status,
        finished_at=None,
        workflow_id=workflow_id,
    )


def test_get_of_a_workflow_schedule_shows_the_workflow_and_its_runs() -> None:
    runs = (
        _run(None, "wf-running", TaskStatus.RUNNING),
        _run(None, "wf-gone", None),
        _run(None, None, None),
    )
    details = ScheduleDetails(_schedule(FLOW_STORED), (), runs)
    text = output.schedule_details(details, UTC, NOW)
    lines = text.splitlines()
    fields = dict(line.split(":", 1) for line in lines[: lines.index("")])
    assert fields["workflow"].strip() == "nightly-etl"
    assert fields["tasks"].strip() == "4: fetch, left, right, join"
    assert fields["edges"].strip() == "4"
    assert "type" not in fields and "payload" not in fields
    start = lines.index("latest runs:")
    assert lines[start + 1].split()[4:6] == ["STATUS", "WORKFLOW"]
    assert lines[start + 2].split()[3:5] == ["RUNNING", "wf-running"]
    assert lines[start + 3].split()[3:5] == ["gone", "wf-gone"]
    assert lines[start + 4].split()[3] == "skipped"
    unnamed = dataclasses.replace(FLOW_STORED, workflow=WorkflowTemplate(tasks=DIAMOND.tasks))
    no_name = output.schedule_fields(_schedule(unnamed), NOW)
    assert "workflow:      etl (the name)" in no_name and "tasks:         4: fetch" in no_name
    defaulted = dataclasses.replace(FLOW_STORED, watch=ScheduleWatch())
    assert "expected the longest chain's timeouts, else 1m (default)" in (
        output.schedule_fields(_schedule(defaulted), NOW)
    )
    # A schedule updated from a task to a workflow has runs of both.
    mixed = output.run_table((_run("task-1", None, TaskStatus.COMPLETED), runs[0]))
    assert mixed.splitlines()[0].split()[5] == "TASK|WORKFLOW"
    assert "task-1" in mixed and "wf-running" in mixed


def test_workflow_schedules_in_the_list_trigger_and_json() -> None:
    rows = output.schedule_table([_schedule(FLOW_STORED)]).splitlines()
    assert "workflow (4 tasks)" in rows[1]
    assert _run_line(_run(None, "wf-1", TaskStatus.RUNNING)).endswith(
        "SCHEDULE  workflow wf-1  RUNNING"
    )
    assert _run_line(_run("task-1", None, None)).endswith("SCHEDULE  task-1  gone")
    document = json.loads(output.dumps(_schedule(FLOW_STORED)))
    assert document["spec"]["task"] is None
    workflow = document["spec"]["workflow"]
    assert workflow["name"] == "nightly-etl"
    assert [t["ref"] for t in workflow["tasks"]] == ["fetch", "left", "right", "join"]
    assert workflow["tasks"][3]["trigger_rule"] == "all_done"
    assert workflow["edges"][0] == {"parent": "fetch", "child": "left"}
    run_document = json.loads(output.dumps(_run(None, "wf-1", TaskStatus.COMPLETED)))
    assert (run_document["task_id"], run_document["workflow_id"]) == (None, "wf-1")
