"""``chronoshard.tracing`` and what calls it, without a cluster (docs/tracing.md).

The scenarios that need OpenTelemetry missing, or a tracer provider set, run in
processes of their own (``tracing_probe.py``: a provider is global and set once, and it
would make every later test's calls carry a ``traceparent``), three at once; this module
judges what they report. This process has the API and the SDK installed and no provider,
the state of a user who installed the extra without configuring it. The same code paths
across real scheduler and worker processes: tests/e2e/test_tracing.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tracing_probe import API_KEY, TENANT, Recorder, serve

from chronoshard import Client, tracing

PROBE = Path(__file__).with_name("tracing_probe.py")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# What every call of the client carries, with tracing off.
PLAIN_KEYS = ["user-agent", "authorization"]

SCENARIO_ENV = {
    # Each asks for traces: absent must warn once, sdk must keep the user's provider,
    # configured must skip the exporter that does not exist.
    "absent": {"OTEL_TRACES_EXPORTER": "otlp"},
    "sdk": {"OTEL_TRACES_EXPORTER": "console"},
    "configured": {"OTEL_TRACES_EXPORTER": "console,nonexistent"},
}


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each scenario's report, and ``stdout`` (the console exporter writes there)."""
    out_dir = tmp_path_factory.mktemp("tracing-probes")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    running = {
        name: subprocess.Popen(
            [sys.executable, str(PROBE), name, str(out_dir / f"{name}.json")],
            env={**clean, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, env in SCENARIO_ENV.items()
    }
    reports = {}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, f"{name}:\n{stderr}"
        reports[name] = {**json.loads((out_dir / f"{name}.json").read_text()), "stdout": stdout}
    return reports


def _keys(metadata: list[list[str]]) -> list[str]:
    return [key for key, _ in metadata]


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, ["otlp_proto_grpc"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4317"}, ["otlp_proto_grpc"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_grpc"]),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            ["otlp_proto_http"],
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            },
            ["otlp_proto_grpc"],
        ),
        ({"OTEL_TRACES_EXPORTER": " console , otlp,console"}, ["console", "otlp_proto_grpc"]),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_the_environment_says_which_exporters(env: dict[str, str], exporters: list[str]) -> None:
    assert tracing.requested_exporters(env) == exporters


def test_without_opentelemetry_every_helper_is_a_no_op(probes: dict[str, Any]) -> None:
    absent = probes["absent"]
    assert (absent["available"], absent["enabled"]) == (False, False)
    assert absent["inject_is_identity"] and absent["links"] == 0
    assert absent["opentelemetry_imported"] is False


def test_without_opentelemetry_a_submit_sends_the_metadata_it_always_sent(
    probes: dict[str, Any],
) -> None:
    absent = probes["absent"]
    assert [method for method, _ in absent["seen"]] == [
        "SubmitTask",
        "SubmitBatch",
        "CreateWorkflow",
    ]
    for _, metadata in absent["seen"]:
        assert _keys(metadata) == PLAIN_KEYS
    assert absent["calls"]["workflow_error"] == "InvalidArgumentError"
    assert absent["streamed"] == [[]], "a streamed submit carries no trace context"
    assert absent["runs"] == {"async": "completed", "sync": "failed"}


def test_without_the_sdk_a_request_for_traces_is_one_warning(probes: dict[str, Any]) -> None:
    absent = probes["absent"]
    assert absent["configured"] is False
    [line] = absent["logs"]
    assert line.startswith("WARNING ") and "SDK is not installed" in line


async def test_without_a_tracer_provider_nothing_is_traced_or_sent() -> None:
    """The API (and the SDK) installed, no provider set: this test process."""
    assert tracing.AVAILABLE and not tracing.enabled()
    metadata = (("authorization", "Bearer x"),)
    assert tracing.inject(metadata) == metadata
    recorder = Recorder()
    server, target = await serve(recorder)
    try:
        async with Client(target, api_key=API_KEY) as client:
            await client.submit("probe.type", {})
    finally:
        await server.stop(grace=None)
    [(_, seen)] = recorder.seen
    assert _keys(seen) == PLAIN_KEYS


def test_links_come_only_from_a_valid_traceparent() -> None:
    [link] = tracing.submit_links({"traceparent": TRACEPARENT, "tracestate": "k=v"})
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == (
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "00f067aa0ba902b7",
    )
    assert link.context.is_remote and link.context.trace_state.get("k") == "v"
    assert tracing.submit_links({}) == []
    assert tracing.submit_links({"traceparent": "00-not-a-trace-01"}) == []


def _span(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [span] = [s for s in spans if s["name"] == name]
    return span


def test_the_users_own_provider_is_kept(probes: dict[str, Any]) -> None:
    sdk = probes["sdk"]
    assert sdk["configured"] is False and sdk["kept_user_provider"] is True
    # No current span: nothing to inject.
    assert sdk["inject_outside_spans"] == [["authorization", "Bearer x"]]


def _submit_span(spans: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], str, str]:
    """The client's PRODUCER span ``name``, a child of the probe's request span; with its
    trace and span ids."""
    span = _span(spans, name)
    assert (span["kind"], span["scope"]) == ("PRODUCER", "chronoshard.client")
    assert span["parent"] == _span(spans, "probe.request")["ids"], "the caller's span is the parent"
    trace_id, span_id = span["ids"]
    return span, trace_id, span_id


