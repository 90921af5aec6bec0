"""The lifeline keeper with real processes: when the launcher's end of the pipe closes (as
it does when the launcher dies, however), the keeper stops every registered process that
still runs, escalates to SIGKILL for the whole process group after the grace period, and
deletes the scratch paths. Here the "launcher" is this test, which closes its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from chronoshard._dev.lifeline import Lifeline

GRACE_S = 0.5
BOUND_S = 10.0


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def _spawn(lifeline: Lifeline, name: str, script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["sh", "-c", script],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=lifeline.tie(name),
    )


def test_the_keeper_stops_what_the_launcher_left_and_sweeps_groups(tmp_path: Path) -> None:
    lifeline = Lifeline(tmp_path / "lifeline.log", GRACE_S)
    lifeline.start()
    polite = _spawn(lifeline, "polite", "exec sleep 300")
    # Ignores SIGTERM and has a child of its own: only the group SIGKILL ends both.
    stubborn = _spawn(lifeline, "stubborn", "trap '' TERM; sleep 300 & wait")
    scratch = tmp_path / "scratch"
    (scratch / "deep").mkdir(parents=True)
    lifeline.remove_on_exit(scratch)
    finished = _spawn(lifeline, "finished", "exit 0")
    finished.wait()
    deadline = time.monotonic() + BOUND_S
    while len(_group_members(stubborn.pid)) < 2:  # its sleep has started
        assert time.monotonic() < deadline
        time.sleep(0.02)
    groups = [polite.pid, stubborn.pid]

    lifeline.close()  # what the kernel does for a launcher that died
    started = time.monotonic()
    for proc in (polite, stubborn):
        proc.wait(BOUND_S)
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    while any(_group_members(g) for g in groups):
        assert time.monotonic() - started < BOUND_S, [_group_members(g) for g in groups]
        time.sleep(0.02)
    assert lifeline.exited() == 0
    assert not scratch.exists()
    log = (tmp_path / "lifeline.log").read_text()
    assert "launcher gone" in log and "polite" in log and "stubborn" in log
    assert "finished" not in log  # it had ended on its own: not this keeper's business


def test_after_a_clean_stop_the_keeper_says_nothing(tmp_path: Path) -> None:
    lifeline = Lifeline(tmp_path / "lifeline.log", GRACE_S)
    lifeline.start()
    child = _spawn(lifeline, "child", "exec sleep 300")
    child.terminate()
    child.wait()
    lifeline.close()
    assert lifeline.exited() == 0
    assert (tmp_path / "lifeline.log").read_text() == ""


# A stand-in for a test run: it starts a process through the harness, as an end-to-end
# test does, and an etcd as the session's fixture does, says their pids and waits to be
# killed.
_RUN = """
import sys, time
from pathlib import Path
from harness.processes import ManagedProcess, run_lifeline
from chronoshard.services import EtcdProcess

child = ManagedProcess("node", ["sleep", "300"], {}, Path(sys.argv[1]))
child.start()
etcd = EtcdProcess(fsync=False, lifeline=run_lifeline())
etcd.start()
print(child.pid, etcd.pid, flush=True)
time.sleep(300)
"""


def test_a_killed_test_run_leaves_no_process_it_started(tmp_path: Path) -> None:
    """The harness registers what it starts with the run's lifeline (harness.processes),
    and so do the session's etcd and PostgreSQL: a run killed before its teardown (pytest
    SIGKILLed, a CI timeout) takes them along."""
    tests_dir = Path(__file__).resolve().parent.parent
    with subprocess.Popen(
        [sys.executable, "-c", _RUN, str(tmp_path / "node.log")],
        cwd=tmp_path,
        # TMPDIR: the run's lifeline log (which names what its keeper stopped) stays here.
        env={**os.environ, "PYTHONPATH": str(tests_dir), "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        start_new_session=True,
    ) as run:
        try:
            assert run.stdout is not None
            child, etcd = (int(pid) for pid in run.stdout.readline().split())
            assert _group_members(child) == [child]
            assert _group_members(etcd) == [etcd]
        finally:
            run.kill()
    started = time.monotonic()
    for pid in (child, etcd):
        while _group_members(pid):
            assert time.monotonic() - started < BOUND_S, f"pid {pid} outlived its test run"
            time.sleep(0.02)
    (log,) = tmp_path.glob("chronoshard-test-lifeline-*.log")
    assert f"node ({child})" in log.read_text()
    assert f"etcd ({etcd})" in log.read_text()
