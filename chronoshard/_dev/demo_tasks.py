"""``chronoshard dev --demo``: a few hundred demo tasks, watched until they settle.

The plan (:func:`demo_plan`) is pure: given ``now`` and a seeded random generator it
returns what to submit — strict tasks spread over the next ~20 s, jittered ones with a
10 s window, flaky ones that fail once or twice and are retried, a few that always fail
and end dead-lettered (something to investigate with ``tasks get --attempts``), and slow
ones that heartbeat. Beside them, a real schedule (``demo.heartbeat``, cron
``*/5 * * * * *``: every 5 s) is created through the client (:func:`heartbeat_schedule`);
the cluster's materialiser creates its occurrences, the demo worker's ``demo.tick``
prints each one's logical date, and the demo prints a line per occurrence that ran. The
schedule stays in the dev database: a later ``chronoshard dev --demo`` puts it back to
this spec (and resumes it) instead of making a second one.

:class:`DemoProgress` is pure too: it folds the tasks read back into counts per kind and
the lateness the demo worker measured (``late_ms`` in each result: handler start minus
due time), and renders a table or a one-line summary. :class:`DemoRun` is the thin shell
that submits through the client, polls once a second, and prints: a table redrawn in
place on a terminal, plain lines (only when something changed) otherwise.
"""

from __future__ import annotations

import random
import statistics
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TextIO

from chronoshard._cli import output
from chronoshard.types import (
    RetryPolicy,
    ScheduleSpec,
    Task,
    TaskSpec,
    WorkflowDetail,
    WorkflowEdge,
    WorkflowTask,
)

if TYPE_CHECKING:
    from chronoshard.sync_client import SyncClient

STRICT_TASKS = 120
JITTERED_TASKS = 100
FLAKY_TASKS = 40
FAILING_TASKS = 10
SLOW_TASKS = 30
FIRST_AT_S = 3.0
"""The first demo task is due this long after submission: the table is on screen first."""
SPREAD_S = 20.0
JITTER_WINDOW_S = 10.0
HEARTBEAT_SCHEDULE = "demo.heartbeat"
HEARTBEAT_EVERY_S = 5
HEARTBEAT_CRON = f"*/{HEARTBEAT_EVERY_S} * * * * *"
"""Six fields, seconds first: at :00, :05, :10, ... of every minute."""
POLL_S = 1.0
PLAIN_EVERY_S = 2.0
SCHEDULED = "schedule"
"""The kind of the schedule's occurrences in the table."""
KINDS = ("strict", "jittered", "flaky", "failing", "slow", SCHEDULED)

# What each status counts as in the table.
_COLUMN = {
    "SCHEDULED": "waiting",
    "PRELOADED": "waiting",
    "DISPATCHED": "running",
    "RUNNING": "running",
    "RETRYING": "retrying",
    "COMPLETED": "completed",
    "DEAD_LETTER": "dead",
    "CANCELLED": "dead",
    "UPSTREAM_FAILED": "dead",
}
COLUMNS = ("waiting", "running", "retrying", "completed", "dead")


@dataclass(frozen=True)
class PlannedTask:
    kind: str
    spec: TaskSpec


def demo_plan(now: datetime, rng: random.Random, run_id: str) -> list[PlannedTask]:
    """The demo's tasks, due between ``FIRST_AT_S`` and ``FIRST_AT_S + SPREAD_S`` from
    ``now`` (plus retries and jitter), tagged with ``run_id`` in their payloads."""
    fast_retry = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=2.0, multiplier=2.0)

    def at(i: int, n: int) -> datetime:
        return now + timedelta(seconds=FIRST_AT_S + SPREAD_S * i / n)

    plan = [
        PlannedTask(
            "strict",
            TaskSpec(
                "demo.echo", {"run": run_id, "i": i}, at=at(i, STRICT_TASKS), strict_timing=True
            ),
        )
        for i in range(STRICT_TASKS)
    ]
    plan += [
        PlannedTask(
            "jittered",
            TaskSpec(
                "demo.echo",
                {"run": run_id, "i": i},
                # Scheduled half a window in, so the jitter never reaches before the submit.
                at=at(i, JITTERED_TASKS) + timedelta(seconds=JITTER_WINDOW_S / 2),
                jitter_window_s=JITTER_WINDOW_S,
            ),
        )
        for i in range(JITTERED_TASKS)
    ]
    plan += [
        PlannedTask(
            "flaky",
            TaskSpec(
                "demo.flaky",
                {"run": run_id, "failures": rng.choice((1, 2))},
                at=at(i, FLAKY_TASKS),
                strict_timing=True,
                retry=RetryPolicy(3, 0.5, 2.0, 2.0),
            ),
        )
        for i in range(FLAKY_TASKS)
    ]
    plan += [
        PlannedTask(
            "failing",
            TaskSpec(
                "demo.fail",
                {"run": run_id},
                at=at(i, FAILING_TASKS),
                strict_timing=True,
                max_retries=2,
                retry=fast_retry,
            ),
        )
        for i in range(FAILING_TASKS)
    ]
    plan += [
        PlannedTask(
            "slow",
            TaskSpec(
                "demo.sleep",
                {"run": run_id, "seconds": rng.choice((1, 2, 3))},
                at=at(i, SLOW_TASKS),
                strict_timing=True,
            ),
        )
        for i in range(SLOW_TASKS)
    ]
    return plan


