"""The console's pages as HTML, from the client's types: pure functions, no I/O. The
frame and what every page shares are here with the tenant's pages (tasks, schedules,
workflows, expectations); the cluster's pages (the overview, the workers) are
:mod:`.cluster_views`.

Every page is :func:`page` around a body; every value from the cluster passes through
:func:`~chronoshard.console.markup.html`, which escapes it. Nothing here emits a
``<script>`` but the one static file, nor an inline style: the content security policy
allows neither, so geometry (the attempt timeline, the lateness plot, the shard map,
the workflow graph) is SVG attributes and colour is CSS classes from the static sheet.
Forms that change something carry the session's CSRF token (:func:`csrf_field`).

The parts that refresh live (the overview, the workers, a task or workflow that is not
finished) are rendered by their own ``*_fragment`` function, which the page embeds and
the JSON endpoint returns, so what the script swaps in is exactly what a reload would
show.
"""

from __future__ import annotations

import base64
import json
import math
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from chronoshard._cli.output import schedule_rule
from chronoshard.console import graph
from chronoshard.console.backend import ExpectationView
from chronoshard.console.markup import Html, escape, html, join
from chronoshard.types import (
    Incident,
    Priority,
    Schedule,
    ScheduleDetails,
    ScheduleSpec,
    Task,
    TaskAttempt,
    TaskPage,
    TaskSpec,
    TaskStatus,
    Workflow,
    WorkflowDetail,
    WorkflowState,
)

EMPTY = "—"
NAV = (
    ("overview", "/", "Overview"),
    ("tasks", "/tasks", "Tasks"),
    ("schedules", "/schedules", "Schedules"),
    ("workflows", "/workflows", "Workflows"),
    ("workers", "/workers", "Workers"),
    ("expectations", "/expectations", "Expectations"),
)
CANCELLABLE = frozenset(
    {
        TaskStatus.SCHEDULED,
        TaskStatus.PRELOADED,
        TaskStatus.DISPATCHED,
        TaskStatus.RUNNING,
        TaskStatus.RETRYING,
        TaskStatus.OUTCOME_UNKNOWN,
    }
)
"""States CancelTask accepts (a terminal task cannot be cancelled)."""
RETRYABLE = frozenset({TaskStatus.DEAD_LETTER, TaskStatus.OUTCOME_UNKNOWN})
"""States RetryTask accepts (on OUTCOME_UNKNOWN it is ResolveTask RETRY)."""
WORKFLOW_RETRYABLE = frozenset({WorkflowState.FAILED, WorkflowState.CANCELLED})
"""Workflow states RetryWorkflow runs again from (SUCCEEDED would change nothing)."""


# --- formatting ------------------------------------------------------------------------------


