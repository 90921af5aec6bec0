"""WorkflowService requests: validated whole before anything is written.

The graph first (:func:`~chronoshard.scheduler.core.workflows.validate`: sizes, refs,
edges, one cycle named), then every task through the submit's own validation
(:func:`.task_requests.submit_from_pb`, its errors under ``tasks[i].task.``), so a
workflow task accepts exactly what ``SubmitTask`` accepts, minus when it runs and its
idempotency key: every task of a run is scheduled at the run's instant (one partition
key for the DAG), and the create as a whole is what a key deduplicates.

A task without parents is due at that instant plus its own jitter, like a submit; a
task with parents waits (``unresolved_dependencies`` = its in-degree) and is due the
moment its last parent releases it, so jitter does not apply to it.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import replace
from datetime import datetime

from chronoshard.scheduler.api import task_requests
from chronoshard.scheduler.api.task_requests import SubmitLimits
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.models import MAX_KEY_LENGTH, PreparedTask
from chronoshard.scheduler.core.workflows import (
    MAX_NAME_LENGTH,
    RunState,
    TriggerRule,
    WorkflowSpec,
    WorkflowTaskSpec,
    validate,
)
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.scheduler.store.workflows import NewRun
from chronoshard.v1 import task_service_pb2, workflow_service_pb2

_RULES: dict[int, TriggerRule] = {
    workflow_service_pb2.TRIGGER_RULE_UNSPECIFIED: TriggerRule.ALL_SUCCESS,
    workflow_service_pb2.TRIGGER_RULE_ALL_SUCCESS: TriggerRule.ALL_SUCCESS,
    workflow_service_pb2.TRIGGER_RULE_ALL_DONE: TriggerRule.ALL_DONE,
}
RULE_TO_PB = {
    TriggerRule.ALL_SUCCESS: workflow_service_pb2.TRIGGER_RULE_ALL_SUCCESS,
    TriggerRule.ALL_DONE: workflow_service_pb2.TRIGGER_RULE_ALL_DONE,
}
STATE_TO_PB = {
    RunState.RUNNING: workflow_service_pb2.WORKFLOW_STATE_RUNNING,
    RunState.SUCCEEDED: workflow_service_pb2.WORKFLOW_STATE_SUCCEEDED,
    RunState.FAILED: workflow_service_pb2.WORKFLOW_STATE_FAILED,
    RunState.CANCELLED: workflow_service_pb2.WORKFLOW_STATE_CANCELLED,
}
_STATES: dict[int, RunState] = {int(value): state for state, value in STATE_TO_PB.items()}


def rule_from_pb(value: int, field: str) -> TriggerRule:
    rule = _RULES.get(value)
    if rule is None:
        raise InvalidArgument(field, f"unknown trigger rule {value}")
    return rule


def state_from_pb(value: int, field: str) -> RunState | None:
    """None for UNSPECIFIED (no filter)."""
    if value == workflow_service_pb2.WORKFLOW_STATE_UNSPECIFIED:
        return None
    state = _STATES.get(value)
    if state is None:
        raise InvalidArgument(field, f"unknown workflow state {value}")
    return state


def create_from_pb(
    req: workflow_service_pb2.CreateWorkflowRequest,
    *,
    tenant_id: uuid.UUID,
    now: datetime,
    limits: SubmitLimits,
    trace_context: dict[str, str] | None = None,
) -> NewRun:
    """The run ``req`` asks for, every task validated and prepared, in the DAG's order.

    Raises:
        InvalidArgument: on the field as the request spells it (``tasks[2].ref``,
            ``edges[0].child``, ``edges`` for a cycle, ``tasks[1].task.payload_json``).
        PayloadTooLarge: a task's payload is over the node's limit.
    """
    if len(req.name) > MAX_NAME_LENGTH:
        raise InvalidArgument("name", f"must be at most {MAX_NAME_LENGTH} characters")
    key = task_requests.optional_text(req.idempotency_key, "idempotency_key", MAX_KEY_LENGTH)
    rules = [
        rule_from_pb(t.trigger_rule, f"tasks[{i}].trigger_rule") for i, t in enumerate(req.tasks)
    ]
    dag = validate(
        WorkflowSpec(
            name=req.name,
            tasks=[
                WorkflowTaskSpec(task.ref, task.task, rule)
                for task, rule in zip(req.tasks, rules, strict=True)
            ],
            edges=[(edge.parent, edge.child) for edge in req.edges],
        )
    )
    scheduled_at, _ = task_requests.when_from_pb(req, now, "")
    run_id = new_task_id()
    index = {task.ref: i for i, task in enumerate(req.tasks)}
    prepared: dict[str, PreparedTask] = {}
    for i, task in enumerate(req.tasks):
        prepared[task.ref] = _prepared_task(
            task.task,
            f"tasks[{i}].task.",
            tenant_id=tenant_id,
            run_id=run_id,
            scheduled_at=scheduled_at,
            in_degree=dag.in_degrees[task.ref],
            now=now,
            limits=limits,
            trace_context=trace_context,
        )
    ids = {ref: p.new.id for ref, p in prepared.items()}
    return NewRun(
        id=run_id,
        tenant_id=tenant_id,
        name=req.name,
        scheduled_at=scheduled_at,
        tasks=[(ref, rules[index[ref]], prepared[ref]) for ref in dag.order],
        edges=[(ids[edge.parent], ids[edge.child]) for edge in req.edges],
        idempotency_key=key,
        fingerprint=None if key is None else fingerprint(req),
        job_id=task_requests.optional_text(req.job_id, "job_id", MAX_KEY_LENGTH),
    )


def _prepared_task(
    template: task_service_pb2.SubmitTaskRequest,
    prefix: str,
    *,
    tenant_id: uuid.UUID,
    run_id: uuid.UUID,
    scheduled_at: datetime,
    in_degree: int,
    now: datetime,
    limits: SubmitLimits,
    trace_context: dict[str, str] | None,
) -> PreparedTask:
    kind = template.WhichOneof("when")
    if kind is not None:
        raise InvalidArgument(
            prefix + kind,
            "must be unset: a workflow's tasks start from the workflow's own scheduled_at or delay",
        )
    if template.idempotency_key:
        raise InvalidArgument(
            prefix + "idempotency_key",
            "must be unset: set the workflow's idempotency_key, which covers all of its tasks",
        )
    request = task_service_pb2.SubmitTaskRequest()
    request.CopyFrom(template)
    request.scheduled_at.FromDatetime(scheduled_at)
    task = task_requests.submit_from_pb(
        request,
        tenant_id=tenant_id,
        task_id=new_task_id(),
        now=now,
        limits=limits,
        trace_context=trace_context,
        prefix=prefix,
    )
    new = replace(task.new, workflow_id=run_id, unresolved_dependencies=in_degree)
    if in_degree:
        # Due the moment its last parent releases it (release_children sets due_at then).
        new = replace(new, due_at=scheduled_at)
    return replace(task, new=new)


def fingerprint(req: workflow_service_pb2.CreateWorkflowRequest) -> str:
    """The request as sent (deterministic bytes): a retry of the same create matches, a
    reuse of the key for another workflow does not. A relative delay is compared as
    sent, so a retried create with ``delay`` still matches."""
    return hashlib.sha256(req.SerializeToString(deterministic=True)).hexdigest()
