"""``chronoshard schedules create|ls|get|update|pause|resume|trigger|backfill|rm``: the
ScheduleService through :class:`chronoshard.SyncClient`, as the tenant whose API key is
given.

``create`` and ``update`` take the same options and build the spec with one function
(:func:`spec_from_args`): ``create`` applies them to nothing, ``update`` to the spec it
reads first, and sends the whole result (the RPC replaces the spec; options not given
keep their value). What each occurrence makes is one task (a TYPE and the task options)
or a run of the workflow in ``--workflow FILE``, the format ``workflows submit`` reads
(:func:`chronoshard._cli.workflows.read_workflow_template`). Wherever a schedule is
named, its name or its id is accepted. Server refusals are raised as the client's
exceptions and turned into exit codes by ``cli.main``; JSON output is the client's
dataclasses (docs/operations.md, The CLI).
"""

from __future__ import annotations

import argparse
import dataclasses
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Any, TextIO
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from chronoshard._cli import output
from chronoshard._cli.common import (
    EXIT_OK,
    Command,
    UsageError,
    add_api,
    add_payload,
    aware_time,
    client,
    first_of,
    non_negative_duration_s,
    non_negative_int,
    positive_duration_s,
    positive_int,
    read_payload,
)
from chronoshard._cli.workflows import longest_chain_s, read_workflow_template

if TYPE_CHECKING:
    from chronoshard.types import (
        Schedule,
        ScheduleRun,
        ScheduleSpec,
        TaskSpec,
        WorkflowTemplate,
    )

DEFAULT_LIST_LIMIT = 50
MAX_LIST_PAGE = 1000
DEFAULT_NEXT = 5
DEFAULT_RUNS = 10
MAX_GET_COUNT = 100  # GetScheduleRequest.next_count and runs_count

SEVERITIES = ("critical", "error", "warning", "info")
DEFAULT_EXPECTED_S = 60.0  # ScheduleWatch.expected_duration unset, no timeout

TASK_OPTIONS = (
    # (TaskSpec field, the option that sets it); the option's dest is its name. The
    # payload's two options are read apart (read_payload).
    ("queue", "--queue"),
    ("priority", "--priority"),
    ("max_retries", "--max-retries"),
    ("timeout_s", "--timeout"),
    ("strict_timing", "--strict"),
    ("jitter_window_s", "--jitter-window"),
    ("idempotent", "--idempotent"),
)

# --- create / update: one set of options, one spec builder ------------------------------


