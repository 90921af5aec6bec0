"""The tracing code paths run in a process of their own: ``python tracing_probe.py
SCENARIO OUT.json`` (tests/unit/test_tracing_helpers.py).

A tracer provider is global and can be set once per process, so whatever sets one runs
here and not in the test session, where it would put a ``traceparent`` into every later
test's calls. Each scenario drives the real client (against :class:`Recorder`, a real
gRPC server on a free port that records each call's metadata) and real handler runs
(``chronoshard.worker.testing``, the worker's own execution code), then writes what it
saw as JSON: the metadata, and every finished span in a plain form.

* ``absent``: ``opentelemetry`` cannot be imported (a blocker on ``sys.meta_path``,
  installed before anything of Chronoshard is imported);
* ``sdk``: the user's own provider with an in-memory exporter, set before
  :func:`chronoshard.tracing.configure_from_env` is asked to install one;
* ``configured``: :func:`~chronoshard.tracing.configure_from_env` with the console
  exporter, then :func:`~chronoshard.tracing.shutdown` (which must flush).

Chronoshard is imported inside the functions, after the scenario's blocker.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import json
import logging
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import grpc

TENANT = "7d3f6a9e-0000-4000-8000-000000000001"
API_KEY = "probe-key"


class _NoOpenTelemetry(importlib.abc.MetaPathFinder):
    """Makes ``import opentelemetry...`` fail as if the package were not installed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname == "opentelemetry" or fullname.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the probe)")
        return None