def heartbeat_schedule() -> ScheduleSpec:
    """The demo's schedule: ``demo.tick`` every 5 s, on the second (strict: no jitter),
    watched by the watchdog like any schedule (job id: its name)."""
    return ScheduleSpec(
        name=HEARTBEAT_SCHEDULE,
        cron=HEARTBEAT_CRON,
        task=TaskSpec("demo.tick", {"demo": HEARTBEAT_SCHEDULE}, strict_timing=True, timeout_s=30),
    )


PIPELINE = "demo.pipeline"
PIPELINE_EDGES = (
    ("fetch", "invoice"),
    ("fetch", "credit-check"),
    ("invoice", "summary"),
    ("credit-check", "summary"),
)


def pipeline_workflow(run_id: str) -> tuple[list[WorkflowTask], list[WorkflowEdge]]:
    """The demo's workflow: fetch, then invoice and credit-check in parallel, then a
    summary that gathers what both returned (``demo.gather`` reads ``ctx.parents``)."""
    tasks = [
        WorkflowTask(ref, TaskSpec("demo.echo", {"run": run_id, "step": ref}, strict_timing=True))
        for ref in ("fetch", "invoice", "credit-check")
    ]
    tasks.append(WorkflowTask("summary", TaskSpec("demo.gather", {"run": run_id})))
    return tasks, [WorkflowEdge(parent, child) for parent, child in PIPELINE_EDGES]


def pipeline_line(detail: WorkflowDetail) -> str:
    """``chronoshard dev --demo``'s line once its workflow finished."""
    order = " -> ".join(f"{t.ref} {t.task.status.value.lower()}" for t in detail.tasks)
    return f"demo: workflow {PIPELINE} {detail.workflow.state.value.lower()} ({order})"


def occurrence_line(task: Task) -> str:
    """``chronoshard dev --demo``'s line for an occurrence of the schedule that ran."""
    late = task.result.get("late_ms") if isinstance(task.result, dict) else None
    lateness = output.millis(late / 1000) if isinstance(late, int | float) else output.EMPTY
    return (
        f"demo: {HEARTBEAT_SCHEDULE} occurrence {output.short_time(task.logical_date)} UTC "
        f"{task.status.value.lower()} (late {lateness}, task {task.id})"
    )


