"""A node dropping shards forgets their tasks, on the wheel and ready, and only theirs.

The dispatcher keeps no index of its tasks by shard (it cost ~40 bytes per pending task,
issue 14 target 7): a release looks at every task held, so what it must find is pinned
here, wherever the task waits.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import cast

from fixtures.timers import AT, timer_task

from chronoshard.clock import FakeClock
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.fairness import UNLIMITED
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.dispatch.dispatcher import Dispatcher, ShardView
from chronoshard.scheduler.dispatch.sessions import SessionRegistry
from chronoshard.scheduler.store.runs import RunStore


class _Shards:
    def epochs(self) -> dict[int, int]:
        return {0: 1, 1: 1, 2: 1}

    def dispatch_allowed(self) -> bool:
        return True

    def epochs_lost(self, shards: object) -> None: ...

    def retry_due(self, shard: int, due_at: datetime) -> None: ...


def test_drop_shards_forgets_their_tasks_on_the_wheel_and_ready_and_no_other() -> None:
    clock = FakeClock(AT)
    config = SchedulerConfig()
    dispatcher = Dispatcher(
        config,
        clock,
        cast(RunStore, None),  # scheduling and dropping touch neither store nor workers
        SessionRegistry(config.node_id, clock, send_queue=config.grpc.worker_send_queue),
        cast(ShardView, _Shards()),
        lambda tenant: UNLIMITED,
    )
    due_now = [timer_task(shard=i % 3, scheduled_at=AT, due_at=AT) for i in range(9)]
    later = AT + timedelta(hours=1)
    due_later = [timer_task(shard=i % 3, scheduled_at=later, due_at=later) for i in range(12)]
    dispatcher.schedule(due_now + due_later)
    now = clock.monotonic()
    fired = [  # the loop's first step: fired -> ready
        TimerTask.unpack(entry.key, entry.item) for entry in dispatcher._wheel.advance(now)
    ]
    for timer in fired:
        dispatcher._push_ready(timer, now)
    # The wheel holds each timer packed into an int; what fires is the timer scheduled.
    assert sorted(fired, key=lambda t: t.id_int) == sorted(due_now, key=lambda t: t.id_int)
    assert (len(dispatcher._wheel), len(dispatcher._ready)) == (12, 9)

    assert dispatcher.drop_shards([1, 2]) == 6 + 8
    assert dispatcher.drop_shards([1, 2]) == 0
    assert dispatcher.drop_shards([]) == 0
    kept = {t.id for t in due_now + due_later if t.shard == 0}
    held = {t.id for t in due_now + due_later if t.id_int in dispatcher._wheel}
    held |= {t.id for t in due_now if t.id in dispatcher._ready}
    assert held == kept
    assert dispatcher.pending() == len(kept)