def when(value: datetime | None) -> str:
    if value is None:
        return EMPTY
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def seconds_text(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return EMPTY
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    if abs(value) < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def json_text(value: object) -> str:
    if value is None:
        return EMPTY
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def checkpoint_text(value: bytes | None) -> str:
    if value is None:
        return EMPTY
    try:
        return json_text(json.loads(value))
    except (UnicodeDecodeError, ValueError):
        return f"{len(value)} bytes (base64): {base64.b64encode(value).decode('ascii')}"


def status_badge(status: object) -> Html:
    text = str(status.value if hasattr(status, "value") else status)
    return html('<span class="badge s-{0}">{1}</span>', text.lower(), text)


def first_line(text: str | None, limit: int = 100) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def csrf_field(token: str) -> Html:
    return html('<input type="hidden" name="csrf" value="{0}">', token)


def action_button(action: str, label: str, token: str, css: str = "") -> Html:
    return html(
        '<form method="post" action="{0}" class="inline">{1}'
        '<button type="submit" class="{2}">{3}</button></form>',
        action,
        csrf_field(token),
        css,
        label,
    )


def task_href(task_id: str) -> str:
    return "/tasks/" + urllib.parse.quote(task_id, safe="")


# --- the frame ---------------------------------------------------------------------------------


class Paged(Protocol):
    """A listing's filters: the page asked for, and the query string that asks again."""

    @property
    def page_token(self) -> str: ...

    def query(self, *, page_token: str = "") -> str: ...


def paging_links(path: str, filters: Paged, next_page_token: str | None) -> Html:
    """The links under a listing: the next page (the API's token), and the first page
    once past it."""
    links = Html("")
    if next_page_token:
        links = html(
            '<p class="paging"><a href="{0}?{1}" rel="next">Next page →</a></p>',
            path,
            filters.query(page_token=next_page_token),
        )
    if filters.page_token:
        links = html(
            '{0}<p class="paging"><a href="{1}?{2}">← First page</a></p>',
            links,
            path,
            filters.query(),
        )
    return links


def page(
    title: str,
    body: Html,
    *,
    active: str = "",
    csrf: str | None = None,
    notice: str | None = None,
) -> Html:
    """The whole document: head (the stylesheet and the one script), navigation with
    logout when logged in (``csrf`` given), an optional notice, the body."""
    nav = Html("")
    if csrf is not None:
        links = join(
            html('<a href="{0}" class="{1}">{2}</a>', href, "on" if key == active else "", label)
            for key, href, label in NAV
        )
        nav = html(
            '<nav>{0}<form method="get" action="/tasks/search" class="search">'
            '<input name="id" placeholder="task id" aria-label="task id">'
            '<button type="submit">Find</button></form>{1}</nav>',
            links,
            action_button("/logout", "Log out", csrf, "quiet"),
        )
    shown = html('<p class="notice">{0}</p>', notice) if notice else Html("")
    return html(
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>{0} · Chronoshard</title>"
        '<link rel="stylesheet" href="/static/console.css">'
        '<script src="/static/console.js" defer></script></head>'
        '<body><header><a href="/" class="brand">Chronoshard</a>{1}</header>'
        "<main><h1>{0}</h1>{2}{3}</main></body></html>",
        title,
        nav,
        shown,
        body,
    )


def login_page(csrf: str, error: str | None = None) -> Html:
    problem = html('<p class="error" role="alert">{0}</p>', error) if error else Html("")
    body = html(
        '<form method="post" action="/login" class="login">{0}{1}'
        '<label for="api_key">API key</label>'
        '<input type="password" id="api_key" name="api_key" autocomplete="off" required '
        "autofocus>"
        '<button type="submit">Log in</button>'
        '<p class="hint">The key stays on the console\'s server, in your session; it is '
        "sent to the cluster with every call, never back to the browser.</p></form>",
        problem,
        csrf_field(csrf),
    )
    return page("Log in", body)


def error_page(title: str, message: str, csrf: str | None) -> Html:
    return page(title, html('<p class="error">{0}</p>', message), csrf=csrf)


# --- tasks ------------------------------------------------------------------------------------

FILTER_KEYS = ("status", "type", "queue", "job", "from", "before")


@dataclass(frozen=True)
class TaskFilters:
    """The task list's filters, as the query string gives them."""

    status: TaskStatus | None = None
    type: str = ""
    queue: str = ""
    job: str = ""
    scheduled_from: datetime | None = None
    scheduled_before: datetime | None = None
    page_token: str = ""
    problems: tuple[str, ...] = field(default=())

    def query(self, *, page_token: str = "") -> str:
        """The query string of these filters (and a page token)."""
        pairs = [
            ("status", self.status.value if self.status else ""),
            ("type", self.type),
            ("queue", self.queue),
            ("job", self.job),
            ("from", _local_input(self.scheduled_from)),
            ("before", _local_input(self.scheduled_before)),
            ("page", page_token),
        ]
        return urllib.parse.urlencode([(k, v) for k, v in pairs if v])


def _local_input(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def _parse_time(text: str, name: str, problems: list[str]) -> datetime | None:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        problems.append(f"{name}: not a date and time: {text!r}")
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def parse_filters(query: Mapping[str, str]) -> TaskFilters:
    """Filters from a query string; what cannot be read is named in ``problems`` (and
    left out of the filter) rather than refused."""
    problems: list[str] = []
    status = None
    if query.get("status"):
        try:
            status = TaskStatus(query["status"].upper())
        except ValueError:
            problems.append(f"status: not a task status: {query['status']!r}")
    return TaskFilters(
        status=status,
        type=query.get("type", "").strip(),
        queue=query.get("queue", "").strip(),
        job=query.get("job", "").strip(),
        scheduled_from=_parse_time(query.get("from", "").strip(), "from", problems),
        scheduled_before=_parse_time(query.get("before", "").strip(), "before", problems),
        page_token=query.get("page", ""),
        problems=tuple(problems),
    )


def _filter_form(filters: TaskFilters) -> Html:
    options = join(
        html(
            '<option value="{0}"{1}>{2}</option>',
            value,
            Html(" selected") if filters.status is not None and value == filters.status else "",
            label,
        )
        for value, label in [("", "any status"), *((s.value, s.value) for s in TaskStatus)]
    )

    def text_input(name: str, label: str, value: str, kind: str = "text") -> Html:
        return html(
            '<label>{0} <input type="{1}" name="{2}" value="{3}"></label>', label, kind, name, value
        )

    return html(
        '<form method="get" action="/tasks" class="filters">'
        '<label>status <select name="status">{0}</select></label>{1}{2}{3}{4}{5}'
        '<button type="submit">Filter</button> <a href="/tasks">clear</a></form>',
        options,
        text_input("type", "type", filters.type),
        text_input("queue", "queue", filters.queue),
        text_input("job", "job", filters.job),
        text_input(
            "from", "scheduled from (UTC)", _local_input(filters.scheduled_from), "datetime-local"
        ),
        text_input("before", "before", _local_input(filters.scheduled_before), "datetime-local"),
    )


def tasks_page(filters: TaskFilters, found: TaskPage, csrf: str) -> Html:
    rows = join(
        html(
            '<tr><td><a href="{0}" class="mono">{1}</a></td><td>{2}</td><td>{3}</td>'
            "<td>{4}</td><td>{5}</td><td>{6}</td><td>{7}</td><td>{8}</td></tr>",
            task_href(t.id),
            t.id,
            t.type,
            status_badge(t.status),
            t.queue,
            when(t.scheduled_at),
            t.attempt,
            t.job_id or "",
            first_line(t.last_error),
        )
        for t in found.tasks
    )
    problems = join(html('<p class="error">{0}</p>', p) for p in filters.problems)
    table = (
        html(
            '<table class="tasks"><thead><tr><th>id</th><th>type</th><th>status</th>'
            "<th>queue</th><th>scheduled</th><th>attempt</th><th>job</th><th>last error</th>"
            "</tr></thead><tbody>{0}</tbody></table>",
            rows,
        )
        if found.tasks
        else html('<p class="empty">No task matches.</p>')
    )
    paging = paging_links("/tasks", filters, found.next_page_token)
    return page(
        "Tasks",
        html("{0}{1}{2}{3}", _filter_form(filters), problems, table, paging),
        active="tasks",
        csrf=csrf,
    )


TIMELINE_WIDTH = 720
TIMELINE_ROW = 26
TIMELINE_LABEL = 150


def attempt_duration(attempt: TaskAttempt, now: datetime) -> float | None:
    if attempt.entered_at is None:
        return None
    end = attempt.finished_at or now
    return (end - attempt.entered_at).total_seconds()


def timeline_svg(attempts: Sequence[TaskAttempt], now: datetime) -> Html:
    """Each attempt as a bar from entering to finishing (or now), on one time axis."""
    timed = [a for a in attempts if a.entered_at is not None]
    if not timed:
        return html('<p class="empty">No attempt yet.</p>')
    start = min(a.entered_at for a in timed if a.entered_at is not None)
    end = max((a.finished_at or now) for a in timed)
    span_s = max((end - start).total_seconds(), 0.001)
    scale = (TIMELINE_WIDTH - TIMELINE_LABEL - 10) / span_s
    bars = []
    for row, attempt in enumerate(timed):
        assert attempt.entered_at is not None
        x = TIMELINE_LABEL + (attempt.entered_at - start).total_seconds() * scale
        width = max((attempt_duration(attempt, now) or 0.0) * scale, 2.0)
        y = 6 + row * TIMELINE_ROW
        bars.append(
            html(
                '<text x="4" y="{0}" class="tl-label">#{1} {2}</text>'
                '<rect x="{3}" y="{4}" width="{5}" height="16" rx="3" class="bar a-{6}">'
                "<title>attempt {1}: {2}, {7}</title></rect>",
                y + 12,
                attempt.attempt,
                attempt.state.value,
                Html(f"{x:.1f}"),
                y,
                Html(f"{width:.1f}"),
                attempt.state.value.lower(),
                seconds_text(attempt_duration(attempt, now)),
            )
        )
    height = 12 + len(timed) * TIMELINE_ROW + 14
    return html(
        '<svg class="timeline" viewBox="0 0 {0} {1}" width="{0}" height="{1}" role="img" '
        'aria-label="attempts timeline">{2}'
        '<text x="{3}" y="{4}" class="tl-axis">{5}</text>'
        '<text x="{6}" y="{4}" class="tl-axis" text-anchor="end">+{7}</text></svg>',
        TIMELINE_WIDTH,
        height,
        join(bars),
        TIMELINE_LABEL,
        height - 4,
        when(start),
        TIMELINE_WIDTH - 10,
        seconds_text(span_s),
    )


def _fields(pairs: Sequence[tuple[str, object]]) -> Html:
    return html(
        '<dl class="fields">{0}</dl>',
        join(
            html("<dt>{0}</dt><dd>{1}</dd>", k, v if isinstance(v, Html) else (v or EMPTY))
            for k, v in pairs
        ),
    )


def task_fragment(task: Task, csrf: str, now: datetime) -> Html:
    """What a task's page shows and refreshes: state, actions, attempts, data."""
    actions = []
    if task.status in CANCELLABLE:
        actions.append(action_button(task_href(task.id) + "/cancel", "Cancel", csrf, "danger"))
    if task.status is TaskStatus.OUTCOME_UNKNOWN:
        # Nobody knows whether the last attempt's effect happened: the operator decides,
        # having looked at the effect (docs/console.md "Tasks whose outcome is unknown").
        actions.append(action_button(task_href(task.id) + "/retry", "Run again", csrf))
        actions.append(
            action_button(task_href(task.id) + "/mark-failed", "Mark failed", csrf, "danger")
        )
    elif task.status in RETRYABLE:
        actions.append(action_button(task_href(task.id) + "/retry", "Retry", csrf))
    links: list[tuple[str, object]] = []
    if task.workflow_id:
        links.append(
            (
                "workflow",
                html('<a href="/workflows/{0}">{1}</a>', task.workflow_id, task.workflow_id),
            )
        )
    if task.schedule_id:
        links.append(
            (
                "schedule",
                html('<a href="/schedules/{0}">{1}</a>', task.schedule_id, task.schedule_id),
            )
        )
    summary = _fields(
        [
            ("status", status_badge(task.status)),
            ("type", task.type),
            ("queue", task.queue),
            ("priority", task.priority.value),
            ("scheduled", when(task.scheduled_at)),
            ("due", when(task.due_at)),
            ("finished", when(task.finished_at)),
            ("attempt", task.attempt),
            ("fencing token", task.fencing_token),
            ("worker", task.worker_id),
            ("job", task.job_id),
            ("waiting", task.waiting_reason),
            *links,
        ]
    )
    attempt_rows = join(
        html(
            '<tr><td>{0}</td><td>{1}</td><td>{2}</td><td class="mono">{3}</td><td>{4}</td>'
            "<td>{5}</td><td>{6}</td></tr>{7}",
            a.attempt,
            status_badge(a.state),
            a.fencing_token,
            a.worker_id or EMPTY,
            when(a.entered_at),
            when(a.finished_at),
            seconds_text(attempt_duration(a, now)),
            html(
                '<tr class="err"><td colspan="7"><pre class="traceback">{0}</pre></td></tr>',
                a.error,
            )
            if a.error
            else Html(""),
        )
        for a in task.attempts
    )
    attempts = (
        html(
            '<table class="attempts"><thead><tr><th>#</th><th>state</th><th>token</th>'
            "<th>worker</th><th>entered</th><th>finished</th><th>duration</th></tr></thead>"
            "<tbody>{0}</tbody></table>",
            attempt_rows,
        )
        if task.attempts
        else Html("")
    )
    last_error = (
        html('<h2>Last error</h2><pre class="traceback" id="last-error">{0}</pre>', task.last_error)
        if task.last_error
        else Html("")
    )
    return html(
        '<div class="actions">{0}</div>{1}<h2>Attempts</h2>{2}{3}{4}'
        '<h2>Payload</h2><pre class="json" id="payload">{5}</pre>'
        '<h2>Result</h2><pre class="json" id="result">{6}</pre>'
        '<h2>Checkpoint</h2><pre class="json">{7}</pre>',
        join(actions),
        summary,
        timeline_svg(task.attempts, now),
        attempts,
        last_error,
        json_text(task.payload),
        json_text(task.result),
        checkpoint_text(task.checkpoint),
    )


def task_is_live(task: Task) -> bool:
    return not task.status.is_terminal


def live_section(url: str | None, fragment: Html) -> Html:
    """A section the script refreshes from ``url`` every two seconds (None: it does not)."""
    if url is None:
        return html('<section id="live">{0}</section>', fragment)
    return html('<section id="live" data-live="{0}">{1}</section>', url, fragment)


def task_page(task: Task, csrf: str, now: datetime, notice: str | None = None) -> Html:
    url = task_href(task.id) + "/live" if task_is_live(task) else None
    return page(
        f"Task {task.id}",
        live_section(url, task_fragment(task, csrf, now)),
        active="tasks",
        csrf=csrf,
        notice=notice,
    )


# --- incidents ------------------------------------------------------------------------------


def incidents_table(incidents: Sequence[Incident], *, whose: bool = False) -> Html:
    """Incidents newest first: state, severity, job, what fired, since when; with
    ``whose`` (an operator's listing of every tenant's) the tenant of each, or
    "cluster" for the cluster's own."""
    if not incidents:
        return html('<p class="empty">No incident.</p>')
    rows = join(
        html(
            '<tr class="incident {0}"><td>{1}</td>{2}<td>{3}</td><td class="mono">{4}</td>'
            "<td>{5}</td><td>{6}</td><td>{7}</td><td>{8}</td></tr>",
            "open" if i.resolved_at is None else "resolved",
            html('<span class="badge s-failed">open</span>')
            if i.resolved_at is None
            else html('<span class="badge s-completed">resolved</span>'),
            html('<td class="tenant">{0}</td>', i.tenant_name or i.tenant_id or "cluster")
            if whose
            else Html(""),
            i.severity,
            i.job_id or EMPTY,
            i.kind,
            i.summary,
            when(i.opened_at),
            when(i.resolved_at),
        )
        for i in incidents
    )
    return html(
        '<table class="incidents"><thead><tr><th>state</th>{0}<th>severity</th><th>job</th>'
        "<th>kind</th><th>summary</th><th>opened</th><th>resolved</th></tr></thead>"
        "<tbody>{1}</tbody></table>",
        Html("<th>tenant</th>") if whose else Html(""),
        rows,
    )


# --- schedules ---------------------------------------------------------------------------------


def schedule_href(schedule_id: str) -> str:
    return "/schedules/" + urllib.parse.quote(schedule_id, safe="")


def schedule_actions(schedule: Schedule, csrf: str) -> Html:
    base = schedule_href(schedule.id)
    toggle = (
        action_button(base + "/resume", "Resume", csrf)
        if schedule.paused
        else action_button(base + "/pause", "Pause", csrf)
    )
    return html("{0}{1}", toggle, action_button(base + "/trigger", "Trigger now", csrf))


def schedules_page(schedules: Sequence[Schedule], csrf: str, notice: str | None = None) -> Html:
    rows = join(
        html(
            '<tr><td><a href="{0}">{1}</a></td><td>{2}</td><td>{3}</td><td>{4}</td>'
            "<td>{5}</td><td>{6}</td></tr>",
            schedule_href(s.id),
            s.spec.name,
            schedule_rule(s.spec),
            s.spec.task.type if s.spec.task else ("workflow" if s.spec.workflow else EMPTY),
            html('<span class="badge s-paused">paused</span>')
            if s.paused
            else html('<span class="badge s-active">active</span>'),
            when(s.next_occurrence),
            schedule_actions(s, csrf),
        )
        for s in schedules
    )
    body = (
        html(
            '<table class="schedules"><thead><tr><th>name</th><th>rule</th><th>makes</th>'
            "<th>state</th><th>next occurrence</th><th></th></tr></thead><tbody>{0}</tbody>"
            "</table>",
            rows,
        )
        if schedules
        else html('<p class="empty">No schedule yet.</p>')
    )
    new = html('<p><a class="button" href="/schedules/new">New schedule</a></p>')
    return page(
        "Schedules", html("{0}{1}", new, body), active="schedules", csrf=csrf, notice=notice
    )


SCHEDULE_FORM_KEYS = ("name", "cron", "timezone", "interval_s", "type", "queue", "priority")
PAYLOAD_FORM_KEY = "payload"
MAX_FORM_PAYLOAD_CHARS = 65_536
"""Far above a form's use; the API's own payload limit still applies."""


@dataclass(frozen=True)
class ScheduleForm:
    """What the new-schedule form holds: the fields as typed, kept to show again."""

    values: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> str:
        return self.values.get(key, "")


def read_schedule_form(form: Mapping[str, object]) -> tuple[ScheduleForm, ScheduleSpec | str]:
    """The form's fields, and the spec they make or the first problem with them (named as
    the form labels it). The API judges the rest (a cron it cannot read, a time zone it
    does not know) and its refusal is shown on the form the same way."""
    values = {key: str(form.get(key) or "").strip() for key in SCHEDULE_FORM_KEYS}
    values[PAYLOAD_FORM_KEY] = str(form.get(PAYLOAD_FORM_KEY) or "").strip()
    kept = ScheduleForm(values)
    if not values["name"]:
        return kept, "name: give the schedule a name"
    if not values["type"]:
        return kept, "task type: name the handler type each occurrence runs"
    if bool(values["cron"]) == bool(values["interval_s"]):
        return kept, "rule: give a cron expression or an interval in seconds, not both"
    interval_s: float | None = None
    if values["interval_s"]:
        try:
            interval_s = float(values["interval_s"])
        except ValueError:
            return kept, f"interval: {values['interval_s']!r} is not a number of seconds"
    payload: dict[str, object] | None = None
    if values[PAYLOAD_FORM_KEY]:
        if len(values[PAYLOAD_FORM_KEY]) > MAX_FORM_PAYLOAD_CHARS:
            return kept, f"payload: over {MAX_FORM_PAYLOAD_CHARS} characters"
        try:
            parsed = json.loads(values[PAYLOAD_FORM_KEY])
        except ValueError as exc:
            return kept, f"payload: not JSON ({exc})"
        if not isinstance(parsed, dict):
            return kept, "payload: must be a JSON object ({...})"
        payload = parsed
    try:
        priority = Priority(values["priority"]) if values["priority"] else None
        spec = ScheduleSpec(
            name=values["name"],
            task=TaskSpec(
                type=values["type"], payload=payload, priority=priority, queue=values["queue"]
            ),
            cron=values["cron"] or None,
            interval_s=interval_s,
            timezone=values["timezone"] or None,
        )
    except (TypeError, ValueError) as exc:
        return kept, str(exc)
    return kept, spec


def schedule_form_page(form: ScheduleForm, csrf: str, error: str | None = None) -> Html:
    problem = html('<p class="error" role="alert">{0}</p>', error) if error else Html("")

    def text(key: str, label: str, hint: str = "") -> Html:
        return html(
            '<label for="{0}">{1}</label><input type="text" id="{0}" name="{0}" value="{2}"'
            ' placeholder="{3}">',
            key,
            label,
            form.get(key),
            hint,
        )

    priorities = join(
        html(
            '<option value="{0}"{1}>{2}</option>',
            value,
            Html(" selected") if form.get("priority") == value else Html(""),
            label,
        )
        for value, label in (("", "server default"), *((p.value, p.value) for p in Priority))
    )
    body = html(
        '<form method="post" action="/schedules/new" class="schedule-form">{0}{1}'
        "{2}{3}{4}{5}{6}{7}"
        '<label for="priority">priority</label><select id="priority" name="priority">{8}'
        "</select>"
        '<label for="payload">payload (a JSON object)</label>'
        '<textarea id="payload" name="payload" rows="4">{9}</textarea>'
        '<button type="submit">Create</button></form>',
        problem,
        csrf_field(csrf),
        text("name", "name"),
        text("cron", "cron", "0 3 * * *"),
        text("timezone", "time zone", "UTC"),
        text("interval_s", "or every (seconds)", "3600"),
        text("type", "task type"),
        text("queue", "queue", "default"),
        priorities,
        form.get(PAYLOAD_FORM_KEY),
    )
    return page("New schedule", body, active="schedules", csrf=csrf)


def schedule_page(details: ScheduleDetails, csrf: str, notice: str | None = None) -> Html:
    schedule = details.schedule
    upcoming = join(html("<li>{0}</li>", when(at)) for at in details.next_occurrences)
    runs = join(
        html(
            "<tr><td>{0}</td><td>{1}</td><td>{2}</td><td>{3}</td><td>{4}</td></tr>",
            when(r.logical_date),
            r.origin.value,
            html('<a href="{0}" class="mono">{1}</a>', task_href(r.task_id), r.task_id)
            if r.task_id
            else (
                html('<a href="/workflows/{0}">workflow</a>', r.workflow_id)
                if r.workflow_id
                else EMPTY
            ),
            status_badge(r.status) if r.status else EMPTY,
            when(r.finished_at),
        )
        for r in details.runs
    )
    body = html(
        '<div class="actions">{0}</div>{1}<h2>Next occurrences</h2><ul>{2}</ul>'
        "<h2>Last runs</h2>{3}",
        schedule_actions(schedule, csrf),
        _fields(
            [
                (
                    "state",
                    html('<span class="badge s-paused">paused</span>')
                    if schedule.paused
                    else html('<span class="badge s-active">active</span>'),
                ),
                ("rule", schedule_rule(schedule.spec)),
                ("task type", schedule.spec.task.type if schedule.spec.task else None),
                ("job", schedule.spec.job_id),
                ("next occurrence", when(schedule.next_occurrence)),
                ("id", schedule.id),
            ]
        ),
        upcoming or html("<li>{0}</li>", EMPTY),
        html(
            "<table><thead><tr><th>logical date</th><th>origin</th><th>task</th>"
            "<th>status</th><th>finished</th></tr></thead><tbody>{0}</tbody></table>",
            runs,
        )
        if details.runs
        else html('<p class="empty">No run yet.</p>'),
    )
    return page(
        f"Schedule {schedule.spec.name}", body, active="schedules", csrf=csrf, notice=notice
    )


# --- workflows --------------------------------------------------------------------------------


def workflows_page(workflows: Sequence[Workflow], csrf: str) -> Html:
    rows = join(
        html(
            '<tr><td><a href="/workflows/{0}">{1}</a></td><td>{2}</td><td>{3}</td><td>{4}</td>'
            "<td>{5}</td></tr>",
            w.id,
            w.name,
            status_badge(w.state),
            w.task_count,
            when(w.created_at),
            when(w.finished_at),
        )
        for w in workflows
    )
    body = (
        html(
            "<table><thead><tr><th>name</th><th>state</th><th>tasks</th><th>created</th>"
            "<th>finished</th></tr></thead><tbody>{0}</tbody></table>",
            rows,
        )
        if workflows
        else html('<p class="empty">No workflow yet.</p>')
    )
    return page("Workflows", body, active="workflows", csrf=csrf)


def workflow_svg(detail: WorkflowDetail) -> Html:
    refs = [t.ref for t in detail.tasks]
    edges = [(e.parent, e.child) for e in detail.edges]
    placed = graph.layout(refs, edges)
    states = {t.ref: t for t in detail.tasks}
    lines = []
    for parent, child in placed.edges:
        a, b = placed.nodes[parent], placed.nodes[child]
        lines.append(
            html(
                '<path d="M{0},{1} C{0},{2} {3},{2} {3},{4}" '
                'class="edge" marker-end="url(#arrow)"></path>',
                Html(f"{a.centre_x:.1f}"),
                Html(f"{a.y + graph.NODE_HEIGHT:.1f}"),
                Html(f"{(a.y + graph.NODE_HEIGHT + b.y) / 2:.1f}"),
                Html(f"{b.centre_x:.1f}"),
                Html(f"{b.y - 2:.1f}"),
            )
        )
    boxes = []
    for ref in refs:
        spot = placed.nodes[ref]
        state = states[ref]
        status = state.task.status.value
        boxes.append(
            html(
                '<a href="{0}" class="node"><g data-ref="{1}" data-status="{2}">'
                '<rect x="{3}" y="{4}" width="{5}" height="{6}" rx="6" class="box s-{7}">'
                "</rect>"
                '<text x="{8}" y="{9}" class="ref">{1}</text>'
                '<text x="{8}" y="{10}" class="state">{2}</text>'
                "<title>{1}: {2}{11}</title></g></a>",
                task_href(state.task.id),
                ref,
                status,
                Html(f"{spot.x:.1f}"),
                Html(f"{spot.y:.1f}"),
                graph.NODE_WIDTH,
                graph.NODE_HEIGHT,
                status.lower(),
                Html(f"{spot.centre_x:.1f}"),
                Html(f"{spot.y + 18:.1f}"),
                Html(f"{spot.y + 35:.1f}"),
                f" (upstream: {state.upstream_cause})" if state.upstream_cause else "",
            )
        )
    return html(
        '<svg class="dag" viewBox="0 0 {0} {1}" width="{0}" height="{1}" '
        'role="img" aria-label="workflow graph"><defs><marker id="arrow" viewBox="0 0 10 10" '
        'refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" class="arrowhead"></path></marker></defs>{2}{3}</svg>',
        Html(f"{placed.width:.0f}"),
        Html(f"{placed.height:.0f}"),
        join(lines),
        join(boxes),
    )


def workflow_href(workflow_id: str) -> str:
    return "/workflows/" + urllib.parse.quote(workflow_id, safe="")


def workflow_is_live(detail: WorkflowDetail) -> bool:
    return detail.workflow.state is WorkflowState.RUNNING


def workflow_fragment(detail: WorkflowDetail, csrf: str) -> Html:
    w = detail.workflow
    actions = []
    if w.state is WorkflowState.RUNNING:
        actions.append(action_button(workflow_href(w.id) + "/cancel", "Cancel", csrf, "danger"))
    if w.state in WORKFLOW_RETRYABLE:
        actions.append(action_button(workflow_href(w.id) + "/retry", "Retry failed", csrf))
    return html(
        '<div class="actions">{2}</div>{0}<h2>Graph</h2>{1}',
        _fields(
            [
                ("state", status_badge(w.state)),
                ("tasks", w.task_count),
                ("edges", w.edge_count),
                ("created", when(w.created_at)),
                ("finished", when(w.finished_at)),
                ("job", w.job_id),
                ("id", w.id),
            ]
        ),
        workflow_svg(detail),
        join(actions),
    )


def workflow_page(detail: WorkflowDetail, csrf: str, notice: str | None = None) -> Html:
    url = workflow_href(detail.workflow.id) + "/live" if workflow_is_live(detail) else None
    return page(
        f"Workflow {detail.workflow.name}",
        live_section(url, workflow_fragment(detail, csrf)),
        active="workflows",
        csrf=csrf,
        notice=notice,
    )


# --- expectations ---------------------------------------------------------------------------


def expectations_page(
    expectations: Sequence[ExpectationView], incidents: Sequence[Incident], csrf: str
) -> Html:
    rows = join(
        html(
            "<tr><td>{0}</td><td>{1}</td><td>{2}</td><td>{3}</td><td>{4}</td><td>{5}</td>"
            "<td>{6}</td></tr>",
            e.job_id,
            seconds_text(e.interval_s),
            seconds_text(e.tolerance_s),
            e.severity,
            "enabled" if e.enabled else "disabled",
            "config" if e.from_config else "api",
            e.description,
        )
        for e in expectations
    )
    body = (
        html(
            "<table><thead><tr><th>job</th><th>every</th><th>tolerance</th><th>severity</th>"
            "<th>state</th><th>from</th><th>description</th></tr></thead><tbody>{0}</tbody>"
            "</table>",
            rows,
        )
        if expectations
        else html('<p class="empty">No expectation registered (chronoshard expect add).</p>')
    )
    body = html(
        "{0}<h2>Incidents (open, and resolved in the last day)</h2>{1}",
        body,
        incidents_table(incidents),
    )
    return page("Expectations and incidents", body, active="expectations", csrf=csrf)


__all__ = ["escape"]
