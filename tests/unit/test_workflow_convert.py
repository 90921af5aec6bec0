"""The client's workflow edge: WorkflowService messages <-> ``chronoshard.types``, the
tasks through the one submit-request builder, what a WorkflowTask refuses, a schedule's
workflow template (a CreateWorkflowRequest without start, key or job), and the failover
policy of the five calls.

Pure functions only. The samples set every field of every response (checked by walking
the proto descriptors), so a field added to the contract fails here until the client
maps it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from google.protobuf import duration_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard import _convert as convert
from chronoshard import _failover as failover
from chronoshard import client as client_module
from chronoshard.errors import ProtocolError
from chronoshard.types import (
    JitterMode,
    Priority,
    RetryPolicy,
    TaskSpec,
    TriggerRule,
    Workflow,
    WorkflowEdge,
    WorkflowState,
    WorkflowTask,
    WorkflowTemplate,
)
from chronoshard.v1 import common_pb2, task_service_pb2, workflow_service_pb2

T0 = datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=UTC)
WORKFLOW_ID = "0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f"
TENANT_ID = "0190a7d2-0000-7000-8000-000000000001"
SCHEDULE_ID = "0190a7d2-6a3b-7c4d-8e5f-00000000000a"


def _unset_fields(msg: Any) -> list[str]:
    unset = []
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if not field.is_repeated and not msg.HasField(field.name):
                unset.append(field.name)
        elif field.has_presence and not field.is_repeated:
            if not msg.HasField(field.name):
                unset.append(field.name)
        elif not value:
            unset.append(field.name)
    return unset


def full_workflow_pb(state: int = workflow_service_pb2.WORKFLOW_STATE_FAILED) -> Any:
    msg = workflow_service_pb2.Workflow(
        id=WORKFLOW_ID,
        tenant_id=TENANT_ID,
        name="nightly-etl",
        state=state,
        task_count=4,
        edge_count=4,
        idempotency_key="etl-2026-03-29",
        job_id="nightly-etl",
        schedule_id=SCHEDULE_ID,
    )
    for offset, name in enumerate(("scheduled_at", "created_at", "finished_at", "logical_date")):
        getattr(msg, name).CopyFrom(convert.timestamp(T0 + timedelta(minutes=offset), name))
    return msg


def full_task_pb(task_id: str, status: int) -> common_pb2.Task:
    """A task as a workflow's: every field the round trip of ``task_from_pb`` keeps
    (that mapping has its own full-field tests in test_client_convert.py)."""
    msg = common_pb2.Task(
        id=task_id,
        tenant_id=TENANT_ID,
        type="records.fetch",
        status=status,
        priority=common_pb2.PRIORITY_BULK,
        queue="etl",
        payload_json=b'{"day":"2026-03-29"}',
        attempt=1,
        fencing_token=7,
        max_retries=3,
        workflow_id=WORKFLOW_ID,
        unresolved_dependencies=0,
    )
    msg.scheduled_at.CopyFrom(convert.timestamp(T0, "scheduled_at"))
    return msg


def full_task_state_pb(ref: str = "invoice") -> Any:
    return workflow_service_pb2.WorkflowTaskState(
        ref=ref,
        task=full_task_pb("0190a7d2-6a3b-7c4d-8e5f-000000000002", common_pb2.TASK_STATUS_RUNNING),
        trigger_rule=workflow_service_pb2.TRIGGER_RULE_ALL_DONE,
        upstream_cause="fetch",
    )


def full_detail_pb() -> Any:
    return workflow_service_pb2.GetWorkflowResponse(
        workflow=full_workflow_pb(),
        tasks=[full_task_state_pb("fetch"), full_task_state_pb("invoice")],
        edges=[workflow_service_pb2.WorkflowEdge(parent="fetch", child="invoice")],
    )


def full_template_pb() -> task_service_pb2.SubmitTaskRequest:
    """A workflow task's template with every field it may have (not the time, not the
    key: the workflow's apply)."""
    msg = task_service_pb2.SubmitTaskRequest(
        type="billing.invoice",
        payload_json=b'{"n":12345678901234567890}',
        priority=common_pb2.PRIORITY_CRITICAL,
        queue="billing",
        max_retries=4,
        strict_timing=True,
        jitter_mode=common_pb2.JITTER_MODE_DELAY_ONLY,
        idempotent=True,
        job_id="invoices",
    )
    msg.retry_backoff.initial.CopyFrom(duration_pb2.Duration(seconds=1, nanos=500_000_000))
    msg.retry_backoff.max.CopyFrom(duration_pb2.Duration(seconds=60))
    msg.retry_backoff.multiplier = 2.5
    msg.timeout.CopyFrom(duration_pb2.Duration(seconds=600))
    msg.jitter_window.CopyFrom(duration_pb2.Duration(seconds=30))
    return msg