def test_each_submit_call_is_a_producer_span_whose_context_the_call_carries(
    probes: dict[str, Any],
) -> None:
    sdk = probes["sdk"]
    spans = sdk["spans"]
    by_method = dict(zip(("SubmitTask", "SubmitBatch", "CreateWorkflow"), sdk["seen"], strict=True))
    names = {
        "SubmitTask": "submit probe.type",
        "SubmitBatch": "submit_batch probe.type",
        "CreateWorkflow": "create_workflow",
    }
    for method, name in names.items():
        span, trace_id, span_id = _submit_span(spans, name)
        seen_method, metadata = by_method[method]
        assert seen_method == method
        # The same as without tracing, plus the span's own context; the flags are the
        # SDK's (sampled, and on newer SDKs the W3C "random" bit).
        assert [k for k in _keys(metadata) if k != "traceparent"] == PLAIN_KEYS
        [traceparent] = [value for key, value in metadata if key == "traceparent"]
        assert traceparent.startswith(f"00-{trace_id}-{span_id}-")
        attributes = span["attributes"]
        assert attributes["messaging.system"] == "chronoshard"
        assert attributes["messaging.operation.type"] == "send"
        assert attributes["messaging.destination.name"] == (
            "default" if method == "CreateWorkflow" else "probe-q"
        )
    submit = _span(spans, "submit probe.type")["attributes"]
    assert submit["messaging.message.id"] == sdk["calls"]["task_id"]
    assert submit["chronoshard.tenant"] == TENANT
    assert (
        _span(spans, "submit_batch probe.type")["attributes"]["messaging.batch.message_count"] == 2
    )
    workflow = _span(spans, "create_workflow")
    assert workflow["attributes"]["chronoshard.workflow.name"] == "probe-flow"
    assert workflow["status"] == "ERROR"
    assert [e["exception.type"] for e in workflow["events"]] == [
        "chronoshard.errors.InvalidArgumentError"
    ]


def test_a_streamed_submit_is_a_producer_span_whose_context_its_request_carries(
    probes: dict[str, Any],
) -> None:
    sdk = probes["sdk"]
    span, trace_id, span_id = _submit_span(sdk["spans"], "submit probe.streamed")
    [carried] = sdk["streamed"]
    assert [key for key, _ in carried] == ["traceparent"]
    assert carried[0][1].startswith(f"00-{trace_id}-{span_id}-")
    attributes = span["attributes"]
    assert attributes["messaging.operation.name"] == "submit"
    assert attributes["messaging.destination.name"] == "probe-q"
    assert attributes["messaging.message.id"] == sdk["calls"]["streamed_id"]
    assert attributes["chronoshard.tenant"] == TENANT


def test_a_run_is_a_consumer_span_linked_to_the_submit_and_current_for_the_handler(
    probes: dict[str, Any],
) -> None:
    sdk = probes["sdk"]
    spans = sdk["spans"]
    submit = _span(spans, "submit probe.type")
    run = _span(spans, "process probe.async")
    assert (run["kind"], run["scope"], run["parent"]) == ("CONSUMER", "chronoshard.worker", None)
    assert run["links"] == [submit["ids"]]
    assert run["status"] == "UNSET" and run["attributes"]["chronoshard.outcome"] == "completed"
    assert {
        k: run["attributes"][k] for k in ("chronoshard.task.attempt", "messaging.operation.type")
    } == {
        "chronoshard.task.attempt": 2,
        "messaging.operation.type": "process",
    }
    assert _span(spans, "probe.async-child")["parent"] == run["ids"]


def test_a_failing_sync_handler_records_its_exception_under_an_unlinked_span(
    probes: dict[str, Any],
) -> None:
    spans = probes["sdk"]["spans"]
    run = _span(spans, "process probe.sync")
    assert run["links"] == [] and run["parent"] is None
    assert (run["status"], run["description"]) == ("ERROR", "boom")
    assert run["attributes"]["error.type"] == "ValueError"
    [event] = run["events"]
    assert (event["name"], event["exception.type"], event["exception.message"]) == (
        "exception",
        "ValueError",
        "boom",
    )
    # The handler's thread ran with the run's span current.
    assert _span(spans, "probe.sync-child")["parent"] == run["ids"]


def test_configure_from_env_installs_a_provider_once_and_shutdown_flushes_it(
    probes: dict[str, Any],
) -> None:
    configured = probes["configured"]
    assert configured["configured"] is True and configured["enabled"] is True
    assert configured["configured_again"] is False
    assert configured["service_name"] == "probe-service"
    assert configured["logs"][0] == (
        "WARNING no OpenTelemetry span exporter named 'nonexistent' is installed; skipped"
    )
    # The console exporter printed the span before the line printed after shutdown().
    stdout = configured["stdout"]
    assert '"name": "probe.flushed-at-shutdown"' in stdout.split("PROBE: after shutdown")[0]
