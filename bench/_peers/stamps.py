"""The one record every system's handler leaves: when it started, by the wall clock.

Each worker process (a Celery pool child, a Procrastinate worker, a Chronoshard worker)
appends ``KEY START_US`` lines to a file of its own, named by its pid, in the directory
named by ``$BENCH_STAMPS_DIR``, and flushes each line: one ``write`` per task, a few
microseconds, the same cost for every system, and readable by the benchmark while the
run goes on (it counts lines to know when all handlers ran). A line is in the kernel's
page cache once written, so a worker killed later loses nothing; nothing here survives
a power cut, which no benchmark needs.

The key is the task's index in the run; the benchmark knows each index's scheduled
instant, so lateness is computed afterwards, never in the handler.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

STAMPS_DIR_ENV = "BENCH_STAMPS_DIR"

_out: TextIO | None = None
_out_pid = 0


def record(key: int) -> None:
    """Note that the handler of task ``key`` starts now."""
    started_us = time.time_ns() // 1000
    global _out, _out_pid
    # Prefork pools fork after import: each process opens its own file on first use.
    if _out is None or _out_pid != os.getpid():
        _out_pid = os.getpid()
        path = Path(os.environ[STAMPS_DIR_ENV]) / f"{_out_pid}.stamps"
        _out = path.open("a", encoding="ascii")
    _out.write(f"{key} {started_us}\n")
    _out.flush()


def _lines(directory: Path) -> list[str]:
    lines: list[str] = []
    for path in sorted(directory.glob("*.stamps")):
        text = path.read_text(encoding="ascii")
        # A line being written is complete only once it ends with its newline.
        lines += text[: text.rfind("\n") + 1].splitlines()
    return lines


def count(directory: Path) -> int:
    """How many handler starts have been recorded so far."""
    return len(_lines(directory))


def read(directory: Path) -> list[tuple[int, int]]:
    """Every ``(key, start in µs since the epoch)`` recorded, in no particular order."""
    found = []
    for line in _lines(directory):
        key, started_us = line.split()
        found.append((int(key), int(started_us)))
    return found
