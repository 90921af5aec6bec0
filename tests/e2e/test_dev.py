"""``chronoshard dev --demo`` as a newcomer runs it: a real subprocess on free ports that
starts etcd, PostgreSQL, three schedulers, the watchdog and the demo worker, submits the
demo and shows it settling; then it is stopped the hard ways, and no process it started
survives (checked by pid and by process group, so PostgreSQL's backends count too):

- ``chronoshard dev | tee log`` and Ctrl-C: ``tee`` dies first, so the launcher's stdout
  is a pipe without a reader when the SIGINT comes; the shutdown must not care;
- the launcher SIGKILLed: its lifeline keeper stops everything within a bound.

Both run (as root, in CI) with the data dir inside a directory only root may enter, where
the embedded PostgreSQL runs as an unprivileged user that cannot pass through it: its
data must stay in the data dir anyway, and nothing may be left in the temp dir."""

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

from chronoshard._dev import demo_tasks as _dev_demo
from chronoshard._dev.cluster import CHILD_STOP_GRACE_S

TEST_DSN_ENV = "CHRONOSHARD_TEST_DSN"
START_TIMEOUT_S = 90.0
DEMO_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
SIGKILL_STOP_BOUND_S = 2 * CHILD_STOP_GRACE_S
"""A killed launcher's children are gone within this (each stage stops in well under its
grace period unless a process hangs; see chronoshard._dev.lifeline)."""
PIPELINE_DONE = re.compile(
    r"demo: workflow demo\.pipeline succeeded \(fetch completed -> (invoice|credit-check) "
    r"completed -> (invoice|credit-check) completed -> summary completed\)"
)
SETTLED = re.compile(r"demo: all (\d+) tasks settled: (\d+) completed, (\d+) dead-lettered")
BANNER_DONE = re.compile(r"Ctrl-C stops everything")
OCCURRENCE = re.compile(
    r"demo: demo\.heartbeat occurrence \d{4}-\d\d-\d\d \d\d:\d\d:(\d\d)\.(\d{3}) UTC completed"
)
OCCURRENCE_WAIT_S = 30.0


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """A directory only its owner may enter (mkdtemp makes it 0700), shared by the tests
    of this module (the second starts on the first one's data). Under root, the embedded
    PostgreSQL runs as an unprivileged user who cannot pass through it."""
    path = Path(tempfile.mkdtemp(prefix="chronoshard-dev-test-"))
    assert path.stat().st_mode & 0o777 == 0o700
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def temp_dir() -> Iterator[Path]:
    """The launcher's system temp dir (``TMPDIR``): a private one, so that "nothing left
    in the temp dir" is exact while other processes on the machine use /tmp."""
    path = Path(tempfile.mkdtemp(prefix="chronoshard-dev-tmp-"))
    path.chmod(0o755)  # as /tmp is: the PostgreSQL user may need to reach a scratch copy
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dev_command(request: pytest.FixtureRequest, *args: str) -> list[str]:
    """``chronoshard dev ARGS`` on free ports; against CHRONOSHARD_TEST_DSN's server
    (a database of this test's own) when that is set, else with embedded PostgreSQL."""
    argv = [sys.executable, "-m", "chronoshard.cli", "dev", "--port", "0", "--metrics-port", "0"]
    if os.environ.get(TEST_DSN_ENV):
        argv += ["--dsn", request.getfixturevalue("fresh_db_dsn")]
    return argv + list(args)


def interruptible(argv: list[str]) -> list[str]:
    """``argv`` run with SIGINT at its default and unblocked, as under a terminal: a child
    inherits an ignored disposition and the signal mask of whoever started the test run,
    and a ``tee`` that does not die of Ctrl-C is not the pipeline this test plays."""
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
        "os.execvp(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", reset, *argv]


def signal_state(pid: int) -> str:
    """The blocked, ignored and caught signal masks of ``pid`` (from /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        return f"no /proc status: {exc}"
    return " ".join(
        line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
    )


def clean_env(temp_dir: Path | None = None) -> dict[str, str]:
    """The test's environment without anything that would point the CLI elsewhere (and
    with ``temp_dir`` as the system temp dir, when given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOSHARD_")}
    if temp_dir is not None:
        env["TMPDIR"] = str(temp_dir)
    return env


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


def live(pids: dict[str, int]) -> dict[str, int]:
    return {name: pid for name, pid in pids.items() if pid_alive(pid)}


def assert_nothing_left(pids: dict[str, int], data_dir: Path, temp_dir: Path) -> None:
    assert live(pids) == {}
    # Children lead their own process groups: nothing of any group may be left either.
    assert process_groups_alive(set(pids.values())) == []
    assert list(temp_dir.iterdir()) == []
    if "postgres" in pids:  # embedded: its data is in the data dir, wherever that is
        assert (data_dir / "postgres" / "data" / "PG_VERSION").is_file()


