"""How ``chronoshard`` prints: aligned tables for people, JSON for scripts.

Everything here is pure: functions take values (and ``now`` where a relative time is
shown) and return strings, so the output is tested without a server. JSON output is the
client's dataclasses turned into plain values — times as ISO 8601 in UTC with ``Z``,
enums as their string values, bytes as base64 — with the same field names as
``chronoshard.Task``; it is the stable, documented form for scripts. The tables may
change to read better.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

from chronoshard import exact_json
from chronoshard._cli.common import format_s
from chronoshard.types import Schedule, ScheduleDetails, ScheduleRun, ScheduleSpec, Task

EMPTY = "-"


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON-serialisable data (see the module docstring)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Task):
            data["max_retries"] = value.max_retries
        return data
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return exact_json.dumps(jsonable(value), indent=2, separators=(",", ": "))


def iso(value: datetime) -> str:
    """UTC, ISO 8601, milliseconds, ``Z``: ``2030-01-02T03:04:05.123Z``."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def short_time(value: datetime | None) -> str:
    """``2030-01-02 03:04:05.123`` (UTC), or ``-``."""
    if value is None:
        return EMPTY
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def span(seconds: float) -> str:
    """A duration for people: ``850ms``, ``12.3s``, ``4m05s``, ``3h12m``, ``2d04h``."""
    magnitude = abs(seconds)
    sign = "-" if seconds < 0 else ""
    if magnitude < 1:
        return f"{sign}{magnitude * 1000:.0f}ms"
    if magnitude < 60:
        return f"{sign}{magnitude:.1f}s"
    whole = int(magnitude)
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86_400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86_400}d{whole % 86_400 // 3600:02d}h"


def relative(value: datetime | None, now: datetime) -> str:
    """``in 4.2s`` / ``3m05s ago`` / ``-``."""
    if value is None:
        return EMPTY
    delta = (value - now).total_seconds()
    return f"in {span(delta)}" if delta > 0 else f"{span(-delta)} ago"


def millis(seconds: float | None) -> str:
    """A lateness: ``3.2ms``, ``-80ms`` (early), ``1.25s``; ``-`` when unknown."""
    if seconds is None:
        return EMPTY
    if abs(seconds) < 0.01:
        return f"{seconds * 1000:.1f}ms"
    if abs(seconds) < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.2f}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned with two spaces; ``None`` and ``""`` print as ``-``; numbers are
    right-aligned. No trailing spaces."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *cells]:
        parts = [
            cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None or value == "":
        return EMPTY
    if isinstance(value, datetime):
        return short_time(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    """``key: value`` lines with the values aligned; empty values print as ``-``."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k + ':':<{width + 1}} {_cell(v)}".rstrip() for k, v in pairs)


def one_line_json(value: Any) -> str:
    return exact_json.dumps(jsonable(value), separators=(", ", ": "))


# --- tasks -----------------------------------------------------------------------------------


TASK_HEADERS = ("ID", "TYPE", "STATUS", "SCHEDULED (UTC)", "DUE", "ATTEMPT", "QUEUE", "JOB")


def task_row(task: Task, now: datetime) -> list[object]:
    return [
        task.id,
        task.type,
        task.status,
        task.scheduled_at,
        relative(task.due_at, now),
        task.attempt,
        task.queue or "default",
        task.job_id,
    ]


def task_table(tasks: Sequence[Task], now: datetime) -> str:
    return table(TASK_HEADERS, [task_row(t, now) for t in tasks])


def task_details(task: Task, now: datetime) -> str:
    """Everything someone debugging a task wants, one field a line."""
    policy = task.retry_policy
    retries = EMPTY if policy.max_retries is None else f"{task.retry_count}/{policy.max_retries}"
    pairs: list[tuple[str, object]] = [
        ("id", task.id),
        ("type", task.type),
        ("status", task.status),
        # Due but held by its tenant's quotas (docs/operations.md#tenants-and-quotas).
        ("waiting", task.waiting_reason),
        ("scheduled_at", f"{short_time(task.scheduled_at)}  ({relative(task.scheduled_at, now)})"),
        ("due_at", f"{short_time(task.due_at)}  ({relative(task.due_at, now)})"),
        ("priority", task.priority),
        ("queue", task.queue or "default"),
        ("strict_timing", "yes" if task.strict_timing else "no (jittered)"),
        ("attempt", task.attempt),
        ("retries", retries),
        ("timeout", None if task.timeout_s is None else span(task.timeout_s)),
        ("job_id", task.job_id),
        ("idempotency_key", task.idempotency_key),
        ("worker", task.worker_id),
        ("finished_at", task.finished_at),
        ("last_error", task.last_error.splitlines()[0] if task.last_error else None),
        ("payload", None if task.payload is None else one_line_json(task.payload)),
        ("result", None if task.result is None else one_line_json(task.result)),
    ]
    text = fields(pairs)
    if task.last_error and "\n" in task.last_error.strip():
        # A traceback: after the fields, whole, so the fields stay one per line.
        indented = "\n".join("  " + line for line in task.last_error.rstrip().splitlines())
        text += "\n\nlast error in full:\n" + indented
    return text


ATTEMPT_HEADERS = ("ATTEMPT", "STATE", "TOKEN", "WORKER", "STARTED (UTC)", "TOOK", "ERROR")


def attempt_table(task: Task) -> str:
    rows: list[list[object]] = []
    for a in task.attempts:
        took = (
            span((a.finished_at - a.entered_at).total_seconds())
            if a.finished_at is not None and a.entered_at is not None
            else None
        )
        error = (a.error or "").splitlines()[0][:80] if a.error else None
        rows.append([a.attempt, a.state, a.fencing_token, a.worker_id, a.entered_at, took, error])
    return table(ATTEMPT_HEADERS, rows)


# --- schedules ---------------------------------------------------------------------------------


def zoned_time(value: datetime, zone: tzinfo) -> str:
    """An instant as the wall time of ``zone`` with its offset and the zone's abbreviation:
    ``2030-03-31 03:00:00.000 +02:00 CEST``. The offset is there because a wall time alone
    is ambiguous in the hour a clock goes back."""
    local = value.astimezone(zone)
    offset = local.utcoffset()
    minutes = 0 if offset is None else int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    name = local.tzname() or ""
    # Zones without an abbreviation of their own name it by its offset ("+0530"): no repeat.
    suffix = "" if not name or name.lstrip("+-").isdigit() else f" {name}"
    return f"{local.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} {sign}{hours:02d}:{rest:02d}{suffix}"


def schedule_rule(spec: ScheduleSpec) -> str:
    """``cron 30 2 * * *`` or ``every 15m``."""
    if spec.cron is not None:
        return f"cron {spec.cron}"
    return f"every {format_s(spec.interval_s or 0.0)}"


def schedule_state(schedule: Schedule) -> str:
    """``paused``, ``ended`` (no occurrence left to create) or ``active``."""
    if schedule.paused:
        return "paused"
    return "ended" if schedule.next_occurrence is None else "active"


SCHEDULE_HEADERS = ("NAME", "RULE", "ZONE", "STATE", "NEXT (UTC)", "TYPE", "ID")


def schedule_table(schedules: Sequence[Schedule]) -> str:
    rows: list[list[object]] = [
        [
            s.spec.name,
            schedule_rule(s.spec),
            s.spec.timezone or "UTC",
            schedule_state(s),
            s.next_occurrence,
            schedule_makes(s.spec),
            s.id,
        ]
        for s in schedules
    ]
    return table(SCHEDULE_HEADERS, rows)


REFS_SHOWN = 10
"""A schedule's workflow tasks named in ``schedules get``; ``workflows get`` draws a run."""


def schedule_makes(spec: ScheduleSpec) -> str:
    """What each occurrence makes: its task's type, or ``workflow (4 tasks)``."""
    if spec.workflow is not None:
        return f"workflow ({len(spec.workflow.tasks)} tasks)"
    return spec.task.type if spec.task is not None else EMPTY


def _or_default(value: object, default: str) -> object:
    """What a spec says, or the server's documented default for an unset field."""
    return f"{default} (default)" if value is None else value


def _duration(seconds: float | None, default: str) -> object:
    return _or_default(None if seconds is None else format_s(seconds), default)


def _template_fields(spec: ScheduleSpec) -> list[tuple[str, object]]:
    """What each occurrence makes: the task's fields, or the workflow's name, its tasks'
    refs (the first :data:`REFS_SHOWN`) and its edge count."""
    workflow, task = spec.workflow, spec.task
    if workflow is not None:
        refs = [t.ref for t in workflow.tasks]
        shown = ", ".join(refs[:REFS_SHOWN]) + (" ..." if len(refs) > REFS_SHOWN else "")
        return [
            ("workflow", workflow.name or f"{spec.name} (the name)"),
            ("tasks", f"{len(refs)}: {shown}" if refs else 0),
            ("edges", len(workflow.edges)),
        ]
    if task is None:  # a ScheduleSpec holds one of the two
        return []
    return [
        ("type", task.type),
        ("payload", None if task.payload is None else one_line_json(task.payload)),
        ("queue", task.queue or "default"),
        ("priority", _or_default(task.priority, "standard")),
        ("max_retries", _or_default(task.effective_max_retries, "the server's")),
        ("timeout", _duration(task.timeout_s, "the server's")),
        ("strict_timing", "yes" if task.strict_timing else "no (jittered)"),
        ("idempotent", "yes" if task.idempotent else "no"),
    ]


def schedule_fields(schedule: Schedule, now: datetime) -> str:
    """The spec and the state of a schedule, one field a line."""
    spec, watch = schedule.spec, schedule.spec.watch
    catchup: object = _or_default(spec.catchup, "skip")
    if spec.catchup_limit is not None:
        catchup = f"{catchup}, limit {spec.catchup_limit}"
    if watch.disabled:
        watched = "off"
    else:
        followed = "the timeout" if spec.workflow is None else "the longest chain's timeouts"
        expected = _duration(watch.expected_duration_s, f"{followed}, else 1m")
        tolerance = _duration(watch.tolerance_s, "1m")
        severity = _or_default(watch.severity and watch.severity.value, "critical")
        watched = f"expected {expected}, tolerance {tolerance}, severity {severity}"
    nxt = schedule.next_occurrence
    pairs: list[tuple[str, object]] = [
        ("id", schedule.id),
        ("name", spec.name),
        ("state", schedule_state(schedule)),
        ("rule", schedule_rule(spec)),
        ("timezone", _or_default(spec.timezone, "UTC")),
        ("start_at", spec.start_at),
        ("end_at", spec.end_at),
        ("next", None if nxt is None else f"{short_time(nxt)} UTC  ({relative(nxt, now)})"),
        *_template_fields(spec),
        ("catchup", catchup),
        ("overlap", _or_default(spec.overlap, "allow")),
        ("misfire_grace", _duration(spec.misfire_grace_s, "1m")),
        ("job_id", spec.job_id or f"{spec.name} (the name)"),
        ("watch", watched),
        ("created_at", schedule.created_at),
        ("updated_at", schedule.updated_at),
    ]
    return fields(pairs)


def occurrence_table(occurrences: Sequence[datetime], zone: tzinfo | None, zone_name: str) -> str:
    """The next occurrences in the schedule's zone (wall time and offset) and in UTC;
    without ``zone`` (not known to this machine's tz database) in UTC only."""
    if zone is None:
        return table(("#", "UTC"), [[i, t] for i, t in enumerate(occurrences, 1)])
    return table(
        ("#", f"IN {zone_name}", "UTC"),
        [[i, zoned_time(t, zone), t] for i, t in enumerate(occurrences, 1)],
    )


RUN_HEADERS = ("LOGICAL DATE (UTC)", "ORIGIN", "STATUS", "TASK", "FINISHED (UTC)")


def run_status(run: ScheduleRun) -> str:
    """The task's status (a workflow run's state read as one); ``skipped`` when the
    overlap policy created nothing, ``gone`` when its task or run is no longer kept."""
    if run.status is not None:
        return run.status.value
    return "skipped" if run.task_id is None and run.workflow_id is None else "gone"


def run_table(runs: Sequence[ScheduleRun]) -> str:
    """The runs, each with the id of what it made: its task, or its workflow run."""
    made_tasks, made_runs = any(r.task_id for r in runs), any(r.workflow_id for r in runs)
    made = "TASK|WORKFLOW" if made_tasks and made_runs else "WORKFLOW" if made_runs else "TASK"
    return table(
        (*RUN_HEADERS[:3], made, *RUN_HEADERS[4:]),
        [
            [r.logical_date, r.origin, run_status(r), r.task_id or r.workflow_id, r.finished_at]
            for r in runs
        ],
    )


def schedule_details(details: ScheduleDetails, zone: tzinfo | None, now: datetime) -> str:
    """``schedules get``: the fields, the next occurrences, the latest runs."""
    spec = details.schedule.spec
    parts = [schedule_fields(details.schedule, now), ""]
    if details.next_occurrences:
        parts.append("next occurrences:")
        parts.append(occurrence_table(details.next_occurrences, zone, spec.timezone or "UTC"))
    else:
        parts.append("no next occurrences" + (" (paused)" if details.schedule.paused else ""))
    if zone is None:
        parts.append(f"(zone {spec.timezone} is not in this machine's tz database: UTC only)")
    parts.append("")
    parts.append(f"latest runs:\n{run_table(details.runs)}" if details.runs else "no runs yet")
    return "\n".join(parts)