@dataclass
class Recorder:
    """TaskService and WorkflowService on a real grpc.aio server: ``SubmitTask`` and
    ``SubmitBatch`` succeed, ``CreateWorkflow`` fails INVALID_ARGUMENT; every call's
    metadata is kept, by method, in arrival order."""

    seen: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    # SubmitStream: the trace context each request carried, in arrival order.
    streamed: list[list[tuple[str, str]]] = field(default_factory=list)

    def handler(self) -> grpc.GenericRpcHandler:
        from chronoshard.v1 import task_service_pb2, workflow_service_pb2

        requests: dict[str, Any] = {
            "SubmitTask": task_service_pb2.SubmitTaskRequest,
            "SubmitBatch": task_service_pb2.SubmitBatchRequest,
            "CreateWorkflow": workflow_service_pb2.CreateWorkflowRequest,
        }
        recorder = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
                method = details.method.rsplit("/", 1)[-1]
                if method == "SubmitStream":
                    return grpc.stream_stream_rpc_method_handler(
                        recorder.stream,
                        request_deserializer=task_service_pb2.SubmitStreamRequest.FromString,
                        response_serializer=lambda message: message.SerializeToString(),
                    )
                if method not in requests:
                    return None

                async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                    metadata = [(m.key, m.value) for m in context.invocation_metadata()]
                    recorder.seen.append((method, metadata))
                    return await recorder.answer(method, request, context)

                return grpc.unary_unary_rpc_method_handler(
                    call,
                    request_deserializer=requests[method].FromString,
                    response_serializer=lambda message: message.SerializeToString(),
                )

        return Handler()

    async def stream(self, requests: Any, context: grpc.aio.ServicerContext) -> Any:
        from chronoshard.v1 import task_service_pb2

        async for request in requests:
            self.streamed.append(sorted(request.trace_context.items()))
            yield task_service_pb2.SubmitStreamReply(submitted=_submitted(request.task))

    async def answer(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        from chronoshard.v1 import task_service_pb2

        submitted = _submitted
        if method == "SubmitTask":
            return submitted(request)
        if method == "SubmitBatch":
            results = [
                task_service_pb2.SubmitBatchResult(submitted=submitted(item))
                for item in request.tasks
            ]
            return task_service_pb2.SubmitBatchResponse(results=results)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused by the probe")

    def metadata(self, method: str) -> list[list[tuple[str, str]]]:
        return [metadata for name, metadata in self.seen if name == method]


def _submitted(item: Any) -> Any:
    """The answer to a SubmitTaskRequest: a task as the node would describe it."""
    from chronoshard.v1 import common_pb2, task_service_pb2

    task = common_pb2.Task(
        id=str(uuid.uuid4()),
        tenant_id=TENANT,
        type=item.type,
        status=common_pb2.TASK_STATUS_SCHEDULED,
        queue=item.queue or "default",
    )
    task.scheduled_at.GetCurrentTime()
    task.due_at.GetCurrentTime()
    return task_service_pb2.SubmitTaskResponse(task=task, created=True)


async def serve(recorder: Recorder) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([recorder.handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _submit_all(target: str) -> dict[str, Any]:
    """One SubmitTask, one SubmitBatch of two and one (refused) CreateWorkflow through
    a SyncClient, as a user's blocking code would call it."""
    from chronoshard import ChronoshardError, SyncClient, TaskSpec, WorkflowTask

    out: dict[str, Any] = {}
    with SyncClient(target, api_key=API_KEY) as client:
        out["task_id"] = client.submit("probe.type", {"n": 1}, queue="probe-q").task.id
        specs = [TaskSpec(type="probe.type", payload={"n": i}, queue="probe-q") for i in (2, 3)]
        client.submit_batch(specs)
        try:
            client.create_workflow(
                "probe-flow", [WorkflowTask("a", TaskSpec(type="probe.a"))], delay_s=1
            )
        except ChronoshardError as exc:
            out["workflow_error"] = type(exc).__name__
    return out


async def _submit_on_a_stream(target: str) -> str:
    """One submit on a SubmitStream (Client.submit_stream); the task id answered."""
    from chronoshard import Client, TaskSpec

    async with Client(target, api_key=API_KEY) as client, client.submit_stream() as stream:
        result = await stream.submit(TaskSpec("probe.streamed", {"n": 4}, queue="probe-q"))
    return str(result.task.id)


async def _client_calls() -> tuple[Recorder, dict[str, Any]]:
    recorder = Recorder()
    server, target = await serve(recorder)
    try:
        out = await asyncio.to_thread(_submit_all, target)
        out["streamed_id"] = await _submit_on_a_stream(target)
    finally:
        await server.stop(grace=None)
    return recorder, out


async def _handler_runs(traceparent: str | None) -> dict[str, str]:
    """An async handler run with ``traceparent`` as its trace context, and a sync one
    with none that fails; each starts a span of its own inside."""
    from chronoshard import tracing
    from chronoshard.worker import TaskContext
    from chronoshard.worker.testing import TaskEnvironment

    def child(name: str) -> None:
        if tracing.AVAILABLE:
            from opentelemetry import trace

            with trace.get_tracer("probe.user").start_as_current_span(name):
                pass

    async def async_handler(ctx: TaskContext) -> dict[str, int]:
        child("probe.async-child")
        return {"attempt": ctx.attempt}

    def sync_handler(ctx: TaskContext) -> None:
        child("probe.sync-child")
        raise ValueError("boom")

    traced = {"traceparent": traceparent} if traceparent else {}
    first = await TaskEnvironment(
        {}, task_type="probe.async", trace_context=traced, queue="probe-q", attempt=2
    ).run(async_handler)
    second = await TaskEnvironment({}, task_type="probe.sync").run(sync_handler)
    return {"async": first.status, "sync": second.status}


def _spans(exporter: Any) -> list[dict[str, Any]]:
    def hex_ids(context: Any) -> list[str]:
        return [f"{context.trace_id:032x}", f"{context.span_id:016x}"]

    return [
        {
            "name": span.name,
            "kind": span.kind.name,
            "ids": hex_ids(span.context),
            "parent": None if span.parent is None else hex_ids(span.parent),
            "links": [hex_ids(link.context) for link in span.links],
            "attributes": dict(span.attributes or {}),
            "status": span.status.status_code.name,
            "description": span.status.description,
            "events": [
                {"name": event.name, **dict(event.attributes or {})} for event in span.events
            ],
            "start_ns": span.start_time,
            "scope": span.instrumentation_scope.name,
        }
        for span in exporter.get_finished_spans()
    ]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _capture_tracing_logs() -> _Lines:
    lines = _Lines()
    logger = logging.getLogger("chronoshard.tracing")
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    return lines


def absent() -> dict[str, Any]:
    sys.meta_path.insert(0, _NoOpenTelemetry())
    from chronoshard import tracing

    logs = _capture_tracing_logs()
    metadata = (("authorization", "Bearer x"),)
    out: dict[str, Any] = {
        "available": tracing.AVAILABLE,
        "enabled": tracing.enabled(),
        "inject_is_identity": tracing.inject(metadata) is metadata,
        "links": len(
            tracing.submit_links(
                {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
            )
        ),
        # The environment asks for OTLP (set by the test): one warning, no failure.
        "configured": tracing.configure_from_env("probe"),
    }
    recorder, calls = asyncio.run(_client_calls())
    out["calls"] = calls
    out["seen"] = recorder.seen
    out["streamed"] = recorder.streamed
    out["runs"] = asyncio.run(_handler_runs(None))
    out["logs"] = logs.lines
    out["opentelemetry_imported"] = any(m.startswith("opentelemetry") for m in sys.modules)
    return out


def sdk() -> dict[str, Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from chronoshard import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    # The environment asks for the console exporter (set by the test): the user's
    # provider must stay.
    out: dict[str, Any] = {
        "configured": tracing.configure_from_env("probe"),
        "kept_user_provider": trace.get_tracer_provider() is provider,
        "inject_outside_spans": list(tracing.inject((("authorization", "Bearer x"),))),
    }
    tracer = trace.get_tracer("probe.user")

    async def calls_in_a_request() -> tuple[Recorder, dict[str, Any]]:
        with tracer.start_as_current_span("probe.request"):
            return await _client_calls()

    recorder, calls = asyncio.run(calls_in_a_request())
    out["calls"] = calls
    out["seen"] = recorder.seen
    out["streamed"] = recorder.streamed
    submit = dict(recorder.metadata("SubmitTask")[0])
    out["runs"] = asyncio.run(_handler_runs(submit["traceparent"]))
    out["spans"] = _spans(exporter)
    return out


def configured() -> dict[str, Any]:
    from opentelemetry import trace

    from chronoshard import tracing

    logs = _capture_tracing_logs()
    out: dict[str, Any] = {"configured": tracing.configure_from_env("probe-service")}
    provider: Any = trace.get_tracer_provider()
    out["service_name"] = provider.resource.attributes.get("service.name")
    out["enabled"] = tracing.enabled()
    out["configured_again"] = tracing.configure_from_env("probe-service")
    with trace.get_tracer("probe.user").start_as_current_span("probe.flushed-at-shutdown"):
        pass
    tracing.shutdown()
    # The console exporter wrote the span to stdout, before this line if shutdown flushed.
    print("PROBE: after shutdown", flush=True)
    out["logs"] = logs.lines
    return out


SCENARIOS = {"absent": absent, "sdk": sdk, "configured": configured}

if __name__ == "__main__":
    scenario, out_path = sys.argv[1], sys.argv[2]
    result = SCENARIOS[scenario]()
    with open(out_path, "w") as out_file:
        json.dump(result, out_file)