def test_dev_demo_settles_and_ctrl_c_with_a_dead_tee_leaves_nothing_behind(
    request: pytest.FixtureRequest, workdir: Path, temp_dir: Path
) -> None:
    data_dir = workdir / ".chronoshard"
    log = workdir / "dev.out"
    errors = workdir / "dev.err"
    # `chronoshard dev --demo | tee dev.out`, stderr on the "terminal" (a file).
    log.touch()  # before tee gets to it: the test reads it at once
    tee = subprocess.Popen(
        interruptible(["tee", str(log)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert tee.stdin is not None
    with errors.open("wb") as err:
        proc = subprocess.Popen(
            dev_command(request, "--demo", "--data-dir", str(data_dir)),
            cwd=workdir,
            env=clean_env(temp_dir),
            stdout=tee.stdin,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    tee.stdin.close()  # the launcher holds the only write end
    try:
        wait_for_output(proc, log, BANNER_DONE, START_TIMEOUT_S)
        cluster = json.loads((data_dir / "cluster.json").read_text())
        pids = cluster["pids"]
        assert set(pids) >= {
            "dev-node-1",
            "watchdog",
            "console",
            "demo-worker",
            "etcd",
            "lifeline",
        }
        if not os.environ.get(TEST_DSN_ENV):
            assert "postgres" in pids
            assert cluster["postgres_dir"] == str(data_dir / "postgres")
        assert all(pid_alive(pid) for pid in pids.values()), pids
        banner = log.read_text()
        assert "DEVELOPMENT ONLY" in banner and cluster["api_key"] in banner
        assert cluster["grpc"][0] in banner
        # The web console runs, its address in the banner; its login page answers.
        assert cluster["console"] in banner
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            cluster["console"] + "/login", timeout=5
        ) as login_page:
            assert login_page.status == 200 and b'name="api_key"' in login_page.read()

        # The watchdog runs (with its canary) and reports itself healthy.
        assert watchdog_health(cluster["watchdog"], timeout_s=20) == "ok"

        settled = wait_for_output(proc, log, SETTLED, DEMO_TIMEOUT_S)
        total, completed, dead = (int(g) for g in settled.groups())
        planned = len(_dev_demo.demo_plan(datetime.now(UTC), random.Random(0), "run"))
        # Everything completes but the tasks made to fail, which end dead-lettered.
        failing = _dev_demo.FAILING_TASKS
        assert (total, completed, dead) == (planned, planned - failing, failing)
        assert "--attempts" in log.read_text()  # it shows how to look into a failure

        # The demo's workflow ran through the real unlock: summary after both branches,
        # with what they returned (the handler printed its ctx.parents).
        wait_for_output(proc, log, PIPELINE_DONE, OCCURRENCE_WAIT_S)
        # The demo's schedule is a real one: the materialiser creates its occurrences (on
        # the 5 s grid of its cron), the worker runs them, the demo prints each.
        assert "chronoshard schedules get demo.heartbeat" in banner
        assert "demo: schedule demo.heartbeat runs demo.tick every 5 s" in log.read_text()
        fired = wait_for_output(proc, log, OCCURRENCE, OCCURRENCE_WAIT_S)
        assert int(fired.group(1)) % _dev_demo.HEARTBEAT_EVERY_S == 0 and fired.group(2) == "000"
        worker_log = (data_dir / "logs" / "demo-worker.log").read_text()
        assert "demo.tick: occurrence " in worker_log  # the handler printed ctx.logical_date
        assert "demo.gather: summary of workflow " in worker_log
    finally:
        # Ctrl-C: tee dies at once; the launcher's next line goes into a broken pipe.
        tee_signals = signal_state(tee.pid)  # read first: a tee that outlives SIGINT says why
        tee.send_signal(signal.SIGINT)
        try:
            tee.wait(10)
            tee_survived = ""
        except subprocess.TimeoutExpired:
            tee.kill()  # and still stop the launcher, so nothing outlives this test
            tee_survived = f"tee outlived SIGINT ({tee_signals})"
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert not tee_survived, tee_survived
    printed = log.read_text()
    assert code == 0, errors.read_text()[-3000:] + printed[-3000:]
    assert "· stopping" not in printed  # it was said into the broken pipe, and ignored
    assert errors.read_text() == ""  # no BrokenPipeError, no "Exception ignored"
    assert_nothing_left(pids, data_dir, temp_dir)
    assert json.loads((data_dir / "cluster.json").read_text())["stopped_at"]


def test_a_sigkilled_dev_leaves_nothing_behind(
    request: pytest.FixtureRequest, workdir: Path, temp_dir: Path
) -> None:
    data_dir = workdir / ".chronoshard"
    log = workdir / "dev-killed.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            dev_command(request, "--data-dir", str(data_dir)),
            cwd=workdir,
            env=clean_env(temp_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_for_output(proc, log, BANNER_DONE, START_TIMEOUT_S)
        pids = json.loads((data_dir / "cluster.json").read_text())["pids"]
        assert all(pid_alive(pid) for pid in pids.values()), pids
    finally:
        proc.kill()
        proc.wait()
    killed = time.monotonic()
    while live(pids) or process_groups_alive(set(pids.values())):
        assert time.monotonic() - killed < SIGKILL_STOP_BOUND_S, (
            f"left running {SIGKILL_STOP_BOUND_S} s after the launcher was killed: "
            f"{live(pids)}, {process_groups_alive(set(pids.values()))}"
        )
        time.sleep(0.1)
    print(f"children of a SIGKILLed dev gone {time.monotonic() - killed:.2f} s after the kill")
    assert_nothing_left(pids, data_dir, temp_dir)
    keeper_log = (data_dir / "logs" / "lifeline.log").read_text()
    assert "launcher gone: stopping what it left running" in keeper_log