@dataclass
class DemoProgress:
    """Where the demo's tasks are: counts per kind and column, lateness per kind."""

    kinds: dict[str, str] = field(default_factory=dict)
    """task id -> kind, for every task submitted."""
    latest: dict[str, Task] = field(default_factory=dict)
    total_by_kind: Counter[str] = field(default_factory=Counter)

    def submitted(self, task_id: str, kind: str) -> None:
        if task_id not in self.kinds:
            self.kinds[task_id] = kind
            self.total_by_kind[kind] += 1

    def observe(self, tasks: Iterable[Task]) -> None:
        for task in tasks:
            if task.id in self.kinds:
                self.latest[task.id] = task

    def column_counts(self, kind: str | None = None) -> Counter[str]:
        counts: Counter[str] = Counter()
        for task_id, k in self.kinds.items():
            if kind is not None and k != kind:
                continue
            task = self.latest.get(task_id)
            counts[_COLUMN[task.status.value] if task is not None else "waiting"] += 1
        return counts

    def lateness_s(self, kind: str | None = None) -> list[float]:
        found = []
        for task_id, task in self.latest.items():
            if kind is not None and self.kinds[task_id] != kind:
                continue
            late = task.result.get("late_ms") if isinstance(task.result, dict) else None
            if isinstance(late, int | float):
                found.append(late / 1000)
        return found

    def batch_settled(self) -> bool:
        """Every task of the batch (not the schedule's) is in a terminal state."""
        return all(
            (task := self.latest.get(task_id)) is not None and task.status.is_terminal
            for task_id, kind in self.kinds.items()
            if kind != SCHEDULED
        )

    def batch_size(self) -> int:
        return sum(n for kind, n in self.total_by_kind.items() if kind != SCHEDULED)

    def finished_occurrences(self) -> list[Task]:
        """The schedule's occurrences that reached a terminal state, oldest first."""
        done = [
            task
            for task_id, kind in self.kinds.items()
            if kind == SCHEDULED
            and (task := self.latest.get(task_id)) is not None
            and task.status.is_terminal
        ]
        return sorted(done, key=lambda t: (t.logical_date or t.scheduled_at, t.id))

    def dead_lettered(self) -> list[Task]:
        return [t for t in self.latest.values() if t.status.value == "DEAD_LETTER"]

    def table(self) -> str:
        rows: list[list[object]] = []
        for kind in KINDS:
            if not self.total_by_kind[kind]:
                continue
            counts = self.column_counts(kind)
            p50, p99, worst = _quantiles(self.lateness_s(kind))
            rows.append(
                [
                    kind,
                    self.total_by_kind[kind],
                    *(counts[c] for c in COLUMNS),
                    output.millis(p50),
                    output.millis(p99),
                    output.millis(worst),
                ]
            )
        headers = ("DEMO", "TASKS", "WAITING", "RUNNING", "RETRYING", "DONE", "DEAD")
        return output.table((*headers, "LATE p50", "LATE p99", "LATE max"), rows)

    def line(self) -> str:
        """The batch's progress (the schedule's occurrences, created ahead of their time,
        are the table's last row and a line each once the batch settled)."""
        batch_kinds = [kind for kind in KINDS if kind != SCHEDULED]
        counts: Counter[str] = Counter()
        for kind in batch_kinds:
            counts.update(self.column_counts(kind))
        settled = counts["completed"] + counts["dead"]
        p50, p99, worst = _quantiles([s for kind in batch_kinds for s in self.lateness_s(kind)])
        return (
            f"demo: {settled}/{self.batch_size()} settled ({counts['completed']} completed, "
            f"{counts['dead']} dead-lettered), {counts['running']} running, "
            f"{counts['retrying']} retrying, {counts['waiting']} waiting; lateness "
            f"p50 {output.millis(p50)} p99 {output.millis(p99)} max {output.millis(worst)}"
        )

    def settled_line(self) -> str:
        batch = [t for t, k in self.kinds.items() if k != SCHEDULED]
        done = Counter(self.latest[t].status.value for t in batch if t in self.latest)
        p50, p99, worst = _quantiles(
            [s for kind in KINDS if kind != SCHEDULED for s in self.lateness_s(kind)]
        )
        return (
            f"demo: all {len(batch)} tasks settled: {done['COMPLETED']} completed, "
            f"{done['DEAD_LETTER']} dead-lettered; lateness p50 {output.millis(p50)} "
            f"p99 {output.millis(p99)} max {output.millis(worst)}"
        )


def _quantiles(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    if len(values) == 1:
        return values[0], values[0], values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98], max(values)


