"""The client's schedule edge: ScheduleService messages <-> ``chronoshard.types``, the
task template through the one submit-request builder, the workflow template through the
one create-workflow builder, and what a ScheduleSpec refuses.

Pure functions only. The full-message tests walk the proto descriptors, so a field added
to ``ScheduleSpec``, ``Schedule``, ``ScheduleRun`` or ``ScheduleWatch`` fails here until
the client maps it.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from google.protobuf import duration_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard import _convert as convert
from chronoshard.errors import ProtocolError
from chronoshard.types import (
    AlertSeverity,
    CatchupPolicy,
    JitterMode,
    OverlapPolicy,
    Priority,
    RetryPolicy,
    RunOrigin,
    ScheduleRun,
    ScheduleSpec,
    ScheduleWatch,
    TaskSpec,
    TaskStatus,
    TriggerRule,
    WorkflowEdge,
    WorkflowTask,
    WorkflowTemplate,
)
from chronoshard.v1 import common_pb2, schedule_service_pb2, task_service_pb2, workflow_service_pb2

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
T0 = datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=UTC)
SCHEDULE_ID = "0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f"
TASK_ID = "0190a7d2-6a3b-7c4d-8e5f-000000000001"
WORKFLOW_ID = "0190a7d2-6a3b-7c4d-8e5f-000000000002"


def _ts(dt: datetime) -> object:
    return convert.timestamp(dt, "test")


def _unset_fields(msg: object) -> list[str]:
    descriptor = msg.DESCRIPTOR  # type: ignore[attr-defined]
    unset = []
    for field in descriptor.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if not field.is_repeated and not msg.HasField(field.name):  # type: ignore[attr-defined]
                unset.append(field.name)
        elif field.has_presence and not field.is_repeated:
            if not msg.HasField(field.name):  # type: ignore[attr-defined]
                unset.append(field.name)
        elif not value:
            unset.append(field.name)
    return unset


def full_template_pb() -> task_service_pb2.SubmitTaskRequest:
    """A template with every field a template may have set (not the time, not the key,
    not the job: the occurrence and the schedule decide those)."""
    msg = task_service_pb2.SubmitTaskRequest(
        type="report.build",
        payload_json=b'{"format":"pdf","n":12345678901234567890}',
        priority=common_pb2.PRIORITY_BULK,
        queue="reports",
        max_retries=4,
        strict_timing=True,
        jitter_mode=common_pb2.JITTER_MODE_DELAY_ONLY,
        idempotent=True,
    )
    msg.retry_backoff.initial.CopyFrom(duration_pb2.Duration(seconds=1, nanos=500_000_000))
    msg.retry_backoff.max.CopyFrom(duration_pb2.Duration(seconds=60))
    msg.retry_backoff.multiplier = 2.5
    msg.timeout.CopyFrom(duration_pb2.Duration(seconds=600))
    msg.jitter_window.CopyFrom(duration_pb2.Duration(seconds=30))
    return msg


def full_workflow_template_pb() -> workflow_service_pb2.CreateWorkflowRequest:
    """A workflow template with every field it may have set (not the start, the key or
    the job: the occurrence and the schedule decide those); its tasks' full mapping is
    test_workflow_convert.py's."""
    return workflow_service_pb2.CreateWorkflowRequest(
        name="nightly-etl",
        tasks=[
            workflow_service_pb2.WorkflowTask(
                ref=ref,
                task=full_template_pb(),
                trigger_rule=workflow_service_pb2.TRIGGER_RULE_ALL_DONE,
            )
            for ref in ("fetch", "report")
        ],
        edges=[workflow_service_pb2.WorkflowEdge(parent="fetch", child="report")],
    )


