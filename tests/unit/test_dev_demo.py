"""The ``dev --demo`` plan and progress (``chronoshard._dev.demo_tasks``): pure, no cluster."""

from __future__ import annotations

import dataclasses
import io
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from chronoshard._dev.demo_tasks import (
    FAILING_TASKS,
    FIRST_AT_S,
    HEARTBEAT_SCHEDULE,
    JITTER_WINDOW_S,
    SCHEDULED,
    SPREAD_S,
    DemoProgress,
    DemoRun,
    demo_plan,
    heartbeat_schedule,
    occurrence_line,
    pipeline_workflow,
)
from chronoshard.errors import AlreadyExistsError
from chronoshard.scheduler.core.recurrence import Cron
from chronoshard.types import Priority, RetryPolicy, Schedule, ScheduleSpec, Task, TaskStatus

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_the_plan_runs_within_a_minute_and_mixes_every_kind() -> None:
    plan = demo_plan(NOW, random.Random(1), "run1")
    kinds = Counter(p.kind for p in plan)
    assert sum(kinds.values()) >= 200
    assert set(kinds) == {"strict", "jittered", "flaky", "failing", "slow"}
    for planned in plan:
        spec = planned.spec
        assert spec.at is not None and spec.payload is not None and spec.payload["run"] == "run1"
        earliest = NOW + timedelta(seconds=FIRST_AT_S)
        assert earliest <= spec.at <= earliest + timedelta(seconds=SPREAD_S + JITTER_WINDOW_S)
        # Strict unless jittered, and jittered within a window that cannot reach back
        # before the submit.
        assert spec.strict_timing == (planned.kind != "jittered")
        if planned.kind == "jittered":
            assert spec.jitter_window_s == JITTER_WINDOW_S
            assert spec.at - timedelta(seconds=JITTER_WINDOW_S / 2) >= NOW
    failing = [p.spec for p in plan if p.kind == "failing"]
    assert len(failing) == FAILING_TASKS and all(s.effective_max_retries == 2 for s in failing)
    # Same seed, same plan: the demo is reproducible.
    assert demo_plan(NOW, random.Random(1), "run1") == plan


def test_the_schedule_fires_every_five_seconds_on_the_second() -> None:
    spec = heartbeat_schedule()
    assert spec.name == HEARTBEAT_SCHEDULE and spec.interval_s is None
    assert spec.cron is not None and (spec.timezone or "UTC") == "UTC"
    rule = Cron(spec.cron, "UTC", now=NOW)
    at, nexts = NOW, []
    for _ in range(3):
        found = rule.next_after(at)
        assert found is not None
        nexts.append(found)
        at = found
    assert nexts == [datetime(2030, 1, 2, 3, 4, s, tzinfo=UTC) for s in (10, 15, 20)]
    # What the demo worker serves, on time (no jitter), bounded (a hung one ends).
    assert spec.task.type == "demo.tick" and spec.task.strict_timing
    assert spec.task.timeout_s is not None
    # The same spec every run: a second `dev --demo` updates the schedule to it.
    assert heartbeat_schedule() == spec


def test_an_occurrence_line_names_its_logical_date_and_lateness() -> None:
    ran = dataclasses.replace(
        _task("t1", "COMPLETED", {"late_ms": 3.0}), logical_date=NOW, schedule_id="s"
    )
    line = occurrence_line(ran)
    assert line.startswith(f"demo: {HEARTBEAT_SCHEDULE} occurrence 2030-01-02 03:04:05.000 UTC")
    assert "completed" in line and "late 3.0ms" in line and "t1" in line


def _task(task_id: str, status: str, result: Any = None) -> Task:
    return Task(
        id=task_id, tenant_id="t", type="demo.echo", status=TaskStatus(status),
        scheduled_at=NOW, due_at=NOW, priority=Priority.STANDARD, queue="", payload=None,
        result=result, last_error=None, attempt=1, fencing_token=1, retry_count=0,
        retry_policy=RetryPolicy(3, 1.0, 300.0, 2.0), timeout_s=None, strict_timing=True,
        idempotent=False, idempotency_key=None, job_id=None, worker_id=None,
        lease_expires_at=None, checkpoint=None, shard=0, trace_context={}, created_at=NOW,
        updated_at=NOW, finished_at=None, workflow_id=None, unresolved_dependencies=0,
        schedule_id=None, logical_date=None,
    )  # fmt: skip


