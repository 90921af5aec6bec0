"""``chronoshard workflows submit|get|ls|cancel|retry``: the WorkflowService through
:class:`chronoshard.SyncClient`, as the tenant whose API key is given.

``submit`` reads a workflow file (JSON or YAML, docs/client.md#workflow-files) into
the client's types with :func:`parse_workflow_document`, which checks the whole file
before any call and names every problem by its place in the file
(``tasks[2].tpye: unknown key``). It checks only what the server could not name by
the file's own positions: unknown keys and value types, and edges naming no task,
looping on one task or repeating another (the request's edges are the file's
``edges`` followed by its ``after`` shorthands, so the server's ``edges[7]`` would
not point into the file). Everything else (a reference's spelling, repeated
references, cycles, sizes) is the server's to judge; its message names the field,
and a task's index in the request is its index in the file.

``get`` draws the DAG as layers (:func:`layers`: a task's layer is the longest path to
it from a task without parents), one line per task, bounded by ``--limit`` so that a
10,000-task run prints a screenful. The layout and the drawing are pure functions.
Server refusals are raised as the client's exceptions and turned into exit codes by
``cli.main``; JSON output is the client's dataclasses (docs/operations.md, The CLI).
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO, TypeVar

from chronoshard import exact_json
from chronoshard._cli import output
from chronoshard._cli.common import (
    EXIT_OK,
    Command,
    UsageError,
    add_api,
    aware_time,
    client,
    duration_s,
    first_of,
    positive_int,
)
from chronoshard.types import (
    JitterMode,
    Priority,
    TaskSpec,
    TaskStatus,
    TriggerRule,
    Workflow,
    WorkflowCreateResult,
    WorkflowDetail,
    WorkflowEdge,
    WorkflowState,
    WorkflowTask,
    WorkflowTaskState,
    WorkflowTemplate,
)

DEFAULT_LIST_LIMIT = 50
MAX_LIST_PAGE = 1000
DEFAULT_DRAW_LIMIT = 200
"""Task lines ``get`` and ``submit`` print by default: a screenful of a big run."""
PARENTS_SHOWN = 5
"""Parents named on one task's line; a fan-in of thousands would make one line a page."""
PROBLEMS_SHOWN = 20
"""Problems of a workflow file reported at once; a generated file may have thousands."""
YAML_SUFFIXES = (".yaml", ".yml")

_E = TypeVar("_E", bound=StrEnum)

# --- the workflow file -------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowFile:
    """A workflow file read into the arguments of ``create_workflow``; ``edges`` are
    the file's ``edges`` followed by the ``after`` shorthands of its tasks, in order."""

    name: str
    tasks: tuple[WorkflowTask, ...]
    edges: tuple[WorkflowEdge, ...]
    at: datetime | None = None
    delay_s: float | None = None
    idempotency_key: str | None = None