def full_spec_pb(
    rule: str = "cron", *, workflow: bool = False
) -> schedule_service_pb2.ScheduleSpec:
    msg = schedule_service_pb2.ScheduleSpec(
        name="nightly-report",
        timezone="Europe/Berlin",
        catchup_policy=schedule_service_pb2.CATCHUP_POLICY_ALL,
        catchup_limit=7,
        overlap_policy=schedule_service_pb2.OVERLAP_POLICY_BUFFER_ONE,
        job_id="nightly",
        watch=schedule_service_pb2.ScheduleWatch(
            disabled=True,
            expected_duration=duration_pb2.Duration(seconds=900),
            tolerance=duration_pb2.Duration(seconds=120),
            severity="warning",
        ),
        misfire_grace=duration_pb2.Duration(seconds=90),
    )
    if workflow:
        msg.workflow_template.CopyFrom(full_workflow_template_pb())
    else:
        msg.task_template.CopyFrom(full_template_pb())
    if rule == "cron":
        msg.cron = "30 2 * * *"
    else:
        msg.interval.CopyFrom(duration_pb2.Duration(seconds=900, nanos=250_000_000))
    msg.start_at.CopyFrom(_ts(T0))
    msg.end_at.CopyFrom(_ts(T0 + timedelta(days=365)))
    return msg


def full_run_pb(*, workflow: bool = False) -> schedule_service_pb2.ScheduleRun:
    """A run that made a task, or (``workflow``) a workflow run: never both."""
    msg = schedule_service_pb2.ScheduleRun(
        origin="BACKFILL", status=common_pb2.TASK_STATUS_COMPLETED
    )
    if workflow:
        msg.workflow_id = WORKFLOW_ID
    else:
        msg.task_id = TASK_ID
    msg.logical_date.CopyFrom(_ts(T0))
    msg.finished_at.CopyFrom(_ts(T0 + timedelta(seconds=42)))
    return msg


def full_schedule_pb(
    rule: str = "cron", *, workflow: bool = False
) -> schedule_service_pb2.Schedule:
    msg = schedule_service_pb2.Schedule(
        id=SCHEDULE_ID,
        tenant_id="0190a7d2-0000-7000-8000-000000000001",
        spec=full_spec_pb(rule, workflow=workflow),
        paused=True,
    )
    for offset, name in enumerate(("next_occurrence", "created_at", "updated_at")):
        getattr(msg, name).CopyFrom(_ts(T0 + timedelta(hours=offset)))
    return msg


# --- the samples and the enums ---------------------------------------------------------------


def test_samples_set_every_field() -> None:
    # Guards the round trips below: a new proto field must be added to the samples.
    # The rule is a oneof: each sample sets one branch; and one of the two templates.
    assert _unset_fields(full_spec_pb("cron")) == ["interval", "workflow_template"]
    assert _unset_fields(full_spec_pb("interval")) == ["cron", "workflow_template"]
    assert _unset_fields(full_spec_pb(workflow=True)) == ["interval", "task_template"]
    assert _unset_fields(full_spec_pb().watch) == []
    assert _unset_fields(full_run_pb()) == ["workflow_id"]
    assert _unset_fields(full_run_pb(workflow=True)) == ["task_id"]
    assert _unset_fields(full_schedule_pb()) == []
    assert sorted(_unset_fields(full_workflow_template_pb())) == [
        "delay",
        "idempotency_key",
        "job_id",
        "scheduled_at",
    ]
    # A template leaves unset exactly what the occurrence and the schedule decide.
    assert sorted(_unset_fields(full_template_pb())) == [
        "delay",
        "idempotency_key",
        "job_id",
        "scheduled_at",
    ]


@pytest.mark.parametrize(
    ("user_enum", "pb_enum", "prefix"),
    [
        (CatchupPolicy, schedule_service_pb2.CatchupPolicy, "CATCHUP_POLICY_"),
        (OverlapPolicy, schedule_service_pb2.OverlapPolicy, "OVERLAP_POLICY_"),
    ],
)
def test_policies_match_the_proto_one_to_one(user_enum: type, pb_enum: object, prefix: str) -> None:
    proto_names = {
        v.name.removeprefix(prefix).lower()
        for v in pb_enum.DESCRIPTOR.values  # type: ignore[attr-defined]
        if v.name != prefix + "UNSPECIFIED"
    }
    assert {m.value for m in user_enum} == proto_names


def test_string_enums_are_the_values_the_proto_comments_name() -> None:
    # ScheduleRun.origin and ScheduleWatch.severity are strings on the wire; their
    # comments are the contract.
    assert [o.value for o in RunOrigin] == [
        "SCHEDULE",
        "CATCHUP",
        "TRIGGER",
        "BACKFILL",
        "BUFFERED",
    ]
    assert [s.value for s in AlertSeverity] == ["critical", "error", "warning", "info"]


# --- pb <-> types ------------------------------------------------------------------------------


