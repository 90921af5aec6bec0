"""The lifeline: a launcher's children die with it, however it dies.

``chronoshard dev`` starts etcd, PostgreSQL, scheduler nodes, the watchdog and a worker,
each in its own session (so a terminal's Ctrl-C reaches only the launcher, which stops
them in order). Its own orderly stop covers Ctrl-C, SIGTERM and SIGHUP, but not a launcher
that is SIGKILLed, crashes, or dies on a broken stdout: its children would run on. So each
child is tied to the launcher's life by a pipe.

**The keeper.** Before it starts anything, the launcher starts a small keeper process
(``python -m chronoshard._dev.lifeline``, its own session, its log in a file — never the
launcher's stdout) whose stdin is the read end of a pipe. Only the launcher holds the
write end (it is close-on-exec, so no child inherits it past ``exec``), and the kernel
closes it when the launcher exits, whatever the cause. The keeper reads registrations until
end of file; then, for every registered process that is still the same process (pid and
start time), it does what the launcher's stop would have done: stage by stage in reverse
order of start (worker, watchdog, nodes together, PostgreSQL, etcd), the stage's stop
signal (SIGINT for PostgreSQL: its fast shutdown; SIGTERM otherwise), a grace period, then
SIGKILL to each process *group*, which takes grandchildren along (PostgreSQL's backends, a
handler's subprocesses). Scratch directories registered with it are deleted last. After a
clean stop everything registered is already gone and the keeper exits without a word.

**No window.** A child registers itself: :meth:`Lifeline.tie` returns the function that
``subprocess.Popen`` runs in the child between ``fork`` and ``exec`` (after it dropped
privileges and started its session), which writes the child's pid and start time to the
pipe. The forked child holds a copy of the write end until its ``exec`` closes it, so the
keeper cannot see end of file before the registration is in the pipe: a launcher killed at
any instant leaves no child unregistered. That function only calls ``os`` primitives
(no imports, locks or logging), which is what makes running Python in a forked child of a
process with threads safe here.

**From the parent.** A ``preexec_fn`` makes CPython run the process's at-fork handlers,
and gRPC's wait forever in a process with live gRPC calls (the test suite). A lifeline
made with ``from_parent`` registers each child from the launcher right after its start
instead (:meth:`Lifeline.register`), with that window. Launchers start children through
:func:`start_child`, which does it the lifeline's way.

Why not ``PR_SET_PDEATHSIG``: it is Linux-only, fires when the parent *thread* that forked
the child exits (not the process), reaches only direct children, and is cleared when a
child changes its uid (PostgreSQL under root). The pipe has none of these limits. The
keeper is one process: if it dies, the launcher sees it as a dead child and stops the
cluster; if both are killed at once, the next ``dev`` on the data dir stops what is left
(``cluster.json`` lists every pid with its start time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("chronoshard.lifeline")

KEEPER_EXIT_TIMEOUT_S = 10.0
"""How long a launcher that closed its lifeline waits for the keeper to finish."""
POLL_S = 0.05
_PROCESS = "proc"
_PATH = "path"
_NO_TICKS = "-"


@dataclass(frozen=True)
class Registration:
    """A process the keeper stops if the launcher dies: its identity and how to stop it."""

    pid: int
    start_ticks: int | None
    """The process's start time (clock ticks since boot; None where there is no /proc):
    with the pid it names one process, never a later one reusing the pid."""
    stop_signal: int
    stage: str
    name: str

    def alive(self) -> bool:
        """Whether this very process still runs (and is not a zombie)."""
        if self.start_ticks is None:
            return _exists(self.pid)
        return start_ticks(self.pid) == self.start_ticks


def parse_line(line: str) -> Registration | Path | None:
    """One line of the lifeline: a process registration, a scratch path, or None for a
    line that is neither (ignored: the keeper must never die on its input)."""
    fields = line.rstrip("\n").split("\t")
    try:
        if fields[0] == _PROCESS and len(fields) == 6:
            _, pid, ticks, sig, stage, name = fields
            return Registration(
                int(pid), None if ticks == _NO_TICKS else int(ticks), int(sig), stage, name
            )
        if fields[0] == _PATH and len(fields) == 2 and fields[1]:
            return Path(fields[1])
    except ValueError:
        return None
    return None


def stop_order(registrations: Iterable[Registration]) -> list[list[Registration]]:
    """Stages to stop, one after another: the reverse of the order in which each stage
    first registered; the processes of a stage stop together."""
    stages: dict[str, list[Registration]] = {}
    for registration in registrations:
        stages.setdefault(registration.stage, []).append(registration)
    return list(reversed(stages.values()))


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a
    zombie: together with the pid it names one process, never a later one reusing it."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_groups(leaders: Mapping[int, int], grace_s: float, alive: Callable[[int], bool]) -> None:
    """Send each leader its signal (``leaders``: pid → signal), wait until none is
    ``alive`` or ``grace_s`` passed, then SIGKILL every leader's process group.

    The leaders lead their own sessions, so a pid is also its group's id; Linux does not
    reuse an id while any member of its group lives, so the sweep cannot hit a stranger.
    """
    for pid, sig in leaders.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)  # a paused process acts on nothing but SIGKILL
            os.kill(pid, sig)
    deadline = time.monotonic() + grace_s
    while any(alive(pid) for pid in leaders) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for pid in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


class Lifeline:
    """The launcher's side: starts the keeper, ties children to it, closes it at the end.

    ``log_path`` receives the keeper's log; ``grace_s`` is how long it gives each stage
    between the stop signal and SIGKILL. With ``from_parent``, :func:`start_child`
    registers each child from the launcher after its start (:meth:`register`) instead of
    tying it in the child (:meth:`tie`): for a launcher where a ``preexec_fn`` is unsafe.
    """

    def __init__(self, log_path: Path, grace_s: float, *, from_parent: bool = False) -> None:
        self._log_path = log_path
        self._grace_s = grace_s
        self.from_parent = from_parent
        self._write_fd: int | None = None
        self._keeper: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._keeper is None else self._keeper.pid

    def start(self) -> None:
        read_fd, write_fd = os.pipe()  # both close-on-exec
        try:
            with self._log_path.open("ab") as log_file:
                self._keeper = subprocess.Popen(
                    [sys.executable, "-m", "chronoshard._dev.lifeline", str(self._grace_s)],
                    stdin=read_fd,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    # Out of the terminal's reach: a Ctrl-C must not take it along.
                    start_new_session=True,
                )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self._write_fd = write_fd

    def exited(self) -> int | None:
        """The keeper's exit code once it is gone (it must outlive the launcher), else None."""
        return None if self._keeper is None else self._keeper.poll()

    def tie(
        self, name: str, stop_signal: int = signal.SIGTERM, stage: str = ""
    ) -> Callable[[], None]:
        """The ``preexec_fn`` that registers the child it runs in (see the module
        docstring). Children of one ``stage`` (default: their name) stop together."""
        fd = self._write_fd
        if fd is None:
            raise RuntimeError("the lifeline is not started")
        tail = _registration_tail(name, stop_signal, stage)

        def register() -> None:
            # In the forked child: os primitives only (see the module docstring).
            line = f"{_PROCESS}\t{os.getpid()}\t{_own_start_ticks()}{tail}"
            os.write(fd, line.encode())

        return register

    def register(
        self, pid: int, name: str, stop_signal: int = signal.SIGTERM, stage: str = ""
    ) -> None:
        """Register a child that is already running, from the launcher's side: for a
        launcher where :meth:`tie` is unsafe. A ``preexec_fn`` makes CPython run the
        process's at-fork handlers, and gRPC's wait forever in a process with live gRPC
        calls (the test suite's: a worker's start hung there). Unlike :meth:`tie`, a
        launcher killed between the child's start and this call leaves it unregistered."""
        ticks = start_ticks(pid)
        identity = f"{_PROCESS}\t{pid}\t{_NO_TICKS if ticks is None else ticks}"
        self._send(identity + _registration_tail(name, stop_signal, stage))

    def remove_on_exit(self, path: Path) -> None:
        """Have the keeper delete ``path`` (a scratch directory) if the launcher dies."""
        self._send(f"{_PATH}\t{_field(str(path))}\n")

    def close(self) -> None:
        """The launcher is done (everything stopped): close the pipe and let the keeper
        finish. Idempotent."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        if self._keeper is not None:
            # Still stopping something a stop step gave up on? It finishes on its own.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._keeper.wait(KEEPER_EXIT_TIMEOUT_S)

    def _send(self, line: str) -> None:
        if self._write_fd is None:
            raise RuntimeError("the lifeline is not started")
        os.write(self._write_fd, line.encode())


def start_child(
    lifeline: Lifeline | None,
    argv: Sequence[str],
    *,
    name: str,
    stop_signal: int = signal.SIGTERM,
    stage: str = "",
    **popen: Any,
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen)`` with the child registered with ``lifeline`` (if
    any) the lifeline's way: tied in the child (no window), or from the parent after its
    start (``from_parent``). Every launcher starts its children through this."""
    if lifeline is None:
        return subprocess.Popen(list(argv), **popen)
    if not lifeline.from_parent:
        preexec = lifeline.tie(name, stop_signal, stage)
        return subprocess.Popen(list(argv), preexec_fn=preexec, **popen)
    proc = subprocess.Popen(list(argv), **popen)
    lifeline.register(proc.pid, name, stop_signal, stage)
    return proc


