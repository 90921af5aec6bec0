"""``chronoshard submit`` and ``chronoshard tasks get|ls|cancel|retry|resolve``: the TaskService
through :class:`chronoshard.SyncClient`, as the tenant whose API key is given.

Each ``_run_*`` turns arguments into one client call (or a few, for ``ls`` paging and
``submit --wait``) and prints the answer as a table or JSON. Server refusals are raised
as the client's exceptions and turned into exit codes by ``cli.main``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from chronoshard._cli import output
from chronoshard._cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    Command,
    UsageError,
    add_api,
    add_payload,
    aware_time,
    client,
    duration_s,
    first_of,
    non_negative_duration_s,
    non_negative_int,
    positive_duration_s,
    positive_int,
    read_payload,
    time_bound,
)

if TYPE_CHECKING:
    from chronoshard.sync_client import SyncClient
    from chronoshard.types import Task

DEFAULT_LIST_LIMIT = 50
MAX_LIST_PAGE = 1000
DEFAULT_WAIT_S = 60.0
WAIT_POLL_S = 0.25

# --- submit ------------------------------------------------------------------------------

SUBMIT_EPILOG = """\
examples:
  chronoshard submit demo.echo --payload '{"hello": "world"}'
  chronoshard submit report.build --payload-file params.json --in 5m --job-id nightly-report
  chronoshard submit email.send --at 2030-01-02T09:00:00+01:00 --strict --priority critical
  chronoshard submit demo.flaky --payload '{"failures": 1}' --wait   # exits 0 once COMPLETED
  echo '{"n": 1}' | chronoshard submit demo.echo --payload-file - --idempotency-key n-1

Without --at/--in the task runs now. Unless --strict, the scheduler spreads tasks
around their time (jitter, default window 240 s); --jitter-window narrows it."""


def configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("type", help="task type, as registered by a worker (@worker.task(...))")
    add_payload(parser)
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--at", type=aware_time, metavar="TIME", help="run at this ISO 8601 time (with Z or +HH:MM)"
    )
    when.add_argument(
        "--in",
        dest="delay",
        type=non_negative_duration_s,
        metavar="DURATION",
        help="run this long from now: 30s, 5m, 2h, 1d",
    )
    parser.add_argument(
        "--strict", action="store_true", help="no jitter: run at the exact time given"
    )
    parser.add_argument(
        "--jitter-window", type=non_negative_duration_s, metavar="DURATION", help="jitter window"
    )
    parser.add_argument(
        "--priority", choices=("critical", "standard", "bulk"), help="default: standard"
    )
    parser.add_argument("--queue", default="", help="worker queue (default: the default queue)")
    parser.add_argument(
        "--max-retries", type=non_negative_int, help="retries after a failed attempt (0: never)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_duration_s,
        metavar="DURATION",
        help="longest one attempt may run (default: the server's, 1h)",
    )
    parser.add_argument(
        "--idempotent", action="store_true", help="safe to re-run if its worker is lost"
    )
    parser.add_argument("--job-id", help="the job this task belongs to (watched by the watchdog)")
    parser.add_argument(
        "--idempotency-key", help="a repeat of the same request returns the first task"
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait until the task finishes; exit 0 only if it COMPLETED",
    )
    parser.add_argument(
        "--wait-timeout",
        type=positive_duration_s,
        default=DEFAULT_WAIT_S,
        metavar="DURATION",
        help=f"give up waiting after this long (default {DEFAULT_WAIT_S:g}s; exit 1)",
    )
    add_api(parser)


def run_submit(args: argparse.Namespace, out: TextIO) -> int:
    payload = read_payload(args)
    with client(args) as c:
        try:
            submitted = c.submit(
                args.type,
                payload,
                at=args.at,
                delay_s=args.delay,
                priority=args.priority,
                queue=args.queue,
                max_retries=args.max_retries,
                timeout_s=args.timeout,
                strict_timing=args.strict,
                jitter_window_s=args.jitter_window,
                idempotent=args.idempotent,
                idempotency_key=args.idempotency_key,
                job_id=args.job_id,
            )
        except (TypeError, ValueError) as exc:  # refused by the client before any call
            raise UsageError(str(exc)) from None
        task = submitted.task
        now = datetime.now(UTC)
        if args.output == "table":
            verb = "submitted" if submitted.created else "already submitted (idempotency key)"
            print(
                f"{verb} {task.id}  {task.type}  {task.status}  "
                f"due {output.short_time(task.due_at)} UTC ({output.relative(task.due_at, now)})",
                file=out,
                flush=True,
            )
        if not args.wait:
            if args.output == "json":
                print(output.dumps({"task": task, "created": submitted.created}), file=out)
            return EXIT_OK
        if args.output == "table":
            print("waiting for it to finish (Ctrl-C stops waiting, not the task)", file=out)
        final, finished = _wait_finished(c, task.id, args.wait_timeout)
    if args.output == "json":
        print(output.dumps({"task": final, "created": submitted.created}), file=out)
    else:
        print(output.task_details(final, datetime.now(UTC)), file=out)
    if not finished:
        print(
            f"chronoshard submit: task {task.id} is still {final.status.value} after "
            f"{output.span(args.wait_timeout)}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    if final.status.value != "COMPLETED":
        print(
            f"chronoshard submit: task {task.id} ended {final.status.value}: "
            f"{final.last_error or 'no error recorded'}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return EXIT_OK


def _wait_finished(c: SyncClient, task_id: str, timeout_s: float) -> tuple[Task, bool]:
    """The task as last read, and whether it reached a terminal state within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        task = c.get(task_id, attempts=True)
        if task.status.is_terminal:
            return task, True
        if time.monotonic() >= deadline:
            return task, False
        time.sleep(WAIT_POLL_S)


