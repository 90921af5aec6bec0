"""The committed generated gRPC code matches its .proto sources, and the contract holds.

The freshness test regenerates into a temporary directory and compares byte for byte, so
an edited .proto without regenerated code (or a hand-edited ``*_pb2.py``) fails here with
the command to run. The other tests pin the parts of the contract that other code relies
on: docs/architecture.md#d4's status names, the RPCs of each service, and that one message of each
service survives a wire round trip with its presence-sensitive fields intact.
"""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest
from google.protobuf import json_format

from chronoshard import protogen
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    common_pb2,
    task_service_pb2,
    task_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)

SCHEDULED_AT = datetime.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)


def test_committed_generated_code_is_fresh() -> None:
    stale = protogen.find_stale()
    assert not stale, (
        "generated code under proto/ does not match the .proto sources:\n"
        + "".join(f"  {item.path} ({item.problem})\n" for item in stale)
        + f"regenerate with: {protogen.REGENERATE_COMMAND}"
    )


@pytest.fixture
def proto_copy(tmp_path: Path) -> Path:
    """A private copy of the proto root (sources and committed generated files)."""
    package = tmp_path / protogen.PACKAGE_PATH
    package.mkdir(parents=True)
    for path in (protogen.PROTO_ROOT / protogen.PACKAGE_PATH).iterdir():
        if path.suffix == ".proto" or path.name.endswith(protogen.GENERATED_SUFFIXES):
            shutil.copy2(path, package / path.name)
    return tmp_path


def _make_stale(proto_root: Path) -> None:
    """One change of each kind: a source edit, a hand edit, a missing and an orphan file."""
    package = proto_root / protogen.PACKAGE_PATH
    with (package / "admin_service.proto").open("a") as source:
        source.write("\nmessage AddedByTest {\n  string name = 1;\n}\n")
    with (package / "common_pb2.pyi").open("a") as stub:
        stub.write("# hand edit\n")
    (package / "task_service_pb2_grpc.py").unlink()
    (package / "removed_service_pb2.py").write_text("# its .proto is gone\n")


