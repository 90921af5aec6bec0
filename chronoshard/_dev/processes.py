"""Plumbing shared by the local etcd and PostgreSQL launchers.

Both launchers start a server as a child process in its own process group, on ports
picked free on loopback, and wait for it with a deadline. Picking a free port by
binding port 0 races with every other process on the machine, so a start that loses
its port is retried on new ones (`start_on_free_ports`). Ending a server always sweeps
its whole process group, so nothing we started outlives `stop()`. Errors carry the tail
of the server log, because "timed out" alone is useless in CI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

LOOPBACK_HOST = "127.0.0.1"
DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.05
PORT_ATTEMPTS = 5
LOG_TAIL_CHARS = 4000


class ServerProcess:
    """A local server as a context manager: :meth:`start` on entry, :meth:`close` on
    exit, and :meth:`close` too when the start fails, so a failed start leaves no
    process or temp dir behind. Subclasses (the etcd and PostgreSQL launchers) define
    both."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
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


class ServiceError(RuntimeError):
    """Raised when a local etcd or PostgreSQL cannot be found, started or reached.

    The message says which and why, with the tail of the server log when there is one.
    """


class PortTaken(Exception):
    """The server lost the race for its port to another process; retry on a new one."""


def start_on_free_ports(what: str, count: int, launch: Callable[[list[int]], None]) -> None:
    """Call `launch` with `count` free ports until a start keeps its ports.

    `launch` raises `PortTaken` when the server could not bind; anything else ends
    the attempts.
    """
    for _ in range(PORT_ATTEMPTS):
        try:
            launch(free_ports(count))
            return
        except PortTaken:
            continue
    raise ServiceError(f"{what} lost the race for a free port {PORT_ATTEMPTS} times")


def free_ports(count: int) -> list[int]:
    """Return `count` distinct ports that were free on loopback a moment ago.

    All sockets stay bound until every port is chosen, so the kernel cannot hand out
    the same port twice.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK_HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def log_tail(path: Path, since: int = 0) -> str:
    """The last few KB of a log written from byte offset `since` on."""
    try:
        with path.open("rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    return text[-LOG_TAIL_CHARS:]


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def end_process_group(proc: subprocess.Popen[bytes], sig: int, grace_s: float) -> None:
    """Send `sig`, wait up to `grace_s`, then SIGKILL whatever is left of the group.

    The group outlives its leader when the leader leaves children behind (a postmaster
    killed with SIGKILL leaves its backends), so the group is always swept. Linux does
    not reuse a process-group id while any member lives, so the sweep cannot hit a
    stranger.
    """
    if proc.returncode is not None:
        # Reaped by an earlier call: its group id may belong to a stranger by now.
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            # A stopped (paused) process acts on no signal but SIGKILL until continued.
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def running(proc: subprocess.Popen[bytes] | None) -> bool:
    return proc is not None and proc.poll() is None
