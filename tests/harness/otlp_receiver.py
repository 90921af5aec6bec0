"""An OTLP/gRPC trace receiver inside the test: what a collector is to a real deployment.

:class:`OtlpReceiver` serves ``opentelemetry.proto.collector.trace.v1.TraceService``
(``Export``, from the ``opentelemetry-proto`` package) on a free loopback port, on a
thread pool of its own (so it outlives any test's event loop), and keeps every span it
was sent, in arrival order, as a :class:`ReceivedSpan` with the ``service.name`` of the
process that sent it. Processes point at it with the standard variables
(:meth:`OtlpReceiver.env`); tests read the spans back with :meth:`OtlpReceiver.spans`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

SPAN_KIND = trace_pb2.Span.SpanKind
STATUS_CODE = trace_pb2.Status.StatusCode


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    scope: str
    name: str
    kind: int  # SPAN_KIND.SPAN_KIND_CONSUMER, ...
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    links: tuple[tuple[str, str], ...]  # (trace_id, span_id) of each link
    attributes: Mapping[str, Any]
    status_code: int  # STATUS_CODE.STATUS_CODE_ERROR, ...
    status_message: str
    events: tuple[tuple[str, Mapping[str, Any]], ...]
    start_ns: int
    end_ns: int


def _value(value: common_pb2.AnyValue) -> Any:
    which = value.WhichOneof("value")
    return None if which is None else getattr(value, which)


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            scope=scope_spans.scope.name,
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
                            attributes=_attributes(span.attributes),
                            status_code=span.status.code,
                            status_message=span.status.message,
                            events=tuple((e.name, _attributes(e.attributes)) for e in span.events),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        self._receiver._add(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, port: int) -> None:
        self.port = port
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, service_name: str | None = None) -> dict[str, str]:
        """The standard variables that make a process of ours export its spans here,
        soon after they end (a batch every 100 ms instead of the SDK's 5 s)."""
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        if service_name is not None:
            env["OTEL_SERVICE_NAME"] = service_name
        return env

    def _add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    server = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="otlp-receiver"))
    port = server.add_insecure_port("127.0.0.1:0")
    receiver = OtlpReceiver(port)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)
    server.start()
    try:
        yield receiver
    finally:
        server.stop(grace=None)
