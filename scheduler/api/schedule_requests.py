"""What a ScheduleService request may hold and what it resolves to: pure, ``now`` passed in.

:func:`spec_from_pb` validates a whole ``ScheduleSpec`` before anything is written, each
refusal ``INVALID_ARGUMENT`` naming the field as the request spells it (``spec.cron``,
``spec.task_template.timeout``, ...). The task template is validated by the very
function that validates a submit (:func:`.task_requests.submit_from_pb`), run once here
on a trial occurrence, and again per occurrence by :func:`occurrence_task`: a template
is what a submit would be, so no second set of rules exists for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from google.protobuf.message import DecodeError

from chronoshard.scheduler.api import workflow_requests
from chronoshard.scheduler.api.convert import ts_from_pb
from chronoshard.scheduler.api.task_requests import (
    MAX_DELAY_S,
    SubmitLimits,
    optional_text,
    request_duration,
    submit_from_pb,
)
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import MAX_KEY_LENGTH, PreparedTask
from chronoshard.scheduler.core.recurrence import Catchup, Cron, Interval, zone_named
from chronoshard.scheduler.core.schedules import Overlap, Schedule, ScheduleSpec
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.scheduler.store.workflows import NewRun
from chronoshard.v1 import schedule_service_pb2, task_service_pb2, workflow_service_pb2

MAX_NAME_CHARS = 200
MAX_CATCHUP_LIMIT = 10_000
MAX_BACKFILL = 1000
"""Occurrences one BackfillSchedule call may create."""
DEFAULT_MISFIRE_GRACE_S = 60.0
MAX_MISFIRE_GRACE_S = 86_400.0
DEFAULT_EXPECTED_DURATION_S = 60.0
DEFAULT_TOLERANCE_S = 60.0
DEFAULT_RUNS = 10
DEFAULT_NEXT = 5
MAX_LISTED = 100
SEVERITIES = ("critical", "error", "warning", "info")

_CATCHUP = {
    schedule_service_pb2.CATCHUP_POLICY_UNSPECIFIED: Catchup.SKIP,
    schedule_service_pb2.CATCHUP_POLICY_SKIP: Catchup.SKIP,
    schedule_service_pb2.CATCHUP_POLICY_LATEST: Catchup.LATEST,
    schedule_service_pb2.CATCHUP_POLICY_ALL: Catchup.ALL,
}
_OVERLAP = {
    schedule_service_pb2.OVERLAP_POLICY_UNSPECIFIED: Overlap.ALLOW,
    schedule_service_pb2.OVERLAP_POLICY_ALLOW: Overlap.ALLOW,
    schedule_service_pb2.OVERLAP_POLICY_SKIP: Overlap.SKIP,
    schedule_service_pb2.OVERLAP_POLICY_BUFFER_ONE: Overlap.BUFFER_ONE,
}


def spec_from_pb(
    pb: schedule_service_pb2.ScheduleSpec,
    *,
    tenant_id: uuid.UUID,
    now: datetime,
    limits: SubmitLimits,
    prefix: str = "spec.",
) -> ScheduleSpec:
    """The validated spec ``pb`` asks for (module docstring).

    Raises:
        InvalidArgument: a field is invalid; ``field`` names it (``prefix`` first).
    """
    name = optional_text(pb.name, prefix + "name", MAX_NAME_CHARS)
    if name is None:
        raise InvalidArgument(prefix + "name", "is required")
    zone = pb.timezone or "UTC"
    _renamed(prefix, lambda: zone_named(zone))
    start_at = ts_from_pb(pb.start_at, prefix + "start_at") if pb.HasField("start_at") else None
    end_at = ts_from_pb(pb.end_at, prefix + "end_at") if pb.HasField("end_at") else None
    if end_at is not None:
        if start_at is not None and end_at <= start_at:
            raise InvalidArgument(prefix + "end_at", "must be after start_at")
        if end_at <= now:
            raise InvalidArgument(prefix + "end_at", "is in the past")
    cron, interval_s = _rule_from_pb(pb, zone, start_at or now, now, prefix)
    facts = (
        _workflow_template_from_pb(pb, tenant_id, now, limits, prefix)
        if pb.HasField("workflow_template")
        else _template_from_pb(pb, tenant_id, now, limits, prefix)
    )
    catchup = _CATCHUP.get(pb.catchup_policy)
    if catchup is None:
        raise InvalidArgument(prefix + "catchup_policy", "is not a known policy")
    catchup_limit = _catchup_limit(pb, catchup, prefix)
    overlap = _OVERLAP.get(pb.overlap_policy)
    if overlap is None:
        raise InvalidArgument(prefix + "overlap_policy", "is not a known policy")
    if overlap is not Overlap.ALLOW and facts.untimed is not None:
        # "The previous occurrence still runs" must end: a hung one would otherwise
        # hold every later occurrence back for the server's default timeout, or forever.
        raise InvalidArgument(
            facts.untimed,
            f"is required with overlap policy {overlap}: it bounds how long an occurrence "
            "can hold back the next",
        )
    job_id = optional_text(pb.job_id, prefix + "job_id", MAX_KEY_LENGTH) or name
    grace_s = DEFAULT_MISFIRE_GRACE_S
    if pb.HasField("misfire_grace"):
        grace_s = request_duration(
            pb.misfire_grace, prefix + "misfire_grace", limit_s=MAX_MISFIRE_GRACE_S
        )
    watch = pb.watch
    expected_s = (
        request_duration(watch.expected_duration, prefix + "watch.expected_duration")
        if watch.HasField("expected_duration")
        else facts.expected_s
    )
    tolerance_s = (
        request_duration(watch.tolerance, prefix + "watch.tolerance")
        if watch.HasField("tolerance")
        else DEFAULT_TOLERANCE_S + facts.latest_start_s
    )
    severity = watch.severity or "critical"
    if severity not in SEVERITIES:
        raise InvalidArgument(prefix + "watch.severity", f"must be one of {', '.join(SEVERITIES)}")
    return ScheduleSpec(
        name=name,
        cron=cron,
        interval_s=interval_s,
        timezone=zone,
        start_at=start_at,
        end_at=end_at,
        template=facts.template,
        catchup=catchup,
        catchup_limit=catchup_limit,
        misfire_grace_s=grace_s,
        overlap=overlap,
        job_id=job_id,
        watch=not watch.disabled,
        expected_duration_s=expected_s,
        tolerance_s=tolerance_s,
        severity=severity,
        creates_workflow=facts.creates_workflow,
    )


def _renamed(prefix: str, check: Callable[[], object]) -> None:
    """Run ``check``; a refusal names its field under ``prefix``."""
    try:
        check()
    except InvalidArgument as exc:
        raise InvalidArgument(prefix + exc.field, exc.message) from None


def _rule_from_pb(
    pb: schedule_service_pb2.ScheduleSpec,
    zone: str,
    anchor: datetime,
    now: datetime,
    prefix: str,
) -> tuple[str | None, float | None]:
    kind = pb.WhichOneof("rule")
    if kind == "cron":
        expression = pb.cron.strip()
        _renamed(prefix, lambda: Cron(expression, zone, now=now))
        return expression, None
    if kind == "interval":
        every_s = request_duration(pb.interval, prefix + "interval", positive=True)
        _renamed(prefix, lambda: Interval(anchor, timedelta(seconds=every_s)))
        return None, every_s
    raise InvalidArgument(prefix + "cron", "a cron expression or an interval is required")


@dataclass(frozen=True, slots=True)
class _TemplateFacts:
    """A validated template and what the rest of the spec's defaults read off it."""

    template: bytes
    creates_workflow: bool
    untimed: str | None
    """The field of a task without a timeout (SKIP and BUFFER_ONE need one), if any."""
    expected_s: float
    """The watch's default expected duration: the task's timeout, or the sum of the
    timeouts along the workflow's longest chain; 60 s when one is missing."""
    latest_start_s: float
    """How late a jittered occurrence (its first tasks) may start."""