@pytest.mark.parametrize("workflow", [False, True])
@pytest.mark.parametrize("rule", ["cron", "interval"])
def test_schedule_round_trip_pb_types_pb_keeps_every_field(rule: str, workflow: bool) -> None:
    msg = full_schedule_pb(rule, workflow=workflow)
    assert convert.schedule_to_pb(convert.schedule_from_pb(msg)) == msg


@pytest.mark.parametrize("workflow", [False, True])
def test_run_round_trip_keeps_every_field(workflow: bool) -> None:
    msg = full_run_pb(workflow=workflow)
    assert convert.schedule_run_to_pb(convert.schedule_run_from_pb(msg)) == msg


def test_schedule_of_a_workflow_reads_its_template() -> None:
    spec = convert.schedule_from_pb(full_schedule_pb(workflow=True)).spec
    assert spec.task is None and spec.workflow is not None
    assert spec.workflow.name == "nightly-etl"
    assert [(t.ref, t.trigger_rule) for t in spec.workflow.tasks] == [
        ("fetch", TriggerRule.ALL_DONE),
        ("report", TriggerRule.ALL_DONE),
    ]
    assert spec.workflow.tasks[0].task == convert.task_spec_from_pb(full_template_pb())
    assert spec.workflow.edges == (WorkflowEdge("fetch", "report"),)
    run = convert.schedule_run_from_pb(full_run_pb(workflow=True))
    assert (run.task_id, run.workflow_id, run.status) == (
        None,
        WORKFLOW_ID,
        TaskStatus.COMPLETED,  # the run SUCCEEDED
    )


def test_schedule_from_pb_reads_values_as_python_types() -> None:
    schedule = convert.schedule_from_pb(full_schedule_pb("interval"))
    spec = schedule.spec
    assert (schedule.id, schedule.name, schedule.paused) == (SCHEDULE_ID, "nightly-report", True)
    assert schedule.next_occurrence == T0 and schedule.updated_at == T0 + timedelta(hours=2)
    assert spec.cron is None and spec.interval_s == 900.25
    assert spec.timezone == "Europe/Berlin"
    assert spec.start_at == T0 and spec.end_at == T0 + timedelta(days=365)
    assert spec.catchup is CatchupPolicy.ALL and spec.catchup_limit == 7
    assert spec.overlap is OverlapPolicy.BUFFER_ONE
    assert spec.job_id == "nightly" and spec.misfire_grace_s == 90.0
    assert spec.watch == ScheduleWatch(
        disabled=True, expected_duration_s=900.0, tolerance_s=120.0, severity=AlertSeverity.WARNING
    )
    assert spec.task == TaskSpec(
        type="report.build",
        payload={"format": "pdf", "n": 12345678901234567890},  # exact, as task payloads
        priority=Priority.BULK,
        queue="reports",
        max_retries=4,
        retry=RetryPolicy(initial_backoff_s=1.5, max_backoff_s=60.0, multiplier=2.5),
        timeout_s=600.0,
        strict_timing=True,
        jitter=JitterMode.DELAY_ONLY,
        jitter_window_s=30.0,
        idempotent=True,
    )


def test_minimal_schedule_reads_unset_values_as_none() -> None:
    msg = schedule_service_pb2.Schedule(
        id=SCHEDULE_ID,
        spec=schedule_service_pb2.ScheduleSpec(
            name="n", cron="@daily", task_template=task_service_pb2.SubmitTaskRequest(type="t")
        ),
    )
    schedule = convert.schedule_from_pb(msg)
    spec = schedule.spec
    assert schedule.next_occurrence is None and schedule.created_at is None
    assert (spec.timezone, spec.start_at, spec.end_at) == (None, None, None)
    # Unspecified policies are "the server's default", not a policy of the client's.
    assert (spec.catchup, spec.catchup_limit, spec.overlap) == (None, None, None)
    assert (spec.job_id, spec.misfire_grace_s) == (None, None)
    assert spec.watch == ScheduleWatch()
    assert spec.task == TaskSpec(type="t")


def test_run_of_a_skipped_occurrence_has_no_task_and_no_status() -> None:
    msg = schedule_service_pb2.ScheduleRun(origin="SCHEDULE", logical_date=_ts(T0))
    assert convert.schedule_run_from_pb(msg) == ScheduleRun(
        logical_date=T0,
        origin=RunOrigin.SCHEDULE,
        task_id=None,
        status=None,
        finished_at=None,
        workflow_id=None,
    )


