"""bench/heartbeats.py keeps working: a real scheduler process, tiny and fast."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from chronoshard.services import EtcdProcess

BENCH = Path(__file__).resolve().parents[2] / "bench" / "heartbeats.py"
TASKS = 60
WORKERS = 3
HEARTBEAT_S = 0.5


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    # Loaded by path: the repository root is not on sys.path under .venv/bin/pytest.
    spec = importlib.util.spec_from_file_location("bench_heartbeats_under_test", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_heartbeat_cost_is_measured_at_a_tiny_size(
    bench: ModuleType, fresh_db_dsn: str, etcd: EtcdProcess
) -> None:
    result = bench.run_benchmark(
        tasks=TASKS,
        workers=WORKERS,
        heartbeat_s=HEARTBEAT_S,
        lease_s=3.0,
        window_s=2.0,
        idle_window_s=1.0,
        warmup_s=0.0,
        dsn=fresh_db_dsn,
        etcd_endpoint=etcd.endpoint,
    )
    idle, running = result.windows
    assert (idle.phase, idle.running_tasks) == ("idle", 0)
    assert (running.phase, running.running_tasks) == ("running", TASKS)
    # Idle workers heartbeat an empty list: no statement, no lease.
    assert idle.heartbeat_statements_per_s == 0
    assert idle.leases_extended_per_s == 0
    # Every worker beats every interval; a batch never takes more than one statement.
    expected_beats = WORKERS / HEARTBEAT_S
    assert 0.5 * expected_beats <= running.heartbeats_per_s <= 1.5 * expected_beats
    assert 0 < running.heartbeat_statements_per_s <= running.heartbeats_per_s
    expected_leases = TASKS / HEARTBEAT_S
    assert 0.5 * expected_leases <= running.leases_extended_per_s <= 1.5 * expected_leases
    assert running.revoked == 0
    assert 0 <= running.cpu_percent < 200  # two cores at most
    assert running.transactions_per_s > 0

    table = bench.render_markdown(result, bench.machine(), "python bench/heartbeats.py --tiny")
    assert "Command: `python bench/heartbeats.py --tiny`" in table
    assert "| idle | 0 |" in table
    assert f"| running | {TASKS} |" in table


def test_process_cpu_reads_this_process(bench: ModuleType) -> None:
    before = bench.process_cpu_s(os.getpid())
    sum(i * i for i in range(200_000))  # burn a little CPU
    assert bench.process_cpu_s(os.getpid()) >= before > 0