def full_workflow_task_pb() -> Any:
    return workflow_service_pb2.WorkflowTask(
        ref="invoice",
        task=full_template_pb(),
        trigger_rule=workflow_service_pb2.TRIGGER_RULE_ALL_DONE,
    )


def full_workflow_template_pb() -> Any:
    """A schedule's workflow template: every field but what each occurrence decides."""
    fetch = workflow_service_pb2.WorkflowTask(
        ref="fetch",
        task=task_service_pb2.SubmitTaskRequest(type="records.fetch"),
        trigger_rule=workflow_service_pb2.TRIGGER_RULE_ALL_SUCCESS,
    )
    return workflow_service_pb2.CreateWorkflowRequest(
        name="nightly-etl",
        tasks=[fetch, full_workflow_task_pb()],
        edges=[workflow_service_pb2.WorkflowEdge(parent="fetch", child="invoice")],
    )


# --- the samples and the enums -----------------------------------------------------------------


def test_samples_set_every_field() -> None:
    # Guards the round trips below: a new proto field must be added to the samples.
    assert _unset_fields(full_workflow_pb()) == []
    assert _unset_fields(full_task_state_pb()) == []
    assert _unset_fields(full_detail_pb()) == []
    assert _unset_fields(full_workflow_task_pb()) == []
    assert sorted(_unset_fields(full_workflow_template_pb())) == [
        "delay",
        "idempotency_key",
        "job_id",
        "scheduled_at",
    ]
    # A workflow task's template leaves unset exactly what the workflow decides.
    assert sorted(_unset_fields(full_template_pb())) == [
        "delay",
        "idempotency_key",
        "scheduled_at",
    ]


@pytest.mark.parametrize(
    ("user_enum", "pb_enum", "prefix", "lower"),
    [
        (TriggerRule, workflow_service_pb2.TriggerRule, "TRIGGER_RULE_", True),
        (WorkflowState, workflow_service_pb2.WorkflowState, "WORKFLOW_STATE_", False),
    ],
)
def test_enums_match_the_proto_one_to_one(
    user_enum: type, pb_enum: Any, prefix: str, lower: bool
) -> None:
    proto_names = {
        value.name.removeprefix(prefix)
        for value in pb_enum.DESCRIPTOR.values
        if value.name != prefix + "UNSPECIFIED"
    }
    expected = {name.lower() for name in proto_names} if lower else proto_names
    assert {member.value for member in user_enum} == expected


# --- pb -> types -> pb ---------------------------------------------------------------------------


def test_workflow_round_trip_keeps_every_field() -> None:
    for state in (1, 2, 3, 4):
        msg = full_workflow_pb(state)
        assert convert.workflow_to_pb(convert.workflow_from_pb(msg)) == msg


def test_detail_round_trip_keeps_every_field() -> None:
    msg = full_detail_pb()
    assert convert.workflow_detail_to_pb(convert.workflow_detail_from_pb(msg)) == msg