def test_progress_counts_settles_and_reports_lateness() -> None:
    progress = DemoProgress()
    for task_id, kind in (("a", "strict"), ("b", "strict"), ("c", "failing"), ("r", SCHEDULED)):
        progress.submitted(task_id, kind)
    progress.submitted("a", "strict")  # a repeat is not counted twice
    progress.observe([_task("a", "COMPLETED", {"late_ms": 2.0}), _task("zz", "COMPLETED")])
    assert progress.column_counts() == Counter({"completed": 1, "waiting": 3})
    assert not progress.batch_settled()

    progress.observe(
        [
            _task("b", "COMPLETED", {"late_ms": 4.0}),
            _task("c", "DEAD_LETTER"),
            _task("r", "RUNNING"),  # the schedule's occurrences never hold the batch up
        ]
    )
    assert progress.batch_settled() and progress.batch_size() == 3
    assert progress.line().startswith("demo: 3/3 settled (2 completed, 1 dead-lettered)")
    assert sorted(progress.lateness_s("strict")) == [0.002, 0.004]
    assert [t.id for t in progress.dead_lettered()] == ["c"]
    assert progress.settled_line().startswith("demo: all 3 tasks settled: 2 completed, 1 dead")
    rows = {line.split()[0]: line.split() for line in progress.table().splitlines()[1:]}
    assert rows["strict"][1:7] == ["2", "0", "0", "0", "2", "0"]
    assert rows["failing"][6] == "1" and rows[SCHEDULED][3] == "1"
    assert progress.finished_occurrences() == []
    progress.observe([_task("r", "COMPLETED")])
    assert [t.id for t in progress.finished_occurrences()] == ["r"]


def test_tasks_read_back_replace_what_was_seen_before() -> None:
    progress = DemoProgress()
    progress.submitted("a", "flaky")
    progress.observe([_task("a", "RETRYING")])
    assert progress.column_counts()["retrying"] == 1
    progress.observe([dataclasses.replace(_task("a", "COMPLETED"), attempt=3)])
    assert progress.column_counts() == Counter({"completed": 1})


@dataclasses.dataclass
class _Schedules:
    """The schedule calls of a SyncClient, over one stored schedule (or none)."""

    stored: Schedule | None = None
    calls: list[str] = dataclasses.field(default_factory=list)

    def create_schedule(self, spec: ScheduleSpec) -> Schedule:
        self.calls.append("create")
        if self.stored is not None:
            raise AlreadyExistsError("taken", code=grpc.StatusCode.ALREADY_EXISTS)
        self.stored = Schedule("s1", "t", spec, False, NOW, NOW, NOW)
        return self.stored

    def update_schedule(self, schedule: str, spec: ScheduleSpec) -> Schedule:
        self.calls.append(f"update {schedule}")
        assert self.stored is not None
        self.stored = dataclasses.replace(self.stored, spec=spec)
        return self.stored

    def resume_schedule(self, schedule: str) -> Schedule:
        self.calls.append(f"resume {schedule}")
        assert self.stored is not None
        self.stored = dataclasses.replace(self.stored, paused=False)
        return self.stored


def test_the_schedule_is_made_once_and_one_an_earlier_run_left_is_put_back() -> None:
    fresh = _Schedules()
    assert DemoRun(fresh, io.StringIO(), tty=False)._ensure_schedule() == "s1"  # type: ignore[arg-type]
    assert fresh.calls == ["create"] and fresh.stored is not None
    assert fresh.stored.spec == heartbeat_schedule()

    # Left by an earlier `dev --demo`, changed and paused since: back to the demo's spec.
    old = dataclasses.replace(heartbeat_schedule(), cron="0 * * * *")
    left = _Schedules(Schedule("s0", "t", old, True, None, NOW, NOW))
    assert DemoRun(left, io.StringIO(), tty=False)._ensure_schedule() == "s0"  # type: ignore[arg-type]
    assert left.calls == ["create", f"update {HEARTBEAT_SCHEDULE}", "resume s0"]
    assert left.stored is not None and not left.stored.paused
    assert left.stored.spec == heartbeat_schedule()


def test_the_demo_workflow_is_a_diamond_whose_summary_gathers_both_branches() -> None:
    tasks, edges = pipeline_workflow("run")
    assert [t.ref for t in tasks] == ["fetch", "invoice", "credit-check", "summary"]
    assert {(e.parent, e.child) for e in edges} == {
        ("fetch", "invoice"),
        ("fetch", "credit-check"),
        ("invoice", "summary"),
        ("credit-check", "summary"),
    }
    assert tasks[-1].task.type == "demo.gather"
    assert all(t.task.payload["run"] == "run" for t in tasks)
