"""Handler slots: at most ``slots`` handlers run at once, and the assignments a worker
holds beyond them (its ``prefetch``) wait here for their turn, first come first served.

A worker takes up to ``slots + prefetch`` assignments (the credits it grants,
:mod:`._credits`); each becomes a run at once, which waits for its ``due_at``, then for
one of these slots, then starts its handler. With ``prefetch`` 0 (the default) every
accepted run finds a slot free and the worker has no :class:`HandlerSlots` at all. What
prefetch buys: without it, a slot whose handler ended idles until the node has heard of
the freed credit, committed the next intent and sent the assignment back (issue 14:
~23 ms per cycle at 10 slots per worker, of which the no-op handler took nothing); with
it, the next task is already here. What it costs: a held task waits behind this
worker's handlers even when another worker has a slot free, so it suits short tasks,
as Celery's prefetch multiplier does.

The waiting is plain asyncio futures on one event loop, no clock: :meth:`HandlerSlots.enter`
is a turn that resolves once a slot is the caller's, :meth:`HandlerSlots.leave` gives a
slot back (to the oldest live turn), :meth:`HandlerSlots.withdraw` ends a turn whether or
not it came. A draining worker starts nothing it holds but has not begun:
:meth:`HandlerSlots.close` cancels every turn still waiting and every later one (their
runs are released unrun, so another worker takes them at once); handlers already in a
slot run on through the drain's grace.
"""

from __future__ import annotations

import asyncio
from collections import deque


class HandlerSlots:
    """``slots`` handler slots handed out in the order they were asked for."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self._free = slots
        # Turns not given a slot yet, oldest first; withdrawn ones are cancelled and
        # skipped when reached. While any live turn waits, no slot is free.
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.closed = False

    @property
    def in_use(self) -> int:
        return self.slots - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for turn in self._waiting if not turn.done())

    def enter(self) -> asyncio.Future[None]:
        """A turn: resolved when a slot is the caller's (at once if one is free);
        cancelled, not by its caller, if the slots are (or get) closed."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.closed:
            turn.cancel()
        elif self._free > 0:
            self._free -= 1
            turn.set_result(None)
        else:
            self._waiting.append(turn)
        return turn

    def leave(self) -> None:
        """Give a slot back: to the oldest live turn, else to the free ones."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        if self._free >= self.slots:
            raise RuntimeError("a handler slot was given back that was not taken")
        self._free += 1

    def withdraw(self, turn: asyncio.Future[None]) -> None:
        """The caller of ``turn`` no longer wants it: a slot it was given goes back, one
        it still waits for goes to the next in line."""
        if turn.done() and not turn.cancelled():
            self.leave()
        else:
            turn.cancel()

    def close(self) -> None:
        """No turn is given from now on: those waiting are cancelled, later ones too."""
        self.closed = True
        while self._waiting:
            self._waiting.popleft().cancel()