def _registration_tail(name: str, stop_signal: int, stage: str) -> str:
    """A process registration's line after its pid and start ticks (:meth:`Lifeline.tie`
    and :meth:`Lifeline.register` write the same lines)."""
    return f"\t{int(stop_signal)}\t{_field(stage or name)}\t{_field(name)}\n"


def _field(text: str) -> str:
    """A value that cannot break the line format."""
    return text.replace("\t", " ").replace("\n", " ")


def _own_start_ticks() -> str:
    """This process's start ticks, read with os calls only (it runs in a forked child)."""
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY)
    except OSError:
        return _NO_TICKS
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    fields = data.rsplit(b")", 1)[-1].split()
    return fields[19].decode() if len(fields) > 19 else _NO_TICKS


# --- the keeper ------------------------------------------------------------------------------


def keep(stream: BinaryIO, grace_s: float) -> None:
    """Read registrations until end of file, then stop what still runs and delete the
    scratch paths (the keeper's whole life)."""
    registrations: list[Registration] = []
    paths: list[Path] = []
    for raw in stream:
        parsed = parse_line(raw.decode(errors="replace"))
        if isinstance(parsed, Registration):
            registrations.append(parsed)
        elif isinstance(parsed, Path):
            paths.append(parsed)
    left = [r for r in registrations if r.alive()]
    if left:
        log.warning(
            "launcher gone: stopping what it left running",
            extra={"processes": ", ".join(f"{r.name} ({r.pid})" for r in left)},
        )
    alive = {r.pid: r.alive for r in left}
    for stage in stop_order(left):
        stop_groups({r.pid: r.stop_signal for r in stage}, grace_s, lambda pid: alive[pid]())
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    if left:
        log.info("stopped", extra={"processes": len(left)})


def main(argv: Sequence[str]) -> int:
    from chronoshard import logs

    logs.setup(fmt="text")
    # Only end of file on the lifeline ends the keeper: a stray SIGINT or SIGHUP (it has
    # no terminal, but a process-group kill could reach it) must not cut it short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    keep(sys.stdin.buffer, float(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