class _Problems:
    """The problems found in one file, each as ``where: what``; raised together."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.found: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.found.append(f"{where}: {what}" if where else what)

    def raise_any(self) -> None:
        if not self.found:
            return
        if len(self.found) == 1:
            raise UsageError(f"{self.source}: {self.found[0]}")
        shown = [f"  {problem}" for problem in self.found[:PROBLEMS_SHOWN]]
        if len(self.found) > PROBLEMS_SHOWN:
            shown.append(f"  ... and {len(self.found) - PROBLEMS_SHOWN} more")
        raise UsageError(f"{self.source}: {len(self.found)} problems:\n" + "\n".join(shown))


def _text_value(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {_kind(value)}")
    return value


def _flag_value(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {_kind(value)}")
    return value


def _count_value(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be an integer, got {_kind(value)}")
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


def _seconds_value(value: Any, *, positive: bool) -> float:
    """A duration as the command line writes it (``90s``, ``5m``: :func:`duration_s`)
    or a number of seconds."""
    if isinstance(value, str):
        try:
            seconds = duration_s(value)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError(f"must be finite, got {value}")
    else:
        raise ValueError(f"must be a duration (90s, 5m, 1h) or seconds, got {_kind(value)}")
    if seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"must be {'positive' if positive else 'non-negative'}, got {value!r}")
    return seconds


def _choice_value(enum: type[_E]) -> Callable[[Any], _E]:
    def read(value: Any) -> _E:
        allowed = ", ".join(member.value for member in enum)
        if isinstance(value, str):
            for member in enum:
                if member.value.lower() == value.lower():
                    return member
        raise ValueError(f"must be one of {allowed}, got {value!r}")

    return read


def _time_value(value: Any) -> datetime:
    try:
        return aware_time(_text_value(value))
    except argparse.ArgumentTypeError as exc:
        # aware_time's advice names the command line's --in; a file has `delay` instead.
        raise ValueError(str(exc).replace("--in", "delay")) from None


_TASK_OPTIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    # file key: (TaskSpec field, reader); the keys are the `submit`/`schedules create`
    # options without their dashes, the values read as those options read them.
    "queue": ("queue", _text_value),
    "priority": ("priority", _choice_value(Priority)),
    "max_retries": ("max_retries", _count_value),
    "timeout": ("timeout_s", lambda v: _seconds_value(v, positive=True)),
    "strict": ("strict_timing", _flag_value),
    "jitter": ("jitter", _choice_value(JitterMode)),
    "jitter_window": ("jitter_window_s", lambda v: _seconds_value(v, positive=False)),
    "idempotent": ("idempotent", _flag_value),
    "job_id": ("job_id", _text_value),
}
_TASK_KEYS = ("ref", "type", "payload", "trigger_rule", "after", *_TASK_OPTIONS)
_TOP_KEYS = ("name", "tasks", "edges", "delay", "scheduled_at", "idempotency_key")
OCCURRENCE_KEYS: dict[str, str] = {
    # The keys of a workflow file a schedule's occurrence decides, and why.
    "delay": "each occurrence starts its run at the occurrence's time",
    "scheduled_at": "each occurrence starts its run at the occurrence's time",
    "idempotency_key": "each occurrence's run is keyed by the schedule and its logical date",
}
_EDGE_KEYS = ("parent", "child")


def _kind(value: Any) -> str:
    """A YAML/JSON value's kind, as the file's author knows it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _unknown_keys(
    mapping: Mapping[Any, Any], known: Sequence[str], where: str, problems: _Problems
) -> None:
    for key in mapping:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(known)})"
        problems.add(f"{where}{key}", "unknown key" + hint)


def _required(mapping: Mapping[str, Any], key: str, where: str, problems: _Problems) -> Any:
    if key not in mapping:
        problems.add(f"{where}{key}", "is required")
    return mapping.get(key)


@dataclass
class _Edges:
    """The edges found so far, each with the place in the file that gave it."""

    pairs: list[tuple[str, str]] = field(default_factory=list)
    places: list[str] = field(default_factory=list)

    def add(self, parent: str, child: str, place: str) -> None:
        self.pairs.append((parent, child))
        self.places.append(place)


def _read_edge(item: Any, place: str, edges: _Edges, problems: _Problems) -> None:
    if isinstance(item, list) and len(item) == 2 and all(isinstance(r, str) for r in item):
        edges.add(item[0], item[1], place)
    elif isinstance(item, Mapping):
        _unknown_keys(item, _EDGE_KEYS, f"{place}.", problems)
        parent = _required(item, "parent", f"{place}.", problems)
        child = _required(item, "child", f"{place}.", problems)
        for key, ref in (("parent", parent), ("child", child)):
            if ref is not None and not isinstance(ref, str):
                problems.add(f"{place}.{key}", f"must be a task's ref, got {_kind(ref)}")
        if isinstance(parent, str) and isinstance(child, str):
            edges.add(parent, child, place)
    else:
        problems.add(place, f"must be [parent, child] or {{parent: ..., child: ...}}, got {item!r}")


