"""OpenTelemetry across real processes: the submit's span, the node's dispatch span and the
worker's run span, joined by links, with the run two days after the submit (issue 17,
item 6; docs/tracing.md).

One scheduler node and one worker process (``tracing_workers.py``) run with the standard
``OTEL_*`` variables pointing at an OTLP receiver inside this test
(:mod:`harness.otlp_receiver`), so each configures itself as an operator would set it up
(``chronoshard.tracing.configure_from_env``). The client is a third process
(``tracing_client.py``) exporting to the same receiver, run under libfaketime two days in
the past: it submits ``tracing.traced`` and ``tracing.fails`` due now by the node's
clock, so its spans are stamped two days before the dispatch and the run. A third task is
submitted from this test process, which has no tracer provider: no trace context.

Once the tasks are settled the worker and the node are stopped (SIGTERM): their last
spans are flushed on the way out, so everything they recorded is in the receiver and the
absence of a span is a fact, not a matter of waiting longer.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fixtures.system import libfaketime
from fixtures.waiting import eventually
from harness.cluster import Cluster, running_cluster
from harness.otlp_receiver import SPAN_KIND, STATUS_CODE, OtlpReceiver, ReceivedSpan, otlp_receiver
from tracing_client import REQUEST_SPAN
from tracing_workers import HANDLER_SPAN

from chronoshard import Client, tracing
from chronoshard.services import EtcdProcess

E2E_DIR = Path(__file__).resolve().parent
NODE = "node-1"
WORKER_SERVICE = "tracing-e2e-worker"  # OTEL_SERVICE_NAME of the worker; the node sets none
DAYS_BEHIND = 2
ONE_DAY_NS = 86_400 * 10**9
# The instrumentation scopes of the client, the node and the worker SDK.
CLIENT = "chronoshard.client"
NODE_SCOPE = "chronoshard.scheduler"
WORKER_SCOPE = "chronoshard.worker"


@dataclass
class Run:
    receiver: OtlpReceiver
    cluster: Cluster
    ids: dict[str, str]  # "traced", "fails" (submitted two days behind), "untraced"
    rows: dict[str, tuple[str, int, int, str]]  # id -> (status, shard, fencing token, tenant)
    faked: bool  # the client ran under libfaketime

    def spans(
        self,
        *,
        name: str | None = None,
        kind: int | None = None,
        scope: str | None = None,
        attributes: Mapping[str, object] | None = None,
    ) -> list[ReceivedSpan]:
        """The received spans with that name, kind, scope and attributes (each if given)."""
        return [
            span
            for span in self.receiver.spans()
            if (name is None or span.name == name)
            and (kind is None or span.kind == kind)
            and (scope is None or span.scope == scope)
            and all(span.attributes.get(k) == v for k, v in (attributes or {}).items())
        ]

    def one(self, **where: Any) -> ReceivedSpan:
        found = self.spans(**where)
        assert len(found) == 1, (where, found)
        return found[0]

    def of(self, task: str) -> dict[str, object]:
        return {"messaging.message.id": self.ids[task]}

    def producer(self, task: str) -> ReceivedSpan:
        return self.one(kind=SPAN_KIND.SPAN_KIND_PRODUCER, scope=CLIENT, attributes=self.of(task))

    def dispatch(self, task: str) -> ReceivedSpan:
        return self.one(scope=NODE_SCOPE, attributes=self.of(task))

    def consumer(self, task: str) -> ReceivedSpan:
        return self.one(kind=SPAN_KIND.SPAN_KIND_CONSUMER, attributes=self.of(task))

    def handler_step(self, task: str) -> ReceivedSpan:
        return self.one(name=HANDLER_SPAN, attributes={"task_id": self.ids[task]})


def _statuses(dsn: str, ids: list[str]) -> dict[str, tuple[str, int, int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id::text, status, shard, fencing_token, tenant_id::text FROM tasks"
            " WHERE id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    return {row[0]: (row[1], row[2], row[3], row[4]) for row in rows}


def _submit_from_the_client_process(
    env: dict[str, str], target: str, api_key: str
) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(E2E_DIR / "tracing_client.py"), target, api_key],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    ids: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return ids


async def _submit_untraced(target: str, api_key: str) -> str:
    async with Client(target, api_key=api_key) as client:
        return (await client.submit("tracing.traced", {}, strict_timing=True)).task.id


@pytest.fixture(scope="module")
def run(db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    assert not tracing.enabled(), "the test process must have no tracer provider"
    try:
        faketime: Path | None = libfaketime()
    except pytest.skip.Exception:  # the days-apart test says so; the rest runs unfaked
        faketime = None
    with (
        otlp_receiver() as receiver,
        running_cluster(
            db_dsn,
            etcd.endpoint,
            tmp_path_factory.mktemp("tracing-logs"),
            nodes=1,
            workers=0,
            scheduler_env=receiver.env(),
        ) as cluster,
    ):
        worker = cluster.start_worker(
            "tracing-worker", "tracing_workers:worker", **receiver.env(WORKER_SERVICE)
        )
        target = cluster.nodes[NODE].address
        client_env = {**os.environ, **receiver.env()}
        if faketime is not None:
            client_env |= {
                "LD_PRELOAD": str(faketime),
                "FAKETIME": f"-{DAYS_BEHIND}d",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        ids = _submit_from_the_client_process(client_env, target, cluster.api_key)
        ids["untraced"] = asyncio.run(_submit_untraced(target, cluster.api_key))
        expected = {ids["traced"]: "COMPLETED", ids["fails"]: "DEAD_LETTER"}
        expected[ids["untraced"]] = "COMPLETED"

        def settled() -> dict[str, tuple[str, int, int, str]] | None:
            rows = _statuses(cluster.dsn, list(expected))
            done = {i: row for i, row in rows.items() if row[0] == expected[i]}
            return rows if len(done) == len(expected) else None

        try:
            rows = asyncio.run(eventually(settled, timeout_s=30, what="the three tasks settled"))
            # SIGTERM: each drains or stops, then flushes its spans (tracing.shutdown).
            assert worker.stop(timeout_s=30) == 0
            assert cluster.nodes[NODE].process.stop(timeout_s=30) == 0
        except AssertionError:
            print(cluster.logs())
            raise
        yield Run(receiver, cluster, ids, rows, faketime is not None)


def test_the_submit_is_a_producer_span_inside_the_callers_span(run: Run) -> None:
    for name in ("traced", "fails"):
        submit = run.producer(name)
        assert (submit.name, submit.service, submit.scope) == (
            f"submit tracing.{name}",
            "tracing-e2e-client",
            CLIENT,
        )
        request = run.one(name=REQUEST_SPAN)
        assert (submit.trace_id, submit.parent_span_id) == (request.trace_id, request.span_id)
        tenant = run.rows[run.ids[name]][3]
        assert {
            key: submit.attributes.get(key)
            for key in (
                "messaging.system",
                "messaging.operation.type",
                "messaging.destination.name",
                "chronoshard.task.type",
                "chronoshard.tenant",
            )
        } == {
            "messaging.system": "chronoshard",
            "messaging.operation.type": "send",
            "messaging.destination.name": "default",
            "chronoshard.task.type": f"tracing.{name}",
            "chronoshard.tenant": tenant,
        }


def test_the_node_records_each_dispatch_linked_to_its_submit(run: Run) -> None:
    for name in ("traced", "fails"):
        submit, dispatch = run.producer(name), run.dispatch(name)
        _, shard, token, tenant = run.rows[run.ids[name]]
        assert dispatch.name == f"dispatch tracing.{name}"
        # The node's own service name: configure_from_env's default, no OTEL_SERVICE_NAME.
        assert dispatch.service == "chronoshard-scheduler"
        assert dispatch.kind == SPAN_KIND.SPAN_KIND_PRODUCER
        assert dispatch.links == ((submit.trace_id, submit.span_id),)
        assert dispatch.parent_span_id == "" and dispatch.trace_id != submit.trace_id
        assert {
            key: dispatch.attributes.get(key)
            for key in (
                "chronoshard.task.attempt",
                "chronoshard.fencing_token",
                "chronoshard.shard",
                "chronoshard.tenant",
                "chronoshard.node",
                "chronoshard.outcome",
            )
        } == {
            "chronoshard.task.attempt": 1,
            "chronoshard.fencing_token": token,
            "chronoshard.shard": shard,
            "chronoshard.tenant": tenant,
            "chronoshard.node": NODE,
            "chronoshard.outcome": "sent",
        }
        assert dispatch.start_ns <= dispatch.end_ns


def test_the_run_is_a_consumer_span_linked_to_the_submit(run: Run) -> None:
    submit, consumer = run.producer("traced"), run.consumer("traced")
    _, _, token, tenant = run.rows[run.ids["traced"]]
    assert (consumer.name, consumer.service, consumer.scope) == (
        "process tracing.traced",
        WORKER_SERVICE,
        WORKER_SCOPE,
    )
    # A link, not a parent: the run starts a trace of its own.
    assert consumer.links == ((submit.trace_id, submit.span_id),)
    assert consumer.parent_span_id == "" and consumer.trace_id != submit.trace_id
    assert {
        key: consumer.attributes.get(key)
        for key in (
            "messaging.system",
            "messaging.operation.type",
            "messaging.destination.name",
            "messaging.message.id",
            "chronoshard.task.attempt",
            "chronoshard.tenant",
            "chronoshard.fencing_token",
            "chronoshard.outcome",
        )
    } == {
        "messaging.system": "chronoshard",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": run.ids["traced"],
        "chronoshard.task.attempt": 1,
        "chronoshard.tenant": tenant,
        "chronoshard.fencing_token": token,
        "chronoshard.outcome": "completed",
    }
    assert consumer.status_code == STATUS_CODE.STATUS_CODE_UNSET


def test_a_span_the_handler_starts_is_a_child_of_the_run_span(run: Run) -> None:
    consumer = run.consumer("traced")
    step = run.handler_step("traced")
    assert (step.trace_id, step.parent_span_id) == (consumer.trace_id, consumer.span_id)
    assert step.service == WORKER_SERVICE
    assert consumer.start_ns <= step.start_ns <= step.end_ns <= consumer.end_ns


def test_a_failed_run_records_its_exception_and_ends_in_error(run: Run) -> None:
    submit, consumer = run.producer("fails"), run.consumer("fails")
    assert consumer.links == ((submit.trace_id, submit.span_id),)
    assert consumer.status_code == STATUS_CODE.STATUS_CODE_ERROR
    assert consumer.status_message == "fails on purpose"
    assert consumer.attributes["error.type"] == "RuntimeError"
    [(event, attributes)] = consumer.events
    assert event == "exception" and attributes["exception.type"] == "RuntimeError"
    assert attributes["exception.message"] == "fails on purpose"


def test_the_link_joins_a_run_two_days_after_its_submit(run: Run) -> None:
    if not run.faked:
        libfaketime()  # skips (or fails where the tools are required) with the reason
    submit, dispatch, consumer = (
        run.producer("traced"),
        run.dispatch("traced"),
        run.consumer("traced"),
    )
    assert consumer.links == dispatch.links == ((submit.trace_id, submit.span_id),)
    # Stamped by their own processes' clocks: the submit two days behind the run.
    assert consumer.start_ns - submit.end_ns >= ONE_DAY_NS
    assert dispatch.start_ns - submit.end_ns >= ONE_DAY_NS
    assert consumer.start_ns - submit.start_ns < (DAYS_BEHIND + 1) * ONE_DAY_NS


def test_a_task_without_trace_context_runs_under_an_unlinked_span(run: Run) -> None:
    consumer = run.consumer("untraced")
    assert consumer.links == () and consumer.parent_span_id == ""
    assert consumer.attributes["chronoshard.outcome"] == "completed"
    assert run.handler_step("untraced").parent_span_id == consumer.span_id
    # The node traces only dispatches that carry a submit's context; its spans were
    # flushed when it stopped, so none is missing for lack of waiting.
    assert run.spans(scope=NODE_SCOPE, attributes=run.of("untraced")) == []
    assert len(run.spans(scope=NODE_SCOPE)) == 2