def test_create_result_round_trip_keeps_every_field() -> None:
    msg = workflow_service_pb2.CreateWorkflowResponse(
        workflow=full_workflow_pb(workflow_service_pb2.WORKFLOW_STATE_RUNNING),
        task_ids={"fetch": "id-1", "invoice": "id-2"},
        created=True,
    )
    assert _unset_fields(msg) == []
    result = convert.workflow_create_result_from_pb(msg)
    assert result.task_ids == {"fetch": "id-1", "invoice": "id-2"} and result.created
    assert convert.workflow_create_result_to_pb(result) == msg


def test_page_cancel_and_retry_round_trips_keep_every_field() -> None:
    page = workflow_service_pb2.ListWorkflowsResponse(
        workflows=[full_workflow_pb(), full_workflow_pb(1)], next_page_token="tok"
    )
    cancel = workflow_service_pb2.CancelWorkflowResponse(
        workflow=full_workflow_pb(4), cancelled=3, stopping=1
    )
    retry = workflow_service_pb2.RetryWorkflowResponse(workflow=full_workflow_pb(1), reopened=2)
    for msg in (page, cancel, retry):
        assert _unset_fields(msg) == []
    assert convert.workflow_page_to_pb(convert.workflow_page_from_pb(page)) == page
    assert convert.workflow_cancel_result_to_pb(convert.workflow_cancel_result_from_pb(cancel)) == (
        cancel
    )
    assert convert.workflow_retry_result_to_pb(convert.workflow_retry_result_from_pb(retry)) == (
        retry
    )
    last = convert.workflow_page_from_pb(workflow_service_pb2.ListWorkflowsResponse())
    assert last.workflows == () and last.next_page_token is None


def test_values_read_as_python_types() -> None:
    detail = convert.workflow_detail_from_pb(full_detail_pb())
    workflow = detail.workflow
    assert workflow.state is WorkflowState.FAILED and workflow.state.is_finished
    assert workflow.scheduled_at == T0 and workflow.scheduled_at.tzinfo is UTC
    assert workflow.finished_at == T0 + timedelta(minutes=2)
    assert (workflow.task_count, workflow.edge_count) == (4, 4)
    assert (workflow.job_id, workflow.schedule_id) == ("nightly-etl", SCHEDULE_ID)
    assert workflow.logical_date == T0 + timedelta(minutes=3)
    fetch, invoice = detail.tasks
    assert fetch.ref == "fetch"
    assert invoice.trigger_rule is TriggerRule.ALL_DONE and invoice.upstream_cause == "fetch"
    assert invoice.task.payload == {"day": "2026-03-29"}
    assert invoice.task.workflow_id == WORKFLOW_ID
    assert detail.edges == (WorkflowEdge("fetch", "invoice"),)
    # Empty strings are None, as everywhere in the client.
    bare = convert.workflow_from_pb(
        workflow_service_pb2.Workflow(id="w", state=workflow_service_pb2.WORKFLOW_STATE_RUNNING)
    )
    assert bare.idempotency_key is None and bare.finished_at is None
    assert (bare.job_id, bare.schedule_id, bare.logical_date) == (None, None, None)
    assert not bare.state.is_finished


def test_unspecified_trigger_rule_reads_as_all_success() -> None:
    # The proto: "Not given: ALL_SUCCESS".
    msg = full_task_state_pb()
    msg.trigger_rule = workflow_service_pb2.TRIGGER_RULE_UNSPECIFIED
    assert convert.workflow_task_state_from_pb(msg).trigger_rule is TriggerRule.ALL_SUCCESS
    msg.trigger_rule = 99  # type: ignore[assignment]  # a newer server's rule
    with pytest.raises(ProtocolError, match="TriggerRule value 99"):
        convert.workflow_task_state_from_pb(msg)


@pytest.mark.parametrize("state", [0, 42])
def test_a_state_the_client_cannot_read_is_a_protocol_error(state: int) -> None:
    with pytest.raises(ProtocolError, match="WorkflowState"):
        convert.workflow_from_pb(full_workflow_pb(state))


