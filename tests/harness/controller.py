"""The client half of a controller process: a script that owns servers the test process
must not start itself.

PostgreSQL runs as an unprivileged user under root, and starting it from a process whose
gRPC threads are busy crashed the forked child before its ``exec`` (seen as "PostgreSQL
exited with status -11 while starting" in about one restart of two). So the tests that
start, stop or kill servers mid-test (:mod:`harness.outage`, :mod:`harness.replication`)
do it in a small script of their own that loads no gRPC, and talk to it over a line
protocol: the script prints ``ready ...`` once its servers are up (or ``error <text>``),
then answers each command read from its stdin with ``ok`` or ``error <text>``; end of
input means ``quit``: its servers stop and their directories go.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from chronoshard._dev.lifeline import start_child
from harness.processes import run_lifeline

TESTS_DIR = Path(__file__).resolve().parent.parent
CONTROL_TIMEOUT_S = 60.0
"""Bound on one answer: an initdb, a base backup and two starts on a busy machine."""


class Controller:
    """Runs ``script`` (with ``args``) as the controller; ``what`` names it in errors.

    Subclasses implement :meth:`open` with :meth:`_launch` and send commands with
    :meth:`_command`; ``with`` opens and closes."""

    def __init__(self, what: str, log_path: Path) -> None:
        self._what = what
        self._log_path = log_path
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        raise NotImplementedError

    def _launch(self, script: str, *args: str) -> list[str]:
        """Start the controller; the words of its ``ready`` line once it is up."""
        # The script imports this package too (run as a file, its own directory is on
        # its path, not the tests directory above it).
        path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
        with self._log_path.open("ab") as log:
            self._proc = start_child(
                run_lifeline(),
                [sys.executable, script, *args],
                name=self._what,
                env={**os.environ, "PYTHONPATH": path.strip(os.pathsep)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        word, _, rest = self._answer().partition(" ")
        if word != "ready":
            raise RuntimeError(
                f"the {self._what} did not start: {word} {rest}; its log: {self._log_path}"
            )
        return rest.split()

    def close(self) -> None:
        """End the controller (end of input: it stops its servers, deletes their data)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(CONTROL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            # A controller that does not end cannot be helped: kill it. Its servers, in
            # sessions of their own, may then outlive it; its log says what it was doing.
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> Self:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _command(self, command: str) -> None:
        with self._lock:
            assert self._proc is not None and self._proc.stdin is not None
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
            answer = self._answer()
        if answer != "ok":
            raise RuntimeError(
                f"{command} failed: {answer}; the {self._what}'s log: {self._log_path}"
            )

    def _answer(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        line = read_line(self._proc.stdout, CONTROL_TIMEOUT_S)
        if line is None:
            raise RuntimeError(f"the {self._what} did not answer; its log: {self._log_path}")
        return line.strip()


def read_line(stream: IO[str], timeout_s: float) -> str | None:
    """A line of ``stream`` within ``timeout_s``; None at its end or after the timeout."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result and result[0] else None


def answer_commands(commands: Mapping[str, Callable[[], None]]) -> None:
    """The script half: run each command read from stdin, answer ``ok`` or ``error <text>``
    (its time to stderr, the controller's log); return at ``quit`` or end of input."""
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            return
        started = time.monotonic()
        try:
            run = commands.get(command)
            if run is None:
                raise ValueError(f"unknown command {command!r}")
            run()
        except Exception as exc:
            print(f"error {exc!r}".replace("\n", " "), flush=True)
            continue
        print(f"{command} took {time.monotonic() - started:.3f} s", file=sys.stderr, flush=True)
        print("ok", flush=True)