def test_details_page_and_backfill_read_every_item_in_order() -> None:
    later = dataclasses.replace(
        convert.schedule_run_from_pb(full_run_pb()), origin=RunOrigin.TRIGGER
    )
    runs = [full_run_pb(), convert.schedule_run_to_pb(later)]
    details = convert.schedule_details_from_pb(
        schedule_service_pb2.GetScheduleResponse(
            schedule=full_schedule_pb(),
            next_occurrences=[_ts(T0), _ts(T0 + timedelta(days=1))],
            runs=runs,
        )
    )
    assert details.next_occurrences == (T0, T0 + timedelta(days=1))
    assert [r.origin for r in details.runs] == [RunOrigin.BACKFILL, RunOrigin.TRIGGER]
    page = convert.schedule_page_from_pb(
        schedule_service_pb2.ListSchedulesResponse(schedules=[full_schedule_pb()] * 2)
    )
    assert len(page.schedules) == 2 and page.next_page_token is None
    token = convert.schedule_page_from_pb(
        schedule_service_pb2.ListSchedulesResponse(next_page_token="tok")
    )
    assert token.next_page_token == "tok"
    backfill = convert.backfill_result_from_pb(
        schedule_service_pb2.BackfillScheduleResponse(runs=runs, existing=3)
    )
    assert backfill.existing == 3 and backfill.runs == details.runs


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda m: setattr(m.runs[0], "origin", "LATER"), "run origin 'LATER'"),
        (lambda m: m.runs[0].ClearField("logical_date"), "without its logical_date"),
        (lambda m: setattr(m.runs[0], "status", 99), "TaskStatus value 99"),
        (lambda m: setattr(m.schedule.spec.watch, "severity", "page"), "severity 'page'"),
        (lambda m: setattr(m.schedule.spec, "catchup_policy", 9), "CatchupPolicy value 9"),
        (lambda m: m.schedule.spec.ClearField("cron"), "exactly one of cron and interval_s"),
        (lambda m: setattr(m.schedule.spec.task_template, "job_id", "j"), "task.job_id"),
        (lambda m: setattr(m.schedule.spec.task_template, "payload_json", b"[1]"), "payload"),
        (lambda m: m.schedule.spec.ClearField("task_template"), "exactly one of task and workflow"),
        (
            lambda m: m.schedule.spec.workflow_template.CopyFrom(full_workflow_template_pb()),
            "exactly one of task and workflow",
        ),
        (
            lambda m: m.schedule.spec.workflow_template.delay.FromSeconds(1),
            "workflow template with delay set",
        ),
    ],
)
def test_answers_no_client_type_holds_are_protocol_errors(mutate: object, match: str) -> None:
    msg = schedule_service_pb2.GetScheduleResponse(
        schedule=full_schedule_pb(), runs=[full_run_pb()]
    )
    mutate(msg)  # type: ignore[operator]
    with pytest.raises(ProtocolError, match=match):
        convert.schedule_details_from_pb(msg)


# --- the task template: the one submit-request builder, and its inverse -------------------------


def test_template_is_the_submit_request_of_the_task_spec() -> None:
    spec = convert.schedule_from_pb(full_schedule_pb()).spec
    assert spec.task is not None
    assert convert.schedule_spec_to_pb(spec).task_template == convert.submit_request(spec.task)
    # ... and a workflow's, the create request of its template; never both.
    flow = convert.schedule_from_pb(full_schedule_pb(workflow=True)).spec
    assert flow.workflow is not None
    msg = convert.schedule_spec_to_pb(flow)
    assert msg.workflow_template == convert.workflow_template_to_pb(flow.workflow)
    assert not msg.HasField("task_template")


def test_task_spec_from_pb_inverts_submit_request_with_time_and_key() -> None:
    # The inverse is general (not only for templates): a time, a key and a job come back.
    spec = TaskSpec(
        type="t",
        at=T0,
        idempotency_key="k",
        job_id="j",
        retry=RetryPolicy(max_backoff_s=5.0),
    )
    assert convert.task_spec_from_pb(convert.submit_request(spec)) == spec
    delayed = TaskSpec(type="t", delay_s=2.5, max_retries=0)
    assert convert.task_spec_from_pb(convert.submit_request(delayed)) == delayed