# --- requests ----------------------------------------------------------------------------------


def test_workflow_task_round_trip_keeps_every_field() -> None:
    msg = full_workflow_task_pb()
    task = convert.workflow_task_from_pb(msg)
    assert task.task.payload == {"n": 12345678901234567890}
    assert task.task.retry == RetryPolicy(initial_backoff_s=1.5, max_backoff_s=60.0, multiplier=2.5)
    assert convert.workflow_task_to_pb(task) == msg


def test_workflow_task_from_pb_refuses_a_template_with_a_time() -> None:
    msg = full_workflow_task_pb()
    msg.task.delay.CopyFrom(duration_pb2.Duration(seconds=5))
    with pytest.raises(ProtocolError, match=r"'invoice'.*delay_s must be unset"):
        convert.workflow_task_from_pb(msg)


def _task(ref: str, **spec: Any) -> WorkflowTask:
    return WorkflowTask(ref, TaskSpec(type=f"t.{ref}", **spec))


def test_create_request_carries_every_argument() -> None:
    tasks = [_task("fetch", payload={"a": 1}), _task("invoice", priority="critical")]
    request = convert.create_workflow_request(
        "etl",
        tasks,
        [WorkflowEdge("fetch", "invoice"), ("fetch", "report")],
        at=datetime(2030, 1, 2, 4, 0, tzinfo=timezone(timedelta(hours=1))),
        delay_s=None,
        idempotency_key="k-1",
        job_id="etl-job",
    )
    assert request.name == "etl" and request.idempotency_key == "k-1"
    assert request.job_id == "etl-job"
    assert [t.ref for t in request.tasks] == ["fetch", "invoice"]
    assert request.tasks[0].task.payload_json == b'{"a":1}'
    assert request.tasks[1].task.priority == common_pb2.PRIORITY_CRITICAL
    # Sent explicitly, never UNSPECIFIED: what was asked for is what is stored.
    assert {t.trigger_rule for t in request.tasks} == {
        workflow_service_pb2.TRIGGER_RULE_ALL_SUCCESS
    }
    assert [(e.parent, e.child) for e in request.edges] == [
        ("fetch", "invoice"),
        ("fetch", "report"),
    ]
    assert request.WhichOneof("when") == "scheduled_at"
    assert request.scheduled_at.ToDatetime(tzinfo=UTC) == datetime(2030, 1, 2, 3, 0, tzinfo=UTC)

    later = convert.create_workflow_request(
        "etl", tasks, (), at=None, delay_s=90.5, idempotency_key=None, job_id=None
    )
    assert later.WhichOneof("when") == "delay" and later.delay.ToTimedelta().total_seconds() == 90.5
    assert later.idempotency_key == "" and list(later.edges) == [] and later.job_id == ""
    now = convert.create_workflow_request(
        "etl", tasks, (), at=None, delay_s=None, idempotency_key="", job_id=""
    )
    assert now.WhichOneof("when") is None