def _read_task(
    item: Any, index: int, edges: _Edges, problems: _Problems
) -> tuple[str, WorkflowTask | None]:
    """The task's ref (``""`` when it has none) and the task, None if it is wrong."""
    where = f"tasks[{index}]"
    if not isinstance(item, Mapping):
        problems.add(where, f"must be a mapping (ref, type, ...), got {_kind(item)}")
        return "", None
    before = len(problems.found)
    _unknown_keys(item, _TASK_KEYS, f"{where}.", problems)
    texts: dict[str, str] = {}
    for key in ("ref", "type"):
        if _required(item, key, f"{where}.", problems) is not None:
            try:
                texts[key] = _text_value(item[key])
            except ValueError as exc:
                problems.add(f"{where}.{key}", str(exc))
    ref = texts.get("ref", "")
    payload = item.get("payload")
    if payload is not None and not isinstance(payload, Mapping):
        problems.add(f"{where}.payload", f"must be a mapping (a JSON object), got {_kind(payload)}")
    options: dict[str, Any] = {}
    for key, (spec_field, reader) in _TASK_OPTIONS.items():
        if key in item:
            try:
                options[spec_field] = reader(item[key])
            except ValueError as exc:
                problems.add(f"{where}.{key}", str(exc))
    rule = TriggerRule.ALL_SUCCESS
    if "trigger_rule" in item:
        try:
            rule = _choice_value(TriggerRule)(item["trigger_rule"])
        except ValueError as exc:
            problems.add(f"{where}.trigger_rule", str(exc))
    after = item.get("after", [])
    parents = [after] if isinstance(after, str) else after
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        problems.add(f"{where}.after", f"must be a ref or a list of refs, got {after!r}")
    elif ref:
        for k, parent in enumerate(parents):
            edges.add(parent, ref, f"{where}.after[{k}]")
    if len(problems.found) > before:
        return ref, None
    try:
        spec = TaskSpec(type=texts["type"], payload=payload, **options)
        return ref, WorkflowTask(ref=ref, task=spec, trigger_rule=rule)
    except (TypeError, ValueError) as exc:
        problems.add(where, str(exc))
        return ref, None


def _check_edges(refs: Iterable[str], edges: _Edges, problems: _Problems) -> None:
    """Edges naming no task, self-loops and repeats, named by their place in the file."""
    known = set(refs) - {""}  # "": a task without a ref, already a problem of its own
    first: dict[tuple[str, str], str] = {}
    for (parent, child), place in zip(edges.pairs, edges.places, strict=True):
        missing = [r for r in (parent, child) if r not in known]
        if missing:
            problems.add(place, f"no task has the ref {missing[0]!r}")
        elif parent == child:
            problems.add(place, f"{parent} -> {child}: a task cannot depend on itself")
        elif (parent, child) in first:
            problems.add(place, f"{parent} -> {child} repeats {first[(parent, child)]}")
        else:
            first[(parent, child)] = place


