"""The ``dev --demo`` plan and progress (``chronoshard._dev.demo_tasks``): pure, no cluster."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from chronoshard._dev.demo_tasks import (
    FAILING_TASKS,
    FIRST_AT_S,
    JITTER_WINDOW_S,
    SPREAD_S,
    DemoProgress,
    demo_plan,
    heartbeat_slot,
    heartbeat_spec,
)
from chronoshard.types import Priority, RetryPolicy, Task, TaskStatus

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


def test_the_repeating_job_is_one_task_per_slot() -> None:
    slot = heartbeat_slot(NOW)
    spec = heartbeat_spec(slot + 1)
    assert spec.at == datetime.fromtimestamp((slot + 1) * 5, UTC) > NOW
    assert spec.idempotency_key == heartbeat_spec(slot + 1).idempotency_key
    assert spec.idempotency_key != heartbeat_spec(slot + 2).idempotency_key
    assert spec.job_id == "demo.heartbeat" and spec.strict_timing


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
    for task_id, kind in (("a", "strict"), ("b", "strict"), ("c", "failing"), ("r", "repeating")):
        progress.submitted(task_id, kind)
    progress.submitted("a", "strict")  # a repeat is not counted twice
    progress.observe([_task("a", "COMPLETED", {"late_ms": 2.0}), _task("zz", "COMPLETED")])
    assert progress.column_counts() == Counter({"completed": 1, "waiting": 3})
    assert not progress.batch_settled()

    progress.observe(
        [
            _task("b", "COMPLETED", {"late_ms": 4.0}),
            _task("c", "DEAD_LETTER"),
            _task("r", "RUNNING"),  # the repeating job never holds the batch up
        ]
    )
    assert progress.batch_settled() and progress.batch_size() == 3
    assert sorted(progress.lateness_s("strict")) == [0.002, 0.004]
    assert [t.id for t in progress.dead_lettered()] == ["c"]
    assert progress.settled_line().startswith("demo: all 3 tasks settled: 2 completed, 1 dead")
    rows = {line.split()[0]: line.split() for line in progress.table().splitlines()[1:]}
    assert rows["strict"][1:7] == ["2", "0", "0", "0", "2", "0"]
    assert rows["failing"][6] == "1" and rows["repeating"][3] == "1"


def test_tasks_read_back_replace_what_was_seen_before() -> None:
    progress = DemoProgress()
    progress.submitted("a", "flaky")
    progress.observe([_task("a", "RETRYING")])
    assert progress.column_counts()["retrying"] == 1
    progress.observe([dataclasses.replace(_task("a", "COMPLETED"), attempt=3)])
    assert progress.column_counts() == Counter({"completed": 1})