@pytest.mark.parametrize(
    ("tasks", "edges", "kwargs", "error", "words"),
    [
        ([_task("a", payload={"x": float("nan")})], (), {}, TypeError, "tasks[0]: task: payload"),
        ([_task("a"), "b"], (), {}, TypeError, "tasks[1]: must be a WorkflowTask"),
        ([_task("a")], [("a",)], {}, TypeError, "edges[0]: must be a WorkflowEdge"),
        ([_task("a")], [("a", 1)], {}, TypeError, "edges[0]: parent and child must be refs"),
        ([_task("a")], (), {"at": datetime(2030, 1, 1)}, ValueError, "at must be"),
        ([_task("a")], (), {"at": T0, "delay_s": 1.0}, ValueError, "at most one of"),
        ([_task("a")], (), {"delay_s": float("inf")}, ValueError, "delay_s must be finite"),
    ],
)
def test_create_request_names_what_cannot_be_encoded(
    tasks: list[Any], edges: Any, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    arguments: dict[str, Any] = {
        "at": None,
        "delay_s": None,
        "idempotency_key": None,
        "job_id": None,
        **kwargs,
    }
    with pytest.raises(error) as refused:
        convert.create_workflow_request("wf", tasks, edges, **arguments)
    assert words in str(refused.value)


@pytest.mark.parametrize("field", ["at", "delay_s", "idempotency_key"])
def test_workflow_task_refuses_what_the_workflow_decides(field: str) -> None:
    value: Any = {"at": T0, "delay_s": 5.0, "idempotency_key": "k"}[field]
    with pytest.raises(ValueError, match=f"task.{field} must be unset in a workflow"):
        WorkflowTask("a", TaskSpec(type="t", **{field: value}))


def test_workflow_task_checks_its_arguments() -> None:
    assert WorkflowTask("a", TaskSpec(type="t"), "all_done").trigger_rule is TriggerRule.ALL_DONE  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="trigger_rule must be one of 'all_success', 'all_done'"):
        WorkflowTask("a", TaskSpec(type="t"), "any")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="task must be a TaskSpec"):
        WorkflowTask("a", {"type": "t"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ref must be a str"):
        WorkflowTask(1, TaskSpec(type="t"))  # type: ignore[arg-type]


# --- a schedule's workflow template --------------------------------------------------------------


def test_template_round_trip_keeps_every_field() -> None:
    msg = full_workflow_template_pb()
    template = convert.workflow_template_from_pb(msg)
    assert template.name == "nightly-etl"
    assert [t.ref for t in template.tasks] == ["fetch", "invoice"]
    assert template.edges == (WorkflowEdge("fetch", "invoice"),)
    assert convert.workflow_template_to_pb(template) == msg


def test_template_is_the_create_request_without_start_key_or_job() -> None:
    template = WorkflowTemplate(tasks=[_task("a"), _task("b")], edges=[WorkflowEdge("a", "b")])  # type: ignore[arg-type]
    assert isinstance(template.tasks, tuple) and isinstance(template.edges, tuple)
    assert convert.workflow_template_to_pb(template) == convert.create_workflow_request(
        "", template.tasks, template.edges, at=None, delay_s=None, idempotency_key=None, job_id=None
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("scheduled_at", convert.timestamp(T0, "t")),
        ("delay", duration_pb2.Duration(seconds=5)),
        ("idempotency_key", "k"),
        ("job_id", "j"),
    ],
)
def test_template_from_pb_refuses_what_each_occurrence_decides(field: str, value: Any) -> None:
    msg = full_workflow_template_pb()
    if isinstance(value, str):
        setattr(msg, field, value)
    else:
        getattr(msg, field).CopyFrom(value)
    with pytest.raises(ProtocolError, match=f"workflow template with {field} set"):
        convert.workflow_template_from_pb(msg)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"name": 3}, TypeError, "name must be a str"),
        ({"tasks": [TaskSpec(type="t")]}, TypeError, r"tasks\[0\] must be a WorkflowTask"),
        ({"edges": [("a", "b")]}, TypeError, r"edges\[0\] must be a WorkflowEdge"),
    ],
)
def test_template_checks_its_arguments(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        WorkflowTemplate(**arguments)


def test_list_request() -> None:
    request = convert.list_workflows_request("FAILED", 10, "tok")
    assert (request.state, request.page_size, request.page_token) == (
        workflow_service_pb2.WORKFLOW_STATE_FAILED,
        10,
        "tok",
    )
    assert convert.list_workflows_request(None, 0, None).state == 0
    with pytest.raises(ValueError, match="page_size must be >= 0"):
        convert.list_workflows_request(None, -1, None)
    with pytest.raises(ValueError, match="state must be one of"):
        convert.list_workflows_request("DONE", 0, None)


_texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
_times = st.none() | st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)


