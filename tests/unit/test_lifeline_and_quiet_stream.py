"""The dev launcher's pure parts: the lifeline's line format and stop order, and the
stream that survives its reader."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from chronoshard._dev.lifeline import Registration, parse_line, stop_order
from chronoshard._dev.quiet_stream import QuietStream, quiet


def reg(name: str, stage: str, pid: int = 1) -> Registration:
    return Registration(pid, 7, int(signal.SIGTERM), stage, name)


def test_lines_round_trip_and_garbage_is_ignored() -> None:
    assert parse_line("proc\t42\t1234\t2\tpostgres\tpostgres\n") == Registration(
        42, 1234, 2, "postgres", "postgres"
    )
    assert parse_line("proc\t42\t-\t15\tnodes\tdev-node-1\n") == Registration(
        42, None, 15, "nodes", "dev-node-1"
    )
    assert parse_line("path\t/tmp/chronoshard-pginstall-x\n") == Path(
        "/tmp/chronoshard-pginstall-x"
    )
    for garbage in ("", "\n", "proc\tx\t1\t2\ta\tb\n", "proc\t1\t2\n", "path\t\n", "what\n"):
        assert parse_line(garbage) is None


@given(st.text())
def test_no_line_breaks_the_keeper(line: str) -> None:
    parse_line(line)  # never raises


def test_stages_stop_in_reverse_order_of_start_and_together() -> None:
    started = [
        reg("etcd", "etcd"),
        reg("postgres", "postgres"),
        reg("dev-node-1", "nodes"),
        reg("dev-node-2", "nodes"),
        reg("watchdog", "watchdog"),
        reg("dev-node-3", "nodes"),  # a late member joins its stage, not a new one
        reg("demo-worker", "demo-worker"),
    ]
    assert [[r.name for r in stage] for stage in stop_order(started)] == [
        ["demo-worker"],
        ["watchdog"],
        ["dev-node-1", "dev-node-2", "dev-node-3"],
        ["postgres"],
        ["etcd"],
    ]


def test_a_stream_whose_reader_died_goes_silent() -> None:
    read_fd, write_fd = os.pipe()
    with open(write_fd, "w", buffering=1) as raw:
        stream = QuietStream(raw)
        print("before", file=stream, flush=True)
        assert os.read(read_fd, 100) == b"before\n"
        os.close(read_fd)  # the reader dies (tee on Ctrl-C)
        print("into the broken pipe", file=stream, flush=True)  # no BrokenPipeError
        print("and again", file=stream, flush=True)
        assert stream.broken and not stream.isatty()
        # Its descriptor now points at /dev/null: the final flush at exit cannot fail.
        assert os.readlink(f"/proc/self/fd/{write_fd}") == os.devnull


def test_a_closed_stream_goes_silent_and_quiet_wraps_once() -> None:
    inner = io.StringIO()
    stream = quiet(inner)
    print("kept", file=stream)
    inner.close()
    print("dropped", file=stream, flush=True)
    assert isinstance(stream, QuietStream) and stream.broken
    assert quiet(stream) is stream