def _template_from_pb(
    pb: schedule_service_pb2.ScheduleSpec,
    tenant_id: uuid.UUID,
    now: datetime,
    limits: SubmitLimits,
    prefix: str,
) -> _TemplateFacts:
    """The task template, validated as the submit of one occurrence."""
    field = prefix + "task_template"
    if not pb.HasField("task_template"):
        raise InvalidArgument(field, "is required (or a workflow_template)")
    template = pb.task_template
    _refuse_what_an_occurrence_decides(template, field)
    trial = submit_from_pb(
        template, tenant_id=tenant_id, task_id=new_task_id(), now=now, limits=limits,
        prefix=field + ".",
    )  # fmt: skip
    return _TemplateFacts(
        template=template.SerializeToString(deterministic=True),
        creates_workflow=False,
        untimed=None if template.HasField("timeout") else field + ".timeout",
        expected_s=DEFAULT_EXPECTED_DURATION_S if trial.new.timeout_s is None
        else trial.new.timeout_s,
        latest_start_s=_latest_start_s(trial, template, limits),
    )  # fmt: skip


def _refuse_what_an_occurrence_decides(
    template: task_service_pb2.SubmitTaskRequest | workflow_service_pb2.CreateWorkflowRequest,
    field: str,
) -> None:
    """A template (of a task or a workflow: the same three fields) may not set when it
    runs, its key or its job: each occurrence decides them."""
    if template.WhichOneof("when") is not None:
        raise InvalidArgument(
            field + "." + str(template.WhichOneof("when")), "is set by each occurrence"
        )
    if template.idempotency_key:
        raise InvalidArgument(
            field + ".idempotency_key", "must be empty: (schedule, logical date) keys each run"
        )
    if template.job_id:
        raise InvalidArgument(field + ".job_id", "must be empty: set the schedule's job_id")


