"""The benchmark suite keeps working: every workload of ``python -m bench`` at a tiny size.

The workloads run in this process through the suite's entry point (``bench.__main__.main``)
against the session's PostgreSQL and etcd, each starting its own scheduler (and worker)
processes on a fresh database, exactly as a full run does. What is checked is that each
one finishes, prints its table with the machine and parameters, writes its JSON, and (for
those that check it) lost and doubled nothing. The numbers themselves are not judged:
at this size and on a shared machine they mean nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from chronoshard.services import EtcdProcess, PostgresServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_main() -> Iterator[ModuleType]:
    # The repository root is not on sys.path under .venv/bin/pytest, so the `bench`
    # package is loaded from its directory and registered under its own name.
    spec = importlib.util.spec_from_file_location(
        "bench", REPO / "bench" / "__init__.py", submodule_search_locations=[str(REPO / "bench")]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = package
    try:
        spec.loader.exec_module(package)
        yield importlib.import_module("bench.__main__")
    finally:
        for name in [n for n in sys.modules if n == "bench" or n.startswith("bench.")]:
            del sys.modules[name]


def run(
    bench_main: ModuleType,
    argv: list[str],
    server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "report.json"
    common = ["--dsn", server.admin_dsn, "--etcd", etcd.endpoint, "--json", str(out)]
    assert bench_main.main([*argv, *common]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["workload"] == argv[0]
    assert report["command"].startswith(f"python -m bench {argv[0]}")
    assert {"cpu", "cores", "python", "postgresql", "etcd"} <= set(report["machine"])
    assert report["rows"], "no measurements"
    assert f"### {argv[0]}" in printed
    assert "| " + " | ".join(report["columns"]) + " |" in printed
    return printed, report


SIZES = [
    pytest.param(["submit-single", "--clients", "4", "--duration-s", "1"], id="submit-single"),
    pytest.param(
        ["submit-single", "--clients", "4", "--duration-s", "1", "--stream"],
        id="submit-single-stream",
    ),
    pytest.param(["submit-handler", "--submits", "50"], id="submit-handler"),
    pytest.param(["submit-handler", "--submits", "3", "--batch", "600"], id="submit-handler-batch"),
    pytest.param(["submit-batch", "--tasks", "1500", "--batch", "500"], id="submit-batch"),
    pytest.param(["stampede", "200", "--slots", "50"], id="stampede"),
    pytest.param(["steady", "50", "--duration-s", "1"], id="steady"),
    pytest.param(["idle", "--timers", "3000", "--window-s", "1", "--settle-s", "0"], id="idle"),
]


@pytest.mark.parametrize("argv", SIZES)
def test_workload_at_a_tiny_size(
    bench_main: ModuleType,
    argv: list[str],
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = run(bench_main, argv, postgres_server, etcd, tmp_path, capsys)
    row = report["rows"][0]
    if argv[0] == "submit-batch":
        assert row["tasks"] == row["rows stored"] == 1500
    if argv[0] == "submit-handler":
        # The measured calls' tasks and the warm-up's (200 single calls, 10 batches).
        calls, batch = row["calls"], row["tasks per call"]
        assert row["rows stored"] == (calls + (200 if batch == 1 else 10)) * batch
    if argv[0] in ("stampede", "steady"):
        assert row["none lost or doubled"] is True
    if argv[0] == "stampede":
        assert row["completed"] == 200
    if argv[0] == "steady":
        assert row["started"] == row["tasks"] == 50
    if argv[0] == "idle":
        assert row["timers in wheel"] == 3000
        assert 0 <= row["% of one core"] < 200  # two cores at most


def test_wheel_reuses_bench_wheel(
    bench_main: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "wheel.json"
    argv = ["wheel", "--sizes", "1000,2000", "--repeat", "1", "--json", str(out)]
    assert bench_main.main(argv) == 0
    report = json.loads(out.read_text())
    assert [(r["timers"], r["structure"]) for r in report["rows"]] == [
        (1000, "wheel"),
        (1000, "heapq"),
        (2000, "wheel"),
        (2000, "heapq"),
    ]
    assert report["targets"][0]["target"] == "wheel ≤ 250 bytes per pending timer"


@pytest.mark.parametrize("calls", ["unary", "a stream each"])
def test_submit_floor_answers_every_caller(
    bench_main: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], calls: str
) -> None:
    # No database and no etcd: the floor is the gRPC hop alone.
    out = tmp_path / "floor.json"
    argv = ["submit-floor", "--clients", "4", "--duration-s", "1", "--json", str(out)]
    if calls != "unary":
        argv.append("--stream")
    assert bench_main.main(argv) == 0
    [row] = json.loads(out.read_text())["rows"]
    assert row["clients"] == 4
    assert row["calls"] == calls
    assert row["answered"] > 0
    assert float(row["server CPU ms per call"]) > 0


def test_failover_reuses_bench_failover(
    bench_main: ModuleType,
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["failover", "--ttl", "2", "--tasks", "30", "--spread", "2"]
    _, report = run(bench_main, argv, postgres_server, etcd, tmp_path, capsys)
    [row] = report["rows"]
    assert row["exactly_once"] is True
    assert row["orphaned_shards"] > 0


def test_heartbeats_reports_bench_heartbeats(
    bench_main: ModuleType,
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bench/heartbeats.py has its own smoke test that runs it for real
    # (test_bench_heartbeats_smoke.py); here only the suite's adapter is checked, with
    # the windows a run returns, to keep this module's time small.
    heartbeats = pytest.importorskip("bench.heartbeats")
    calls: list[dict[str, Any]] = []

    def fake_run(**kwargs: Any) -> Any:
        calls.append(kwargs)
        window = {
            "seconds": 1.0,
            "cpu_percent": 3.0,
            "heartbeats_per_s": 4.0,
            "heartbeat_statements_per_s": 2.0,
            "leases_extended_per_s": 40.0,
            "transactions_per_s": 5.0,
            "revoked": 0,
        }
        return heartbeats.Result(
            tasks=20,
            workers=2,
            heartbeat_s=0.5,
            lease_s=3.0,
            windows=[
                heartbeats.Window(phase="idle", running_tasks=0, **window),
                heartbeats.Window(phase="running", running_tasks=20, **window),
            ],
        )

    monkeypatch.setattr(heartbeats, "run_benchmark", fake_run)
    argv = ["heartbeats", "--tasks", "20", "--workers", "2", "--heartbeat-s", "0.5"]
    _, report = run(bench_main, argv, postgres_server, etcd, tmp_path, capsys)
    assert [r["phase"] for r in report["rows"]] == ["idle", "running"]
    assert report["rows"][1]["running tasks"] == 20
    [kwargs] = calls
    assert (kwargs["tasks"], kwargs["workers"], kwargs["heartbeat_s"]) == (20, 2, 0.5)
    assert kwargs["etcd_endpoint"] == etcd.endpoint


def _peers(
    bench_main: ModuleType,
    argv: list[str],
    server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, Any]:
    out = tmp_path / "peers.json"
    common = ["--dsn", server.admin_dsn, "--etcd", etcd.endpoint, "--json", str(out)]
    assert bench_main.main(["peers", *argv, *common]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["workload"] == f"peers {argv[argv.index('--workload') + 1]}"
    assert {"cpu", "cores", "python", "postgresql"} <= set(report["machine"])
    assert "| " + " | ".join(report["columns"]) + " |" in printed
    return report


def test_peers_stampede_runs_for_chronoshard_alone(
    bench_main: ModuleType,
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--workload", "stampede", "--tasks", "100", "--system", "chronoshard", "--runs", "2"]
    report = _peers(bench_main, argv, postgres_server, etcd, tmp_path, capsys)
    runs = [r for r in report["rows"] if r["run"] in ("1", "2")]
    assert [r["system"] for r in report["rows"]] == ["chronoshard"] * 3
    assert report["rows"][2]["run"] == "median of 2"
    for row in runs:
        # Every task's handler started once, none before its instant (the node holds a
        # strict task until it is due).
        assert (row["started"], row["lost"], row["doubled"]) == (100, 0, 0)
        assert not row["lateness p50"].startswith("-")


def test_peers_submit_batch_runs_for_chronoshard_alone(
    bench_main: ModuleType,
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--workload", "submit-batch", "--tasks", "1500", "--system", "chronoshard"]
    report = _peers(bench_main, [*argv, "--runs", "1"], postgres_server, etcd, tmp_path, capsys)
    [row] = report["rows"]
    assert row["tasks/s"] > 0
    peers_module = importlib.import_module("bench.peers")
    # A count (zero when the server runs with fsync off, as the tests' embedded one does).
    flushes = row[peers_module.WAL_FLUSHES]
    assert flushes == "—" or flushes.replace(",", "").isdigit()
    # Two calls, each a write transaction (more if the server is shared): ≥ 1.3 per 1,000.
    assert int(row[peers_module.WRITE_TRANSACTIONS].replace(",", "")) >= 1


@pytest.mark.parametrize("system", ["celery", "procrastinate"])
def test_peers_stampede_runs_for_a_peer(
    bench_main: ModuleType,
    system: str,
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    peers = importlib.import_module("bench.peers")
    why_not = peers.available(system)
    if why_not is None and system == "celery":
        why_not = _redis_unreachable(peers.DEFAULT_REDIS)
    if why_not is not None:
        print(f"skipped: {why_not}")
        pytest.skip(why_not)
    argv = ["--workload", "stampede", "--tasks", "100", "--system", system, "--runs", "1"]
    report = _peers(bench_main, argv, postgres_server, etcd, tmp_path, capsys)
    [row] = report["rows"]
    assert row["system"] == system
    assert (row["started"], row["lost"], row["doubled"]) == (100, 0, 0)


def _redis_unreachable(url: str) -> str | None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"Redis at {url} is not reachable ({exc})"
    finally:
        client.close()
    return None


def test_schedules_at_a_tiny_size(
    bench_main: ModuleType,
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The spread variant over a 6 s window (a lookahead of 2 s): ~10 s. The ``minute``
    # variant differs only in its crons and the expected dates, checked below without a
    # node (its window must hold a whole minute).
    argv = [
        "schedules",
        "--schedules",
        "120",
        "--minutes",
        "0.1",
        "--variants",
        "seconds",
        "--lookahead-s",
        "2",
    ]
    _, report = run(bench_main, argv, postgres_server, etcd, tmp_path, capsys)
    [row] = report["rows"]
    assert row["variant"] == "seconds"
    assert row["schedules"] == 120
    # 120 schedules at 60 distinct seconds: two per second, 6 seconds in the window.
    assert row["occurrences in window"] == row["started"] == 12
    assert row["exactly once"] is True
    assert row["missing / doubled / unexpected"] == "0 / 0 / 0"
    assert row["creates/s"] > 0 and row["schedules MiB"] > 0


def test_schedules_expected_dates(bench_main: ModuleType) -> None:
    schedules = importlib.import_module("bench.schedules")
    start = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    end = start + timedelta(minutes=2)
    assert schedules.cron_of("minute", 7) == "* * * * *"
    assert schedules.cron_of("seconds", 61) == "1 * * * * *"
    assert schedules.expected_dates("minute", 7, start, end) == [
        start,
        start + timedelta(minutes=1),
    ]
    assert schedules.expected_dates("seconds", 61, start + timedelta(seconds=30), end) == [
        start + timedelta(minutes=1, seconds=1)
    ]
    assert schedules.window_start(start + timedelta(seconds=5), 3) == start + timedelta(minutes=1)
    assert schedules.window_start(start + timedelta(seconds=5.5), 0.1) == start + timedelta(
        seconds=6
    )


def test_workflows_at_a_tiny_size(
    bench_main: ModuleType,
    postgres_server: PostgresServer,
    etcd: EtcdProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 60 tasks at width 10 (7 layers, 108 edges) and a chain of 10, each on its own
    # node, without the idle window. flat and dag-x2 run the same code as dag with other
    # shapes: left out, the smoke costs two nodes less (the suite is near its budget).
    argv = ["workflows", "--tasks", "60", "--width", "10", "--chain", "10", "--idle-s", "0"]
    argv += ["--variants", "dag,chain"]
    _, report = run(bench_main, argv, postgres_server, etcd, tmp_path, capsys)
    by = {r["variant"]: r for r in report["rows"]}
    assert list(by) == ["dag", "chain"]
    assert [(r["tasks"], r["edges"]) for r in by.values()] == [(60, 108), (10, 9)]
    assert all(r["none lost or doubled"] is True for r in by.values())
    assert [r["state"] for r in by.values()] == ["SUCCEEDED", "SUCCEEDED"]
    # Every edge's unlock was measured (a child starts after the parent that released it).
    assert by["chain"]["unlock p50 / p99 / max"] != "— / — / —"
    assert not by["dag"]["unlock p50 / p99 / max"].startswith("-")


def test_workflows_layered_shape(bench_main: ModuleType) -> None:
    workflows = importlib.import_module("bench.workflows")
    shape = workflows.layered(7, 3, 2)
    assert shape.depth == 3
    # The first layer hangs off the root alone; then task j of a layer depends on j and
    # j+1 (mod 3) of the layer before, the last (shorter) layer too.
    assert shape.edges == [
        ("t0", "t1"),
        ("t0", "t2"),
        ("t0", "t3"),
        ("t1", "t4"),
        ("t2", "t4"),
        ("t2", "t5"),
        ("t3", "t5"),
        ("t3", "t6"),
        ("t1", "t6"),
    ]
    chain = workflows.layered(4, 1, 1)
    assert (chain.depth, chain.edges) == (4, [("t0", "t1"), ("t1", "t2"), ("t2", "t3")])
