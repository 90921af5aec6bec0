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
from datetime import UTC, datetime
from typing import Any

from chronoshard import exact_json
from chronoshard.types import Task

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
