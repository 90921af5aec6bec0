"""Handlers of the worker process of tests/e2e/test_tracing.py.

``tracing.traced`` starts a span of its own, as a user's handler would with its
module-level tracer (a proxy until ``chronoshard worker`` installs the provider from the
``OTEL_*`` environment): it must come out as a child of the run's CONSUMER span.
``tracing.fails`` raises, so its run's span must record the exception and say ERROR.
"""

from __future__ import annotations

from opentelemetry import trace

from chronoshard.worker import TaskContext, Worker

HANDLER_SPAN = "tracing.handler-step"

worker = Worker([], slots=4)
tracer = trace.get_tracer("tracing_workers")


@worker.task("tracing.traced")
async def traced(ctx: TaskContext) -> dict[str, int]:
    with tracer.start_as_current_span(HANDLER_SPAN) as span:
        span.set_attribute("task_id", str(ctx.task_id))
    return {"attempt": ctx.attempt}


@worker.task("tracing.fails")
async def fails(ctx: TaskContext) -> None:
    raise RuntimeError("fails on purpose")
