"""A workflow task's view in the worker SDK: Assignment fields 18-20 -> ``ctx``.

The wire message is converted (``_convert``), then decoded and validated when the context
is built (``build_context``), as the payload and ``schedule_id`` are: anything malformed
refuses the attempt (BadAttempt, settled as a non-retryable BadAssignment).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from chronoshard.clock import FakeClock
from chronoshard.v1 import common_pb2, worker_service_pb2
from chronoshard.worker import ParentResult, TaskContext
from chronoshard.worker._context import BadAttempt, build_context
from chronoshard.worker._convert import from_pb
from chronoshard.worker._models import AssignedParent, Assignment, TaskRef
from chronoshard.worker.testing import TaskEnvironment, run_task

pb = worker_service_pb2
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TASK_ID = "0190a5e2-0000-7000-8000-0000000000aa"
WORKFLOW_ID = "0190a5e2-0000-7000-8000-0000000000f0"
B_ID = "0190a5e2-0000-7000-8000-0000000000b0"
C_ID = "0190a5e2-0000-7000-8000-0000000000c0"
CLOCK = FakeClock()


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def _wire_assignment(**fields: Any) -> pb.Assignment:
    return pb.Assignment(
        task=common_pb2.TaskRef(id=TASK_ID, scheduled_at=_ts(AT)),
        type="t",
        payload_json=b"{}",
        fencing_token=1,
        attempt=1,
        due_at=_ts(AT),
        **fields,
    )


def _convert(msg: pb.Assignment) -> Assignment:
    out = from_pb(pb.SchedulerMessage(assignment=msg))
    assert isinstance(out, Assignment)
    return out


def _context(info: Assignment) -> TaskContext:
    return build_context(info, worker_id="w", timeout_s=None, now=CLOCK.now)


def _assignment(**overrides: Any) -> Assignment:
    fields: dict[str, Any] = {
        "task": TaskRef(TASK_ID, AT),
        "type": "t",
        "payload_json": b"{}",
        "fencing_token": 1,
        "attempt": 1,
        "max_retries": 0,
        "due_at": AT,
        "lease_expires_at": None,
        "timeout_s": None,
        "checkpoint": b"",
        "workflow_id": WORKFLOW_ID,
        "workflow_ref": "D",
    }
    fields.update(overrides)
    return Assignment(**fields)


# ---- protobuf -> Assignment ----------------------------------------------------------


def test_the_workflow_fields_are_converted_in_the_workflows_order() -> None:
    info = _convert(
        _wire_assignment(
            workflow_id=WORKFLOW_ID,
            workflow_ref="D",
            parent_results=[
                pb.ParentResult(
                    ref="C",
                    task_id=C_ID,
                    status=common_pb2.TASK_STATUS_DEAD_LETTER,
                ),
                pb.ParentResult(
                    ref="B",
                    task_id=B_ID,
                    status=common_pb2.TASK_STATUS_COMPLETED,
                    result_json=b'{"n":1}',
                ),
                pb.ParentResult(
                    ref="E",
                    task_id=B_ID,
                    status=common_pb2.TASK_STATUS_COMPLETED,
                    omitted=True,
                ),
            ],
        )
    )
    assert (info.workflow_id, info.workflow_ref) == (WORKFLOW_ID, "D")
    assert info.parent_results == (
        AssignedParent("C", C_ID, "DEAD_LETTER", b"", False),
        AssignedParent("B", B_ID, "COMPLETED", b'{"n":1}', False),
        AssignedParent("E", B_ID, "COMPLETED", b"", True),
    )


def test_a_task_outside_a_workflow_has_none_of_it() -> None:
    info = _convert(_wire_assignment())
    assert (info.workflow_id, info.workflow_ref, info.parent_results) == (None, None, ())
    ctx = _context(info)
    assert (ctx.workflow_id, ctx.workflow_ref) == (None, None)
    assert dict(ctx.parents) == {}


def test_a_status_newer_than_the_sdk_does_not_fail_the_assignment() -> None:
    info = _convert(
        _wire_assignment(
            workflow_id=WORKFLOW_ID,
            parent_results=[pb.ParentResult(ref="B", task_id=B_ID, status=99)],  # type: ignore[arg-type]
        )
    )
    assert info.parent_results[0].status == "99"
    assert _context(info).parents["B"].status == "99"


# ---- Assignment -> ctx ---------------------------------------------------------------


def test_the_context_decodes_each_parent_by_ref() -> None:
    ctx = _context(
        _assignment(
            parent_results=(
                AssignedParent("B", B_ID, "COMPLETED", b'{"p":-0.46211904005971607552}'),
                AssignedParent("C", C_ID, "DEAD_LETTER"),
            )
        )
    )
    assert ctx.workflow_id == uuid.UUID(WORKFLOW_ID)
    assert ctx.workflow_ref == "D"
    assert list(ctx.parents) == ["B", "C"]  # the order the node sent
    # Numbers exact, as in a payload.
    assert ctx.parents["B"] == ParentResult(
        "B", uuid.UUID(B_ID), "COMPLETED", {"p": Decimal("-0.46211904005971607552")}, False
    )
    assert ctx.parents["C"] == ParentResult("C", uuid.UUID(C_ID), "DEAD_LETTER", None, False)
    with pytest.raises(TypeError):
        ctx.parents["X"] = ctx.parents["B"]  # type: ignore[index]


def test_a_null_result_and_an_omitted_one_are_both_none_but_told_apart() -> None:
    ctx = _context(
        _assignment(
            parent_results=(
                AssignedParent("B", B_ID, "COMPLETED", b"null"),
                # Bytes along with omitted=True are not the result: never decoded.
                AssignedParent("C", C_ID, "COMPLETED", b"{trunc", omitted=True),
            )
        )
    )
    assert (ctx.parents["B"].result, ctx.parents["B"].omitted) == (None, False)
    assert (ctx.parents["C"].result, ctx.parents["C"].omitted) == (None, True)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"workflow_id": "nope"}, "workflow id 'nope' is not a UUID"),
        (
            {"parent_results": (AssignedParent("B", "nope", "COMPLETED"),)},
            "workflow parent 'B'.s task id 'nope' is not a UUID",
        ),
        (
            {"parent_results": (AssignedParent("B", B_ID, "COMPLETED", b"[1,"),)},
            "workflow parent 'B'.s result is not valid UTF-8 JSON",
        ),
        (
            {"parent_results": (AssignedParent("B", B_ID, "COMPLETED", b"\xff"),)},
            "workflow parent 'B'.s result",
        ),
        ({"parent_results": (AssignedParent("", B_ID, "COMPLETED"),)}, "has no ref"),
        (
            {
                "parent_results": (
                    AssignedParent("B", B_ID, "COMPLETED"),
                    AssignedParent("B", C_ID, "COMPLETED"),
                )
            },
            "'B' is given twice",
        ),
    ],
)
def test_a_malformed_workflow_view_refuses_the_attempt(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadAttempt, match=message):
        _context(_assignment(**overrides))


# ---- the testing helper --------------------------------------------------------------


async def test_run_task_hands_plain_values_over_as_completed_parents() -> None:
    seen: dict[str, ParentResult] = {}

    async def merge(ctx: TaskContext) -> list[Any]:
        seen.update(ctx.parents)
        assert ctx.workflow_id is not None  # a task with parents is a workflow's
        return [ctx.parents[ref].result for ref in ctx.parents]

    outcome = await run_task(merge, parents={"left": [1, 2.5], "right": {"k": None}})
    assert outcome.status == "completed"
    assert outcome.result == [[1, 2.5], {"k": None}]
    assert {ref: (p.status, p.omitted) for ref, p in seen.items()} == {
        "left": ("COMPLETED", False),
        "right": ("COMPLETED", False),
    }


async def test_task_environment_takes_parent_results_as_given() -> None:
    workflow_id = uuid.uuid4()
    failed = ParentResult("B", uuid.UUID(B_ID), "DEAD_LETTER")
    omitted = ParentResult("C", uuid.UUID(C_ID), "COMPLETED", omitted=True)

    def join(ctx: TaskContext) -> dict[str, Any]:  # a sync handler sees the same
        return {
            "workflow": str(ctx.workflow_id),
            "ref": ctx.workflow_ref,
            "parents": {r: [p.status, p.omitted, str(p.task_id)] for r, p in ctx.parents.items()},
        }

    env = TaskEnvironment(
        parents={"B": failed, "C": omitted}, workflow_id=workflow_id, workflow_ref="D"
    )
    outcome = await env.run(join)
    assert outcome.result == {
        "workflow": str(workflow_id),
        "ref": "D",
        "parents": {"B": ["DEAD_LETTER", False, B_ID], "C": ["COMPLETED", True, C_ID]},
    }
    plain = await TaskEnvironment().run(lambda ctx: [str(ctx.workflow_id), len(ctx.parents)])
    assert plain.result == ["None", 0]


def test_task_environment_refuses_a_parent_under_another_ref() -> None:
    with pytest.raises(ValueError, match="ParentResult of 'B'"):
        TaskEnvironment(parents={"C": ParentResult("B", uuid.UUID(B_ID), "COMPLETED")})
    with pytest.raises(ValueError, match="must not be empty"):
        TaskEnvironment(parents={"": 1})