def _workflow_template_from_pb(
    pb: schedule_service_pb2.ScheduleSpec,
    tenant_id: uuid.UUID,
    now: datetime,
    limits: SubmitLimits,
    prefix: str,
) -> _TemplateFacts:
    """The workflow template, validated as the create of one occurrence's run."""
    field = prefix + "workflow_template"
    if pb.HasField("task_template"):
        raise InvalidArgument(field, "set task_template or workflow_template, not both")
    template = pb.workflow_template
    _refuse_what_an_occurrence_decides(template, field)
    trial: list[NewRun] = []
    _renamed(
        field + ".",
        lambda: trial.append(
            workflow_requests.create_from_pb(template, tenant_id=tenant_id, now=now, limits=limits)
        ),
    )
    run = trial[0]
    untimed = next(
        (
            f"{field}.tasks[{i}].task.timeout"
            for i, task in enumerate(template.tasks)
            if not task.task.HasField("timeout")
        ),
        None,
    )
    by_ref = {task.ref: task.task for task in template.tasks}
    roots = [(ref, p) for ref, _, p in run.tasks if p.new.unresolved_dependencies == 0]
    return _TemplateFacts(
        template=template.SerializeToString(deterministic=True),
        creates_workflow=True,
        untimed=untimed,
        expected_s=_longest_chain_s(run) or DEFAULT_EXPECTED_DURATION_S,
        latest_start_s=max(_latest_start_s(p, by_ref[ref], limits) for ref, p in roots),
    )


def _longest_chain_s(run: NewRun) -> float | None:
    """The sum of the timeouts along the run's longest chain of tasks (the longest it can
    take without retries), or None when a task has no timeout."""
    timeouts = {p.new.id: p.new.timeout_s for _, _, p in run.tasks}
    if any(timeout is None for timeout in timeouts.values()):
        return None
    parents: dict[uuid.UUID, list[uuid.UUID]] = {task_id: [] for task_id in timeouts}
    for parent, child in run.edges:
        parents[child].append(parent)
    done: dict[uuid.UUID, float] = {}
    for _, _, p in run.tasks:  # parents before children
        task_id = p.new.id
        before = max((done[parent] for parent in parents[task_id]), default=0.0)
        done[task_id] = before + float(timeouts[task_id] or 0.0)
    return max(done.values())


def _latest_start_s(
    trial: PreparedTask, template: task_service_pb2.SubmitTaskRequest, limits: SubmitLimits
) -> float:
    """How long after its logical date a jittered occurrence may start: the default
    tolerance of the watch makes room for it, so jitter never reads as a missed run."""
    window_s = (
        request_duration(template.jitter_window, "jitter_window")
        if template.HasField("jitter_window")
        else limits.jitter_window_s
    )
    mode = trial.new.jitter_mode
    if mode is JitterMode.NONE:
        return 0.0
    return window_s if mode is JitterMode.DELAY_ONLY else window_s / 2


def _catchup_limit(pb: schedule_service_pb2.ScheduleSpec, catchup: Catchup, prefix: str) -> int:
    field = prefix + "catchup_limit"
    if not pb.HasField("catchup_limit"):
        if catchup is Catchup.ALL:
            raise InvalidArgument(field, "is required with catchup policy ALL")
        return 1
    if not 1 <= pb.catchup_limit <= MAX_CATCHUP_LIMIT:
        raise InvalidArgument(field, f"must be between 1 and {MAX_CATCHUP_LIMIT}")
    return pb.catchup_limit


