"""The README's "write your first worker" runs as written: both of its blocks (marked
``<!-- readme-test: ... -->``) are taken verbatim from README.md — the worker saved as
``hello_worker.py``, the shell block run by bash — against ``chronoshard dev`` started the
way the README starts it (from the directory, default data dir ``./.chronoshard``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_dev import START_TIMEOUT_S, STOP_TIMEOUT_S, clean_env, dev_command, wait_for_output

README = Path(__file__).resolve().parents[2] / "README.md"
SHELL_TIMEOUT_S = 90.0


def readme_block(marker: str) -> str:
    """The fenced block right after ``<!-- readme-test: MARKER -->``, verbatim."""
    pattern = re.compile(
        rf"<!-- readme-test: {re.escape(marker)} -->\n```[a-z]*\n(.*?)\n```", re.DOTALL
    )
    found = pattern.findall(README.read_text())
    assert len(found) == 1, f"README.md needs exactly one block marked {marker!r}"
    return str(found[0]) + "\n"


def test_the_blocks_are_there() -> None:
    assert "@worker.task(" in readme_block("hello_worker.py")
    assert "chronoshard submit" in readme_block("shell")


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="chronoshard-readme-test-"))
    # A project directory as most have it (test_dev covers one only root may enter).
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_first_worker_example_runs_as_written(
    request: pytest.FixtureRequest, workdir: Path
) -> None:
    (workdir / "hello_worker.py").write_text(readme_block("hello_worker.py"))
    with running_dev(request, workdir, "first"):
        code, stdout, stderr = run_shell(readme_block("shell"), workdir)
    output = stdout + stderr
    assert code == 0, output
    assert re.search(r"^status:\s+COMPLETED$", stdout, re.MULTILINE), output
    assert '"greeting": "Hello, Ada!"' in stdout and '"attempt": 2' in stdout
    assert "the first attempt fails on purpose" in output  # the worker's log of attempt 1
    key = api_key_line(workdir)

    # State is kept between runs: started again, the same key sees the same task.
    with running_dev(request, workdir, "again"):
        assert api_key_line(workdir) == key
        code, stdout, stderr = run_shell(
            ". .chronoshard/env\nchronoshard tasks ls --type hello.greet -o json", workdir
        )
    assert code == 0, stdout + stderr
    [task] = json.loads(stdout)["tasks"]
    assert (task["status"], task["attempt"]) == ("COMPLETED", 2)


def api_key_line(workdir: Path) -> str:
    env = (workdir / ".chronoshard" / "env").read_text()
    [line] = [line for line in env.splitlines() if "CHRONOSHARD_API_KEY=" in line]
    return line


@contextlib.contextmanager
def running_dev(request: pytest.FixtureRequest, workdir: Path, name: str) -> Iterator[None]:
    """``chronoshard dev`` in ``workdir`` (default data dir) until the block ends; then
    SIGTERM, and it must exit 0."""
    log = workdir / f"dev-{name}.out"
    with log.open("wb") as out:
        dev = subprocess.Popen(
            dev_command(request),
            cwd=workdir,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_for_output(dev, log, re.compile(r"Ctrl-C stops everything"), START_TIMEOUT_S)
        yield
    finally:
        dev.terminate()
        dev.wait(STOP_TIMEOUT_S)
    assert dev.returncode == 0, log.read_text()[-3000:]


def run_shell(script: str, cwd: Path) -> tuple[int, str, str]:
    """``script`` under ``bash -euo pipefail`` in a session of its own, so whatever it
    left running in the background (a worker, if a step failed) is ended with it."""
    proc = subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=SHELL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n(timed out after {SHELL_TIMEOUT_S} s)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a background job the script left behind
    return proc.returncode, stdout, stderr
