"""Which node hears of a changed task: this node's preloader, or the shard's owner."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from chronoshard.clock import FakeClock
from chronoshard.scheduler.cluster.routing import ChangeRouter
from chronoshard.scheduler.cluster.signals import SignalHandler, decode
from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.runs import TimerTask

LOOKAHEAD_S = 60.0
START = datetime(2026, 12, 1, 12, tzinfo=UTC)
OWNED = {1: 4, 2: 9}  # shard -> epoch


class Node:
    """The pieces of one node the router reaches, recording what they were told."""

    def __init__(self) -> None:
        self.wakes = 0
        self.scheduled: list[TimerTask] = []
        self.forgotten: list[uuid.UUID] = []
        self.cancels: list[tuple[uuid.UUID, str]] = []
        self.sent: list[str] = []
        self.reads: list[tuple[dict[int, int], list[TaskRef]]] = []
        self.handler: SignalHandler | None = None

    def owns(self, shard: int) -> bool:
        return shard in OWNED

    def epochs(self) -> Mapping[int, int]:
        return OWNED

    def wake(self) -> None:
        self.wakes += 1

    def schedule(self, timers: Iterable[TimerTask]) -> None:
        self.scheduled.extend(timers)

    def forget(self, task_id: uuid.UUID) -> bool:
        self.forgotten.append(task_id)
        return True

    def send_cancel(self, task_id: uuid.UUID, reason: str) -> bool:
        self.cancels.append((task_id, reason))
        return True

    def attach(self, handler: SignalHandler) -> None:
        self.handler = handler

    async def send(self, payloads: Sequence[str]) -> None:
        self.sent.extend(payloads)

    async def load_preloaded_refs(
        self, epochs: Mapping[int, int], refs: Sequence[TaskRef]
    ) -> list[TimerTask]:
        self.reads.append((dict(epochs), list(refs)))
        return []


def _router(node: Node, clock: FakeClock) -> ChangeRouter:
    return ChangeRouter(
        clock=clock,
        lookahead_s=LOOKAHEAD_S,
        shards=node,
        preloader=node,
        dispatcher=node,
        sessions=node,
        runs=node,
        signals=node,
    )


@dataclass(frozen=True)
class Changed:
    shard: int
    due_at: datetime
    id: uuid.UUID = field(default_factory=uuid.uuid4)


def _ref(n: int) -> TaskRef:
    return TaskRef(START, uuid.UUID(int=n))


def _timer_shards(payloads: list[str]) -> list[tuple[str, set[int]]]:
    return [decode(p)[:2] for p in payloads]


async def test_a_submit_due_soon_wakes_our_preloader_or_signals_its_owner() -> None:
    node, clock = Node(), FakeClock(START)
    router = _router(node, clock)
    soon, later = START + timedelta(seconds=5), START + timedelta(seconds=LOOKAHEAD_S + 1)
    router.tasks_submitted([Changed(1, soon), Changed(2, soon)])
    assert (node.wakes, node.sent) == (2, [])
    router.tasks_submitted(
        [Changed(7, soon), Changed(8, later), Changed(9, soon), Changed(9, soon)]
    )
    await _settled(router)
    # Beyond the lookahead nobody needs to hear: the owner's periodic pass finds it.
    assert node.wakes == 2 and _timer_shards(node.sent) == [("due", {7, 9})]


async def test_a_retry_due_elsewhere_is_signalled_only_within_the_lookahead() -> None:
    node, clock = Node(), FakeClock(START)
    router = _router(node, clock)
    router.due_elsewhere(7, START + timedelta(seconds=LOOKAHEAD_S + 1))
    router.due_elsewhere(8, START + timedelta(seconds=1))
    await _settled(router)
    assert _timer_shards(node.sent) == [("due", {8})]


async def test_signals_from_other_nodes_act_only_on_owned_shards() -> None:
    node, clock = Node(), FakeClock(START)
    router = _router(node, clock)
    assert node.handler is router
    router.signal_due({7, 8})
    assert node.wakes == 0
    router.signal_due({7, 2})
    assert node.wakes == 1
    router.signal_ready([(7, _ref(1)), (1, _ref(2)), (2, _ref(3))])
    router.signal_ready([(7, _ref(4))])
    await _settled(router)
    assert node.reads == [(OWNED, [_ref(2), _ref(3)])]


async def test_a_cancel_leaves_the_dispatcher_and_reaches_the_worker() -> None:
    node, clock = Node(), FakeClock(START)
    task = Changed(1, START)
    _router(node, clock).cancel_requested(task, "cancelled by its tenant")
    assert node.forgotten == [task.id]
    assert node.cancels == [(task.id, "cancelled by its tenant")]


async def _settled(router: ChangeRouter) -> None:
    await asyncio.gather(*router.in_flight())
