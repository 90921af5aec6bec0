"""OpenTelemetry tracing when it is installed (the ``otel`` extra), nothing when it is not.

This is the one module that imports ``opentelemetry``; the client, the node's dispatcher
and the worker SDK ask it for spans. Without the package every helper is a no-op and
:func:`enabled` is one boolean test, so a process without OpenTelemetry does no per-call
work for tracing and sends exactly the metadata it always sent. With the API but no
configured SDK (the global tracer provider is still the API's proxy or no-op one),
:func:`enabled` is False too and callers skip building span names and attributes.

What is traced (docs/tracing.md has the names and attributes):

* the client: a PRODUCER span per submit call (``SubmitTask``, ``SubmitBatch``,
  ``CreateWorkflow``), whose context goes into the call's gRPC metadata through the
  global propagator (:func:`inject`; W3C ``traceparent`` by default, so a user's
  configured propagator is honoured). The node stores the W3C ``traceparent`` and
  ``tracestate`` as the task's ``trace_context``;
* the node: a span per dispatched attempt that carries a trace context
  (:func:`record_span`), from its intent's commit to the assignment's send;
* the worker: a CONSUMER span per handler run (:func:`start_span`, made current for the
  handler by :func:`enter_span`, ended by :func:`end_span`).

The node's and the worker's spans are *linked* to the submit's span, not its children
(:func:`submit_links`): a run may come days after the submit, whose trace is long
finished by then, and a retry is a run of its own; a child would stretch the submit's
trace over days and make its duration meaningless.

Processes we own (the scheduler node, the watchdog, ``chronoshard worker``) call
:func:`configure_from_env` at start and :func:`shutdown` on their way out: with the SDK
installed and the standard ``OTEL_*`` variables asking for traces, it installs a tracer
provider that exports with a batch span processor. Library use (a user's own process
running a Worker or a Client) never calls it, so a provider the user set is theirs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from chronoshard import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
    """The OpenTelemetry API is importable."""
except ImportError:  # the otel extra is not installed: every helper below is a no-op
    AVAILABLE = False

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, Span, Tracer

__all__ = [
    "AVAILABLE",
    "Attributes",
    "configure_from_env",
    "enabled",
    "end_span",
    "enter_span",
    "inject",
    "producer_span",
    "record_span",
    "shutdown",
    "start_span",
    "submit_links",
]

log = logging.getLogger(__name__)

Attributes = Mapping[str, str | bool | int | float]

MESSAGING_SYSTEM = "chronoshard"
"""``messaging.system`` of every span here (messaging semantic conventions)."""

# Span kinds by name, so callers need not import opentelemetry to say which they want.
PRODUCER = "producer"
CONSUMER = "consumer"

_W3C = TraceContextTextMapPropagator() if AVAILABLE else None
_tracers: dict[str, Tracer] = {}
_installed: TracerProvider | None = None
"""The provider :func:`configure_from_env` installed (None: none, or the user's)."""


def enabled() -> bool:
    """Whether spans are recorded anywhere: the API is installed and a real tracer
    provider was set (by :func:`configure_from_env` or by the user). Cheap enough to ask
    per call; False means: build no span, no attributes, change no metadata."""
    if not AVAILABLE:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _tracer(name: str) -> Tracer:
    tracer = _tracers.get(name)
    if tracer is None:
        tracer = _tracers[name] = trace.get_tracer(name, __version__)
    return tracer


def _kind(kind: str) -> trace.SpanKind:
    return trace.SpanKind.PRODUCER if kind == PRODUCER else trace.SpanKind.CONSUMER


# ---- the client ------------------------------------------------------------------------


@contextmanager
def producer_span(tracer_name: str, name: str, attributes: Attributes) -> Iterator[Span]:
    """A PRODUCER span, current for the block (so :func:`inject` carries it); an
    exception leaving the block is recorded and sets the status to ERROR. Only when
    :func:`enabled`."""
    with _tracer(tracer_name).start_as_current_span(
        name, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        yield span


def inject(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """``metadata`` plus the current trace context, as the global propagator writes it
    (``traceparent``/``tracestate`` with the default W3C one). gRPC wants lower-case keys.
    Unchanged when OpenTelemetry is absent or there is no current span."""
    if not AVAILABLE:
        return metadata
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return metadata + tuple((key.lower(), value) for key, value in carrier.items())


# ---- the node and the worker -------------------------------------------------------------


def submit_links(trace_context: Mapping[str, str]) -> list[Link]:
    """A link to the submit's span when ``trace_context`` (a task's, as the node stored
    it) holds a valid ``traceparent``; none otherwise. Read with the W3C propagator
    whatever the global one is: the node stores W3C fields only."""
    if not AVAILABLE or not trace_context:
        return []
    assert _W3C is not None
    submitted = trace.get_current_span(_W3C.extract(trace_context)).get_span_context()
    return [trace.Link(submitted)] if submitted.is_valid else []


def start_span(
    tracer_name: str,
    name: str,
    kind: str,
    attributes: Attributes,
    trace_context: Mapping[str, str],
    *,
    start_time_ns: int | None = None,
) -> Span:
    """A new root span of ``kind`` (:data:`PRODUCER` or :data:`CONSUMER`) linked to the
    submit of ``trace_context``; not current anywhere (see :func:`enter_span`). Only
    when :func:`enabled`."""
    return _tracer(tracer_name).start_span(
        name,
        # An empty context: a root, whatever span is current where this runs (a worker
        # started inside a user's span must not adopt every run into it).
        context=otel_context.Context(),
        kind=_kind(kind),
        attributes=attributes,
        links=submit_links(trace_context),
        start_time=start_time_ns,
    )


def enter_span(span: Span) -> None:
    """Make ``span`` current in the running ``contextvars`` context, for good: call it in
    a copy made for one task or thread (``contextvars.copy_context().run``), which is
    dropped with it, so there is nothing to detach."""
    otel_context.attach(trace.set_span_in_context(span))


def end_span(
    span: Span,
    outcome: str,
    *,
    error_type: str | None = None,
    message: str = "",
    exception: BaseException | None = None,
    end_time_ns: int | None = None,
) -> None:
    """End ``span``, saying how its operation ended: ``chronoshard.outcome``, and for an
    error its ``error.type``, the exception (as a span event) and status ERROR."""
    span.set_attribute("chronoshard.outcome", outcome)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        if exception is not None:
            span.record_exception(exception)
        span.set_status(trace.Status(trace.StatusCode.ERROR, message or error_type))
    span.end(end_time=end_time_ns)


def record_span(
    tracer_name: str,
    name: str,
    kind: str,
    attributes: Attributes,
    trace_context: Mapping[str, str],
    *,
    start_time_ns: int,
    outcome: str,
    error_type: str | None = None,
    message: str = "",
) -> None:
    """A span of an operation that already happened, from ``start_time_ns`` to now.
    Only when :func:`enabled`."""
    span = start_span(
        tracer_name, name, kind, attributes, trace_context, start_time_ns=start_time_ns
    )
    end_span(span, outcome, error_type=error_type, message=message)


# ---- processes we own ---------------------------------------------------------------------

_OTLP_NAMES = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def requested_exporters(environ: Mapping[str, str] | None = None) -> list[str]:
    """The span exporters the standard variables ask for, by entry-point name
    (``opentelemetry_traces_exporter``); empty: tracing is off.

    ``OTEL_TRACES_EXPORTER`` names them (``otlp``, ``console``, comma-separated;
    ``none``: off); unset, an ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``)
    asks for ``otlp``. ``otlp`` means gRPC unless ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``
    says ``http/protobuf``, as the SDK reads it. Deliberately not the specification's
    default of ``otlp`` with nothing set: a node would then send spans to
    ``localhost:4317`` (and log its failures) wherever nobody asked for traces.
    ``OTEL_SDK_DISABLED=true`` turns everything off.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        names = "otlp" if any(env.get(v, "").strip() for v in endpoints) else ""
    if names.lower() == "none":
        return []
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    ) or "grpc"
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if name == "otlp":
            name = _OTLP_NAMES.get(protocol.strip(), name)
        if name and name != "none" and name not in chosen:
            chosen.append(name)
    return chosen


def configure_from_env(service_name: str) -> bool:
    """Install a tracer provider exporting spans as the ``OTEL_*`` variables ask
    (:func:`requested_exporters`); whether it did. For our own processes' entry points.

    The SDK reads the rest itself: the resource (``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``; ``service_name`` when they name no service), the
    sampler (``OTEL_TRACES_SAMPLER``), the batch processor (``OTEL_BSP_*``) and each
    exporter its own (``OTEL_EXPORTER_OTLP_*``). A provider set already (by the user,
    or ``OTEL_PYTHON_TRACER_PROVIDER``) is left alone. When the variables ask for traces
    and the SDK is missing, one warning says so; nothing fails.
    """
    global _installed
    names = requested_exporters()
    if not names or enabled():
        return False
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    except ImportError:
        log.warning(
            "the OTEL_* environment asks for traces (exporters: %s) but the OpenTelemetry "
            "SDK is not installed (pip install 'chronoshard[otel]'); tracing is off",
            ", ".join(names),
        )
        return False
    exporters: list[SpanExporter] = []
    for name in names:
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            log.warning("no OpenTelemetry span exporter named %r is installed; skipped", name)
            continue
        try:
            exporters.append(found[0].load()())
        except Exception as exc:  # a misconfigured exporter must not stop the process
            log.warning("cannot start the OpenTelemetry span exporter %r: %s", name, exc)
    if not exporters:
        return False
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _installed = provider
    log.info(
        "tracing on",
        extra={"service": resource.attributes.get(SERVICE_NAME), "exporters": names},
    )
    return True


def shutdown() -> None:
    """Flush and stop what :func:`configure_from_env` installed (a no-op otherwise), so
    the last spans of a stopping process are exported."""
    global _installed
    provider, _installed = _installed, None
    if provider is not None:
        provider.shutdown()