# Binary fractions: a float such as 1.382 comes back as 1.3820000000000001 (seconds +
# nanos / 1e9), which is the codec's business (tests/unit/test_wire_codec.py); the
# message direction, the one `schedules update` relies on, is exact for any value.
seconds = st.integers(min_value=1, max_value=10**9).map(lambda quarters: quarters / 4)
optional_seconds = st.none() | seconds
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
instants = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(9998, 12, 31),
    timezones=st.sampled_from([UTC, ZoneInfo("Europe/Paris"), ZoneInfo("Australia/Lord_Howe")]),
    # In UTC: PEP 495 makes == across zones False for wall times in a DST gap or fold.
).map(lambda value: value.astimezone(UTC))


@st.composite
def templates(draw: st.DrawFn) -> TaskSpec:
    retry = draw(
        st.none()
        | st.builds(
            RetryPolicy,
            initial_backoff_s=optional_seconds,
            max_backoff_s=optional_seconds,
            multiplier=st.none() | st.floats(min_value=1, max_value=10),
        ).filter(lambda r: r != RetryPolicy())  # an empty policy is sent as none at all
    )
    return TaskSpec(
        type=draw(names),
        payload=draw(
            st.none()
            | st.dictionaries(names, st.integers() | st.booleans() | names | st.none(), max_size=3)
        ),
        priority=draw(st.none() | st.sampled_from(Priority)),
        queue=draw(names),
        max_retries=draw(st.none() | st.integers(min_value=0, max_value=2**31)),
        retry=retry,
        timeout_s=draw(optional_seconds),
        strict_timing=draw(st.booleans()),
        jitter=draw(st.none() | st.sampled_from(JitterMode)),
        jitter_window_s=draw(optional_seconds),
        idempotent=draw(st.booleans()),
    )


@st.composite
def workflow_templates(draw: st.DrawFn) -> WorkflowTemplate:
    refs = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, unique=True))
    tasks = [
        WorkflowTask(ref, draw(templates()), draw(st.sampled_from(TriggerRule))) for ref in refs
    ]
    # Any pairs: the template holds what the server judges (acyclic, known refs).
    pairs = draw(st.lists(st.tuples(st.sampled_from(refs), st.sampled_from(refs)), max_size=4))
    return WorkflowTemplate(
        name=draw(names), tasks=tuple(tasks), edges=tuple(WorkflowEdge(p, c) for p, c in pairs)
    )


@st.composite
def schedule_specs(draw: st.DrawFn) -> ScheduleSpec:
    cron = draw(st.none() | st.sampled_from(["30 2 * * *", "*/5 * * * * *", "@daily"]))
    workflow = draw(st.none() | workflow_templates())
    return ScheduleSpec(
        name=draw(names),
        task=draw(templates()) if workflow is None else None,
        workflow=workflow,
        cron=cron,
        interval_s=draw(seconds) if cron is None else None,
        timezone=draw(st.none() | st.sampled_from(["Europe/Berlin", "America/New_York"])),
        start_at=draw(st.none() | instants),
        end_at=draw(st.none() | instants),
        catchup=draw(st.none() | st.sampled_from(CatchupPolicy)),
        catchup_limit=draw(st.none() | st.integers(min_value=0, max_value=2**32 - 1)),
        overlap=draw(st.none() | st.sampled_from(OverlapPolicy)),
        job_id=draw(st.none() | names.filter(bool)),
        watch=draw(
            st.builds(
                ScheduleWatch,
                disabled=st.booleans(),
                expected_duration_s=optional_seconds,
                tolerance_s=optional_seconds,
                severity=st.none() | st.sampled_from(AlertSeverity),
            )
        ),
        misfire_grace_s=draw(optional_seconds),
    )


@PROPERTY_SETTINGS
@given(templates())
def test_templates_round_trip_both_ways(spec: TaskSpec) -> None:
    request = convert.submit_request(spec)
    back = convert.task_spec_from_pb(request)
    assert back == spec
    assert convert.submit_request(back) == request


