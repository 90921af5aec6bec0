"""bench/wheel.py keeps working: run it at a tiny size, as a function and as a command."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "wheel.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    # Loaded by path: the repository root is not on sys.path under .venv/bin/pytest
    # (and must not be, see scripts/test.sh), so `import bench.wheel` is not available.
    spec = importlib.util.spec_from_file_location("bench_wheel_under_test", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_run_benchmark_at_a_tiny_size(bench: ModuleType) -> None:
    results = bench.run_benchmark([1000], repeat=1, seed=7)
    assert [(r.structure, r.timers) for r in results] == [("wheel", 1000), ("heapq", 1000)]
    for result in results:
        assert result.fired == 500  # half were cancelled
        assert result.wakeups >= 1
        assert min(result.insert_s, result.cancel_s, result.drain_s) >= 0
        # A tuple, a sequence number and index slots at least; far below a kilobyte.
        assert 50 < result.bytes_per_timer < 1000


def test_main_prints_the_table_and_writes_json(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "wheel.json"
    assert bench.main(["--sizes", "1000", "--repeat", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "python bench/wheel.py --sizes 1000 --repeat 1 --json" in printed
    assert "| timers | structure |" in printed
    assert "| 1,000 | wheel |" in printed
    assert "| 1,000 | heapq |" in printed
    document = json.loads(out.read_text())
    assert document["benchmark"] == "wheel"
    assert set(document["machine"]) == {"platform", "cpu", "cores", "python"}
    assert [r["structure"] for r in document["results"]] == ["wheel", "heapq"]