def parse_workflow_document(
    document: Any, source: str, *, for_schedule: bool = False
) -> WorkflowFile:
    """A workflow file's document (the JSON or YAML value) as ``create_workflow``'s
    arguments. Raises UsageError naming ``source`` and every problem found (the first
    :data:`PROBLEMS_SHOWN` of them), each at its place in the file.

    ``for_schedule``: the file of a schedule's workflow (``schedules create --workflow``),
    whose runs each occurrence starts and keys: :data:`OCCURRENCE_KEYS` are refused,
    each named, and ``name`` may be left out (the runs take the schedule's)."""
    problems = _Problems(source)
    if not isinstance(document, Mapping):
        problems.add("", f"must be a mapping (name, tasks, edges, ...), got {_kind(document)}")
        problems.raise_any()
    _unknown_keys(document, _TOP_KEYS, "", problems)
    name = document.get("name", "") if for_schedule else _required(document, "name", "", problems)
    if "name" in document and not isinstance(name, str):
        problems.add("name", f"must be a string, got {_kind(name)}")
    key = at = delay_s = None
    if for_schedule:
        for refused, why in OCCURRENCE_KEYS.items():
            if refused in document:
                problems.add(refused, f"not allowed in a schedule's workflow: {why}")
    else:
        key = document.get("idempotency_key")
        if key is not None and not isinstance(key, str):
            problems.add("idempotency_key", f"must be a string, got {_kind(key)}")
        at, delay_s = _read_start(document, problems)

    # Tasks first, so that problems are listed in the order a file is written in.
    after = _Edges()
    refs: list[str] = []
    tasks: list[WorkflowTask] = []
    raw_tasks = _required(document, "tasks", "", problems)
    if raw_tasks is not None and not isinstance(raw_tasks, list):
        problems.add("tasks", f"must be a list, got {_kind(raw_tasks)}")
    elif raw_tasks is not None:
        for i, item in enumerate(raw_tasks):
            ref, task = _read_task(item, i, after, problems)
            refs.append(ref)
            if task is not None:
                tasks.append(task)
    edges = _Edges()
    raw_edges = document.get("edges", [])
    if not isinstance(raw_edges, list):
        problems.add("edges", f"must be a list, got {_kind(raw_edges)}")
    else:
        for j, item in enumerate(raw_edges):
            _read_edge(item, f"edges[{j}]", edges, problems)
    # The request's edges: the listed ones (their indices stay the file's), then `after`.
    edges.pairs += after.pairs
    edges.places += after.places
    _check_edges(refs, edges, problems)
    problems.raise_any()
    return WorkflowFile(
        name=name,
        tasks=tuple(tasks),
        edges=tuple(WorkflowEdge(parent, child) for parent, child in edges.pairs),
        at=at,
        delay_s=delay_s,
        idempotency_key=key or None,
    )


def _read_start(
    document: Mapping[str, Any], problems: _Problems
) -> tuple[datetime | None, float | None]:
    """``scheduled_at`` or ``delay`` (at most one), as ``create_workflow``'s ``at`` and
    ``delay_s``."""
    if "scheduled_at" in document and "delay" in document:
        problems.add("delay", "give at most one of delay and scheduled_at")
    elif "scheduled_at" in document:
        try:
            return _time_value(document["scheduled_at"]), None
        except ValueError as exc:
            problems.add("scheduled_at", str(exc))
    elif "delay" in document:
        try:
            return None, _seconds_value(document["delay"], positive=False)
        except ValueError as exc:
            problems.add("delay", str(exc))
    return None, None


def load_document(text: str, source: str) -> Any:
    """The value a workflow file holds: YAML for a ``.yaml``/``.yml`` name, JSON for
    ``.json``, else JSON when it starts with ``{`` and YAML otherwise. JSON numbers are
    exact (:mod:`chronoshard.exact_json`); YAML reads them as int or float."""
    suffix = Path(source).suffix.lower()
    as_yaml = suffix in YAML_SUFFIXES or (suffix != ".json" and not text.lstrip().startswith("{"))
    if not as_yaml:
        try:
            return exact_json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"{source}: not JSON: {exc}") from None
    import yaml  # only for a YAML file: the CLI's other commands never pay for it

    try:
        return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass: no tags run code
    except yaml.YAMLError as exc:
        raise UsageError(f"{source}: not YAML: {exc}") from None


def _yaml_loader() -> type[Any]:
    """PyYAML's safe loader without its timestamp rule: a time in a payload stays the
    string it is in JSON (a ``date`` would be no JSON value), and ``scheduled_at`` is
    read as the command line reads a time, refusing one without an offset."""
    import yaml

    class NoTimestamps(yaml.SafeLoader):
        pass

    NoTimestamps.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return NoTimestamps