@PROPERTY_SETTINGS
@given(schedule_specs())
def test_schedule_specs_round_trip_both_ways(spec: ScheduleSpec) -> None:
    msg = convert.schedule_spec_to_pb(spec)
    back = convert.schedule_spec_from_pb(msg)
    # Instants come back in UTC; compared as instants they are the same.
    assert back == spec
    assert convert.schedule_spec_to_pb(back) == msg


# --- what a spec refuses before any call ---------------------------------------------------------


def _spec(**overrides: object) -> ScheduleSpec:
    values: dict[str, object] = {"name": "n", "task": TaskSpec(type="t"), "cron": "@daily"}
    values.update(overrides)
    return ScheduleSpec(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"interval_s": 60.0}, ValueError, "exactly one of cron and interval_s"),
        ({"cron": None}, ValueError, "exactly one of cron and interval_s"),
        ({"start_at": datetime(2026, 1, 1)}, ValueError, "start_at must be a timezone-aware"),
        ({"end_at": "2026-01-01"}, TypeError, "end_at must be a datetime"),
        ({"task": TaskSpec(type="t", at=T0)}, ValueError, "task.at must be unset"),
        ({"task": TaskSpec(type="t", delay_s=1.0)}, ValueError, "task.delay_s must be unset"),
        (
            {"task": TaskSpec(type="t", idempotency_key="k")},
            ValueError,
            "task.idempotency_key must be unset",
        ),
        ({"task": TaskSpec(type="t", job_id="j")}, ValueError, "the schedule's job_id instead"),
        ({"task": "t"}, TypeError, "task must be a TaskSpec"),
        ({"task": None}, ValueError, "give exactly one of task and workflow"),
        ({"workflow": WorkflowTemplate()}, ValueError, "give exactly one of task and workflow"),
        ({"task": None, "workflow": "w"}, TypeError, "workflow must be a WorkflowTemplate"),
        ({"catchup": "some"}, ValueError, "catchup must be one of 'skip', 'latest', 'all'"),
        ({"overlap": "queue"}, ValueError, "overlap must be one of 'allow', 'skip', 'buffer_one'"),
        ({"watch": {"disabled": True}}, TypeError, "watch must be a ScheduleWatch"),
        ({"name": 7}, TypeError, "name must be a str"),
    ],
)
def test_spec_refuses_what_cannot_be_right(
    overrides: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _spec(**overrides)


def test_strings_are_accepted_for_the_policies() -> None:
    spec = _spec(catchup="latest", overlap="buffer_one", watch=ScheduleWatch(severity="info"))  # type: ignore[arg-type]
    assert spec.catchup is CatchupPolicy.LATEST and spec.overlap is OverlapPolicy.BUFFER_ONE
    assert spec.watch.severity is AlertSeverity.INFO
    with pytest.raises(ValueError, match=r"watch\.severity must be one of"):
        ScheduleWatch(severity="page")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"catchup_limit": -1}, "catchup_limit must be an int >= 0"),
        ({"cron": None, "interval_s": float("inf")}, "interval_s must be finite"),
        ({"misfire_grace_s": "1m"}, "misfire_grace_s must be a number"),
        ({"task": TaskSpec(type="t", max_retries=-1)}, "task: max_retries must be an int >= 0"),
        ({"task": TaskSpec(type="t", payload={"x": {1}})}, "task: payload is not JSON"),
        (
            {
                "task": None,
                "workflow": WorkflowTemplate(
                    tasks=(WorkflowTask("a", TaskSpec(type="t", payload={"x": {1}})),)
                ),
            },
            r"workflow: tasks\[0\]: task: payload is not JSON",
        ),
    ],
)
def test_what_cannot_be_encoded_is_refused_naming_the_argument(
    overrides: dict[str, object], match: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        convert.schedule_spec_to_pb(_spec(**overrides))


def test_backfill_request_needs_aware_bounds() -> None:
    request = convert.backfill_request("nightly", T0, T0 + timedelta(days=1))
    assert request.id == "nightly" and request.start == _ts(T0)
    with pytest.raises(ValueError, match="end must be a timezone-aware"):
        convert.backfill_request("nightly", T0, datetime(2026, 1, 1))


def test_run_status_reads_task_status() -> None:
    run = convert.schedule_run_from_pb(full_run_pb())
    assert run.status is TaskStatus.COMPLETED and run.finished_at == T0 + timedelta(seconds=42)