def _add_spec_options(parser: argparse.ArgumentParser, *, update: bool) -> None:
    """The options of ``create`` and ``update``. In ``update`` every one is optional and
    a name and a type are options too (``--name`` renames)."""
    if update:
        parser.add_argument("schedule", metavar="NAME|ID", help="the schedule to change")
        parser.add_argument("--name", help="rename it (the id stays)")
        parser.add_argument(
            "--type",
            help="the task type each occurrence submits (a schedule of a workflow becomes "
            "one of this task)",
        )
    else:
        parser.add_argument(
            "name", metavar="NAME", help="the schedule's name, unique for the tenant"
        )
        type_ = parser.add_argument(
            "type",
            metavar="[TYPE]",
            help="the task type each occurrence submits (none with --workflow)",
        )
        # Optional, yet not nargs="?": argparse would consume an empty "?" right after
        # NAME and then refuse a TYPE written after the options (as it always could be).
        # Whether it is missing is spec_from_args's to say, with --workflow.
        type_.required = False
    parser.add_argument(
        "--workflow",
        metavar="FILE",
        help="each occurrence creates a run of this workflow instead of one task: a JSON "
        "or YAML file as 'workflows submit' reads, without delay, scheduled_at and "
        "idempotency_key ('-': stdin)",
    )
    rule = parser.add_mutually_exclusive_group(required=not update)
    rule.add_argument("--cron", metavar="EXPR", help="a cron expression: '30 2 * * *', @daily")
    rule.add_argument(
        "--every",
        type=positive_duration_s,
        metavar="DURATION",
        help="a fixed interval instead: 90s, 15m, 1h, 1d (at least 1s)",
    )
    parser.add_argument("--tz", metavar="ZONE", help="IANA zone the cron expression reads (UTC)")
    parser.add_argument("--start", type=aware_time, metavar="TIME", help="no occurrence before")
    parser.add_argument("--end", type=aware_time, metavar="TIME", help="no occurrence after")
    task = parser.add_argument_group("the task of each occurrence")
    add_payload(task)
    task.add_argument("--queue", help="worker queue (default: the default queue)")
    task.add_argument(
        "--priority", choices=("critical", "standard", "bulk"), help="default: standard"
    )
    task.add_argument(
        "--max-retries", type=non_negative_int, help="retries after a failed attempt (0: never)"
    )
    task.add_argument(
        "--timeout",
        type=positive_duration_s,
        metavar="DURATION",
        help="longest one attempt may run (needed by --overlap skip|buffer_one)",
    )
    task.add_argument(
        "--strict",
        action=argparse.BooleanOptionalAction,
        help="no jitter: run at the occurrence's exact time",
    )
    task.add_argument(
        "--jitter-window", type=non_negative_duration_s, metavar="DURATION", help="jitter window"
    )
    task.add_argument(
        "--idempotent",
        action=argparse.BooleanOptionalAction,
        help="safe to re-run if its worker is lost",
    )
    policy = parser.add_argument_group("policies")
    policy.add_argument(
        "--catchup",
        choices=("skip", "latest", "all"),
        help="missed occurrences: none (skip, default), the newest, or all up to the limit",
    )
    policy.add_argument(
        "--catchup-limit",
        type=positive_int,
        metavar="N",
        help="how many missed occurrences --catchup all runs (1-10000)",
    )
    policy.add_argument(
        "--overlap",
        choices=("allow", "skip", "buffer_one"),
        help="while the previous occurrence runs: run anyway (allow, default), skip, or "
        "wait (one at most)",
    )
    policy.add_argument(
        "--misfire-grace",
        type=non_negative_duration_s,
        metavar="DURATION",
        help="an occurrence this late is still created (default 1m)",
    )
    watch = parser.add_argument_group("watchdog")
    watch.add_argument(
        "--job-id", help="the job the watchdog knows the occurrences by (default: the name)"
    )
    watch.add_argument(
        "--watch",
        action=argparse.BooleanOptionalAction,
        help="alert when an occurrence does not complete in time (default: --watch)",
    )
    watch.add_argument(
        "--expected-duration",
        type=positive_duration_s,
        metavar="DURATION",
        help="how long an occurrence takes (default: --timeout, for a workflow the sum of "
        "the timeouts along its longest chain; else 1m)",
    )
    watch.add_argument(
        "--tolerance",
        type=non_negative_duration_s,
        metavar="DURATION",
        help="lateness allowed past the expected duration (default 1m)",
    )
    watch.add_argument("--severity", choices=SEVERITIES, help="of the alert (default critical)")
    add_api(parser)


def spec_from_args(args: argparse.Namespace, base: ScheduleSpec | None) -> ScheduleSpec:
    """The spec ``base`` with every option given applied (``create``: ``base`` is None and
    the positional name, a TYPE or --workflow, and a rule are given). Raises UsageError
    for a spec the client refuses (naming the argument), before any call."""
    from chronoshard.types import ScheduleSpec, ScheduleWatch

    try:
        task, workflow = _template_from_args(args, base)

        watch = ScheduleWatch() if base is None else base.watch
        watch_changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("expected_duration_s", args.expected_duration),
                ("tolerance_s", args.tolerance),
                ("severity", args.severity),
            )
            if value is not None
        }
        if args.watch is not None:
            watch_changes["disabled"] = not args.watch
        if (
            base is not None
            and args.expected_duration is None
            and base.watch.expected_duration_s == _default_expected_s(base.task, base.workflow)
            and _default_expected_s(task, workflow) != base.watch.expected_duration_s
        ):
            # The server stores the default it chose (the timeout or the workflow's
            # longest chain, else 1m): an expected duration that followed the old
            # template follows the new one.
            watch_changes["expected_duration_s"] = None
        watch = dataclasses.replace(watch, **watch_changes)

        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("timezone", args.tz),
                ("start_at", args.start),
                ("end_at", args.end),
                ("catchup", args.catchup),
                ("catchup_limit", args.catchup_limit),
                ("overlap", args.overlap),
                ("job_id", args.job_id),
                ("misfire_grace_s", args.misfire_grace),
            )
            if value is not None
        }
        if (
            base is not None
            and args.catchup == "all"
            and base.catchup != "all"
            and args.catchup_limit is None
        ):
            # The limit read back is the server's default for another policy (1), not a
            # choice: --catchup all asks for one, as it does on create.
            changes["catchup_limit"] = None
        if args.cron is not None:
            changes.update(cron=args.cron, interval_s=None)
        elif args.every is not None:
            changes.update(cron=None, interval_s=args.every)
        if base is None:
            return ScheduleSpec(
                name=args.name, task=task, workflow=workflow, watch=watch, **changes
            )
        if args.name is not None:
            changes["name"] = args.name
        return dataclasses.replace(base, task=task, workflow=workflow, watch=watch, **changes)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _template_from_args(
    args: argparse.Namespace, base: ScheduleSpec | None
) -> tuple[TaskSpec | None, WorkflowTemplate | None]:
    """What each occurrence makes, as (task, workflow), one of them None: the workflow
    of --workflow FILE; ``base``'s workflow while no task type is given; else ``base``'s
    task (or a new one of TYPE) with the task options given applied."""
    from chronoshard.types import TaskSpec

    options = _task_options(args)
    if args.workflow is not None and args.type is not None:
        raise UsageError("give a task type or --workflow FILE, not both")
    kept = base.workflow if base is not None and args.type is None else None
    if args.workflow is not None or kept is not None:
        if options:
            raise UsageError(
                f"{next(iter(options))} sets the task of a schedule of one task: the tasks "
                "of a workflow take their options in its file (tasks[i].timeout, ...)"
            )
        return None, kept if args.workflow is None else read_workflow_template(args.workflow)
    if base is not None and base.task is not None:
        task = base.task if args.type is None else dataclasses.replace(base.task, type=args.type)
    elif args.type is not None:
        task = TaskSpec(type=args.type)
    else:
        raise UsageError("give the task type each occurrence submits (TYPE), or --workflow FILE")
    changes = {name: value for name, value in options.values()}
    if "max_retries" in changes and task.retry is not None:
        # max_retries given here wins over a retry policy's: keep its backoff only.
        changes["retry"] = dataclasses.replace(task.retry, max_retries=None)
    return dataclasses.replace(task, **changes), None


