"""The dispatch round's policy, pure: which ready task goes to which worker credit, and
what becomes of each choice once the intents' transaction answered.

A round (:mod:`chronoshard.scheduler.dispatch.dispatcher`) is: :func:`choose` against the
credits the workers granted, write the intents, then either :func:`put_back` everything
(nothing committed: the store failed) or :func:`match_written` the tasks the transaction
returned to their choices, send those, and :func:`give_back` the rest. The rules:

- Each ready task goes to the session holding the most unused credits that serves it,
  ties to the one chosen least recently (:class:`Spread`, which remembers that across
  rounds). Load spreads over the workers: taking sessions in the registry's order, the
  first worker to connect got every task whenever its credits came back before the next
  task fell due, and a second worker of the same slots sat idle (issue 14).
- A choice spends one credit of its session and counts as started for its tenant at
  once, not after the commit: otherwise one round could take a tenant past its
  concurrency limit by up to the batch size. A round takes at most ``batch_max``.
- Nothing committed: every credit comes back, every task is finished for its tenant and
  pushed back to the ready queues, to be chosen again.
- Committed: a task the transaction returned is sent on the session it was chosen for.
  A chosen task it did not return gives its credit back and is finished for its tenant;
  it is chosen again only if it was read back as not written (``unwritten``: still
  PRELOADED after a commit of unknown outcome), otherwise its row moved on (cancelled,
  or the shard was lost) and it is dropped.

No I/O and no clock: ``now`` is the dispatcher's monotonic reading of the round. The
functions change the ready queues and the sessions' credits they are given, which are
in-memory structures of the node.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from chronoshard.scheduler.core.fairness import ReadyQueues, ReadyTask, WorkerOffer


class CreditHolder(Protocol):
    """A worker session as the round sees it: the credits it granted and what it runs."""

    credits: int

    @property
    def offer(self) -> WorkerOffer: ...


class Row(Protocol):
    """A row the intents' transaction returned (a :class:`~.models.Task`)."""

    @property
    def id(self) -> uuid.UUID: ...


S = TypeVar("S", bound=CreditHolder)
R = TypeVar("R", bound=Row)


@dataclass(frozen=True, slots=True)
class Written(Generic[S, R]):
    """What the intents' transaction answered, matched to the round's choices."""

    to_send: list[tuple[S, R, ReadyTask]]
    """Committed intents, in the order the transaction returned them, with the session
    each was chosen for."""
    leftover: list[tuple[S, ReadyTask]]
    """Chosen but not returned: for :func:`give_back`."""


class Gathering:
    """When the wheel's timers fire: together, a window at a time, not one by one.

    A timer's deadline is ``lead_dispatch_s`` before its task is due, and the worker
    starts the handler at ``due_at`` by the node's clock whenever the assignment arrived,
    so a task dispatched somewhat earlier still starts on time. Fired one by one, tasks
    spread over time each paid a round of their own (an intent transaction of six
    statements, an assignment message, and later a group commit of one completion): a
    steady 200 tasks/s cost the node ~2.7 ms of CPU per task, against ~0.14 ms in a
    stampede's rounds of hundreds (issue 14, target 6). So the timers are fired a window
    at a time: at a gathering the wheel is advanced to ``now + window_s`` (every timer
    whose deadline falls in it fires), and the next gathering is not before the window
    has passed, unless a deadline falls after it. A timer therefore fires at most
    ``window_s`` before its deadline (never after it), and the wheel starts at most one
    round per window however the deadlines spread. ``window_s`` 0 is firing at each
    deadline exactly.

    Pure: the dispatcher passes its monotonic readings in.
    """

    __slots__ = ("_horizon", "_next_at", "_window_s")

    def __init__(self, window_s: float) -> None:
        if not window_s >= 0:
            raise ValueError(f"window_s must not be negative, got {window_s!r}")
        self._window_s = window_s
        self._horizon = float("-inf")
        self._next_at = float("-inf")

    def horizon(self, now: float) -> float:
        """How far the wheel is to be advanced at ``now``: a new window when the last one
        has passed, else the current window's end (a timer added inside it, or one
        already due, fires at once)."""
        if now >= self._next_at:
            self._horizon = now + self._window_s
            self._next_at = self._horizon
        return max(now, self._horizon)

    def wake_at(self, next_deadline: float | None) -> float | None:
        """When to advance the wheel next, given its earliest pending deadline: that
        deadline's window opens ``window_s`` before it, not before the current window
        ends."""
        if next_deadline is None:
            return None
        return max(next_deadline - self._window_s, self._next_at)