# --- tasks get -------------------------------------------------------------------------------

GET_EPILOG = """\
examples:
  chronoshard tasks get 0190a5c2-7b1e-7c3d-9f00-1234567890ab --attempts
  chronoshard tasks get "$ID" -o json | jq -r .status

--attempts lists every dispatch of the task: its state, worker, duration and error.
Another tenant's task answers "not found" (exit code 3), exactly like a missing one."""


def configure_get(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="task id")
    parser.add_argument("--attempts", action="store_true", help="show the attempt history")
    add_api(parser)


def run_get(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        task = c.get(args.id, attempts=args.attempts)
    if args.output == "json":
        print(output.dumps(task), file=out)
        return EXIT_OK
    print(output.task_details(task, datetime.now(UTC)), file=out)
    if args.attempts:
        print("", file=out)
        print(output.attempt_table(task) if task.attempts else "no attempts yet", file=out)
    return EXIT_OK


# --- tasks ls --------------------------------------------------------------------------------

LS_EPILOG = """\
examples:
  chronoshard tasks ls --status dead_letter --since 1h
  chronoshard tasks ls --type demo.flaky --status retrying,dead_letter
  chronoshard tasks ls --job-id nightly-report --since 2030-01-01T00:00:00Z --limit 500
  chronoshard tasks ls --until +10m -o json | jq -r '.tasks[].id'

Tasks are ordered by scheduled time. --since/--until bound the scheduled time: an ISO
time, a duration meaning that long ago (30m, 2h, 1d), or +DURATION for ahead."""

STATUS_NAMES = (
    "scheduled",
    "preloaded",
    "dispatched",
    "running",
    "completed",
    "retrying",
    "dead_letter",
    "cancelled",
    "upstream_failed",
    "outcome_unknown",
)


def _statuses(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    chosen = []
    for value in values:
        for name in value.split(","):
            normal = name.strip().lower().replace("-", "_")
            if normal not in STATUS_NAMES:
                raise UsageError(
                    f"--status: unknown status {name!r}; one of {', '.join(STATUS_NAMES)}"
                )
            chosen.append(normal.upper())
    return chosen


def configure_ls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status",
        action="append",
        metavar="STATUS[,STATUS]",
        help=f"any of: {', '.join(STATUS_NAMES)} (repeatable)",
    )
    parser.add_argument("--type", help="task type (exact)")
    parser.add_argument("--queue", help="worker queue (exact)")
    parser.add_argument("--job-id", help="job id (exact)")
    parser.add_argument(
        "--since", type=time_bound, metavar="TIME", help="scheduled at or after (ISO, or 30m ago)"
    )
    parser.add_argument("--until", type=time_bound, metavar="TIME", help="scheduled before")
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIST_LIMIT,
        help=f"show at most this many (default {DEFAULT_LIST_LIMIT})",
    )
    parser.add_argument(
        "--payloads", action="store_true", help="include payloads and results (json output)"
    )
    add_api(parser)


def run_ls(args: argparse.Namespace, out: TextIO) -> int:
    statuses = _statuses(args.status)
    if args.since and args.until and args.until < args.since:
        raise UsageError("--until is before --since")
    with client(args) as c:
        tasks = c.iter_tasks(
            statuses=statuses,
            type=args.type,
            queue=args.queue,
            job_id=args.job_id,
            scheduled_from=args.since,
            scheduled_before=args.until,
            page_size=min(args.limit + 1, MAX_LIST_PAGE),
            include_payloads=args.payloads,
        )
        found, more = first_of(tasks, args.limit)
    if args.output == "json":
        print(output.dumps({"tasks": found, "more": more}), file=out)
        return EXIT_OK
    if not found:
        print("no tasks match", file=out)
        return EXIT_OK
    print(output.task_table(found, datetime.now(UTC)), file=out)
    if more:
        print(f"(first {len(found)} shown; more match: raise --limit or narrow it)", file=out)
    return EXIT_OK


