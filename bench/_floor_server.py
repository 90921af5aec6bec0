"""``python -m bench._floor_server PORT``: TaskService.SubmitTask with nothing behind it.

The floor under a submit (``python -m bench submit-floor``): a ``grpc.aio`` server on
uvloop, configured like the node (its server options, its one generic handler per
service: ``chronoshard.scheduler.api.server``), whose SubmitTask answers at once with a
task shaped like the node's answer (the request's type and payload, a fresh id, the
instants) and does nothing else: no authentication, validation, database or group
commit. What this process spends per call, and the rate and latency its clients see, is
what the gRPC hop alone costs on the machine, the part of a submit no change inside
Chronoshard's handler can remove.

The same answer is also served on one bidirectional stream per caller
(``chronoshard.bench.Floor/SubmitStream``: a SubmitTaskRequest in, its SubmitTaskResponse
out, in order), which ``submit-floor --stream`` calls: what the hop would cost if single
submits rode a stream rather than one unary call each. It is not part of the API; it
measures whether such an RPC would be worth building.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import grpc
import uvloop

from chronoshard.scheduler.api import server as api_server
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.v1 import common_pb2, task_service_pb2, task_service_pb2_grpc
from chronoshard.wire import write_timestamp

STREAM_SERVICE = "chronoshard.bench.Floor"
STREAM_METHOD = f"/{STREAM_SERVICE}/SubmitStream"


class FloorTaskService(task_service_pb2_grpc.TaskServiceServicer):
    async def SubmitTask(
        self, request: task_service_pb2.SubmitTaskRequest, context: Any
    ) -> task_service_pb2.SubmitTaskResponse:
        return answer(request)


async def submit_stream(
    requests: AsyncIterator[task_service_pb2.SubmitTaskRequest], context: Any
) -> AsyncIterator[task_service_pb2.SubmitTaskResponse]:
    async for request in requests:
        yield answer(request)


def answer(request: task_service_pb2.SubmitTaskRequest) -> task_service_pb2.SubmitTaskResponse:
    """A reply shaped like the node's to a SubmitTask, built from the request alone."""
    response = task_service_pb2.SubmitTaskResponse(created=True)
    task = response.task
    task.id = str(uuid.uuid4())
    task.type = request.type
    task.payload_json = request.payload_json
    task.status = common_pb2.TASK_STATUS_SCHEDULED
    now = datetime.now(UTC)
    for field in (task.scheduled_at, task.due_at, task.created_at, task.updated_at):
        write_timestamp(field, now)
    return response


async def serve(port: int) -> None:
    server = grpc.aio.server(options=api_server.server_options(SchedulerConfig()))
    api_server.add_service(
        server, task_service_pb2_grpc.add_TaskServiceServicer_to_server, FloorTaskService()
    )
    stream = grpc.stream_stream_rpc_method_handler(
        submit_stream,
        request_deserializer=task_service_pb2.SubmitTaskRequest.FromString,
        response_serializer=task_service_pb2.SubmitTaskResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(STREAM_SERVICE, {"SubmitStream": stream}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
