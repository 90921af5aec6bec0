"""Submit throughput: many clients each calling SubmitTask, and SubmitBatch of 1,000.

Both run the public asyncio client in this process against one scheduler process on a
fresh database; no workers. Tasks are due two hours out, past the preloader's lookahead,
so what is measured is the submit path alone: authenticate, validate, insert (with the
idempotency-key table and partition routing), commit, answer. A call counts once its
answer arrived, and the server answers only after the commit, so every counted task is
durable; the run ends by checking that the database holds exactly as many tasks as were
acknowledged.

* ``submit-single``: ``--clients`` concurrent callers, each submitting one task at a time
  back to back for ``--duration-s`` (after a warm-up of one second that is not counted);
  tasks/s and the ack latency (call to answer) p50/p99/max.
* ``submit-batch``: ``--tasks`` tasks in SubmitBatch calls of ``--batch``, ``--concurrency``
  calls in flight; tasks/s and the latency of one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import psycopg
import uvloop

from bench import _floor_server
from bench._cluster import Infrastructure, Node, cpu_by_pid, node, postgres_pids, process_cpu_s
from bench._report import Report, Target, ms, percentile
from chronoshard import Client, SubmitResult, TaskSpec
from chronoshard._convert import submit_request, submit_result_from_pb
from chronoshard._dev.processes import free_ports
from chronoshard.v1 import task_service_pb2

FAR_OUT = timedelta(hours=2)
WARMUP_S = 1.0
SINGLE_TARGET_TPS = 2000.0
SINGLE_TARGET_P99_S = 0.025
BATCH_TARGET_TPS = 20_000.0


class Cpu(NamedTuple):
    """CPU seconds of the scheduler, of this (the clients') process, and of PostgreSQL."""

    scheduler: float
    client: float
    postgres: float

    def __sub__(self, other: object) -> Cpu:
        assert isinstance(other, Cpu)
        return Cpu(*(a - b for a, b in zip(self, other, strict=True)))


def _cpu(n: Node) -> Cpu:
    return Cpu(
        process_cpu_s(n.pid),
        process_cpu_s(os.getpid()),
        sum(cpu_by_pid(postgres_pids(n.dsn)).values()),
    )


def _task_count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM tasks").fetchone()
    return 0 if row is None else int(row[0])


class _Window:
    """Callers that each submit one task at a time until the window stops them, and the
    latency of every submit answered inside the measured part (after a warm-up)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.measuring = False
        self.stopped = False

    def record(self, started: float) -> None:
        if self.measuring:
            self.latencies.append(time.perf_counter() - started)

    async def run(
        self,
        callers: Iterable[Coroutine[Any, Any, None]],
        duration_s: float,
        cpu_now: Callable[[], Cpu],
    ) -> tuple[int, list[float], float, Cpu]:
        """(acknowledged, latencies of the measured window, window seconds, CPU s used)."""
        runners = [asyncio.create_task(caller) for caller in callers]
        try:
            await asyncio.sleep(WARMUP_S)
            self.measuring, cpu0, t0 = True, cpu_now(), time.perf_counter()
            await asyncio.sleep(duration_s)
            self.measuring, elapsed, cpu = False, time.perf_counter() - t0, cpu_now() - cpu0
        finally:
            self.stopped = True
            await asyncio.gather(*runners)
        return len(self.latencies), self.latencies, elapsed, cpu


async def _single_clients(
    address: str,
    api_key: str,
    clients: int,
    duration_s: float,
    cpu_now: Callable[[], Cpu],
    *,
    stream: bool = False,
) -> tuple[int, list[float], float, Cpu]:
    """``clients`` callers of the public client (:meth:`_Window.run`'s figures). With
    ``stream``, each caller sends its submits on a ``SubmitStream`` of its own."""
    channels = [Client(address, api_key=api_key, max_in_flight=clients) for _ in range(4)]
    window = _Window()
    at = datetime.now(UTC) + FAR_OUT

    async def one_client(client: Client, index: int) -> None:
        async with contextlib.AsyncExitStack() as exits:
            if stream:
                on_stream = await exits.enter_async_context(client.submit_stream())
            await submits(client, on_stream.submit if stream else None, index)

    async def submits(
        client: Client, send: Callable[[TaskSpec], Awaitable[SubmitResult]] | None, index: int
    ) -> None:
        i = 0
        while not window.stopped:
            started = time.perf_counter()
            if send is None:
                await client.submit("bench.noop", {"c": index, "i": i}, at=at)
            else:
                await send(TaskSpec("bench.noop", {"c": index, "i": i}, at=at))
            window.record(started)
            i += 1

    try:
        callers = (one_client(channels[i % len(channels)], i) for i in range(clients))
        return await window.run(callers, duration_s, cpu_now)
    finally:
        for client in channels:
            await client.close()


async def _stream_callers(
    address: str, clients: int, duration_s: float, cpu_now: Callable[[], Cpu]
) -> tuple[int, list[float], float, Cpu]:
    """``_single_clients``' callers on the floor server's stream (``submit-floor --stream``):
    each caller holds one bidirectional stream and sends one request at a time on it,
    building the request and reading the answer as the client's ``submit`` does (the same
    conversions), so what differs from the unary callers is the hop alone."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(4)]
    window = _Window()
    at = datetime.now(UTC) + FAR_OUT

    async def one_caller(channel: grpc.aio.Channel, index: int) -> None:
        call = channel.stream_stream(
            _floor_server.STREAM_METHOD,
            request_serializer=task_service_pb2.SubmitTaskRequest.SerializeToString,
            response_deserializer=task_service_pb2.SubmitTaskResponse.FromString,
        )()
        i = 0
        while not window.stopped:
            started = time.perf_counter()
            await call.write(submit_request(TaskSpec("bench.noop", {"c": index, "i": i}, at=at)))
            answer = await call.read()
            if not isinstance(answer, task_service_pb2.SubmitTaskResponse):
                raise RuntimeError(f"the floor stream ended: {answer!r}")
            submit_result_from_pb(answer)
            window.record(started)
            i += 1
        await call.done_writing()

    try:
        callers = (one_caller(channels[i % len(channels)], i) for i in range(clients))
        return await window.run(callers, duration_s, cpu_now)
    finally:
        for channel in channels:
            await channel.close()


def _cpu_cell(cpu: Iterable[float], elapsed: float) -> str:
    """Each as a percentage of one core over the window."""
    return " / ".join(f"{100 * c / elapsed:.0f}" for c in cpu)


def _latency_cells(what: str, latencies: list[float]) -> dict[str, str]:
    return {
        f"{what} p50": ms(percentile(latencies, 50)),
        f"{what} p99": ms(percentile(latencies, 99)),
        f"{what} max": ms(max(latencies, default=float("nan"))),
    }


def submit_single(
    infra: Infrastructure, clients: int, duration_s: float, *, stream: bool = False
) -> Report:
    with node(infra, "submit_single") as n:
        acked, latencies, elapsed, cpu = uvloop.run(
            _single_clients(
                n.address, n.api_key, clients, duration_s, lambda: _cpu(n), stream=stream
            )
        )
        stored = _task_count(n.dsn)
    tps = acked / elapsed
    p99 = percentile(latencies, 99)
    row = {
        "clients": clients,
        "submits": "a SubmitStream each" if stream else "SubmitTask calls",
        "acknowledged": acked,
        "tasks/s": tps,
        **_latency_cells("ack", latencies),
        "CPU % sched / client / PG": _cpu_cell(cpu, elapsed),
    }
    return Report(
        workload="submit-single",
        command="",
        parameters={
            "clients": clients,
            "duration_s": duration_s,
            "warmup_s": WARMUP_S,
            "stream": stream,
        },
        columns=list(row),
        rows=[row],
        targets=[
            Target("submit-single ≥ 2,000 tasks/s", tps >= SINGLE_TARGET_TPS, f"{tps:,.0f}/s"),
            Target("submit-single p99 ack ≤ 25 ms", p99 <= SINGLE_TARGET_P99_S, ms(p99)),
        ],
        notes=[
            f"{stored:,} tasks stored (acknowledged in the window plus warm-up and tail: "
            "every acknowledged task is a committed row)."
        ],
    )


def submit_floor(clients: int, duration_s: float, *, stream: bool = False) -> Report:
    """``submit-single``'s clients against ``bench._floor_server``: SubmitTask over gRPC
    with nothing behind it (that module's docstring), the same rows as ``submit-single``
    (the PostgreSQL column is 0: there is none). With ``stream``, the same requests and
    answers on one bidirectional stream per caller instead of a unary call each."""
    port = free_ports(1)[0]
    with subprocess.Popen(
        [sys.executable, "-m", "bench._floor_server", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    ) as server:
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "serving":
                raise RuntimeError(f"the floor server did not start (exit code {server.poll()})")

            def cpu_now() -> Cpu:
                return Cpu(process_cpu_s(server.pid), process_cpu_s(os.getpid()), 0.0)

            address = f"127.0.0.1:{port}"
            acked, latencies, elapsed, cpu = uvloop.run(
                _stream_callers(address, clients, duration_s, cpu_now)
                if stream
                else _single_clients(address, "floor", clients, duration_s, cpu_now)
            )
        finally:
            server.terminate()
            server.wait(timeout=10)
    row = {
        "clients": clients,
        "calls": "a stream each" if stream else "unary",
        "answered": acked,
        "calls/s": acked / elapsed,
        **_latency_cells("call", latencies),
        "server CPU ms per call": f"{1000 * cpu.scheduler / max(acked, 1):.3f}",
        "CPU % server / client": _cpu_cell((cpu.scheduler, cpu.client), elapsed),
    }
    return Report(
        workload="submit-floor",
        command="",
        parameters={
            "clients": clients,
            "duration_s": duration_s,
            "warmup_s": WARMUP_S,
            "stream": stream,
        },
        columns=list(row),
        rows=[row],
        targets=[],
        notes=[
            "SubmitTask answered by a grpc.aio server that does nothing else "
            "(bench/_floor_server.py): the gRPC hop alone, on this machine."
            + (
                " Each caller sends its requests one at a time on its own bidirectional "
                "stream (chronoshard.bench.Floor/SubmitStream, not part of the API)."
                if stream
                else ""
            )
        ],
    )


async def _batches(
    n: Node, tasks: int, batch: int, concurrency: int
) -> tuple[int, list[float], float, Cpu]:
    at = datetime.now(UTC) + FAR_OUT
    specs = [TaskSpec(type="bench.noop", payload={"i": i}, at=at) for i in range(tasks)]
    chunks = [specs[i : i + batch] for i in range(0, tasks, batch)]
    latencies: list[float] = []
    acked = 0
    async with Client(n.address, api_key=n.api_key) as client:
        # One small call first: the channel is connected before the clock starts.
        await client.submit("bench.noop", {"warmup": True}, at=at)
        queue = list(reversed(chunks))

        async def caller() -> None:
            nonlocal acked
            while queue:
                chunk = queue.pop()
                started = time.perf_counter()
                results = await client.submit_batch(chunk)
                latencies.append(time.perf_counter() - started)
                failed = [r for r in results if not isinstance(r, SubmitResult)]
                if failed:
                    raise RuntimeError(f"{len(failed)} items of a batch failed: {failed[0]}")
                acked += len(results)

        cpu0, t0 = _cpu(n), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - t0, _cpu(n) - cpu0
    return acked, latencies, elapsed, cpu


def submit_batch(infra: Infrastructure, tasks: int, batch: int, concurrency: int) -> Report:
    with node(infra, "submit_batch") as n:
        acked, latencies, elapsed, cpu = uvloop.run(_batches(n, tasks, batch, concurrency))
        stored = _task_count(n.dsn) - 1  # the warm-up task
    tps = acked / elapsed
    row = {
        "tasks": acked,
        "batch": batch,
        "calls in flight": concurrency,
        "seconds": elapsed,
        "tasks/s": tps,
        "call p50": ms(percentile(latencies, 50)),
        "call p99": ms(percentile(latencies, 99)),
        "CPU % sched / client / PG": _cpu_cell(cpu, elapsed),
        "rows stored": stored,
    }
    return Report(
        workload="submit-batch",
        command="",
        parameters={"tasks": tasks, "batch": batch, "concurrency": concurrency},
        columns=list(row),
        rows=[row],
        targets=[
            Target(
                "submit-batch ≥ 20,000 tasks/s durable",
                tps >= BATCH_TARGET_TPS and stored == acked,
                f"{tps:,.0f}/s",
            )
        ],
    )