def test_check_names_every_stale_file_and_the_command(
    proto_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert protogen.main(["--check", "--proto-root", str(proto_copy)]) == 0
    _make_stale(proto_copy)

    assert protogen.main(["--check", "--proto-root", str(proto_copy)]) == 1

    out = capsys.readouterr().out
    v1 = proto_copy / protogen.PACKAGE_PATH
    assert f"{v1 / 'admin_service_pb2.py'} (differs)" in out
    assert f"{v1 / 'common_pb2.pyi'} (differs)" in out
    assert f"{v1 / 'task_service_pb2_grpc.py'} (missing)" in out
    assert f"{v1 / 'removed_service_pb2.py'} (orphaned)" in out
    assert "worker_service" not in out
    assert protogen.REGENERATE_COMMAND in out


def test_regenerate_repairs_every_stale_file(proto_copy: Path) -> None:
    _make_stale(proto_copy)

    assert protogen.main(["--proto-root", str(proto_copy)]) == 0

    assert protogen.find_stale(proto_copy) == []
    v1 = proto_copy / protogen.PACKAGE_PATH
    assert not (v1 / "removed_service_pb2.py").exists()
    assert b"class AddedByTest(" in (v1 / "admin_service_pb2.pyi").read_bytes()


def test_protoc_error_is_reported_and_nothing_is_written(
    proto_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v1 = proto_copy / protogen.PACKAGE_PATH
    before = (v1 / "common_pb2.py").read_bytes()
    with (v1 / "common.proto").open("a") as source:
        source.write("\nmessage Broken {\n")

    assert protogen.main(["--proto-root", str(proto_copy)]) == 2

    assert "common.proto" in capsys.readouterr().err
    assert (v1 / "common_pb2.py").read_bytes() == before


def test_task_status_names_match_design_state_machine() -> None:
    values = common_pb2.TaskStatus.DESCRIPTOR.values
    names = {value.name.removeprefix("TASK_STATUS_") for value in values}
    assert names == {
        "UNSPECIFIED",
        "SCHEDULED",
        "PRELOADED",
        "DISPATCHED",
        "RUNNING",
        "COMPLETED",
        "RETRYING",
        "DEAD_LETTER",
        "CANCELLED",
        "UPSTREAM_FAILED",
        "OUTCOME_UNKNOWN",
    }
    assert common_pb2.TaskStatus.Name(0) == "TASK_STATUS_UNSPECIFIED"


def test_services_expose_their_rpcs() -> None:
    def methods(module: object, service: str) -> dict[str, tuple[bool, bool]]:
        descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
        return {m.name: (m.client_streaming, m.server_streaming) for m in descriptor.methods}

    unary = (False, False)
    assert methods(task_service_pb2, "TaskService") == {
        name: unary
        for name in (
            "SubmitTask",
            "SubmitBatch",
            "GetTask",
            "ListTasks",
            "CancelTask",
            "RetryTask",
            "ResolveTask",
        )
    } | {"SubmitStream": (True, True)}
    assert methods(worker_service_pb2, "WorkerService") == {
        "Connect": (True, True),
        "Complete": unary,
        "Fail": unary,
        "Release": unary,
    }
    assert methods(admin_service_pb2, "AdminService") == {
        "GetTopology": unary,
        "ListShards": unary,
        "ListWorkerSessions": unary,
        "DrainNode": unary,
        "UndrainNode": unary,
    }
    # The grpc modules import (their generated-version check passes) and register.
    assert callable(task_service_pb2_grpc.add_TaskServiceServicer_to_server)
    assert callable(worker_service_pb2_grpc.add_WorkerServiceServicer_to_server)
    assert callable(admin_service_pb2_grpc.add_AdminServiceServicer_to_server)


def _task_ref() -> common_pb2.TaskRef:
    ref = common_pb2.TaskRef(id="0190a5c2-7b7e-7cde-8f00-000000000001")
    ref.scheduled_at.FromDatetime(SCHEDULED_AT)
    return ref


def test_submit_request_round_trip_keeps_presence_and_exact_payload() -> None:
    payload = b'{"n": 9007199254740993}'  # 2**53 + 1: not representable as a double
    request = task_service_pb2.SubmitTaskRequest(
        type="email.send",
        payload_json=payload,
        priority=common_pb2.PRIORITY_CRITICAL,
        max_retries=0,
        jitter_mode=common_pb2.JITTER_MODE_DELAY_ONLY,
        idempotency_key="k-1",
    )
    request.scheduled_at.FromDatetime(SCHEDULED_AT)
    request.retry_backoff.initial.FromSeconds(2)
    request.retry_backoff.multiplier = 2.0

    parsed = task_service_pb2.SubmitTaskRequest.FromString(request.SerializeToString())

    assert parsed == request
    assert parsed.WhichOneof("when") == "scheduled_at"
    assert parsed.scheduled_at.ToDatetime(datetime.UTC) == SCHEDULED_AT
    assert parsed.HasField("max_retries") and parsed.max_retries == 0
    assert not task_service_pb2.SubmitTaskRequest().HasField("max_retries")
    assert parsed.payload_json == payload

    request.delay.FromSeconds(30)  # the oneof: setting delay clears scheduled_at
    assert request.WhichOneof("when") == "delay"
    assert not request.HasField("scheduled_at")


def test_worker_messages_round_trip() -> None:
    heartbeat = worker_service_pb2.WorkerMessage(
        heartbeat=worker_service_pb2.Heartbeat(
            running=[
                worker_service_pb2.RunningTask(
                    task=_task_ref(), fencing_token=2**40, checkpoint=b""
                ),
                worker_service_pb2.RunningTask(task=_task_ref(), fencing_token=7),
            ]
        )
    )
    parsed = worker_service_pb2.WorkerMessage.FromString(heartbeat.SerializeToString())
    assert parsed == heartbeat
    assert parsed.WhichOneof("message") == "heartbeat"
    first, second = parsed.heartbeat.running
    # An empty checkpoint (store "nothing") differs from no checkpoint (keep the old one).
    assert first.HasField("checkpoint") and not second.HasField("checkpoint")
    assert first.fencing_token == 2**40

    assignment = worker_service_pb2.SchedulerMessage(
        assignment=worker_service_pb2.Assignment(
            task=_task_ref(),
            type="email.send",
            payload_json=b"{}",
            fencing_token=3,
            attempt=2,
            trace_context={
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            },
            priority=common_pb2.PRIORITY_BULK,
        )
    )
    parsed_reply = worker_service_pb2.SchedulerMessage.FromString(assignment.SerializeToString())
    assert parsed_reply == assignment
    assert parsed_reply.assignment.task.scheduled_at.ToDatetime(datetime.UTC) == SCHEDULED_AT


def test_admin_topology_round_trip() -> None:
    response = admin_service_pb2.GetTopologyResponse(
        nodes=[
            admin_service_pb2.Node(
                node_id="node-a",
                address="10.0.0.1:7070",
                metrics_address="10.0.0.1:9090",
                shards=[0, 2],
            )
        ],
        shards=[
            admin_service_pb2.ShardOwner(shard=0, node_id="node-a", epoch=2**33),
            admin_service_pb2.ShardOwner(shard=1, node_id="", epoch=5),
            admin_service_pb2.ShardOwner(shard=2, node_id="node-a", epoch=9),
        ],
        shard_count=3,
        node_id="node-a",
    )
    parsed = admin_service_pb2.GetTopologyResponse.FromString(response.SerializeToString())
    assert parsed == response
    assert json_format.MessageToDict(parsed)["shards"][0]["epoch"] == str(2**33)