class DemoRun:
    """Submits the demo and creates its schedule, then :meth:`tick` (about once a
    second) polls and prints."""

    def __init__(self, client: SyncClient, out: TextIO, *, tty: bool) -> None:
        self._client = client
        self._out = out
        self._tty = tty
        self.progress = DemoProgress()
        self.schedule_id: str | None = None
        self.workflow_id: str | None = None
        self._workflow_reported = False
        self._since = datetime.now(UTC)
        self._printed: set[str] = set()
        """Occurrences whose line was printed (task ids)."""
        self._drawn_lines = 0
        self._last_plain = ""
        self._last_plain_at = 0.0
        self._announced = False

    def start(self, now: datetime) -> None:
        from chronoshard.errors import ChronoshardError

        run_id = uuid.uuid4().hex[:8]
        self._since = now - timedelta(seconds=1)
        plan = demo_plan(now, random.Random(run_id), run_id)
        results = self._client.submit_batch([p.spec for p in plan])
        for planned, result in zip(plan, results, strict=True):
            if isinstance(result, ChronoshardError):
                self._print(f"demo: a {planned.kind} task was refused: {result}")
                continue
            self.progress.submitted(result.task.id, planned.kind)
        self._print(
            f"demo: submitted {self.progress.batch_size()} tasks (due over the next "
            f"{FIRST_AT_S + SPREAD_S:g} s)"
        )
        try:
            tasks, edges = pipeline_workflow(run_id)
            self.workflow_id = self._client.create_workflow(PIPELINE, tasks, edges).workflow.id
        except ChronoshardError as exc:
            self._print(f"demo: the workflow {PIPELINE} could not be made: {exc}")
        else:
            self._print(
                f"demo: workflow {PIPELINE} runs fetch, then invoice and credit-check in "
                f"parallel, then summary; see it with: chronoshard workflows get "
                f"{self.workflow_id}"
            )
        try:
            self.schedule_id = self._ensure_schedule()
        except ChronoshardError as exc:
            self._print(f"demo: the schedule {HEARTBEAT_SCHEDULE} could not be made: {exc}")
            return
        self._print(
            f"demo: schedule {HEARTBEAT_SCHEDULE} runs demo.tick every {HEARTBEAT_EVERY_S} s "
            f"(cron {HEARTBEAT_CRON!r}); see it with: chronoshard schedules get "
            f"{HEARTBEAT_SCHEDULE}"
        )

    def _ensure_schedule(self) -> str:
        """The demo schedule's id: created, or (left by an earlier run) put back to the
        demo's spec and resumed."""
        from chronoshard.errors import AlreadyExistsError

        spec = heartbeat_schedule()
        try:
            return self._client.create_schedule(spec).id
        except AlreadyExistsError:
            schedule = self._client.update_schedule(HEARTBEAT_SCHEDULE, spec)
            if schedule.paused:
                schedule = self._client.resume_schedule(schedule.id)
            return schedule.id

    def tick(self, now: datetime, monotonic: float) -> None:
        """Read the tasks back (the batch's and the schedule's occurrences) and print;
        call errors are printed, never raised (the cluster keeps running)."""
        from chronoshard.errors import ChronoshardError

        try:
            # Once the batch settled only the schedule moves: read just its recent
            # occurrences instead of everything since the start.
            since = now - timedelta(seconds=30) if self._announced else self._since
            tasks = list(
                self._client.iter_tasks(scheduled_from=since, page_size=1000, include_payloads=True)
            )
        except ChronoshardError as exc:
            self._print(f"demo: {exc}")
            return
        for task in tasks:
            if self.schedule_id is not None and task.schedule_id == self.schedule_id:
                self.progress.submitted(task.id, SCHEDULED)
        self.progress.observe(tasks)
        self._show(monotonic)
        self._report_workflow()

    def _report_workflow(self) -> None:
        """Once, when the demo's workflow has finished: its state and its tasks'."""
        from chronoshard.errors import ChronoshardError

        if self.workflow_id is None or self._workflow_reported or not self._announced:
            return
        try:
            detail = self._client.get_workflow(self.workflow_id)
        except ChronoshardError as exc:
            self._print(f"demo: {exc}")
            return
        if detail.workflow.state.is_finished:
            self._workflow_reported = True
            self._print(pipeline_line(detail))

    def _show(self, monotonic: float) -> None:
        settled = self.progress.batch_settled()
        if self._tty:
            self._redraw(self.progress.table())
        else:
            line = self.progress.line()
            changed = line != self._last_plain
            if changed and monotonic - self._last_plain_at >= PLAIN_EVERY_S and not self._announced:
                self._print(line)
                self._last_plain, self._last_plain_at = line, monotonic
        if settled and not self._announced:
            self._announced = True
            if not self._tty:
                self._print(self.progress.table())
            self._drawn_lines = 0
            self._print(self.progress.settled_line())
            dead = self.progress.dead_lettered()
            if dead:
                self._print(
                    f"demo: why did one fail?  chronoshard tasks get {dead[0].id} --attempts"
                )
            if self.schedule_id is not None:
                self._print(
                    f"demo: {HEARTBEAT_SCHEDULE} keeps firing every {HEARTBEAT_EVERY_S} s "
                    f"(chronoshard schedules get {HEARTBEAT_SCHEDULE}; stop it with "
                    f"chronoshard schedules pause {HEARTBEAT_SCHEDULE})"
                )
        if self._announced:
            # Under the table (which no longer moves): one line per occurrence that ran.
            for task in self.progress.finished_occurrences():
                if task.id not in self._printed:
                    self._printed.add(task.id)
                    self._print(occurrence_line(task))

    def _redraw(self, text: str) -> None:
        if self._announced:
            return
        # Move up over the previous drawing and clear to the end of the screen.
        prefix = f"\x1b[{self._drawn_lines}F\x1b[J" if self._drawn_lines else ""
        self._out.write(prefix + text + "\n")
        self._out.flush()
        self._drawn_lines = text.count("\n") + 1

    def _print(self, line: str) -> None:
        self._drawn_lines = 0
        print(line, file=self._out, flush=True)
