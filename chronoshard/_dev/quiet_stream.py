"""A text stream that outlives its reader.

A long-running command whose output goes into a pipe (``chronoshard dev | tee log``)
loses that pipe's reader when the user presses Ctrl-C (the terminal's SIGINT reaches
``tee`` as well), and every later ``print`` raises ``BrokenPipeError``: in a shutdown
path, that is what leaves processes running. Wrapped in :class:`QuietStream`, the stream
goes silent instead, and so does the interpreter's final flush of it.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import TextIO, cast


class QuietStream(io.TextIOBase):
    """A text stream that outlives its reader: once a write fails (``BrokenPipeError``
    when the reader of a pipe is gone, ValueError when the stream was closed), every
    later write is dropped, and the stream's descriptor is pointed at /dev/null so the
    interpreter's last flush at exit cannot fail on it either."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self._inner = inner
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self._inner.write(text)
            except (OSError, ValueError):
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._inner.flush()
            except (OSError, ValueError):
                self._silence()

    def isatty(self) -> bool:
        try:
            return not self.broken and self._inner.isatty()
        except (OSError, ValueError):
            return False

    def writable(self) -> bool:
        return True

    def _silence(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation, AttributeError):
            fd = self._inner.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)


def quiet(stream: TextIO) -> TextIO:
    """``stream``, made quiet on failure (once: a QuietStream is returned as it is)."""
    return cast(TextIO, stream if isinstance(stream, QuietStream) else QuietStream(stream))