@settings(max_examples=200, deadline=None)
@given(
    name=_texts,
    state=st.sampled_from(list(WorkflowState)),
    times=st.tuples(_times, _times, _times),
    counts=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    key=st.none() | _texts.filter(bool),
    job=st.none() | _texts.filter(bool),
    scheduled=st.none() | st.tuples(st.just(SCHEDULE_ID), _times.filter(bool)),
)
def test_any_workflow_round_trips_types_pb_types(
    name: str,
    state: WorkflowState,
    times: tuple[datetime | None, ...],
    counts: tuple[int, int],
    key: str | None,
    job: str | None,
    scheduled: tuple[str, datetime] | None,
) -> None:
    workflow = Workflow(
        id=WORKFLOW_ID,
        tenant_id=TENANT_ID,
        name=name,
        state=state,
        scheduled_at=times[0],
        created_at=times[1],
        finished_at=times[2],
        task_count=counts[0],
        edge_count=counts[1],
        idempotency_key=key,
        job_id=job,
        schedule_id=None if scheduled is None else scheduled[0],
        logical_date=None if scheduled is None else scheduled[1],
    )
    assert convert.workflow_from_pb(convert.workflow_to_pb(workflow)) == workflow


@settings(max_examples=100, deadline=None)
@given(
    priority=st.none() | st.sampled_from(list(Priority)),
    jitter=st.none() | st.sampled_from(list(JitterMode)),
    rule=st.sampled_from(list(TriggerRule)),
    timeout=st.none() | st.integers(1, 10**6).map(float),
    max_retries=st.none() | st.integers(0, 100),
)
def test_any_workflow_task_round_trips_types_pb_types(
    priority: Priority | None,
    jitter: JitterMode | None,
    rule: TriggerRule,
    timeout: float | None,
    max_retries: int | None,
) -> None:
    task = WorkflowTask(
        "a.b-c_1",
        TaskSpec(
            type="t",
            payload={"k": [1, "two"]},
            priority=priority,
            jitter=jitter,
            timeout_s=timeout,
            max_retries=max_retries,
        ),
        rule,
    )
    assert convert.workflow_task_from_pb(convert.workflow_task_to_pb(task)) == task


# --- how the client sends the calls --------------------------------------------------------------


class _Channel:
    """Enough of a channel for the generated stubs: every method is a named callable."""

    def unary_unary(self, path: str, **_: Any) -> str:
        return path

    def stream_stream(self, path: str, **_: Any) -> str:
        return path


def test_the_client_reaches_every_workflow_call() -> None:
    endpoint = client_module._Endpoint("t:1", _Channel(), 1)  # type: ignore[arg-type]
    for method in ("CreateWorkflow", "GetWorkflow", "ListWorkflows", "CancelWorkflow"):
        assert endpoint.methods[method] == f"/chronoshard.v1.WorkflowService/{method}"
    assert endpoint.methods["RetryWorkflow"].endswith("/RetryWorkflow")
    # The task calls are still there: RPC names are unique across the services.
    assert endpoint.methods["SubmitTask"].endswith("TaskService/SubmitTask")
    assert endpoint.methods["SubmitStream"].endswith("TaskService/SubmitStream")
    assert endpoint.methods["ListIncidents"] == "/chronoshard.v1.WatchdogService/ListIncidents"


def test_failover_repeats_only_what_is_harmless_to_repeat() -> None:
    def request(key: str) -> Any:
        return workflow_service_pb2.CreateWorkflowRequest(name="w", idempotency_key=key)

    decide = failover.repeatable
    for method in ("GetWorkflow", "ListWorkflows", "CancelWorkflow"):
        assert decide(method, keyed=False)
    assert not decide("RetryWorkflow", keyed=False)
    assert client_module._keyed("CreateWorkflow", request("k"))
    assert not client_module._keyed("CreateWorkflow", request(""))
    assert decide("CreateWorkflow", keyed=True) and not decide("CreateWorkflow", keyed=False)