def _task_options(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The task options given: the option as written -> (the TaskSpec field it sets,
    its value); the payload first, then in the order of :data:`TASK_OPTIONS`."""
    given: dict[str, tuple[str, Any]] = {}
    payload = read_payload(args)
    if payload is not None:
        flag = "--payload" if args.payload is not None else "--payload-file"
        given[flag] = ("payload", payload)
    for name, flag in TASK_OPTIONS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            given[flag] = (name, value)
    return given


def _default_expected_s(task: TaskSpec | None, workflow: WorkflowTemplate | None) -> float:
    """The expected duration the server gives a schedule that names none: the task's
    timeout, or the sum of the timeouts along the workflow's longest chain; else 1m."""
    if workflow is not None:
        chain_s = longest_chain_s(workflow)
        return DEFAULT_EXPECTED_S if chain_s is None else chain_s
    if task is None or task.timeout_s is None:
        return DEFAULT_EXPECTED_S
    return task.timeout_s


def _print_schedule(args: argparse.Namespace, out: TextIO, verb: str, schedule: Schedule) -> None:
    if args.output == "json":
        print(output.dumps(schedule), file=out)
        return
    nxt = schedule.next_occurrence
    when = "no next occurrence" if nxt is None else f"next {output.short_time(nxt)} UTC"
    print(
        f"{verb} {schedule.spec.name} ({schedule.id}): {output.schedule_rule(schedule.spec)}, "
        f"{output.schedule_state(schedule)}, {when}",
        file=out,
    )


CREATE_EPILOG = """\
examples:
  chronoshard schedules create nightly-report report.build --cron '30 2 * * *' \\
      --tz Europe/Berlin --payload '{"format": "pdf"}' --timeout 20m --overlap skip
  chronoshard schedules create heartbeat demo.echo --every 5m --strict --no-watch
  chronoshard schedules create backup db.backup --cron @daily --catchup all --catchup-limit 7
  chronoshard schedules create nightly-etl --workflow etl.yaml --cron '0 3 * * *' --overlap skip

A cron expression has 5 fields, or 6 with seconds first, or is one of @yearly @monthly
@weekly @daily @hourly; it reads wall times in --tz (daylight-saving changes: see
docs/api.md, ScheduleService). Each occurrence submits one task of TYPE, watched by the
watchdog (job id: the name) unless --no-watch.

With --workflow FILE instead of TYPE, each occurrence creates a run of that workflow
(the file 'workflows submit' reads, without delay, scheduled_at and idempotency_key,
which each occurrence decides; its name may be left out: the schedule's). Every task
of a run carries the occurrence's logical date; the run completes the job when it
SUCCEEDS. The task options (--payload, --timeout, ...) are then the file's, per task:
--overlap skip|buffer_one needs a timeout on every task."""


def configure_create(parser: argparse.ArgumentParser) -> None:
    _add_spec_options(parser, update=False)


def run_create(args: argparse.Namespace, out: TextIO) -> int:
    spec = spec_from_args(args, None)
    with client(args) as c:
        schedule = c.create_schedule(spec)
    _print_schedule(args, out, "created", schedule)
    return EXIT_OK


UPDATE_EPILOG = """\
examples:
  chronoshard schedules update nightly-report --cron '0 3 * * *'
  chronoshard schedules update nightly-report --name nightly-pdf --payload '{"format": "pdf"}'
  chronoshard schedules update heartbeat --every 1m --watch --tolerance 2m
  chronoshard schedules update nightly-etl --workflow etl-v2.yaml

Reads the schedule, applies the options given, and sends the whole spec: what is not
given keeps its value, including the defaults the server filled in at creation (the job
id stays the old name on a rename: give --job-id to change it; the tolerance keeps its
value when the jitter changes). --workflow FILE replaces the workflow (or the task) each
occurrence makes; --type makes it one task of that type again. Two follow the options
they derive from: an expected duration that was the default of the old template (its
--timeout, or its workflow's longest chain) follows the new one, and --catchup all asks
for --catchup-limit unless the policy was all already. The change takes effect from the
next occurrence (occurrences created ahead under the old spec that have not started are
withdrawn and made again)."""


def configure_update(parser: argparse.ArgumentParser) -> None:
    _add_spec_options(parser, update=True)


def run_update(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        current = c.get_schedule(args.schedule, next_count=1, runs_count=1).schedule
        spec = spec_from_args(args, current.spec)
        # By id: the name may be the one being changed.
        schedule = c.update_schedule(current.id, spec)
    _print_schedule(args, out, "updated", schedule)
    return EXIT_OK


# --- ls / get ----------------------------------------------------------------------------

LS_EPILOG = """\
examples:
  chronoshard schedules ls
  chronoshard schedules ls -o json | jq -r '.schedules[] | select(.paused) | .spec.name'

Ordered by name. STATE is active, paused, or ended (every occurrence up to its end is
created; the last ones may still be due: they are created ahead of their time)."""


def configure_ls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIST_LIMIT,
        help=f"show at most this many (default {DEFAULT_LIST_LIMIT})",
    )
    add_api(parser)


def run_ls(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        pages = c.iter_schedules(page_size=min(args.limit + 1, MAX_LIST_PAGE))
        found, more = first_of(pages, args.limit)
    if args.output == "json":
        print(output.dumps({"schedules": found, "more": more}), file=out)
        return EXIT_OK
    if not found:
        print("no schedules", file=out)
        return EXIT_OK
    print(output.schedule_table(found), file=out)
    if more:
        print(f"(first {len(found)} shown; more exist: raise --limit)", file=out)
    return EXIT_OK


GET_EPILOG = """\
examples:
  chronoshard schedules get nightly-report
  chronoshard schedules get nightly-report --next 20 --runs 50
  chronoshard schedules get "$ID" -o json | jq -r '.runs[] | select(.status == "DEAD_LETTER")'

Shows the spec, the next occurrences in the schedule's zone (wall time and UTC offset)
and in UTC, and the latest runs (newest first) with their tasks' states."""


def configure_get(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", metavar="NAME|ID", help="the schedule's name or id")
    parser.add_argument(
        "--next",
        type=_count,
        default=DEFAULT_NEXT,
        metavar="N",
        help=f"next occurrences to show (default {DEFAULT_NEXT}, at most {MAX_GET_COUNT})",
    )
    parser.add_argument(
        "--runs",
        type=_count,
        default=DEFAULT_RUNS,
        metavar="N",
        help=f"latest runs to show (default {DEFAULT_RUNS}, at most {MAX_GET_COUNT})",
    )
    add_api(parser)


def _count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_GET_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_GET_COUNT}, got {value}")
    return value


def schedule_zone(name: str | None) -> tzinfo | None:
    """The zone a schedule's times are shown in (UTC when it names none); None when this
    machine's tz database does not know it (the server's may: its answer stands)."""
    if not name:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):  # ValueError: a malformed key
        return None


def run_get(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        details = c.get_schedule(args.schedule, next_count=args.next, runs_count=args.runs)
    if args.output == "json":
        print(output.dumps(details), file=out)
        return EXIT_OK
    zone = schedule_zone(details.schedule.spec.timezone)
    print(output.schedule_details(details, zone, datetime.now(UTC)), file=out)
    return EXIT_OK


# --- pause / resume / trigger / backfill / rm --------------------------------------------------


def _configure_named(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", metavar="NAME|ID", help="the schedule's name or id")
    add_api(parser)


PAUSE_EPILOG = """\
examples:
  chronoshard schedules pause nightly-report

Stops creating occurrences and withdraws (CANCELLED) those created ahead that have not
started; a paused schedule is not alerted on. Pausing a paused schedule changes nothing."""


def run_pause(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        schedule = c.pause_schedule(args.schedule)
    _print_schedule(args, out, "paused", schedule)
    return EXIT_OK


RESUME_EPILOG = """\
examples:
  chronoshard schedules resume nightly-report

Resumes from now: the occurrences that fell in the pause are not caught up (backfill
them if they should run)."""


def run_resume(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        schedule = c.resume_schedule(args.schedule)
    _print_schedule(args, out, "resumed", schedule)
    return EXIT_OK


TRIGGER_EPILOG = """\
examples:
  chronoshard schedules trigger nightly-report
  chronoshard schedules trigger nightly-report -o json | jq -r .task_id
  chronoshard schedules trigger nightly-etl -o json | jq -r .workflow_id

Runs one occurrence now (logical date: now), whatever the rule, a pause or the end; the
overlap policy does not apply."""


def _run_line(run_: ScheduleRun) -> str:
    made = run_.task_id or (run_.workflow_id and f"workflow {run_.workflow_id}")
    return (
        f"{output.short_time(run_.logical_date)} UTC  {run_.origin.value}  "
        f"{made or output.EMPTY}  {output.run_status(run_)}"
    )


def run_trigger(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        run_ = c.trigger_schedule(args.schedule)
    if args.output == "json":
        print(output.dumps(run_), file=out)
    else:
        print(f"triggered {args.schedule}: {_run_line(run_)}", file=out)
    return EXIT_OK


BACKFILL_EPILOG = """\
examples:
  chronoshard schedules backfill nightly-report --from 2026-01-01T00:00:00Z \\
      --to 2026-01-07T23:59:59Z

Runs now every occurrence of the rule with FROM <= logical date <= TO (TO not in the
future: occurrences ahead are the schedule's) that has no run
yet, each with its own logical date (at most 1,000 per call: split a longer range).
Occurrences that already ran are left alone and counted. The overlap policy does not
apply."""


def configure_backfill(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", metavar="NAME|ID", help="the schedule's name or id")
    parser.add_argument(
        "--from", dest="start", type=aware_time, required=True, metavar="TIME", help="first"
    )
    parser.add_argument("--to", dest="end", type=aware_time, required=True, metavar="TIME")
    add_api(parser)


def run_backfill(args: argparse.Namespace, out: TextIO) -> int:
    if args.end < args.start:
        raise UsageError("--to is before --from")
    with client(args) as c:
        result = c.backfill_schedule(args.schedule, args.start, args.end)
    if args.output == "json":
        print(output.dumps(result), file=out)
        return EXIT_OK
    print(
        f"backfilled {args.schedule}: {len(result.runs)} runs created, "
        f"{result.existing} already had one",
        file=out,
    )
    if result.runs:
        print(output.run_table(result.runs), file=out)
    return EXIT_OK


RM_EPILOG = """\
examples:
  chronoshard schedules rm nightly-report

Deletes the schedule and its occurrence history and withdraws the occurrences created
ahead that have not started; tasks that ran or run stay."""


def run_rm(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        withdrawn = c.delete_schedule(args.schedule)
    if args.output == "json":
        print(output.dumps({"schedule": args.schedule, "withdrawn": withdrawn}), file=out)
    else:
        print(f"deleted {args.schedule} ({withdrawn} occurrences withdrawn)", file=out)
    return EXIT_OK


SCHEDULE_COMMANDS: dict[str, Command] = {
    "create": Command("create a recurring schedule", configure_create, run_create, CREATE_EPILOG),
    "ls": Command("list schedules", configure_ls, run_ls, LS_EPILOG),
    "get": Command(
        "show a schedule, its next occurrences and its latest runs",
        configure_get,
        run_get,
        GET_EPILOG,
    ),
    "update": Command(
        "change a schedule (the options given; the rest is kept)",
        configure_update,
        run_update,
        UPDATE_EPILOG,
    ),
    "pause": Command("pause a schedule", _configure_named, run_pause, PAUSE_EPILOG),
    "resume": Command("resume a paused schedule", _configure_named, run_resume, RESUME_EPILOG),
    "trigger": Command("run one occurrence now", _configure_named, run_trigger, TRIGGER_EPILOG),
    "backfill": Command(
        "run the occurrences of a past range", configure_backfill, run_backfill, BACKFILL_EPILOG
    ),
    "rm": Command("delete a schedule", _configure_named, run_rm, RM_EPILOG),
}