# --- tasks cancel / retry ----------------------------------------------------------------------

CANCEL_EPILOG = """\
examples:
  chronoshard tasks cancel "$ID" --reason "customer unsubscribed"

A task not yet running is CANCELLED at once. A RUNNING task stays RUNNING while its
worker is asked to stop; it ends CANCELLED when the worker acknowledges. Cancelling a
finished task fails (exit 1, FAILED_PRECONDITION/TASK_ALREADY_FINISHED)."""


def configure_cancel(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="task id")
    parser.add_argument("--reason", default="", help="recorded and passed to a running worker")
    add_api(parser)


def run_cancel(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        task = c.cancel(args.id, args.reason)
    if args.output == "json":
        print(output.dumps(task), file=out)
    elif task.status.value == "CANCELLED":
        print(f"cancelled {task.id}", file=out)
    else:
        print(
            f"cancel requested: {task.id} is {task.status.value}; its worker was asked to stop",
            file=out,
        )
    return EXIT_OK


RETRY_EPILOG = """\
examples:
  chronoshard tasks ls --status dead_letter --since 1d
  chronoshard tasks retry "$ID"            # again now, with its full retries
  chronoshard tasks retry "$ID" --in 10m

Only a DEAD_LETTER task can be retried (anything else: exit 1, INVALID_TRANSITION); an
OUTCOME_UNKNOWN one is resolved "run again", as `tasks resolve --retry` does."""


def configure_retry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="task id (a DEAD_LETTER task)")
    parser.add_argument(
        "--in",
        dest="delay",
        type=duration_s,
        default=0.0,
        metavar="DURATION",
        help="run again this long from now (default: now)",
    )
    add_api(parser)


def run_retry(args: argparse.Namespace, out: TextIO) -> int:
    if args.delay < 0:
        raise UsageError("--in must not be negative")
    with client(args) as c:
        task = c.retry(args.id, args.delay)
    if args.output == "json":
        print(output.dumps(task), file=out)
    else:
        now = datetime.now(UTC)
        print(
            f"retrying {task.id}: {task.status.value}, due {output.relative(task.due_at, now)}",
            file=out,
        )
    return EXIT_OK


RESOLVE_EPILOG = """\
examples:
  chronoshard tasks ls --status outcome_unknown
  chronoshard tasks get "$ID" --attempts       # who ran it, when its lease ran out
  chronoshard tasks resolve "$ID" --retry --reason "no effect row for it in billing"
  chronoshard tasks resolve "$ID" --fail --reason "charged twice already; refunded"

An OUTCOME_UNKNOWN task is a non-idempotent one whose attempt's lease ran out with no
settlement (worker killed, partitioned, paused): it may or may not have run, so it is
never run again on its own. Look at what its handler writes, then --retry (run it again
under a new fencing token) or --fail (dead-letter it). Repeating the same resolution is
harmless; resolving a task in any other state fails (exit 1, NOTHING_TO_RESOLVE)."""


def configure_resolve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="task id (an OUTCOME_UNKNOWN task)")
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument(
        "--retry", action="store_const", const="RETRY", dest="resolution", help="run it again"
    )
    choice.add_argument(
        "--fail",
        action="store_const",
        const="MARK_FAILED",
        dest="resolution",
        help="dead-letter it",
    )
    parser.add_argument("--reason", default="", help="recorded on the attempt (and as last error)")
    add_api(parser)


def run_resolve(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        task = c.resolve(args.id, args.resolution, args.reason)
    if args.output == "json":
        print(output.dumps(task), file=out)
    else:
        print(f"resolved {task.id}: {task.status.value}", file=out)
    return EXIT_OK


TASK_COMMANDS: dict[str, Command] = {
    "get": Command("show one task (--attempts: its history)", configure_get, run_get, GET_EPILOG),
    "ls": Command("list tasks, filtered", configure_ls, run_ls, LS_EPILOG),
    "cancel": Command("cancel a task", configure_cancel, run_cancel, CANCEL_EPILOG),
    "retry": Command("run a dead-lettered task again", configure_retry, run_retry, RETRY_EPILOG),
    "resolve": Command(
        "decide an OUTCOME_UNKNOWN task: run it again or dead-letter it",
        configure_resolve,
        run_resolve,
        RESOLVE_EPILOG,
    ),
}
