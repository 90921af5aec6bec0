"""``chronoshard health`` against a real node (in-process: real gRPC, PostgreSQL and etcd)
and a real HTTP endpoint (the watchdog's ``HttpServer``): the exit code a probe reads and
the one line it prints, for a serving node, a service the node does not know, a draining
node, a port nobody listens on and one that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from fixtures.cli_runs import Ran, run
from fixtures.nodes import node_config, running_node
from fixtures.waiting import eventually

from chronoshard import cli
from chronoshard._dev.processes import free_ports
from chronoshard.http_endpoint import HttpServer, Response
from chronoshard.scheduler.api.server import CLOCK_HEALTH_SERVICE
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.services import EtcdProcess

SHARDS = 2

# pytest-asyncio: the module-scoped node and the tests share the module's loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(db_dsn: str, etcd: EtcdProcess) -> AsyncIterator[SchedulerNode]:
    async with running_node(node_config(db_dsn, etcd.endpoint, shard_count=SHARDS)) as started:
        yield started


@pytest.fixture
def address(node: SchedulerNode, no_cli_env: None) -> str:
    assert node.addresses is not None
    return node.addresses.grpc


async def _serving(capsys: pytest.CaptureFixture[str], address: str) -> Ran:
    """``health`` of the overall status once it says SERVING (a node may publish its
    statuses a moment after it listens)."""

    async def check() -> Ran | None:
        ran = await run(capsys, "health", "--target", address)
        return ran if ran.code == cli.EXIT_OK else None

    found: Ran = await eventually(check, timeout_s=30, what=f"{address} SERVING", interval_s=0.2)
    return found


async def test_a_serving_node_exits_0_for_its_overall_status_and_its_clock(
    address: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    overall = await _serving(capsys, address)
    assert overall.out == f"SERVING (overall) at {address}\n" and overall.err == ""

    clock = await run(capsys, "health", "--target", address, "--service", CLOCK_HEALTH_SERVICE)
    assert (clock.code, clock.err) == (cli.EXIT_OK, "")
    assert clock.out == f"SERVING {CLOCK_HEALTH_SERVICE} at {address}\n"

    # No --target: the CLI's usual variable names the node.
    monkeypatch.setenv(cli.TARGET_ENV, address)
    from_env = await run(capsys, "health")
    assert (from_env.code, from_env.out) == (cli.EXIT_OK, overall.out)

    as_json = await run(capsys, "health", "--service", CLOCK_HEALTH_SERVICE, "-o", "json")
    assert as_json.code == cli.EXIT_OK
    assert as_json.json() == {
        "serving": True,
        "answers": [
            {
                "target": address,
                "service": CLOCK_HEALTH_SERVICE,
                "status": "SERVING",
                "detail": "",
                "error": None,
                "http_status": None,
            }
        ],
    }


async def test_list_prints_every_service_the_node_reports_overall_first(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _serving(capsys, address)
    listed = await run(capsys, "health", "--target", address, "--list")
    lines = listed.out.splitlines()
    assert lines[0] == f"SERVING (overall) at {address}"
    assert f"SERVING {CLOCK_HEALTH_SERVICE} at {address}" in lines
    assert all(line.endswith(f" at {address}") for line in lines)
    # The rule of every form: 0 exactly when each status printed is SERVING.
    every_serving = all(line.startswith("SERVING ") for line in lines)
    assert listed.code == (cli.EXIT_OK if every_serving else cli.EXIT_FAILURE), listed.out


async def test_a_service_the_node_does_not_know_exits_1_and_says_what_it_has(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _serving(capsys, address)
    unknown = await run(capsys, "health", "--target", address, "--service", "chronoshard.v1.Nope")
    assert (unknown.code, unknown.err) == (cli.EXIT_FAILURE, "")
    assert unknown.out.startswith(
        f"SERVICE_UNKNOWN chronoshard.v1.Nope at {address}: the node reports no health "
        "status by that name (it reports: (overall), "
    )
    assert CLOCK_HEALTH_SERVICE in unknown.out and unknown.out.count("\n") == 1


async def test_a_draining_node_is_not_serving_until_undrained(
    node: SchedulerNode, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _serving(capsys, address)
    await node.drain("test: a probe must see it")
    try:
        drained = await run(capsys, "health", "--target", address)
        assert (drained.code, drained.err) == (cli.EXIT_FAILURE, "")
        assert drained.out == f"NOT_SERVING (overall) at {address}\n"
    finally:
        await node.undrain()
    await _serving(capsys, address)


async def test_a_port_nobody_listens_on_exits_1_with_one_line_and_no_traceback(
    tmp_path: Path, no_cli_env: None
) -> None:
    """As a process: whatever gRPC's C core or Python would print lands on stderr too."""
    (port,) = free_ports(1)
    program = Path(sys.executable).parent / "chronoshard"
    ran = await asyncio.to_thread(
        subprocess.run,
        [str(program), "health", "--target", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert (ran.returncode, ran.stdout) == (cli.EXIT_FAILURE, ""), ran.stderr
    assert ran.stderr.startswith(f"chronoshard health: 127.0.0.1:{port}: unreachable: ")
    assert ran.stderr.count("\n") == 1 and "Traceback" not in ran.stderr, ran.stderr


@contextlib.contextmanager
def _silent_listener() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never says a word."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


async def test_a_node_that_never_answers_exits_1_within_the_timeout(
    capsys: pytest.CaptureFixture[str], no_cli_env: None
) -> None:
    with _silent_listener() as silent:
        loop = asyncio.get_running_loop()
        started = loop.time()
        ran = await run(capsys, "health", "--target", silent, "--timeout", "500ms")
        took = loop.time() - started
        http = await run(
            capsys, "health", "--target", f"http://{silent}/healthz", "--timeout", "0.5"
        )
    assert (ran.code, ran.out) == (cli.EXIT_FAILURE, "")
    assert ran.err == f"chronoshard health: {silent}: did not answer within 0.5s\n"
    assert took < 10, took  # bounded by --timeout, not by gRPC's connection backoff
    assert (http.code, http.out) == (cli.EXIT_FAILURE, "")
    assert http.err == f"chronoshard health: http://{silent}/healthz: did not answer within 0.5s\n"


@pytest_asyncio.fixture(loop_scope="module")
async def healthz() -> AsyncIterator[tuple[str, list[Response]]]:
    """An HTTP endpoint whose /healthz answers what the test puts in the list."""
    answer: list[Response] = [(200, "application/json", b'{"status": "ok"}\n')]
    server = HttpServer("127.0.0.1:0", {"/healthz": lambda: answer[0]})
    bound = await server.start()
    try:
        yield f"http://{bound}", answer
    finally:
        await server.close()


async def test_a_url_is_an_http_get_that_serves_only_on_200(
    healthz: tuple[str, list[Response]], capsys: pytest.CaptureFixture[str], no_cli_env: None
) -> None:
    base, answer = healthz
    ok = await run(capsys, "health", "--target", f"{base}/healthz")
    assert (ok.code, ok.out, ok.err) == (cli.EXIT_OK, f"SERVING (HTTP 200) at {base}/healthz\n", "")

    answer[0] = (503, "application/json", b'{"status": "failing", "database_up": false}\n')
    failing = await run(capsys, "health", "--target", f"{base}/healthz")
    assert (failing.code, failing.err) == (cli.EXIT_FAILURE, "")
    assert failing.out == (
        f'NOT_SERVING (HTTP 503) at {base}/healthz: {{"status": "failing", "database_up": false}}\n'
    )

    missing = await run(capsys, "health", "--target", f"{base}/nothing-here")
    assert missing.code == cli.EXIT_FAILURE
    assert missing.out.startswith(f"NOT_SERVING (HTTP 404) at {base}/nothing-here")
