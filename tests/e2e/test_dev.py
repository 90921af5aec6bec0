"""``chronoshard dev --demo`` as a newcomer runs it: a real subprocess on free ports that
starts etcd, PostgreSQL, a scheduler, the watchdog and the demo worker, submits the demo
and shows it settling; SIGINT then stops it, and no process it started survives (checked
by pid and by process group, so PostgreSQL's backends count too)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from harness.processes import pid_alive

from chronoshard import _dev_demo

TEST_DSN_ENV = "CHRONOSHARD_TEST_DSN"
START_TIMEOUT_S = 90.0
DEMO_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
SETTLED = re.compile(r"demo: all (\d+) tasks settled: (\d+) completed, (\d+) dead-lettered")


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory any user can traverse: under root, the embedded PostgreSQL runs as an
    unprivileged user and keeps its data inside the data dir only when it can reach it."""
    path = Path(tempfile.mkdtemp(prefix="chronoshard-dev-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dev_command(request: pytest.FixtureRequest, *args: str) -> list[str]:
    """``chronoshard dev ARGS`` on free ports; against CHRONOSHARD_TEST_DSN's server
    (a database of this test's own) when that is set, else with embedded PostgreSQL."""
    argv = [sys.executable, "-m", "chronoshard.cli", "dev", "--port", "0", "--metrics-port", "0"]
    if os.environ.get(TEST_DSN_ENV):
        argv += ["--dsn", request.getfixturevalue("fresh_db_dsn")]
    return argv + list(args)


def clean_env() -> dict[str, str]:
    """The test's environment without anything that would point the CLI elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CHRONOSHARD_")}


def wait_for_output(
    proc: subprocess.Popen[bytes], log: Path, pattern: re.Pattern[str], timeout_s: float
) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        text = log.read_text(errors="replace")
        found = pattern.search(text)
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"dev exited with {proc.returncode}:\n{text}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {pattern.pattern!r} within {timeout_s} s:\n{text}")
        time.sleep(0.2)


def watchdog_health(base_url: str, timeout_s: float) -> str:
    """The watchdog's /healthz status once it is "ok" (or the last one after the timeout)."""
    deadline = time.monotonic() + timeout_s
    status = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=5) as reply:
                status = json.loads(reply.read())["status"]
        except urllib.error.HTTPError as exc:  # 503 while failing
            status = json.loads(exc.read()).get("status", str(exc))
        if status == "ok":
            break
        time.sleep(0.5)
    return status


def process_groups_alive(groups: set[int]) -> list[str]:
    """Processes (``pid name``) still in any of ``groups``, zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name_and_rest = (entry / "stat").read_text()
        except OSError:
            continue
        name, _, rest = name_and_rest.rpartition(")")
        fields = rest.split()
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.append(f"{entry.name} {name.split('(', 1)[-1]}")
    return found


def test_dev_demo_settles_and_sigint_leaves_nothing_behind(
    request: pytest.FixtureRequest, workdir: Path
) -> None:
    data_dir = workdir / ".chronoshard"
    log = workdir / "dev.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            dev_command(request, "--demo", "--data-dir", str(data_dir)),
            cwd=workdir,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_for_output(proc, log, re.compile(r"Ctrl-C stops everything"), START_TIMEOUT_S)
        cluster = json.loads((data_dir / "cluster.json").read_text())
        pids = cluster["pids"]
        assert set(pids) >= {"dev-node-1", "watchdog", "demo-worker", "etcd"}
        if not os.environ.get(TEST_DSN_ENV):
            assert "postgres" in pids
        assert all(pid_alive(pid) for pid in pids.values()), pids
        banner = log.read_text()
        assert "DEVELOPMENT ONLY" in banner and cluster["api_key"] in banner
        assert cluster["grpc"][0] in banner

        # The watchdog runs (with its canary) and reports itself healthy.
        assert watchdog_health(cluster["watchdog"], timeout_s=20) == "ok"

        settled = wait_for_output(proc, log, SETTLED, DEMO_TIMEOUT_S)
        total, completed, dead = (int(g) for g in settled.groups())
        planned = len(_dev_demo.demo_plan(datetime.now(UTC), random.Random(0), "run"))
        # Everything completes but the tasks made to fail, which end dead-lettered.
        failing = _dev_demo.FAILING_TASKS
        assert (total, completed, dead) == (planned, planned - failing, failing)
        assert "--attempts" in log.read_text()  # it shows how to look into a failure
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, log.read_text()[-3000:]
    assert log.read_text().rstrip().endswith("· stopped")
    survivors = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    assert survivors == {}
    # Children lead their own process groups: nothing of any group may be left either.
    assert process_groups_alive(set(pids.values())) == []
    assert json.loads((data_dir / "cluster.json").read_text())["stopped_at"]