def read_workflow_file(path: str, *, for_schedule: bool = False) -> WorkflowFile:
    """Read and check the file at ``path`` (``-``: standard input); ``for_schedule`` as
    :func:`parse_workflow_document`."""
    source = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"{source}: {reason}") from None
    return parse_workflow_document(load_document(text, source), source, for_schedule=for_schedule)


def read_workflow_template(path: str) -> WorkflowTemplate:
    """A schedule's workflow file (``schedules create --workflow``): what ``submit``
    reads, without the keys each occurrence decides."""
    found = read_workflow_file(path, for_schedule=True)
    return WorkflowTemplate(name=found.name, tasks=found.tasks, edges=found.edges)


def longest_chain_s(template: WorkflowTemplate) -> float | None:
    """The sum of the timeouts along the template's longest chain of tasks (the longest
    a run can take without retries), None when a task has no timeout (or there is no
    task): the expected duration the server gives the watch of a schedule of it."""
    timeouts: dict[str, float] = {}
    for task in template.tasks:
        if task.task.timeout_s is None:
            return None
        timeouts[task.ref] = task.task.timeout_s
    parents: dict[str, list[str]] = {ref: [] for ref in timeouts}
    for edge in template.edges:
        if edge.child in parents:
            parents[edge.child].append(edge.parent)
    done: dict[str, float] = {}
    for layer in layers(list(timeouts), _pairs(template.edges)):  # parents before children
        for ref in layer:
            before = max((done.get(parent, 0.0) for parent in parents[ref]), default=0.0)
            done[ref] = before + timeouts[ref]
    return max(done.values(), default=None)


# --- the drawing -------------------------------------------------------------------------


