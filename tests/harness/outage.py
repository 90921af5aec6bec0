"""A PostgreSQL of a test's own that the test stops (immediate mode) and starts again.

Fault tests need a server they may take down while the session's test server keeps
serving every other test (and the fault test's own side-effect ledger). The server runs
under a small controller process (this module, run as a script) that owns a
:class:`~chronoshard.services.PostgresServer`: ``stop`` does what ``pg_ctl stop -m
immediate`` does (SIGQUIT: every session cut, no checkpoint), ``start`` brings it back on
the same port and data directory (crash recovery runs first, as after a real crash).

Why a controller process rather than the server object in the test: PostgreSQL runs as
an unprivileged user under root, and starting it from a process whose gRPC threads are
busy crashed the forked child before its ``exec`` (seen as "PostgreSQL exited with status
-11 while starting" in about one restart of two). The controller loads no gRPC.

Protocol, one line each way: the controller prints ``ready PORT`` once the server is up,
then answers each command read from stdin (``stop``, ``start``, ``quit``) with ``ok`` or
``error <text>``. End of input means ``quit``: the server stops and its directory goes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

CONTROL_TIMEOUT_S = 60.0


class RestartablePostgres:
    """The controller's client: ``stop()`` immediately, ``start()`` again, ``close()``."""

    def __init__(self, log_path: Path) -> None:
        self._log_path = log_path
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self.port = 0

    def open(self) -> None:
        with self._log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        word, _, port = self._answer().partition(" ")
        if word != "ready":
            raise RuntimeError(f"the PostgreSQL controller did not start: {word} {port}")
        self.port = int(port)

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster); returns once it is down."""
        self._command("stop")

    def start(self) -> None:
        """Start again on the same port and data directory; returns once it accepts."""
        self._command("start")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(CONTROL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
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
            raise RuntimeError(f"PostgreSQL {command} failed: {answer}")

    def _answer(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        line = _read_line(self._proc.stdout, CONTROL_TIMEOUT_S)
        if line is None:
            raise RuntimeError(
                f"the PostgreSQL controller did not answer; its log: {self._log_path}"
            )
        return line.strip()


def _read_line(stream: IO[str], timeout_s: float) -> str | None:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result and result[0] else None


def _serve() -> None:
    # Imported here: the client half above must not pull the server code into the test.
    from chronoshard.services import PostgresServer

    with PostgresServer(fsync=False) as server:
        print(f"ready {server.port}", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "quit":
                break
            started = time.monotonic()
            try:
                if command == "stop":
                    server.stop_immediately()
                elif command == "start":
                    server.start()
                else:
                    raise ValueError(f"unknown command {command!r}")
            except Exception as exc:
                print(f"error {exc!r}".replace("\n", " "), flush=True)
                continue
            print(
                f"{command} took {time.monotonic() - started:.3f} s",
                file=sys.stderr,
                flush=True,
            )
            print("ok", flush=True)


if __name__ == "__main__":
    _serve()
