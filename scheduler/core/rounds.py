"""The dispatch round's policy, pure: which ready task goes to which worker credit, and
what becomes of each choice once the intents' transaction answered.

A round (:mod:`chronoshard.scheduler.dispatch.dispatcher`) is: :func:`choose` against the
credits the workers granted, write the intents, then either :func:`put_back` everything
(nothing committed: the store failed) or :func:`match_written` the tasks the transaction
returned to their choices, send those, and :func:`give_back` the rest. The rules:

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

import uuid
from collections.abc import Collection, Iterable, Sequence
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


def choose(
    sessions: Iterable[S], ready: ReadyQueues, batch_max: int, now: float
) -> list[tuple[S, ReadyTask]]:
    """Match ready tasks to the sessions' credits, session by session, at most
    ``batch_max`` in all; each choice spends a credit and counts as started."""
    chosen: list[tuple[S, ReadyTask]] = []
    for session in sessions:
        while session.credits > 0 and len(chosen) < batch_max:
            task = ready.pop_for(session.offer, now)
            if task is None:
                break
            ready.task_started(task)
            session.credits -= 1
            chosen.append((session, task))
    return chosen


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