def layers(refs: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """``refs`` grouped by depth, the longest path to each from a task without parents,
    so every child is in a later layer than each of its parents; within a layer, in the
    order of ``refs``. Linear in tasks + edges (Kahn's order).

    The server sends only acyclic graphs whose edges name its tasks; this function still
    ends on anything: edges naming no ref are ignored, and tasks on a cycle (or after
    one) form one last layer. Each ref appears once (a repeat in ``refs`` is dropped).
    """
    position: dict[str, int] = {}
    for ref in refs:
        position.setdefault(ref, len(position))
    children: dict[str, list[str]] = {ref: [] for ref in position}
    waiting: dict[str, int] = dict.fromkeys(position, 0)
    for parent, child in set(edges):
        if parent in position and child in position:
            children[parent].append(child)
            waiting[child] += 1
    depth: dict[str, int] = {}
    ready = deque(ref for ref in position if waiting[ref] == 0)
    for ref in ready:
        depth[ref] = 0
    while ready:
        ref = ready.popleft()
        for child in children[ref]:
            depth[child] = max(depth.get(child, 0), depth[ref] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    # A task on a cycle has a depth from its parents outside the cycle, but no layer.
    deepest = max((depth[ref] for ref in position if waiting[ref] == 0), default=-1)
    out: list[list[str]] = [[] for _ in range(deepest + 1)]
    stuck: list[str] = []
    for ref in position:  # in the order of refs
        if waiting[ref] == 0:
            out[depth[ref]].append(ref)
        else:
            stuck.append(ref)
    if stuck:
        out.append(stuck)
    return out


def status_counts(tasks: Iterable[WorkflowTaskState]) -> str:
    """``COMPLETED 3, RUNNING 1``: in the lifecycle's order."""
    counts = Counter(t.task.status for t in tasks)
    return ", ".join(f"{status.value} {counts[status]}" for status in TaskStatus if counts[status])


def _parents_text(parents: Sequence[str]) -> str:
    if not parents:
        return ""
    shown = ", ".join(parents[:PARENTS_SHOWN])
    more = len(parents) - PARENTS_SHOWN
    return f"<- {shown}" + (f" (+{more} more)" if more > 0 else "")


def _notes(state: WorkflowTaskState) -> str:
    notes = []
    if state.trigger_rule is TriggerRule.ALL_DONE:
        notes.append("[all_done]")
    if state.task.status is TaskStatus.UPSTREAM_FAILED and state.upstream_cause:
        notes.append(f"(cause: {state.upstream_cause})")
    elif state.task.status is TaskStatus.SCHEDULED and state.task.unresolved_dependencies:
        notes.append(f"(waits for {state.task.unresolved_dependencies})")
    return " ".join(notes)


def draw_dag(detail: WorkflowDetail, limit: int) -> str:
    """The tasks layer by layer (:func:`layers`), one line each: ``ref  STATE  task id
    <- parents  notes``; at most ``limit`` task lines, then how many were left out."""
    by_ref = {state.ref: state for state in detail.tasks}
    parents: dict[str, list[str]] = {ref: [] for ref in by_ref}
    for edge in detail.edges:
        if edge.child in parents:
            parents[edge.child].append(edge.parent)
    rows: list[tuple[int, WorkflowTaskState]] = []
    for number, layer in enumerate(layers([t.ref for t in detail.tasks], _pairs(detail.edges))):
        rows.extend((number, by_ref[ref]) for ref in layer)
    shown = rows[:limit]
    ref_width = max((len(s.ref) for _, s in shown), default=0)
    status_width = max((len(s.task.status.value) for _, s in shown), default=0)
    lines: list[str] = []
    current = -1
    for number, state in shown:
        if number != current:
            lines.append(f"layer {number}")
            current = number
        line = (
            f"  {state.ref:<{ref_width}}  {state.task.status.value:<{status_width}}  "
            f"{state.task.id}  {_parents_text(parents[state.ref])}  {_notes(state)}"
        )
        lines.append(line.rstrip())
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more tasks (raise --limit, or -o json for all)")
    return "\n".join(lines)


def _pairs(edges: Iterable[WorkflowEdge]) -> list[tuple[str, str]]:
    return [(edge.parent, edge.child) for edge in edges]


def workflow_fields(workflow: Workflow, counts: str) -> str:
    """The run, one field a line."""
    return output.fields(
        [
            ("id", workflow.id),
            ("name", workflow.name),
            ("state", workflow.state),
            ("scheduled_at", workflow.scheduled_at),
            ("created_at", workflow.created_at),
            ("finished_at", workflow.finished_at),
            ("idempotency_key", workflow.idempotency_key),
            ("job_id", workflow.job_id),
            ("schedule_id", workflow.schedule_id),
            ("logical_date", workflow.logical_date),
            ("tasks", f"{workflow.task_count}" + (f" ({counts})" if counts else "")),
            ("edges", workflow.edge_count),
        ]
    )


def workflow_details(detail: WorkflowDetail, limit: int) -> str:
    """``workflows get``: the run's fields, then its DAG."""
    text = workflow_fields(detail.workflow, status_counts(detail.tasks))
    return text + "\n\n" + (draw_dag(detail, limit) if detail.tasks else "no tasks")


WORKFLOW_HEADERS = ("ID", "NAME", "STATE", "TASKS", "CREATED (UTC)", "FINISHED (UTC)")


def workflow_table(workflows: Sequence[Workflow]) -> str:
    return output.table(
        WORKFLOW_HEADERS,
        [[w.id, w.name, w.state, w.task_count, w.created_at, w.finished_at] for w in workflows],
    )


def created_text(result: WorkflowCreateResult, refs: Sequence[str], limit: int) -> str:
    """``workflows submit``: what was created, and each ref's task id in the file's
    order (at most ``limit`` of them)."""
    workflow = result.workflow
    verb = "created" if result.created else "already created (idempotency key)"
    head = (
        f"{verb} workflow {workflow.id} ({workflow.name}): {workflow.task_count} tasks, "
        f"{workflow.edge_count} edges, {workflow.state.value}, "
        f"starts {output.short_time(workflow.scheduled_at)} UTC"
    )
    shown = refs[:limit]
    text = head + "\n" + output.table(("REF", "TASK"), [[r, result.task_ids.get(r)] for r in shown])
    if len(refs) > len(shown):
        text += f"\n... {len(refs) - len(shown)} more (raise --limit, or -o json for all)"
    return text


# --- the commands ------------------------------------------------------------------------


def _add_limit(parser: argparse.ArgumentParser, default: int, what: str) -> None:
    parser.add_argument(
        "--limit", type=positive_int, default=default, help=f"{what} (default {default})"
    )


SUBMIT_EPILOG = """\
examples:
  chronoshard workflows submit etl.yaml
  chronoshard workflows submit etl.json -o json | jq -r .workflow.id
  generate-dag | chronoshard workflows submit -

The file (JSON, or YAML by its .yaml/.yml name or its content) names the run, its
tasks by local refs, and the edges parent -> child:

  name: nightly-etl
  delay: 30s                  # or scheduled_at: 2030-01-02T03:00:00Z; neither: now
  idempotency_key: etl-2030-01-02
  tasks:
    - {ref: fetch, type: records.fetch, payload: {day: "2030-01-02"}, timeout: 10m}
    - {ref: invoice, type: billing.invoice, after: [fetch], max_retries: 5}
    - {ref: report, type: report.build, after: [invoice], trigger_rule: all_done}
  edges: [[fetch, report]]    # or {parent: fetch, child: report}; `after` adds edges too

A task takes the options of `chronoshard submit` without dashes: queue, priority,
max_retries, timeout, strict, jitter, jitter_window, idempotent, job_id. Unknown keys
and wrong values are refused before any call, each named by its place in the file
(tasks[2].tpye: unknown key); the server refuses a cycle, naming one."""


def configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the workflow file ('-': stdin)")
    _add_limit(parser, DEFAULT_DRAW_LIMIT, "task ids to print")
    add_api(parser)


def run_submit(args: argparse.Namespace, out: TextIO) -> int:
    workflow_file = read_workflow_file(args.file)
    with client(args) as c:
        try:
            result = c.create_workflow(
                workflow_file.name,
                workflow_file.tasks,
                workflow_file.edges,
                at=workflow_file.at,
                delay_s=workflow_file.delay_s,
                idempotency_key=workflow_file.idempotency_key,
            )
        except (TypeError, ValueError) as exc:  # refused by the client before any call
            source = "<stdin>" if args.file == "-" else args.file
            raise UsageError(f"{source}: {exc}") from None
    if args.output == "json":
        print(output.dumps(result), file=out)
    else:
        refs = [task.ref for task in workflow_file.tasks]
        print(created_text(result, refs, args.limit), file=out)
    return EXIT_OK


GET_EPILOG = """\
examples:
  chronoshard workflows get "$ID"
  chronoshard workflows get "$ID" --limit 2000
  chronoshard workflows get "$ID" -o json \\
      | jq -r '.tasks[] | select(.task.status == "DEAD_LETTER") | .ref'

Shows the run (its state and the count of tasks per state) and its DAG in layers: a
task's layer is the longest path to it from a task without parents, so each task comes
after its parents. One line per task: ref, state, task id, its parents (<- ...), and
notes: [all_done] for that trigger rule, (cause: REF) for an UPSTREAM_FAILED task (the
task whose failure it descends from), (waits for N) for a task with N parents not
finished."""


def configure_get(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="the workflow's id")
    _add_limit(parser, DEFAULT_DRAW_LIMIT, "task lines to draw")
    add_api(parser)


def run_get(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        detail = c.get_workflow(args.id)
    if args.output == "json":
        print(output.dumps(detail), file=out)
    else:
        print(workflow_details(detail, args.limit), file=out)
    return EXIT_OK


LS_EPILOG = """\
examples:
  chronoshard workflows ls
  chronoshard workflows ls --state failed --limit 10
  chronoshard workflows ls -o json | jq -r '.workflows[].id'

Newest first."""


def _state(text: str) -> WorkflowState:
    try:
        return _choice_value(WorkflowState)(text)
    except ValueError:
        allowed = ", ".join(s.value.lower() for s in WorkflowState)
        raise argparse.ArgumentTypeError(f"one of {allowed}, got {text!r}") from None


def configure_ls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        type=_state,
        metavar="STATE",
        help="only runs in this state: running, succeeded, failed, cancelled",
    )
    _add_limit(parser, DEFAULT_LIST_LIMIT, "show at most this many")
    add_api(parser)


def run_ls(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        pages = c.iter_workflows(state=args.state, page_size=min(args.limit + 1, MAX_LIST_PAGE))
        found, more = first_of(pages, args.limit)
    if args.output == "json":
        print(output.dumps({"workflows": found, "more": more}), file=out)
        return EXIT_OK
    if not found:
        print("no workflows", file=out)
        return EXIT_OK
    print(workflow_table(found), file=out)
    if more:
        print(f"(first {len(found)} shown; more exist: raise --limit)", file=out)
    return EXIT_OK


CANCEL_EPILOG = """\
examples:
  chronoshard workflows cancel "$ID" --reason "bad input file"

Tasks not yet running are CANCELLED at once (never UPSTREAM_FAILED); running ones are
asked to stop and end CANCELLED when their workers acknowledge, so the run may show
RUNNING until then. Cancelling a finished workflow changes nothing."""


def configure_cancel(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="the workflow's id")
    parser.add_argument("--reason", default="", help="recorded as each cancelled task's last error")
    add_api(parser)


def run_cancel(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        result = c.cancel_workflow(args.id, args.reason)
    workflow = result.workflow
    if args.output == "json":
        print(output.dumps(result), file=out)
    elif result.cancelled == 0 and result.stopping == 0 and workflow.state.is_finished:
        print(f"workflow {workflow.id} is {workflow.state.value}: nothing to cancel", file=out)
    else:
        print(
            f"cancelled workflow {workflow.id}: {result.cancelled} tasks cancelled, "
            f"{result.stopping} running asked to stop; now {workflow.state.value}",
            file=out,
        )
    return EXIT_OK


RETRY_EPILOG = """\
examples:
  chronoshard workflows ls --state failed
  chronoshard workflows retry "$ID"

Retries a finished run from its failures on: every task that did not complete goes
back to SCHEDULED (those whose parents all completed are due at once); what completed
is kept and not run again. A SUCCEEDED run is left as it is; a RUNNING one is refused
(exit 1, FAILED_PRECONDITION): cancel it first, or wait for it to finish."""


def configure_retry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="the workflow's id (a finished run)")
    add_api(parser)


def run_retry(args: argparse.Namespace, out: TextIO) -> int:
    with client(args) as c:
        result = c.retry_workflow(args.id)
    workflow = result.workflow
    if args.output == "json":
        print(output.dumps(result), file=out)
    elif result.reopened == 0:
        print(f"workflow {workflow.id} is {workflow.state.value}: nothing to retry", file=out)
    else:
        print(
            f"retrying workflow {workflow.id}: {result.reopened} tasks back to SCHEDULED; "
            f"now {workflow.state.value}",
            file=out,
        )
    return EXIT_OK


WORKFLOW_COMMANDS: dict[str, Command] = {
    "submit": Command(
        "create a workflow from a JSON or YAML file", configure_submit, run_submit, SUBMIT_EPILOG
    ),
    "get": Command(
        "show a workflow: its state and its DAG with each task's state",
        configure_get,
        run_get,
        GET_EPILOG,
    ),
    "ls": Command("list workflows, newest first", configure_ls, run_ls, LS_EPILOG),
    "cancel": Command(
        "cancel every task of a workflow that is not finished",
        configure_cancel,
        run_cancel,
        CANCEL_EPILOG,
    ),
    "retry": Command(
        "run a finished workflow again from its failures on",
        configure_retry,
        run_retry,
        RETRY_EPILOG,
    ),
}