def occurrence_task(
    spec: ScheduleSpec,
    *,
    tenant_id: uuid.UUID,
    schedule_id: uuid.UUID,
    logical_date: datetime,
    scheduled_at: datetime,
    now: datetime,
    limits: SubmitLimits,
) -> PreparedTask:
    """The task of one occurrence: the template submitted at ``scheduled_at`` with the
    schedule's job, id and the occurrence's logical date.

    Raises:
        InvalidArgument: the stored template no longer passes (the node's limits changed
            since it was accepted); the field is named under ``task_template.``.
    """
    try:
        request = task_service_pb2.SubmitTaskRequest.FromString(spec.template)
    except DecodeError:
        raise InvalidArgument("task_template", "cannot be decoded") from None
    request.scheduled_at.FromDatetime(scheduled_at)
    request.job_id = spec.job_id
    prepared = submit_from_pb(
        request,
        tenant_id=tenant_id,
        task_id=new_task_id(),
        now=now,
        limits=limits,
        prefix="task_template.",
    )
    new = replace(prepared.new, schedule_id=schedule_id, logical_date=logical_date)
    return replace(prepared, new=new)


def occurrence_run(
    spec: ScheduleSpec,
    *,
    tenant_id: uuid.UUID,
    schedule_id: uuid.UUID,
    logical_date: datetime,
    scheduled_at: datetime,
    now: datetime,
    limits: SubmitLimits,
) -> NewRun:
    """The workflow run of one occurrence: the template created at ``scheduled_at``, the
    run completing the schedule's job, every task carrying the schedule's id and the
    occurrence's logical date.

    Raises:
        InvalidArgument: the stored template no longer passes; the field is named under
            ``workflow_template.``.
    """
    try:
        request = workflow_service_pb2.CreateWorkflowRequest.FromString(spec.template)
    except DecodeError:
        raise InvalidArgument("workflow_template", "cannot be decoded") from None
    request.scheduled_at.FromDatetime(scheduled_at)
    request.name = request.name or spec.name
    request.job_id = spec.job_id
    built: list[NewRun] = []
    _renamed(
        "workflow_template.",
        lambda: built.append(
            workflow_requests.create_from_pb(request, tenant_id=tenant_id, now=now, limits=limits)
        ),
    )
    run = built[0]
    tasks = [
        (
            ref,
            rule,
            replace(p, new=replace(p.new, schedule_id=schedule_id, logical_date=logical_date)),
        )
        for ref, rule, p in run.tasks
    ]
    return replace(run, tasks=tasks, schedule_id=schedule_id, logical_date=logical_date)


Occurrence = PreparedTask | NewRun
"""What an occurrence creates: one task, or a workflow run."""


def occurrence_builder(
    limits: SubmitLimits,
) -> Callable[[Schedule, datetime, datetime, datetime], Occurrence]:
    """:func:`occurrence_task` (or :func:`occurrence_run`) for ``schedule`` as
    ``(schedule, logical_date, scheduled_at, now)``: what the materialiser and the
    servicer's explicit runs call."""

    def build(
        schedule: Schedule, logical_date: datetime, scheduled_at: datetime, now: datetime
    ) -> Occurrence:
        make = occurrence_run if schedule.spec.creates_workflow else occurrence_task
        return make(
            schedule.spec,
            tenant_id=schedule.tenant_id,
            schedule_id=schedule.id,
            logical_date=logical_date,
            scheduled_at=scheduled_at,
            now=now,
            limits=limits,
        )

    return build


def template_to_pb(spec: ScheduleSpec) -> task_service_pb2.SubmitTaskRequest:
    return task_service_pb2.SubmitTaskRequest.FromString(spec.template)


def workflow_template_to_pb(spec: ScheduleSpec) -> workflow_service_pb2.CreateWorkflowRequest:
    return workflow_service_pb2.CreateWorkflowRequest.FromString(spec.template)


def count_from_pb(value: int, field: str, default: int) -> int:
    if value == 0:
        return default
    if value > MAX_LISTED:
        raise InvalidArgument(field, f"must be at most {MAX_LISTED}")
    return value


def backfill_range_from_pb(
    req: schedule_service_pb2.BackfillScheduleRequest, now: datetime
) -> tuple[datetime, datetime]:
    if not req.HasField("start"):
        raise InvalidArgument("start", "is required")
    if not req.HasField("end"):
        raise InvalidArgument("end", "is required")
    start, end = ts_from_pb(req.start, "start"), ts_from_pb(req.end, "end")
    if end < start:
        raise InvalidArgument("end", "must not be before start")
    if end > now:
        raise InvalidArgument("end", "is in the future: occurrences ahead are the schedule's")
    if start < now - timedelta(seconds=MAX_DELAY_S):
        raise InvalidArgument("start", "is more than 10 years in the past")
    return start, end