class Spread:
    """Which session takes the next task: the one holding the most unused credits, ties
    to the one chosen least recently (never chosen first, then the order given).

    Most unused credits is most free capacity offered to this node, so the sessions'
    credits are drawn down level (water-filling) and a worker with more free slots takes
    more. The tie rule is what spreads a trickle: while every worker's credits come back
    before the next task is due, all hold the same count at every round, and the turns
    rotate instead of the first session taking every task. The turns outlive a round;
    that is this object's only state (the dispatcher keeps one).
    """

    FORGET_AFTER = 64
    """Sessions remembered beyond those of a round before the gone ones are forgotten."""

    def __init__(self) -> None:
        self._turn = 0
        self._last: dict[Hashable, int] = {}

    def last_chosen(self, session_id: Hashable) -> int:
        """The turn ``session_id`` was last chosen at (-1: never)."""
        return self._last.get(session_id, -1)

    def choose(
        self, sessions: Iterable[S], ready: ReadyQueues, batch_max: int, now: float
    ) -> list[tuple[S, ReadyTask]]:
        """Match ready tasks to the sessions' credits, at most ``batch_max`` in all;
        each choice spends a credit and counts as started. A session offered nothing
        (no ready task it serves, or limits hold what it serves) is out of the round:
        nothing a round does makes more tasks eligible."""
        chosen: list[tuple[S, ReadyTask]] = []
        offered = list(sessions)
        heap = [
            (-s.credits, self.last_chosen(s.offer.session_id), i)
            for i, s in enumerate(offered)
            if s.credits > 0
        ]
        heapq.heapify(heap)
        while heap and len(chosen) < batch_max:
            _, _, i = heapq.heappop(heap)
            session = offered[i]
            task = ready.pop_for(session.offer, now)
            if task is None:
                continue
            ready.task_started(task)
            session.credits -= 1
            chosen.append((session, task))
            self._turn += 1
            self._last[session.offer.session_id] = self._turn
            if session.credits > 0:
                heapq.heappush(heap, (-session.credits, self._turn, i))
        self._forget_gone(offered)
        return chosen

    def _forget_gone(self, sessions: Sequence[CreditHolder]) -> None:
        # Bounded memory: a session with no credit this round keeps its turn (forgetting
        # it would put it first on the next tie) unless many more are remembered.
        if len(self._last) > len(sessions) + self.FORGET_AFTER:
            present = {s.offer.session_id for s in sessions}
            self._last = {k: v for k, v in self._last.items() if k in present}


def choose(
    sessions: Iterable[S],
    ready: ReadyQueues,
    batch_max: int,
    now: float,
    spread: Spread | None = None,
) -> list[tuple[S, ReadyTask]]:
    """:meth:`Spread.choose` with ``spread``'s turns (None: a fresh one, no memory of
    earlier rounds)."""
    return (spread or Spread()).choose(sessions, ready, batch_max, now)


def put_back(chosen: Iterable[tuple[S, ReadyTask]], ready: ReadyQueues, now: float) -> None:
    """Nothing was committed: undo every choice, to be chosen again."""
    for session, task in chosen:
        session.credits += 1
        ready.task_finished(task.tenant_id, task.priority)
        ready.push(task, now)


def match_written(chosen: Sequence[tuple[S, ReadyTask]], dispatched: Iterable[R]) -> Written[S, R]:
    """Pair each task the transaction returned with its choice; the rest is leftover."""
    by_id = {task.id: (session, task) for session, task in chosen}
    to_send = []
    for row in dispatched:
        session, task = by_id.pop(row.id)
        to_send.append((session, row, task))
    return Written(to_send, list(by_id.values()))


def give_back(
    leftover: Iterable[tuple[S, ReadyTask]],
    unwritten: Collection[uuid.UUID],
    ready: ReadyQueues,
    now: float,
) -> int:
    """Return the leftover choices' credits; push back those read back as not written.
    The number dropped (their rows moved on)."""
    dropped = 0
    for session, task in leftover:
        session.credits += 1
        ready.task_finished(task.tenant_id, task.priority)
        if task.id in unwritten:
            ready.push(task, now)
        else:
            dropped += 1
    return dropped
