"""bench/reconcile.py keeps working: run it at a tiny size against the test database."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fixtures.databases import database_from_template

from chronoshard.services import PostgresServer

BENCH = Path(__file__).resolve().parents[2] / "bench" / "reconcile.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    # Loaded by path: the repository root is not on sys.path under .venv/bin/pytest.
    spec = importlib.util.spec_from_file_location("bench_reconcile_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_run_benchmark_at_a_tiny_size(
    bench: ModuleType, fresh_db_dsn: str, postgres_server: PostgresServer, template_database: str
) -> None:
    live = bench.LiveSet(running=20, held=6, repaired=4, scheduled=30, runs=3, preload_limit=25)
    with database_from_template(postgres_server, template_database) as control_dsn:
        results = bench.run_benchmark(fresh_db_dsn, control_dsn, [300, 600], passes=2, live=live)
    assert [r.history_rows for r in results] == [300, 600]
    for result in results:
        # Every pass did the same work: read the expired rows, repaired and held them.
        assert (result.examined, result.repaired, result.held) == (10, 4, 6)
        assert result.preloaded == 25
        # Tables this small are read whole by any planner: the plan is only reported
        # (tests/integration/test_reconcile_sql.py asserts index use at a real size).
        assert isinstance(result.reconcile_indexes, list)
        assert isinstance(result.sequential_scans, list)
        assert result.reconcile_median_ms > 0 and result.preload_median_ms > 0
        assert result.reconcile_ratio > 0 and result.preload_ratio > 0
    table = bench.render(results, "python bench/reconcile.py --sizes 300,600", live, 2)
    assert "| 300 |" in table and "| 600 |" in table
    assert "Largest change of the ratio to no history" in table
